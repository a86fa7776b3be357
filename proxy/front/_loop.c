/* The front connection's read loop (proxy.front.fastpath.Front's data_received and _go_on),
 * compiled: a plain fresh hit is read, answered, written, counted and logged with no Python
 * frame on the way.
 *
 * Rules this file keeps:
 *
 * - It is the only loop: Front's data_received and _go_on are these functions (bound as
 *   methods by instancemethod), and every branch but the commonest calls back the Front's own
 *   Python methods, which hold the rules for them: _read_proxy_header, _answer_at (a request
 *   the compiled answerer did not answer: parsed, asked of the other answerers, or sent to the
 *   lane), _hand_over, _send_large (a body past PIECE), _log_parsed, _failed.
 * - The connection's states and limits are the Python module's (proxy.front.life, HOLD_LIMIT,
 *   PIECE), given once by rules(); nothing of them is written here twice.
 * - Requests are answered one at a time while the connection is READING, in order; the bytes
 *   after a request in progress are held, and past HOLD_LIMIT reading stops.
 * - An exception (an Exception) raised by the compiled answerer or the access log is logged
 *   and costs the request nothing: the answerer's, the parser reads the request; the log's,
 *   the answer already went out. Anything else, or an exception raised writing, propagates to
 *   the event loop as it would from the Python loop.
 */
#include "../core/native/slots.h" /* Python.h first: it sets the POSIX feature macros */
#include "../core/native/clock.h"

enum {
    F_BUFFER, F_LIFE, F_STATE, F_TRANSPORT, F_PAUSED, F_ANSWER_BYTES, F_HIT_LINES, F_SERVER,
    F_REMOTE, F_LAST, F_LOOP, F_REQUESTS_COUNT, F_ANSWERED, F_COUNT
};

static Attr fattrs[F_COUNT] = {
    {"_buffer"}, {"_life"}, {"state"}, {"transport"}, {"_paused"}, {"_answer_bytes"},
    {"_hit_lines"}, {"_server"}, {"_remote"}, {"_last"}, {"_loop"}, {"requests_count"},
    {"answered"},
};

static PyObject *s_is_closing, *s_write, *s_writelines, *s_time, *s_hand_over, *s_answer_at,
    *s_send_large, *s_log_parsed, *s_failed, *s_read_proxy_header, *s_reading_paused,
    *s_head_limit,
    *s_hold_reading, *s_hit, *one;
static PyObject *why_answer, *why_log;

/* The connection's states and limits, from rules(). */
static long st_reading = -1, st_proxy_header = -1, st_handed_over = -1;
static unsigned long long busy_states;
static Py_ssize_t hold_limit, piece;

/* The connection's state (a State, a small int); -1 with an exception set. */
static long state_of(PyObject *life) {
    PyObject *state = get(life, &fattrs[F_STATE]);
    if (state == NULL)
        return -1;
    long value = PyLong_AsLong(state);
    Py_DECREF(state);
    return value;
}

/* Whether `state` has a request in progress (BUSY). */
static int busy(long state) {
    return state >= 0 && state < 64 && (busy_states >> state) & 1;
}


/* The exception set, when it is an Exception, given with `why` to the front's _failed and
 * cleared: 0. -1 (still set) for anything else, or when _failed fails. */
static int report(PyObject *front, PyObject *why) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    PyObject *done = PyObject_CallMethodObjArgs(front, s_failed, why, value, NULL);
    Py_XDECREF(value);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* Write one hit's answer, count it and log it, as the Python loop did: head and body in one
 * call, a body past PIECE through _send_large (which logs it when it ends); `message` is the
 * parsed request (NULL: read from its bytes, data[start:end]). 0, or -1 with an exception
 * set. */
