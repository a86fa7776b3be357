/* The caching rules of an origin response, compiled for the common case (see
 * proxy.core.rfc9111.response_rules, which calls common_case first).
 *
 * Rules this module keeps:
 *
 * - common_case answers exactly what the Python rules answer, or None when it cannot be sure:
 *   then the Python rules decide. Every miss the proxy stores or relays asks these rules once.
 * - It decides only messages in the common shape: a request without Cookie, Authorization or
 *   Cache-Control; a response without Age, Set-Cookie or CDN-Cache-Control; Cache-Control and
 *   Vary values of printable ASCII (tab allowed) without quotes; Date, Expires and
 *   Last-Modified in IMF-fixdate form (RFC 9110 section 5.6.7). Anything else is None.
 * - Names and values compare as the Python rules compare them: names lower-cased, values
 *   trimmed of spaces and tabs (the only whitespace a common-shape value can hold).
 * - The status sets are rfc9111's HEURISTICALLY_CACHEABLE and UNDERSTOOD_STATUSES;
 *   tests/test_response_rules.py checks every status against the Python rules.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define DELTA_SECONDS_CAP 2147483648LL
#define HEURISTIC_FRACTION 0.1
#define HEURISTIC_CAP 86400.0

static PyObject *s_cookie, *s_authorization, *s_cache_control, *s_cdn_cache_control,
    *s_set_cookie, *s_set_cookie2, *s_age, *s_vary, *s_date, *s_expires, *s_last_modified,
    *s_max_age, *s_s_maxage, *s_public, *s_private, *s_no_store, *s_must_understand, *s_empty,
    *s_method, *s_partial, *s_status, *s_vary_star;

/* RFC 9110 section 15.1. */
static int heuristically_cacheable(long status) {
    switch (status) {
    case 200: case 203: case 204: case 206: case 300: case 301: case 308:
    case 404: case 405: case 410: case 414: case 501:
        return 1;
    default:
        return 0;
    }
}

static int understood(long status) {
    return (heuristically_cacheable(status) && status != 206) || status == 302 ||
           status == 303 || status == 307;
}

/* A value's characters when it is in the common shape (printable ASCII or tab, and no double
 * quote when quotes are refused); NULL otherwise. */
static const char *plain(PyObject *value, Py_ssize_t *size, int refuse_quotes) {
    if (!PyUnicode_CheckExact(value) || !PyUnicode_IS_ASCII(value))
        return NULL;
    const char *text = (const char *)PyUnicode_1BYTE_DATA(value);
    Py_ssize_t n = PyUnicode_GET_LENGTH(value);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f || (refuse_quotes && c == '"'))
            return NULL;
    }
    *size = n;
    return text;
}

static void trim(const char **start, const char **end) {
    while (*start < *end && (**start == ' ' || **start == '\t'))
        (*start)++;
    while (*end > *start && ((*end)[-1] == ' ' || (*end)[-1] == '\t'))
        (*end)--;
}

