/* Admission policies: which cacheable responses of missed keys are stored; the Admission type. */
#include "native.h"

/* Admission: which cacheable responses of missed keys are stored. One object per policy,
 * driven by the proxy (through proxy/core/admission.py) and by the simulator's loop alike.
 *
 * - always: everything.
 * - second-hit: keys already seen in a Window.
 * - nth-hit:N: keys sighted N times, counted in a count-min sketch (4 rows of 8-bit counters
 *   saturating at 255) whose counts halve once it has counted as many sightings as it has
 *   columns: an aging window of about one sketch-width of sightings.
 * - tinylfu (Einziger et al., TOS 2017): every request is counted, first in a doorkeeper
 *   Bloom filter and from the second on in the sketch (counters saturate at 15, as 4-bit
 *   ones would); after ten sketch-widths of counts the sketch halves and the doorkeeper
 *   clears. A candidate is admitted while the store has room, else only when its estimated
 *   frequency beats that of the entry the store would evict next.
 * - probabilistic:p: each miss admitted with probability p (xorshift64*, fixed seed, so a
 *   run is repeatable and the live proxy and the simulator decide alike).
 * - size-below:BYTES: responses smaller than BYTES.
 * - adaptive: several candidate policies decide side by side, each fed every request; the
 *   one whose shadow cache scores the most hits decides. The shadows are caches of `rate`
 *   times the store's bytes, each with its candidate's policy, fed the requests of the keys
 *   whose hash falls under `rate` of the hash space (spatial sampling, as SHARDS does). Every
 *   `period` sampled requests the scores are compared, then halved; the choice moves only to
 *   a candidate ahead by more than `margin` of a period's requests.
 * - auto: a disk tier's, whose candidates have ghost tiers rather than shadow caches: see
 *   auto.c.
 * The sketch is sized to a power of two at least the keys it is given, and re-sized at a
 * halving when a sizer (the store's object count) asks for twice or half as many. */

static const char *admission_kinds[] = {
    "always", "second-hit", "nth-hit", "tinylfu", "probabilistic", "size-below", "adaptive",
    "auto",
};

/* At a halving, the sketch follows the sizer's key count when it doubled or halved. */
int admission_age(AdmissionObject *a) {
    Sketch *s = &a->sketch;
    a->halvings++;
    if (a->sizer != NULL) {
        PyObject *r = PyObject_CallNoArgs(a->sizer);
        if (r == NULL) return -1;
        long long keys = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (keys == -1 && PyErr_Occurred()) return -1;
        if (keys > (long long)s->width * 2 || keys * 2 < (long long)s->width) {
            long long periods = s->period / (long long)s->width;
            if (sketch_init(s, keys, s->ceiling, periods) < 0) return -1;
            if (a->doorkeeper != NULL && bloom_setup(a->doorkeeper, (long long)s->width, 0.01) < 0)
                return -1;
            return 0;
        }
    }
    sketch_halve(s);
    if (a->doorkeeper != NULL) bloom_clear(a->doorkeeper);
    return 0;
}

static inline int tinylfu_estimate(const AdmissionObject *a, uint64_t h1) {
    uint64_t h2 = second_hash(h1);
    return sketch_estimate(&a->sketch, h1, h2) + bloom_contains(a->doorkeeper, h1, h2);
}

int admission_admit(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now) {
    int admit = 1;
    switch (a->kind) {
    case A_ALWAYS:
        break;
    case A_SECOND_HIT:
        admit = window_seen_before(a->window, h1, h2, now);
        break;
    case A_NTH_HIT:
        admit = sketch_add(&a->sketch, h1, h2) >= a->threshold;
        if (a->sketch.added >= a->sketch.period && admission_age(a) < 0) return -1;
        break;
    case A_TINYLFU: {
        IndexObject *x = a->index;
        if (x->used + size <= x->capacity) break;
        int32_t victim = x->ev->victim(x);
        if (victim < 0) break;
        admit = tinylfu_estimate(a, h1) > tinylfu_estimate(a, x->nodes[victim].key);
        break;
    }
    case A_PROBABILISTIC: {
        admit = next_uniform(&a->rng) < a->probability;
        break;
    }
    case A_ADAPTIVE:
    case A_AUTO: {
        Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
        for (Py_ssize_t j = 0; j < n; j++) {
            AdmissionObject *c = (AdmissionObject *)PyTuple_GET_ITEM(a->candidates, j);
            int says = admission_admit(c, h1, h2, size, now);
            if (says < 0) return -1;
            if (j == a->choice) admit = says;
        }
        break;
    }
    default:
        admit = size < a->limit;
    }
    if (admit < 0) return -1;
    if (admit) a->admitted++; else a->rejected++;
    return admit;
}

