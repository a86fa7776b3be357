/* The access log's lines, formatted and written in batches without the interpreter: LogLines.
 *
 * Rules this file keeps:
 *
 * - One formatter for every answer, json or combined as proxy/ops/access_log.py documents
 *   them: from the fields as the handler gives them (entry), or read from the bytes of a plain
 *   request the front answered as they came (hit), which parse_plain has judged whole.
 * - A text field is logged from its bytes as the client sent them (a str is taken back to them
 *   with surrogateescape, as aiohttp's parser decoded them): in json, as valid UTF-8 (a byte
 *   that is not is U+FFFD) escaped as Python's json.dumps(ensure_ascii=True) escapes it; in
 *   combined, with Apache's escapes (\", \\, \xhh for a byte outside printable ASCII).
 * - Lines are appended whole to a buffer, written to the descriptor when the buffer passes
 *   `limit` bytes and on flush() (the owner's timer, a reopen, the stop); a limit of 0 writes
 *   each line as it is made. A write holds whole lines only: to a file (O_APPEND) any number,
 *   to a pipe or socket at most PIPE_BUF bytes of them. A pipe keeps such a write whole
 *   (POSIX), so the lines of processes that share it never interleave within a line; a
 *   stream socket (journald's stderr) promises no such thing, and a line it took in part
 *   may have another process's written into it. What the descriptor does not take now
 *   stays, up to HOLD times the
 *   limit (at least HOLD_MIN bytes); a line past that is dropped and counted (`lost`), so memory
 *   stays bounded when the log cannot be written. A write error drops what was held, counted;
 *   the next flush() raises it, once.
 * - A request id is the client's X-Request-ID when it is 1 to 128 characters of
 *   [A-Za-z0-9._:@/+=-], else this object's: a random prefix and a count, unique in its life.
 */
#include "hits.h"

#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HOLD 16
#define HOLD_MIN (1 << 20)
#define MAX_CLIENT_ID 128

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t len, cap, limit;
    int fd;
    Py_ssize_t atomic; /* the most one write keeps whole (a pipe's PIPE_BUF), or 0: any */
    int socket;        /* fd is a socket: sent to without waiting, whatever its flags */
    int json;
    int error; /* errno of a failed write not yet raised, or 0 */
    unsigned long long lines, lost, ids;
    char prefix[13];
    long long second; /* the second the stamps are for, or LLONG_MIN */
    char stamp_json[20];     /* YYYY-MM-DDTHH:MM:SS */
    char stamp_combined[27]; /* DD/Mon/YYYY:HH:MM:SS +0000 */
} LogLines;

/* A text field: its bytes, or absent (logged null, or - in combined). */
typedef struct {
    const char *p;
    Py_ssize_t n;
    int present;
} Text;

static const char hex[] = "0123456789abcdef";
static const char *months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                               "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

