/* A window whose generations and rotation state live in memory that processes share: every
 * worker of one machine records and tests the same generations.
 *
 * Rules this file keeps (proxy/core/window.py says what they give a caller):
 *
 * - Layout: a SharedHead padded to HEAD_BYTES, then g + 1 slots of slot_bytes each (a
 *   generation's bits rounded up to 64 bytes): the g generations, newest in slot epoch %
 *   (g + 1) and the i-th newest in (epoch - i) % (g + 1), and a spare, (epoch + 1) % (g + 1),
 *   cleared, which the next rotation makes the newest.
 * - No locks: a bit is set with an atomic OR, a count with an atomic add, and a rotation is
 *   one compare-and-swap of epoch, so a process killed at any instant blocks nobody.
 * - A rotation publishes the spare as the newest generation (the compare-and-swap: of two
 *   processes rotating from one epoch, one wins and the other does nothing), and only then
 *   clears the generation it retired, the new spare, which no process reads or writes any
 *   longer, and marks it ready. One process clears at a time (its pid in `clearer`); a spare
 *   not ready is never published: the next process to rotate clears it first when its
 *   clearer died, and otherwise rotates later. So a slot in use is never cleared, and no key
 *   recorded inside the window is lost to a rotation.
 * - Timed rotations fall on a grid: period k starts at origin + k * span, origin being the
 *   first time any process asked (unset: NaN). The process that moves `period` on (a
 *   compare-and-swap) makes the rotations due, at most g. A forced rotation (the newest
 *   generation reached its share) does not move the grid.
 * - A process that read epoch before a rotation may test the generation being retired (its
 *   keys are past the window) or record into the one that became second newest; it records
 *   into the newest too when it sees epoch moved by the time it is done. A key recorded as a
 *   timed rotation falls due (its period claimed, epoch not yet moved) may still be
 *   forgotten up to one span early: a URL then needs one sighting more. */
#include "native.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#define SHARED_MAGIC 0x31574853544948ULL /* "HITSHW1" */
#define HEAD_BYTES 4096

static inline uint64_t bits_of(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static inline double double_of(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static int64_t slot_bytes_for(int64_t size_bits) { return ((size_bits + 511) / 512) * 64; }

int64_t shared_window_bytes(int64_t size_bits, int g) {
    return HEAD_BYTES + (int64_t)(g + 1) * slot_bytes_for(size_bits);
}

static inline uint8_t *slot_bits(const SharedWindow *s, int64_t slot) {
    return s->slots + slot * s->slot_bytes;
}

static inline int64_t gen_slot(const SharedHead *h, uint64_t epoch, int i) {
    const uint64_t slots = (uint64_t)h->g + 1;
    return (int64_t)((epoch + slots * 64 - (uint64_t)i) % slots);
}

int shared_attach(WindowObject *w, PyObject *buffer, long long share) {
    BloomObject *model = w->gens[0];
    SharedWindow *s = PyMem_Calloc(1, sizeof *s);
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &s->view, PyBUF_WRITABLE) < 0) {
        PyMem_Free(s);
        return -1;
    }
    int64_t need = shared_window_bytes(model->size_bits, w->g);
    if (s->view.len < need || ((uintptr_t)s->view.buf & 63) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "the shared window needs %lld bytes, 64-byte aligned; got %zd",
                     (long long)need, s->view.len);
        PyBuffer_Release(&s->view);
        PyMem_Free(s);
        return -1;
    }
    s->head = (SharedHead *)s->view.buf;
    s->slots = (uint8_t *)s->view.buf + HEAD_BYTES;
    s->slot_bytes = slot_bytes_for(model->size_bits);
    SharedHead *h = s->head;
    uint64_t expected = 0;
    /* The first process to attach lays the head out; memory that is not zero nor this layout
     * (another build's, or another setting's) is refused. */
    if (__atomic_compare_exchange_n(&h->magic, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        h->g = w->g;
        h->size_bits = model->size_bits;
        h->num_hashes = model->num_hashes;
        h->share = share;
        h->limit = share;
        long long first;
        if (w->sizer != NULL) {  /* the first generation's share, as a window of its own has */
            if (window_sizer_share(w, &first) < 0) {
                __atomic_store_n(&h->magic, 0, __ATOMIC_RELEASE);
                PyBuffer_Release(&s->view);
                PyMem_Free(s);
                return -1;
            }
            h->limit = first < share ? first : share;
        }
        h->window = w->window;
        h->origin = bits_of(NAN);
        __atomic_store_n(&h->magic, SHARED_MAGIC, __ATOMIC_RELEASE);
    } else {
        for (long spins = 0; expected == 1 && spins < 100000000; spins++)
            expected = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
    }
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHARED_MAGIC || h->g != w->g ||
        h->size_bits != model->size_bits || h->num_hashes != model->num_hashes ||
        h->share != share || h->window != w->window) {
        PyErr_SetString(PyExc_ValueError,
                         "the shared window was laid out with other settings (generations, "
                         "capacity, fp_rate or window): every process must use the same");
        PyBuffer_Release(&s->view);
        PyMem_Free(s);
        return -1;
    }
    w->shared = s;
    return 0;
}

