/* The proxy's plain fresh hit, compiled: what Proxy.answer_hit does for the request a cache
 * exists for, without running the interpreter.
 *
 * Rules this module keeps:
 *
 * - It answers a subset of what Proxy.answer_hit answers, and answers it the same: the same
 *   bytes (but for the clock), the same counters moved in the same way. Anything else it
 *   declines, and the proxy's own rules decide: it never refuses and never sends a request
 *   to aiohttp's handler itself. It declines with False a plain request whose URL has
 *   nothing stored, in memory nor (once attach_disk gave it the disk tier) on disk, which
 *   answer_hit would decline too (so the caller need not ask it), and one whose URL is
 *   remembered uncacheable (the mark's expiry is the handler's to judge); with what `cold` makes of
 *   a disk record the page cache does not hold (where it lies: the handler reads it off the
 *   loop without asking the index again, and no answerer is asked); and with None anything
 *   else.
 * - With a disk tier, a plain request whose URL memory holds nothing for is answered from
 *   its disk record when disk.c may (a whole, fresh record with the head this proxy
 *   renders), counted as CacheEngine._hit_behind counts one, and kept in memory (the proxy's
 *   own `promote`) when the store's admission (`admit`) and its promotion filter
 *   (`promotion_admit`) take it (CacheEngine._promotes).
 * - Plain: GET or HEAD, HTTP/1.1 keep-alive, no body or upgrade, an origin-form target within
 *   the URL limit, header fields within their limit and none of the `declined` names (the
 *   fields the HTTP rules read: validators, Range, Cache-Control, Cookie...), a Host the proxy
 *   has already validated and routed (`hosts`, which the proxy fills), a URL without stored
 *   variants, and a stored entry that is fresh with no request directives, carries no
 *   `no-cache`, and whose head the proxy has rendered from its current fields
 *   (`ServedEntry.rendered`, whose third item is the `headers` it was rendered from).
 * - A hit is found and counted as CacheEngine.lookup finds and counts one: the entry by its
 *   key's hash and its key, its age as Entry.age computes it, and
 *   requests, hits, hit_bytes, bytes_served, the index's touch and record_hit, the
 *   admission's observe when it observes, and the what-if's record for the hits of its
 *   sample (a sample point of its key's hash, keyed by sample_key, below sample_below).
 * - answer_bytes reads a request from its bytes only when they begin with one whole plain
 *   request (parse_plain): a strict subset of what aiohttp's request parser (llhttp, strict)
 *   takes, read as it reads it (method, target, fields, one Host, no body, keep-alive), so
 *   the same request gets the same answer either way. Anything else it leaves to that
 *   parser, counting nothing: it never refuses a request itself.
 * - Per hit only Cache-Status's ttl, Age (and Date when the origin sent none) are formatted;
 *   a body under `join_below` bytes goes out in one bytes object with the head, a larger one
 *   as its own object, never copied.
 */
#include "hits.h"

static int PlainHits_traverse(PlainHits *self, visitproc visit, void *arg) {
    Py_VISIT(self->entries);
    Py_VISIT(self->vary);
    Py_VISIT(self->index);
    Py_VISIT(self->counters);
    Py_VISIT(self->observe);
    Py_VISIT(self->whatif);
    Py_VISIT(self->hash);
    Py_VISIT(self->clock);
    Py_VISIT(self->date);
    Py_VISIT(self->hosts);
    Py_VISIT(self->declined);
    Py_VISIT(self->per_hit);
    Py_VISIT(self->disk_index);
    Py_VISIT(self->disk_index_get);
    Py_VISIT(self->record_meta);
    Py_VISIT(self->disk_fds);
    Py_VISIT(self->disk_bans);
    Py_VISIT(self->uncacheable);
    Py_VISIT(self->checksum);
    Py_VISIT(self->disk_promote);
    Py_VISIT(self->disk_counters);
    Py_VISIT(self->disk_observe);
    Py_VISIT(self->admit);
    Py_VISIT(self->promotion_admit);
    Py_VISIT(self->disk_cold);
    return 0;
}