static int grow(LogLines *self, Py_ssize_t more) {
    if (self->len + more <= self->cap)
        return 0;
    Py_ssize_t cap = self->cap ? self->cap : 4096;
    while (cap < self->len + more)
        cap *= 2;
    char *buf = PyMem_Realloc(self->buf, cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->buf = buf;
    self->cap = cap;
    return 0;
}

/* Appenders: each grows the buffer first; -1 with MemoryError set when it cannot. */
static int put(LogLines *self, const char *s, Py_ssize_t n) {
    if (grow(self, n) < 0)
        return -1;
    memcpy(self->buf + self->len, s, n);
    self->len += n;
    return 0;
}

#define PUT_LITERAL(self, s) put(self, s, sizeof(s) - 1)

static int put_number(LogLines *self, long long value) {
    char text[24];
    int n = 0;
    unsigned long long u = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        text[sizeof text - 1 - n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (value < 0)
        text[sizeof text - 1 - n++] = '-';
    return put(self, text + sizeof text - n, n);
}

static int put_json_char(LogLines *self, Py_UCS4 c) {
    char out[12];
    Py_ssize_t n = 0;
    if (c >= ' ' && c <= '~' && c != '"' && c != '\\') {
        out[n++] = (char)c;
    } else if (c == '"' || c == '\\') {
        out[n++] = '\\';
        out[n++] = (char)c;
    } else if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') {
        out[n++] = '\\';
        out[n++] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : c == '\b' ? 'b' : 'f';
    } else {
        if (c >= 0x10000) {
            Py_UCS4 v = c - 0x10000, high = 0xd800 | (v >> 10);
            out[n++] = '\\';
            out[n++] = 'u';
            for (int shift = 12; shift >= 0; shift -= 4)
                out[n++] = hex[(high >> shift) & 0xf];
            c = 0xdc00 | (v & 0x3ff);
        }
        out[n++] = '\\';
        out[n++] = 'u';
        for (int shift = 12; shift >= 0; shift -= 4)
            out[n++] = hex[(c >> shift) & 0xf];
    }
    return put(self, out, n);
}

/* A JSON string of t's bytes read as UTF-8 with replacement, or null. */
static int put_json_text(LogLines *self, const Text *t) {
    if (!t->present)
        return PUT_LITERAL(self, "null");
    if (PUT_LITERAL(self, "\"") < 0)
        return -1;
    int ascii = 1;
    for (Py_ssize_t i = 0; i < t->n && ascii; i++)
        ascii = (unsigned char)t->p[i] < 0x80;
    if (ascii) {
        /* Runs of characters JSON writes as they are go in at once; the others escaped. */
        Py_ssize_t run = 0;
        for (Py_ssize_t i = 0; i <= t->n; i++) {
            unsigned char c = i < t->n ? (unsigned char)t->p[i] : 0;
            if (i < t->n && c >= ' ' && c <= '~' && c != '"' && c != '\\')
                continue;
            if (put(self, t->p + run, i - run) < 0 ||
                (i < t->n && put_json_char(self, c) < 0))
                return -1;
            run = i + 1;
        }
    } else {
        PyObject *text = PyUnicode_DecodeUTF8(t->p, t->n, "replace");
        if (text == NULL)
            return -1;
        int kind = PyUnicode_KIND(text);
        const void *data = PyUnicode_DATA(text);
        for (Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(text); i < n; i++)
            if (put_json_char(self, PyUnicode_READ(kind, data, i)) < 0) {
                Py_DECREF(text);
                return -1;
            }
        Py_DECREF(text);
    }
    return PUT_LITERAL(self, "\"");
}

/* t's bytes with Apache's escapes, or - when absent. */
static int put_combined_text(LogLines *self, const Text *t) {
    if (!t->present)
        return PUT_LITERAL(self, "-");
    if (grow(self, 4 * t->n) < 0)
        return -1;
    char *out = self->buf + self->len;
    for (Py_ssize_t i = 0; i < t->n; i++) {
        unsigned char c = (unsigned char)t->p[i];
        if (c == '"' || c == '\\') {
            *out++ = '\\';
            *out++ = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            *out++ = '\\';
            *out++ = 'x';
            *out++ = hex[c >> 4];
            *out++ = hex[c & 0xf];
        } else
            *out++ = (char)c;
    }
    self->len = out - self->buf;
    return 0;
}

static const Text SPACE = {" ", 1, 1};

static void stamp(LogLines *self, long long second) {
    if (second == self->second)
        return;
    time_t t = (time_t)second;
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(self->stamp_json, sizeof self->stamp_json, "%04d-%02d-%02dT%02d:%02d:%02d",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    snprintf(self->stamp_combined, sizeof self->stamp_combined, "%02d/%s/%04d:%02d:%02d:%02d +0000",
             tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    self->second = second;
}

static int client_id(const Text *t) {
    if (!t->present || t->n < 1 || t->n > MAX_CLIENT_ID)
        return 0;
    for (Py_ssize_t i = 0; i < t->n; i++) {
        unsigned char c = (unsigned char)t->p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c && strchr("._:@/+=-", c) != NULL)))
            return 0;
    }
    return 1;
}

/* What a line holds, its text fields as bytes. */
typedef struct {
    long long began_us, duration_us, status, bytes;
    long long origin_us; /* the time waited on the origin, or -1: none asked (null) */
    Text client, method, target, host, protocol, cache_status, user_agent, referer, request_id;
} Fields;

static void hold_back(LogLines *self, Py_ssize_t from);
static void write_out(LogLines *self);

