/* A plain fresh hit found, counted and rendered, as CacheEngine.lookup does. */
#include "hits.h"

/* The stored entry for key when it answers a plain request fresh at now (a new reference;
 * *hash is its key hash, a new reference, *age and *lifetime its own), or NULL: declined
 * (*absent is 1 when nothing is stored under the key's hash, and *hash is kept), or an error
 * with an exception set. */
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
    *age = stored_age(initial_age, stored_at, now);
    if (!answers_plain(*age, *lifetime))
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
    if (!*absent)
        Py_CLEAR(*hash);
    return NULL;
}

/* observe(key, size, now), unless observe is None; -1 on error. */
int call_observer(PyObject *observe, PyObject *key, PyObject *size, PyObject *now) {
    if (observe == Py_None)
        return 0;
    PyObject *args[] = {key, size, now};
    PyObject *r = PyObject_Vectorcall(observe, args, 3, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The what-if's record of a hit of its sample (the hit counted already): what it raises is
 * its own, reported, never the answer's (a request counted and then answered again would
 * count twice). */
void record_sampled(PlainHits *self, PyObject *key, PyObject *size, PyObject *hash,
                    PyObject *now) {
    if (self->whatif == NULL || self->whatif == Py_None)
        return;
    unsigned long long h = PyLong_AsUnsignedLongLong(hash);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_WriteUnraisable(self->whatif);
    } else if (sample_point(h, self->sample_key) < self->sample_below) {
        PyObject *args[] = {key, size, now};
        PyObject *r = PyObject_Vectorcall(self->whatif, args, 3, NULL);
        if (r == NULL)
            PyErr_WriteUnraisable(self->whatif);
        Py_XDECREF(r);
    }
}

/* Call the index's method on hash when entry is still stored under it; what it raises is
 * reported. */
static void index_call(PlainHits *self, PyObject *method, PyObject *entry, PyObject *hash) {
    PyObject *stored = PyDict_GetItemWithError(self->entries, hash);
    PyObject *r = stored == entry ? PyObject_CallMethodOneArg(self->index, method, hash) : NULL;
    if (r == NULL && PyErr_Occurred())
        PyErr_WriteUnraisable(self->index);
    Py_XDECREF(r);
}

/* Count a hit on entry as CacheEngine.lookup does; -1, nothing counted, when the objects it
 * counts with cannot be made. Once counting began, what fails (the index, an observer) is
 * reported, never the answer's: a request counted and then answered again would count
 * twice. */
static int count_hit(PlainHits *self, PyObject *key, PyObject *entry, PyObject *hash,
                     PyObject *now) {
    PyObject *one = PyLong_FromLong(1), *size = get(entry, &attrs[A_SIZE]);
    int rc = -1;
    if (one == NULL || size == NULL)
        goto done;
    rc = 0;
    if (attr_add(self->counters, &attrs[A_REQUESTS], one) < 0)
        PyErr_WriteUnraisable(self->counters);
    index_call(self, s_touch, entry, hash);
    if (call_observer(self->observe, key, size, now) < 0)
        PyErr_WriteUnraisable(self->observe);
    if (attr_add(self->counters, &attrs[A_HITS], one) < 0 ||
        attr_add(self->counters, &attrs[A_HIT_BYTES], size) < 0 ||
        attr_add(self->counters, &attrs[A_BYTES_SERVED], size) < 0)
        PyErr_WriteUnraisable(self->counters);
    index_call(self, s_record_hit, entry, hash);
    self->answered++;
    record_sampled(self, key, size, hash, now);
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

/* The answer's bytes: the fixed head, the per-hit fields (detail: what follows the ttl in
 * Cache-Status), the blank line, and the body (body_len bytes at body) when it is joined;
 * one that is not is answered as body_obj, which holds those bytes. The ttl and Age are
 * whole seconds truncated toward zero, as proxy.core.cache_status.ttl_of and int() give
 * them. */
PyObject *render(PlainHits *self, const char *fixed, Py_ssize_t fixed_len, int dated,
                 const char *detail, const char *body, Py_ssize_t body_len, PyObject *body_obj,
                 int head, double lifetime, double age, PyObject *status) {
    char numbers[96];
    Py_ssize_t nlen = decimal(numbers, (long long)(lifetime - age));
    Py_ssize_t detail_len = (Py_ssize_t)strlen(detail);
    memcpy(numbers + nlen, detail, detail_len);
    nlen += detail_len;
    memcpy(numbers + nlen, "\r\nAge: ", 7);
    nlen += 7;
    nlen += decimal(numbers + nlen, (long long)age);
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
    if (head)
        body_len = 0;
    int join = !head && body_len < self->join_below;
    const char *parts[] = {fixed,
                           PyBytes_AS_STRING(self->per_hit),
                           numbers,
                           dated ? "" : "Date: ",
                           date_text,
                           dated ? "" : "\r\n",
                           "\r\n",
                           join ? body : ""};
    Py_ssize_t lens[] = {fixed_len,
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
    PyObject *rest = join || head ? PyBytes_FromStringAndSize(NULL, 0) : Py_NewRef(body_obj);
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
PyObject *answer_key(PlainHits *self, PyObject *host, PyObject *path, int head) {
    PyObject *key = NULL, *hash = NULL, *entry = NULL, *now_obj = NULL, *rendered = NULL,
             *headers = NULL, *body = NULL, *status = NULL, *result = NULL;
    PyObject *origin = PyDict_GetItemWithError(self->hosts, host);
    if (origin == NULL)
        goto done;
    if (!self->query_as_sent &&
        PyUnicode_FindChar(path, '?', 0, PyUnicode_GET_LENGTH(path), 1) != -1)
        goto done; /* -2, an error, is raised as one */
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
        /* Nothing stored: answer_hit, which finds entries the same way, would decline too,
         * unless the disk holds the URL. */
        if (absent && self->disk_index != NULL)
            result = disk_answer(self, key, hash, now, head);
        else if (absent)
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
    int dated = PyObject_IsTrue(PyTuple_GET_ITEM(rendered, 1));
    if (dated < 0)
        goto done;
    /* Rendered first, then counted: a render that fails leaves the request to the handler,
     * which then counts it once, as it finds it. */
    PyObject *fixed = PyTuple_GET_ITEM(rendered, 0);
    result = render(self, PyBytes_AS_STRING(fixed), PyBytes_GET_SIZE(fixed), dated, "",
                    PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), body, head, lifetime, age,
                    status);
    if (result != NULL && count_hit(self, key, entry, hash, now_obj) < 0)
        Py_CLEAR(result);
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
