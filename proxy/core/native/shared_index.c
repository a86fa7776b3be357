/* The disk tier's index and ring head in memory that the processes of one machine share: every
 * worker finds, writes and forgets records of one tier.
 *
 * Rules this file keeps (proxy/core/disk.py says what they give a caller):
 *
 * - Layout: a SharedIndexHead padded to HEAD_BYTES; per region (by region % (2 * ring)) its
 *   count of records and of bytes; then `buckets` buckets of WAYS slots, each slot three
 *   words: the key's hash (0: never used; a hash of 0 is kept as 1), where its record lies
 *   (region << 32 | offset, or EMPTY) and the record's length.
 * - No locks: every change is one atomic store, exchange or compare-and-swap of a word, so a
 *   process killed at any instant blocks nobody and leaves every slot readable. A reader may
 *   pair a key with a place that is not its record (a slot taken over as it reads): the
 *   record's own key, which every read checks, makes that a miss, never a wrong body.
 * - A place only ever becomes a slot's by a put of a record just written, or a load from a
 *   checkpoint at start-up. A put takes a slot for a new key by one compare-and-swap of its
 *   place to BUSY (only one writer can), then writes its key, length and place, the place
 *   last: a reader skips a BUSY slot, so it never pairs a key with a place being written. A
 *   forgotten record's place is emptied (EMPTY), so no slot comes to point at a record its key
 *   had before a removal. A writer killed while it holds a slot leaves it BUSY, one slot of
 *   its bucket lost until the memory is made again.
 * - A bucket holds WAYS records; a put into a full one takes the slot of the oldest region
 *   (the ring would evict it first), counted in `pushed_out`.
 * - The ring head is one word, (open region + 1) << 32 | bytes used (0: none open yet): a
 *   record's place is reserved with one compare-and-swap, so two writers never overlap. The
 *   writer that opens a region moves `first` on past the regions it evicts (a compare-and-swap
 *   to the larger value) and is told which, to remove their files.
 * - Counts per region are kept with atomic adds, in 2 * ring places (a region's and the one
 *   that evicts it never share one); the writer that evicts a region takes its counts whole (an
 *   exchange), so each is subtracted once. They are for /stats: a put racing with the
 *   eviction of its region may leave them off by a record.
 * - Checkpoints: `begun` and `done` count them, so a process can tell that a checkpoint begun
 *   after its last drop has been written (and empty its journal of drops).
 * - `bans` counts the purges by prefix or tag any process saved: one that sees it move reads
 *   the bans again, so a worker started while a purge went round learns it at its next read. */
#include "native.h"

#define SI_MAGIC 0x3158444953484fULL /* "OHSIDX1" */
#define HEAD_BYTES 4096
#define WAYS 8
#define EMPTY UINT64_MAX
#define BUSY (UINT64_MAX - 1)

typedef struct {
    uint64_t magic;
    uint64_t buckets;
    uint64_t ring;
    uint64_t region_size;
    uint64_t head;     /* (open region + 1) << 32 | fill; 0: none open */
    uint64_t next;     /* the region the first open takes while none is open */
    uint64_t first;    /* the oldest live region */
    int64_t live;      /* records indexed in live regions */
    int64_t bytes;     /* their bytes */
    int64_t pushed_out;
    uint64_t begun, done; /* checkpoints */
    uint64_t bans;        /* purges by prefix or tag saved */
} SharedIndexHead;

typedef struct {
    uint64_t key, loc, length;
} SharedSlot;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    SharedIndexHead *head;
    int64_t *counts;  /* records per region % (2 * ring) */
    int64_t *rbytes;  /* bytes per region % (2 * ring) */
    SharedSlot *slots;
    uint64_t mask;    /* buckets - 1 */
    uint32_t followed; /* the oldest region this process has seen evicted: DiskTier's `first` */
    long long evicted; /* records of the regions this process evicted, not yet followed */
} SharedIndexObject;

