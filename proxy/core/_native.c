/* The compiled policy core: hashing, Bloom filters, windowed generations, the LRU store's
 * bookkeeping and the simulator's per-request loop.
 *
 * Rules this module keeps:
 *
 * - hash64 is MurmurHash3 x64/128 (seed 0) of a key's UTF-8 bytes, as two unsigned 64-bit
 *   halves: bit for bit what mmh3.hash64(key, signed=False) returns, so probe positions are
 *   the same here, in pure-Python readers of a filter and in the Redis script.
 * - A Bloom filter probes (h1 + i*h2) mod m for i < k (Kirsch-Mitzenmacher double hashing).
 * - A Window is g Bloom generations, newest first; its rotation rules are those documented in
 *   proxy/core/window.py, including Python's float floor division for elapsed spans, so a
 *   window decides identically whoever drives it.
 * - A StoreIndex is a byte-bounded store over 64-bit key hashes, evicting by LRU, SIEVE or
 *   S3-FIFO: sizes, charges, hits and the store time of each entry, and the eviction and
 *   dead-write counts. Callers keep payloads.
 * - An Admission is one admission policy (always, second-hit, nth-hit, tinylfu,
 *   probabilistic, size-below).
 * - untrack keeps an object out of the cyclic collector's view; only for objects that can
 *   never be part of a reference cycle (the store's entries).
 * - index_fields and end_to_end read header fields as rfc9111.Fields and rfc9111.end_to_end
 *   do (lower-cased names, as str.lower gives them); end_to_end leaves a message with a
 *   Connection field, whose listed names are dropped too, to the Python rule.
 * - simulate_chunk drives a StoreIndex and an Admission over a trace's arrays with the
 *   cache engine's rules for a cacheable response (see loadgen/simulate.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* MurmurHash3 x64/128, after Austin Appleby's public-domain reference. */

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static void murmur3_128(const uint8_t *data, Py_ssize_t len, uint64_t *out1, uint64_t *out2) {
    const Py_ssize_t nblocks = len / 16;
    uint64_t h1 = 0, h2 = 0;
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    for (Py_ssize_t i = 0; i < nblocks; i++) {
        uint64_t k1, k2;
        memcpy(&k1, data + i * 16, 8);
        memcpy(&k2, data + i * 16 + 8, 8);
        k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
        k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
    }
    const uint8_t *tail = data + nblocks * 16;
    uint64_t k1 = 0, k2 = 0;
    switch (len & 15) {
    case 15: k2 ^= ((uint64_t)tail[14]) << 48; /* fall through */
    case 14: k2 ^= ((uint64_t)tail[13]) << 40; /* fall through */
    case 13: k2 ^= ((uint64_t)tail[12]) << 32; /* fall through */
    case 12: k2 ^= ((uint64_t)tail[11]) << 24; /* fall through */
    case 11: k2 ^= ((uint64_t)tail[10]) << 16; /* fall through */
    case 10: k2 ^= ((uint64_t)tail[9]) << 8; /* fall through */
    case 9:
        k2 ^= ((uint64_t)tail[8]);
        k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        /* fall through */
    case 8: k1 ^= ((uint64_t)tail[7]) << 56; /* fall through */
    case 7: k1 ^= ((uint64_t)tail[6]) << 48; /* fall through */
    case 6: k1 ^= ((uint64_t)tail[5]) << 40; /* fall through */
    case 5: k1 ^= ((uint64_t)tail[4]) << 32; /* fall through */
    case 4: k1 ^= ((uint64_t)tail[3]) << 24; /* fall through */
    case 3: k1 ^= ((uint64_t)tail[2]) << 16; /* fall through */
    case 2: k1 ^= ((uint64_t)tail[1]) << 8; /* fall through */
    case 1:
        k1 ^= ((uint64_t)tail[0]);
        k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
    }
    h1 ^= (uint64_t)len; h2 ^= (uint64_t)len;
    h1 += h2; h2 += h1;
    h1 = fmix64(h1); h2 = fmix64(h2);
    h1 += h2; h2 += h1;
    *out1 = h1;
    *out2 = h2;
}

/* The bytes of a str (UTF-8) or bytes-like key; -1 with an exception set otherwise. */
static int key_bytes(PyObject *key, const char **data, Py_ssize_t *len) {
    if (PyUnicode_Check(key)) {
        *data = PyUnicode_AsUTF8AndSize(key, len);
        return *data == NULL ? -1 : 0;
    }
    if (PyBytes_Check(key)) {
        *data = PyBytes_AS_STRING(key);
        *len = PyBytes_GET_SIZE(key);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "a key is str or bytes, not %.100s", Py_TYPE(key)->tp_name);
    return -1;
}

/* A key's hash: of its UTF-8 bytes, or, for a str holding bytes a parser could not decode
 * (lone surrogates from surrogateescape, as a Latin-1 field value under Vary gives), of the
 * bytes it was decoded from. */
static int hash_key(PyObject *key, uint64_t *h1, uint64_t *h2) {
    const char *data;
    Py_ssize_t len;
    if (key_bytes(key, &data, &len) == 0) {
        murmur3_128((const uint8_t *)data, len, h1, h2);
        return 0;
    }
    if (!PyUnicode_Check(key) || !PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
    PyErr_Clear();
    PyObject *raw = PyUnicode_AsEncodedString(key, "utf-8", "surrogateescape");
    if (raw == NULL) return -1;
    murmur3_128((const uint8_t *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), h1, h2);
    Py_DECREF(raw);
    return 0;
}

static int parse_hash(PyObject *h, uint64_t *h1, uint64_t *h2) {
    if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2) {
        PyErr_SetString(PyExc_TypeError, "a key hash is a (h1, h2) tuple");
        return -1;
    }
    *h1 = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(h, 0));
    *h2 = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(h, 1));
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *py_hash64(PyObject *module, PyObject *key) {
    uint64_t h1, h2;
    if (hash_key(key, &h1, &h2) < 0) return NULL;
    return Py_BuildValue("(KK)", (unsigned long long)h1, (unsigned long long)h2);
}

/* Sizing: m = ceil(-n ln p / (ln 2)^2), k = round(m / n * ln 2), at least 1. */

static const double LN2 = 0.6931471805599453;

static int sizing(long long capacity, double fp_rate, long long *bits, int *probes) {
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity must be a positive integer of keys, got %lld",
                     capacity);
        return -1;
    }
    if (!(fp_rate > 0.0 && fp_rate < 1.0)) {
        PyObject *repr = PyFloat_FromDouble(fp_rate);
        PyErr_Format(PyExc_ValueError, "fp_rate must be between 0 and 1 (exclusive), got %R",
                     repr);
        Py_XDECREF(repr);
        return -1;
    }
    double m = ceil(-(double)capacity * log(fp_rate) / (LN2 * LN2));
    *bits = (long long)m;
    double k = nearbyint((double)*bits / (double)capacity * LN2);
    *probes = k < 1.0 ? 1 : (int)k;
    return 0;
}

static PyObject *py_optimal_size(PyObject *module, PyObject *args) {
    PyObject *cap;
    double fp_rate;
    if (!PyArg_ParseTuple(args, "Od", &cap, &fp_rate)) return NULL;
    if (!PyLong_Check(cap) || PyBool_Check(cap)) {
        PyErr_Format(PyExc_ValueError, "capacity must be a positive integer of keys, got %R", cap);
        return NULL;
    }
    long long capacity = PyLong_AsLongLong(cap);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    long long bits;
    int probes;
    if (sizing(capacity, fp_rate, &bits, &probes) < 0) return NULL;
    return Py_BuildValue("(Li)", bits, probes);
}

/* Bloom */

typedef struct {
    PyObject_HEAD
    uint8_t *bits;
    long long size_bits;
    long long nbytes;
    long long capacity;
    long long count;
    double fp_rate;
    int num_hashes;
} BloomObject;

static PyTypeObject BloomType;

static int bloom_setup(BloomObject *self, long long capacity, double fp_rate) {
    long long bits;
    int probes;
    if (sizing(capacity, fp_rate, &bits, &probes) < 0) return -1;
    uint8_t *mem = PyMem_Calloc((size_t)((bits + 7) / 8), 1);
    if (mem == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->bits);
    self->bits = mem;
    self->size_bits = bits;
    self->nbytes = (bits + 7) / 8;
    self->num_hashes = probes;
    self->capacity = capacity;
    self->fp_rate = fp_rate;
    self->count = 0;
    return 0;
}

