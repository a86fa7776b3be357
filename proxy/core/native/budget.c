/* A disk tier's write budget: at most about `rate` bytes a second written, as CacheLib's
 * dynamic random admission keeps flash within its endurance. Each second, the share of what
 * the admission takes that is written follows the rate the second before (its ratio to the
 * budget; at most doubling a second, up to all; at least 0.1%), drawn from a seeded generator
 * so that runs repeat. */
#include "native.h"

static int WriteBudget_init(WriteBudgetObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"rate", "seed", NULL};
    double rate;
    unsigned long long seed = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|K", kwlist, &rate, &seed)) return -1;
    if (!(rate >= 0) || isinf(rate)) {
        PyObject *given = PyFloat_FromDouble(rate);
        if (given != NULL) {
            PyErr_Format(PyExc_ValueError, "a write budget is a finite rate >= 0, got %R", given);
            Py_DECREF(given);
        }
        return -1;
    }
    self->rate = rate;
    self->probability = 1.0;
    self->started = 0;
    self->start = 0.0;
    self->bytes = 0;
    /* xorshift's state is never 0; the seed is spread so that nearby seeds differ at once */
    self->rng = fmix64(seed + 0x9e3779b97f4a7c15ULL) | 1;
    return 0;
}

static PyObject *WriteBudget_allow(WriteBudgetObject *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(budget_allow(self, now));
}

static PyObject *WriteBudget_wrote(WriteBudgetObject *self, PyObject *arg) {
    long long length = PyLong_AsLongLong(arg);
    if (length == -1 && PyErr_Occurred()) return NULL;
    self->bytes += length;
    Py_RETURN_NONE;
}

static PyMethodDef WriteBudget_methods[] = {
    {"allow", (PyCFunction)WriteBudget_allow, METH_O,
     "allow(now): whether a record the admission took may be written at now."},
    {"wrote", (PyCFunction)WriteBudget_wrote, METH_O,
     "wrote(length): a record of length bytes was written."},
    {NULL},
};

static PyMemberDef WriteBudget_members[] = {
    {"rate", T_DOUBLE, offsetof(WriteBudgetObject, rate), READONLY,
     "bytes a second (0: no budget)"},
    {"probability", T_DOUBLE, offsetof(WriteBudgetObject, probability), READONLY,
     "the share of what the admission takes that is written now"},
    {NULL},
};

PyTypeObject WriteBudgetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.core._native.WriteBudget",
    .tp_basicsize = sizeof(WriteBudgetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WriteBudget(rate, seed=1): at most about rate bytes a second written to a disk "
              "tier (0: no budget).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)WriteBudget_init,
    .tp_methods = WriteBudget_methods,
    .tp_members = WriteBudget_members,
};
