/* auto: a disk tier's admission that follows whichever of its candidates earns its writes.
 *
 * Each candidate (a policy of the disk family) decides for the tier side by side, asked about
 * every response offered (as adaptive's candidates are), and each has a ghost tier: a ring of
 * regions `rate` times the tier's size, its index only, admitting by a copy of the candidate.
 * The ghosts are fed the disk lookups (a memory miss answered from disk, or a response offered
 * to it) of the keys whose hash falls under `rate` of the hash space (SHARDS): a lookup a
 * ghost holds is its hit, one it does not is offered to it, and what it writes is counted.
 *
 * Every `period` sampled lookups the candidates are compared on their recent hits and bytes
 * written (both halved after each comparison): of those whose hits are within `margin` of the
 * lookups of the best, the one that wrote least decides from then on. With a write budget
 * (bytes a second), a candidate that wrote faster than it in the period is left out while one
 * within it is left. */
#include "native.h"

int auto_init(AdmissionObject *a, PyObject *ghost_indexes, long long region_size,
              long long regions, long long record_overhead) {
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
    a->ghosts = NULL;
    a->ghost_counts = NULL;
    a->written = NULL;
    Py_CLEAR(a->ghost_budget);
}

/* The candidate that decides after a period: the least writer of those within the margin of
 * the best hits (and within the budget, while any is). */
static int auto_choose(const AdmissionObject *a, Py_ssize_t n, double seconds) {
    const double *period = a->written + n;  /* this period's bytes, of the sample */
    int within_budget = 0;
    for (Py_ssize_t j = 0; a->budget > 0 && seconds > 0 && j < n; j++) {
        if (period[j] / a->rate / seconds <= a->budget) within_budget = 1;
    }
    double best = -1.0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (within_budget && period[j] / a->rate / seconds > a->budget) continue;
        if (a->scores[j] > best) best = a->scores[j];
    }
    int choice = -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (within_budget && period[j] / a->rate / seconds > a->budget) continue;
        if (a->scores[j] < best - a->margin * a->seen) continue;
        if (choice < 0 || a->written[j] < a->written[choice]) choice = (int)j;
    }
    return choice < 0 ? a->choice : choice;
}

int auto_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now) {
    if (sample_point(h1, a->sample_key) >= a->sample_below) return 0;
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
