/* The plain origin response, parsed whole: the common case of what aiohttp's response parser
 * (llhttp, lenient, as its client runs it) parses for the proxy's origin pool, without a
 * parser object, a callback per field, a multidict, a message tuple and a body stream.
 *
 * Rules this module keeps:
 *
 * - It parses a strict subset of what aiohttp's parser accepts, and parses it the same: the
 *   same status, reason, fields (names as sent, values without the whitespace around them,
 *   both decoded as UTF-8 with surrogateescape) and body. Anything else it declines with
 *   None, and aiohttp's parser decides: it never refuses a message itself.
 * - Plain: `HTTP/1.1`, a status from 200 to 599 with a body (not 204 or 304), a reason of
 *   visible ASCII and spaces, at most MAX_FIELDS fields within a head of at most MAX_HEAD
 *   bytes, each `token ":" OWS value OWS CRLF` with a value of visible characters, spaces and
 *   tabs (no other control byte), exactly one Content-Length of at most 15 digits, and none of
 *   the fields that change how the message is framed or whether the connection goes on
 *   (Transfer-Encoding, Connection, Proxy-Connection, Upgrade) or that aiohttp refuses
 *   (Sec-WebSocket-Key1).
 * - Whole: the head and exactly Content-Length bytes of body, nothing missing and nothing
 *   after, so the connection stands ready for the next request, as after aiohttp's parser.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <strings.h>

#define MAX_HEAD 8190
#define MAX_FIELDS 100

/* RFC 9110 section 5.6.2: tchar. */
static unsigned char is_tchar[256];

static void init_tables(void) {
    const char *extra = "!#$%&'*+-.^_`|~";
    for (int c = '0'; c <= '9'; c++)
        is_tchar[c] = 1;
    for (int c = 'a'; c <= 'z'; c++)
        is_tchar[c] = 1;
    for (int c = 'A'; c <= 'Z'; c++)
        is_tchar[c] = 1;
    for (const char *p = extra; *p; p++)
        is_tchar[(unsigned char)*p] = 1;
}

static int named(const char *name, Py_ssize_t length, const char *lower) {
    return (size_t)length == strlen(lower) && strncasecmp(name, lower, (size_t)length) == 0;
}

/* Text as aiohttp decodes it: UTF-8 with surrogateescape (plain ASCII needs no error
 * handler). */
static PyObject *text(const char *start, Py_ssize_t length, int high) {
    return high ? PyUnicode_DecodeUTF8(start, length, "surrogateescape")
                : PyUnicode_FromStringAndSize(start, length);
}

static PyObject *parse_response(PyObject *module, PyObject *arg) {
    char *data;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(arg, &data, &size) < 0)
        return NULL;
    const char *end = data + (size < MAX_HEAD ? size : MAX_HEAD);
    const char *p = data;
    if (end - p < 13 || memcmp(p, "HTTP/1.1 ", 9) != 0)
        Py_RETURN_NONE;
    p += 9;
    int status = 0;
    for (int i = 0; i < 3; i++, p++) {
        if (*p < '0' || *p > '9')
            Py_RETURN_NONE;
        status = status * 10 + (*p - '0');
    }
    if (status < 200 || status > 599 || status == 204 || status == 304 || *p != ' ')
        Py_RETURN_NONE;
    const char *reason = ++p;
    while (p < end && *p >= 0x20 && *p < 0x7f)
        p++;
    if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
        Py_RETURN_NONE;
    const char *reason_end = p;
    p += 2;

    struct {
        const char *name, *value;
        Py_ssize_t name_length, value_length;
        int high;
    } fields[MAX_FIELDS];
    int count = 0;
    long long length = -1;
    for (;;) {
        if (end - p < 2)
            Py_RETURN_NONE;
        if (p[0] == '\r') {
            if (p[1] != '\n')
                Py_RETURN_NONE;
            p += 2;
            break;
        }
        if (count == MAX_FIELDS)
            Py_RETURN_NONE;
        const char *name = p;
        while (p < end && is_tchar[(unsigned char)*p])
            p++;
        if (p == name || p == end || *p != ':')
            Py_RETURN_NONE;
        Py_ssize_t name_length = p - name;
        p++;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *value = p;
        int high = 0;
        for (; p < end; p++) {
            unsigned char c = (unsigned char)*p;
            if (c >= 0x80)
                high = 1;
            else if ((c < 0x20 && c != '\t') || c == 0x7f)
                break;
        }
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            Py_RETURN_NONE;
        const char *value_end = p;
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t'))
            value_end--;
        p += 2;
        if (named(name, name_length, "content-length")) {
            Py_ssize_t digits = value_end - value;
            if (length >= 0 || digits < 1 || digits > 15 || value_end != p - 2)
                Py_RETURN_NONE;
            length = 0;
            for (const char *d = value; d < value_end; d++) {
                if (*d < '0' || *d > '9')
                    Py_RETURN_NONE;
                length = length * 10 + (*d - '0');
            }
        } else if (named(name, name_length, "transfer-encoding") ||
                   named(name, name_length, "connection") ||
                   named(name, name_length, "proxy-connection") ||
                   named(name, name_length, "upgrade") ||
                   named(name, name_length, "sec-websocket-key1")) {
            Py_RETURN_NONE;
        }
        fields[count].name = name;
        fields[count].name_length = name_length;
        fields[count].value = value;
        fields[count].value_length = value_end - value;
        fields[count].high = high;
        count++;
    }
    Py_ssize_t head = p - data;
    if (length < 0 || size - head != length)
        Py_RETURN_NONE;

    PyObject *list = PyList_New(count);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *name = PyUnicode_FromStringAndSize(fields[i].name, fields[i].name_length);
        PyObject *value = name == NULL ? NULL
                                       : text(fields[i].value, fields[i].value_length,
                                              fields[i].high);
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, pair);
    }
    return Py_BuildValue("(is#Nn)", status, reason, reason_end - reason, list, head);
}

static PyMethodDef origin_methods[] = {
    {"parse_response", parse_response, METH_O,
     "parse_response(data: bytes) -> (status, reason, fields, head_length) | None\n\n"
     "A plain origin response that is all of ``data``, head and body: its status, reason,\n"
     "fields as (name, value) pairs in order, and where its body starts (it runs to the end\n"
     "of ``data``); None for any other bytes, which aiohttp's parser is to parse."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef origin_module = {
    PyModuleDef_HEAD_INIT, "proxy.origin._origin", "The plain origin response, parsed whole.", -1,
    origin_methods,
};

PyMODINIT_FUNC PyInit__origin(void) {
    init_tables();
    return PyModule_Create(&origin_module);
}