static PyObject *lowered(const char *start, const char *end) {
    PyObject *out = PyUnicode_New(end - start, 127);
    if (out == NULL)
        return NULL;
    char *data = (char *)PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t i = 0; i < end - start; i++) {
        char c = start[i];
        data[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    return out;
}

/* The values of a field, a list of str as rfc9111.Fields indexes them; NULL when absent. */
static PyObject *values_of(PyObject *by_name, PyObject *name) {
    PyObject *values = PyDict_GetItemWithError(by_name, name);
    if (values != NULL && (!PyList_CheckExact(values) || PyList_GET_SIZE(values) == 0))
        return NULL;
    return values;
}

/* Calls visit on each comma-separated member of a field's values, as str.split(",") splits
 * each value; 1 done, 0 a value not in the common shape (quotes refused), -1 visit's error. */
static int each_member(PyObject *values, int (*visit)(const char *, const char *, void *),
                       void *context) {
    Py_ssize_t count = values == NULL ? 0 : PyList_GET_SIZE(values);
    for (Py_ssize_t v = 0; v < count; v++) {
        Py_ssize_t n;
        const char *text = plain(PyList_GET_ITEM(values, v), &n, 1);
        if (text == NULL)
            return 0;
        const char *end = text + n;
        for (const char *item = text; item <= end;) {
            const char *stop = memchr(item, ',', end - item);
            if (stop == NULL)
                stop = end;
            if (visit(item, stop, context) < 0)
                return -1;
            item = stop + 1;
        }
    }
    return 1;
}

/* One Cache-Control member into the directives, as rfc9111.parse_directives reads it. */
static int add_directive(const char *item, const char *stop, void *directives) {
    const char *eq = memchr(item, '=', stop - item);
    const char *name = item, *name_end = eq != NULL ? eq : stop;
    trim(&name, &name_end);
    if (name == name_end)
        return 0;
    PyObject *key = lowered(name, name_end);
    if (key == NULL)
        return -1;
    int seen = PyDict_Contains(directives, key);
    if (seen != 0) {
        Py_DECREF(key);
        return seen < 0 ? -1 : 0;
    }
    PyObject *arg;
    if (eq != NULL) {
        const char *arg_start = eq + 1, *arg_end = stop;
        trim(&arg_start, &arg_end);
        arg = PyUnicode_FromStringAndSize(arg_start, arg_end - arg_start);
    } else {
        arg = Py_NewRef(Py_None);
    }
    int failed = arg == NULL ? -1 : PyDict_SetItem(directives, key, arg);
    Py_DECREF(key);
    Py_XDECREF(arg);
    return failed;
}

/* rfc9111.delta_seconds of a directive's value: -1 when absent or not delta-seconds. */
static long long delta_seconds(PyObject *directives, PyObject *name) {
    PyObject *value = PyDict_GetItemWithError(directives, name);
    if (value == NULL || value == Py_None)
        return -1;
    const char *text = (const char *)PyUnicode_1BYTE_DATA(value);
    Py_ssize_t n = PyUnicode_GET_LENGTH(value);
    if (n == 0)
        return -1;
    long long seconds = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -1;
        if (seconds < DELTA_SECONDS_CAP)
            seconds = seconds * 10 + (text[i] - '0');
    }
    return seconds < DELTA_SECONDS_CAP ? seconds : DELTA_SECONDS_CAP;
}

/* Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's days_from_civil); a day
 * past its month's end runs into the next, as calendar.timegm counts it. */
static long long days_from_civil(long long y, unsigned m, unsigned d) {
    y -= m <= 2;
    const long long era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

static int digits(const char *p, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10 + (p[i] - '0');
    }
    *out = v;
    return 1;
}

static int alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

static int same_caseless(const char *p, const char *word, int n) {
    for (int i = 0; i < n; i++)
        if ((p[i] | 0x20) != word[i])
            return 0;
    return 1;
}

/* The first value of a date field as rfc9111.http_date gives it: 1 with *when set, 0 when the
 * field is absent (*when untouched), -1 when it is not an IMF-fixdate this code is sure of. */
static int imf_date(PyObject *by_name, PyObject *name, double *when) {
    PyObject *values = values_of(by_name, name);
    if (values == NULL)
        return PyErr_Occurred() ? -2 : 0;
    Py_ssize_t n;
    const char *start = plain(PyList_GET_ITEM(values, 0), &n, 0);
    if (start == NULL)
        return -1;
    const char *end = start + n;
    trim(&start, &end);
    /* "Sun, 06 Nov 1994 08:49:37 GMT" */
    static const char months[] = "janfebmaraprmayjunjulaugsepoctnovdec";
    const char *p = start;
    int day, year, hh, mm, ss;
    if (end - start != 29 || !alpha(p[0]) || !alpha(p[1]) || !alpha(p[2]) || p[3] != ',' ||
        p[4] != ' ' || !digits(p + 5, 2, &day) || p[7] != ' ' || p[11] != ' ' ||
        !digits(p + 12, 4, &year) || p[16] != ' ' || !digits(p + 17, 2, &hh) || p[19] != ':' ||
        !digits(p + 20, 2, &mm) || p[22] != ':' || !digits(p + 23, 2, &ss) || p[25] != ' ' ||
        !same_caseless(p + 26, "gmt", 3))
        return -1;
    int month = 0;
    for (int i = 0; i < 12 && month == 0; i++)
        if (alpha(p[8]) && alpha(p[9]) && alpha(p[10]) && same_caseless(p + 8, months + 3 * i, 3))
            month = i + 1;
    if (month == 0 || year == 0 || day < 1 || day > 31 || hh >= 24 || mm >= 60 || ss >= 61)
        return -1;
    long long days = days_from_civil(year, (unsigned)month, 1) + day - 1;
    *when = (double)(days * 86400 + hh * 3600 + mm * 60 + ss);
    return 1;
}

