/* The evictions a store index is created with: one table of functions each. */
#include "native.h"

/* - lru: a hit moves the entry to the front; the back is evicted.
 * - sieve (Zhang et al., NSDI'24): a hit marks the entry visited; a hand walks from the back
 *   towards the front, unmarking visited entries and evicting the first unvisited one, and
 *   stays where it stopped.
 * - s3fifo (Yang et al., SOSP'23): a small FIFO of 10% of the bytes, a main FIFO of the rest
 *   and a ghost FIFO of 90% of the bytes; a hit counts (up to 3). New keys enter the small
 *   queue, keys found in the ghost enter the main one. The small queue's oldest entry moves
 *   to main if it was hit twice (`move` hits), else it is evicted into the ghost; main's oldest is evicted
 *   if its count is 0, else re-inserted with one count less. Until the first eviction, new
 *   keys go to main once the small queue is full. An entry larger than the small queue is not
 *   stored. These are libCacheSim's rules, so the two agree on a trace.
 * - wtinylfu (Einziger et al., TOS 2017; Caffeine): new keys enter an LRU window of 1% of
 *   the bytes (`small`); what leaves the window is a candidate for the main space (an SLRU: probation,
 *   and a protected 80% that a hit in probation promotes to). When the store is over its
 *   bytes, the candidate and probation's LRU entry meet: the one requested less often, by a
 *   4-row sketch of every request (halved after ten sketch-widths of counts, re-sized then to
 *   the entries held), is evicted; a tie evicts the candidate.
 * - twoq (Johnson and Shasha, VLDB'94, as libCacheSim's TwoQ): new keys enter Ain, a FIFO of
 *   25% of the bytes, where a hit changes nothing; keys found in Aout, a ghost FIFO of 50% of
 *   the bytes, enter Am, an LRU of the rest. When the store is full, Ain's oldest goes to Aout
 *   while Ain is over its share, else Am's least recent is evicted. An entry larger than Ain
 *   is not stored.
 *
 * The shares and S3-FIFO's `move` are knobs an index is created with (`small`, `ghost`,
 * `move`; negative: the policy's default, which is libCacheSim's); S4-FIFO (OSDI'26) tunes
 * S3-FIFO's alike. */

static inline double knob(double set, double otherwise) { return set >= 0 ? set : otherwise; }

/* lru */

static void lru_touch(IndexObject *x, int32_t i) {
    if (x->head[Q_MAIN] != i) {
        list_unlink(x, i);
        list_push_front(x, i, Q_MAIN);
    }
}

static int lru_evict(IndexObject *x, PyObject *evicted) {
    return index_evict_node(x, x->tail[Q_MAIN], evicted);
}

static int32_t lru_victim(const IndexObject *x) { return x->tail[Q_MAIN]; }

static const Eviction LRU = {
    .name = "lru",
    .entry_queue = Q_MAIN,
    .touch = lru_touch,
    .evict = lru_evict,
    .victim = lru_victim,
};

/* sieve */

static void sieve_touch(IndexObject *x, int32_t i) { x->nodes[i].freq = 1; }

static int sieve_evict(IndexObject *x, PyObject *evicted) {
    int32_t i = x->hand >= 0 ? x->hand : x->tail[Q_MAIN];
    while (x->nodes[i].freq > 0) {
        x->nodes[i].freq = 0;
        i = x->nodes[i].prev >= 0 ? x->nodes[i].prev : x->tail[Q_MAIN];
    }
    x->hand = x->nodes[i].prev;
    return index_evict_node(x, i, evicted);
}

static int32_t sieve_victim(const IndexObject *x) {
    int32_t i = x->hand >= 0 ? x->hand : x->tail[Q_MAIN];
    for (long long steps = 0; i >= 0 && x->nodes[i].freq > 0 && steps <= x->count; steps++)
        i = x->nodes[i].prev >= 0 ? x->nodes[i].prev : x->tail[Q_MAIN];
    return i;
}

static const Eviction SIEVE = {
    .name = "sieve",
    .entry_queue = Q_MAIN,
    .touch = sieve_touch,
    .evict = sieve_evict,
    .victim = sieve_victim,
};

/* s3fifo */

