/* The compiled policy core's shared types: what its parts (hash, Bloom, window, sketch, store
 * index and evictions, admission, simulator, header fields) give one another.
 *
 * Rules the core keeps:
 *
 * - hash64 is MurmurHash3 x64/128 (seed 0) of a key's UTF-8 bytes, as two unsigned 64-bit
 *   halves: bit for bit what mmh3.hash64(key, signed=False) returns, so probe positions are
 *   the same here, in pure-Python readers of a filter and in the Redis script.
 * - A Bloom filter probes (h1 + i*h2) mod m for i < k (Kirsch-Mitzenmacher double hashing).
 * - A Window is g Bloom generations, newest first; its rotation rules are those documented in
 *   proxy/core/window.py, including Python's float floor division for elapsed spans, so a
 *   window decides identically whoever drives it.
 * - A StoreIndex is a byte-bounded store over 64-bit key hashes: sizes, charges, hits and the
 *   store time of each entry, and the eviction and dead-write counts. Callers keep payloads.
 *   Each eviction (lru, sieve, s3fifo, wtinylfu) is one table of functions, an Eviction.
 * - A DiskIndex is the disk tier's RAM index: key hash -> (region, offset, length).
 * - An Admission is one admission policy (always, second-hit, nth-hit, tinylfu,
 *   probabilistic, size-below, adaptive).
 * - simulate_chunk drives a StoreIndex and an Admission over a trace's arrays with the cache
 *   engine's rules for a cacheable response (see loadgen/sim/simulate.py); simulate_tiers the
 *   same loop with a disk tier behind it (a DiskIndex, its Admission and WriteBudget: see
 *   loadgen/sim/tiers.py).
 * - index_fields and end_to_end read header fields as rfc9111.Fields and rfc9111.end_to_end
 *   do (lower-cased names, as str.lower gives them).
 *
 * Functions called once per request (probes, sketch counts, list moves) are inline here; the
 * build links with -flto, so calls between the parts cost what calls within one file did. */
#ifndef ONEHIT_NATIVE_H
#define ONEHIT_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <math.h>

#include "age.h"
#include "sample.h"
#include <stdint.h>
#include <string.h>

/* hash.c */

void murmur3_128(const uint8_t *data, Py_ssize_t len, uint64_t *out1, uint64_t *out2);
int hash_key(PyObject *key, uint64_t *h1, uint64_t *h2);
int parse_hash(PyObject *h, uint64_t *h1, uint64_t *h2);
int sizing(long long capacity, double fp_rate, long long *bits, int *probes);
PyObject *py_hash64(PyObject *module, PyObject *key);
PyObject *py_sample_point(PyObject *module, PyObject *args);
PyObject *py_optimal_size(PyObject *module, PyObject *args);

/* A uniform double in [0, 1) from a xorshift64* generator: what every random choice of the
 * core draws (probabilistic admission, a disk tier's write budget), so a seed repeats a run
 * whichever driver makes it. */
static inline double next_uniform(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * 0x1.0p-53;
}

/* bloom.c */

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

extern PyTypeObject BloomType;
int bloom_setup(BloomObject *self, long long capacity, double fp_rate);
BloomObject *bloom_new(long long capacity, double fp_rate);
void bloom_clear(BloomObject *b);

/* 1 if every probed bit was set already (the key was present), else 0. */
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

/* shared_window.c: a window's generations and rotation state in memory that processes
 * share (see proxy/core/window.py). */

#define SHARED_MAX_G 16

typedef struct {
    uint64_t magic;
    int64_t g, size_bits, num_hashes, share;
    int64_t limit;     /* first sightings after which the newest generation rotates (<= share) */
    double window;
    uint64_t origin;   /* the rotation grid's start (a double's bits; 0: not set yet) */
    uint64_t epoch;    /* rotations so far: the newest generation is slot epoch % (g + 1) */
    uint64_t ready;    /* the last epoch whose spare slot is known cleared */
    int64_t clearer;   /* the pid of the process clearing a spare (0: none) */
    int64_t period;    /* the grid period of the last timed rotation */
    uint64_t rotations, forced;
    int64_t counts[SHARED_MAX_G + 1];
} SharedHead;

