/* Bloom filters: the Bloom type and the setup, clearing and fill of a filter. */
#include "native.h"

int bloom_setup(BloomObject *self, long long capacity, double fp_rate) {
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

BloomObject *bloom_new(long long capacity, double fp_rate) {
    BloomObject *b = PyObject_New(BloomObject, &BloomType);
    if (b == NULL) return NULL;
    b->bits = NULL;
    if (bloom_setup(b, capacity, fp_rate) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

void bloom_clear(BloomObject *b) {
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

PyTypeObject BloomType = {
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

