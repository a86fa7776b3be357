/* auto: a disk tier's admission that follows whichever of its candidates earns its writes.
 *
 * Each candidate (a policy of the disk family) decides for the tier side by side, asked about
 * every response offered (as adaptive's candidates are), and each has a ghost tier: a ring of
 * regions `rate` times the tier's size, its index only, admitting by a copy of the candidate.
 * The ghosts are fed the disk lookups (a memory miss answered from disk, or a response offered
 * to it) of the keys whose hash falls under `rate` of the hash space (SHARDS): a lookup a
 * ghost holds is its hit, one it does not is offered to it, and what it writes is counted.
 *
 * Size classes: the last candidates may be size-below rules whose limits follow percentiles
 * of the sizes looked up (`classes`). Every lookup of a known size (above 0) is counted in a
 * histogram of 16 bins an octave, since the start: a trace comes in phases (a block trace's
 * first sixth may be all 64 KiB reads), and the sizes of one period would follow each. A
 * class's limit is the largest power of 2 at or below the lower bound of the bin holding its
 * percentile, so it never admits that bin (size-below at the median admits what is smaller
 * than the power of 2 at or under the median's bin, up to half of it), and moves only when
 * the percentile crosses a power of 2: a ghost's
 * records were admitted by one limit for long. The limits are set at each sampled lookup
 * through the first period, from the first on, then at the end of each period; a class
 * admits nothing before.
 *
 * Every `period` sampled lookups the candidates are compared on their recent hits and bytes
 * written (both halved after each comparison): of those whose hits are within `margin` of the
 * lookups of the best, the one that wrote least decides from then on. Two bounds each leave
 * out the candidates past them while some candidate is within them:
 * - `share` (0: none): while the ghost that wrote most (admit-all's, always being a
 *   candidate) evicted in the period, a candidate whose recent writes exceed `share` of its
 *   own. On a block trace admit-all's ghost leads the others for a while, and following it
 *   would push out what the size classes keep; on a disk that holds all it writes, writing
 *   costs no hit, and the bound stays off.
 * - a write budget (bytes a second; 0: none): a candidate that wrote faster in the period.
 * Where no candidate is within both bounds at once, the choice stays.
 *
 * A ghost's region is `rate` of its tier's, each of which holds many records: a ghost's record
 * is written on from where the last one ended, across its regions (up to `longest`, its
 * tier's region), so that ghosts see the bodies their tier keeps, packed about as densely. */
#include "native.h"

/* The size histogram's classes: sizes under 16 one each, then 16 an octave to 2^40. */
#define SIZE_BINS ((40 - 3) * 16)

/* The size classes' percentiles, checked before anything is changed; then their rules and
 * ghosts' copies admit nothing until a limit is set. 0, or -1 with an exception set. */
static int auto_classes(AdmissionObject *a, PyObject *classes) {
    Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
    if (classes == Py_None) return 0;
    if (!PyTuple_Check(classes) || PyTuple_GET_SIZE(classes) > n) {
        PyErr_SetString(PyExc_TypeError, "auto's classes are a tuple of percentiles, one per "
                                         "size-below candidate at the end of its candidates");
        return -1;
    }
    Py_ssize_t c = PyTuple_GET_SIZE(classes);
    if (c == 0) return 0;
    int *percentiles = PyMem_Calloc((size_t)c, sizeof(int));
    if (percentiles == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < c; k++) {
        long p = PyLong_AsLong(PyTuple_GET_ITEM(classes, k));
        AdmissionObject *rule = (AdmissionObject *)PyTuple_GET_ITEM(a->candidates, n - c + k);
        AdmissionObject *ghost =
            (AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, n - c + k);
        if ((p == -1 && PyErr_Occurred()) || p < 1 || p > 99 || rule->kind != A_SIZE_BELOW ||
            ghost->kind != A_SIZE_BELOW) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a size class is a percentile of 1 to 99 of "
                                                  "a size-below candidate and its ghost's rule");
            PyMem_Free(percentiles);
            return -1;
        }
        percentiles[k] = (int)p;
    }
    a->size_bins = PyMem_Calloc(SIZE_BINS, sizeof(double));
    if (a->size_bins == NULL) {
        PyMem_Free(percentiles);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < c; k++) {
        ((AdmissionObject *)PyTuple_GET_ITEM(a->candidates, n - c + k))->limit = 0;
        ((AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, n - c + k))->limit = 0;
    }
    a->percentiles = percentiles;
    a->classes = c;
    return 0;
}

