/* The proxy's plain fresh hit, compiled: what Proxy.answer_hit does for the request a cache
 * exists for, without running the interpreter.
 *
 * Rules this module keeps:
 *
 * - It answers a subset of what Proxy.answer_hit answers, and answers it the same: the same
 *   bytes (but for the clock), the same counters moved in the same way. Anything else it
 *   declines, and the proxy's own rules decide: it never refuses and never sends a request
 *   to aiohttp's handler itself. It declines with False a plain request whose URL has
 *   nothing stored, which answer_hit would decline too (so the caller need not ask it), and
 *   with None anything else.
 * - Plain: GET or HEAD, HTTP/1.1 keep-alive, no body or upgrade, an origin-form target within
 *   the URL limit, header fields within their limit and none of the `declined` names (the
 *   fields the HTTP rules read: validators, Range, Cache-Control, Cookie...), a Host the proxy
 *   has already validated and routed (`hosts`, which the proxy fills), a URL without stored
 *   variants, and a stored entry that is fresh with no request directives, carries no
 *   `no-cache`, and whose head the proxy has rendered from its current fields
 *   (`ServedEntry.rendered`, whose third item is the `headers` it was rendered from).
 * - A hit is found and counted as CacheEngine.fresh_plain and CacheEngine.served find and
 *   count it: the entry by its key's hash and its key, its age as Entry.age computes it, and
 *   requests, hits, hit_bytes, bytes_served, the index's touch and record_hit, and the
 *   admission's observe when it observes.
 * - answer_bytes reads a request from its bytes only when they begin with one whole plain
 *   request (parse_plain): a strict subset of what aiohttp's request parser (llhttp, strict)
 *   takes, read as it reads it (method, target, fields, one Host, no body, keep-alive), so
 *   the same request gets the same answer either way. Anything else it leaves to that
 *   parser, counting nothing: it never refuses a request itself.
 * - Per hit only Cache-Status's ttl, Age (and Date when the origin sent none) are formatted;
 *   a body under `join_below` bytes goes out in one bytes object with the head, a larger one
 *   as its own object, never copied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <strings.h>

typedef struct {
    PyObject_HEAD
    PyObject *entries;  /* dict: hash64(key)[0] -> Entry */
    PyObject *vary;     /* dict: URL -> its variants */
    PyObject *index;    /* StoreIndex */
    PyObject *counters; /* the engine's Counters */
    PyObject *observe;  /* the admission's observe, or None */
    PyObject *hash;     /* hash64 */
    PyObject *clock;    /* seconds since the epoch, as the proxy reads them */
    PyObject *date;     /* the current IMF-fixdate, as aiohttp writes Date */
    PyObject *hosts;    /* dict: a Host field's bytes -> the cache key up to its path */
    PyObject *declined; /* tuple of lower-case field names (bytes) */
    PyObject *per_hit;  /* bytes: Cache-Status up to its ttl value */
    Py_ssize_t max_url;
    Py_ssize_t max_headers;
    Py_ssize_t join_below;
    unsigned long long answered;
} PlainHits;

/* An attribute, read and written straight in its slot when the object's type keeps it in one
 * (a __slots__ member, a Cython object field), else through getattr and setattr. Looking
 * attributes up by name was most of this path's time. */
typedef struct {
    const char *text;
    PyObject *name;
    PyTypeObject *type; /* the type last seen, or NULL */
    Py_ssize_t offset;  /* where that type keeps the attribute, or -1: not in a slot */
    int writable;
} Attr;

enum {
    A_METHOD, A_VERSION, A_SHOULD_CLOSE, A_UPGRADE, A_CHUNKED, A_PATH, A_RAW_HEADERS,
    A_KEY, A_INITIAL_AGE, A_STORED_AT, A_LIFETIME, A_DIRECTIVES, A_RENDERED, A_HEADERS,
    A_STATUS, A_PAYLOAD, A_SIZE, A_REQUESTS, A_HITS, A_HIT_BYTES, A_BYTES_SERVED, A_COUNT
};