static inline uint64_t load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline int cas(uint64_t *p, uint64_t *expected, uint64_t v) {
    return __atomic_compare_exchange_n(p, expected, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline void add(int64_t *p, int64_t v) { __atomic_add_fetch(p, v, __ATOMIC_RELAXED); }

static inline uint64_t stored(uint64_t key) { return key ? key : 1; }
static inline uint32_t loc_region(uint64_t loc) { return (uint32_t)(loc >> 32); }

static uint64_t counts_bytes(uint64_t ring) { return (ring * 32 + 63) / 64 * 64; }

static uint64_t index_bytes(uint64_t ring, uint64_t buckets) {
    return HEAD_BYTES + counts_bytes(ring) + buckets * WAYS * sizeof(SharedSlot);
}

/* The buckets a tier of `ring` regions of `region_size` bytes gets: a slot per 2 KiB of the
 * ring, at least 1024 buckets, a power of two. */
static uint64_t buckets_for(uint64_t ring, uint64_t region_size) {
    uint64_t want = ring * region_size / 2048 / WAYS, b = 1024;
    while (b < want && b < (1ULL << 40)) b <<= 1;
    return b;
}

/* Whether a place is a record of a live region. */
static inline int live_loc(const SharedIndexObject *x, uint64_t loc) {
    return loc < BUSY && loc_region(loc) >= load(&x->head->first);
}

static inline SharedSlot *bucket(const SharedIndexObject *x, uint64_t key) {
    return &x->slots[slot_of(key, x->mask) * WAYS];
}

static void counted(SharedIndexObject *x, uint64_t loc, uint64_t length, int sign) {
    if (loc >= BUSY) return;
    uint64_t r = loc_region(loc) % (2 * x->head->ring);
    add(&x->counts[r], sign);
    add(&x->rbytes[r], sign * (int64_t)length);
    add(&x->head->live, sign);
    add(&x->head->bytes, sign * (int64_t)length);
}

static int SharedIndex_init(SharedIndexObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"memory", "regions", "region_size", NULL};
    PyObject *memory;
    unsigned long long ring, region_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKK", kwlist, &memory, &ring, &region_size))
        return -1;
    if (self->head != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a SharedIndex is initialised once");
        return -1;
    }
    if (ring < 2 || region_size < 1 || region_size > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "a shared disk index needs at least 2 regions of 1 byte "
                     "to 4 GiB - 1, got %llu of %llu", ring, region_size);
        return -1;
    }
    if (PyObject_GetBuffer(memory, &self->view, PyBUF_WRITABLE) < 0) return -1;
    uint64_t buckets = buckets_for(ring, region_size);
    if ((uint64_t)self->view.len < index_bytes(ring, buckets) ||
        ((uintptr_t)self->view.buf & 63) != 0) {
        PyErr_Format(PyExc_ValueError, "the shared disk index needs %llu bytes, 64-byte "
                     "aligned; got %zd", (unsigned long long)index_bytes(ring, buckets),
                     self->view.len);
        PyBuffer_Release(&self->view);
        return -1;
    }
    SharedIndexHead *h = self->view.buf;
    uint64_t expected = 0;
    /* The first process to attach lays the head out (slots start zeroed: never used). */
    if (cas(&h->magic, &expected, 1)) {
        h->buckets = buckets;
        h->ring = ring;
        h->region_size = region_size;
        store(&h->magic, SI_MAGIC);
    } else {
        for (long spins = 0; expected == 1 && spins < 100000000; spins++)
            expected = load(&h->magic);
    }
    if (load(&h->magic) != SI_MAGIC || h->buckets != buckets || h->ring != ring ||
        h->region_size != region_size) {
        PyErr_SetString(PyExc_ValueError, "the shared disk index was laid out with another "
                        "[disk] size or region_size: every process must use the same");
        PyBuffer_Release(&self->view);
        return -1;
    }
    self->head = h;
    self->counts = (int64_t *)((char *)self->view.buf + HEAD_BYTES);
    self->rbytes = self->counts + 2 * ring;
    self->slots = (SharedSlot *)((char *)self->view.buf + HEAD_BYTES + counts_bytes(ring));
    self->mask = buckets - 1;
    self->followed = (uint32_t)load(&h->first);
    return 0;
}