static int PlainHits_clear(PlainHits *self) {
    Py_CLEAR(self->entries);
    Py_CLEAR(self->vary);
    Py_CLEAR(self->index);
    Py_CLEAR(self->counters);
    Py_CLEAR(self->observe);
    Py_CLEAR(self->whatif);
    Py_CLEAR(self->hash);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->date);
    Py_CLEAR(self->hosts);
    Py_CLEAR(self->declined);
    Py_CLEAR(self->per_hit);
    Py_CLEAR(self->disk_index);
    Py_CLEAR(self->disk_index_get);
    Py_CLEAR(self->record_meta);
    Py_CLEAR(self->disk_fds);
    Py_CLEAR(self->disk_bans);
    Py_CLEAR(self->uncacheable);
    Py_CLEAR(self->checksum);
    Py_CLEAR(self->disk_promote);
    Py_CLEAR(self->disk_counters);
    Py_CLEAR(self->disk_observe);
    Py_CLEAR(self->admit);
    Py_CLEAR(self->promotion_admit);
    Py_CLEAR(self->disk_cold);
    return 0;
}

static void PlainHits_dealloc(PlainHits *self) {
    PyObject_GC_UnTrack(self);
    PlainHits_clear(self);
    PyMem_Free(self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int PlainHits_init(PlainHits *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"entries", "vary",    "index",    "counters",   "observe",
                            "hash",    "clock",   "date",     "hosts",      "declined",
                            "per_hit", "max_url", "max_headers", "join_below", NULL};
    PyObject *entries, *vary, *index, *counters, *observe, *hash, *clock, *date, *hosts,
        *declined, *per_hit;
    Py_ssize_t max_url, max_headers, join_below;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$O!O!OOOOOOO!O!O!nnn", names, &PyDict_Type,
                                     &entries, &PyDict_Type, &vary, &index, &counters, &observe,
                                     &hash, &clock, &date, &PyDict_Type, &hosts, &PyTuple_Type,
                                     &declined, &PyBytes_Type, &per_hit, &max_url, &max_headers,
                                     &join_below))
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(declined); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(declined, i))) {
            PyErr_SetString(PyExc_TypeError, "declined holds field names as bytes");
            return -1;
        }
    }
    PyObject *old[] = {self->entries, self->vary, self->index, self->counters,
                       self->observe, self->hash, self->clock, self->date,
                       self->hosts,   self->declined, self->per_hit};
    self->entries = Py_NewRef(entries);
    self->vary = Py_NewRef(vary);
    self->index = Py_NewRef(index);
    self->counters = Py_NewRef(counters);
    self->observe = Py_NewRef(observe);
    self->hash = Py_NewRef(hash);
    self->clock = Py_NewRef(clock);
    self->date = Py_NewRef(date);
    self->hosts = Py_NewRef(hosts);
    self->declined = Py_NewRef(declined);
    self->per_hit = Py_NewRef(per_hit);
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        Py_XDECREF(old[i]);
    if (self->whatif == NULL)
        self->whatif = Py_NewRef(Py_None);
    if (self->admit == NULL)
        self->admit = Py_NewRef(Py_None);
    if (self->promotion_admit == NULL)
        self->promotion_admit = Py_NewRef(Py_None);
    self->query_as_sent = 1;
    self->max_url = max_url;
    self->max_headers = max_headers;
    self->join_below = join_below;
    return 0;
}