static BloomObject *bloom_new(long long capacity, double fp_rate) {
    BloomObject *b = PyObject_New(BloomObject, &BloomType);
    if (b == NULL) return NULL;
    b->bits = NULL;
    if (bloom_setup(b, capacity, fp_rate) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

static inline int bloom_add(BloomObject *b, uint64_t h1, uint64_t h2) {
    const uint64_t m = (uint64_t)b->size_bits;
    uint64_t pos = h1 % m, step = h2 % m;
    uint8_t *bits = b->bits;
    int present = 1;
    for (int i = 0; i < b->num_hashes; i++) {
        uint8_t mask = (uint8_t)(1u << (pos & 7));
        if (!(bits[pos >> 3] & mask)) {
            bits[pos >> 3] |= mask;
            present = 0;
        }
        pos += step;
        if (pos >= m) pos -= m;
    }
    if (!present) b->count++;
    return present;
}

static inline int bloom_contains(const BloomObject *b, uint64_t h1, uint64_t h2) {
    const uint64_t m = (uint64_t)b->size_bits;
    uint64_t pos = h1 % m, step = h2 % m;
    for (int i = 0; i < b->num_hashes; i++) {
        if (!(b->bits[pos >> 3] & (1u << (pos & 7)))) return 0;
        pos += step;
        if (pos >= m) pos -= m;
    }
    return 1;
}

static void bloom_clear(BloomObject *b) {
    memset(b->bits, 0, (size_t)b->nbytes);
    b->count = 0;
}

static double bloom_fill(const BloomObject *b) {
    long long ones = 0;
    long long i = 0;
    for (; i + 8 <= b->nbytes; i += 8) {
        uint64_t word;
        memcpy(&word, b->bits + i, 8);
        ones += __builtin_popcountll(word);
    }
    for (; i < b->nbytes; i++) ones += __builtin_popcount(b->bits[i]);
    return (double)ones / (double)b->size_bits;
}

static int Bloom_init(BloomObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity", "fp_rate", NULL};
    PyObject *cap;
    double fp_rate = 0.01;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|d", kwlist, &cap, &fp_rate)) return -1;
    if (!PyLong_Check(cap) || PyBool_Check(cap)) {
        PyErr_Format(PyExc_ValueError, "capacity must be a positive integer of keys, got %R", cap);
        return -1;
    }
    long long capacity = PyLong_AsLongLong(cap);
    if (capacity == -1 && PyErr_Occurred()) return -1;
    return bloom_setup(self, capacity, fp_rate);
}

static void Bloom_dealloc(BloomObject *self) {
    PyMem_Free(self->bits);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Bloom_add(BloomObject *self, PyObject *key) {
    uint64_t h1, h2;
    if (hash_key(key, &h1, &h2) < 0) return NULL;
    return PyBool_FromLong(bloom_add(self, h1, h2));
}

static PyObject *Bloom_add_hash(BloomObject *self, PyObject *h) {
    uint64_t h1, h2;
    if (parse_hash(h, &h1, &h2) < 0) return NULL;
    return PyBool_FromLong(bloom_add(self, h1, h2));
}

static PyObject *Bloom_contains_hash(BloomObject *self, PyObject *h) {
    uint64_t h1, h2;
    if (parse_hash(h, &h1, &h2) < 0) return NULL;
    return PyBool_FromLong(bloom_contains(self, h1, h2));
}

static int Bloom_sq_contains(BloomObject *self, PyObject *key) {
    uint64_t h1, h2;
    if (hash_key(key, &h1, &h2) < 0) return -1;
    return bloom_contains(self, h1, h2);
}

static Py_ssize_t Bloom_len(BloomObject *self) { return (Py_ssize_t)self->count; }

static PyObject *Bloom_fill_ratio(BloomObject *self, PyObject *unused) {
    return PyFloat_FromDouble(bloom_fill(self));
}

static PyObject *Bloom_clear(BloomObject *self, PyObject *unused) {
    bloom_clear(self);
    Py_RETURN_NONE;
}

static PyObject *Bloom_raw(BloomObject *self, PyObject *unused) {
    return PyBytes_FromStringAndSize((const char *)self->bits, (Py_ssize_t)self->nbytes);
}

static PyObject *Bloom_load_raw(BloomObject *self, PyObject *args) {
    Py_buffer view;
    long long count;
    if (!PyArg_ParseTuple(args, "y*L", &view, &count)) return NULL;
    if (view.len != self->nbytes) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "BloomFilter bytes do not match their header's sizing");
        return NULL;
    }
    memcpy(self->bits, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    self->count = count;
    Py_RETURN_NONE;
}

static PyMethodDef Bloom_methods[] = {
    {"add", (PyCFunction)Bloom_add, METH_O, "Record key; True if it was (probably) present before."},
    {"add_hash", (PyCFunction)Bloom_add_hash, METH_O, "add for a key already hashed with hash64."},
    {"contains_hash", (PyCFunction)Bloom_contains_hash, METH_O,
     "in for a key already hashed with hash64."},
    {"fill_ratio", (PyCFunction)Bloom_fill_ratio, METH_NOARGS, "Share of the bits that are set."},
    {"clear", (PyCFunction)Bloom_clear, METH_NOARGS, "Unset every bit."},
    {"raw_bits", (PyCFunction)Bloom_raw, METH_NOARGS, "The bit array, as bytes."},
    {"load_raw_bits", (PyCFunction)Bloom_load_raw, METH_VARARGS,
     "Replace the bit array and the count of keys recorded."},
    {NULL},
};

static PyMemberDef Bloom_members[] = {
    {"size_bits", T_LONGLONG, offsetof(BloomObject, size_bits), READONLY, "bits"},
    {"num_hashes", T_INT, offsetof(BloomObject, num_hashes), READONLY, "probes per key"},
    {"capacity", T_LONGLONG, offsetof(BloomObject, capacity), READONLY, "keys sized for"},
    {"fp_rate", T_DOUBLE, offsetof(BloomObject, fp_rate), READONLY, "target rate"},
    {"memory_bytes", T_LONGLONG, offsetof(BloomObject, nbytes), READONLY, "bytes of bits"},
    {NULL},
};

static PySequenceMethods Bloom_as_sequence = {
    .sq_length = (lenfunc)Bloom_len,
    .sq_contains = (objobjproc)Bloom_sq_contains,
};

static PyTypeObject BloomType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.Bloom",
    .tp_basicsize = sizeof(BloomObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A bit array with k double-hashing probes per key.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Bloom_init,
    .tp_dealloc = (destructor)Bloom_dealloc,
    .tp_methods = Bloom_methods,
    .tp_members = Bloom_members,
    .tp_as_sequence = &Bloom_as_sequence,
};

/* Window */

typedef struct {
    PyObject_HEAD
    BloomObject **gens;
    double *written;
    int g;
    double window;
    double span;
    double gen_fp;
    double started;
    int has_started;
    PyObject *sizer;
    long long rotations;
    long long forced_rotations;
} WindowObject;

/* Python's float floor division, so elapsed spans round exactly as in pure Python. */
static double py_floor_div(double vx, double wx) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0)) div -= 1.0;
    }
    double floordiv;
    if (div) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, vx / wx);
    }
    return floordiv;
}

static int window_rotate(WindowObject *w, double now) {
    BloomObject *oldest = w->gens[w->g - 1];
    long long share = oldest->capacity;
    if (w->sizer != NULL) {
        PyObject *r = PyObject_CallNoArgs(w->sizer);
        if (r == NULL) return -1;
        long long asked = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (asked == -1 && PyErr_Occurred()) return -1;
        share = asked < 1 ? 1 : asked;
    }
    if (share == oldest->capacity) {
        bloom_clear(oldest);
    } else {
        BloomObject *fresh = bloom_new(share, w->gen_fp);
        if (fresh == NULL) return -1;
        Py_DECREF(oldest);
        oldest = fresh;
    }
    memmove(w->gens + 1, w->gens, sizeof(BloomObject *) * (size_t)(w->g - 1));
    memmove(w->written + 1, w->written, sizeof(double) * (size_t)(w->g - 1));
    w->gens[0] = oldest;
    w->written[0] = -INFINITY;
    w->started = now;
    w->rotations++;
    return 0;
}

static int window_advance(WindowObject *w, double now) {
    if (!w->has_started) {
        w->started = now;
        w->has_started = 1;
        return 0;
    }
    double started = w->started;
    if (now - started < w->span) return 0;
    long long elapsed = (long long)py_floor_div(now - started, w->span);
    long long due = elapsed < w->g ? elapsed : w->g;
    /* The oldest generation goes only once its last write is out of the window: in exact
     * arithmetic that always holds here, and it keeps the guarantee when floats round. */
    while (due && w->written[w->g - 1] + w->window < now) {
        if (window_rotate(w, now) < 0) return -1;
        due--;
    }
    if (!due) w->started = started + (double)elapsed * w->span;
    return 0;
}

/* 1 seen, 0 not, -1 error. */
static int window_seen_before(WindowObject *w, uint64_t h1, uint64_t h2, double now) {
    if (window_advance(w, now) < 0) return -1;
    BloomObject *newest = w->gens[0];
    w->written[0] = now;
    if (bloom_add(newest, h1, h2)) return 1;
    int seen = 0;
    for (int i = 1; i < w->g; i++) {
        if (bloom_contains(w->gens[i], h1, h2)) {
            seen = 1;
            break;
        }
    }
    if (newest->count >= newest->capacity) {
        w->forced_rotations++;
        if (window_rotate(w, now) < 0) return -1;
    }
    return seen;
}

static int Window_init(WindowObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"share", "gen_fp", "window", "generations", "sizer", NULL};
    long long share;
    double gen_fp, window;
    int g;
    PyObject *sizer = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Lddi|O", kwlist, &share, &gen_fp, &window, &g,
                                     &sizer))
        return -1;
    if (g < 2) {
        PyErr_Format(PyExc_ValueError, "generations must be an integer >= 2, got %d", g);
        return -1;
    }
    if (self->gens != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Window is initialised once");
        return -1;
    }
    self->gens = PyMem_Calloc((size_t)g, sizeof(BloomObject *));
    self->written = PyMem_Calloc((size_t)g, sizeof(double));
    if (self->gens == NULL || self->written == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->g = g;
    for (int i = 0; i < g; i++) {
        self->gens[i] = bloom_new(share, gen_fp);
        if (self->gens[i] == NULL) return -1;
        self->written[i] = -INFINITY;
    }
    self->window = window;
    self->span = window / (double)(g - 1);
    self->gen_fp = gen_fp;
    self->has_started = 0;
    self->started = 0.0;
    self->rotations = 0;
    self->forced_rotations = 0;
    if (sizer != Py_None) {
        Py_INCREF(sizer);
        self->sizer = sizer;
    }
    return 0;
}

static int Window_traverse(WindowObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->sizer);
    return 0;
}

static int Window_clear_refs(WindowObject *self) {
    Py_CLEAR(self->sizer);
    return 0;
}