typedef struct {
    PyObject *names;
    int star;
} VaryNames;

/* One Vary member into the names, lower-cased; a "*" noted. */
static int add_vary_name(const char *name, const char *name_end, void *context) {
    VaryNames *vary = context;
    trim(&name, &name_end);
    if (name == name_end)
        return 0;
    if (name_end - name == 1 && *name == '*')
        vary->star = 1;
    PyObject *key = lowered(name, name_end);
    int failed = key == NULL ? -1 : PySet_Add(vary->names, key);
    Py_XDECREF(key);
    return failed;
}

/* rfc9111.vary_names, and whether a member is "*": 1 done, 0 not in the common shape. */
static int vary(PyObject *values, PyObject **names, int *star) {
    VaryNames found = {PySet_New(NULL), 0};
    if (found.names == NULL)
        return -1;
    int shape = each_member(values, add_vary_name, &found);
    if (shape != 1) {
        Py_DECREF(found.names);
        return shape;
    }
    *star = found.star;
    PyObject *sorted = PySequence_List(found.names);
    Py_DECREF(found.names);
    if (sorted == NULL || PyList_Sort(sorted) < 0) {
        Py_XDECREF(sorted);
        return -1;
    }
    *names = PyList_AsTuple(sorted);
    Py_DECREF(sorted);
    return *names == NULL ? -1 : 1;
}

static int present(PyObject *by_name, PyObject *name) { return PyDict_Contains(by_name, name); }