static void SharedIndex_dealloc(SharedIndexObject *self) {
    if (self->head != NULL) PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define NEED_HEAD(x) \
    if ((x)->head == NULL) { \
        PyErr_SetString(PyExc_RuntimeError, "SharedIndex used before __init__"); \
        return NULL; \
    }

static PyObject *SharedIndex_get(SharedIndexObject *self, PyObject *arg) {
    uint64_t key;
    NEED_HEAD(self);
    if (parse_u64(arg, &key) < 0) return NULL;
    key = stored(key);
    SharedSlot *b = bucket(self, key);
    for (int w = 0; w < WAYS; w++) {
        if (load(&b[w].key) != key) continue;
        uint64_t loc = load(&b[w].loc);
        if (!live_loc(self, loc)) continue;
        uint64_t length = load(&b[w].length);
        return Py_BuildValue("(IIK)", loc_region(loc), (uint32_t)loc, (unsigned long long)length);
    }
    Py_RETURN_NONE;
}

/* key's record lies at loc: the slot holding key takes it (its duplicates, left by two puts
 * racing for one new key, are emptied), else a free slot, else the oldest region's; none when
 * every slot of the bucket is BUSY (the record is then a miss). */
static void put_loc(SharedIndexObject *self, uint64_t key, uint64_t loc, uint64_t length) {
    SharedSlot *b = bucket(self, key);
    for (;;) {
        SharedSlot *match = NULL, *free_slot = NULL, *oldest = NULL;
        uint64_t match_loc = 0, free_loc = 0, oldest_loc = 0;
        for (int w = 0; w < WAYS; w++) {
            uint64_t l = load(&b[w].loc);
            if (l == BUSY) continue;
            uint64_t k = load(&b[w].key);
            if (k == key && match == NULL) {
                match = &b[w];
                match_loc = l;
            } else if (k == key) {
                uint64_t length_w = load(&b[w].length);
                if (live_loc(self, l) && cas(&b[w].loc, &l, EMPTY))
                    counted(self, l, length_w, -1);
            } else if (k == 0 || !live_loc(self, l)) {
                if (free_slot == NULL) {
                    free_slot = &b[w];
                    free_loc = l;
                }
            } else if (oldest == NULL || loc_region(l) < loc_region(oldest_loc)) {
                oldest = &b[w];
                oldest_loc = l;
            }
        }
        if (match != NULL) {
            uint64_t old_length = load(&match->length);
            if (!cas(&match->loc, &match_loc, BUSY)) continue;
            store(&match->length, length);
            store(&match->loc, loc);
            if (live_loc(self, match_loc)) counted(self, match_loc, old_length, -1);
            counted(self, loc, length, 1);
            return;
        }
        SharedSlot *target = free_slot != NULL ? free_slot : oldest;
        if (target == NULL) return;
        uint64_t old = target == free_slot ? free_loc : oldest_loc;
        uint64_t old_key = load(&target->key), old_length = load(&target->length);
        if (!cas(&target->loc, &old, BUSY)) continue;
        if (old_key != 0 && live_loc(self, old)) {  /* a slot never used holds zeros */
            counted(self, old, old_length, -1);
            add(&self->head->pushed_out, 1);
        }
        store(&target->key, key);
        store(&target->length, length);
        store(&target->loc, loc);
        counted(self, loc, length, 1);
        return;
    }
}

static PyObject *SharedIndex_put(SharedIndexObject *self, PyObject *const *args, Py_ssize_t n) {
    uint64_t key, region, offset, length;
    NEED_HEAD(self);
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "put(key, region, offset, length)");
        return NULL;
    }
    if (parse_u64(args[0], &key) < 0 || parse_u64(args[1], &region) < 0 ||
        parse_u64(args[2], &offset) < 0 || parse_u64(args[3], &length) < 0)
        return NULL;
    if (region >= UINT32_MAX || offset > UINT32_MAX || length > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "a slot in region %llu at %llu of %llu bytes does not "
                     "fit the index", (unsigned long long)region, (unsigned long long)offset,
                     (unsigned long long)length);
        return NULL;
    }
    if (region >= load(&self->head->first))
        put_loc(self, stored(key), region << 32 | offset, length);
    Py_RETURN_NONE;
}