static void Window_dealloc(WindowObject *self) {
    PyObject_GC_UnTrack(self);
    Window_clear_refs(self);
    if (self->gens != NULL) {
        for (int i = 0; i < self->g; i++) Py_XDECREF(self->gens[i]);
    }
    PyMem_Free(self->gens);
    PyMem_Free(self->written);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int window_now(PyObject *arg, double *now) {
    *now = PyFloat_AsDouble(arg);
    return (*now == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *Window_seen_before(WindowObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "seen_before(key, now)");
        return NULL;
    }
    uint64_t h1, h2;
    double now;
    if (hash_key(args[0], &h1, &h2) < 0 || window_now(args[1], &now) < 0) return NULL;
    int seen = window_seen_before(self, h1, h2, now);
    if (seen < 0) return NULL;
    return PyBool_FromLong(seen);
}

static PyObject *Window_contains(WindowObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "contains(key, now)");
        return NULL;
    }
    uint64_t h1, h2;
    double now;
    if (hash_key(args[0], &h1, &h2) < 0 || window_now(args[1], &now) < 0) return NULL;
    if (window_advance(self, now) < 0) return NULL;
    for (int i = 0; i < self->g; i++) {
        if (bloom_contains(self->gens[i], h1, h2)) Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *Window_clear(WindowObject *self, PyObject *const *args, Py_ssize_t n) {
    for (int i = 0; i < self->g; i++) {
        bloom_clear(self->gens[i]);
        self->written[i] = -INFINITY;
    }
    if (n >= 1 && args[0] != Py_None) {
        if (window_now(args[0], &self->started) < 0) return NULL;
        self->has_started = 1;
    } else {
        self->has_started = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *Window_generations(WindowObject *self, PyObject *unused) {
    PyObject *out = PyTuple_New(self->g);
    if (out == NULL) return NULL;
    for (int i = 0; i < self->g; i++) {
        Py_INCREF(self->gens[i]);
        PyTuple_SET_ITEM(out, i, (PyObject *)self->gens[i]);
    }
    return out;
}

static PyMethodDef Window_methods[] = {
    {"seen_before", (PyCFunction)(void (*)(void))Window_seen_before, METH_FASTCALL,
     "Test key, then record it in the newest generation; one call."},
    {"contains", (PyCFunction)(void (*)(void))Window_contains, METH_FASTCALL,
     "Test key without recording it."},
    {"clear", (PyCFunction)(void (*)(void))Window_clear, METH_FASTCALL,
     "Forget everything; the next generation starts at now (or at the next call)."},
    {"generations", (PyCFunction)Window_generations, METH_NOARGS,
     "The generations, newest first."},
    {NULL},
};

static PyMemberDef Window_members[] = {
    {"window", T_DOUBLE, offsetof(WindowObject, window), READONLY, "seconds remembered"},
    {"num_generations", T_INT, offsetof(WindowObject, g), READONLY, "generations"},
    {"rotations", T_LONGLONG, offsetof(WindowObject, rotations), READONLY, "rotations"},
    {"forced_rotations", T_LONGLONG, offsetof(WindowObject, forced_rotations), READONLY,
     "rotations because the newest generation reached its share"},
    {NULL},
};

static PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.Window",
    .tp_basicsize = sizeof(WindowObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Rotating Bloom generations over a time window.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Window_init,
    .tp_dealloc = (destructor)Window_dealloc,
    .tp_traverse = (traverseproc)Window_traverse,
    .tp_clear = (inquiry)Window_clear_refs,
    .tp_methods = Window_methods,
    .tp_members = Window_members,
};

/* A count-min sketch: 4 rows of 8-bit counters saturating at a ceiling, halved after a
 * period of counts. */
typedef struct {
    uint8_t *rows;   /* 4 rows of `width` counters */
    uint64_t width;  /* a power of two */
    uint8_t ceiling;
    long long added;
    long long period;
} Sketch;

static int sketch_init(Sketch *s, long long keys, uint8_t ceiling, long long periods) {
    uint64_t width = 64;
    while ((long long)width < keys) width *= 2;
    uint8_t *rows = PyMem_Calloc((size_t)(4 * width), 1);
    if (rows == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(s->rows);
    s->rows = rows;
    s->width = width;
    s->ceiling = ceiling;
    s->added = 0;
    s->period = (long long)width * periods;
    return 0;
}

static inline uint64_t sketch_slot(const Sketch *s, uint64_t h1, uint64_t h2, int row) {
    return row * s->width + ((h1 + (uint64_t)row * (h2 | 1)) & (s->width - 1));
}

static inline int sketch_estimate(const Sketch *s, uint64_t h1, uint64_t h2) {
    int least = 255;
    for (int r = 0; r < 4; r++) {
        int v = s->rows[sketch_slot(s, h1, h2, r)];
        if (v < least) least = v;
    }
    return least;
}

/* Counts one sighting (conservative update: only the smallest counters grow); returns the
 * estimate after it. */
static inline int sketch_add(Sketch *s, uint64_t h1, uint64_t h2) {
    int least = sketch_estimate(s, h1, h2);
    if (least < s->ceiling) {
        for (int r = 0; r < 4; r++) {
            uint8_t *v = &s->rows[sketch_slot(s, h1, h2, r)];
            if (*v == least) *v = (uint8_t)(least + 1);
        }
        least++;
    }
    s->added++;
    return least;
}

static void sketch_halve(Sketch *s) {
    for (uint64_t i = 0; i < 4 * s->width; i++) s->rows[i] >>= 1;
    s->added = 0;
}

/* TinyLFU hashes a key from h1 alone: the store index, which names its victim, keeps only h1. */
static inline uint64_t second_hash(uint64_t h1) { return fmix64(h1 ^ 0x5bd1e9955bd1e995ULL); }

/* StoreIndex: the store's bookkeeping. Nodes live in one array and are found through an
 * open-addressing table of node numbers (0 is empty) with backward-shift deletion. Each
 * resident node sits in one queue, newest first; S3-FIFO's ghost queue holds the keys (and
 * charges) of entries evicted from its small queue, which are not resident.
 *
 * Eviction, chosen at creation:
 * - lru: a hit moves the entry to the front; the back is evicted.
 * - sieve (Zhang et al., NSDI'24): a hit marks the entry visited; a hand walks from the back
 *   towards the front, unmarking visited entries and evicting the first unvisited one, and
 *   stays where it stopped.
 * - s3fifo (Yang et al., SOSP'23): a small FIFO of 10% of the bytes, a main FIFO of the rest
 *   and a ghost FIFO of 90% of the bytes; a hit counts (up to 3). New keys enter the small
 *   queue, keys found in the ghost enter the main one. The small queue's oldest entry moves
 *   to main if it was hit twice, else it is evicted into the ghost; main's oldest is evicted
 *   if its count is 0, else re-inserted with one count less. Until the first eviction, new
 *   keys go to main once the small queue is full. An entry larger than the small queue is not
 *   stored. These are libCacheSim's rules, so the two agree on a trace.
 * - wtinylfu (Einziger et al., TOS 2017; Caffeine): new keys enter an LRU window of 1% of
 *   the bytes; what leaves the window is a candidate for the main space (an SLRU: probation,
 *   and a protected 80% that a hit in probation promotes to). When the store is over its
 *   bytes, the candidate and probation's LRU entry meet: the one requested less often, by a
 *   4-row sketch of every request (halved after ten sketch-widths of counts, re-sized then to
 *   the entries held), is evicted; a tie evicts the candidate. */

enum { EV_LRU, EV_SIEVE, EV_S3FIFO, EV_WTINYLFU };
/* S3-FIFO's small queue is W-TinyLFU's window, its main W-TinyLFU's probation. */
enum { Q_MAIN, Q_SMALL, Q_GHOST, Q_PROTECTED, N_QUEUES };

static const char *eviction_names[] = {"lru", "sieve", "s3fifo", "wtinylfu"};

typedef struct {
    uint64_t key;
    long long size;
    long long charge;
    long long hits;
    double stored_at;
    int32_t prev, next;
    uint8_t queue;
    uint8_t freq;
} Node;

typedef struct {
    PyObject_HEAD
    Node *nodes;
    int32_t nodes_cap;
    int32_t free_head;
    int32_t head[N_QUEUES], tail[N_QUEUES];
    long long bytes[N_QUEUES];
    int32_t hand;
    int eviction;
    int has_evicted;
    long long count;   /* resident entries */
    long long ghosts;  /* keys in the ghost queue */
    int32_t *table;
    uint64_t mask;
    long long capacity;
    long long small_capacity;
    long long ghost_capacity;
    long long protected_capacity;
    long long used;
    long long evictions, evicted_bytes, evicted_unread, evicted_unread_bytes;
    long long resident_unread, resident_unread_bytes;
    Sketch sketch;  /* wtinylfu */
} IndexObject;

static inline uint64_t slot_of(uint64_t key, uint64_t mask) {
    return (key * 0x9e3779b97f4a7c15ULL) >> 17 & mask;
}

static int64_t index_find_slot(const IndexObject *x, uint64_t key) {
    uint64_t s = slot_of(key, x->mask);
    for (;;) {
        int32_t n = x->table[s];
        if (n == 0) return -(int64_t)s - 1;
        if (x->nodes[n - 1].key == key) return (int64_t)s;
        s = (s + 1) & x->mask;
    }
}

/* The resident node of key, or -1 (a ghost is not resident). */
static inline int32_t index_find(const IndexObject *x, uint64_t key) {
    int64_t s = index_find_slot(x, key);
    if (s < 0) return -1;
    int32_t i = x->table[s] - 1;
    return x->nodes[i].queue == Q_GHOST ? -1 : i;
}

static int index_grow_table(IndexObject *x) {
    uint64_t size = (x->mask + 1) * 2;
    int32_t *table = PyMem_Calloc((size_t)size, sizeof(int32_t));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t mask = size - 1;
    for (uint64_t i = 0; i <= x->mask; i++) {
        int32_t n = x->table[i];
        if (n == 0) continue;
        uint64_t s = slot_of(x->nodes[n - 1].key, mask);
        while (table[s]) s = (s + 1) & mask;
        table[s] = n;
    }
    PyMem_Free(x->table);
    x->table = table;
    x->mask = mask;
    return 0;
}

static void index_table_remove(IndexObject *x, uint64_t s) {
    uint64_t mask = x->mask;
    uint64_t hole = s;
    uint64_t j = s;
    for (;;) {
        j = (j + 1) & mask;
        int32_t n = x->table[j];
        if (n == 0) break;
        uint64_t home = slot_of(x->nodes[n - 1].key, mask);
        /* Move n into the hole unless its home lies cyclically in (hole, j]. */
        if (hole <= j ? (home <= hole || home > j) : (home <= hole && home > j)) {
            x->table[hole] = n;
            hole = j;
        }
    }
    x->table[hole] = 0;
}

static inline void list_unlink(IndexObject *x, int32_t i) {
    Node *n = &x->nodes[i];
    int q = n->queue;
    if (x->hand == i) x->hand = n->prev;
    if (n->prev >= 0) x->nodes[n->prev].next = n->next; else x->head[q] = n->next;
    if (n->next >= 0) x->nodes[n->next].prev = n->prev; else x->tail[q] = n->prev;
    x->bytes[q] -= n->charge;
}

static inline void list_push_front(IndexObject *x, int32_t i, int q) {
    Node *n = &x->nodes[i];
    n->queue = (uint8_t)q;
    n->prev = -1;
    n->next = x->head[q];
    if (x->head[q] >= 0) x->nodes[x->head[q]].prev = i; else x->tail[q] = i;
    x->head[q] = i;
    x->bytes[q] += n->charge;
}

/* W-TinyLFU counts every request of a key it holds or takes in. */
static void index_count(IndexObject *x, uint64_t key) {
    Sketch *s = &x->sketch;
    sketch_add(s, key, second_hash(key));
    if (s->added >= s->period) {
        long long target = x->count > 1024 ? x->count : 1024;
        if ((target > (long long)s->width * 2 || target * 2 < (long long)s->width) &&
            sketch_init(s, target, 15, 10) == 0)
            return;
        PyErr_Clear();  /* re-sizing is an optimisation: on failure, halve as usual */
        sketch_halve(s);
    }
}

static inline int index_frequency(const IndexObject *x, uint64_t key) {
    return sketch_estimate(&x->sketch, key, second_hash(key));
}

/* A hit's effect on the eviction order. */
static inline void index_touch(IndexObject *x, int32_t i) {
    Node *n = &x->nodes[i];
    switch (x->eviction) {
    case EV_LRU:
        if (x->head[Q_MAIN] != i) {
            list_unlink(x, i);
            list_push_front(x, i, Q_MAIN);
        }
        break;
    case EV_SIEVE:
        n->freq = 1;
        break;
    case EV_WTINYLFU:
        index_count(x, n->key);
        if (n->queue == Q_PROTECTED || n->queue == Q_SMALL) {
            list_unlink(x, i);
            list_push_front(x, i, n->queue);
        } else {
            list_unlink(x, i);
            list_push_front(x, i, Q_PROTECTED);
            while (x->bytes[Q_PROTECTED] > x->protected_capacity && x->tail[Q_PROTECTED] != i) {
                int32_t old = x->tail[Q_PROTECTED];
                list_unlink(x, old);
                list_push_front(x, old, Q_MAIN);
            }
        }
        break;
    default:
        if (n->freq < 3) n->freq++;
    }
}

static inline void index_record_hit(IndexObject *x, int32_t i) {
    Node *n = &x->nodes[i];
    if (n->hits == 0) {
        x->resident_unread--;
        x->resident_unread_bytes -= n->size;
    }
    n->hits++;
}

/* A resident node leaves the store's counts (it is unlinked already). */
static void index_forget(IndexObject *x, Node *n) {
    x->used -= n->charge;
    x->count--;
    if (n->hits == 0) {
        x->resident_unread--;
        x->resident_unread_bytes -= n->size;
    }
}

/* Unlinks node i found at table slot s and frees it; a resident one leaves the counts. */
static void index_drop(IndexObject *x, int32_t i, uint64_t s) {
    Node *n = &x->nodes[i];
    index_table_remove(x, s);
    list_unlink(x, i);
    if (n->queue == Q_GHOST) x->ghosts--; else index_forget(x, n);
    n->next = x->free_head;
    x->free_head = i;
}

/* Removes a resident key (not an eviction); 1 if it was there. */
static int index_delete(IndexObject *x, uint64_t key) {
    int64_t s = index_find_slot(x, key);
    if (s < 0 || x->nodes[x->table[s] - 1].queue == Q_GHOST) return 0;
    index_drop(x, x->table[s] - 1, (uint64_t)s);
    return 1;
}

/* Counts node i's eviction and reports its key; the caller then removes it. */
static int index_count_eviction(IndexObject *x, int32_t i, PyObject *evicted) {
    Node *v = &x->nodes[i];
    x->evictions++;
    x->evicted_bytes += v->size;
    if (v->hits == 0) {
        x->evicted_unread++;
        x->evicted_unread_bytes += v->size;
    }
    if (evicted != NULL) {
        PyObject *k = PyLong_FromUnsignedLongLong(v->key);
        if (k == NULL || PyList_Append(evicted, k) < 0) {
            Py_XDECREF(k);
            return -1;
        }
        Py_DECREF(k);
    }
    return 0;
}

static int index_evict_node(IndexObject *x, int32_t i, PyObject *evicted) {
    if (index_count_eviction(x, i, evicted) < 0) return -1;
    index_drop(x, i, (uint64_t)index_find_slot(x, x->nodes[i].key));
    return 0;
}

static int index_evict_small(IndexObject *x, PyObject *evicted) {
    while (x->tail[Q_SMALL] >= 0) {
        int32_t i = x->tail[Q_SMALL];
        Node *n = &x->nodes[i];
        list_unlink(x, i);
        if (n->freq >= 2) {
            n->freq = 0;
            list_push_front(x, i, Q_MAIN);
            continue;
        }
        /* Evicted into the ghost: the node stays, as a key that is not resident. */
        if (index_count_eviction(x, i, evicted) < 0) return -1;
        index_forget(x, n);
        n->freq = 0;
        list_push_front(x, i, Q_GHOST);
        x->ghosts++;
        while (x->bytes[Q_GHOST] > x->ghost_capacity) {
            int32_t old = x->tail[Q_GHOST];
            index_drop(x, old, (uint64_t)index_find_slot(x, x->nodes[old].key));
        }
        return 0;
    }
    return 0;
}

static int index_evict_main(IndexObject *x, PyObject *evicted) {
    while (x->tail[Q_MAIN] >= 0) {
        int32_t i = x->tail[Q_MAIN];
        Node *n = &x->nodes[i];
        if (n->freq >= 1) {
            list_unlink(x, i);
            n->freq = (uint8_t)((n->freq < 3 ? n->freq : 3) - 1);
            list_push_front(x, i, Q_MAIN);
            continue;
        }
        return index_evict_node(x, i, evicted);
    }
    return 0;
}

static int index_evict(IndexObject *x, PyObject *evicted) {
    x->has_evicted = 1;
    switch (x->eviction) {
    case EV_LRU:
        return index_evict_node(x, x->tail[Q_MAIN], evicted);
    case EV_SIEVE: {
        int32_t i = x->hand >= 0 ? x->hand : x->tail[Q_MAIN];
        while (x->nodes[i].freq > 0) {
            x->nodes[i].freq = 0;
            i = x->nodes[i].prev >= 0 ? x->nodes[i].prev : x->tail[Q_MAIN];
        }
        x->hand = x->nodes[i].prev;
        return index_evict_node(x, i, evicted);
    }
    default:
        if (x->bytes[Q_MAIN] > x->capacity - x->small_capacity || x->bytes[Q_SMALL] == 0)
            return index_evict_main(x, evicted);
        return index_evict_small(x, evicted);
    }
}

/* The largest charge the index stores. */
static inline long long index_max_charge(const IndexObject *x) {
    return x->eviction == EV_S3FIFO ? x->small_capacity : x->capacity;
}

/* W-TinyLFU after key entered the window: what leaves the window becomes a candidate at the
 * front of probation; while over the bytes, the candidates meet probation's LRU entry. */
static int index_settle_window(IndexObject *x, uint64_t key, PyObject *evicted) {
    index_count(x, key);
    long long candidates = 0;
    while (x->bytes[Q_SMALL] > x->small_capacity && x->tail[Q_SMALL] >= 0) {
        int32_t c = x->tail[Q_SMALL];
        list_unlink(x, c);
        list_push_front(x, c, Q_MAIN);
        candidates++;
    }
    while (x->used > x->capacity) {
        int32_t victim = x->tail[Q_MAIN];
        int32_t loser;
        if (victim < 0) {
            loser = x->tail[Q_PROTECTED] >= 0 ? x->tail[Q_PROTECTED] : x->tail[Q_SMALL];
        } else if (candidates > 0 && x->head[Q_MAIN] != victim) {
            /* The oldest candidate still waiting sits just before those moved after it. */
            int32_t candidate = x->head[Q_MAIN];
            for (long long k = 1; k < candidates; k++) candidate = x->nodes[candidate].next;
            candidates--;
            loser = index_frequency(x, x->nodes[candidate].key) >
                            index_frequency(x, x->nodes[victim].key)
                        ? victim
                        : candidate;
        } else {
            if (candidates > 0) candidates--;
            loser = victim;
        }
        if (index_evict_node(x, loser, evicted) < 0) return -1;
    }
    return 0;
}

/* Stores key (replacing it), evicting until it fits; appends the evicted keys to `evicted`
 * when it is not NULL. The caller checked charge <= index_max_charge. */
static int index_put(IndexObject *x, uint64_t key, long long size, long long charge,
                     long long hits, double stored_at, PyObject *evicted) {
    int wtinylfu = x->eviction == EV_WTINYLFU;
    int queue = (x->eviction == EV_S3FIFO || wtinylfu) ? Q_SMALL : Q_MAIN;
    int64_t found = index_find_slot(x, key);
    if (found >= 0) {
        int32_t old = x->table[found] - 1;
        if (x->nodes[old].queue == Q_GHOST) queue = Q_MAIN;
        index_drop(x, old, (uint64_t)found);
    }
    while (!wtinylfu && x->used + charge > x->capacity && x->count > 0) {
        if (index_evict(x, evicted) < 0) return -1;
    }
    /* Until the first eviction, S3-FIFO fills main once the small queue is full. */
    if (queue == Q_SMALL && !x->has_evicted && x->bytes[Q_SMALL] >= x->small_capacity)
        queue = Q_MAIN;
    if (x->free_head < 0) {
        int32_t cap = x->nodes_cap ? x->nodes_cap * 2 : 1024;
        Node *nodes = PyMem_Realloc(x->nodes, sizeof(Node) * (size_t)cap);
        if (nodes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (int32_t i = x->nodes_cap; i < cap; i++) nodes[i].next = i + 1 < cap ? i + 1 : -1;
        x->nodes = nodes;
        x->free_head = x->nodes_cap;
        x->nodes_cap = cap;
    }
    if ((uint64_t)(x->count + x->ghosts + 1) * 2 > x->mask + 1 && index_grow_table(x) < 0)
        return -1;
    int32_t i = x->free_head;
    Node *n = &x->nodes[i];
    x->free_head = n->next;
    n->key = key;
    n->size = size;
    n->charge = charge;
    n->hits = hits;
    n->stored_at = stored_at;
    n->freq = 0;
    int64_t s = index_find_slot(x, key);
    x->table[-s - 1] = i + 1;
    list_push_front(x, i, queue);
    x->count++;
    x->used += charge;
    if (hits == 0) {
        x->resident_unread++;
        x->resident_unread_bytes += size;
    }
    return wtinylfu ? index_settle_window(x, key, evicted) : 0;
}

static int Index_init(IndexObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity_bytes", "eviction", NULL};
    long long capacity;
    const char *eviction = "lru";
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L|s", kwlist, &capacity, &eviction)) return -1;
    if (self->table != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a StoreIndex is initialised once");
        return -1;
    }
    self->eviction = -1;
    for (int e = 0; e < (int)(sizeof(eviction_names) / sizeof(*eviction_names)); e++) {
        if (strcmp(eviction, eviction_names[e]) == 0) self->eviction = e;
    }
    if (self->eviction < 0) {
        PyErr_Format(PyExc_ValueError, "unknown eviction %R; expected one of lru, s3fifo, sieve, wtinylfu",
                     PyTuple_GET_SIZE(args) > 1 ? PyTuple_GET_ITEM(args, 1) : Py_None);
        return -1;
    }
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity_bytes must be positive, got %lld", capacity);
        return -1;
    }
    self->table = PyMem_Calloc(1024, sizeof(int32_t));
    if (self->table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->mask = 1023;
    self->nodes = NULL;
    self->nodes_cap = 0;
    self->free_head = -1;
    for (int q = 0; q < N_QUEUES; q++) {
        self->head[q] = self->tail[q] = -1;
        self->bytes[q] = 0;
    }
    self->hand = -1;
    self->has_evicted = 0;
    self->capacity = capacity;
    if (self->eviction == EV_WTINYLFU) {
        self->small_capacity = capacity / 100;  /* Caffeine's window: 1% */
        self->protected_capacity = (capacity - self->small_capacity) / 5 * 4;
        if (sketch_init(&self->sketch, 1024, 15, 10) < 0) return -1;
    } else {
        /* libCacheSim's sizing: (int64_t)(size * ratio) */
        self->small_capacity = (long long)((double)capacity * 0.1);
        self->ghost_capacity = (long long)((double)capacity * 0.9);
    }
    return 0;
}

static void Index_dealloc(IndexObject *self) {
    PyMem_Free(self->sketch.rows);
    PyMem_Free(self->nodes);
    PyMem_Free(self->table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int parse_key(PyObject *arg, uint64_t *key) {
    *key = PyLong_AsUnsignedLongLong(arg);
    return (*key == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *Index_touch(IndexObject *self, PyObject *arg) {
    uint64_t key;
    if (parse_key(arg, &key) < 0) return NULL;
    int32_t i = index_find(self, key);
    if (i < 0) Py_RETURN_FALSE;
    index_touch(self, i);
    Py_RETURN_TRUE;
}

static PyObject *Index_record_hit(IndexObject *self, PyObject *arg) {
    uint64_t key;
    if (parse_key(arg, &key) < 0) return NULL;
    int32_t i = index_find(self, key);
    if (i >= 0) index_record_hit(self, i);
    Py_RETURN_NONE;
}

static PyObject *Index_hits(IndexObject *self, PyObject *arg) {
    uint64_t key;
    if (parse_key(arg, &key) < 0) return NULL;
    int32_t i = index_find(self, key);
    return PyLong_FromLongLong(i < 0 ? 0 : self->nodes[i].hits);
}

static PyObject *Index_put(IndexObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "put(key, size, charge, hits)");
        return NULL;
    }
    uint64_t key;
    if (parse_key(args[0], &key) < 0) return NULL;
    long long size = PyLong_AsLongLong(args[1]);
    long long charge = PyLong_AsLongLong(args[2]);
    long long hits = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (charge > index_max_charge(self)) {
        PyErr_Format(PyExc_ValueError, "a charge of %lld bytes exceeds the %lld bytes an entry "
                     "may take", charge, index_max_charge(self));
        return NULL;
    }
    PyObject *evicted = PyList_New(0);
    if (evicted == NULL) return NULL;
    if (index_put(self, key, size, charge, hits, 0.0, evicted) < 0) {
        Py_DECREF(evicted);
        return NULL;
    }
    return evicted;
}

static PyObject *Index_delete(IndexObject *self, PyObject *arg) {
    uint64_t key;
    if (parse_key(arg, &key) < 0) return NULL;
    return PyBool_FromLong(index_delete(self, key));
}

static int Index_sq_contains(IndexObject *self, PyObject *arg) {
    uint64_t key;
    if (parse_key(arg, &key) < 0) return -1;
    return index_find(self, key) >= 0;
}

static Py_ssize_t Index_len(IndexObject *self) { return (Py_ssize_t)self->count; }

static PyObject *Index_estimated_capacity_objects(IndexObject *self, PyObject *unused) {
    if (self->used == 0) return PyLong_FromLong(0);
    double estimate = nearbyint((double)self->capacity * (double)self->count / (double)self->used);
    return PyLong_FromDouble(estimate);
}

static PyObject *Index_max_charge(IndexObject *self, void *closure) {
    return PyLong_FromLongLong(index_max_charge(self));
}

static PyObject *Index_eviction(IndexObject *self, void *closure) {
    return PyUnicode_FromString(eviction_names[self->eviction]);
}

static PyMethodDef Index_methods[] = {
    {"touch", (PyCFunction)Index_touch, METH_O,
     "A hit's effect on the eviction order; False if key is absent."},
    {"record_hit", (PyCFunction)Index_record_hit, METH_O, "Count one answer served from key."},
    {"hits", (PyCFunction)Index_hits, METH_O, "Answers served from key's entry (0 if absent)."},
    {"put", (PyCFunction)(void (*)(void))Index_put, METH_FASTCALL,
     "put(key, size, charge, hits): store key, replacing it; returns the keys evicted."},
    {"delete", (PyCFunction)Index_delete, METH_O, "Remove key (not an eviction)."},
    {"estimated_capacity_objects", (PyCFunction)Index_estimated_capacity_objects, METH_NOARGS,
     "Objects of the resident mean charge the index holds when full (0 when empty)."},
    {NULL},
};

static PyGetSetDef Index_getset[] = {
    {"max_charge", (getter)Index_max_charge, NULL, "The largest charge an entry may have.", NULL},
    {"eviction", (getter)Index_eviction, NULL, "The eviction policy's name.", NULL},
    {NULL},
};

static PyMemberDef Index_members[] = {
    {"capacity_bytes", T_LONGLONG, offsetof(IndexObject, capacity), READONLY, ""},
    {"bytes_used", T_LONGLONG, offsetof(IndexObject, used), READONLY, ""},
    {"ghosts", T_LONGLONG, offsetof(IndexObject, ghosts), READONLY, "keys in the ghost queue"},
    {"evictions", T_LONGLONG, offsetof(IndexObject, evictions), READONLY, ""},
    {"evicted_bytes", T_LONGLONG, offsetof(IndexObject, evicted_bytes), READONLY, ""},
    {"evicted_unread", T_LONGLONG, offsetof(IndexObject, evicted_unread), READONLY, ""},
    {"evicted_unread_bytes", T_LONGLONG, offsetof(IndexObject, evicted_unread_bytes), READONLY,
     ""},
    {"resident_unread", T_LONGLONG, offsetof(IndexObject, resident_unread), READONLY, ""},
    {"resident_unread_bytes", T_LONGLONG, offsetof(IndexObject, resident_unread_bytes), READONLY,
     ""},
    {NULL},
};

static PySequenceMethods Index_as_sequence = {
    .sq_length = (lenfunc)Index_len,
    .sq_contains = (objobjproc)Index_sq_contains,
};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.StoreIndex",
    .tp_basicsize = sizeof(IndexObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The store's bookkeeping over 64-bit key hashes: lru, sieve, s3fifo or wtinylfu "
              "eviction, with dead-write accounting.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Index_init,
    .tp_dealloc = (destructor)Index_dealloc,
    .tp_methods = Index_methods,
    .tp_members = Index_members,
    .tp_getset = Index_getset,
    .tp_as_sequence = &Index_as_sequence,
};

/* Admission: which cacheable responses of missed keys are stored. One object per policy,
 * driven by the proxy (through proxy/core/admission.py) and by the simulator's loop alike.
 *
 * - always: everything.
 * - second-hit: keys already seen in a Window.
 * - nth-hit:N: keys sighted N times, counted in a count-min sketch (4 rows of 8-bit counters
 *   saturating at 255) whose counts halve once it has counted as many sightings as it has
 *   columns: an aging window of about one sketch-width of sightings.
 * - tinylfu (Einziger et al., TOS 2017): every request is counted, first in a doorkeeper
 *   Bloom filter and from the second on in the sketch (counters saturate at 15, as 4-bit
 *   ones would); after ten sketch-widths of counts the sketch halves and the doorkeeper
 *   clears. A candidate is admitted while the store has room, else only when its estimated
 *   frequency beats that of the entry the store would evict next.
 * - probabilistic:p: each miss admitted with probability p (xorshift64*, fixed seed, so a
 *   run is repeatable and the live proxy and the simulator decide alike).
 * - size-below:BYTES: responses smaller than BYTES.
 * - adaptive: several candidate policies decide side by side, each fed every request; the
 *   one whose shadow cache scores the most hits decides. The shadows are caches of `rate`
 *   times the store's bytes, each with its candidate's policy, fed the requests of the keys
 *   whose hash falls under `rate` of the hash space (spatial sampling, as SHARDS does). Every
 *   `period` sampled requests the scores are compared, then halved; the choice moves only to
 *   a candidate ahead by more than `margin` of a period's requests.
 * The sketch is sized to a power of two at least the keys it is given, and re-sized at a
 * halving when a sizer (the store's object count) asks for twice or half as many. */

enum {
    A_ALWAYS, A_SECOND_HIT, A_NTH_HIT, A_TINYLFU, A_PROBABILISTIC, A_SIZE_BELOW, A_ADAPTIVE
};

static const char *admission_kinds[] = {
    "always", "second-hit", "nth-hit", "tinylfu", "probabilistic", "size-below", "adaptive",
};

typedef struct {
    PyObject_HEAD
    int kind;
    WindowObject *window;
    IndexObject *index;
    BloomObject *doorkeeper;
    PyObject *sizer;
    Sketch sketch;
    int threshold;
    double probability;
    uint64_t rng;
    long long limit;
    long long halvings;
    long long admitted;
    long long rejected;
    /* adaptive */
    PyObject *candidates;  /* tuple of Admission: each candidate, deciding for the store */
    PyObject *shadows;     /* tuple of StoreIndex: each candidate's shadow cache */
    PyObject *shadow_policies;  /* tuple of Admission: each candidate, for its shadow */
    double *scores;
    int choice;
    uint64_t sample_below;
    long long overhead;
    long long period;
    long long sampled;
    long long margin_hits;
    long long switches;
} AdmissionObject;

static PyTypeObject AdmissionType;

/* At a halving, the sketch follows the sizer's key count when it doubled or halved. */
static int admission_age(AdmissionObject *a) {
    Sketch *s = &a->sketch;
    a->halvings++;
    if (a->sizer != NULL) {
        PyObject *r = PyObject_CallNoArgs(a->sizer);
        if (r == NULL) return -1;
        long long keys = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (keys == -1 && PyErr_Occurred()) return -1;
        if (keys > (long long)s->width * 2 || keys * 2 < (long long)s->width) {
            long long periods = s->period / (long long)s->width;
            if (sketch_init(s, keys, s->ceiling, periods) < 0) return -1;
            if (a->doorkeeper != NULL && bloom_setup(a->doorkeeper, (long long)s->width, 0.01) < 0)
                return -1;
            return 0;
        }
    }
    sketch_halve(s);
    if (a->doorkeeper != NULL) bloom_clear(a->doorkeeper);
    return 0;
}

static inline int tinylfu_estimate(const AdmissionObject *a, uint64_t h1) {
    uint64_t h2 = second_hash(h1);
    return sketch_estimate(&a->sketch, h1, h2) + bloom_contains(a->doorkeeper, h1, h2);
}

static int admission_admit(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size,
                           double now);
static int adaptive_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size,
                            double now);

/* Every request, hit or miss, once its size is known: TinyLFU counts them all, adaptive
 * feeds its candidates and shadows; the others ignore it. */
static inline int admission_observe(AdmissionObject *a, uint64_t h1, uint64_t h2,
                                    long long size, double now) {
    if (a->kind == A_ADAPTIVE) return adaptive_observe(a, h1, h2, size, now);
    if (a->kind != A_TINYLFU) return 0;
    h2 = second_hash(h1);
    if (bloom_add(a->doorkeeper, h1, h2)) sketch_add(&a->sketch, h1, h2);
    else a->sketch.added++;
    if (a->sketch.added >= a->sketch.period) return admission_age(a);
    return 0;
}

/* The key the index would evict next, without evicting it; 0 with found = 0 when empty. */
static uint64_t index_peek_victim(const IndexObject *x, int *found) {
    int32_t i = -1;
    switch (x->eviction) {
    case EV_LRU:
        i = x->tail[Q_MAIN];
        break;
    case EV_SIEVE:
        i = x->hand >= 0 ? x->hand : x->tail[Q_MAIN];
        for (long long steps = 0; i >= 0 && x->nodes[i].freq > 0 && steps <= x->count; steps++)
            i = x->nodes[i].prev >= 0 ? x->nodes[i].prev : x->tail[Q_MAIN];
        break;
    case EV_WTINYLFU:
        i = x->tail[Q_MAIN] >= 0 ? x->tail[Q_MAIN] : x->tail[Q_PROTECTED];
        break;
    default:
        i = (x->bytes[Q_MAIN] > x->capacity - x->small_capacity || x->tail[Q_SMALL] < 0)
                ? x->tail[Q_MAIN]
                : x->tail[Q_SMALL];
    }
    *found = i >= 0;
    return i >= 0 ? x->nodes[i].key : 0;
}

/* 1 admit, 0 not, -1 error. */
static int admission_admit(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size,
                           double now) {
    int admit = 1;
    switch (a->kind) {
    case A_ALWAYS:
        break;
    case A_SECOND_HIT:
        admit = window_seen_before(a->window, h1, h2, now);
        break;
    case A_NTH_HIT:
        admit = sketch_add(&a->sketch, h1, h2) >= a->threshold;
        if (a->sketch.added >= a->sketch.period && admission_age(a) < 0) return -1;
        break;
    case A_TINYLFU: {
        IndexObject *x = a->index;
        if (x->used + size <= x->capacity) break;
        int found;
        uint64_t victim = index_peek_victim(x, &found);
        if (!found) break;
        admit = tinylfu_estimate(a, h1) > tinylfu_estimate(a, victim);
        break;
    }
    case A_PROBABILISTIC: {
        a->rng ^= a->rng >> 12;
        a->rng ^= a->rng << 25;
        a->rng ^= a->rng >> 27;
        double u = (double)((a->rng * 0x2545F4914F6CDD1DULL) >> 11) * 0x1.0p-53;
        admit = u < a->probability;
        break;
    }
    case A_ADAPTIVE: {
        Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
        for (Py_ssize_t j = 0; j < n; j++) {
            AdmissionObject *c = (AdmissionObject *)PyTuple_GET_ITEM(a->candidates, j);
            int says = admission_admit(c, h1, h2, size, now);
            if (says < 0) return -1;
            if (j == a->choice) admit = says;
        }
        break;
    }
    default:
        admit = size < a->limit;
    }
    if (admit < 0) return -1;
    if (admit) a->admitted++; else a->rejected++;
    return admit;
}

static int adaptive_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size,
                            double now) {
    Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
    for (Py_ssize_t j = 0; j < n; j++) {
        AdmissionObject *c = (AdmissionObject *)PyTuple_GET_ITEM(a->candidates, j);
        if (admission_observe(c, h1, h2, size, now) < 0) return -1;
    }
    if (h1 >= a->sample_below) return 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        IndexObject *x = (IndexObject *)PyTuple_GET_ITEM(a->shadows, j);
        AdmissionObject *p = (AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, j);
        if (admission_observe(p, h1, h2, size, now) < 0) return -1;
        int32_t i = index_find(x, h1);
        if (i >= 0) {
            index_touch(x, i);
            a->scores[j] += 1.0;
            continue;
        }
        long long charge = size + a->overhead;
        if (charge > index_max_charge(x)) continue;
        int admit = admission_admit(p, h1, h2, size, now);
        if (admit < 0) return -1;
        if (admit && index_put(x, h1, size, charge, 0, now, NULL) < 0) return -1;
    }
    if (++a->sampled % a->period == 0) {
        int best = a->choice;
        for (Py_ssize_t j = 0; j < n; j++) {
            if (a->scores[j] > a->scores[best]) best = (int)j;
        }
        if (best != a->choice && a->scores[best] - a->scores[a->choice] > a->margin_hits) {
            a->choice = best;
            a->switches++;
        }
        for (Py_ssize_t j = 0; j < n; j++) a->scores[j] /= 2.0;
    }
    return 0;
}

static int Admission_init(AdmissionObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind", "window", "index", "keys", "threshold", "probability",
                             "limit", "sizer", "candidates", "shadows", "shadow_policies",
                             "rate", "overhead", "period", "margin", "choice", NULL};
    const char *kind;
    PyObject *window = Py_None, *index = Py_None, *sizer = Py_None;
    PyObject *candidates = Py_None, *shadows = Py_None, *shadow_policies = Py_None;
    long long keys = 1024, limit = 0, overhead = 0, period = 4096;
    int threshold = 2;
    double probability = 1.0, rate = 1.0 / 16, margin = 0.002;
    int choice = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|$OOLidLOOOOdLLdi", kwlist, &kind, &window,
                                     &index, &keys, &threshold, &probability, &limit, &sizer,
                                     &candidates, &shadows, &shadow_policies, &rate, &overhead,
                                     &period, &margin, &choice))
        return -1;
    if (self->kind != 0 || self->window != NULL || self->sketch.rows != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "an Admission is initialised once");
        return -1;
    }
    self->kind = -1;
    for (int k = 0; k < (int)(sizeof(admission_kinds) / sizeof(*admission_kinds)); k++) {
        if (strcmp(kind, admission_kinds[k]) == 0) self->kind = k;
    }
    if (self->kind < 0) {
        PyErr_Format(PyExc_ValueError, "unknown admission kind %s", kind);
        return -1;
    }
    if (self->kind == A_SECOND_HIT) {
        if (!PyObject_TypeCheck(window, &WindowType)) {
            PyErr_SetString(PyExc_TypeError, "second-hit needs a window");
            return -1;
        }
        Py_INCREF(window);
        self->window = (WindowObject *)window;
    }
    if (self->kind == A_TINYLFU) {
        if (!PyObject_TypeCheck(index, &IndexType)) {
            PyErr_SetString(PyExc_TypeError, "tinylfu needs the store's index");
            return -1;
        }
        Py_INCREF(index);
        self->index = (IndexObject *)index;
    }
    if (self->kind == A_NTH_HIT || self->kind == A_TINYLFU) {
        int tiny = self->kind == A_TINYLFU;
        if (sketch_init(&self->sketch, keys, tiny ? 15 : 255, tiny ? 10 : 1) < 0) return -1;
        if (tiny) {
            self->doorkeeper = bloom_new((long long)self->sketch.width, 0.01);
            if (self->doorkeeper == NULL) return -1;
        }
        if (sizer != Py_None) {
            Py_INCREF(sizer);
            self->sizer = sizer;
        }
    }
    if (self->kind == A_NTH_HIT && (threshold < 1 || threshold > 255)) {
        PyErr_Format(PyExc_ValueError, "nth-hit counts 1 to 255 sightings, got %d", threshold);
        return -1;
    }
    if (self->kind == A_ADAPTIVE) {
        if (!PyTuple_Check(candidates) || !PyTuple_Check(shadows) ||
            !PyTuple_Check(shadow_policies) || PyTuple_GET_SIZE(candidates) < 1 ||
            PyTuple_GET_SIZE(shadows) != PyTuple_GET_SIZE(candidates) ||
            PyTuple_GET_SIZE(shadow_policies) != PyTuple_GET_SIZE(candidates)) {
            PyErr_SetString(PyExc_TypeError, "adaptive needs tuples of candidates, shadows and "
                                             "shadow policies, one of each per candidate");
            return -1;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(candidates); j++) {
            if (!PyObject_TypeCheck(PyTuple_GET_ITEM(candidates, j), &AdmissionType) ||
                !PyObject_TypeCheck(PyTuple_GET_ITEM(shadow_policies, j), &AdmissionType) ||
                !PyObject_TypeCheck(PyTuple_GET_ITEM(shadows, j), &IndexType)) {
                PyErr_SetString(PyExc_TypeError, "candidates and shadow policies are Admission "
                                                 "objects, shadows StoreIndex objects");
                return -1;
            }
        }
        if (!(rate > 0.0 && rate <= 1.0) || period < 1 || choice < 0 ||
            choice >= PyTuple_GET_SIZE(candidates)) {
            PyErr_SetString(PyExc_ValueError,
                            "adaptive needs 0 < rate <= 1, period >= 1 and a candidate to start");
            return -1;
        }
        self->scores = PyMem_Calloc((size_t)PyTuple_GET_SIZE(candidates), sizeof(double));
        if (self->scores == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        Py_INCREF(candidates);
        Py_INCREF(shadows);
        Py_INCREF(shadow_policies);
        self->candidates = candidates;
        self->shadows = shadows;
        self->shadow_policies = shadow_policies;
        self->sample_below = rate >= 1.0 ? UINT64_MAX : (uint64_t)(rate * 18446744073709551616.0);
        self->overhead = overhead;
        self->period = period;
        self->margin_hits = (long long)(margin * (double)period);
        self->choice = choice;
    }
    self->threshold = threshold;
    self->probability = probability;
    self->rng = 0x9e3779b97f4a7c15ULL;
    self->limit = limit;
    return 0;
}

static int Admission_traverse(AdmissionObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->window);
    Py_VISIT(self->index);
    Py_VISIT(self->sizer);
    Py_VISIT(self->candidates);
    Py_VISIT(self->shadows);
    Py_VISIT(self->shadow_policies);
    return 0;
}

