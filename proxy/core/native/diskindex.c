/* The disk tier's RAM index: key hash -> (region, offset, length), 20 bytes a slot. */
#include "native.h"

/* An open-addressing table of slots (linear probing, key 0 is empty: a key hash of 0 is
 * stored as 1, and the record's own key, which a read checks, tells the two apart), at most
 * three quarters full and at least three eighths after growing, so an object costs 27 to 54
 * bytes of RAM.
 *
 * Regions are evicted whole and oldest first, so a slot whose region is older than the
 * oldest live one (`first`), or marked DELETED, is dead: never found, overwritten by a put
 * of its key, and dropped when the table is rebuilt, which happens once the dead slots
 * outnumber the live ones (or at growth). Each live region's count of slots is kept in a ring of `ring` counts,
 * so an eviction knows at once how many slots died. */

static inline uint64_t slot_key(const DiskSlot *s) {
    return (uint64_t)s->key_hi << 32 | s->key_lo;
}

static inline uint64_t stored_key(uint64_t key) { return key ? key : 1; }

/* The region of a slot whose key was deleted: dead whatever the oldest live region is. */
#define DELETED UINT32_MAX

static inline int slot_live(const DiskIndexObject *x, const DiskSlot *s) {
    return s->region >= x->first && s->region != DELETED;
}

/* The slot holding key (live or dead), or the empty one where it would go. */
static DiskSlot *find_slot(const DiskIndexObject *x, uint64_t key) {
    uint64_t s = slot_of(key, x->mask);
    for (;;) {
        DiskSlot *slot = &x->slots[s];
        uint64_t k = slot_key(slot);
        if (k == 0 || k == key) return slot;
        s = (s + 1) & x->mask;
    }
}