static int deliver(PyObject *front, PyObject *transport, PyObject *lines, PyObject *data,
                   Py_ssize_t start, Py_ssize_t end, PyObject *head, PyObject *body,
                   PyObject *status, PyObject *message, double began) {
    PyObject *loop = get(front, &fattrs[F_LOOP]);
    PyObject *now = loop ? PyObject_CallMethodNoArgs(loop, s_time) : NULL;
    Py_XDECREF(loop);
    if (now == NULL)
        return -1;
    int rc = set(front, &fattrs[F_LAST], now);
    Py_DECREF(now);
    PyObject *server = rc < 0 ? NULL : get(front, &fattrs[F_SERVER]);
    if (server == NULL)
        return -1;
    if (attr_add(server, &fattrs[F_REQUESTS_COUNT], one) < 0)
        goto failed;
    /* As the Python loop: a body that is false (empty, or none) is no body. */
    int has_body = PyObject_IsTrue(body);
    Py_ssize_t body_len = has_body > 0 ? PyObject_Length(body) : 0;
    if (has_body < 0 || body_len < 0)
        goto failed;
    PyObject *wrote;
    int logs_itself = body_len > piece;
    if (body_len == 0) {
        wrote = PyObject_CallMethodOneArg(transport, s_write, head);
    } else if (!logs_itself) {
        PyObject *both = PyTuple_Pack(2, head, body);
        wrote = both ? PyObject_CallMethodOneArg(transport, s_writelines, both) : NULL;
        Py_XDECREF(both);
    } else {
        /* Its log line is _send_large's to write, once the body's last byte is handed over
         * (or the connection ends first): its duration and bytes are the whole answer's. */
        PyObject *at = PyFloat_FromDouble(began);
        PyObject *from = at ? PyLong_FromSsize_t(start) : NULL;
        PyObject *to = from ? PyLong_FromSsize_t(end) : NULL;
        wrote = to ? PyObject_CallMethodObjArgs(front, s_send_large, head, body, status, at,
                                                message ? message : Py_None, data, from, to,
                                                NULL)
                   : NULL;
        Py_XDECREF(to);
        Py_XDECREF(from);
        Py_XDECREF(at);
    }
    if (wrote == NULL)
        goto failed;
    Py_DECREF(wrote);
    PyObject *answered = get(server, &fattrs[F_ANSWERED]);
    if (answered == NULL)
        goto failed;
    PyObject *count = PyDict_GetItemWithError(answered, status);
    PyObject *more = count ? PyNumber_Add(count, one)
                           : (PyErr_Occurred() ? NULL : Py_NewRef(one));
    rc = more ? PyDict_SetItem(answered, status, more) : -1;
    Py_XDECREF(more);
    Py_DECREF(answered);
    if (rc < 0)
        goto failed;
    Py_DECREF(server);
    if (lines == Py_None || logs_itself)
        return 0;
    PyObject *logged;
    PyObject *at = PyFloat_FromDouble(began);
    if (at == NULL) {
        logged = NULL;
    } else if (message == NULL) {
        /* LogLines.hit: the line made from the request's bytes and the head. */
        PyObject *remote = get(front, &fattrs[F_REMOTE]);
        PyObject *from = remote ? PyLong_FromSsize_t(start) : NULL;
        PyObject *to = from ? PyLong_FromSsize_t(end) : NULL;
        PyObject *args[] = {lines, data, from, to, remote, head, body, status, at};
        logged = to ? PyObject_VectorcallMethod(s_hit, args,
                                                9 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)
                    : NULL;
        Py_XDECREF(to);
        Py_XDECREF(from);
        Py_XDECREF(remote);
    } else {
        logged = PyObject_CallMethodObjArgs(front, s_log_parsed, message, head, body, status,
                                            at, NULL);
    }
    Py_XDECREF(at);
    rc = logged ? 0 : -1;
    Py_XDECREF(logged);
    return rc < 0 ? report(front, why_log) : 0;
failed:
    Py_DECREF(server);
    return -1;
}

/* Answer what the buffer holds, in order, until it is empty or the connection stops reading
 * (Front._go_on). 0, or -1 with an exception set. */