static int Admission_clear_refs(AdmissionObject *self) {
    Py_CLEAR(self->window);
    Py_CLEAR(self->index);
    Py_CLEAR(self->sizer);
    Py_CLEAR(self->candidates);
    Py_CLEAR(self->shadows);
    Py_CLEAR(self->shadow_policies);
    return 0;
}

static void Admission_dealloc(AdmissionObject *self) {
    PyObject_GC_UnTrack(self);
    Admission_clear_refs(self);
    Py_XDECREF(self->doorkeeper);
    PyMem_Free(self->scores);
    PyMem_Free(self->sketch.rows);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Admission_admit(AdmissionObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "admit(key, size, now)");
        return NULL;
    }
    uint64_t h1, h2;
    if (hash_key(args[0], &h1, &h2) < 0) return NULL;
    long long size = PyLong_AsLongLong(args[1]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    double now;
    if (window_now(args[2], &now) < 0) return NULL;
    int admit = admission_admit(self, h1, h2, size, now);
    if (admit < 0) return NULL;
    return PyBool_FromLong(admit);
}

static PyObject *Admission_observe(AdmissionObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "observe(key, size, now)");
        return NULL;
    }
    uint64_t h1, h2;
    if (hash_key(args[0], &h1, &h2) < 0) return NULL;
    long long size = PyLong_AsLongLong(args[1]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    double now;
    if (window_now(args[2], &now) < 0) return NULL;
    if (admission_observe(self, h1, h2, size, now) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Admission_scores(AdmissionObject *self, PyObject *unused) {
    if (self->kind != A_ADAPTIVE) return PyTuple_New(0);
    Py_ssize_t n = PyTuple_GET_SIZE(self->candidates);
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = PyFloat_FromDouble(self->scores[j]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, j, v);
    }
    return out;
}

static PyObject *Admission_estimate(AdmissionObject *self, PyObject *key) {
    uint64_t h1, h2;
    if (hash_key(key, &h1, &h2) < 0) return NULL;
    if (self->kind == A_TINYLFU) return PyLong_FromLong(tinylfu_estimate(self, h1));
    if (self->kind == A_NTH_HIT) return PyLong_FromLong(sketch_estimate(&self->sketch, h1, h2));
    PyErr_SetString(PyExc_TypeError, "only nth-hit and tinylfu count sightings");
    return NULL;
}

static PyObject *Admission_reset(AdmissionObject *self, PyObject *unused) {
    if (self->sketch.rows != NULL) {
        memset(self->sketch.rows, 0, (size_t)(4 * self->sketch.width));
        self->sketch.added = 0;
    }
    if (self->doorkeeper != NULL) bloom_clear(self->doorkeeper);
    Py_RETURN_NONE;
}

static PyObject *Admission_sketch_bytes(AdmissionObject *self, void *closure) {
    long long bytes = (long long)(4 * self->sketch.width) * (self->sketch.rows != NULL);
    if (self->doorkeeper != NULL) bytes += self->doorkeeper->nbytes;
    return PyLong_FromLongLong(bytes);
}

static PyObject *Admission_kind(AdmissionObject *self, void *closure) {
    return PyUnicode_FromString(admission_kinds[self->kind]);
}

static PyMethodDef Admission_methods[] = {
    {"admit", (PyCFunction)(void (*)(void))Admission_admit, METH_FASTCALL,
     "admit(key, size, now): whether a missed key's cacheable response is stored."},
    {"observe", (PyCFunction)(void (*)(void))Admission_observe, METH_FASTCALL,
     "observe(key, size, now): one request of key, hit or miss, once its size is known."},
    {"estimate", (PyCFunction)Admission_estimate, METH_O, "A key's counted sightings."},
    {"reset", (PyCFunction)Admission_reset, METH_NOARGS, "Forget every count."},
    {"scores", (PyCFunction)Admission_scores, METH_NOARGS,
     "adaptive: each candidate's recent shadow hits (halved every period)."},
    {NULL},
};

static PyGetSetDef Admission_getset[] = {
    {"kind", (getter)Admission_kind, NULL, "The policy's kind.", NULL},
    {"sketch_bytes", (getter)Admission_sketch_bytes, NULL,
     "Bytes of the sketch and doorkeeper.", NULL},
    {NULL},
};

static PyMemberDef Admission_members[] = {
    {"halvings", T_LONGLONG, offsetof(AdmissionObject, halvings), READONLY,
     "times the sketch aged (halved, or was re-sized)"},
    {"admitted", T_LONGLONG, offsetof(AdmissionObject, admitted), READONLY, ""},
    {"rejected", T_LONGLONG, offsetof(AdmissionObject, rejected), READONLY, ""},
    {"choice", T_INT, offsetof(AdmissionObject, choice), READONLY,
     "adaptive: the candidate deciding now (its index)"},
    {"switches", T_LONGLONG, offsetof(AdmissionObject, switches), READONLY,
     "adaptive: times the deciding candidate changed"},
    {"sampled", T_LONGLONG, offsetof(AdmissionObject, sampled), READONLY,
     "adaptive: requests its shadows saw"},
    {NULL},
};

static PyTypeObject AdmissionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.Admission",
    .tp_basicsize = sizeof(AdmissionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An admission policy (see the module's rules).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Admission_init,
    .tp_dealloc = (destructor)Admission_dealloc,
    .tp_traverse = (traverseproc)Admission_traverse,
    .tp_clear = (inquiry)Admission_clear_refs,
    .tp_methods = Admission_methods,
    .tp_members = Admission_members,
    .tp_getset = Admission_getset,
};

/* The simulator's loop. */

enum {
    C_REQUESTS, C_HITS, C_MISSES, C_HIT_BYTES, C_BYTES_SERVED, C_ORIGIN_FETCHES,
    C_ORIGIN_BYTES, C_TOO_LARGE, C_REJECTED, C_BYTES_NOT_WRITTEN, C_ADMISSIONS,
    C_BYTES_WRITTEN, C_COUNT
};

static const char *counter_names[C_COUNT] = {
    "requests", "hits", "misses", "hit_bytes", "bytes_served", "origin_fetches",
    "origin_bytes", "too_large", "rejected_first_sighting", "bytes_not_written", "admissions",
    "bytes_written",
};

static int get_array(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t itemsize,
                     char kind) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    char f = view->format ? view->format[strlen(view->format) - 1] : 'B';
    int ok = view->itemsize == itemsize &&
             (kind == 'f' ? f == 'd' : (kind == 'u' ? (f == 'Q' || f == 'L')
                                                   : (f == 'q' || f == 'l')));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s array", what,
                     kind == 'f' ? "float64" : (kind == 'u' ? "uint64" : "int64"));
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int format_decimal(char *out, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

static PyObject *py_simulate_chunk(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"index", "admission", "times", "ids", "sizes", "prefix",
                             "prefix_chars", "ttl", "entry_overhead", "max_object_bytes",
                             "names_h1", "names_h2", "names_chars", NULL};
    PyObject *index_obj, *admission_obj, *times_obj, *ids_obj, *sizes_obj;
    PyObject *nh1_obj = Py_None, *nh2_obj = Py_None, *nchars_obj = Py_None;
    Py_buffer prefix;
    long long prefix_chars, overhead, max_object;
    double ttl;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOy*LdLL|OOO", kwlist, &IndexType,
                                     &index_obj, &AdmissionType, &admission_obj, &times_obj,
                                     &ids_obj, &sizes_obj,
                                     &prefix, &prefix_chars, &ttl, &overhead, &max_object,
                                     &nh1_obj, &nh2_obj, &nchars_obj))
        return NULL;
    IndexObject *x = (IndexObject *)index_obj;
    AdmissionObject *a = (AdmissionObject *)admission_obj;
    Py_buffer tv, iv, sv, h1v = {0}, h2v = {0}, cv = {0};
    int named = nh1_obj != Py_None;
    PyObject *result = NULL;
    int have_t = 0, have_i = 0, have_s = 0, have_named = 0;
    if (get_array(times_obj, &tv, "times", 8, 'f') < 0) goto done;
    have_t = 1;
    if (get_array(ids_obj, &iv, "ids", 8, named ? 'i' : 'u') < 0) goto done;
    have_i = 1;
    if (get_array(sizes_obj, &sv, "sizes", 8, 'i') < 0) goto done;
    have_s = 1;
    if (named) {
        if (get_array(nh1_obj, &h1v, "names_h1", 8, 'u') < 0) goto done;
        if (get_array(nh2_obj, &h2v, "names_h2", 8, 'u') < 0) {
            PyBuffer_Release(&h1v);
            goto done;
        }
        if (get_array(nchars_obj, &cv, "names_chars", 8, 'i') < 0) {
            PyBuffer_Release(&h1v);
            PyBuffer_Release(&h2v);
            goto done;
        }
        have_named = 1;
    }
    Py_ssize_t n = tv.len / 8;
    if (iv.len / 8 != n || sv.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "times, ids and sizes must have one length");
        goto done;
    }
    const double *times = tv.buf;
    const uint64_t *ids = iv.buf;
    const long long *sizes = sv.buf;
    const uint64_t *nh1 = named ? h1v.buf : NULL, *nh2 = named ? h2v.buf : NULL;
    const long long *nchars = named ? cv.buf : NULL;
    Py_ssize_t names = named ? h1v.len / 8 : 0;
    long long c[C_COUNT] = {0};
    char *key = PyMem_Malloc((size_t)prefix.len + 24);
    if (key == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(key, prefix.buf, (size_t)prefix.len);
    const int finite_ttl = !isinf(ttl);
    for (Py_ssize_t r = 0; r < n; r++) {
        const double now = times[r];
        const long long size = sizes[r];
        uint64_t h1, h2;
        long long chars;
        if (named) {
            uint64_t id = ids[r];
            if (id >= (uint64_t)names) {
                PyErr_Format(PyExc_IndexError, "key id %llu has no name", (unsigned long long)id);
                PyMem_Free(key);
                goto done;
            }
            h1 = nh1[id];
            h2 = nh2[id];
            chars = nchars[id];
        } else {
            int digits = format_decimal(key + prefix.len, ids[r]);
            murmur3_128((const uint8_t *)key, prefix.len + digits, &h1, &h2);
            chars = prefix_chars + digits;
        }
        c[C_REQUESTS]++;
        int32_t i = index_find(x, h1);
        if (i >= 0) {
            index_touch(x, i);
            Node *node = &x->nodes[i];
            double resident = now - node->stored_at;
            if (!finite_ttl || (resident > 0.0 ? resident : 0.0) < ttl) {
                if (admission_observe(a, h1, h2, node->size, now) < 0) {
                    PyMem_Free(key);
                    goto done;
                }
                c[C_HITS]++;
                c[C_HIT_BYTES] += node->size;
                c[C_BYTES_SERVED] += node->size;
                index_record_hit(x, i);
                continue;
            }
        }
        c[C_MISSES]++;
        c[C_ORIGIN_FETCHES]++;
        c[C_ORIGIN_BYTES] += size;
        c[C_BYTES_SERVED] += size;
        if (admission_observe(a, h1, h2, size, now) < 0) {
            PyMem_Free(key);
            goto done;
        }
        if (size > max_object) {
            c[C_TOO_LARGE]++;
            continue;
        }
        if (i < 0) {
            int admit = admission_admit(a, h1, h2, size, now);
            if (admit < 0) {
                PyMem_Free(key);
                goto done;
            }
            if (!admit) {
                c[C_REJECTED]++;
                c[C_BYTES_NOT_WRITTEN] += size;
                continue;
            }
        }
        long long charge = overhead ? size + overhead + 2 * chars : size;
        if (charge > index_max_charge(x)) {
            c[C_TOO_LARGE]++;
            continue;
        }
        if (index_put(x, h1, size, charge, 0, now, NULL) < 0) {
            PyMem_Free(key);
            goto done;
        }
        c[C_ADMISSIONS]++;
        c[C_BYTES_WRITTEN] += size;
    }
    PyMem_Free(key);
    result = PyDict_New();
    if (result == NULL) goto done;
    for (int k = 0; k < C_COUNT; k++) {
        PyObject *v = PyLong_FromLongLong(c[k]);
        if (v == NULL || PyDict_SetItemString(result, counter_names[k], v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(v);
    }
done:
    PyBuffer_Release(&prefix);
    if (have_t) PyBuffer_Release(&tv);
    if (have_i) PyBuffer_Release(&iv);
    if (have_s) PyBuffer_Release(&sv);
    if (have_named) {
        PyBuffer_Release(&h1v);
        PyBuffer_Release(&h2v);
        PyBuffer_Release(&cv);
    }
    return result;
}

/* h1 of each numeric id's key (prefix, then the id in decimal), as the simulator hashes it. */
static PyObject *py_hash_ids(PyObject *module, PyObject *args) {
    PyObject *ids_obj, *out_obj;
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "Oy*O", &ids_obj, &prefix, &out_obj)) return NULL;
    Py_buffer iv, ov;
    PyObject *result = NULL;
    if (get_array(ids_obj, &iv, "ids", 8, 'u') < 0) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &ov, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        goto release_ids;
    if (ov.itemsize != 8 || ov.len != iv.len) {
        PyErr_SetString(PyExc_ValueError, "out must be a writable uint64 array as long as ids");
        goto release_all;
    }
    char *key = PyMem_Malloc((size_t)prefix.len + 24);
    if (key == NULL) {
        PyErr_NoMemory();
        goto release_all;
    }
    memcpy(key, prefix.buf, (size_t)prefix.len);
    const uint64_t *ids = iv.buf;
    uint64_t *out = ov.buf;
    Py_ssize_t n = iv.len / 8;
    for (Py_ssize_t r = 0; r < n; r++) {
        uint64_t h2;
        int digits = format_decimal(key + prefix.len, ids[r]);
        murmur3_128((const uint8_t *)key, prefix.len + digits, &out[r], &h2);
    }
    PyMem_Free(key);
    result = Py_NewRef(Py_None);
release_all:
    PyBuffer_Release(&ov);
release_ids:
    PyBuffer_Release(&iv);
    PyBuffer_Release(&prefix);
    return result;
}

