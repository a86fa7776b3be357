/* Key hashing (MurmurHash3 x64/128) and Bloom filter sizing. */
#include "native.h"

/* MurmurHash3 x64/128, after Austin Appleby's public-domain reference. */
static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

void murmur3_128(const uint8_t *data, Py_ssize_t len, uint64_t *out1, uint64_t *out2) {
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
int hash_key(PyObject *key, uint64_t *h1, uint64_t *h2) {
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

int parse_hash(PyObject *h, uint64_t *h1, uint64_t *h2) {
    if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2) {
        PyErr_SetString(PyExc_TypeError, "a key hash is a (h1, h2) tuple");
        return -1;
    }
    *h1 = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(h, 0));
    *h2 = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(h, 1));
    return PyErr_Occurred() ? -1 : 0;
}

PyObject *py_sample_point(PyObject *module, PyObject *args) {
    unsigned long long h1, key;
    if (!PyArg_ParseTuple(args, "KK", &h1, &key)) return NULL;
    return PyLong_FromUnsignedLongLong(sample_point(h1, key));
}

PyObject *py_hash64(PyObject *module, PyObject *key) {
    uint64_t h1, h2;
    if (hash_key(key, &h1, &h2) < 0) return NULL;
    return Py_BuildValue("(KK)", (unsigned long long)h1, (unsigned long long)h2);
}

/* Sizing: m = ceil(-n ln p / (ln 2)^2), k = round(m / n * ln 2), at least 1. */

static const double LN2 = 0.6931471805599453;

int sizing(long long capacity, double fp_rate, long long *bits, int *probes) {
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

PyObject *py_optimal_size(PyObject *module, PyObject *args) {
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