static int go_on(PyObject *front) {
    PyObject *data = get(front, &fattrs[F_BUFFER]);
    if (data == NULL)
        return -1;
    if (!PyBytes_Check(data)) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_TypeError, "a front's buffer is bytes");
        return -1;
    }
    PyObject *life = get(front, &fattrs[F_LIFE]);
    PyObject *transport = life ? get(front, &fattrs[F_TRANSPORT]) : NULL;
    PyObject *answer_bytes = transport ? get(front, &fattrs[F_ANSWER_BYTES]) : NULL;
    PyObject *lines = answer_bytes ? get(front, &fattrs[F_HIT_LINES]) : NULL;
    int rc = lines == NULL ? -1 : 0, keep = 1;
    Py_ssize_t start = 0, size = PyBytes_GET_SIZE(data);
    while (rc == 0 && start < size) {
        long state = state_of(life);
        if (state < 0) {
            rc = -1;
            break;
        }
        if (state != st_reading || transport == Py_None)
            break;
        PyObject *closing = PyObject_CallMethodNoArgs(transport, s_is_closing);
        int closed = closing ? PyObject_IsTrue(closing) : -1;
        Py_XDECREF(closing);
        int paused = closed == 0 ? attr_true(front, &fattrs[F_PAUSED]) : 0;
        if (closed < 0 || paused < 0) {
            rc = -1;
            break;
        }
        if (closed)
            break;
        if (paused) {
            /* A client that does not read: aiohttp's handler waits for it. */
            PyObject *rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + start,
                                                       size - start);
            PyObject *done = rest ? PyObject_CallMethodOneArg(front, s_hand_over, rest) : NULL;
            Py_XDECREF(rest);
            rc = done ? 0 : -1;
            Py_XDECREF(done);
            keep = 0;
            break;
        }
        double began = lines != Py_None ? perf_seconds() : 0.0;
        PyObject *found = NULL;
        if (answer_bytes != Py_None) {
            PyObject *at = PyLong_FromSsize_t(start);
            PyObject *args[] = {data, at};
            found = at ? PyObject_Vectorcall(answer_bytes, args, 2, NULL) : NULL;
            Py_XDECREF(at);
            if (found == NULL && report(front, why_answer) < 0) {
                rc = -1;
                break;
            }
        }
        if (found == NULL)
            found = Py_NewRef(Py_None);
        PyObject *parsed = NULL, *head, *body, *status, *message = NULL;
        Py_ssize_t end;
        if (PyTuple_Check(found) && PyTuple_GET_SIZE(found) == 4) {
            end = PyLong_AsSsize_t(PyTuple_GET_ITEM(found, 0));
            head = PyTuple_GET_ITEM(found, 1);
            body = PyTuple_GET_ITEM(found, 2);
            status = PyTuple_GET_ITEM(found, 3);
        } else {
            PyObject *at = PyLong_FromSsize_t(start);
            parsed = at ? PyObject_CallMethodObjArgs(front, s_answer_at, data, at, found, NULL)
                        : NULL;
            Py_XDECREF(at);
            if (parsed == NULL || !PyTuple_Check(parsed) || PyTuple_GET_SIZE(parsed) != 3) {
                if (parsed != NULL)
                    PyErr_SetString(PyExc_TypeError, "_answer_at gives (end, answer, message)");
                Py_XDECREF(parsed);
                Py_DECREF(found);
                rc = -1;
                break;
            }
            end = PyLong_AsSsize_t(PyTuple_GET_ITEM(parsed, 0));
            PyObject *answered = PyTuple_GET_ITEM(parsed, 1);
            if (answered == Py_None) {
                Py_DECREF(parsed);
                Py_DECREF(found);
                if (end == -1 && PyErr_Occurred()) {
                    rc = -1;
                    break;
                }
                if (end < 0) {
                    /* Handed over (the buffer is the handler's now), or a request in part. */
                    long now = state_of(life);
                    if (now < 0)
                        rc = -1;
                    else if (now == st_handed_over)
                        keep = 0;
                    break;
                }
                start = end; /* the lane's */
                continue;
            }
            if (!PyTuple_Check(answered) || PyTuple_GET_SIZE(answered) != 3) {
                PyErr_SetString(PyExc_TypeError, "an answer is (head, body, status)");
                Py_DECREF(parsed);
                Py_DECREF(found);
                rc = -1;
                break;
            }
            head = PyTuple_GET_ITEM(answered, 0);
            body = PyTuple_GET_ITEM(answered, 1);
            status = PyTuple_GET_ITEM(answered, 2);
            message = PyTuple_GET_ITEM(parsed, 2);
        }
        if (end == -1 && PyErr_Occurred()) {
            rc = -1;
        } else if (end <= start || end > size) {
            PyErr_SetString(PyExc_ValueError, "an answered request ends outside the buffer");
            rc = -1;
        } else {
            rc = deliver(front, transport, lines, data, start, end, head, body, status, message,
                         began);
        }
        Py_XDECREF(parsed);
        Py_DECREF(found);
        if (rc == 0)
            start = end;
    }
    if (keep && rc == 0) {
        PyObject *rest = start == 0 ? Py_NewRef(data)
                                    : PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + start,
                                                                size - start);
        if (rest == NULL || set(front, &fattrs[F_BUFFER], rest) < 0)
            rc = -1;
        Py_XDECREF(rest);
    }
    Py_XDECREF(lines);
    Py_XDECREF(answer_bytes);
    Py_XDECREF(transport);
    Py_XDECREF(life);
    Py_DECREF(data);
    return rc;
}

/* Whether p[old:n], come after a request head in part (p[:old]), may end it or have the
 * parser refuse it, as _answer_at judges a head: an empty line ending in them, or a bare LF
 * among them. Else the head is only longer, and nothing is read again: a head sent a few
 * bytes at a time would be read again whole at each (quadratic in its length). */
