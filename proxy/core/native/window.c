/* Windows: g Bloom generations, newest first, rotated as time or fill asks. */
#include "native.h"

/* Python's float floor division, so elapsed spans round exactly as in pure Python. */
static double py_floor_div(double vx, double wx) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0)) div -= 1.0;
    }
    double floordiv;
    if (div) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, vx / wx);
    }
    return floordiv;
}

int window_sizer_share(WindowObject *w, long long *share) {
    PyObject *r = PyObject_CallNoArgs(w->sizer);
    if (r == NULL) return -1;
    long long asked = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (asked == -1 && PyErr_Occurred()) return -1;
    *share = asked < 1 ? 1 : asked;
    return 0;
}

static int window_rotate(WindowObject *w, double now) {
    BloomObject *oldest = w->gens[w->g - 1];
    long long share = oldest->capacity;
    if (w->sizer != NULL && window_sizer_share(w, &share) < 0) return -1;
    if (share == oldest->capacity) {
        bloom_clear(oldest);
    } else {
        BloomObject *fresh = bloom_new(share, w->gen_fp);
        if (fresh == NULL) return -1;
        Py_DECREF(oldest);
        oldest = fresh;
    }
    memmove(w->gens + 1, w->gens, sizeof(BloomObject *) * (size_t)(w->g - 1));
    memmove(w->written + 1, w->written, sizeof(double) * (size_t)(w->g - 1));
    w->gens[0] = oldest;
    w->written[0] = -INFINITY;
    w->started = now;
    w->rotations++;
    return 0;
}

static int window_advance(WindowObject *w, double now) {
    if (!w->has_started) {
        w->started = now;
        w->has_started = 1;
        return 0;
    }
    double started = w->started;
    if (now - started < w->span) return 0;
    /* In floating point until clamped: a clock leap past what a long long holds rotates
     * every generation, as any leap past the window does. */
    double elapsed = py_floor_div(now - started, w->span);
    long long due = elapsed < (double)w->g ? (long long)elapsed : w->g;
    /* The oldest generation goes only once its last write is out of the window: in exact
     * arithmetic that always holds here, and it keeps the guarantee when floats round. */
    while (due && w->written[w->g - 1] + w->window < now) {
        if (window_rotate(w, now) < 0) return -1;
        due--;
    }
    if (!due) w->started = started + elapsed * w->span;
    return 0;
}

int window_seen_before(WindowObject *w, uint64_t h1, uint64_t h2, double now) {
    if (w->shared != NULL) return shared_seen_before(w, h1, h2, now);
    if (window_advance(w, now) < 0) return -1;
    BloomObject *newest = w->gens[0];
    w->written[0] = now;
    if (bloom_add(newest, h1, h2)) return 1;
    int seen = 0;
    for (int i = 1; i < w->g; i++) {
        if (bloom_contains(w->gens[i], h1, h2)) {
            seen = 1;
            break;
        }
    }
    if (newest->count >= newest->capacity) {
        w->forced_rotations++;
        if (window_rotate(w, now) < 0) return -1;
    }
    return seen;
}

static int Window_init(WindowObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"share", "gen_fp", "window", "generations", "sizer", "shared",
                             NULL};
    long long share;
    double gen_fp, window;
    int g;
    PyObject *sizer = Py_None, *shared = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Lddi|OO", kwlist, &share, &gen_fp, &window, &g,
                                     &sizer, &shared))
        return -1;
    if (g < 2) {
        PyErr_Format(PyExc_ValueError, "generations must be an integer >= 2, got %d", g);
        return -1;
    }
    if (shared != Py_None && g > SHARED_MAX_G) {
        PyErr_Format(PyExc_ValueError, "a shared window has at most %d generations",
                     SHARED_MAX_G);
        return -1;
    }
    if (self->gens != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Window is initialised once");
        return -1;
    }
    self->gens = PyMem_Calloc((size_t)g, sizeof(BloomObject *));
    self->written = PyMem_Calloc((size_t)g, sizeof(double));
    if (self->gens == NULL || self->written == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->g = g;
    /* A shared window's generations are in the shared memory: the first is kept here as the
     * model of their sizing. */
    for (int i = 0; i < (shared == Py_None ? g : 1); i++) {
        self->gens[i] = bloom_new(share, gen_fp);
        if (self->gens[i] == NULL) return -1;
        self->written[i] = -INFINITY;
    }
    self->window = window;
    self->span = window / (double)(g - 1);
    self->gen_fp = gen_fp;
    self->has_started = 0;
    self->started = 0.0;
    self->rotations = 0;
    self->forced_rotations = 0;
    if (sizer != Py_None) {
        Py_INCREF(sizer);
        self->sizer = sizer;
    }
    if (shared != Py_None) return shared_attach(self, shared, share);
    return 0;
}

static int Window_traverse(WindowObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->sizer);
    return 0;
}

static int Window_clear_refs(WindowObject *self) {
    Py_CLEAR(self->sizer);
    return 0;
}