static PyObject *PlainHits_attach_disk(PlainHits *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"index",  "fds",      "bans",    "uncacheable", "checksum",
                            "promote", "counters", "observe", "cold",        "meta",
                            "stamp",   "read_inline", NULL};
    PyObject *index, *fds, *bans, *uncacheable, *checksum, *promote, *counters, *observe, *cold,
        *meta;
    unsigned long stamp;
    Py_ssize_t read_inline;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OO!O!OOOOOOO!kn", names, &index, &PyDict_Type,
                                     &fds, &PyList_Type, &bans, &uncacheable, &checksum,
                                     &promote, &counters, &observe, &cold, &PyType_Type, &meta,
                                     &stamp, &read_inline))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)meta, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "meta is a tuple's type (RecordMeta)");
        return NULL;
    }
    PyObject *get = PyObject_GetAttrString(index, "get");
    if (get == NULL)
        return NULL;
    Py_XSETREF(self->disk_index_get, get);
    Py_XSETREF(self->record_meta, Py_NewRef(meta));
    Py_XSETREF(self->disk_index, Py_NewRef(index));
    Py_XSETREF(self->disk_fds, Py_NewRef(fds));
    Py_XSETREF(self->disk_bans, Py_NewRef(bans));
    Py_XSETREF(self->uncacheable, Py_NewRef(uncacheable));
    Py_XSETREF(self->checksum, Py_NewRef(checksum));
    Py_XSETREF(self->disk_promote, Py_NewRef(promote));
    Py_XSETREF(self->disk_counters, Py_NewRef(counters));
    Py_XSETREF(self->disk_observe, Py_NewRef(observe));
    Py_XSETREF(self->disk_cold, Py_NewRef(cold));
    self->stamp = stamp;
    self->read_inline = read_inline;
    Py_RETURN_NONE;
}

static PyObject *PlainHits_answer(PlainHits *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "answer(message, ...) takes the parsed request");
        return NULL;
    }
    PyObject *msg = args[0], *path = NULL, *raw = NULL, *result = NULL;
    int head = 0;
    int plain = plain_request(self, msg, &head, &path);
    if (plain <= 0)
        goto done;
    raw = get(msg, &attrs[A_RAW_HEADERS]);
    if (raw == NULL)
        goto done;
    PyObject *host;
    if (scan_fields(self, raw, &host) != 0)
        goto done;
    result = answer_key(self, host, path, head);
done:
    Py_XDECREF(path);
    Py_XDECREF(raw);
    if (result == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return result;
}

static PyObject *PlainHits_answer_bytes(PlainHits *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    Py_ssize_t start;
    if (nargs != 2 || !PyBytes_Check(args[0]) ||
        (start = PyLong_AsSsize_t(args[1])) < 0 || start > PyBytes_GET_SIZE(args[0])) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "answer_bytes(data: bytes, start: int)");
        return NULL;
    }
    RawRequest r;
    if (!parse_plain(self, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), start, &r))
        Py_RETURN_NONE;
    PyObject *end = PyLong_FromSsize_t(r.end), *host = NULL, *path = NULL, *answer = NULL,
             *result = NULL;
    if (end == NULL)
        return NULL;
    if (r.declined) {
        result = PyTuple_Pack(2, end, Py_None);
        goto done;
    }
    host = PyBytes_FromStringAndSize(r.host, r.host_len);
    path = host ? PyUnicode_DecodeASCII(r.path, r.path_len, NULL) : NULL;
    answer = path ? answer_key(self, host, path, r.head) : NULL;
    if (answer == NULL)
        goto done;
    if (PyTuple_Check(answer) && PyTuple_GET_SIZE(answer) == 3)
        result = PyTuple_Pack(4, end, PyTuple_GET_ITEM(answer, 0), PyTuple_GET_ITEM(answer, 1),
                              PyTuple_GET_ITEM(answer, 2));
    else
        result = PyTuple_Pack(2, end, answer);
done:
    Py_DECREF(end);
    Py_XDECREF(host);
    Py_XDECREF(path);
    Py_XDECREF(answer);
    return result;
}

static PyObject *PlainHits_get_answered(PlainHits *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->answered);
}