static void s3fifo_sizes(IndexObject *x) {
    /* libCacheSim's sizing: (int64_t)(size * ratio) */
    x->small_capacity = (long long)((double)x->capacity * knob(x->small_ratio, 0.1));
    x->ghost_capacity = (long long)((double)x->capacity * knob(x->ghost_ratio, 0.9));
    x->max_charge = x->small_capacity;
}

static int s3fifo_init(IndexObject *x) {
    s3fifo_sizes(x);
    return 0;
}

static void s3fifo_touch(IndexObject *x, int32_t i) {
    Node *n = &x->nodes[i];
    if (n->freq < 3) n->freq++;
}

/* Node i (unlinked) is evicted into the ghost queue: counted and reported as an eviction,
 * its key kept as one that is not resident, the ghost trimmed to its bytes oldest first
 * (S3-FIFO's ghost, 2Q's Aout). */
static int evict_into_ghost(IndexObject *x, int32_t i, PyObject *evicted) {
    Node *n = &x->nodes[i];
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

static int s3fifo_evict_small(IndexObject *x, PyObject *evicted) {
    while (x->tail[Q_SMALL] >= 0) {
        int32_t i = x->tail[Q_SMALL];
        Node *n = &x->nodes[i];
        list_unlink(x, i);
        if (n->freq >= (int)knob(x->move_hits, 2)) {
            n->freq = 0;
            list_push_front(x, i, Q_MAIN);
            continue;
        }
        return evict_into_ghost(x, i, evicted);
    }
    return 0;
}

static int s3fifo_evict_main(IndexObject *x, PyObject *evicted) {
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

/* Main is over its share, or the small queue holds no bytes. */
static inline int s3fifo_main_first(const IndexObject *x) {
    return x->bytes[Q_MAIN] > x->capacity - x->small_capacity || x->bytes[Q_SMALL] == 0;
}

static int s3fifo_evict(IndexObject *x, PyObject *evicted) {
    return s3fifo_main_first(x) ? s3fifo_evict_main(x, evicted) : s3fifo_evict_small(x, evicted);
}

/* The entry a candidate competes with for lasting space (TinyLFU's duel): main's oldest. The
 * small queue's tail is not one: it was itself admitted a moment ago, with the candidate's
 * count or more, so a duel with it turns nearly every new key away (a tie rejects). */
static int32_t s3fifo_victim(const IndexObject *x) {
    return x->tail[Q_MAIN] >= 0 ? x->tail[Q_MAIN] : x->tail[Q_SMALL];
}

static const Eviction S3FIFO = {
    .name = "s3fifo",
    .init = s3fifo_init,
    .sizes = s3fifo_sizes,
    .entry_queue = Q_SMALL,
    .unread_to_entry = 1,
    .touch = s3fifo_touch,
    .evict = s3fifo_evict,
    .victim = s3fifo_victim,
};

/* wtinylfu */

static void wtinylfu_sizes(IndexObject *x) {
    /* Caffeine's window, 1%, by default as libCacheSim sizes it: capacity / 100 in integers,
     * which capacity * 0.01 in doubles is not always. */
    x->small_capacity = x->small_ratio >= 0 ? (long long)((double)x->capacity * x->small_ratio)
                                            : x->capacity / 100;
    x->protected_capacity = (x->capacity - x->small_capacity) / 5 * 4;
}

static int wtinylfu_init(IndexObject *x) {
    wtinylfu_sizes(x);
    return sketch_init(&x->sketch, 1024, 15, 10);
}

/* W-TinyLFU counts every request of a key it holds or takes in. */
static void wtinylfu_count(IndexObject *x, uint64_t key) {
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

static inline int wtinylfu_frequency(const IndexObject *x, uint64_t key) {
    return sketch_estimate(&x->sketch, key, second_hash(key));
}

static void wtinylfu_touch(IndexObject *x, int32_t i) {
    Node *n = &x->nodes[i];
    wtinylfu_count(x, n->key);
    if (n->queue == Q_PROTECTED || n->queue == Q_SMALL) {
        list_unlink(x, i);
        list_push_front(x, i, n->queue);
        return;
    }
    list_unlink(x, i);
    list_push_front(x, i, Q_PROTECTED);
    while (x->bytes[Q_PROTECTED] > x->protected_capacity && x->tail[Q_PROTECTED] != i) {
        int32_t old = x->tail[Q_PROTECTED];
        list_unlink(x, old);
        list_push_front(x, old, Q_MAIN);
    }
}

/* After key entered the window: what leaves the window becomes a candidate at the front of
 * probation; while over the bytes, the candidates meet probation's LRU entry. */
static int wtinylfu_settle(IndexObject *x, uint64_t key, PyObject *evicted) {
    wtinylfu_count(x, key);
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
            loser = wtinylfu_frequency(x, x->nodes[candidate].key) >
                            wtinylfu_frequency(x, x->nodes[victim].key)
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

/* The sketch, new, would count every resident at 0 and turn each newcomer away at its duel
 * (a tie evicts the candidate) until it had seen the residents again: sized to them, it
 * counts each as often as it was read (up to the ceiling), so that one never read loses to a
 * newcomer and one read keeps its place. A resident's reads are counted at once: its
 * counters raised to its estimate plus them, what as many conservative updates would do. */
static int wtinylfu_adopt(IndexObject *x) {
    Sketch *s = &x->sketch;
    if (sketch_init(s, x->count > 1024 ? x->count : 1024, 15, 10) < 0) return -1;
    static const int queues[] = {Q_MAIN, Q_PROTECTED, Q_SMALL};
    for (int q = 0; q < 3; q++) {
        for (int32_t i = x->head[queues[q]]; i >= 0; i = x->nodes[i].next) {
            uint64_t h1 = x->nodes[i].key, h2 = second_hash(h1);
            long long target = sketch_estimate(s, h1, h2) + x->nodes[i].hits;
            uint8_t t = (uint8_t)(target < s->ceiling ? target : s->ceiling);
            for (int r = 0; r < 4; r++) {
                uint8_t *v = &s->rows[sketch_slot(s, h1, h2, r)];
                if (*v < t) *v = t;
            }
        }
    }
    return 0;
}

static int32_t wtinylfu_victim(const IndexObject *x) {
    return x->tail[Q_MAIN] >= 0 ? x->tail[Q_MAIN] : x->tail[Q_PROTECTED];
}

static const Eviction WTINYLFU = {
    .name = "wtinylfu",
    .init = wtinylfu_init,
    .sizes = wtinylfu_sizes,
    .entry_queue = Q_SMALL,
    .touch = wtinylfu_touch,
    .settle = wtinylfu_settle,
    .adopt = wtinylfu_adopt,
    .victim = wtinylfu_victim,
};

/* twoq */

static void twoq_sizes(IndexObject *x) {
    /* libCacheSim's sizing: cache_size * ratio, as int64_t */
    x->small_capacity = (long long)((double)x->capacity * knob(x->small_ratio, 0.25));
    x->ghost_capacity = (long long)((double)x->capacity * knob(x->ghost_ratio, 0.5));
    x->max_charge = x->small_capacity;
}

static int twoq_init(IndexObject *x) {
    twoq_sizes(x);
    return 0;
}

static void twoq_touch(IndexObject *x, int32_t i) {
    if (x->nodes[i].queue == Q_MAIN && x->head[Q_MAIN] != i) {
        list_unlink(x, i);
        list_push_front(x, i, Q_MAIN);
    }
}

/* Ain's oldest leaves for Aout while Ain is over its share, else Am's least recent goes. */
static int twoq_evict(IndexObject *x, PyObject *evicted) {
    if (x->bytes[Q_SMALL] > x->small_capacity || x->tail[Q_MAIN] < 0) {
        int32_t i = x->tail[Q_SMALL];
        list_unlink(x, i);
        return evict_into_ghost(x, i, evicted);
    }
    return index_evict_node(x, x->tail[Q_MAIN], evicted);
}

static int32_t twoq_victim(const IndexObject *x) {
    if (x->bytes[Q_SMALL] > x->small_capacity || x->tail[Q_MAIN] < 0) return x->tail[Q_SMALL];
    return x->tail[Q_MAIN];
}

static const Eviction TWOQ = {
    .name = "twoq",
    .init = twoq_init,
    .sizes = twoq_sizes,
    .entry_queue = Q_SMALL,
    .small_grows = 1,
    .touch = twoq_touch,
    .evict = twoq_evict,
    .victim = twoq_victim,
};

const Eviction *const EVICTIONS[] = {&LRU, &SIEVE, &S3FIFO, &WTINYLFU, &TWOQ};
const int N_EVICTIONS = (int)(sizeof(EVICTIONS) / sizeof(*EVICTIONS));