void shared_detach(WindowObject *w) {
    if (w->shared == NULL) return;
    PyBuffer_Release(&w->shared->view);
    PyMem_Free(w->shared);
    w->shared = NULL;
}

static int alive(int64_t pid) { return kill((pid_t)pid, 0) == 0 || errno != ESRCH; }

/* Make the spare slot of `epoch` ready (cleared, marked in `ready`) if this process may: the
 * clearing is held by one process at a time (`clearer`, its pid), taken when free or when its
 * holder died. Whether the spare is ready. */
static int clear_spare(SharedWindow *s, uint64_t epoch) {
    SharedHead *h = s->head;
    const int64_t me = (int64_t)getpid();
    int64_t holder = 0;
    while (!__atomic_compare_exchange_n(&h->clearer, &holder, me, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
        if (alive(holder)) return __atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) >= epoch;
    }
    if (__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) < epoch) {
        int64_t slot = gen_slot(h, epoch + 1, 0);
        uint64_t *words = (uint64_t *)slot_bits(s, slot);
        for (int64_t i = 0; i < s->slot_bytes / 8; i++)
            __atomic_store_n(&words[i], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&h->counts[slot], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&h->ready, epoch, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&h->clearer, 0, __ATOMIC_RELEASE);
    return 1;
}

/* Rotate once from `epoch` if no other process did first: 1 if this one did (and then, with
 * a sizer, the newest generation's share is the sizer's answer, within the bits laid out),
 * 0 if not, -1 on the sizer's error. */
