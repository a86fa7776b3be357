/* The proxy.core._native module: its functions and types. */
#include "native.h"

/* Stops the cyclic collector from tracking obj (its memory is still freed by reference
 * counting). Only for an object that can never be part of a reference cycle: one whose fields
 * hold strings, bytes, numbers, and tuples and dicts of them. A cache holds millions of such
 * entries, and each full collection would otherwise walk every one of them. */
static PyObject *py_untrack(PyObject *module, PyObject *obj) {
    if (PyObject_IS_GC(obj))
        PyObject_GC_UnTrack(obj);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"hash64", (PyCFunction)py_hash64, METH_O,
     "MurmurHash3 x64/128 of a key's UTF-8 bytes: (h1, h2), unsigned."},
    {"sample_point", (PyCFunction)py_sample_point, METH_VARARGS,
     "sample_point(h1, key): where a key of hash64 h1 falls in the what-if's sample keyed by "
     "key (sampled when below the sample's bound; sample.h)."},
    {"optimal_size", (PyCFunction)py_optimal_size, METH_VARARGS,
     "(bits, probes) of a Bloom filter holding capacity keys at fp_rate."},
    {"shared_window_bytes", (PyCFunction)py_shared_window_bytes, METH_VARARGS,
     "shared_window_bytes(share, gen_fp, generations): the memory a shared Window needs."},
    {"hash_ids", (PyCFunction)py_hash_ids, METH_VARARGS,
     "hash_ids(ids, prefix, out): out[i] = h1 of prefix + str(ids[i])."},
    {"index_fields", (PyCFunction)py_index_fields, METH_O,
     "index_fields(pairs): {name.lower(): [values in order]} of (name, value) pairs."},
    {"end_to_end", (PyCFunction)py_end_to_end, METH_VARARGS,
     "end_to_end(pairs, hop_by_hop): the pairs whose lower-cased name is not in hop_by_hop and "
     "does not start with 'proxy-', as tuples; None when a Connection field is present."},
    {"indexed_fields", (PyCFunction)py_indexed_fields, METH_VARARGS,
     "indexed_fields(pairs, without, extra, hop_rules): (pairs as a tuple, index_fields of "
     "them) for the pairs whose lower-cased name is not in without (with hop_rules, nor "
     "starts with 'proxy-'), then extra; None when hop_rules and a Connection field is in "
     "without."},
    {"field_lines", (PyCFunction)py_field_lines, METH_O,
     "field_lines(pairs): 'name: value\\r\\n' for each pair, joined; None when a name or value "
     "holds a CR or an LF (a field may not smuggle in a line of its own)."},
    {"untrack", (PyCFunction)py_untrack, METH_O,
     "Keep an object that can never be in a reference cycle out of the cyclic collector's view."},
    {"footprint", (PyCFunction)py_footprint, METH_VARARGS,
     "footprint(ids, sizes): (distinct objects, their bytes at each one's largest size)."},
    {"shared_index_bytes", (PyCFunction)py_shared_index_bytes, METH_VARARGS,
     "shared_index_bytes(regions, region_size): the memory a SharedIndex of them lays out."},
    {"simulate_chunk", (PyCFunction)(void (*)(void))py_simulate_chunk,
     METH_VARARGS | METH_KEYWORDS,
     "Replay requests through a StoreIndex and an Admission; returns counter deltas."},
    {"simulate_tiers", (PyCFunction)(void (*)(void))py_simulate_tiers,
     METH_VARARGS | METH_KEYWORDS,
     "Replay requests through a memory tier and a disk tier; returns counter deltas and the "
     "ring's state."},
    {NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "proxy.core._native", "The compiled policy core.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&BloomType) < 0 || PyType_Ready(&WindowType) < 0 ||
        PyType_Ready(&IndexType) < 0 || PyType_Ready(&AdmissionType) < 0 ||
        PyType_Ready(&DiskIndexType) < 0 || PyType_Ready(&SharedIndexType) < 0 ||
        PyType_Ready(&WriteBudgetType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Bloom", (PyObject *)&BloomType) < 0 ||
        PyModule_AddObjectRef(m, "Window", (PyObject *)&WindowType) < 0 ||
        PyModule_AddObjectRef(m, "StoreIndex", (PyObject *)&IndexType) < 0 ||
        PyModule_AddObjectRef(m, "Admission", (PyObject *)&AdmissionType) < 0 ||
        PyModule_AddObjectRef(m, "DiskIndex", (PyObject *)&DiskIndexType) < 0 ||
        PyModule_AddObjectRef(m, "SharedIndex", (PyObject *)&SharedIndexType) < 0 ||
        PyModule_AddObjectRef(m, "WriteBudget", (PyObject *)&WriteBudgetType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