/* Empties key's slot when it holds the place `only`; whether one did. */
static int forget(SharedIndexObject *self, uint64_t key, uint64_t only) {
    key = stored(key);
    SharedSlot *b = bucket(self, key);
    int forgot = 0;
    for (int w = 0; w < WAYS; w++) {
        if (load(&b[w].key) != key) continue;
        uint64_t l = load(&b[w].loc), length = load(&b[w].length);
        if (!live_loc(self, l) || l != only) continue;
        if (cas(&b[w].loc, &l, EMPTY)) {
            counted(self, l, length, -1);
            forgot = 1;
        }
    }
    return forgot;
}

static PyObject *SharedIndex_delete_at(SharedIndexObject *self, PyObject *const *args,
                                       Py_ssize_t n) {
    uint64_t key;
    uint32_t region, offset;
    NEED_HEAD(self);
    int place = parse_place(args, n, &key, &region, &offset);
    if (place <= 0) return place < 0 ? NULL : Py_NewRef(Py_False);
    return PyBool_FromLong(forget(self, key, (uint64_t)region << 32 | offset));
}

static PyObject *SharedIndex_load(SharedIndexObject *self, PyObject *arg) {
    Py_buffer view;
    NEED_HEAD(self);
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len % 20 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "slots come 20 bytes each");
        return NULL;
    }
    const char *p = view.buf;
    long long put = 0;
    uint64_t first = load(&self->head->first);
    for (Py_ssize_t at = 0; at < view.len; at += 20) {
        uint64_t key;
        uint32_t region, offset, length;
        memcpy(&key, p + at, 8);
        memcpy(&region, p + at + 8, 4);
        memcpy(&offset, p + at + 12, 4);
        memcpy(&length, p + at + 16, 4);
        if (region < first || region == UINT32_MAX) continue;
        put_loc(self, stored(key), (uint64_t)region << 32 | offset, length);
        put++;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(put);
}

/* The live slots as bytes, 20 each, as DiskIndex.dump gives them. */
static PyObject *SharedIndex_dump(SharedIndexObject *self, PyObject *unused) {
    NEED_HEAD(self);
    uint64_t total = (self->mask + 1) * WAYS;
    char *buffer = PyMem_Malloc(total * 20 + 1);
    if (buffer == NULL) return PyErr_NoMemory();
    char *p = buffer;
    for (uint64_t i = 0; i < total; i++) {
        SharedSlot *s = &self->slots[i];
        uint64_t key = load(&s->key), loc = load(&s->loc), length = load(&s->length);
        if (key == 0 || !live_loc(self, loc)) continue;
        uint32_t region = loc_region(loc), offset = (uint32_t)loc, len32 = (uint32_t)length;
        memcpy(p, &key, 8);
        memcpy(p + 8, &region, 4);
        memcpy(p + 12, &offset, 4);
        memcpy(p + 16, &len32, 4);
        p += 20;
    }
    PyObject *out = PyBytes_FromStringAndSize(buffer, p - buffer);
    PyMem_Free(buffer);
    return out;
}