static Attr attrs[A_COUNT] = {
    {"method"}, {"version"}, {"should_close"}, {"upgrade"}, {"chunked"}, {"path"},
    {"raw_headers"}, {"key"}, {"initial_age"}, {"stored_at"}, {"lifetime"}, {"directives"},
    {"rendered"}, {"headers"}, {"status"}, {"payload"}, {"size"}, {"requests"}, {"hits"}, {"hit_bytes"},
    {"bytes_served"},
};

static PyObject *s_touch, *s_record_hit, *s_no_cache;

/* The slot of a's member in obj, or NULL when obj's type keeps a elsewhere. */
static PyObject **slot(PyObject *obj, Attr *a) {
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
static PyObject *get(PyObject *obj, Attr *a) {
    PyObject **at = slot(obj, a);
    if (at != NULL && *at != NULL)
        return Py_NewRef(*at);
    return PyObject_GetAttr(obj, a->name);
}

/* obj.a = value; -1 with an exception set when it cannot be. */
static int set(PyObject *obj, Attr *a, PyObject *value) {
    PyObject **at = slot(obj, a);
    if (at == NULL || !a->writable)
        return PyObject_SetAttr(obj, a->name, value);
    Py_XSETREF(*at, Py_NewRef(value));
    return 0;
}

static int PlainHits_traverse(PlainHits *self, visitproc visit, void *arg) {
    Py_VISIT(self->entries);
    Py_VISIT(self->vary);
    Py_VISIT(self->index);
    Py_VISIT(self->counters);
    Py_VISIT(self->observe);
    Py_VISIT(self->hash);
    Py_VISIT(self->clock);
    Py_VISIT(self->date);
    Py_VISIT(self->hosts);
    Py_VISIT(self->declined);
    Py_VISIT(self->per_hit);
    return 0;
}

static int PlainHits_clear(PlainHits *self) {
    Py_CLEAR(self->entries);
    Py_CLEAR(self->vary);
    Py_CLEAR(self->index);
    Py_CLEAR(self->counters);
    Py_CLEAR(self->observe);
    Py_CLEAR(self->hash);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->date);
    Py_CLEAR(self->hosts);
    Py_CLEAR(self->declined);
    Py_CLEAR(self->per_hit);
    return 0;
}

static void PlainHits_dealloc(PlainHits *self) {
    PyObject_GC_UnTrack(self);
    PlainHits_clear(self);
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
    self->max_url = max_url;
    self->max_headers = max_headers;
    self->join_below = join_below;
    return 0;
}

