/* auto: a disk tier's admission that follows whichever of its candidates earns its writes.
 *
 * Each candidate (a policy of the disk family) decides for the tier side by side, asked about
 * every response offered (as adaptive's candidates are), and each has a ghost tier: a ring of
 * regions `rate` times the tier's size, its index only, admitting by a copy of the candidate.
 * The ghosts are fed the disk lookups (a memory miss answered from disk, or a response offered
 * to it) of the keys whose hash falls under `rate` of the hash space (SHARDS): a lookup a
 * ghost holds is its hit, one it does not is offered to it, and what it writes is counted.
 *
 * Size classes: the last candidates may be size-below rules whose limits are percentiles of
 * the sizes of every lookup so far (`classes`), set again at the end of each period from a
 * histogram of 16 classes an octave: a class's limit is the lower bound of the histogram's
 * class that holds its percentile, so size-below at the 50th percentile admits what is
 * smaller than the median's class, rounded up to a power of 4 (limits that move only when the
 * sizes do, so that a ghost's records were admitted by one limit). Through the first period
 * the limits are set again at each sampled lookup, from the first on. A trace
 * comes in phases (a block trace's first tenth may be all 64 KiB reads): sizes counted since
 * the start, not in the last period, keep the limits from following one phase.
 *
 * Every `period` sampled lookups the candidates are compared on their recent hits and bytes
 * written (both halved after each comparison): of those whose hits are within `margin` of the
 * lookups of the best, the one that wrote least decides from then on. A candidate is left out
 * while one within these is left: one whose ghost wrote more than `share` of the bytes the
 * most writing ghost wrote (admit-all's, when always is a candidate; 0: no such bound) while
 * that ghost writes more than its ring holds (it evicts: what admitting all writes then
 * pushes out what the others keep, on a block trace for a while after it leads the ghosts),
 * and, with a write budget (bytes a second), one that wrote faster than it in the period. */
#include "native.h"

/* The size histogram's classes: sizes under 16 one each, then 16 an octave to 2^40. */
#define SIZE_BINS ((40 - 3) * 16)

/* The size classes' percentiles, checked: 0, or -1 with an exception set. */
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
    a->percentiles = PyMem_Calloc((size_t)c, sizeof(int));
    a->sizes = PyMem_Calloc(SIZE_BINS, sizeof(double));
    if (a->percentiles == NULL || a->sizes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < c; k++) {
        long p = PyLong_AsLong(PyTuple_GET_ITEM(classes, k));
        if (p == -1 && PyErr_Occurred()) return -1;
        Py_ssize_t j = n - c + k;
        AdmissionObject *rule = (AdmissionObject *)PyTuple_GET_ITEM(a->candidates, j);
        AdmissionObject *ghost = (AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, j);
        if (p < 1 || p > 99 || rule->kind != A_SIZE_BELOW || ghost->kind != A_SIZE_BELOW) {
            PyErr_SetString(PyExc_ValueError, "a size class is a percentile of 1 to 99 of a "
                                              "size-below candidate and its ghost's policy");
            return -1;
        }
        a->percentiles[k] = (int)p;
        rule->limit = ghost->limit = 0;
    }
    a->classes = c;
    return 0;
}

int auto_init(AdmissionObject *a, PyObject *ghost_indexes, long long region_size,
              long long regions, long long record_overhead, double share, PyObject *classes) {
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
    if (a->ghost_budget == NULL || a->ghosts == NULL || a->ghost_counts == NULL ||
        a->written == NULL) {
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
        g->spans = (long long)ceil(1.0 / a->rate);
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
    PyMem_Free(a->sizes);
    PyMem_Free(a->percentiles);
    a->sizes = NULL;
    a->percentiles = NULL;
    a->ghosts = NULL;
    a->ghost_counts = NULL;
    a->written = NULL;
    Py_CLEAR(a->ghost_budget);
}

/* Whether candidate j may decide: within the share of the most written and within the
 * budget, each bound applying while some candidate is within it. */
static int auto_eligible(const AdmissionObject *a, Py_ssize_t j, double most, int within_share,
                         double seconds, int within_budget) {
    const double *period = a->written + PyTuple_GET_SIZE(a->candidates);
    if (within_share && a->written[j] > a->share * most) return 0;
    return !(within_budget && period[j] / a->rate / seconds > a->budget);
}

/* The candidate that decides after a period: the least writer of the eligible candidates
 * whose hits are within the margin of the best eligible one's. */
static int auto_choose(const AdmissionObject *a, Py_ssize_t n, double seconds) {
    const double *period = a->written + n;  /* this period's bytes, of the sample */
    double most = 0.0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (a->written[j] > most) most = a->written[j];
    }
    /* Writes bound only where they evict: a ghost's recent writes (halved each period) past
     * its ring's bytes. A disk that holds what admitting all writes loses nothing by it. */
    const Disk *g = &a->ghosts[0];
    int evicting = most > (double)(g->region_size * g->regions);
    int within_share = 0, within_budget = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (a->share > 0 && evicting && a->written[j] <= a->share * most) within_share = 1;
        if (a->budget > 0 && seconds > 0 && period[j] / a->rate / seconds <= a->budget)
            within_budget = 1;
    }
    double best = -1.0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!auto_eligible(a, j, most, within_share, seconds, within_budget)) continue;
        if (a->scores[j] > best) best = a->scores[j];
    }
    int choice = -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!auto_eligible(a, j, most, within_share, seconds, within_budget)) continue;
        if (a->scores[j] < best - a->margin * a->seen) continue;
        if (choice < 0 || a->written[j] < a->written[choice]) choice = (int)j;
    }
    return choice < 0 ? a->choice : choice;
}

/* Where a size is counted: sizes under 16 in a class each, then 16 classes an octave. */
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
    for (int b = 0; b < SIZE_BINS; b++) total += a->sizes[b];
    for (Py_ssize_t k = 0; k < a->classes; k++) {
        double below = 0.0, rank = total * a->percentiles[k] / 100.0;
        int b = 0;
        while (b < SIZE_BINS - 1 && below + a->sizes[b] < rank) below += a->sizes[b++];
        long long limit = 1;
        while (limit < bin_floor(b)) limit *= 4;
        Py_ssize_t j = n - a->classes + k;
        ((AdmissionObject *)PyTuple_GET_ITEM(a->candidates, j))->limit = limit;
        ((AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, j))->limit = limit;
    }
}

int auto_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now) {
    if (a->sizes != NULL) a->sizes[size_bin(size)] += 1.0;
    if (sample_point(h1, a->sample_key) >= a->sample_below) return 0;
    if (a->sizes != NULL && a->sampled < a->period) auto_size(a);
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
        if (a->sizes != NULL) auto_size(a);
        int choice = auto_choose(a, n, now - a->period_start);
        if (choice != a->choice) {
            a->choice = choice;
            a->switches++;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            a->scores[j] /= 2.0;
            a->written[j] /= 2.0;
            a->written[n + j] = 0.0;
        }
        a->seen /= 2.0;
        a->period_start = now;
    }
    return 0;
}