/* This process follows the eviction of `region`, the oldest it had seen live (DiskTier drops
 * regions up to the ring's first one by one): returned, the records of the regions this
 * process's reservations evicted since its last call, which it alone counted. */
static PyObject *SharedIndex_evict_region(SharedIndexObject *self, PyObject *arg) {
    uint64_t region;
    NEED_HEAD(self);
    if (parse_u64(arg, &region) < 0) return NULL;
    if (region != self->followed) {
        PyErr_Format(PyExc_ValueError, "regions are evicted oldest first: %u, not %llu",
                     self->followed, (unsigned long long)region);
        return NULL;
    }
    self->followed = (uint32_t)region + 1;
    long long gone = self->evicted;
    self->evicted = 0;
    return PyLong_FromLongLong(gone);
}

/* The counts of a region this process evicted, taken whole. */
static void take_counts(SharedIndexObject *self, uint64_t region) {
    uint64_t r = region % (2 * self->head->ring);
    int64_t gone = __atomic_exchange_n(&self->counts[r], 0, __ATOMIC_ACQ_REL);
    int64_t gone_bytes = __atomic_exchange_n(&self->rbytes[r], 0, __ATOMIC_ACQ_REL);
    add(&self->head->live, -gone);
    add(&self->head->bytes, -gone_bytes);
    self->evicted += gone;
}

static PyObject *SharedIndex_resume(SharedIndexObject *self, PyObject *arg) {
    uint64_t first;
    NEED_HEAD(self);
    if (parse_u64(arg, &first) < 0) return NULL;
    if (first >= UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "resume(first): first < 2**32 - 1");
        return NULL;
    }
    self->followed = (uint32_t)first;
    Py_RETURN_NONE;
}

/* Reserve `length` bytes at the ring's head: (region, offset, regions evicted to open it). */
static PyObject *SharedIndex_reserve(SharedIndexObject *self, PyObject *arg) {
    uint64_t length;
    NEED_HEAD(self);
    if (parse_u64(arg, &length) < 0) return NULL;
    SharedIndexHead *h = self->head;
    if (length > h->region_size) Py_RETURN_NONE;
    for (;;) {
        uint64_t word = load(&h->head);
        uint64_t open = word >> 32, fill = word & UINT32_MAX;
        if (open != 0 && fill + length <= h->region_size) {
            if (cas(&h->head, &word, open << 32 | (fill + length)))
                return Py_BuildValue("(KKO)", (unsigned long long)(open - 1),
                                     (unsigned long long)fill, Py_None);
            continue;
        }
        uint64_t region = open != 0 ? open : load(&h->next);
        if (region + 1 >= UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "the disk tier's regions ran out of numbers");
            return NULL;
        }
        if (!cas(&h->head, &word, (region + 1) << 32 | length)) continue;
        uint64_t first = load(&h->first), want = region + 1 > h->ring ? region + 1 - h->ring : 0;
        while (first < want && !cas(&h->first, &first, want)) {
        }
        PyObject *evicted = PyList_New(0);
        for (uint64_t r = first; evicted != NULL && r < want; r++) {
            take_counts(self, r);
            PyObject *n = PyLong_FromUnsignedLongLong(r);
            if (n == NULL || PyList_Append(evicted, n) < 0) Py_CLEAR(evicted);
            Py_XDECREF(n);
        }
        if (evicted == NULL) return NULL;
        return Py_BuildValue("(KKN)", (unsigned long long)region, 0ULL, evicted);
    }
}

