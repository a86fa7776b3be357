/* The store index: entries by key hash, their queues and counts, and the StoreIndex type. */
#include "native.h"

/* StoreIndex: the store's bookkeeping. Nodes live in one array and are found through an
 * open-addressing table of node numbers (0 is empty) with backward-shift deletion. Each
 * resident node sits in one queue, newest first; S3-FIFO's ghost queue holds the keys (and
 * charges) of entries evicted from its small queue, which are not resident. The order
 * within the queues is the eviction's (evictions.c). */

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

void index_forget(IndexObject *x, Node *n) {
    x->used -= n->charge;
    x->count--;
    if (n->hits == 0) {
        x->resident_unread--;
        x->resident_unread_bytes -= n->size;
    }
}

void index_drop(IndexObject *x, int32_t i, uint64_t s) {
    Node *n = &x->nodes[i];
    index_table_remove(x, s);
    list_unlink(x, i);
    if (n->queue == Q_GHOST) x->ghosts--; else index_forget(x, n);
    n->next = x->free_head;
    x->free_head = i;
}

int index_delete(IndexObject *x, uint64_t key) {
    int64_t s = index_find_slot(x, key);
    if (s < 0 || x->nodes[x->table[s] - 1].queue == Q_GHOST) return 0;
    index_drop(x, x->table[s] - 1, (uint64_t)s);
    return 1;
}

int index_count_eviction(IndexObject *x, int32_t i, PyObject *evicted) {
    Node *v = &x->nodes[i];
    /* Set by every eviction, wherever it is made: W-TinyLFU evicts in its own settle step,
     * and its window would otherwise send every new key to main for ever. */
    x->has_evicted = 1;
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

int index_evict_node(IndexObject *x, int32_t i, PyObject *evicted) {
    if (index_count_eviction(x, i, evicted) < 0) return -1;
    index_drop(x, i, (uint64_t)index_find_slot(x, x->nodes[i].key));
    return 0;
}

int index_put(IndexObject *x, uint64_t key, long long size, long long charge, long long hits,
              double stored_at, PyObject *evicted) {
    const Eviction *ev = x->ev;
    int queue = ev->entry_queue;
    int64_t found = index_find_slot(x, key);
    if (found >= 0) {
        int32_t old = x->table[found] - 1;
        if (x->nodes[old].queue == Q_GHOST) queue = Q_MAIN;
        index_drop(x, old, (uint64_t)found);
    }
    while (ev->evict != NULL && x->used + charge > x->capacity && x->count > 0) {
        if (ev->evict(x, evicted) < 0) return -1;
    }
    /* Until the first eviction, a small queue that is full sends new keys to main. */
    if (queue == Q_SMALL && !ev->small_grows && !x->has_evicted &&
        x->bytes[Q_SMALL] >= x->small_capacity)
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
    return ev->settle != NULL ? ev->settle(x, key, evicted) : 0;
}

/* The eviction named `eviction` with its knobs (negative: the policy's default), checked;
 * NULL with ValueError set for an unknown name or a knob out of its range. */
static const Eviction *eviction_named(const char *eviction, double small, double ghost,
                                      int move) {
    const Eviction *ev = NULL;
    for (int e = 0; e < N_EVICTIONS; e++) {
        if (strcmp(eviction, EVICTIONS[e]->name) == 0) ev = EVICTIONS[e];
    }
    if (ev == NULL) {
        PyErr_Format(PyExc_ValueError, "unknown eviction '%s'; expected one of lru, s3fifo, "
                     "sieve, wtinylfu, twoq", eviction);
        return NULL;
    }
    /* Negative: the policy's default. A NaN fails each test. proxy.core.evictions checks
     * them first, naming the knob; this guards a StoreIndex made directly. */
    if (!(small < 0 || (small > 0 && small < 1)) || !(ghost < 0 || ghost <= 4) ||
        !(move < 0 || (move >= 1 && move <= 3))) {
        PyErr_SetString(PyExc_ValueError, "an eviction's knob is out of its range "
                        "(proxy.core.evictions names them)");
        return NULL;
    }
    return ev;
}

/* Sets the policy and its knobs, and the queue sizes and state it keeps. */
static int index_use(IndexObject *x, const Eviction *ev, double small, double ghost, int move) {
    x->ev = ev;
    x->small_ratio = small;
    x->ghost_ratio = ghost;
    x->move_hits = move;
    x->small_capacity = x->ghost_capacity = x->protected_capacity = 0;
    x->max_charge = x->capacity;
    x->hand = -1;
    return ev->init != NULL ? ev->init(x) : 0;
}

static int Index_init(IndexObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity_bytes", "eviction", "small", "ghost", "move", NULL};
    long long capacity;
    const char *eviction = "lru";
    double small = -1, ghost = -1;
    int move = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L|s$ddi", kwlist, &capacity, &eviction,
                                     &small, &ghost, &move))
        return -1;
    if (self->table != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a StoreIndex is initialised once");
        return -1;
    }
    const Eviction *ev = eviction_named(eviction, small, ghost, move);
    if (ev == NULL) return -1;
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
    self->has_evicted = 0;
    self->capacity = capacity;
    return index_use(self, ev, small, ghost, move);
}