/* Builds a table of `size` slots holding the live slots only. */
static int rebuild(DiskIndexObject *x, uint64_t size) {
    DiskSlot *slots = PyMem_Calloc((size_t)size, sizeof(DiskSlot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t mask = size - 1;
    for (uint64_t i = 0; x->slots != NULL && i <= x->mask; i++) {
        DiskSlot *old = &x->slots[i];
        uint64_t k = slot_key(old);
        if (k == 0 || !slot_live(x, old)) continue;
        uint64_t s = slot_of(k, mask);
        while (slot_key(&slots[s]) != 0) s = (s + 1) & mask;
        slots[s] = *old;
    }
    PyMem_Free(x->slots);
    x->slots = slots;
    x->mask = mask;
    x->dead = 0;
    return 0;
}

static inline long long *region_count(DiskIndexObject *x, uint32_t region) {
    return &x->counts[region % (uint64_t)x->ring];
}

/* A live slot (its region's count and bytes) counted in (sign 1) or out (-1). */
static inline void counted(DiskIndexObject *x, const DiskSlot *s, int sign) {
    *region_count(x, s->region) += sign;
    x->bytes[s->region % (uint64_t)x->ring] += sign * (long long)s->length;
    x->live += sign;
    x->held += sign * (long long)s->length;
}

static int DiskIndex_init(DiskIndexObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"regions", NULL};
    long long ring;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L", kwlist, &ring)) return -1;
    if (ring < 2) {
        PyErr_Format(PyExc_ValueError, "a disk tier holds at least 2 regions, got %lld", ring);
        return -1;
    }
    if (self->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a DiskIndex is initialised once");
        return -1;
    }
    self->counts = PyMem_Calloc((size_t)ring * 2, sizeof(long long));
    if (self->counts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->bytes = self->counts + ring;
    self->ring = ring;
    self->mask = 0;
    return rebuild(self, 1024);
}

static void DiskIndex_dealloc(DiskIndexObject *self) {
    PyMem_Free(self->slots);
    PyMem_Free(self->counts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

const DiskSlot *disk_index_get(DiskIndexObject *x, uint64_t key) {
    DiskSlot *slot = find_slot(x, stored_key(key));
    return slot_key(slot) == 0 || !slot_live(x, slot) ? NULL : slot;
}

static PyObject *DiskIndex_get(DiskIndexObject *self, PyObject *arg) {
    uint64_t key;
    if (parse_u64(arg, &key) < 0) return NULL;
    const DiskSlot *slot = disk_index_get(self, key);
    if (slot == NULL) Py_RETURN_NONE;
    return Py_BuildValue("(III)", slot->region, slot->offset, slot->length);
}

int disk_index_put(DiskIndexObject *self, uint64_t key, uint32_t region, uint32_t offset,
                    uint32_t length) {
    if ((uint64_t)(self->live + self->dead + 1) * 4 > (self->mask + 1) * 3) {
        uint64_t size = self->mask + 1;
        if ((uint64_t)(self->live + 1) * 2 > size) size *= 2;  /* else dropping the dead makes room */
        if (rebuild(self, size) < 0) return -1;
    }
    key = stored_key(key);
    DiskSlot *slot = find_slot(self, key);
    if (slot_key(slot) != 0) {
        if (slot_live(self, slot)) {
            counted(self, slot, -1);
        } else {
            self->dead--;
        }
    }
    slot->key_lo = (uint32_t)key;
    slot->key_hi = (uint32_t)(key >> 32);
    slot->region = region;
    slot->offset = offset;
    slot->length = length;
    counted(self, slot, 1);
    return 0;
}

static PyObject *DiskIndex_put(DiskIndexObject *self, PyObject *const *args, Py_ssize_t n) {
    uint64_t key, region, offset, length;
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "put(key, region, offset, length)");
        return NULL;
    }
    if (parse_u64(args[0], &key) < 0 || parse_u64(args[1], &region) < 0 ||
        parse_u64(args[2], &offset) < 0 || parse_u64(args[3], &length) < 0)
        return NULL;
    if (region >= DELETED || offset > UINT32_MAX || length > UINT32_MAX || region < self->first) {
        PyErr_Format(PyExc_ValueError, "a slot in region %llu at %llu of %llu bytes does not fit "
                     "the index (its oldest live region is %u)", (unsigned long long)region,
                     (unsigned long long)offset, (unsigned long long)length, self->first);
        return NULL;
    }
    if (disk_index_put(self, key, (uint32_t)region, (uint32_t)offset, (uint32_t)length) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Slots as dump gives them, put back; those of regions older than the oldest live one are
 * left out. Returns how many were put. */
static PyObject *DiskIndex_load(DiskIndexObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len % 20 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "slots come 20 bytes each");
        return NULL;
    }
    const char *p = view.buf;
    long long put = 0;
    for (Py_ssize_t at = 0; at < view.len; at += 20) {
        uint64_t key;
        uint32_t region, offset, length;
        memcpy(&key, p + at, 8);
        memcpy(&region, p + at + 8, 4);
        memcpy(&offset, p + at + 12, 4);
        memcpy(&length, p + at + 16, 4);
        if (region < self->first || region == DELETED) continue;
        if (disk_index_put(self, key, region, offset, length) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        put++;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(put);
}

int disk_index_delete_at(DiskIndexObject *self, uint64_t key, uint32_t only_region,
                       uint32_t only_offset) {
    DiskSlot *slot = find_slot(self, stored_key(key));
    if (slot_key(slot) == 0 || !slot_live(self, slot)) return 0;
    if (slot->region != only_region || slot->offset != only_offset) return 0;
    counted(self, slot, -1);
    slot->region = DELETED;  /* kept, so that probing past it still finds what follows */
    self->dead++;
    if (self->dead > self->live && rebuild(self, self->mask + 1) < 0) return -1;
    return 1;
}

static PyObject *DiskIndex_delete_at(DiskIndexObject *self, PyObject *const *args, Py_ssize_t n) {
    uint64_t key;
    uint32_t region, offset;
    int place = parse_place(args, n, &key, &region, &offset);
    if (place <= 0) return place < 0 ? NULL : Py_NewRef(Py_False);
    int done = disk_index_delete_at(self, key, region, offset);
    return done < 0 ? NULL : PyBool_FromLong(done);
}

long long disk_index_evict_region(DiskIndexObject *x, uint32_t region) {
    long long *count = region_count(x, region);
    long long gone = *count;
    *count = 0;
    x->held -= x->bytes[region % (uint64_t)x->ring];
    x->bytes[region % (uint64_t)x->ring] = 0;
    x->live -= gone;
    x->dead += gone;
    x->first = region + 1;
    if (x->dead > x->live && rebuild(x, x->mask + 1) < 0) return -1;
    return gone;
}

static PyObject *DiskIndex_evict_region(DiskIndexObject *self, PyObject *arg) {
    uint64_t region;
    if (parse_u64(arg, &region) < 0) return NULL;
    if (region != self->first) {
        PyErr_Format(PyExc_ValueError, "regions are evicted oldest first: %u, not %llu",
                     self->first, (unsigned long long)region);
        return NULL;
    }
    long long gone = disk_index_evict_region(self, (uint32_t)region);
    return gone < 0 ? NULL : PyLong_FromLongLong(gone);
}

static PyObject *DiskIndex_resume(DiskIndexObject *self, PyObject *arg) {
    uint64_t first;
    if (parse_u64(arg, &first) < 0) return NULL;
    if (self->live != 0 || first > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "resume(first) on an empty index, first < 2**32");
        return NULL;
    }
    self->first = (uint32_t)first;
    Py_RETURN_NONE;
}

/* The live slots as bytes, 20 each (key, region, offset, length: u64, u32 x3, in the machine's byte order):
 * a checkpoint of the index. */
static PyObject *DiskIndex_dump(DiskIndexObject *self, PyObject *unused) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)self->live * 20);
    if (out == NULL) return NULL;
    char *p = PyBytes_AS_STRING(out);
    for (uint64_t i = 0; i <= self->mask; i++) {
        const DiskSlot *slot = &self->slots[i];
        if (slot_key(slot) == 0 || !slot_live(self, slot)) continue;
        uint64_t key = slot_key(slot);
        memcpy(p, &key, 8);
        memcpy(p + 8, &slot->region, 4);
        memcpy(p + 12, &slot->offset, 4);
        memcpy(p + 16, &slot->length, 4);
        p += 20;
    }
    return out;
}