typedef struct {
    SharedHead *head;
    uint8_t *slots;     /* g generations of slot_bytes each */
    int64_t slot_bytes;
    Py_buffer view;     /* held: the memory stays mapped while the window lives */
} SharedWindow;

int64_t shared_window_bytes(int64_t size_bits, int g);
PyObject *py_shared_window_bytes(PyObject *module, PyObject *args);

/* window.c */

typedef struct {
    PyObject_HEAD
    SharedWindow *shared;  /* NULL: the window is this process's own */
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

extern PyTypeObject WindowType;
/* 1 seen, 0 not, -1 error. */
int window_seen_before(WindowObject *w, uint64_t h1, uint64_t h2, double now);
int shared_attach(WindowObject *w, PyObject *buffer, long long share);
void shared_detach(WindowObject *w);
int shared_seen_before(WindowObject *w, uint64_t h1, uint64_t h2, double now);
int shared_contains(WindowObject *w, uint64_t h1, uint64_t h2, double now);
void shared_clear(WindowObject *w, double now);
/* A copy of generation i (newest first), as a Bloom of this process. */
BloomObject *shared_generation(WindowObject *w, int i);
int window_now(PyObject *arg, double *now);
/* The sizer's share for the next generation (at least 1); -1 on its error. */
int window_sizer_share(WindowObject *w, long long *share);

/* sketch.c: a count-min sketch of 4 rows of 8-bit counters saturating at a ceiling, halved
 * after a period of counts. */

typedef struct {
    uint8_t *rows;   /* 4 rows of `width` counters */
    uint64_t width;  /* a power of two */
    uint8_t ceiling;
    long long added;
    long long period;
} Sketch;

int sketch_init(Sketch *s, long long keys, uint8_t ceiling, long long periods);
void sketch_halve(Sketch *s);

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

/* TinyLFU hashes a key from h1 alone: the store index, which names its victim, keeps only h1. */
static inline uint64_t second_hash(uint64_t h1) { return fmix64(h1 ^ 0x5bd1e9955bd1e995ULL); }

/* index.c and evictions.c */

/* S3-FIFO's small queue is W-TinyLFU's window, its main W-TinyLFU's probation. */
enum { Q_MAIN, Q_SMALL, Q_GHOST, Q_PROTECTED, N_QUEUES };

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

typedef struct IndexObject IndexObject;

/* One eviction policy, as libCacheSim's cache.h has one function table per eviction. */
typedef struct {
    const char *name;
    /* Sets the queue sizes and state the policy keeps; -1 with an exception set. */
    int (*init)(IndexObject *x);
    /* Sets the queue sizes the policy derives from the capacity, after it changed (NULL:
     * none). */
    void (*sizes)(IndexObject *x);
    /* The queue a new key enters. */
    int entry_queue;
    /* 1: the entry queue may grow past its share until the store is full (2Q's Ain); 0: until
     * the first eviction, a full small queue sends new keys to main (S3-FIFO's rule). */
    int small_grows;
    /* 1: a reshape puts an entry never read in the entry queue, not main: main evicts only
     * past its share (S3-FIFO's), and such an entry would squat there. */
    int unread_to_entry;
    /* A hit's effect on the order of resident node i. */
    void (*touch)(IndexObject *x, int32_t i);
    /* Evicts one entry to make room before an insert (NULL: the policy makes room after it);
     * its key goes to `evicted` when that is not NULL. */
    int (*evict)(IndexObject *x, PyObject *evicted);
    /* After key was inserted: the evictions the policy makes then (NULL: none). */
    int (*settle)(IndexObject *x, uint64_t key, PyObject *evicted);
    /* After a reshape made this the policy, with the entries placed: what its state should
     * learn from their hits (NULL: nothing); -1 with an exception set. */
    int (*adopt)(IndexObject *x);
    /* The node the policy would evict next, without evicting it; -1 when empty. */
    int32_t (*victim)(const IndexObject *x);
} Eviction;

/* lru, sieve, s3fifo, wtinylfu, twoq: the policies an index is created with, by name. */
extern const Eviction *const EVICTIONS[];
extern const int N_EVICTIONS;

struct IndexObject {
    PyObject_HEAD
    Node *nodes;
    int32_t nodes_cap;
    int32_t free_head;
    int32_t head[N_QUEUES], tail[N_QUEUES];
    long long bytes[N_QUEUES];
    int32_t hand;
    const Eviction *ev;
    int has_evicted;
    long long count;   /* resident entries */
    long long ghosts;  /* keys in the ghost queue */
    int32_t *table;
    uint64_t mask;
    long long capacity;
    long long max_charge;  /* the largest charge the index stores */
    long long small_capacity;
    long long ghost_capacity;
    long long protected_capacity;
    /* The policy's knobs, as created (negative: the policy's default): the entry queue's
     * share of the bytes (S3-FIFO's small queue, W-TinyLFU's window, 2Q's Ain), the ghost
     * queue's, and the hits that move an entry from S3-FIFO's small queue to main. */
    double small_ratio, ghost_ratio;
    int move_hits;
    long long used;
    long long evictions, evicted_bytes, evicted_unread, evicted_unread_bytes;
    long long resident_unread, resident_unread_bytes;
    Sketch sketch;  /* wtinylfu */
};

extern PyTypeObject IndexType;

static inline uint64_t slot_of(uint64_t key, uint64_t mask) {
    return (key * 0x9e3779b97f4a7c15ULL) >> 17 & mask;
}

/* The table slot holding key, or -(free slot) - 1. */
static inline int64_t index_find_slot(const IndexObject *x, uint64_t key) {
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

static inline void index_touch(IndexObject *x, int32_t i) { x->ev->touch(x, i); }

static inline void index_record_hit(IndexObject *x, int32_t i) {
    Node *n = &x->nodes[i];
    if (n->hits == 0) {
        x->resident_unread--;
        x->resident_unread_bytes -= n->size;
    }
    n->hits++;
}

/* Stores key (replacing it), evicting until it fits; appends the evicted keys to `evicted`
 * when it is not NULL. The caller checked charge <= max_charge. */
int index_put(IndexObject *x, uint64_t key, long long size, long long charge, long long hits,
              double stored_at, PyObject *evicted);
/* A resident node leaves the store's counts (it is unlinked already). */
void index_forget(IndexObject *x, Node *n);
/* Removes a resident key (not an eviction); 1 if it was there. */
int index_delete(IndexObject *x, uint64_t key);
/* Unlinks node i found at table slot s and frees it; a resident one leaves the counts. */
void index_drop(IndexObject *x, int32_t i, uint64_t s);
/* Counts node i's eviction and reports its key; the caller then removes it. */
int index_count_eviction(IndexObject *x, int32_t i, PyObject *evicted);
/* Evicts node i: counted, reported and removed. */
int index_evict_node(IndexObject *x, int32_t i, PyObject *evicted);

/* admission.c */

enum {
    A_ALWAYS, A_SECOND_HIT, A_NTH_HIT, A_TINYLFU, A_PROBABILISTIC, A_SIZE_BELOW, A_ADAPTIVE,
    A_AUTO
};

struct Disk;

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
    uint64_t sample_key;   /* the sample's secret (sample.h): 0, unkeyed */
    long long overhead;
    long long period;
    long long sampled;
    long long margin_hits;
    long long switches;
    /* auto (a disk tier's, auto.c): each candidate's ghost tier, fed the sampled lookups */
    struct Disk *ghosts;
    long long *ghost_counts;  /* the ghosts' counts, T_COUNT each */
    double *written;          /* each candidate's recent ghost bytes written (halved alike),
                               * then what each wrote in the current period */
    double rate;              /* the share of keys sampled */
    double seen;              /* recent sampled lookups (halved alike) */
    double margin;            /* of the hit ratio: candidates this close to the best are tied */
    double budget;            /* bytes a second the tier may write (0: none) */
    double period_start;      /* when the current period began (NaN: not yet) */
    PyObject *ghost_budget;   /* the ghosts' WriteBudget: none */
    double share;             /* of the most written: past it a candidate is left out while
                               * the most writing ghost evicts (auto.c) */
    long long *evicted;       /* each ghost's regions evicted when the period began */
    Py_ssize_t classes;       /* how many size classes: the last candidates (auto.c) */
    int *percentiles;         /* each size class's percentile */
    double *size_bins;        /* size classes: a histogram of the sizes looked up (auto.c) */
} AdmissionObject;

extern PyTypeObject AdmissionType;
/* 1 admit, 0 not, -1 error. */
int admission_admit(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now);
int admission_age(AdmissionObject *a);
int adaptive_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now);
/* auto.c: the ghosts of a disk tier's candidates. */
int auto_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now);
int auto_init(AdmissionObject *a, PyObject *ghost_indexes, long long region_size,
              long long regions, long long record_overhead, double share, PyObject *classes,
              long long longest);