/* reshape(eviction, *, small, ghost, move): evict by another policy (or the same with other
 * knobs) from now on, every entry kept with its hits, hit marks cleared. Oldest first as
 * they stood (main, protected, then the entry queue, each from its oldest), they go to the
 * new policy's main queue; but for S3-FIFO (``unread_to_entry``), whose main evicts only past its
 * share, an entry never read goes to its small queue: in main it would squat. The policy
 * learns what it keeps of entries from their hits (``adopt``: W-TinyLFU's sketch). The ghost
 * queue's keys are forgotten. An entry charged more than the new policy lets one be stays
 * until it leaves. */
static PyObject *Index_reshape(IndexObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"eviction", "small", "ghost", "move", NULL};
    const char *eviction;
    double small = -1, ghost = -1;
    int move = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|$ddi", kwlist, &eviction, &small, &ghost,
                                     &move))
        return NULL;
    const Eviction *ev = eviction_named(eviction, small, ghost, move);
    if (ev == NULL) return NULL;
    int32_t *order = PyMem_Malloc(sizeof(int32_t) * (size_t)(self->count > 0 ? self->count : 1));
    if (order == NULL) return PyErr_NoMemory();
    long long n = 0;
    static const int kept[] = {Q_MAIN, Q_PROTECTED, Q_SMALL};
    for (int k = 0; k < 3; k++) {
        for (int32_t i = self->tail[kept[k]]; i >= 0; i = self->nodes[i].prev) order[n++] = i;
    }
    while (self->tail[Q_GHOST] >= 0) {
        int32_t old = self->tail[Q_GHOST];
        index_drop(self, old, (uint64_t)index_find_slot(self, self->nodes[old].key));
    }
    for (int q = 0; q < N_QUEUES; q++) {
        self->head[q] = self->tail[q] = -1;
        self->bytes[q] = 0;
    }
    int unread = ev->unread_to_entry ? ev->entry_queue : Q_MAIN;
    for (long long k = 0; k < n; k++) {
        Node *node = &self->nodes[order[k]];
        node->freq = 0;
        list_push_front(self, order[k], node->hits == 0 ? unread : Q_MAIN);
    }
    PyMem_Free(order);
    if (index_use(self, ev, small, ghost, move) < 0) return NULL;
    /* What a policy learns at a reshape is an optimisation: on failure, it starts as new. */
    if (ev->adopt != NULL && ev->adopt(self) < 0) PyErr_Clear();
    Py_RETURN_NONE;
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
    if (charge > self->max_charge) {
        PyErr_Format(PyExc_ValueError, "a charge of %lld bytes exceeds the %lld bytes an entry "
                     "may take", charge, self->max_charge);
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

/* resize(capacity): the capacity changes; entries are evicted, as the policy evicts (counted
 * as evictions), until what the index holds fits. Returns their keys, in eviction order. */
static PyObject *Index_resize(IndexObject *self, PyObject *arg) {
    long long capacity = PyLong_AsLongLong(arg);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity_bytes must be positive, got %lld", capacity);
        return NULL;
    }
    PyObject *evicted = PyList_New(0);
    if (evicted == NULL) return NULL;
    const Eviction *ev = self->ev;
    self->capacity = capacity;
    self->max_charge = capacity;
    if (ev->sizes != NULL) ev->sizes(self);
    while (self->used > self->capacity && self->count > 0) {
        int done;
        if (ev->evict != NULL) {
            done = ev->evict(self, evicted);
        } else {
            /* A policy that makes room after an insert: its next victim goes now, and once
             * its main queues are empty, the window's oldest (its own step moves the window
             * on at an insert, which a resize has not). */
            int32_t i = ev->victim(self);
            if (i < 0) i = self->tail[Q_SMALL];
            if (i < 0) break;
            done = index_evict_node(self, i, evicted);
        }
        if (done < 0) {
            Py_DECREF(evicted);
            return NULL;
        }
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
    return PyLong_FromLongLong(self->max_charge);
}

/* A sample of a larger store keeps what the larger one keeps: its policy's bound (S3-FIFO's
 * small queue) is the larger store's, up to this one's capacity. Until a resize or reshape
 * sets the policy's own again. */
static int Index_set_max_charge(IndexObject *self, PyObject *value, void *closure) {
    long long charge = value == NULL ? -1 : PyLong_AsLongLong(value);
    if (charge == -1 && PyErr_Occurred()) return -1;
    if (charge < 1 || charge > self->capacity) {
        PyErr_Format(PyExc_ValueError, "max_charge is from 1 to the capacity (%lld), got %lld",
                     self->capacity, charge);
        return -1;
    }
    self->max_charge = charge;
    return 0;
}

static PyObject *Index_eviction(IndexObject *self, void *closure) {
    return PyUnicode_FromString(self->ev->name);
}

/* The knobs as set (at creation, or by the last reshape): None where the policy's default
 * holds. */
static PyObject *Index_knobs(IndexObject *self, void *closure) {
    PyObject *small = self->small_ratio >= 0 ? PyFloat_FromDouble(self->small_ratio) : Py_None;
    PyObject *ghost = self->ghost_ratio >= 0 ? PyFloat_FromDouble(self->ghost_ratio) : Py_None;
    PyObject *move = self->move_hits >= 0 ? PyLong_FromLong(self->move_hits) : Py_None;
    if (small == Py_None) Py_INCREF(small);
    if (ghost == Py_None) Py_INCREF(ghost);
    if (move == Py_None) Py_INCREF(move);
    if (small == NULL || ghost == NULL || move == NULL) {
        Py_XDECREF(small);
        Py_XDECREF(ghost);
        Py_XDECREF(move);
        return NULL;
    }
    return Py_BuildValue("{sNsNsN}", "small", small, "ghost", ghost, "move", move);
}

static PyMethodDef Index_methods[] = {
    {"touch", (PyCFunction)Index_touch, METH_O,
     "A hit's effect on the eviction order; False if key is absent."},
    {"record_hit", (PyCFunction)Index_record_hit, METH_O, "Count one answer served from key."},
    {"hits", (PyCFunction)Index_hits, METH_O, "Answers served from key's entry (0 if absent)."},
    {"put", (PyCFunction)(void (*)(void))Index_put, METH_FASTCALL,
     "put(key, size, charge, hits): store key, replacing it; returns the keys evicted."},
    {"delete", (PyCFunction)Index_delete, METH_O, "Remove key (not an eviction)."},
    {"reshape", (PyCFunction)(void (*)(void))Index_reshape, METH_VARARGS | METH_KEYWORDS,
     "reshape(eviction, *, small, ghost, move): evict by another policy from now on, every "
     "entry kept."},
    {"resize", (PyCFunction)Index_resize, METH_O,
     "Change the capacity; evict until the entries fit. The keys evicted."},
    {"estimated_capacity_objects", (PyCFunction)Index_estimated_capacity_objects, METH_NOARGS,
     "Objects of the resident mean charge the index holds when full (0 when empty)."},
    {NULL},
};

static PyGetSetDef Index_getset[] = {
    {"max_charge", (getter)Index_max_charge, (setter)Index_set_max_charge,
     "The largest charge an entry may have (set: a sample's, as the larger store's).", NULL},
    {"eviction", (getter)Index_eviction, NULL, "The eviction policy's name.", NULL},
    {"knobs", (getter)Index_knobs, NULL, "The policy's knobs (None: its default).", NULL},
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

PyTypeObject IndexType = {
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