static int head_may_end(const char *p, Py_ssize_t old, Py_ssize_t n) {
    Py_ssize_t from = old > 3 ? old - 3 : 0;
    if (memmem(p + from, (size_t)(n - from), "\r\n\r\n", 4) != NULL)
        return 1;
    for (const char *lf = memchr(p + old, '\n', (size_t)(n - old)); lf != NULL;
         lf = memchr(lf + 1, '\n', (size_t)(p + n - lf - 1)))
        if (lf == p || lf[-1] != '\r')
            return 1;
    return 0;
}

/* 1 when the front's buffer is a request head in part that the bytes past `old` only made
 * longer (head_may_end says no, and it is within the longest the parser judges: its
 * server's head_limit), so that nothing is to be read again; 0 otherwise; -1 with an
 * exception set. */
static int only_longer(PyObject *front, Py_ssize_t old) {
    PyObject *buffer = get(front, &fattrs[F_BUFFER]);
    if (buffer == NULL)
        return -1;
    Py_ssize_t held = PyBytes_Check(buffer) ? PyBytes_GET_SIZE(buffer) : 0;
    int may_end = held <= old || head_may_end(PyBytes_AS_STRING(buffer), old, held);
    Py_DECREF(buffer);
    if (may_end)
        return 0;
    PyObject *server = get(front, &fattrs[F_SERVER]);
    PyObject *limit = server ? PyObject_GetAttr(server, s_head_limit) : NULL;
    Py_XDECREF(server);
    Py_ssize_t most = limit ? PyLong_AsSsize_t(limit) : -1;
    Py_XDECREF(limit);
    if (most == -1 && PyErr_Occurred())
        return -1;
    return held <= most;
}

/* Front.data_received: the bytes kept after those not yet answered; a PROXY header read first;
 * held while a request is in progress (reading stops past HOLD_LIMIT); else answered. */
static PyObject *received(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "data_received(data: bytes)");
        return NULL;
    }
    PyObject *front = args[0], *data = args[1];
    PyObject *buffer = get(front, &fattrs[F_BUFFER]);
    if (buffer == NULL)
        return NULL;
    PyObject *all = PyBytes_Check(buffer) && PyBytes_GET_SIZE(buffer) == 0 &&
                            PyBytes_CheckExact(data)
                        ? Py_NewRef(data)
                        : PyNumber_Add(buffer, data);
    Py_ssize_t old = PyBytes_Check(buffer) ? PyBytes_GET_SIZE(buffer) : 0;
    Py_DECREF(buffer);
    if (all == NULL)
        return NULL;
    int rc = set(front, &fattrs[F_BUFFER], all);
    Py_ssize_t held = PyBytes_Check(all) ? PyBytes_GET_SIZE(all) : 0;
    Py_DECREF(all);
    PyObject *life = rc < 0 ? NULL : get(front, &fattrs[F_LIFE]);
    long state = life ? state_of(life) : -1;
    Py_XDECREF(life);
    if (state < 0)
        return NULL;
    if (state == st_proxy_header) {
        PyObject *read = PyObject_CallMethodNoArgs(front, s_read_proxy_header);
        int whole = read ? PyObject_IsTrue(read) : -1;
        Py_XDECREF(read);
        if (whole < 0)
            return NULL;
        if (!whole)
            Py_RETURN_NONE;
    }
    if (busy(state)) {
        if (held > hold_limit) {
            PyObject *paused = PyObject_GetAttr(front, s_reading_paused);
            int is = paused ? PyObject_IsTrue(paused) : -1;
            Py_XDECREF(paused);
            if (is < 0)
                return NULL;
            if (!is) {
                PyObject *done = PyObject_CallMethodNoArgs(front, s_hold_reading);
                if (done == NULL)
                    return NULL;
                Py_DECREF(done);
            }
        }
        Py_RETURN_NONE;
    }
    if (state == st_reading && old > 0) {
        int longer = only_longer(front, old);
        if (longer < 0)
            return NULL;
        if (longer)
            Py_RETURN_NONE;
    }
    if (go_on(front) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *go_on_method(PyObject *module, PyObject *front) {
    if (go_on(front) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *rules(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "rules(reading, proxy_header, handed_over, "
                                         "busy, hold_limit, piece)");
        return NULL;
    }
    long reading = PyLong_AsLong(args[0]), header = PyLong_AsLong(args[1]),
         handed = PyLong_AsLong(args[2]);
    Py_ssize_t hold = PyLong_AsSsize_t(args[4]), size = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred())
        return NULL;
    unsigned long long states = 0;
    PyObject *it = PyObject_GetIter(args[3]), *item;
    if (it == NULL)
        return NULL;
    while ((item = PyIter_Next(it)) != NULL) {
        long state = PyLong_AsLong(item);
        Py_DECREF(item);
        if (state < 0 || state >= 64) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a state is a small int (0 to 63)");
            break;
        }
        states |= 1ULL << state;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    st_reading = reading;
    st_proxy_header = header;
    st_handed_over = handed;
    busy_states = states;
    hold_limit = hold;
    piece = size;
    Py_RETURN_NONE;
}