void auto_free(AdmissionObject *a);

/* Every request, hit or miss, once its size is known: TinyLFU counts them all, adaptive
 * feeds its candidates and shadows; the others ignore it. */
static inline int admission_observe(AdmissionObject *a, uint64_t h1, uint64_t h2,
                                    long long size, double now) {
    if (a->kind == A_ADAPTIVE) return adaptive_observe(a, h1, h2, size, now);
    if (a->kind == A_AUTO) return auto_observe(a, h1, h2, size, now);
    if (a->kind != A_TINYLFU) return 0;
    h2 = second_hash(h1);
    if (bloom_add(a->doorkeeper, h1, h2)) sketch_add(&a->sketch, h1, h2);
    else a->sketch.added++;
    if (a->sketch.added >= a->sketch.period) return admission_age(a);
    return 0;
}

/* diskindex.c, shared_index.c */

static inline int parse_u64(PyObject *arg, uint64_t *out) {
    *out = PyLong_AsUnsignedLongLong(arg);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* The key and place of a call (key, region, offset) to a disk index: 1 when the place is one
 * an index holds (region and offset within 32 bits, the region not UINT32_MAX), 0 when no
 * record can lie there, -1 with an exception set. */
static inline int parse_place(PyObject *const *args, Py_ssize_t n, uint64_t *key,
                              uint32_t *region, uint32_t *offset) {
    uint64_t r, o;
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "delete_at(key, region, offset)");
        return -1;
    }
    if (parse_u64(args[0], key) < 0 || parse_u64(args[1], &r) < 0 || parse_u64(args[2], &o) < 0)
        return -1;
    if (r >= UINT32_MAX || o > UINT32_MAX) return 0;
    *region = (uint32_t)r;
    *offset = (uint32_t)o;
    return 1;
}