/* Distinct objects and their bytes, each at its largest requested size, through one
 * open-addressing table of (id, largest size) slots, -1 marking an empty one: linear in the
 * trace where sorting it would not be, and sized by the objects rather than the requests. */
typedef struct {
    uint64_t id;
    long long largest;
} Seen;

static Seen *seen_table(uint64_t slots) {
    Seen *t = PyMem_Malloc(sizeof(Seen) * slots);
    if (t != NULL) {
        for (uint64_t i = 0; i < slots; i++) t[i].largest = -1;
    }
    return t;
}

static PyObject *py_footprint(PyObject *module, PyObject *args) {
    PyObject *ids_obj, *sizes_obj;
    if (!PyArg_ParseTuple(args, "OO", &ids_obj, &sizes_obj)) return NULL;
    Py_buffer iv, sv;
    if (get_array(ids_obj, &iv, "ids", 8, 'u') < 0) return NULL;
    if (get_array(sizes_obj, &sv, "sizes", 8, 'i') < 0) {
        PyBuffer_Release(&iv);
        return NULL;
    }
    Py_ssize_t n = iv.len / 8;
    PyObject *result = NULL;
    if (sv.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "ids and sizes must have one length");
        goto done;
    }
    uint64_t mask = 1023;
    Seen *table = seen_table(mask + 1);
    if (table == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const uint64_t *ids = iv.buf;
    const long long *sizes = sv.buf;
    long long objects = 0, bytes = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (sizes[r] < 0) {
            PyMem_Free(table);
            PyErr_Format(PyExc_ValueError, "request %zd has a negative size", r);
            goto done;
        }
        uint64_t s = slot_of(ids[r], mask);
        while (table[s].largest >= 0 && table[s].id != ids[r]) s = (s + 1) & mask;
        if (table[s].largest < 0) {
            table[s].id = ids[r];
            table[s].largest = sizes[r];
            objects++;
            bytes += sizes[r];
            if ((uint64_t)objects * 2 > mask + 1) {
                uint64_t bigger = (mask + 1) * 2 - 1;
                Seen *grown = seen_table(bigger + 1);
                if (grown == NULL) {
                    PyMem_Free(table);
                    PyErr_NoMemory();
                    goto done;
                }
                for (uint64_t i = 0; i <= mask; i++) {
                    if (table[i].largest < 0) continue;
                    uint64_t t = slot_of(table[i].id, bigger);
                    while (grown[t].largest >= 0) t = (t + 1) & bigger;
                    grown[t] = table[i];
                }
                PyMem_Free(table);
                table = grown;
                mask = bigger;
            }
        } else if (sizes[r] > table[s].largest) {
            bytes += sizes[r] - table[s].largest;
            table[s].largest = sizes[r];
        }
    }
    PyMem_Free(table);
    result = Py_BuildValue("(LL)", objects, bytes);