int adaptive_observe(AdmissionObject *a, uint64_t h1, uint64_t h2, long long size, double now) {
    Py_ssize_t n = PyTuple_GET_SIZE(a->candidates);
    for (Py_ssize_t j = 0; j < n; j++) {
        AdmissionObject *c = (AdmissionObject *)PyTuple_GET_ITEM(a->candidates, j);
        if (admission_observe(c, h1, h2, size, now) < 0) return -1;
    }
    if (sample_point(h1, a->sample_key) >= a->sample_below) return 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        IndexObject *x = (IndexObject *)PyTuple_GET_ITEM(a->shadows, j);
        AdmissionObject *p = (AdmissionObject *)PyTuple_GET_ITEM(a->shadow_policies, j);
        if (admission_observe(p, h1, h2, size, now) < 0) return -1;
        int32_t i = index_find(x, h1);
        if (i >= 0) {
            index_touch(x, i);
            a->scores[j] += 1.0;
            continue;
        }
        long long charge = size + a->overhead;
        if (charge > x->max_charge) continue;
        int admit = admission_admit(p, h1, h2, size, now);
        if (admit < 0) return -1;
        if (admit && index_put(x, h1, size, charge, 0, now, NULL) < 0) return -1;
    }
    if (++a->sampled % a->period == 0) {
        int best = a->choice;
        for (Py_ssize_t j = 0; j < n; j++) {
            if (a->scores[j] > a->scores[best]) best = (int)j;
        }
        if (best != a->choice && a->scores[best] - a->scores[a->choice] > a->margin_hits) {
            a->choice = best;
            a->switches++;
        }
        for (Py_ssize_t j = 0; j < n; j++) a->scores[j] /= 2.0;
    }
    return 0;
}