/* 1 true, 0 false, -1 error: the truth of obj.a. */
static int attr_true(PyObject *obj, Attr *a) {
    PyObject *value = get(obj, a);
    if (value == NULL)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* obj.a as a double; -1 with an exception set when it is not a number. */
static int attr_double(PyObject *obj, Attr *a, double *out) {
    PyObject *value = get(obj, a);
    if (value == NULL)
        return -1;
    *out = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* obj.a += delta. */
static int attr_add(PyObject *obj, Attr *a, PyObject *delta) {
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

/* 1 when a request's fields keep it off this path (a declined name, too many bytes, no Host),
 * 0 with *host the first Host value, -1 error. */
static int scan_fields(PlainHits *self, PyObject *raw, PyObject **host) {
    if (!PyTuple_Check(raw))
        return 1;
    Py_ssize_t count = PyTuple_GET_SIZE(raw), size = 4 * count;
    PyObject *declined = self->declined;
    Py_ssize_t ndeclined = PyTuple_GET_SIZE(declined);
    *host = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *field = PyTuple_GET_ITEM(raw, i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 2)
            return 1;
        PyObject *name = PyTuple_GET_ITEM(field, 0), *value = PyTuple_GET_ITEM(field, 1);
        if (!PyBytes_Check(name) || !PyBytes_Check(value))
            return 1;
        Py_ssize_t len = PyBytes_GET_SIZE(name);
        const char *text = PyBytes_AS_STRING(name);
        size += len + PyBytes_GET_SIZE(value);
        if (len == 4 && strncasecmp(text, "host", 4) == 0) {
            if (*host == NULL)
                *host = value;
            continue;
        }
        for (Py_ssize_t j = 0; j < ndeclined; j++) {
            PyObject *rule = PyTuple_GET_ITEM(declined, j);
            if (PyBytes_GET_SIZE(rule) == len && strncasecmp(PyBytes_AS_STRING(rule), text, len) == 0)
                return 1;
        }
    }
    return (size > self->max_headers || *host == NULL) ? 1 : 0;
}

/* 1 when the request is a plain GET or HEAD (*head set for HEAD) with an origin-form path within
 * the limit (*path, a new reference), 0 when it is not, -1 error. */
static int plain_request(PlainHits *self, PyObject *msg, int *head, PyObject **path) {
    PyObject *method = get(msg, &attrs[A_METHOD]);
    if (method == NULL)
        return -1;
    int plain = PyUnicode_Check(method);
    if (plain) {
        *head = PyUnicode_CompareWithASCIIString(method, "HEAD") == 0;
        plain = *head || PyUnicode_CompareWithASCIIString(method, "GET") == 0;
    }
    Py_DECREF(method);
    if (!plain)
        return 0;
    PyObject *version = get(msg, &attrs[A_VERSION]);
    if (version == NULL)
        return -1;
    plain = PyTuple_Check(version) && PyTuple_GET_SIZE(version) == 2 &&
            PyLong_CheckExact(PyTuple_GET_ITEM(version, 0)) &&
            PyLong_CheckExact(PyTuple_GET_ITEM(version, 1)) &&
            PyLong_AsLong(PyTuple_GET_ITEM(version, 0)) == 1 &&
            PyLong_AsLong(PyTuple_GET_ITEM(version, 1)) == 1;
    Py_DECREF(version);
    if (!plain)
        return PyErr_Occurred() ? -1 : 0;
    for (int i = A_SHOULD_CLOSE; i <= A_CHUNKED; i++) {
        int flag = attr_true(msg, &attrs[i]);
        if (flag != 0)
            return flag < 0 ? -1 : 0;
    }
    *path = get(msg, &attrs[A_PATH]);
    if (*path == NULL)
        return -1;
    Py_ssize_t len = PyUnicode_Check(*path) ? PyUnicode_GET_LENGTH(*path) : 0;
    if (len == 0 || len > self->max_url || PyUnicode_READ_CHAR(*path, 0) != '/') {
        Py_CLEAR(*path);
        return 0;
    }
    return 1;
}

/* The stored entry for key when it answers a plain request fresh at now (a new reference;
 * *hash is its key hash, a new reference, *age and *lifetime its own), or NULL: declined
 * (*absent is 1 when nothing is stored under the key's hash), or an error with an exception
 * set. */
static PyObject *fresh_entry(PlainHits *self, PyObject *key, double now, double *age,
                             double *lifetime, PyObject **hash, int *absent) {
    if (PyDict_GET_SIZE(self->vary)) {
        int varies = PyDict_Contains(self->vary, key);
        if (varies != 0)
            return NULL;
    }
    PyObject *hashes = PyObject_CallOneArg(self->hash, key);
    if (hashes == NULL)
        return NULL;
    if (!PyTuple_Check(hashes) || PyTuple_GET_SIZE(hashes) < 1) {
        Py_DECREF(hashes);
        PyErr_SetString(PyExc_TypeError, "hash returns a tuple");
        return NULL;
    }
    *hash = Py_NewRef(PyTuple_GET_ITEM(hashes, 0));
    Py_DECREF(hashes);
    PyObject *entry = Py_XNewRef(PyDict_GetItemWithError(self->entries, *hash));
    if (entry == NULL) {
        *absent = !PyErr_Occurred();
        goto decline;
    }
    PyObject *stored_key = get(entry, &attrs[A_KEY]);
    if (stored_key == NULL)
        goto decline;
    int same = PyUnicode_Check(stored_key) && PyUnicode_Compare(stored_key, key) == 0;
    Py_DECREF(stored_key);
    if (!same)
        goto decline;
    double initial_age, stored_at;
    if (attr_double(entry, &attrs[A_INITIAL_AGE], &initial_age) < 0 ||
        attr_double(entry, &attrs[A_STORED_AT], &stored_at) < 0 ||
        attr_double(entry, &attrs[A_LIFETIME], lifetime) < 0)
        goto decline;
    double resident = now - stored_at;
    *age = initial_age + (resident > 0.0 ? resident : 0.0);
    if (!(*age < *lifetime) || !isfinite(*lifetime - *age))
        goto decline;
    PyObject *directives = get(entry, &attrs[A_DIRECTIVES]);
    if (directives == NULL)
        goto decline;
    int no_cache = PySequence_Contains(directives, s_no_cache);
    Py_DECREF(directives);
    if (no_cache != 0)
        goto decline;
    return entry;
decline:
    Py_XDECREF(entry);
    Py_CLEAR(*hash);
    return NULL;
}

/* Count a hit on entry as CacheEngine.served does; -1 on error. */
static int count_hit(PlainHits *self, PyObject *key, PyObject *entry, PyObject *hash,
                     PyObject *now) {
    PyObject *one = PyLong_FromLong(1), *size = get(entry, &attrs[A_SIZE]);
    int rc = -1;
    if (one == NULL || size == NULL)
        goto done;
    if (attr_add(self->counters, &attrs[A_REQUESTS], one) < 0)
        goto done;
    if (PyDict_GetItemWithError(self->entries, hash) == entry) {
        PyObject *r = PyObject_CallMethodOneArg(self->index, s_touch, hash);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    } else if (PyErr_Occurred())
        goto done;
    if (self->observe != Py_None) {
        PyObject *args[] = {key, size, now};
        PyObject *r = PyObject_Vectorcall(self->observe, args, 3, NULL);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if (attr_add(self->counters, &attrs[A_HITS], one) < 0 ||
        attr_add(self->counters, &attrs[A_HIT_BYTES], size) < 0 ||
        attr_add(self->counters, &attrs[A_BYTES_SERVED], size) < 0)
        goto done;
    if (PyDict_GetItemWithError(self->entries, hash) == entry) {
        PyObject *r = PyObject_CallMethodOneArg(self->index, s_record_hit, hash);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    } else if (PyErr_Occurred())
        goto done;
    self->answered++;
    rc = 0;
done:
    Py_XDECREF(one);
    Py_XDECREF(size);
    return rc;
}

/* Writes n in decimal at out (at most 20 bytes); returns how many. */
static Py_ssize_t decimal(char *out, long long n) {
    char digits[20];
    unsigned long long u = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
    Py_ssize_t len = 0, at = 0;
    do {
        digits[len++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (n < 0)
        out[at++] = '-';
    while (len)
        out[at++] = digits[--len];
    return at;
}

/* The answer's bytes: head, the per-hit fields, the blank line, and the body when it is
 * joined. */
static PyObject *render(PlainHits *self, PyObject *rendered, PyObject *body, int head,
                        long long ttl, long long age, PyObject *status) {
    PyObject *fixed = PyTuple_GET_ITEM(rendered, 0);
    int dated = PyObject_IsTrue(PyTuple_GET_ITEM(rendered, 1));
    if (dated < 0)
        return NULL;
    char numbers[64];
    Py_ssize_t nlen = decimal(numbers, ttl);
    memcpy(numbers + nlen, "\r\nAge: ", 7);
    nlen += 7;
    nlen += decimal(numbers + nlen, age);
    memcpy(numbers + nlen, "\r\n", 2);
    nlen += 2;
    PyObject *date = NULL;
    const char *date_text = "";
    Py_ssize_t date_len = 0;
    if (!dated) {
        date = PyObject_CallNoArgs(self->date);
        if (date == NULL)
            return NULL;
        date_text = PyUnicode_Check(date) ? PyUnicode_AsUTF8AndSize(date, &date_len) : NULL;
        if (date_text == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "date returns a str");
            Py_DECREF(date);
            return NULL;
        }
    }
    Py_ssize_t body_len = head ? 0 : PyBytes_GET_SIZE(body);
    int join = !head && body_len < self->join_below;
    const char *parts[] = {PyBytes_AS_STRING(fixed),
                           PyBytes_AS_STRING(self->per_hit),
                           numbers,
                           dated ? "" : "Date: ",
                           date_text,
                           dated ? "" : "\r\n",
                           "\r\n",
                           join ? PyBytes_AS_STRING(body) : ""};
    Py_ssize_t lens[] = {PyBytes_GET_SIZE(fixed),
                         PyBytes_GET_SIZE(self->per_hit),
                         nlen,
                         dated ? 0 : 6,
                         date_len,
                         dated ? 0 : 2,
                         2,
                         join ? body_len : 0};
    Py_ssize_t total = 0;
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        total += lens[i];
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out != NULL) {
        char *at = PyBytes_AS_STRING(out);
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            memcpy(at, parts[i], lens[i]);
            at += lens[i];
        }
    }
    Py_XDECREF(date);
    if (out == NULL)
        return NULL;
    PyObject *rest = join || head ? PyBytes_FromStringAndSize(NULL, 0) : Py_NewRef(body);
    if (rest == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *answer = PyTuple_Pack(3, out, rest, status);
    Py_DECREF(out);
    Py_DECREF(rest);
    return answer;
}

/* The answer to a plain GET (head: HEAD) of path under the Host field's bytes host: as
 * PlainHits.answer describes it. */
static PyObject *answer_key(PlainHits *self, PyObject *host, PyObject *path, int head) {
    PyObject *key = NULL, *hash = NULL, *entry = NULL, *now_obj = NULL, *rendered = NULL,
             *headers = NULL, *body = NULL, *status = NULL, *result = NULL;
    PyObject *origin = PyDict_GetItemWithError(self->hosts, host);
    if (origin == NULL)
        goto done;
    key = PyUnicode_Concat(origin, path);
    if (key == NULL)
        goto done;
    now_obj = PyObject_CallNoArgs(self->clock);
    if (now_obj == NULL)
        goto done;
    double now = PyFloat_AsDouble(now_obj), age = 0.0, lifetime = 0.0;
    if (now == -1.0 && PyErr_Occurred())
        goto done;
    int absent = 0;
    entry = fresh_entry(self, key, now, &age, &lifetime, &hash, &absent);
    if (entry == NULL) {
        /* Nothing stored: answer_hit, which finds entries the same way, would decline too. */
        if (absent)
            result = Py_NewRef(Py_False);
        goto done;
    }
    rendered = get(entry, &attrs[A_RENDERED]);
    if (rendered == NULL)
        PyErr_Clear(); /* an Entry a driver did not make keeps no rendered head: declined */
    headers = rendered ? get(entry, &attrs[A_HEADERS]) : NULL;
    body = headers ? get(entry, &attrs[A_PAYLOAD]) : NULL;
    status = body ? get(entry, &attrs[A_STATUS]) : NULL;
    /* Rendered from the entry's current fields: a refresh gives it new ones. */
    if (status == NULL || !PyTuple_Check(rendered) || PyTuple_GET_SIZE(rendered) != 3 ||
        !PyBytes_Check(PyTuple_GET_ITEM(rendered, 0)) ||
        PyTuple_GET_ITEM(rendered, 2) != headers || !PyBytes_Check(body))
        goto done;
    if (count_hit(self, key, entry, hash, now_obj) < 0)
        goto done;
    result = render(self, rendered, body, head, (long long)(lifetime - age), (long long)age,
                    status);
done:
    Py_XDECREF(key);
    Py_XDECREF(hash);
    Py_XDECREF(entry);
    Py_XDECREF(now_obj);
    Py_XDECREF(rendered);
    Py_XDECREF(headers);
    Py_XDECREF(body);
    Py_XDECREF(status);
    if (result == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return result;
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

/* Bytes a target, a field name and a field value may hold in a request parse_plain takes: of
 * the target, RFC 3986 pchar, "/" and "?" (no fragment, no space, nothing escaped beyond
 * "%"); of a name, tchar; of a value, visible ASCII, space and tab. */
static unsigned char target_byte[256], name_byte[256], value_byte[256];

static void init_tables(void) {
    const char *target = "-._~!$&'()*+,;=:@/?%", *name = "!#$%&'*+-.^_`|~";
    for (int c = 0; c < 256; c++) {
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        target_byte[c] = alnum || (c && strchr(target, c) != NULL);
        name_byte[c] = alnum || (c && strchr(name, c) != NULL);
        value_byte[c] = (c >= 0x21 && c <= 0x7e) || c == ' ' || c == '\t';
    }
}

/* What parse_plain found of one request. */
typedef struct {
    Py_ssize_t end;       /* offset just past its blank line */
    int head;             /* HEAD, not GET */
    int declined;         /* it carries a field of PlainHits.declined */
    const char *path, *host;
    Py_ssize_t path_len, host_len;
} RawRequest;

#define MAX_RAW_FIELDS 100

/* Fields aiohttp's request parser allows once (its SINGLETON_HEADERS, less Host,
 * Content-Length and Transfer-Encoding, which parse_plain judges itself): a bit each. */
static const struct {
    const char *name;
    Py_ssize_t len;
} singletons[] = {
    {"content-location", 16}, {"content-range", 13}, {"content-type", 12}, {"etag", 4},
    {"max-forwards", 12},     {"server", 6},         {"user-agent", 10},
};

static int singleton_bit(const char *name, Py_ssize_t len) {
    for (size_t i = 0; i < sizeof singletons / sizeof singletons[0]; i++)
        if (len == singletons[i].len && strncasecmp(name, singletons[i].name, len) == 0)
            return 1 << i;
    return 0;
}

/* 1 when data[start:] begins with one whole plain request, filling *r; 0 when it does not:
 * whatever else (a request in part, or in any other form) is aiohttp's parser's to judge.
 *
 * Plain: `GET` or `HEAD`, one space, an origin-form target of target_byte within max_url, one
 * space, `HTTP/1.1`, CRLF; then at most MAX_RAW_FIELDS fields, each a name of name_byte, a
 * colon, optional spaces or tabs, a value of value_byte (trailing spaces and tabs are not its
 * own, as llhttp and aiohttp trim them) and CRLF, within max_headers bytes as scan_fields
 * counts them; then CRLF. Exactly one Host; no Content-Length, Transfer-Encoding, Upgrade,
 * Expect, Proxy-Connection, or Connection but `keep-alive`; none of the singletons twice.
 * Every such request is one that aiohttp's strict parser (llhttp, as aiohttp runs it for
 * requests) takes whole, with these very fields, as a GET or HEAD with no body that keeps
 * the connection open. */
static int parse_plain(PlainHits *self, const char *data, Py_ssize_t size, Py_ssize_t start,
                       RawRequest *r) {
    const char *p = data + start, *end = data + size;
    if (end - p >= 4 && memcmp(p, "GET ", 4) == 0) {
        r->head = 0;
        p += 4;
    } else if (end - p >= 5 && memcmp(p, "HEAD ", 5) == 0) {
        r->head = 1;
        p += 5;
    } else
        return 0;
    r->path = p;
    if (p == end || *p != '/')
        return 0;
    while (p < end && target_byte[(unsigned char)*p])
        p++;
    r->path_len = p - r->path;
    if (r->path_len > self->max_url || end - p < 11 || memcmp(p, " HTTP/1.1\r\n", 11) != 0)
        return 0;
    p += 11;
    Py_ssize_t fields = 0, counted = 0;
    int seen = 0;
    Py_ssize_t ndeclined = PyTuple_GET_SIZE(self->declined);
    r->host = NULL;
    r->declined = 0;
    for (;;) {
        if (end - p < 2)
            return 0;
        if (p[0] == '\r' && p[1] == '\n')
            break;
        const char *name = p;
        while (p < end && name_byte[(unsigned char)*p])
            p++;
        Py_ssize_t name_len = p - name;
        if (name_len == 0 || p == end || *p != ':')
            return 0;
        p++;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *value = p;
        while (p < end && value_byte[(unsigned char)*p])
            p++;
        const char *value_end = p;
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t'))
            value_end--;
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            return 0;
        p += 2;
        Py_ssize_t value_len = value_end - value;
        if (++fields > MAX_RAW_FIELDS)
            return 0;
        counted += 4 + name_len + value_len;
        if (counted > self->max_headers)
            return 0;
        if (name_len == 4 && strncasecmp(name, "host", 4) == 0) {
            if (r->host != NULL)
                return 0;
            r->host = value;
            r->host_len = value_len;
            continue;
        }
        if ((name_len == 14 && strncasecmp(name, "content-length", 14) == 0) ||
            (name_len == 17 && strncasecmp(name, "transfer-encoding", 17) == 0) ||
            (name_len == 7 && strncasecmp(name, "upgrade", 7) == 0) ||
            (name_len == 6 && strncasecmp(name, "expect", 6) == 0))
            return 0;
        if (name_len == 10 && strncasecmp(name, "connection", 10) == 0) {
            if (value_len != 10 || strncasecmp(value, "keep-alive", 10) != 0)
                return 0;
            continue;
        }
        /* llhttp reads Proxy-Connection as Connection: the parser's to judge. */
        if (name_len == 16 && strncasecmp(name, "proxy-connection", 16) == 0)
            return 0;
        int singleton = singleton_bit(name, name_len);
        if (singleton & seen)
            return 0; /* a second one: aiohttp's parser refuses the request (400) */
        seen |= singleton;
        for (Py_ssize_t j = 0; j < ndeclined && !r->declined; j++) {
            PyObject *rule = PyTuple_GET_ITEM(self->declined, j);
            r->declined = PyBytes_GET_SIZE(rule) == name_len &&
                          strncasecmp(PyBytes_AS_STRING(rule), name, name_len) == 0;
        }
    }
    if (r->host == NULL)
        return 0;
    r->end = p + 2 - data;
    return 1;
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
    {"answer", (PyCFunction)(void (*)(void))PlainHits_answer, METH_FASTCALL,
     "answer(message, *ignored) -> (bytes, body or b'', status) | False | None\n\n"
     "The whole answer to a plain fresh hit, counted; False, nothing counted, for a plain\n"
     "request whose URL has nothing stored (no answerer can answer it as a hit); None,\n"
     "nothing counted, otherwise."},
    {"answer_bytes", (PyCFunction)(void (*)(void))PlainHits_answer_bytes, METH_FASTCALL,
     "answer_bytes(data, start) -> (end, bytes, body or b'', status) | (end, False) |\n"
     "    (end, None) | None\n\n"
     "answer() for the request at data[start:] as its bytes came, when they begin with one\n"
     "whole plain request (see parse_plain), which ends at data[end]: its answer, or False or\n"
     "None as answer() gives them (None too when it carries a declined field). None alone,\n"
     "nothing counted, when data[start:] is anything else: aiohttp's parser is to read it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PlainHits_getset[] = {
    {"answered", (getter)PlainHits_get_answered, NULL, "hits answered here", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlainHitsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy._hits.PlainHits",
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
};

static struct PyModuleDef hits_module = {
    PyModuleDef_HEAD_INIT, "proxy._hits", "The proxy's plain fresh hit, compiled.", -1, NULL,
};

PyMODINIT_FUNC PyInit__hits(void) {
    init_tables();
    for (int i = 0; i < A_COUNT; i++) {
        attrs[i].name = PyUnicode_InternFromString(attrs[i].text);
        if (attrs[i].name == NULL)
            return NULL;
    }
    s_touch = PyUnicode_InternFromString("touch");
    s_record_hit = PyUnicode_InternFromString("record_hit");
    s_no_cache = PyUnicode_InternFromString("no-cache");
    if (s_touch == NULL || s_record_hit == NULL || s_no_cache == NULL)
        return NULL;
    if (PyType_Ready(&PlainHitsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&hits_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "PlainHits", (PyObject *)&PlainHitsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