static int rotate_from(WindowObject *w, uint64_t epoch, int forced) {
    SharedWindow *s = w->shared;
    SharedHead *h = s->head;
    /* The spare is published only once ready; one whose clearer died is cleared here. */
    if (__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) < epoch && !clear_spare(s, epoch)) return 0;
    if (!__atomic_compare_exchange_n(&h->epoch, &epoch, epoch + 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return 0;
    clear_spare(s, epoch + 1); /* the generation just retired: the next spare */
    __atomic_fetch_add(&h->rotations, 1, __ATOMIC_RELAXED);
    if (forced) __atomic_fetch_add(&h->forced, 1, __ATOMIC_RELAXED);
    long long asked;
    if (w->sizer != NULL) {
        if (window_sizer_share(w, &asked) < 0) return -1;
        __atomic_store_n(&h->limit, asked > h->share ? h->share : asked, __ATOMIC_RELAXED);
    }
    return 1;
}

static int rotate(WindowObject *w) {
    uint64_t *epoch = &w->shared->head->epoch;
    int done;
    while (!(done = rotate_from(w, __atomic_load_n(epoch, __ATOMIC_ACQUIRE), 0))) {
    }
    return done < 0 ? -1 : 0;
}

static int shared_advance(WindowObject *w, double now) {
    SharedHead *h = w->shared->head;
    if (!isfinite(now)) return 0; /* never the grid's origin, never a rotation */
    uint64_t origin = __atomic_load_n(&h->origin, __ATOMIC_ACQUIRE);
    if (isnan(double_of(origin))) {
        uint64_t mine = bits_of(now);
        if (__atomic_compare_exchange_n(&h->origin, &origin, mine, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return 0;
    }
    double start = double_of(origin);
    if (!(now - start >= w->span)) return 0; /* a clock behind the grid never rotates */
    double periods = floor((now - start) / w->span);
    int64_t current = periods < 4e18 ? (int64_t)periods : (int64_t)4e18;
    int64_t period = __atomic_load_n(&h->period, __ATOMIC_ACQUIRE);
    while (current > period) {
        if (__atomic_compare_exchange_n(&h->period, &period, current, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            int64_t due = current - period < w->g ? current - period : w->g;
            for (int64_t i = 0; i < due; i++) {
                if (rotate(w) < 0) return -1;
            }
            return 0;
        }
    }
    return 0;
}

static inline int probe_add(uint8_t *bits, const SharedHead *h, uint64_t h1, uint64_t h2) {
    const uint64_t m = (uint64_t)h->size_bits;
    uint64_t pos = h1 % m, step = h2 % m;
    int present = 1;
    for (int i = 0; i < h->num_hashes; i++) {
        uint8_t mask = (uint8_t)(1u << (pos & 7));
        if (!(__atomic_fetch_or(&bits[pos >> 3], mask, __ATOMIC_RELAXED) & mask)) present = 0;
        pos += step;
        if (pos >= m) pos -= m;
    }
    return present;
}

static inline int probe_contains(const uint8_t *bits, const SharedHead *h, uint64_t h1,
                                 uint64_t h2) {
    const uint64_t m = (uint64_t)h->size_bits;
    uint64_t pos = h1 % m, step = h2 % m;
    for (int i = 0; i < h->num_hashes; i++) {
        if (!(__atomic_load_n(&bits[pos >> 3], __ATOMIC_RELAXED) & (1u << (pos & 7)))) return 0;
        pos += step;
        if (pos >= m) pos -= m;
    }
    return 1;
}

int shared_seen_before(WindowObject *w, uint64_t h1, uint64_t h2, double now) {
    SharedWindow *s = w->shared;
    SharedHead *h = s->head;
    if (shared_advance(w, now) < 0) return -1;
    uint64_t epoch = __atomic_load_n(&h->epoch, __ATOMIC_ACQUIRE);
    int64_t newest = gen_slot(h, epoch, 0);
    if (probe_add(slot_bits(s, newest), h, h1, h2)) return 1;
    int seen = 0;
    for (int i = 1; i < w->g && !seen; i++)
        seen = probe_contains(slot_bits(s, gen_slot(h, epoch, i)), h, h1, h2);
    if (__atomic_add_fetch(&h->counts[newest], 1, __ATOMIC_RELAXED) >=
            __atomic_load_n(&h->limit, __ATOMIC_RELAXED) &&
        rotate_from(w, epoch, 1) < 0)
        return -1;
    /* Rotated meanwhile (by this call or another process): the key goes into the newest
     * generation too, or it would be forgotten a span early. */
    uint64_t now_epoch = __atomic_load_n(&h->epoch, __ATOMIC_ACQUIRE);
    if (now_epoch != epoch) probe_add(slot_bits(s, gen_slot(h, now_epoch, 0)), h, h1, h2);
    return seen;
}

int shared_contains(WindowObject *w, uint64_t h1, uint64_t h2, double now) {
    SharedWindow *s = w->shared;
    if (shared_advance(w, now) < 0) return -1;
    uint64_t epoch = __atomic_load_n(&s->head->epoch, __ATOMIC_ACQUIRE);
    for (int i = 0; i < w->g; i++) {
        if (probe_contains(slot_bits(s, gen_slot(s->head, epoch, i)), s->head, h1, h2)) return 1;
    }
    return 0;
}

void shared_clear(WindowObject *w, double now) {
    SharedWindow *s = w->shared;
    SharedHead *h = s->head;
    for (int64_t slot = 0; slot <= w->g; slot++) {
        uint64_t *words = (uint64_t *)slot_bits(s, slot);
        for (int64_t i = 0; i < s->slot_bytes / 8; i++)
            __atomic_store_n(&words[i], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&h->counts[slot], 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&h->period, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&h->origin, bits_of(now), __ATOMIC_RELEASE); /* NaN: set at the next call */
}

BloomObject *shared_generation(WindowObject *w, int i) {
    SharedWindow *s = w->shared;
    BloomObject *copy = bloom_new(w->gens[0]->capacity, w->gen_fp);
    if (copy == NULL) return NULL;
    uint64_t epoch = __atomic_load_n(&s->head->epoch, __ATOMIC_ACQUIRE);
    int64_t slot = gen_slot(s->head, epoch, i);
    memcpy(copy->bits, slot_bits(s, slot), (size_t)copy->nbytes);
    copy->count = __atomic_load_n(&s->head->counts[slot], __ATOMIC_RELAXED);
    return copy;
}