int auto_init(AdmissionObject *a, PyObject *ghost_indexes, long long region_size,
              long long regions, long long record_overhead, double share, PyObject *classes,
              long long longest) {
    Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
    if (!PyTuple_Check(ghost_indexes) || PyTuple_GET_SIZE(ghost_indexes) != n) {
        PyErr_SetString(PyExc_TypeError, "auto needs one ghost DiskIndex per candidate");
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(ghost_indexes, j), &DiskIndexType)) {
            PyErr_SetString(PyExc_TypeError, "auto's ghosts are DiskIndex objects");
            return -1;
        }
    }
    if (!(share >= 0.0 && share <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "auto's share of the most written is 0 to 1");
        return -1;
    }
    a->share = share;
    if (auto_classes(a, classes) < 0) return -1;
    if (region_size < 1 || region_size > UINT32_MAX || regions < 2) {
        PyErr_SetString(PyExc_ValueError, "auto's ghosts need 2 regions or more, of 1 byte to "
                                          "4 GiB");
        return -1;
    }
    a->ghost_budget = PyObject_CallFunction((PyObject *)&WriteBudgetType, "d", 0.0);
    a->ghosts = PyMem_Calloc((size_t)n, sizeof(Disk));
    a->ghost_counts = PyMem_Calloc((size_t)n * T_COUNT, sizeof(long long));
    a->written = PyMem_Calloc((size_t)n * 2, sizeof(double));
    a->evicted = PyMem_Calloc((size_t)n, sizeof(long long));
    if (a->ghost_budget == NULL || a->ghosts == NULL || a->ghost_counts == NULL ||
        a->written == NULL || a->evicted == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        Disk *g = &a->ghosts[j];
        g->index = (DiskIndexObject *)PyTuple_GET_ITEM(ghost_indexes, j);
        g->admission = (AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, j);
        g->budget = (WriteBudgetObject *)a->ghost_budget;
        g->region_size = region_size;
        g->regions = regions;
        g->fill = region_size;  /* no region open yet */
        g->longest = longest;
        g->record_overhead = record_overhead;
        g->c = &a->ghost_counts[j * T_COUNT];
    }
    a->period_start = NAN;
    return 0;
}

void auto_free(AdmissionObject *a) {
    if (a->ghosts != NULL) {
        for (Py_ssize_t j = 0; a->candidates != NULL && j < PyTuple_GET_SIZE(a->candidates); j++)
            disk_done(&a->ghosts[j]);
    }
    PyMem_Free(a->ghosts);
    PyMem_Free(a->ghost_counts);
    PyMem_Free(a->written);
    PyMem_Free(a->evicted);
    PyMem_Free(a->size_bins);
    PyMem_Free(a->percentiles);
    a->evicted = NULL;
    a->size_bins = NULL;
    a->percentiles = NULL;
    a->ghosts = NULL;
    a->ghost_counts = NULL;
    a->written = NULL;
    Py_CLEAR(a->ghost_budget);
}

/* Whether candidate j's recent writes are within the share of the most written. */
static int within_share(const AdmissionObject *a, Py_ssize_t j, double most) {
    return a->written[j] <= a->share * most;
}

/* Whether candidate j wrote within the budget in the period just ended (`seconds` long). */
static int within_budget(const AdmissionObject *a, Py_ssize_t j, Py_ssize_t n, double seconds) {
    return a->written[n + j] / a->rate / seconds <= a->budget;
}

/* The candidate that decides after a period: the least writer of those within the bounds
 * that bind (each while some candidate is within it) whose hits are within the margin of the
 * best of them. */