/* After a start: regions from first live, `open` (None: none yet) open at fill. */
static PyObject *SharedIndex_restart(SharedIndexObject *self, PyObject *args) {
    unsigned long long first, fill;
    PyObject *open;
    NEED_HEAD(self);
    if (!PyArg_ParseTuple(args, "KOK", &first, &open, &fill)) return NULL;
    SharedIndexHead *h = self->head;
    unsigned long long last = first;
    if (open != Py_None) {
        last = PyLong_AsUnsignedLongLong(open);
        if (last == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    if (last + 1 >= UINT32_MAX || last < first || fill > h->region_size) {
        PyErr_SetString(PyExc_ValueError, "restart(first, open, fill): first <= open < 2**32 - 1, "
                        "fill within a region");
        return NULL;
    }
    store(&h->first, first);
    store(&h->next, open == Py_None ? first : last + 1);
    store(&h->head, open == Py_None ? 0 : (last + 1) << 32 | fill);
    self->followed = (uint32_t)first;
    Py_RETURN_NONE;
}

/* The open region takes no more records: the next reservation opens a new one. */
static PyObject *SharedIndex_close_open(SharedIndexObject *self, PyObject *unused) {
    NEED_HEAD(self);
    SharedIndexHead *h = self->head;
    uint64_t word = load(&h->head);
    while (word != 0 && !cas(&h->head, &word, (word >> 32) << 32 | h->region_size)) {
    }
    Py_RETURN_NONE;
}

static PyObject *SharedIndex_checkpoint_begin(SharedIndexObject *self, PyObject *unused) {
    NEED_HEAD(self);
    return PyLong_FromUnsignedLongLong(__atomic_add_fetch(&self->head->begun, 1,
                                                          __ATOMIC_ACQ_REL));
}

static PyObject *SharedIndex_checkpoint_end(SharedIndexObject *self, PyObject *arg) {
    uint64_t seq;
    NEED_HEAD(self);
    if (parse_u64(arg, &seq) < 0) return NULL;
    uint64_t done = load(&self->head->done);
    while (done < seq && !cas(&self->head->done, &done, seq)) {
    }
    Py_RETURN_NONE;
}

static PyObject *SharedIndex_banned(SharedIndexObject *self, PyObject *unused) {
    NEED_HEAD(self);
    return PyLong_FromUnsignedLongLong(
        __atomic_add_fetch(&self->head->bans, 1, __ATOMIC_ACQ_REL));
}

static Py_ssize_t SharedIndex_len(SharedIndexObject *self) {
    if (self->head == NULL) return 0;
    int64_t live = __atomic_load_n(&self->head->live, __ATOMIC_RELAXED);
    return live > 0 ? (Py_ssize_t)live : 0;
}

#define GETTER(name, expr) \
    static PyObject *SharedIndex_##name(SharedIndexObject *self, void *closure) { \
        NEED_HEAD(self); \
        return PyLong_FromLongLong((long long)(expr)); \
    }

GETTER(first, self->followed)
GETTER(oldest, load(&self->head->first))
GETTER(open_region, (load(&self->head->head) >> 32) - 1)
GETTER(fill, load(&self->head->head) == 0 ? self->head->region_size
                                          : (load(&self->head->head) & UINT32_MAX))
GETTER(bytes, __atomic_load_n(&self->head->bytes, __ATOMIC_RELAXED))
GETTER(pushed_out, __atomic_load_n(&self->head->pushed_out, __ATOMIC_RELAXED))
GETTER(memory_bytes, index_bytes(self->head->ring, self->mask + 1))
GETTER(slots, (self->mask + 1) * WAYS)
GETTER(begun, load(&self->head->begun))
GETTER(done, load(&self->head->done))
GETTER(bans, load(&self->head->bans))

PyObject *py_shared_index_bytes(PyObject *module, PyObject *args) {
    unsigned long long ring, region_size;
    if (!PyArg_ParseTuple(args, "KK", &ring, &region_size)) return NULL;
    return PyLong_FromUnsignedLongLong(index_bytes(ring, buckets_for(ring, region_size)));
}

static PyMethodDef SharedIndex_methods[] = {
    {"get", (PyCFunction)SharedIndex_get, METH_O,
     "get(key) -> (region, offset, length) of key's record, or None."},
    {"put", (PyCFunction)(void (*)(void))SharedIndex_put, METH_FASTCALL,
     "put(key, region, offset, length): key's record lies there (replacing where it lay)."},
    {"delete_at", (PyCFunction)(void (*)(void))SharedIndex_delete_at, METH_FASTCALL,
     "delete_at(key, region, offset): forget key if its record lies there; whether it did."},
    {"evict_region", (PyCFunction)SharedIndex_evict_region, METH_O,
     "evict_region(region): follow the eviction of the oldest region; the records of the "
     "regions this process's reservations evicted since the last call."},
    {"load", (PyCFunction)SharedIndex_load, METH_O,
     "load(slots): put back what dump gave (regions older than the ring's first left out)."},
    {"dump", (PyCFunction)SharedIndex_dump, METH_NOARGS,
     "The live slots as bytes, 20 each, as DiskIndex.dump gives them."},
    {"resume", (PyCFunction)SharedIndex_resume, METH_O,
     "resume(first): this process follows evictions from region first on."},
    {"reserve", (PyCFunction)SharedIndex_reserve, METH_O,
     "reserve(length) -> (region, offset, [regions evicted]) at the ring's head, or None "
     "when longer than a region."},
    {"restart", (PyCFunction)SharedIndex_restart, METH_VARARGS,
     "restart(first, open, fill): the ring after a start (open None: none open yet)."},
    {"close_open", (PyCFunction)SharedIndex_close_open, METH_NOARGS,
     "The open region takes no more records: the next reservation opens a new one."},
    {"checkpoint_begin", (PyCFunction)SharedIndex_checkpoint_begin, METH_NOARGS,
     "A checkpoint begins: its number."},
    {"checkpoint_end", (PyCFunction)SharedIndex_checkpoint_end, METH_O,
     "checkpoint_end(n): checkpoint n is on the device."},
    {"banned", (PyCFunction)SharedIndex_banned, METH_NOARGS,
     "A process saved a purge by prefix or tag: the others read the bans again. Returns the "
     "count of purges saved, this one included."},
    {NULL},
};

static PyGetSetDef SharedIndex_getset[] = {
    {"first", (getter)SharedIndex_first, NULL, "the oldest live region this process followed",
     NULL},
    {"oldest", (getter)SharedIndex_oldest, NULL, "the ring's oldest live region", NULL},
    {"open_region", (getter)SharedIndex_open_region, NULL, "the open region (-1: none)", NULL},
    {"fill", (getter)SharedIndex_fill, NULL, "bytes of the open region reserved", NULL},
    {"bytes", (getter)SharedIndex_bytes, NULL, "bytes of the records indexed", NULL},
    {"pushed_out", (getter)SharedIndex_pushed_out, NULL,
     "records forgotten because their bucket was full", NULL},
    {"memory_bytes", (getter)SharedIndex_memory_bytes, NULL, "bytes of shared memory", NULL},
    {"slots", (getter)SharedIndex_slots, NULL, "records the index can hold", NULL},
    {"checkpoints_begun", (getter)SharedIndex_begun, NULL, "checkpoints begun", NULL},
    {"checkpoints_done", (getter)SharedIndex_done, NULL, "the last checkpoint written", NULL},
    {"bans_saved", (getter)SharedIndex_bans, NULL, "purges by prefix or tag saved so far",
     NULL},
    {NULL},
};

static PySequenceMethods SharedIndex_as_sequence = {
    .sq_length = (lenfunc)SharedIndex_len,
};

PyTypeObject SharedIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.SharedIndex",
    .tp_basicsize = sizeof(SharedIndexObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The disk tier's index and ring head in shared memory: 64-bit key hash -> "
              "(region, offset, length), read and written by every process without locks.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SharedIndex_init,
    .tp_dealloc = (destructor)SharedIndex_dealloc,
    .tp_methods = SharedIndex_methods,
    .tp_getset = SharedIndex_getset,
    .tp_as_sequence = &SharedIndex_as_sequence,
};