static int Admission_init(AdmissionObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind", "window", "index", "keys", "threshold", "probability",
                             "limit", "sizer", "candidates", "shadows", "shadow_policies",
                             "rate", "overhead", "period", "margin", "choice", "region_size",
                             "regions", "budget", "share", "classes", "longest", NULL};
    const char *kind;
    PyObject *window = Py_None, *index = Py_None, *sizer = Py_None;
    PyObject *candidates = Py_None, *shadows = Py_None, *shadow_policies = Py_None;
    PyObject *classes = Py_None;
    long long keys = 1024, limit = 0, overhead = 0, period = 4096, region_size = 0, regions = 0;
    long long longest = 0;
    int threshold = 2;
    double probability = 1.0, rate = 1.0 / 16, margin = 0.002, budget = 0.0, share = 0.0;
    int choice = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|$OOLidLOOOOdLLdiLLddOL", kwlist, &kind,
                                     &window, &index, &keys, &threshold, &probability, &limit,
                                     &sizer, &candidates, &shadows, &shadow_policies, &rate,
                                     &overhead, &period, &margin, &choice, &region_size,
                                     &regions, &budget, &share, &classes, &longest))
        return -1;
    if (self->kind != 0 || self->window != NULL || self->sketch.rows != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "an Admission is initialised once");
        return -1;
    }
    self->kind = -1;
    for (int k = 0; k < (int)(sizeof(admission_kinds) / sizeof(*admission_kinds)); k++) {
        if (strcmp(kind, admission_kinds[k]) == 0) self->kind = k;
    }
    if (self->kind < 0) {
        PyErr_Format(PyExc_ValueError, "unknown admission kind %s", kind);
        return -1;
    }
    if (self->kind != A_AUTO && (share != 0.0 || classes != Py_None || longest != 0)) {
        PyErr_SetString(PyExc_TypeError, "share, classes and longest are auto's alone");
        return -1;
    }
    if (self->kind == A_SECOND_HIT) {
        if (!PyObject_TypeCheck(window, &WindowType)) {
            PyErr_SetString(PyExc_TypeError, "second-hit needs a window");
            return -1;
        }
        Py_INCREF(window);
        self->window = (WindowObject *)window;
    }
    if (self->kind == A_TINYLFU) {
        if (!PyObject_TypeCheck(index, &IndexType)) {
            PyErr_SetString(PyExc_TypeError, "tinylfu needs the store's index");
            return -1;
        }
        Py_INCREF(index);
        self->index = (IndexObject *)index;
    }
    if (self->kind == A_NTH_HIT || self->kind == A_TINYLFU) {
        int tiny = self->kind == A_TINYLFU;
        if (sketch_init(&self->sketch, keys, tiny ? 15 : 255, tiny ? 10 : 1) < 0) return -1;
        if (tiny) {
            self->doorkeeper = bloom_new((long long)self->sketch.width, 0.01);
            if (self->doorkeeper == NULL) return -1;
        }
        if (sizer != Py_None) {
            Py_INCREF(sizer);
            self->sizer = sizer;
        }
    }
    if (self->kind == A_NTH_HIT && (threshold < 1 || threshold > 255)) {
        PyErr_Format(PyExc_ValueError, "nth-hit counts 1 to 255 sightings, got %d", threshold);
        return -1;
    }
    if (self->kind == A_ADAPTIVE || self->kind == A_AUTO) {
        int ghosts = self->kind == A_AUTO;  /* shadows: ghost DiskIndex objects, not stores */
        if (!PyTuple_Check(candidates) || !PyTuple_Check(shadows) ||
            !PyTuple_Check(shadow_policies) || PyTuple_GET_SIZE(candidates) < 1 ||
            PyTuple_GET_SIZE(shadows) != PyTuple_GET_SIZE(candidates) ||
            PyTuple_GET_SIZE(shadow_policies) != PyTuple_GET_SIZE(candidates)) {
            PyErr_SetString(PyExc_TypeError, "adaptive needs tuples of candidates, shadows and "
                                             "shadow policies, one of each per candidate");
            return -1;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(candidates); j++) {
            if (!PyObject_TypeCheck(PyTuple_GET_ITEM(candidates, j), &AdmissionType) ||
                !PyObject_TypeCheck(PyTuple_GET_ITEM(shadow_policies, j), &AdmissionType) ||
                !PyObject_TypeCheck(PyTuple_GET_ITEM(shadows, j),
                                    ghosts ? &DiskIndexType : &IndexType)) {
                PyErr_SetString(PyExc_TypeError, "candidates and shadow policies are Admission "
                                                 "objects, shadows StoreIndex objects");
                return -1;
            }
        }
        if (!(rate > 0.0 && rate <= 1.0) || period < 1 || choice < 0 ||
            choice >= PyTuple_GET_SIZE(candidates)) {
            PyErr_SetString(PyExc_ValueError,
                            "adaptive needs 0 < rate <= 1, period >= 1 and a candidate to start");
            return -1;
        }
        self->scores = PyMem_Calloc((size_t)PyTuple_GET_SIZE(candidates), sizeof(double));
        if (self->scores == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        Py_INCREF(candidates);
        Py_INCREF(shadows);
        Py_INCREF(shadow_policies);
        self->candidates = candidates;
        self->shadows = shadows;
        self->shadow_policies = shadow_policies;
        self->sample_below = rate >= 1.0 ? UINT64_MAX : (uint64_t)(rate * 18446744073709551616.0);
        self->overhead = overhead;
        self->period = period;
        self->margin_hits = (long long)(margin * (double)period);
        self->choice = choice;
        if (ghosts) {
            self->rate = rate;
            self->margin = margin;
            self->budget = budget;
            if (auto_init(self, shadows, region_size, regions, overhead, share, classes,
                          longest) < 0)
                return -1;
        }
    }
    self->threshold = threshold;
    self->probability = probability;
    self->rng = 0x9e3779b97f4a7c15ULL;
    self->limit = limit;
    return 0;
}

