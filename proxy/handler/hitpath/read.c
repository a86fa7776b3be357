/* Plain requests read: from their bytes (parse_plain), or from a parsed message. */
#include "hits.h"

/* Bytes a target, a field name and a field value may hold in a request parse_plain takes: of
 * the target, RFC 3986 pchar, "/" and "?" (no fragment, no space, nothing escaped beyond
 * "%"); of a name, tchar; of a value, visible ASCII, space and tab. */
static unsigned char target_byte[256], name_byte[256], value_byte[256];

void init_tables(void) {
    const char *target = "-._~!$&'()*+,;=:@/?%", *name = "!#$%&'*+-.^_`|~";
    for (int c = 0; c < 256; c++) {
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        target_byte[c] = alnum || (c && strchr(target, c) != NULL);
        name_byte[c] = alnum || (c && strchr(name, c) != NULL);
        value_byte[c] = (c >= 0x21 && c <= 0x7e) || c == ' ' || c == '\t';
    }
}

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
int parse_plain(PlainHits *self, const char *data, Py_ssize_t size, Py_ssize_t start,
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
            (name_len == 6 && strncasecmp(name, "expect", 6) == 0) ||
            /* aiohttp's parsers refuse a hixie-76 WebSocket handshake (400): theirs to say. */
            (name_len == 18 && strncasecmp(name, "sec-websocket-key1", 18) == 0))
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

/* 1 when a request's fields keep it off this path (a declined name, too many bytes, no Host),
 * 0 with *host the first Host value, -1 error. */
int scan_fields(PlainHits *self, PyObject *raw, PyObject **host) {
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
int plain_request(PlainHits *self, PyObject *msg, int *head, PyObject **path) {
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