static PyObject *common_case(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1]) ||
        !PyDict_CheckExact(args[2]) || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "common_case(method, status, request_by_name, response_by_name, "
                        "request_time, response_time)");
        return NULL;
    }
    PyObject *request = args[2], *response = args[3];
    long status = PyLong_AsLong(args[1]);
    double request_time = PyFloat_AsDouble(args[4]);
    double response_time = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *refused[] = {s_cookie, s_authorization, s_cache_control};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        int found = present(request, refused[i]);
        if (found)
            return found < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *uncommon[] = {s_age, s_set_cookie, s_set_cookie2, s_cdn_cache_control};
    for (size_t i = 0; i < sizeof uncommon / sizeof *uncommon; i++) {
        int found = present(response, uncommon[i]);
        if (found)
            return found < 0 ? NULL : Py_NewRef(Py_None);
    }
    double date = 0, expires = 0, modified = 0;
    int has_date = imf_date(response, s_date, &date);
    int has_expires = imf_date(response, s_expires, &expires);
    int has_modified = imf_date(response, s_last_modified, &modified);
    if (has_date == -2 || has_expires == -2 || has_modified == -2)
        return NULL;
    if (has_date < 0 || has_expires < 0 || has_modified < 0)
        return Py_NewRef(Py_None);

    PyObject *cc = PyDict_New(), *names = NULL;
    if (cc == NULL)
        return NULL;
    int star = 0;
    PyObject *cc_values = values_of(response, s_cache_control);
    if (cc_values == NULL && PyErr_Occurred())
        goto fail;
    PyObject *vary_values = values_of(response, s_vary);
    if (vary_values == NULL && PyErr_Occurred())
        goto fail;
    int shape = each_member(cc_values, add_directive, cc);
    if (shape == 1)
        shape = vary(vary_values, &names, &star);
    if (shape < 0)
        goto fail;
    if (shape == 0) {
        Py_DECREF(cc);
        return Py_NewRef(Py_None);
    }

    /* rfc9111.storable */
    int has_public = PyDict_Contains(cc, s_public);
    int must_understand = PyDict_Contains(cc, s_must_understand);
    int no_store = PyDict_Contains(cc, s_no_store);
    int has_private = PyDict_Contains(cc, s_private);
    int has_max_age = PyDict_Contains(cc, s_max_age);
    int has_s_maxage = PyDict_Contains(cc, s_s_maxage);
    long long s_maxage = delta_seconds(cc, s_s_maxage);
    long long max_age = delta_seconds(cc, s_max_age);
    if (PyErr_Occurred())
        goto fail;
    PyObject *reason = s_empty;
    if (PyUnicode_CompareWithASCIIString(args[0], "GET") != 0)
        reason = s_method;
    else if (status == 206)
        reason = s_partial;
    else if (status < 200 || status == 304 || status == 412 || status == 416)
        reason = s_status;
    else if (must_understand && !understood(status))
        reason = s_status;
    else if (!must_understand && no_store)
        reason = s_no_store;
    else if (has_private)
        reason = s_private;
    else if (star)
        reason = s_vary_star;
    else if (!(has_public || s_maxage >= 0 || max_age >= 0 || has_expires) &&
             !heuristically_cacheable(status))
        reason = s_status;

    /* rfc9111.freshness_lifetime */
    double lifetime = 0.0;
    if (s_maxage >= 0)
        lifetime = (double)s_maxage;
    else if (has_s_maxage)
        lifetime = 0.0;
    else if (max_age >= 0)
        lifetime = (double)max_age;
    else if (has_max_age)
        lifetime = 0.0;
    else {
        double origin_date = has_date ? date : response_time;
        if (has_expires)
            lifetime = expires - origin_date > 0.0 ? expires - origin_date : 0.0;
        else if ((heuristically_cacheable(status) || has_public) && has_modified &&
                 origin_date > modified) {
            double heuristic = HEURISTIC_FRACTION * (origin_date - modified);
            lifetime = heuristic < HEURISTIC_CAP ? heuristic : HEURISTIC_CAP;
        }
    }

    /* rfc9111.current_age at the response's arrival, without an Age field */
    double apparent = has_date && response_time - date > 0.0 ? response_time - date : 0.0;
    double delay = response_time - request_time > 0.0 ? response_time - request_time : 0.0;
    double initial_age = apparent > delay ? apparent : delay;

    return Py_BuildValue("(OOddNN)", reason == s_empty ? Py_True : Py_False, reason, lifetime,
                         initial_age, names, cc);
fail:
    Py_DECREF(cc);
    Py_XDECREF(names);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"common_case", (PyCFunction)(void (*)(void))common_case, METH_FASTCALL,
     "common_case(method, status, request_by_name, response_by_name, request_time, "
     "response_time): (storable, reason, lifetime, initial_age, vary, directives) as "
     "rfc9111.response_rules gives them, or None when the Python rules must decide."},
    {NULL},
};

static struct PyModuleDef rules_module = {
    PyModuleDef_HEAD_INIT, "proxy.core._response_rules",
    "An origin response's caching rules, compiled for the common case.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__response_rules(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_cookie, "cookie"}, {&s_authorization, "authorization"},
        {&s_cache_control, "cache-control"}, {&s_cdn_cache_control, "cdn-cache-control"},
        {&s_set_cookie, "set-cookie"}, {&s_set_cookie2, "set-cookie2"}, {&s_age, "age"},
        {&s_vary, "vary"}, {&s_date, "date"},
        {&s_expires, "expires"}, {&s_last_modified, "last-modified"}, {&s_max_age, "max-age"},
        {&s_s_maxage, "s-maxage"}, {&s_public, "public"}, {&s_private, "private"},
        {&s_no_store, "no-store"}, {&s_must_understand, "must-understand"}, {&s_empty, ""},
        {&s_method, "method"}, {&s_partial, "partial"}, {&s_status, "status"},
        {&s_vary_star, "vary-star"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL)
            return NULL;
    }
    return PyModule_Create(&rules_module);
}