static PyMethodDef received_def = {
    "data_received", (PyCFunction)(void (*)(void))received, METH_FASTCALL,
    "data_received(front, data): Front.data_received, compiled"};
static PyMethodDef go_on_def = {
    "_go_on", (PyCFunction)go_on_method, METH_O,
    "_go_on(front): answer what the front's buffer holds, in order, until it is empty or the\n"
    "connection stops reading"};
static PyMethodDef rules_def = {
    "rules", (PyCFunction)(void (*)(void))rules, METH_FASTCALL,
    "rules(reading, proxy_header, handed_over, busy, hold_limit, piece): the\n"
    "connection's states (proxy.front.life) and limits the compiled loop keeps"};

/* Interns the names, and adds the loop as methods to bind and rules(). */
static int front_init(PyObject *module) {
    for (int i = 0; i < F_COUNT; i++) {
        fattrs[i].name = PyUnicode_InternFromString(fattrs[i].text);
        if (fattrs[i].name == NULL)
            return -1;
    }
    struct {
        PyObject **at;
        const char *text;
    } names[] = {
        {&s_is_closing, "is_closing"}, {&s_write, "write"}, {&s_writelines, "writelines"},
        {&s_time, "time"}, {&s_hand_over, "_hand_over"}, {&s_answer_at, "_answer_at"},
        {&s_send_large, "_send_large"}, {&s_log_parsed, "_log_parsed"}, {&s_failed, "_failed"},
        {&s_read_proxy_header, "_read_proxy_header"}, {&s_reading_paused, "reading_paused"},
        {&s_hold_reading, "hold_reading"}, {&s_hit, "hit"}, {&s_head_limit, "head_limit"},
        {&why_answer, "answering a request as its bytes came failed"},
        {&why_log, "an access log line failed"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].at = PyUnicode_InternFromString(names[i].text);
        if (*names[i].at == NULL)
            return -1;
    }
    one = PyLong_FromLong(1);
    PyMethodDef *defs[] = {&received_def, &go_on_def};
    const char *as[] = {"data_received", "go_on"};
    for (int i = 0; i < 2; i++) {
        PyObject *function = PyCFunction_New(defs[i], NULL);
        PyObject *method = function ? PyInstanceMethod_New(function) : NULL;
        Py_XDECREF(function);
        if (method == NULL || PyModule_AddObject(module, as[i], method) < 0) {
            Py_XDECREF(method);
            return -1;
        }
    }
    /* What it asks of a front by name, for a test to hold Front to. */
    PyObject *methods = PyTuple_Pack(8, s_read_proxy_header, s_answer_at, s_hand_over,
                                     s_send_large, s_log_parsed, s_failed, s_reading_paused,
                                     s_hold_reading);
    if (methods == NULL || PyModule_AddObject(module, "front_methods", methods) < 0) {
        Py_XDECREF(methods);
        return -1;
    }
    PyObject *fields = PyTuple_New(0);
    for (int i = 0; fields != NULL && i < F_COUNT; i++) {
        if (i == F_STATE || i == F_REQUESTS_COUNT || i == F_ANSWERED)
            continue; /* the Life's and the server's */
        PyObject *one_more = PyTuple_Pack(1, fattrs[i].name);
        PyObject *joined = one_more ? PySequence_Concat(fields, one_more) : NULL;
        Py_XDECREF(one_more);
        Py_SETREF(fields, joined);
    }
    if (fields == NULL || PyModule_AddObject(module, "front_slots", fields) < 0) {
        Py_XDECREF(fields);
        return -1;
    }
    PyObject *set_rules = PyCFunction_New(&rules_def, NULL);
    if (set_rules == NULL || PyModule_AddObject(module, "rules", set_rules) < 0) {
        Py_XDECREF(set_rules);
        return -1;
    }
    return one == NULL ? -1 : 0;
}

static struct PyModuleDef loop_module = {
    PyModuleDef_HEAD_INIT, "proxy.front._loop", "The front connection's read loop, compiled.",
    -1, NULL,
};

/* The loop as methods to bind (data_received, go_on), and rules. */
PyMODINIT_FUNC PyInit__loop(void) {
    PyObject *module = PyModule_Create(&loop_module);
    if (module == NULL || front_init(module) < 0) {
        Py_XDECREF(module);
        return NULL;
    }
    return module;
}