/* f as one line at the buffer's end, written out when the buffer is past its limit. */
static int add_line(LogLines *self, const Fields *f) {
    Py_ssize_t from = self->len;
    long long second = f->began_us >= 0 ? f->began_us / 1000000
                                        : -((-f->began_us + 999999) / 1000000);
    long long micro = f->began_us - second * 1000000;
    stamp(self, second);
    int failed;
    if (self->json) {
        /* {"time":"YYYY-MM-DDTHH:MM:SS.ffffffZ","client": */
        char when[64];
        int n = 0;
        memcpy(when, "{\"time\":\"", 9);
        n += 9;
        memcpy(when + n, self->stamp_json, 19);
        n += 19;
        when[n++] = '.';
        for (int shift = 100000; shift; shift /= 10)
            when[n++] = (char)('0' + (micro / shift) % 10);
        memcpy(when + n, "Z\",\"client\":", 12);
        n += 12;
        Text id = f->request_id;
        char made[40];
        if (!client_id(&id)) {
            id.p = made;
            id.n = snprintf(made, sizeof made, "%s%010llx", self->prefix, ++self->ids);
            id.present = 1;
        }
        failed = put(self, when, n) < 0 || put_json_text(self, &f->client) < 0 ||
                 PUT_LITERAL(self, ",\"method\":") < 0 || put_json_text(self, &f->method) < 0 ||
                 PUT_LITERAL(self, ",\"target\":") < 0 || put_json_text(self, &f->target) < 0 ||
                 PUT_LITERAL(self, ",\"host\":") < 0 || put_json_text(self, &f->host) < 0 ||
                 PUT_LITERAL(self, ",\"protocol\":") < 0 ||
                 put_json_text(self, &f->protocol) < 0 ||
                 PUT_LITERAL(self, ",\"status\":") < 0 || put_number(self, f->status) < 0 ||
                 PUT_LITERAL(self, ",\"bytes\":") < 0 || put_number(self, f->bytes) < 0 ||
                 PUT_LITERAL(self, ",\"duration_us\":") < 0 ||
                 put_number(self, f->duration_us) < 0 ||
                 PUT_LITERAL(self, ",\"origin_us\":") < 0 ||
                 (f->origin_us >= 0 ? put_number(self, f->origin_us)
                                    : PUT_LITERAL(self, "null")) < 0 ||
                 PUT_LITERAL(self, ",\"cache_status\":") < 0 ||
                 put_json_text(self, &f->cache_status) < 0 ||
                 PUT_LITERAL(self, ",\"user_agent\":") < 0 ||
                 put_json_text(self, &f->user_agent) < 0 ||
                 PUT_LITERAL(self, ",\"referer\":") < 0 || put_json_text(self, &f->referer) < 0 ||
                 PUT_LITERAL(self, ",\"request_id\":") < 0 || put_json_text(self, &id) < 0 ||
                 PUT_LITERAL(self, "}\n") < 0;
    } else {
        Text client = f->client;
        if (client.present && client.n == 0)
            client.present = 0;
        failed = put_combined_text(self, &client) < 0 || PUT_LITERAL(self, " - - [") < 0 ||
                 put(self, self->stamp_combined, 26) < 0 || PUT_LITERAL(self, "] \"") < 0 ||
                 put_combined_text(self, &f->method) < 0 ||
                 put_combined_text(self, &SPACE) < 0 ||
                 put_combined_text(self, &f->target) < 0 ||
                 put_combined_text(self, &SPACE) < 0 ||
                 put_combined_text(self, &f->protocol) < 0 || PUT_LITERAL(self, "\" ") < 0 ||
                 put_number(self, f->status) < 0 || PUT_LITERAL(self, " ") < 0 ||
                 (f->bytes ? put_number(self, f->bytes) : PUT_LITERAL(self, "-")) < 0 ||
                 PUT_LITERAL(self, " \"") < 0 || put_combined_text(self, &f->referer) < 0 ||
                 PUT_LITERAL(self, "\" \"") < 0 || put_combined_text(self, &f->user_agent) < 0 ||
                 PUT_LITERAL(self, "\"\n") < 0;
    }
    if (failed) {
        self->len = from;
        return -1;
    }
    self->lines++;
    hold_back(self, from);
    if (self->len > self->limit)
        write_out(self);
    return 0;
}

/* The most the buffer holds while the descriptor does not take it. */
static Py_ssize_t hold_max(LogLines *self) {
    if (self->limit > PY_SSIZE_T_MAX / HOLD)
        return PY_SSIZE_T_MAX;
    Py_ssize_t most = HOLD * self->limit;
    return most < HOLD_MIN ? HOLD_MIN : most;
}

/* Drop the line that begins at `from` when it would take the buffer past hold_max. */
static void hold_back(LogLines *self, Py_ssize_t from) {
    if (self->len > hold_max(self) && from > 0) {
        self->len = from;
        self->lost++;
    }
}

static unsigned long long count_lines(const char *p, Py_ssize_t n) {
    unsigned long long lines = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        lines += p[i] == '\n';
    return lines;
}