/* diskindex.c */

typedef struct {
    uint32_t key_lo, key_hi;
    uint32_t region, offset, length;
} DiskSlot;

typedef struct {
    PyObject_HEAD
    DiskSlot *slots;
    uint64_t mask;
    long long live;  /* slots of live regions */
    long long dead;  /* slots of evicted regions, not yet dropped */
    uint32_t first;  /* the oldest live region */
    long long ring;  /* regions the tier holds at most */
    long long *counts; /* slots per live region, by region % ring */
    long long *bytes;  /* their records' bytes, by region % ring */
    long long held;    /* bytes of the live slots' records */
} DiskIndexObject;

extern PyTypeObject DiskIndexType;
/* key's live slot, or NULL. */
const DiskSlot *disk_index_get(DiskIndexObject *x, uint64_t key);
/* key's record lies at (region, offset, length), replacing where it lay; -1 with an exception
 * set when the table cannot grow. The caller checked the values fit and region >= first. */
int disk_index_put(DiskIndexObject *x, uint64_t key, uint32_t region, uint32_t offset,
                   uint32_t length);
/* Forgets key's slot when it is live and lies at only_region and only_offset: 1 when it did,
 * 0 when not, -1 with an exception set. */
int disk_index_delete_at(DiskIndexObject *x, uint64_t key, uint32_t only_region,
                         uint32_t only_offset);
/* The oldest live region (x->first, the caller checked) is gone: how many slots went with it,
 * or -1 with an exception set. */
long long disk_index_evict_region(DiskIndexObject *x, uint32_t region);

/* shared_index.c */

extern PyTypeObject SharedIndexType;
PyObject *py_shared_index_bytes(PyObject *module, PyObject *args);

/* budget.c: a disk tier's write budget (see proxy/core/disk.py). */

typedef struct {
    PyObject_HEAD
    double rate;         /* bytes a second; 0: no budget */
    double probability;  /* the share of what admission takes that is written */
    double start;        /* when the current second began */
    int started;
    long long bytes;     /* written since start */
    uint64_t rng;
} WriteBudgetObject;

extern PyTypeObject WriteBudgetType;