done:
    PyBuffer_Release(&iv);
    PyBuffer_Release(&sv);
    return result;
}

/* Header fields: lower-cased names, as str.lower() gives them. */

/* The lower-cased form of the ASCII names met so far, by name, up to LOWERED_MAX of them. A
 * proxy meets a few dozen distinct names, each on nearly every message: a lookup costs less
 * than a new string, the lower-cased one keeps its hash, and every stored response's index of
 * its fields shares its keys. Names past the bound (a client inventing them) are lower-cased
 * anew each time, as before. */
#define LOWERED_MAX 512
static PyObject *lowered;

/* name.lower(): an exact str, built here for an ASCII name, else by str.lower. */
static PyObject *lower_name(PyObject *name) {
    if (!PyUnicode_Check(name) || !PyUnicode_IS_ASCII(name))
        return PyObject_CallMethod(name, "lower", NULL);
    Py_ssize_t n = PyUnicode_GET_LENGTH(name);
    const Py_UCS1 *s = PyUnicode_1BYTE_DATA(name);
    Py_ssize_t i = 0;
    while (i < n && !(s[i] >= 'A' && s[i] <= 'Z'))
        i++;
    int exact = PyUnicode_CheckExact(name);
    if (i == n && exact) {
        Py_INCREF(name);
        return name;
    }
    if (exact) {
        if (lowered == NULL && (lowered = PyDict_New()) == NULL)
            return NULL;
        PyObject *known = PyDict_GetItemWithError(lowered, name);
        if (known != NULL)
            return Py_NewRef(known);
        if (PyErr_Occurred())
            return NULL;
    }
    PyObject *out = PyUnicode_New(n, 127);
    if (out == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t j = 0; j < n; j++)
        d[j] = (s[j] >= 'A' && s[j] <= 'Z') ? (Py_UCS1)(s[j] + 32) : s[j];
    if (exact && PyDict_GET_SIZE(lowered) < LOWERED_MAX && PyDict_SetItem(lowered, name, out) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* The (name, value) of one field: borrowed references, or -1 with an exception set. */
static int field_pair(PyObject *item, PyObject **name, PyObject **value) {
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
        *name = PyTuple_GET_ITEM(item, 0);
        *value = PyTuple_GET_ITEM(item, 1);
        return 0;
    }
    if ((PyTuple_Check(item) || PyList_Check(item)) && PySequence_Fast_GET_SIZE(item) == 2) {
        *name = PySequence_Fast_GET_ITEM(item, 0);
        *value = PySequence_Fast_GET_ITEM(item, 1);
        return 0;
    }
    PyErr_SetString(PyExc_ValueError, "a header field is a (name, value) pair");
    return -1;
}

/* Whether a str starts with "proxy-", read in place. */
static int starts_with_proxy(PyObject *text) {
    static const char prefix[] = "proxy-";
    if (PyUnicode_GET_LENGTH(text) < 6)
        return 0;
    for (Py_ssize_t i = 0; i < 6; i++)
        if (PyUnicode_READ_CHAR(text, i) != (Py_UCS4)prefix[i])
            return 0;
    return 1;
}

/* One pass over (name, value) pairs: those whose lower-cased name is not in `without` (NULL:
 * none left out) go to `kept` as tuples and into `index` ({lower-cased name: [values]}),
 * either of them NULL when not wanted. With `hop_rules`, names starting with "proxy-" are
 * left out too, and a Connection field in `without` ends the pass: it returns 1, since the
 * names it lists are left out as well (the caller's Python rule does that). 0 when done, -1
 * on error. */
static int pass_fields(PyObject *pairs, PyObject *without, int hop_rules, PyObject *kept,
                       PyObject *index) {
    PyObject *seq = PySequence_Fast(pairs, "fields must be a sequence of (name, value) pairs");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *name, *value;
        if (field_pair(item, &name, &value) < 0)
            goto fail;
        PyObject *low = lower_name(name);
        if (low == NULL)
            goto fail;
        int out = without == NULL ? 0 : PySet_Contains(without, low);
        if (out == 0 && hop_rules)
            out = starts_with_proxy(low);
        if (out == 1 && hop_rules && PyUnicode_CompareWithASCIIString(low, "connection") == 0) {
            Py_DECREF(low);
            Py_DECREF(seq);
            return 1;
        }
        if (out != 0) {
            Py_DECREF(low);
            if (out < 0)
                goto fail;
            continue;
        }
        int failed = 0;
        if (kept != NULL) {
            if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
                failed = PyList_Append(kept, item);
            } else {
                PyObject *pair = PyTuple_Pack(2, name, value);
                failed = pair == NULL ? -1 : PyList_Append(kept, pair);
                Py_XDECREF(pair);
            }
        }
        if (!failed && index != NULL) {
            PyObject *values = PyDict_GetItemWithError(index, low);
            if (values != NULL) {
                failed = PyList_Append(values, value);
            } else if (PyErr_Occurred()) {
                failed = -1;
            } else {
                values = PyList_New(1);
                failed = values == NULL ? -1 : 0;
                if (!failed) {
                    Py_INCREF(value);
                    PyList_SET_ITEM(values, 0, value);
                    failed = PyDict_SetItem(index, low, values);
                    Py_DECREF(values);
                }
            }
        }
        Py_DECREF(low);
        if (failed)
            goto fail;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static PyObject *py_index_fields(PyObject *module, PyObject *pairs) {
    PyObject *index = PyDict_New();
    if (index == NULL || pass_fields(pairs, NULL, 0, NULL, index) < 0) {
        Py_XDECREF(index);
        return NULL;
    }
    return index;
}

static PyObject *py_end_to_end(PyObject *module, PyObject *args) {
    PyObject *pairs, *hop_by_hop;
    if (!PyArg_ParseTuple(args, "OO!:end_to_end", &pairs, &PyFrozenSet_Type, &hop_by_hop))
        return NULL;
    PyObject *kept = PyList_New(0);
    if (kept == NULL)
        return NULL;
    int done = pass_fields(pairs, hop_by_hop, 1, kept, NULL);
    if (done != 0) {
        Py_DECREF(kept);
        if (done < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return kept;
}

static PyObject *py_indexed_fields(PyObject *module, PyObject *args) {
    PyObject *pairs, *without, *extra;
    int hop_rules;
    if (!PyArg_ParseTuple(args, "OO!Op:indexed_fields", &pairs, &PyFrozenSet_Type, &without,
                          &extra, &hop_rules))
        return NULL;
    PyObject *kept = PyList_New(0);
    PyObject *index = PyDict_New();
    PyObject *result = NULL;
    if (kept == NULL || index == NULL)
        goto done;
    int passed = pass_fields(pairs, without, hop_rules, kept, index);
    if (passed == 0)
        passed = pass_fields(extra, NULL, 0, kept, index);
    if (passed < 0)
        goto done;
    if (passed == 1) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *pairs_out = PyList_AsTuple(kept);
    if (pairs_out != NULL)
        result = PyTuple_Pack(2, pairs_out, index);
    Py_XDECREF(pairs_out);
done:
    Py_XDECREF(kept);
    Py_XDECREF(index);
    return result;
}

/* Whether a str holds a CR or an LF: one pass over a one-byte string (a header field's, in
 * practice), where two PyUnicode_FindChar calls cost more than the scan itself. */
static int has_newline(PyObject *text) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (PyUnicode_KIND(text) == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *s = PyUnicode_1BYTE_DATA(text);
        for (Py_ssize_t i = 0; i < n; i++)
            if (s[i] <= '\r' && (s[i] == '\r' || s[i] == '\n'))
                return 1;
        return 0;
    }
    return PyUnicode_FindChar(text, '\r', 0, n, 1) != -1 ||
           PyUnicode_FindChar(text, '\n', 0, n, 1) != -1;
}

static PyObject *py_field_lines(PyObject *module, PyObject *pairs) {
    PyObject *seq = PySequence_Fast(pairs, "fields must be a sequence of (name, value) pairs");
    if (seq == NULL)
        return NULL;
    static PyObject *colon, *crlf, *empty;
    if (colon == NULL) {
        colon = PyUnicode_InternFromString(": ");
        crlf = PyUnicode_InternFromString("\r\n");
        empty = PyUnicode_InternFromString("");
        if (colon == NULL || crlf == NULL || empty == NULL)
            goto fail_seq;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *pieces = PyList_New(4 * n);
    if (pieces == NULL)
        goto fail_seq;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *value;
        if (field_pair(PySequence_Fast_GET_ITEM(seq, i), &name, &value) < 0)
            goto fail;
        if (!PyUnicode_Check(name) || !PyUnicode_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "a header field's name and value are str");
            goto fail;
        }
        if (has_newline(name) || has_newline(value)) {
            Py_DECREF(pieces);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        PyObject *parts[4] = {name, colon, value, crlf};
        for (int j = 0; j < 4; j++) {
            Py_INCREF(parts[j]);
            PyList_SET_ITEM(pieces, 4 * i + j, parts[j]);
        }
    }
    PyObject *lines = PyUnicode_Join(empty, pieces);
    Py_DECREF(pieces);
    Py_DECREF(seq);
    return lines;
fail:
    Py_DECREF(pieces);
fail_seq:
    Py_DECREF(seq);
    return NULL;
}

/* Stops the cyclic collector from tracking obj (its memory is still freed by reference
 * counting). Only for an object that can never be part of a reference cycle: one whose fields
 * hold strings, bytes, numbers, and tuples and dicts of them. A cache holds millions of such
 * entries, and each full collection would otherwise walk every one of them. */
static PyObject *py_untrack(PyObject *module, PyObject *obj) {
    if (PyObject_IS_GC(obj))
        PyObject_GC_UnTrack(obj);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"hash64", (PyCFunction)py_hash64, METH_O,
     "MurmurHash3 x64/128 of a key's UTF-8 bytes: (h1, h2), unsigned."},
    {"optimal_size", (PyCFunction)py_optimal_size, METH_VARARGS,
     "(bits, probes) of a Bloom filter holding capacity keys at fp_rate."},
    {"hash_ids", (PyCFunction)py_hash_ids, METH_VARARGS,
     "hash_ids(ids, prefix, out): out[i] = h1 of prefix + str(ids[i])."},
    {"index_fields", (PyCFunction)py_index_fields, METH_O,
     "index_fields(pairs): {name.lower(): [values in order]} of (name, value) pairs."},
    {"end_to_end", (PyCFunction)py_end_to_end, METH_VARARGS,
     "end_to_end(pairs, hop_by_hop): the pairs whose lower-cased name is not in hop_by_hop and "
     "does not start with 'proxy-', as tuples; None when a Connection field is present."},
    {"indexed_fields", (PyCFunction)py_indexed_fields, METH_VARARGS,
     "indexed_fields(pairs, without, extra, hop_rules): (pairs as a tuple, index_fields of "
     "them) for the pairs whose lower-cased name is not in without (with hop_rules, nor "
     "starts with 'proxy-'), then extra; None when hop_rules and a Connection field is in "
     "without."},
    {"field_lines", (PyCFunction)py_field_lines, METH_O,
     "field_lines(pairs): 'name: value\\r\\n' for each pair, joined; None when a name or value "
     "holds a CR or an LF (a field may not smuggle in a line of its own)."},
    {"untrack", (PyCFunction)py_untrack, METH_O,
     "Keep an object that can never be in a reference cycle out of the cyclic collector's view."},
    {"footprint", (PyCFunction)py_footprint, METH_VARARGS,
     "footprint(ids, sizes): (distinct objects, their bytes at each one's largest size)."},
    {"simulate_chunk", (PyCFunction)(void (*)(void))py_simulate_chunk,
     METH_VARARGS | METH_KEYWORDS,
     "Replay requests through a StoreIndex and an Admission; returns counter deltas."},
    {NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "proxy.core._native", "The compiled policy core.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&BloomType) < 0 || PyType_Ready(&WindowType) < 0 ||
        PyType_Ready(&IndexType) < 0 || PyType_Ready(&AdmissionType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Bloom", (PyObject *)&BloomType) < 0 ||
        PyModule_AddObjectRef(m, "Window", (PyObject *)&WindowType) < 0 ||
        PyModule_AddObjectRef(m, "StoreIndex", (PyObject *)&IndexType) < 0 ||
        PyModule_AddObjectRef(m, "Admission", (PyObject *)&AdmissionType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