static int Admission_traverse(AdmissionObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->window);
    Py_VISIT(self->index);
    Py_VISIT(self->sizer);
    Py_VISIT(self->candidates);
    Py_VISIT(self->shadows);
    Py_VISIT(self->shadow_policies);
    Py_VISIT(self->ghost_budget);
    return 0;
}

static int Admission_clear_refs(AdmissionObject *self) {
    Py_CLEAR(self->window);
    Py_CLEAR(self->index);
    Py_CLEAR(self->sizer);
    Py_CLEAR(self->candidates);
    Py_CLEAR(self->shadows);
    Py_CLEAR(self->shadow_policies);
    return 0;
}

static void Admission_dealloc(AdmissionObject *self) {
    PyObject_GC_UnTrack(self);
    auto_free(self);
    Admission_clear_refs(self);
    Py_XDECREF(self->doorkeeper);
    PyMem_Free(self->scores);
    PyMem_Free(self->sketch.rows);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The (key, size, now) arguments of admit and observe: 0, or -1 with an exception set. */
static int request_args(PyObject *const *args, Py_ssize_t n, const char *usage, uint64_t *h1,
                        uint64_t *h2, long long *size, double *now) {
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (hash_key(args[0], h1, h2) < 0) return -1;
    *size = PyLong_AsLongLong(args[1]);
    if (*size == -1 && PyErr_Occurred()) return -1;
    return window_now(args[2], now);
}

static PyObject *Admission_admit(AdmissionObject *self, PyObject *const *args, Py_ssize_t n) {
    uint64_t h1, h2;
    long long size;
    double now;
    if (request_args(args, n, "admit(key, size, now)", &h1, &h2, &size, &now) < 0) return NULL;
    int admit = admission_admit(self, h1, h2, size, now);
    if (admit < 0) return NULL;
    return PyBool_FromLong(admit);
}

static PyObject *Admission_observe(AdmissionObject *self, PyObject *const *args, Py_ssize_t n) {
    uint64_t h1, h2;
    long long size;
    double now;
    if (request_args(args, n, "observe(key, size, now)", &h1, &h2, &size, &now) < 0) return NULL;
    if (admission_observe(self, h1, h2, size, now) < 0) return NULL;
    Py_RETURN_NONE;
}

/* A tuple of n floats; NULL with an exception set. */
static PyObject *float_tuple(const double *values, Py_ssize_t n) {
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = PyFloat_FromDouble(values[j]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, j, v);
    }
    return out;
}

static PyObject *Admission_scores(AdmissionObject *self, PyObject *unused) {
    if (self->kind != A_ADAPTIVE && self->kind != A_AUTO) return PyTuple_New(0);
    return float_tuple(self->scores, PyTuple_GET_SIZE(self->candidates));
}

static PyObject *Admission_written(AdmissionObject *self, PyObject *unused) {
    if (self->kind != A_AUTO) return PyTuple_New(0);
    return float_tuple(self->written, PyTuple_GET_SIZE(self->candidates));
}

static PyObject *Admission_estimate(AdmissionObject *self, PyObject *key) {
    uint64_t h1, h2;
    if (hash_key(key, &h1, &h2) < 0) return NULL;
    if (self->kind == A_TINYLFU) return PyLong_FromLong(tinylfu_estimate(self, h1));
    if (self->kind == A_NTH_HIT) return PyLong_FromLong(sketch_estimate(&self->sketch, h1, h2));
    PyErr_SetString(PyExc_TypeError, "only nth-hit and tinylfu count sightings");
    return NULL;
}

static PyObject *Admission_reset(AdmissionObject *self, PyObject *unused) {
    if (self->sketch.rows != NULL) {
        memset(self->sketch.rows, 0, (size_t)(4 * self->sketch.width));
        self->sketch.added = 0;
    }
    if (self->doorkeeper != NULL) bloom_clear(self->doorkeeper);
    Py_RETURN_NONE;
}