static void Window_dealloc(WindowObject *self) {
    PyObject_GC_UnTrack(self);
    Window_clear_refs(self);
    shared_detach(self);
    if (self->gens != NULL) {
        for (int i = 0; i < self->g; i++) Py_XDECREF(self->gens[i]);
    }
    PyMem_Free(self->gens);
    PyMem_Free(self->written);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int window_now(PyObject *arg, double *now) {
    *now = PyFloat_AsDouble(arg);
    if (*now == -1.0 && PyErr_Occurred()) return -1;
    if (!isfinite(*now)) {
        PyErr_Format(PyExc_ValueError, "now must be a finite time in seconds, got %R", arg);
        return -1;
    }
    return 0;
}

static PyObject *Window_seen_before(WindowObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "seen_before(key, now)");
        return NULL;
    }
    uint64_t h1, h2;
    double now;
    if (hash_key(args[0], &h1, &h2) < 0 || window_now(args[1], &now) < 0) return NULL;
    int seen = window_seen_before(self, h1, h2, now);
    if (seen < 0) return NULL;
    return PyBool_FromLong(seen);
}

static PyObject *Window_contains(WindowObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "contains(key, now)");
        return NULL;
    }
    uint64_t h1, h2;
    double now;
    if (hash_key(args[0], &h1, &h2) < 0 || window_now(args[1], &now) < 0) return NULL;
    if (self->shared != NULL) {
        int found = shared_contains(self, h1, h2, now);
        return found < 0 ? NULL : PyBool_FromLong(found);
    }
    if (window_advance(self, now) < 0) return NULL;
    for (int i = 0; i < self->g; i++) {
        if (bloom_contains(self->gens[i], h1, h2)) Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *Window_clear(WindowObject *self, PyObject *const *args, Py_ssize_t n) {
    if (self->shared != NULL) {
        double now = NAN;
        if (n >= 1 && args[0] != Py_None && window_now(args[0], &now) < 0) return NULL;
        shared_clear(self, now);
        Py_RETURN_NONE;
    }
    for (int i = 0; i < self->g; i++) {
        bloom_clear(self->gens[i]);
        self->written[i] = -INFINITY;
    }
    if (n >= 1 && args[0] != Py_None) {
        if (window_now(args[0], &self->started) < 0) return NULL;
        self->has_started = 1;
    } else {
        self->has_started = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *Window_generations(WindowObject *self, PyObject *unused) {
    PyObject *out = PyTuple_New(self->g);
    if (out == NULL) return NULL;
    for (int i = 0; i < self->g; i++) {
        BloomObject *gen = self->gens[i];
        if (self->shared != NULL) {
            gen = shared_generation(self, i);
            if (gen == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        } else {
            Py_INCREF(gen);
        }
        PyTuple_SET_ITEM(out, i, (PyObject *)gen);
    }
    return out;
}

static PyMethodDef Window_methods[] = {
    {"seen_before", (PyCFunction)(void (*)(void))Window_seen_before, METH_FASTCALL,
     "Test key, then record it in the newest generation; one call."},
    {"contains", (PyCFunction)(void (*)(void))Window_contains, METH_FASTCALL,
     "Test key without recording it."},
    {"clear", (PyCFunction)(void (*)(void))Window_clear, METH_FASTCALL,
     "Forget everything; the next generation starts at now (or at the next call)."},
    {"generations", (PyCFunction)Window_generations, METH_NOARGS,
     "The generations, newest first."},
    {NULL},
};

static PyMemberDef Window_members[] = {
    {"window", T_DOUBLE, offsetof(WindowObject, window), READONLY, "seconds remembered"},
    {"num_generations", T_INT, offsetof(WindowObject, g), READONLY, "generations"},
    {NULL},
};

static PyObject *Window_rotations(WindowObject *self, void *forced) {
    if (self->shared != NULL) {
        uint64_t *count = forced ? &self->shared->head->forced : &self->shared->head->rotations;
        return PyLong_FromUnsignedLongLong(__atomic_load_n(count, __ATOMIC_RELAXED));
    }
    return PyLong_FromLongLong(forced ? self->forced_rotations : self->rotations);
}

static PyObject *Window_share(WindowObject *self, void *unused) {
    if (self->shared != NULL)
        return PyLong_FromLongLong(__atomic_load_n(&self->shared->head->limit, __ATOMIC_RELAXED));
    return PyLong_FromLongLong(self->gens[0]->capacity);
}

static PyObject *Window_is_shared(WindowObject *self, void *unused) {
    return PyBool_FromLong(self->shared != NULL);
}

static PyGetSetDef Window_getset[] = {
    {"rotations", (getter)Window_rotations, NULL, "rotations", NULL},
    {"forced_rotations", (getter)Window_rotations, NULL,
     "rotations because the newest generation reached its share", (void *)1},
    {"share", (getter)Window_share, NULL, "first sightings the newest generation takes", NULL},
    {"shared", (getter)Window_is_shared, NULL, "whether other processes share it", NULL},
    {NULL},
};

PyObject *py_shared_window_bytes(PyObject *module, PyObject *args) {
    long long share, bits;
    double gen_fp;
    int g, probes;
    if (!PyArg_ParseTuple(args, "Ldi", &share, &gen_fp, &g)) return NULL;
    if (sizing(share, gen_fp, &bits, &probes) < 0) return NULL;
    return PyLong_FromLongLong(shared_window_bytes(bits, g));
}

PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.Window",
    .tp_basicsize = sizeof(WindowObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Rotating Bloom generations over a time window.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Window_init,
    .tp_dealloc = (destructor)Window_dealloc,
    .tp_traverse = (traverseproc)Window_traverse,
    .tp_clear = (inquiry)Window_clear_refs,
    .tp_methods = Window_methods,
    .tp_members = Window_members,
    .tp_getset = Window_getset,
};