static Py_ssize_t DiskIndex_len(DiskIndexObject *self) { return (Py_ssize_t)self->live; }

static PyObject *DiskIndex_memory_bytes(DiskIndexObject *self, void *closure) {
    return PyLong_FromLongLong((long long)((self->mask + 1) * sizeof(DiskSlot) +
                                           (uint64_t)self->ring * 2 * sizeof(long long)));
}

static PyObject *DiskIndex_bytes(DiskIndexObject *self, void *closure) {
    return PyLong_FromLongLong(self->held);
}

static PyObject *DiskIndex_first(DiskIndexObject *self, void *closure) {
    return PyLong_FromUnsignedLong(self->first);
}

static PyMethodDef DiskIndex_methods[] = {
    {"get", (PyCFunction)DiskIndex_get, METH_O,
     "get(key) -> (region, offset, length) of key's record, or None."},
    {"put", (PyCFunction)(void (*)(void))DiskIndex_put, METH_FASTCALL,
     "put(key, region, offset, length): key's record lies there (replacing where it lay)."},
    {"delete_at", (PyCFunction)(void (*)(void))DiskIndex_delete_at, METH_FASTCALL,
     "delete_at(key, region, offset): forget key if its record lies there; whether it did."},
    {"evict_region", (PyCFunction)DiskIndex_evict_region, METH_O,
     "evict_region(region): the oldest live region is gone; returns the keys it held."},
    {"load", (PyCFunction)DiskIndex_load, METH_O,
     "load(slots): put back what dump gave (regions older than first left out); how many."},
    {"dump", (PyCFunction)DiskIndex_dump, METH_NOARGS,
     "The live slots as bytes, 20 each: key (u64), region, offset, length (u32), in the machine's byte order."},
    {"resume", (PyCFunction)DiskIndex_resume, METH_O,
     "resume(first): an empty index whose oldest live region is first (after a restart)."},
    {NULL},
};

static PyGetSetDef DiskIndex_getset[] = {
    {"memory_bytes", (getter)DiskIndex_memory_bytes, NULL, "bytes of RAM the index holds", NULL},
    {"first", (getter)DiskIndex_first, NULL, "the oldest live region", NULL},
    {"bytes", (getter)DiskIndex_bytes, NULL, "bytes of the records indexed", NULL},
    {NULL},
};

static PySequenceMethods DiskIndex_as_sequence = {
    .sq_length = (lenfunc)DiskIndex_len,
};

PyTypeObject DiskIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.DiskIndex",
    .tp_basicsize = sizeof(DiskIndexObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The disk tier's RAM index: 64-bit key hash -> (region, offset, length).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)DiskIndex_init,
    .tp_dealloc = (destructor)DiskIndex_dealloc,
    .tp_methods = DiskIndex_methods,
    .tp_getset = DiskIndex_getset,
    .tp_as_sequence = &DiskIndex_as_sequence,
};