static PyMethodDef PlainHits_methods[] = {
    {"attach_disk", (PyCFunction)(void (*)(void))PlainHits_attach_disk,
     METH_VARARGS | METH_KEYWORDS,
     "attach_disk(*, index, fds, bans, uncacheable, checksum, promote, counters, observe,\n"
     "cold, meta, stamp, read_inline):\n"
     "answer plain hits from the disk tier's records too (see disk.c)"},
    {"answer", (PyCFunction)(void (*)(void))PlainHits_answer, METH_FASTCALL,
     "answer(message, *ignored) -> (bytes, body or b'', status) | False | ColdRecord | None\n\n"
     "The whole answer to a plain fresh hit, counted; False, nothing counted, for a plain\n"
     "request whose URL has nothing stored; what attach_disk's cold makes of a disk record\n"
     "the page cache does not hold (no answerer can answer it as a hit on the event loop:\n"
     "the handler reads it from where it lies); None, nothing counted, otherwise."},
    {"answer_bytes", (PyCFunction)(void (*)(void))PlainHits_answer_bytes, METH_FASTCALL,
     "answer_bytes(data, start) -> (end, bytes, body or b'', status) | (end, False) |\n"
     "    (end, ColdRecord) | (end, None) | None\n\n"
     "answer() for the request at data[start:] as its bytes came, when they begin with one\n"
     "whole plain request (see parse_plain), which ends at data[end]: its answer, or False, a\n"
     "ColdRecord or None as answer() gives them (None too when it carries a declined field).\n"
     "None alone,\n"
     "nothing counted, when data[start:] is anything else: aiohttp's parser is to read it."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PlainHits_members[] = {
    {"query_as_sent", T_BOOL, offsetof(PlainHits, query_as_sent), 0,
     "whether a target's query keys as sent ([cache] key_query): else a target with a query\n"
     "is declined (the proxy keys it)"},
    {"sample_below", T_ULONGLONG, offsetof(PlainHits, sample_below), 0,
     "the hits whose sample point (sample.h) is below it are the what-if's sample"},
    {"sample_key", T_ULONGLONG, offsetof(PlainHits, sample_key), 0,
     "the what-if sample's secret (sample.h)"},
    {NULL}};

/* A callable the hit path calls, or None: never unset, since the hit path calls what it
 * holds (closure: the field's offset in PlainHits). */
static PyObject *PlainHits_get_callable(PlainHits *self, void *closure) {
    PyObject *held = *(PyObject **)((char *)self + (size_t)closure);
    return Py_NewRef(held != NULL ? held : Py_None);
}

static int PlainHits_set_callable(PlainHits *self, PyObject *value, void *closure) {
    if (value == NULL || (value != Py_None && !PyCallable_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "a callable or None, never unset");
        return -1;
    }
    Py_XSETREF(*(PyObject **)((char *)self + (size_t)closure), Py_NewRef(value));
    return 0;
}

#define CALLABLE(name, doc)                                                                    \
    {#name, (getter)PlainHits_get_callable, (setter)PlainHits_set_callable, doc,              \
     (void *)offsetof(PlainHits, name)}

static PyGetSetDef PlainHits_getset[] = {
    {"answered", (getter)PlainHits_get_answered, NULL, "hits answered here", NULL},
    CALLABLE(whatif, "the what-if's record(key, size, now), called for the sampled hits, or None"),
    CALLABLE(observe, "the admission's observe, or None (a reload may change the admission)"),
    CALLABLE(admit, "the admission's admit(key, size, now): whether a disk hit is kept in memory\n"
                    "too, or None (not asked)"),
    CALLABLE(promotion_admit,
             "the promotion filter's admit(key, size, now), asked beside admit of every disk\n"
             "hit (both must take it to keep it in memory), or None"),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlainHitsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.handler._hits.PlainHits",
    .tp_basicsize = sizeof(PlainHits),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Plain fresh hits found, counted and rendered without the interpreter.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PlainHits_init,
    .tp_dealloc = (destructor)PlainHits_dealloc,
    .tp_traverse = (traverseproc)PlainHits_traverse,
    .tp_clear = (inquiry)PlainHits_clear,
    .tp_methods = PlainHits_methods,
    .tp_getset = PlainHits_getset,
    .tp_members = PlainHits_members,
};

static struct PyModuleDef hits_module = {
    PyModuleDef_HEAD_INIT, "proxy.handler._hits", "The proxy's plain fresh hit, compiled.", -1, NULL,
};

PyMODINIT_FUNC PyInit__hits(void) {
    init_tables();
    if (attrs_init() < 0)
        return NULL;
    if (PyType_Ready(&PlainHitsType) < 0 || PyType_Ready(&LogLinesType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&hits_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "PlainHits", (PyObject *)&PlainHitsType) < 0 ||
        PyModule_AddObjectRef(module, "LogLines", (PyObject *)&LogLinesType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