/* Whether a record the admission took may be written at now. */
static inline int budget_allow(WriteBudgetObject *b, double now) {
    if (b->rate <= 0) return 1;
    if (!b->started) {
        b->start = now;
        b->started = 1;
    }
    double elapsed = now - b->start;
    if (elapsed >= 1.0) {
        double observed = (double)b->bytes / elapsed;
        if (observed > b->rate)
            b->probability = fmax(0.001, b->probability * b->rate / observed);
        else if (observed > 0)
            b->probability = fmin(1.0, b->probability * fmin(2.0, b->rate / observed));
        else
            b->probability = fmin(1.0, b->probability * 2.0);
        b->start = now;
        b->bytes = 0;
    }
    return b->probability >= 1.0 || next_uniform(&b->rng) < b->probability;
}

/* simulate.c: the simulator's loop, for one tier or two (tiers.c: the disk's part). */

enum {
    C_REQUESTS, C_HITS, C_MISSES, C_HIT_BYTES, C_BYTES_SERVED, C_ORIGIN_FETCHES,
    C_ORIGIN_BYTES, C_TOO_LARGE, C_REJECTED, C_BYTES_NOT_WRITTEN, C_ADMISSIONS,
    C_BYTES_WRITTEN, C_ONE_TIER, /* the counts of one tier; then those a disk tier adds */
    C_HITS_FROM_DISK = C_ONE_TIER, C_PROMOTED, C_BEYOND_MEMORY,
    D_HITS, D_MISSES, D_ADMISSIONS, D_REJECTED, D_TOO_LARGE, D_THROTTLED, D_BYTES_WRITTEN,
    D_BYTES_NOT_WRITTEN, D_EVICTED_OBJECTS, D_DROPPED,
    R_OLDEST, R_NEXT, R_FILL, R_BYTES_WRITTEN, R_EVICTIONS, T_COUNT
};

typedef struct {
    uint64_t *keys;
    double *times;
    uint64_t mask;
    long long used;
} Written;

/* A disk tier as the loop drives it: its index, admission and budget, its ring (live regions
 * oldest..next-1, the last open at fill), the bytes a record has besides its key and body,
 * when each record was written (with a finite ttl), the counts c, and the memory tier's
 * promotion filter for its hits (NULL: none). */
typedef struct Disk {
    DiskIndexObject *index;
    AdmissionObject *admission;
    WriteBudgetObject *budget;
    long long region_size, regions;
    long long oldest, next, fill;
    long long record_overhead;
    Written written;
    long long *c;
    AdmissionObject *promotion;
    /* A ghost's: the longest record it takes (its tier's region), each written on from where
     * the last ended, across its regions; 0: a tier's, whose records each fit one region. */
    long long longest;
} Disk;

/* Whether the disk answers a memory miss of h1 at now: its record fresh by ttl (from when it
 * was written, set in *written); counted a disk hit or miss. */
int disk_answers(Disk *d, uint64_t h1, double now, double ttl, double *written);
/* The disk forgets h1's record (a fetched response supersedes it), counted as dropped;
 * -1 with an exception set. */
int disk_forget(Disk *d, uint64_t h1);
/* The response of h1 (size body bytes, a record of length) offered at now: written when the
 * tier takes it, as DiskTier.offer does. 1 written, 0 not, -1 with an exception set. */
int disk_offer(Disk *d, uint64_t h1, uint64_t h2, long long size, long long length,
               double now, double ttl);
/* Frees what the loop kept of d. */
void disk_done(Disk *d);

PyObject *py_simulate_chunk(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *py_simulate_tiers(PyObject *module, PyObject *args, PyObject *kwds);
/* A contiguous array of 8-byte items as view: kind 'f' float64, 'u' uint64, 'i' int64; -1
 * with a TypeError naming `what` otherwise. */
int get_array(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t itemsize, char kind);
/* v in decimal at out (at most 20 characters); returns how many. */
int format_decimal(char *out, uint64_t v);
PyObject *py_hash_ids(PyObject *module, PyObject *args);
PyObject *py_footprint(PyObject *module, PyObject *args);

/* fields.c */

PyObject *py_index_fields(PyObject *module, PyObject *pairs);
PyObject *py_end_to_end(PyObject *module, PyObject *args);
PyObject *py_indexed_fields(PyObject *module, PyObject *args);
PyObject *py_field_lines(PyObject *module, PyObject *pairs);

#endif
