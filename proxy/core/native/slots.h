/* Attributes read and written straight in their slots: what the compiled paths (the hit path,
 * the front's loop) use to reach the fields of Python objects without looking them up by name. */
#ifndef ONEHIT_SLOTS_H
#define ONEHIT_SLOTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* An attribute, read and written straight in its slot when the object's type keeps it in one
 * (a __slots__ member, a Cython object field), else through getattr and setattr. Looking
 * attributes up by name was most of the compiled hit path's time. */
typedef struct {
    const char *text;
    PyObject *name;
    PyTypeObject *type; /* the type last seen, or NULL */
    Py_ssize_t offset;  /* where that type keeps the attribute, or -1: not in a slot */
    int writable;
} Attr;

/* The slot of a's member in obj, or NULL when obj's type keeps a elsewhere. */
static inline PyObject **slot(PyObject *obj, Attr *a) {
    PyTypeObject *type = Py_TYPE(obj);
    if (type != a->type) {
        /* Held, so that no other type can take its address while it is remembered. */
        Py_XSETREF(a->type, (PyTypeObject *)Py_NewRef(type));
        a->offset = -1;
        PyObject *descr = PyObject_GetAttr((PyObject *)type, a->name);
        if (descr == NULL) {
            PyErr_Clear();
            return NULL;
        }
        if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            if ((member->type == T_OBJECT_EX || member->type == T_OBJECT) &&
                !(member->flags & READ_RESTRICTED)) {
                a->offset = member->offset;
                a->writable = !(member->flags & READONLY);
            }
        }
        Py_DECREF(descr);
    }
    return a->offset < 0 ? NULL : (PyObject **)((char *)obj + a->offset);
}

/* obj.a, a new reference; NULL with an exception set when it has none. */
static inline PyObject *get(PyObject *obj, Attr *a) {
    PyObject **at = slot(obj, a);
    if (at != NULL && *at != NULL)
        return Py_NewRef(*at);
    return PyObject_GetAttr(obj, a->name);
}

/* obj.a = value; -1 with an exception set when it cannot be. */
static inline int set(PyObject *obj, Attr *a, PyObject *value) {
    PyObject **at = slot(obj, a);
    if (at == NULL || !a->writable)
        return PyObject_SetAttr(obj, a->name, value);
    Py_XSETREF(*at, Py_NewRef(value));
    return 0;
}

/* 1 true, 0 false, -1 error: the truth of obj.a. */
static inline int attr_true(PyObject *obj, Attr *a) {
    PyObject *value = get(obj, a);
    if (value == NULL)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* obj.a += delta. */
static inline int attr_add(PyObject *obj, Attr *a, PyObject *delta) {
    PyObject *value = get(obj, a);
    if (value == NULL)
        return -1;
    PyObject *sum = PyNumber_Add(value, delta);
    Py_DECREF(value);
    if (sum == NULL)
        return -1;
    int rc = set(obj, a, sum);
    Py_DECREF(sum);
    return rc;
}

/* obj.a as a double; -1 with an exception set when it is not a number. */
static inline int attr_double(PyObject *obj, Attr *a, double *out) {
    PyObject *value = get(obj, a);
    if (value == NULL)
        return -1;
    *out = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

#endif
