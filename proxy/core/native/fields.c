/* Header fields read in one pass: lower-cased names, end-to-end fields, field lines. */
#include "native.h"

/* The lower-cased form of the ASCII names met so far, by name, up to LOWERED_MAX of them. A
 * proxy meets a few dozen distinct names, each on nearly every message: a lookup costs less
 * than a new string, the lower-cased one keeps its hash, and every stored response's index of
 * its fields shares its keys. Names past the bound (a client inventing them) are lower-cased
 * anew each time, as before. */
#define LOWERED_MAX 512
static PyObject *lowered;

/* name.lower(): an exact str, built here for an ASCII name, else by str.lower. */
static PyObject *lower_name(PyObject *name) {
    if (!PyUnicode_Check(name) || !PyUnicode_IS_ASCII(name))
        return PyObject_CallMethod(name, "lower", NULL);
    Py_ssize_t n = PyUnicode_GET_LENGTH(name);
    const Py_UCS1 *s = PyUnicode_1BYTE_DATA(name);
    Py_ssize_t i = 0;
    while (i < n && !(s[i] >= 'A' && s[i] <= 'Z'))
        i++;
    int exact = PyUnicode_CheckExact(name);
    if (i == n && exact) {
        Py_INCREF(name);
        return name;
    }
    if (exact) {
        if (lowered == NULL && (lowered = PyDict_New()) == NULL)
            return NULL;
        PyObject *known = PyDict_GetItemWithError(lowered, name);
        if (known != NULL)
            return Py_NewRef(known);
        if (PyErr_Occurred())
            return NULL;
    }
    PyObject *out = PyUnicode_New(n, 127);
    if (out == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t j = 0; j < n; j++)
        d[j] = (s[j] >= 'A' && s[j] <= 'Z') ? (Py_UCS1)(s[j] + 32) : s[j];
    if (exact && PyDict_GET_SIZE(lowered) < LOWERED_MAX && PyDict_SetItem(lowered, name, out) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* The (name, value) of one field: borrowed references, or -1 with an exception set. */
static int field_pair(PyObject *item, PyObject **name, PyObject **value) {
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
        *name = PyTuple_GET_ITEM(item, 0);
        *value = PyTuple_GET_ITEM(item, 1);
        return 0;
    }
    if ((PyTuple_Check(item) || PyList_Check(item)) && PySequence_Fast_GET_SIZE(item) == 2) {
        *name = PySequence_Fast_GET_ITEM(item, 0);
        *value = PySequence_Fast_GET_ITEM(item, 1);
        return 0;
    }
    PyErr_SetString(PyExc_ValueError, "a header field is a (name, value) pair");
    return -1;
}

/* Whether a str starts with "proxy-", read in place. */
static int starts_with_proxy(PyObject *text) {
    static const char prefix[] = "proxy-";
    if (PyUnicode_GET_LENGTH(text) < 6)
        return 0;
    for (Py_ssize_t i = 0; i < 6; i++)
        if (PyUnicode_READ_CHAR(text, i) != (Py_UCS4)prefix[i])
            return 0;
    return 1;
}

/* One pass over (name, value) pairs: those whose lower-cased name is not in `without` (NULL:
 * none left out) go to `kept` as tuples and into `index` ({lower-cased name: [values]}),
 * either of them NULL when not wanted. With `hop_rules`, names starting with "proxy-" are
 * left out too, and a Connection field in `without` ends the pass: it returns 1, since the
 * names it lists are left out as well (the caller's Python rule does that). 0 when done, -1
 * on error. */
static int pass_fields(PyObject *pairs, PyObject *without, int hop_rules, PyObject *kept,
                       PyObject *index) {
    PyObject *seq = PySequence_Fast(pairs, "fields must be a sequence of (name, value) pairs");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *name, *value;
        if (field_pair(item, &name, &value) < 0)
            goto fail;
        PyObject *low = lower_name(name);
        if (low == NULL)
            goto fail;
        int out = without == NULL ? 0 : PySet_Contains(without, low);
        if (out == 0 && hop_rules)
            out = starts_with_proxy(low);
        if (out == 1 && hop_rules && PyUnicode_CompareWithASCIIString(low, "connection") == 0) {
            Py_DECREF(low);
            Py_DECREF(seq);
            return 1;
        }
        if (out != 0) {
            Py_DECREF(low);
            if (out < 0)
                goto fail;
            continue;
        }
        int failed = 0;
        if (kept != NULL) {
            if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
                failed = PyList_Append(kept, item);
            } else {
                PyObject *pair = PyTuple_Pack(2, name, value);
                failed = pair == NULL ? -1 : PyList_Append(kept, pair);
                Py_XDECREF(pair);
            }
        }
        if (!failed && index != NULL) {
            PyObject *values = PyDict_GetItemWithError(index, low);
            if (values != NULL) {
                failed = PyList_Append(values, value);
            } else if (PyErr_Occurred()) {
                failed = -1;
            } else {
                values = PyList_New(1);
                failed = values == NULL ? -1 : 0;
                if (!failed) {
                    Py_INCREF(value);
                    PyList_SET_ITEM(values, 0, value);
                    failed = PyDict_SetItem(index, low, values);
                    Py_DECREF(values);
                }
            }
        }
        Py_DECREF(low);
        if (failed)
            goto fail;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

PyObject *py_index_fields(PyObject *module, PyObject *pairs) {
    PyObject *index = PyDict_New();
    if (index == NULL || pass_fields(pairs, NULL, 0, NULL, index) < 0) {
        Py_XDECREF(index);
        return NULL;
    }
    return index;
}

PyObject *py_end_to_end(PyObject *module, PyObject *args) {
    PyObject *pairs, *hop_by_hop;
    if (!PyArg_ParseTuple(args, "OO!:end_to_end", &pairs, &PyFrozenSet_Type, &hop_by_hop))
        return NULL;
    PyObject *kept = PyList_New(0);
    if (kept == NULL)
        return NULL;
    int done = pass_fields(pairs, hop_by_hop, 1, kept, NULL);
    if (done != 0) {
        Py_DECREF(kept);
        if (done < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return kept;
}

PyObject *py_indexed_fields(PyObject *module, PyObject *args) {
    PyObject *pairs, *without, *extra;
    int hop_rules;
    if (!PyArg_ParseTuple(args, "OO!Op:indexed_fields", &pairs, &PyFrozenSet_Type, &without,
                          &extra, &hop_rules))
        return NULL;
    PyObject *kept = PyList_New(0);
    PyObject *index = PyDict_New();
    PyObject *result = NULL;
    if (kept == NULL || index == NULL)
        goto done;
    int passed = pass_fields(pairs, without, hop_rules, kept, index);
    if (passed == 0)
        passed = pass_fields(extra, NULL, 0, kept, index);
    if (passed < 0)
        goto done;
    if (passed == 1) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *pairs_out = PyList_AsTuple(kept);
    if (pairs_out != NULL)
        result = PyTuple_Pack(2, pairs_out, index);
    Py_XDECREF(pairs_out);
done:
    Py_XDECREF(kept);
    Py_XDECREF(index);
    return result;
}

/* Whether a str holds a CR or an LF: one pass over a one-byte string (a header field's, in
 * practice), where two PyUnicode_FindChar calls cost more than the scan itself. */
static int has_newline(PyObject *text) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (PyUnicode_KIND(text) == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *s = PyUnicode_1BYTE_DATA(text);
        for (Py_ssize_t i = 0; i < n; i++)
            if (s[i] <= '\r' && (s[i] == '\r' || s[i] == '\n'))
                return 1;
        return 0;
    }
    return PyUnicode_FindChar(text, '\r', 0, n, 1) != -1 ||
           PyUnicode_FindChar(text, '\n', 0, n, 1) != -1;
}

PyObject *py_field_lines(PyObject *module, PyObject *pairs) {
    PyObject *seq = PySequence_Fast(pairs, "fields must be a sequence of (name, value) pairs");
    if (seq == NULL)
        return NULL;
    static PyObject *colon, *crlf, *empty;
    if (colon == NULL) {
        colon = PyUnicode_InternFromString(": ");
        crlf = PyUnicode_InternFromString("\r\n");
        empty = PyUnicode_InternFromString("");
        if (colon == NULL || crlf == NULL || empty == NULL)
            goto fail_seq;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *pieces = PyList_New(4 * n);
    if (pieces == NULL)
        goto fail_seq;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *value;
        if (field_pair(PySequence_Fast_GET_ITEM(seq, i), &name, &value) < 0)
            goto fail;
        if (!PyUnicode_Check(name) || !PyUnicode_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "a header field's name and value are str");
            goto fail;
        }
        if (has_newline(name) || has_newline(value)) {
            Py_DECREF(pieces);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        PyObject *parts[4] = {name, colon, value, crlf};
        for (int j = 0; j < 4; j++) {
            Py_INCREF(parts[j]);
            PyList_SET_ITEM(pieces, 4 * i + j, parts[j]);
        }
    }
    PyObject *lines = PyUnicode_Join(empty, pieces);
    Py_DECREF(pieces);
    Py_DECREF(seq);
    return lines;
fail:
    Py_DECREF(pieces);
fail_seq:
    Py_DECREF(seq);
    return NULL;
}