/* What one write to fd keeps whole: a pipe's or a socket's PIPE_BUF (several workers may
 * write to one stderr pipe), anything to a file (O_APPEND); and whether fd is a socket. */
static void follow_fd(LogLines *self) {
    struct stat st;
    int known = self->fd >= 0 && fstat(self->fd, &st) == 0;
    self->socket = known && S_ISSOCK(st.st_mode);
    self->atomic = known && (S_ISFIFO(st.st_mode) || self->socket) ? PIPE_BUF : 0;
}

/* One write of n bytes to the descriptor. A socket (journald's stream, for stderr) is sent to
 * without waiting, so that a reader that stopped costs lines, not the event loop: its open
 * file description may be shared, and blocking, with the processes that gave it. */
static ssize_t send_out(LogLines *self, const char *p, Py_ssize_t n) {
    if (self->socket) {
        ssize_t sent = send(self->fd, p, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent >= 0 || errno != ENOTSOCK)
            return sent;
        self->socket = 0;
    }
    return write(self->fd, p, (size_t)n);
}

/* How much of the buffer from `done` the next write takes: all of it, or where fd keeps only
 * `atomic` bytes whole, the whole lines that fit (a line longer than that alone). */
static Py_ssize_t next_chunk(LogLines *self, Py_ssize_t done) {
    Py_ssize_t rest = self->len - done;
    if (!self->atomic || rest <= self->atomic)
        return rest;
    const char *p = self->buf + done;
    for (Py_ssize_t i = self->atomic; i > 0; i--)
        if (p[i - 1] == '\n')
            return i;
    const char *end = memchr(p, '\n', rest);
    return end ? end - p + 1 : rest;
}

/* Write the buffer's whole lines to the descriptor: what it does not take now (EAGAIN) stays;
 * on an error, what was held is dropped and counted, and the error kept for flush(). */