static int auto_choose(const AdmissionObject *a, Py_ssize_t n, double seconds) {
    Py_ssize_t most = 0;
    for (Py_ssize_t j = 1; j < n; j++) {
        if (a->written[j] > a->written[most]) most = j;
    }
    int share = a->share > 0 && a->ghosts[most].c[R_EVICTIONS] > a->evicted[most];
    int budget = a->budget > 0 && seconds > 0;
    int any_share = 0, any_budget = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        any_share |= share && within_share(a, j, a->written[most]);
        any_budget |= budget && within_budget(a, j, n, seconds);
    }
    int choice = -1;
    double best = -1.0;
    for (int pass = 0; pass < 2; pass++) {  /* the best hits, then the least writer near them */
        for (Py_ssize_t j = 0; j < n; j++) {
            if ((any_share && !within_share(a, j, a->written[most])) ||
                (any_budget && !within_budget(a, j, n, seconds)))
                continue;
            if (pass == 0 && a->scores[j] > best) best = a->scores[j];
            if (pass == 1 && a->scores[j] >= best - a->margin * a->seen &&
                (choice < 0 || a->written[j] < a->written[choice]))
                choice = (int)j;
        }
    }
    return choice < 0 ? a->choice : choice;
}

/* Where a size is counted: sizes under 16 in a bin each, then 16 bins an octave. */
static int size_bin(long long size) {
    if (size < 16) return size < 0 ? 0 : (int)size;
    int octave = 63 - __builtin_clzll((unsigned long long)size);
    if (octave >= 40) return SIZE_BINS - 1;
    return (octave - 3) * 16 + (int)((size >> (octave - 4)) & 15);
}

static long long bin_floor(int bin) {
    if (bin < 16) return bin;
    return (long long)(16 + bin % 16) << (bin / 16 - 1);
}

/* The size classes' limits, for each rule and its ghost's copy, from the sizes seen. */
static void auto_size(AdmissionObject *a) {
    Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
    double total = 0.0;
    for (int b = 0; b < SIZE_BINS; b++) total += a->size_bins[b];
    if (total == 0) return;
    for (Py_ssize_t k = 0; k < a->classes; k++) {
        double below = 0.0, rank = total * a->percentiles[k] / 100.0;
        int b = 0;
        while (b < SIZE_BINS - 1 && below + a->size_bins[b] < rank) below += a->size_bins[b++];
        long long limit = 1;
        while (limit * 2 <= bin_floor(b)) limit *= 2;
        ((AdmissionObject *)PyTuple_GET_ITEM(a->candidates, n - a->classes + k))->limit = limit;
        ((AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, n - a->classes + k))->limit =
            limit;
    }
}

int auto_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now) {
    if (a->ghosts == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "an auto admission whose init failed");
        return -1;
    }
    if (size < 0 || size > LLONG_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "a body's size is 0 to 2^62 bytes");
        return -1;
    }
    if (a->size_bins != NULL && size > 0) a->size_bins[size_bin(size)] += 1.0;
    if (sample_point(h1, a->sample_key) >= a->sample_below) return 0;
    if (a->size_bins != NULL && a->sampled < a->period) auto_size(a);
    Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
    if (isnan(a->period_start)) a->period_start = now;
    for (Py_ssize_t j = 0; j < n; j++) {
        Disk *g = &a->ghosts[j];
        double written;
        if (disk_answers(g, h1, now, INFINITY, &written)) {
            a->scores[j] += 1.0;
            continue;
        }
        long long before = g->c[D_BYTES_WRITTEN];
        long long length = g->record_overhead + size;
        if (disk_offer(g, h1, h2, size, length, now, INFINITY) < 0) return -1;
        a->written[j] += (double)(g->c[D_BYTES_WRITTEN] - before);
        a->written[n + j] += (double)(g->c[D_BYTES_WRITTEN] - before);
    }
    a->seen += 1.0;
    if (++a->sampled % a->period == 0) {
        if (a->size_bins != NULL) auto_size(a);
        int choice = auto_choose(a, n, now - a->period_start);
        if (choice != a->choice) {
            a->choice = choice;
            a->switches++;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            a->evicted[j] = a->ghosts[j].c[R_EVICTIONS];
            a->scores[j] /= 2.0;
            a->written[j] /= 2.0;
            a->written[n + j] = 0.0;
        }
        a->seen /= 2.0;
        a->period_start = now;
    }
    return 0;
}