static PyObject *Admission_sketch_bytes(AdmissionObject *self, void *closure) {
    long long bytes = (long long)(4 * self->sketch.width) * (self->sketch.rows != NULL);
    if (self->doorkeeper != NULL) bytes += self->doorkeeper->nbytes;
    return PyLong_FromLongLong(bytes);
}

static PyObject *Admission_kind(AdmissionObject *self, void *closure) {
    return PyUnicode_FromString(admission_kinds[self->kind]);
}

static PyMethodDef Admission_methods[] = {
    {"admit", (PyCFunction)(void (*)(void))Admission_admit, METH_FASTCALL,
     "admit(key, size, now): whether a missed key's cacheable response is stored."},
    {"observe", (PyCFunction)(void (*)(void))Admission_observe, METH_FASTCALL,
     "observe(key, size, now): one request of key, hit or miss, once its size is known."},
    {"estimate", (PyCFunction)Admission_estimate, METH_O, "A key's counted sightings."},
    {"reset", (PyCFunction)Admission_reset, METH_NOARGS, "Forget every count."},
    {"scores", (PyCFunction)Admission_scores, METH_NOARGS,
     "adaptive: each candidate's recent shadow hits (halved every period)."},
    {"written", (PyCFunction)Admission_written, METH_NOARGS,
     "auto: each candidate's ghost's recent bytes written (halved as its hits are)."},
    {NULL},
};

static PyObject *Admission_classes(AdmissionObject *self, void *closure) {
    PyObject *out = PyTuple_New(self->classes);
    for (Py_ssize_t k = 0; out != NULL && k < self->classes; k++) {
        PyObject *p = PyLong_FromLong(self->percentiles[k]);
        if (p == NULL) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, k, p);
    }
    return out;
}

static PyGetSetDef Admission_getset[] = {
    {"classes", (getter)Admission_classes, NULL,
     "auto: the percentile of each size class, its last candidates", NULL},
    {"kind", (getter)Admission_kind, NULL, "The policy's kind.", NULL},
    {"sketch_bytes", (getter)Admission_sketch_bytes, NULL,
     "Bytes of the sketch and doorkeeper.", NULL},
    {NULL},
};

static PyMemberDef Admission_members[] = {
    {"halvings", T_LONGLONG, offsetof(AdmissionObject, halvings), READONLY,
     "times the sketch aged (halved, or was re-sized)"},
    {"admitted", T_LONGLONG, offsetof(AdmissionObject, admitted), READONLY, ""},
    {"rejected", T_LONGLONG, offsetof(AdmissionObject, rejected), READONLY, ""},
    {"choice", T_INT, offsetof(AdmissionObject, choice), READONLY,
     "adaptive: the candidate deciding now (its index)"},
    {"switches", T_LONGLONG, offsetof(AdmissionObject, switches), READONLY,
     "adaptive: times the deciding candidate changed"},
    {"sampled", T_LONGLONG, offsetof(AdmissionObject, sampled), READONLY,
     "adaptive: requests its shadows saw"},
    {"limit", T_LONGLONG, offsetof(AdmissionObject, limit), READONLY,
     "size-below: the size a response is admitted under (auto's size classes: 0 until set)"},
    {"seen", T_DOUBLE, offsetof(AdmissionObject, seen), READONLY,
     "auto: recent sampled lookups (halved as the scores are)"},
    {"sample_key", T_ULONGLONG, offsetof(AdmissionObject, sample_key), 0,
     "adaptive and auto: the secret their sample of keys is chosen by (sample.h; 0: unkeyed)"},
    {NULL},
};

PyTypeObject AdmissionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.Admission",
    .tp_basicsize = sizeof(AdmissionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An admission policy (see the module's rules).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Admission_init,
    .tp_dealloc = (destructor)Admission_dealloc,
    .tp_traverse = (traverseproc)Admission_traverse,
    .tp_clear = (inquiry)Admission_clear_refs,
    .tp_methods = Admission_methods,
    .tp_members = Admission_members,
    .tp_getset = Admission_getset,
};