static void write_out(LogLines *self) {
    Py_ssize_t done = 0;
    while (done < self->len && self->fd >= 0) {
        ssize_t n = send_out(self, self->buf + done, next_chunk(self, done));
        if (n > 0) {
            done += n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        self->error = n < 0 ? errno : EIO;
        self->lost += count_lines(self->buf + done, self->len - done);
        done = self->len;
    }
    if (self->fd < 0 && done < self->len) {
        /* No descriptor (closed): nothing to keep them for; dropped, counted. */
        self->lost += count_lines(self->buf + done, self->len - done);
        done = self->len;
    }
    memmove(self->buf, self->buf + done, self->len - done);
    self->len -= done;
}

/* Reads a str or None argument into t (str: its bytes as sent); *hold keeps them. */
static int text_arg(PyObject *arg, Text *t, PyObject **hold) {
    *hold = NULL;
    if (arg == Py_None) {
        t->present = 0;
        return 0;
    }
    t->present = 1;
    if (PyUnicode_Check(arg) && PyUnicode_IS_ASCII(arg)) {
        t->p = (const char *)PyUnicode_DATA(arg);
        t->n = PyUnicode_GET_LENGTH(arg);
        return 0;
    }
    if (PyUnicode_Check(arg)) {
        *hold = PyUnicode_AsEncodedString(arg, "utf-8", "surrogateescape");
        if (*hold == NULL)
            return -1;
        t->p = PyBytes_AS_STRING(*hold);
        t->n = PyBytes_GET_SIZE(*hold);
        return 0;
    }
    if (PyBytes_Check(arg)) {
        t->p = PyBytes_AS_STRING(arg);
        t->n = PyBytes_GET_SIZE(arg);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "a logged field is str, bytes or None");
    return -1;
}

/* A field's name as a head is searched for it: lower case, with its colon. */
typedef struct {
    const char *name;
    Py_ssize_t len;
} Name;

static const Name REQUEST_FIELDS[] = {
    {"host:", 5}, {"user-agent:", 11}, {"referer:", 8}, {"x-request-id:", 13}};
static const Name STATUS_FIELD[] = {{"cache-status:", 13}};

/* The value of the first field of each of `names` among a head's field lines from p to end,
 * in one pass, into *out[i] (not present when there is none), trimmed of spaces and tabs as
 * aiohttp's parser trims them. */
static void fields_of(const char *p, const char *end, const Name *names, Text *const *out,
                      int count) {
    int left = count;
    for (int i = 0; i < count; i++)
        *out[i] = (Text){NULL, 0, 0};
    while (p < end && left) {
        const char *eol = memchr(p, '\r', end - p);
        if (eol == NULL || eol == p)
            break;
        for (int i = 0; i < count; i++) {
            Py_ssize_t len = names[i].len;
            if (out[i]->present || eol - p < len || strncasecmp(p, names[i].name, len) != 0)
                continue;
            const char *v = p + len, *e = eol;
            while (v < e && (*v == ' ' || *v == '\t'))
                v++;
            while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
                e--;
            *out[i] = (Text){v, e - v, 1};
            left--;
            break;
        }
        p = eol + 2;
    }
}

/* The Cache-Status field of an answer's head (bytes), from the line after its status line. */
static Text head_status(PyObject *head) {
    const char *h = PyBytes_AS_STRING(head), *e = h + PyBytes_GET_SIZE(head);
    const char *first = memchr(h, '\n', e - h);
    Text status = {NULL, 0, 0};
    Text *out[] = {&status};
    if (first != NULL)
        fields_of(first + 1, e, STATUS_FIELD, out, 1);
    return status;
}

static long long now_us(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static PyObject *raise_held(LogLines *self) {
    int error = self->error;
    self->error = 0;
    errno = error;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static int LogLines_init(LogLines *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fd", "json", "limit", NULL};
    int fd, json;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ipn", names, &fd, &json, &limit))
        return -1;
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "limit is 0 or more bytes");
        return -1;
    }
    self->fd = fd;
    follow_fd(self);
    self->json = json;
    self->limit = limit;
    self->second = LLONG_MIN;
    unsigned char random[6];
    PyObject *urandom = PyImport_ImportModule("os");
    PyObject *bytes = urandom ? PyObject_CallMethod(urandom, "urandom", "i", 6) : NULL;
    Py_XDECREF(urandom);
    if (bytes == NULL)
        return -1;
    memcpy(random, PyBytes_AS_STRING(bytes), 6);
    Py_DECREF(bytes);
    for (int i = 0; i < 6; i++) {
        self->prefix[2 * i] = hex[random[i] >> 4];
        self->prefix[2 * i + 1] = hex[random[i] & 0xf];
    }
    self->prefix[12] = '\0';
    return 0;
}

static void LogLines_dealloc(LogLines *self) {
    PyMem_Free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *LogLines_hit(LogLines *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[4]) ||
        !PyFloat_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "hit(data: bytes, start, end, client, head: bytes, "
                                         "body, status, began: float)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t body = PyObject_Length(args[5]);
    long status = PyLong_AsLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (start < 0 || end < start || end > size) {
        PyErr_SetString(PyExc_ValueError, "hit: start and end lie outside data");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(args[0]) + start, *last = PyBytes_AS_STRING(args[0]) + end;
    Fields f;
    PyObject *hold;
    if (text_arg(args[3], &f.client, &hold) < 0)
        return NULL;
    const char *space = memchr(p, ' ', last - p);
    const char *target = space ? space + 1 : last;
    const char *space2 = memchr(target, ' ', last - target);
    const char *line_end = space2 ? memchr(space2, '\r', last - space2) : NULL;
    if (space == NULL || space2 == NULL || line_end == NULL) {
        Py_XDECREF(hold);
        PyErr_SetString(PyExc_ValueError, "hit: data[start:end] is not a request's head");
        return NULL;
    }
    f.method = (Text){p, space - p, 1};
    f.target = (Text){target, space2 - target, 1};
    f.protocol = (Text){space2 + 1, line_end - space2 - 1, 1};
    Text *wanted[] = {&f.host, &f.user_agent, &f.referer, &f.request_id};
    fields_of(line_end + 2, last, REQUEST_FIELDS, wanted, 4);
    f.cache_status = head_status(args[4]);
    f.duration_us = llround((perf_seconds() - PyFloat_AS_DOUBLE(args[7])) * 1e6);
    f.began_us = now_us(CLOCK_REALTIME) - f.duration_us;
    f.status = status;
    f.origin_us = -1;
    f.bytes = PyBytes_GET_SIZE(args[4]) + body;
    int failed = add_line(self, &f);
    Py_XDECREF(hold);
    if (failed < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *LogLines_entry(LogLines *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError,
                        "entry(duration_us, client, method, target, host, protocol, status, "
                        "bytes, cache_status, user_agent, referer, request_id, now_us, "
                        "origin_us)");
        return NULL;
    }
    Fields f;
    f.duration_us = PyLong_AsLongLong(args[0]);
    f.origin_us = -1;
    if (args[13] != Py_None) {
        f.origin_us = PyLong_AsLongLong(args[13]);
        if (f.origin_us < 0 && !PyErr_Occurred())
            f.origin_us = 0; /* a clock that stepped back: nothing measurable waited */
    }
    f.status = PyLong_AsLongLong(args[6]);
    f.bytes = PyLong_AsLongLong(args[7]);
    long long now = args[12] == Py_None ? now_us(CLOCK_REALTIME) : PyLong_AsLongLong(args[12]);
    if (PyErr_Occurred())
        return NULL;
    f.began_us = now - f.duration_us;
    Text *texts[] = {&f.client,       &f.method,     &f.target,  &f.host,
                     &f.protocol,     NULL,          NULL,       &f.cache_status,
                     &f.user_agent,   &f.referer,    &f.request_id};
    PyObject *held[12] = {NULL};
    int failed = 0;
    for (int i = 1; i < 12 && !failed; i++) {
        if (texts[i - 1] == NULL)
            continue;
        failed = text_arg(args[i], texts[i - 1], &held[i]) < 0;
    }
    /* A head in bytes stands for the Cache-Status field it carries. */
    if (!failed && PyBytes_Check(args[8]))
        f.cache_status = head_status(args[8]);
    if (!failed)
        failed = add_line(self, &f) < 0;
    for (int i = 0; i < 12; i++)
        Py_XDECREF(held[i]);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *LogLines_flush(LogLines *self, PyObject *unused) {
    write_out(self);
    if (self->error)
        return raise_held(self);
    Py_RETURN_NONE;
}

static PyObject *LogLines_swap(LogLines *self, PyObject *arg) {
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < -1 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "swap(fd): a descriptor, or -1");
        return NULL;
    }
    write_out(self);
    int old = self->fd;
    self->fd = (int)fd;
    follow_fd(self);
    return PyLong_FromLong(old);
}

static PyObject *LogLines_get_pending(LogLines *self, void *closure) {
    return PyLong_FromSsize_t(self->len);
}

static PyMethodDef LogLines_methods[] = {
    {"hit", (PyCFunction)(void (*)(void))LogLines_hit, METH_FASTCALL,
     "hit(data, start, end, client, head, body, status, began)\n\n"
     "The line of the answer (head, body, status) just written to the plain request at\n"
     "data[start:end], whose bytes were read whole (PlainHits.answer_bytes) at began\n"
     "(time.perf_counter)."},
    {"entry", (PyCFunction)(void (*)(void))LogLines_entry, METH_FASTCALL,
     "entry(duration_us, client, method, target, host, protocol, status, bytes,\n"
     "      cache_status, user_agent, referer, request_id, now_us, origin_us)\n\n"
     "The line of an answer from its fields (text: str, bytes as sent, or None); a\n"
     "cache_status in bytes is the answer's head, which carries it; now_us: when the answer\n"
     "ended, microseconds since the epoch (None: now); origin_us: the microseconds it waited\n"
     "on the origin (None: it asked none, logged null in json)."},
    {"flush", (PyCFunction)LogLines_flush, METH_NOARGS,
     "Write what the buffer holds; OSError for a write that failed since the last flush\n"
     "(its lines dropped and counted in lost)."},
    {"swap", (PyCFunction)LogLines_swap, METH_O,
     "swap(fd) -> the descriptor written to before: flush, then write to fd (-1: none)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef LogLines_members[] = {
    {"lines", T_ULONGLONG, offsetof(LogLines, lines), READONLY, "lines made"},
    {"lost", T_ULONGLONG, offsetof(LogLines, lost), READONLY,
     "lines dropped: not written (an error), or past what the buffer holds"},
    {"limit", T_PYSSIZET, offsetof(LogLines, limit), READONLY,
     "bytes held before they are written"},
    {"fd", T_INT, offsetof(LogLines, fd), READONLY, "the descriptor written to, or -1"},
    {NULL}};

static PyGetSetDef LogLines_getset[] = {
    {"pending", (getter)LogLines_get_pending, NULL, "bytes held, not yet written", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject LogLinesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.handler._hits.LogLines",
    .tp_basicsize = sizeof(LogLines),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LogLines(fd, json, limit): the access log's lines, formatted and written in\n"
              "batches to the descriptor fd (json: else combined).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)LogLines_init,
    .tp_dealloc = (destructor)LogLines_dealloc,
    .tp_methods = LogLines_methods,
    .tp_members = LogLines_members,
    .tp_getset = LogLines_getset,
};
