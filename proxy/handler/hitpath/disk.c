/* A plain fresh hit read from the disk tier's region files, as HitAnswers.answer reads one
 * for a URL the memory store holds nothing for.
 *
 * Rules this file keeps:
 *
 * - A record is served only when it is whole: its magic, its length (the index's), its checksum
 *   (region_log.checksum, over everything after it) and its key all hold. Anything else is declined, and
 *   the Python reader, which drops a damaged record and logs it, reads it again: one place
 *   judges a damaged record.
 * - It reads through the descriptors RegionLog keeps open (read_fds) and declines a region
 *   with none, or whose file was removed by hand (no link left), a record longer than
 *   read_inline, or one the page cache does not hold all of (RWF_NOWAIT): the handler reads
 *   those off the event loop (a record the page cache does not hold is said as what
 *   disk_cold makes of where it lies, a ColdRecord: the Python answerer, which reads only
 *   what the page cache holds, is not asked, and the handler reads it from there).
 * - It declines a record a ban (DiskTier.bans: a purge by prefix or by tag) may purge, so
 *   that the proxy drops it, in one place.
 * - It answers only what the stored head may answer as it was rendered: the record's meta
 *   carries the render stamp of this proxy, the PLAIN flag (no `no-cache` to revalidate), and
 *   a fresh age, computed as Entry.age computes it; else it declines.
 * - A hit is counted as CacheEngine._hit_behind counts one (count_disk_hit): the request and
 *   the hit, from disk, the disk tier's own hit, both admissions' observe and the what-if's
 *   sample; then the store's admission (`admit`) and its promotion filter (`promotion_admit`) say
 *   whether it is kept in memory too (CacheEngine._promotes), and only then is the proxy
 *   called (disk_promote), to make the entry and keep it.
 */
#include "hits.h"

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* The layout RegionLog and DiskStore write (region_log.HEADER, record_meta.META). */
#define MAGIC "OHR2"
#define HEADER_SIZE 18 /* magic, length, checksum, key length (u16), meta length (u32) */
#define META_SIZE 35   /* status u16, stored_at, lifetime, initial_age f64, flags u8,
                          stamp u32, head length u32 */
#define FLAG_DATED 1
#define FLAG_PLAIN 2
#define NO_VALUE 0xFFFFFFFFu

static uint32_t u32_at(const char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint16_t u16_at(const char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static double f64_at(const char *p) {
    double v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The pair at p + *i, before p + n (record_meta: its name's (u16) and value's (u32,
 * NO_VALUE: none, which only as_dict allows) lengths, then name and value): the lengths, and
 * *i moved to its name; 0 when it does not fit. */
static int pair_at(const char *p, Py_ssize_t n, Py_ssize_t *i, int as_dict, Py_ssize_t *name_len,
                   uint32_t *value_len) {
    if (*i + 6 > n)
        return 0;
    *name_len = u16_at(p + *i);
    *value_len = u32_at(p + *i + 2);
    int valued = *value_len != NO_VALUE;
    *i += 6;
    return !(*name_len > n - *i || (valued && (Py_ssize_t)*value_len > n - *i - *name_len) ||
             (!valued && !as_dict));
}

/* The pairs encoded at p + *at, before p + n (record_meta: their count, then each as its
 * name's (u16) and value's (u32, NO_VALUE: none) lengths, name, value), as record_meta
 * decodes them: a dict of str to str or None (as_dict), else a tuple of (str, str) pairs,
 * and *at moved past them. NULL without an exception when they do not fit, with one on
 * error. */
static PyObject *pairs_at(const char *p, Py_ssize_t n, Py_ssize_t *at, int as_dict) {
    if (*at + 2 > n)
        return NULL;
    Py_ssize_t count = u16_at(p + *at), i = *at + 2;
    PyObject *pairs = as_dict ? PyDict_New() : PyTuple_New(count);
    if (pairs == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t name_len;
        uint32_t value_len;
        if (!pair_at(p, n, &i, as_dict, &name_len, &value_len))
            goto malformed;
        int valued = value_len != NO_VALUE;
        PyObject *name = PyUnicode_DecodeUTF8(p + i, name_len, "surrogateescape"), *value;
        i += name_len;
        if (valued) {
            value = name ? PyUnicode_DecodeUTF8(p + i, value_len, "surrogateescape") : NULL;
            i += value_len;
        } else
            value = Py_NewRef(Py_None);
        int failed = name == NULL || value == NULL;
        if (!failed && as_dict)
            failed = PyDict_SetItem(pairs, name, value) < 0;
        else if (!failed) {
            PyObject *pair = PyTuple_Pack(2, name, value);
            failed = pair == NULL;
            if (pair != NULL)
                PyTuple_SET_ITEM(pairs, k, pair);
        }
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(pairs);
            return NULL;
        }
    }
    *at = i;
    return pairs;
malformed:
    Py_DECREF(pairs);
    return NULL;
}

/* Whether the pairs at p + *at fit before p + n, as pairs_at would read them (as_dict: a
 * value may be absent), *at moved past them: pairs_at's judgement, no object made. */
static int pairs_fit(const char *p, Py_ssize_t n, Py_ssize_t *at, int as_dict) {
    if (*at + 2 > n)
        return 0;
    Py_ssize_t count = u16_at(p + *at), i = *at + 2;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t name_len;
        uint32_t value_len;
        if (!pair_at(p, n, &i, as_dict, &name_len, &value_len))
            return 0;
        i += name_len + (value_len != NO_VALUE ? (Py_ssize_t)value_len : 0);
    }
    *at = i;
    return 1;
}

/* The record's checksum holds over buf[12:n] (the low 32 bits of checksum_hash, the only
 * bits its field keeps); -1 with an exception set on error. */
static int checksum_holds(PlainHits *self, const char *buf, Py_ssize_t n) {
    PyObject *view = PyMemoryView_FromMemory((char *)buf + 12, n - 12, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *sum = PyObject_CallOneArg(self->checksum, view);
    Py_DECREF(view);
    if (sum == NULL)
        return -1;
    unsigned long long value = PyLong_AsUnsignedLongLong(sum);
    Py_DECREF(sum);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return (uint32_t)value == u32_at(buf + 8);
}

/* Where the index places key's record: *region (a new reference), *offset, *length; 0 when
 * it holds none, -1 with an exception set on error. */
static int find_record(PlainHits *self, PyObject *hash, PyObject **region, long long *offset,
                       long long *length) {
    PyObject *found = PyObject_CallOneArg(self->disk_index_get, hash);
    if (found == NULL)
        return -1;
    if (found == Py_None) {
        Py_DECREF(found);
        return 0;
    }
    if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 3) {
        Py_DECREF(found);
        PyErr_SetString(PyExc_TypeError, "the disk index's get returns (region, offset, length)");
        return -1;
    }
    *offset = PyLong_AsLongLong(PyTuple_GET_ITEM(found, 1));
    *length = PyLong_AsLongLong(PyTuple_GET_ITEM(found, 2));
    *region = Py_NewRef(PyTuple_GET_ITEM(found, 0));
    Py_DECREF(found);
    if (PyErr_Occurred()) {
        Py_CLEAR(*region);
        return -1;
    }
    return 1;
}

/* Whether a ban may purge key's record at region and offset: a ban by prefix that does
 * (DiskTier.banned), or any ban by tag written after it, whose tags the proxy checks
 * (DiskTier.tag_banned); -1 with an exception set on error. */
static int banned(PlainHits *self, PyObject *key, PyObject *region, long long offset) {
    long long at = PyLong_AsLongLong(region);
    if (at == -1 && PyErr_Occurred())
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(self->disk_bans); i++) {
        PyObject *ban = PyList_GET_ITEM(self->disk_bans, i);
        if (!PyTuple_Check(ban) || PyTuple_GET_SIZE(ban) != 4) {
            PyErr_SetString(PyExc_TypeError, "a ban is (prefix or tag, region, offset, by_tag)");
            return -1;
        }
        long long ban_at = PyLong_AsLongLong(PyTuple_GET_ITEM(ban, 1));
        long long ban_offset = PyLong_AsLongLong(PyTuple_GET_ITEM(ban, 2));
        if (PyErr_Occurred())
            return -1;
        if (at < ban_at || (at == ban_at && offset < ban_offset)) {
            if (PyTuple_GET_ITEM(ban, 3) == Py_True)
                return 1;
            Py_ssize_t under = PyUnicode_Tailmatch(key, PyTuple_GET_ITEM(ban, 0), 0,
                                                   PY_SSIZE_T_MAX, -1);
            if (under != 0)
                return under < 0 ? -1 : 1;
        }
    }
    return 0;
}

/* Count a hit on key's disk record (a body of body_len bytes) as CacheEngine._hit_behind
 * counts one: 1 when the store's admission and promotion filter then take it
 * (CacheEngine._promotes: it is to be kept in memory too), 0 when not; -1, nothing counted,
 * when the objects it counts with cannot be made. Once counting began, what fails (an
 * observer, the admission) is reported, never the answer's: a request counted and then
 * answered again would count twice; the hit is then not kept. */
static int count_disk_hit(PlainHits *self, PyObject *key, PyObject *hash, Py_ssize_t body_len,
                          double now) {
    PyObject *one = PyLong_FromLong(1), *size = PyLong_FromSsize_t(body_len),
             *when = PyFloat_FromDouble(now);
    int rc = -1;
    if (one == NULL || size == NULL || when == NULL)
        goto done;
    rc = 1;
    Attr *engine_counts[] = {&attrs[A_REQUESTS], &attrs[A_HITS], &attrs[A_HITS_FROM_DISK]};
    for (size_t i = 0; i < 3; i++)
        if (attr_add(self->counters, engine_counts[i], one) < 0) {
            PyErr_WriteUnraisable(self->counters);
            rc = 0;
        }
    if (attr_add(self->disk_counters, &attrs[A_HITS], one) < 0) {
        PyErr_WriteUnraisable(self->disk_counters);
        rc = 0;
    }
    PyObject *observers[] = {self->disk_observe, self->observe};
    for (size_t i = 0; i < 2; i++)
        if (call_observer(observers[i], key, size, when) < 0) {
            PyErr_WriteUnraisable(observers[i]);
            rc = 0;
        }
    if (attr_add(self->counters, &attrs[A_HIT_BYTES], size) < 0 ||
        attr_add(self->counters, &attrs[A_BYTES_SERVED], size) < 0) {
        PyErr_WriteUnraisable(self->counters);
        rc = 0;
    }
    self->answered++;
    record_sampled(self, key, size, hash, when);
    /* Both asked, whatever the first said: each counts every sighting. */
    PyObject *args[] = {key, size, when};
    PyObject *asked[] = {self->admit, self->promotion_admit};
    for (int i = 0; i < 2; i++) {
        if (asked[i] == Py_None)
            continue;
        PyObject *says = PyObject_Vectorcall(asked[i], args, 3, NULL);
        int yes = says == NULL ? -1 : PyObject_IsTrue(says);
        Py_XDECREF(says);
        if (yes < 0)
            PyErr_WriteUnraisable(asked[i]);
        rc = rc && yes > 0;
    }
done:
    Py_XDECREF(one);
    Py_XDECREF(size);
    Py_XDECREF(when);
    return rc;
}

/* The RecordMeta of a record whose meta (m, meta_len bytes, its head head_len) disk_answer has
 * judged: made as tuple.__new__ makes it, its fields in order, no Python frame; NULL with an
 * exception set on error. */
static PyObject *make_record_meta(PlainHits *self, const char *m, Py_ssize_t meta_len,
                             Py_ssize_t head_len, PyObject *status) {
    Py_ssize_t at = META_SIZE + head_len;
    PyObject *fields = pairs_at(m, meta_len, &at, 0);
    PyObject *directives = fields ? pairs_at(m, meta_len, &at, 1) : NULL;
    PyObject *stored_at = PyFloat_FromDouble(f64_at(m + 2)),
             *lifetime = PyFloat_FromDouble(f64_at(m + 10)),
             *initial_age = PyFloat_FromDouble(f64_at(m + 18)),
             *head = PyBytes_FromStringAndSize(m + META_SIZE, head_len),
             *dated = PyBool_FromLong((unsigned char)m[26] & FLAG_DATED), *record = NULL;
    if (directives != NULL && stored_at && lifetime && initial_age && head && dated) {
        PyObject *items = PyTuple_Pack(8, status, stored_at, lifetime, initial_age, head, dated,
                                       fields, directives);
        PyObject *wrapped = items ? PyTuple_Pack(1, items) : NULL;
        Py_XDECREF(items);
        if (wrapped != NULL)
            record = PyTuple_Type.tp_new((PyTypeObject *)self->record_meta, wrapped, NULL);
        Py_XDECREF(wrapped);
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "a record's meta no longer reads");
    }
    Py_XDECREF(fields);
    Py_XDECREF(directives);
    Py_XDECREF(stored_at);
    Py_XDECREF(lifetime);
    Py_XDECREF(initial_age);
    Py_XDECREF(head);
    Py_XDECREF(dated);
    return record;
}

/* The answer to a plain request (head: HEAD) for key, whose hash the memory store holds
 * nothing under: the answer tuple; Py_False when the disk holds no record for it or may not
 * answer it (the handler fetches it); what disk_cold makes of one the page cache does not
 * hold (no answerer can answer it on the loop: the handler reads it off the loop, from where
 * it lies); NULL without an exception to decline (answer_hit decides), or NULL with one on
 * error. */
PyObject *disk_answer(PlainHits *self, PyObject *key, PyObject *hash, double now, int head) {
    PyObject *region = NULL, *record_bytes = NULL, *body = NULL, *status = NULL, *result = NULL;
    int uncacheable = PySequence_Contains(self->uncacheable, key);
    if (uncacheable != 0)
        return uncacheable < 0 ? NULL : Py_NewRef(Py_False);
    long long offset, length;
    int found = find_record(self, hash, &region, &offset, &length);
    if (found <= 0)
        return found < 0 ? NULL : Py_NewRef(Py_False);
    if (length < HEADER_SIZE + META_SIZE || length > self->read_inline)
        goto done;
    if (PyList_GET_SIZE(self->disk_bans) && banned(self, key, region, offset) != 0)
        goto done;
    PyObject *fd_obj = PyDict_GetItemWithError(self->disk_fds, region);
    if (fd_obj == NULL)
        goto done;
    long fd = PyLong_AsLong(fd_obj);
    struct stat st;
    if ((fd == -1 && PyErr_Occurred()) || fstat((int)fd, &st) != 0 || st.st_nlink == 0)
        goto done;
    Py_ssize_t key_len;
    const char *key_text = PyUnicode_AsUTF8AndSize(key, &key_len);
    if (key_text == NULL) {
        PyErr_Clear(); /* a key only surrogateescape encodes: the Python reader's */
        goto done;
    }
    if (length > self->scratch_size) {
        char *grown = PyMem_Realloc(self->scratch, (size_t)length);
        if (grown == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        self->scratch = grown;
        self->scratch_size = (Py_ssize_t)length;
    }
    /* One buffer for every read, warm in the CPU's caches; the event loop waits for the read
     * either way, so the lock is kept. A record whose body may go out apart from the head
     * (join_below) is read into a buffer of its own instead, which the answer then holds:
     * its body is not copied again. */
    char *buf = self->scratch;
    if (!head && length >= self->join_below) {
        record_bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
        if (record_bytes == NULL)
            goto done;
        buf = PyBytes_AS_STRING(record_bytes);
    }
    ssize_t got;
#ifdef RWF_NOWAIT
    /* Only what the page cache holds: a read the device must answer is the handler's, on a
     * worker thread (region_log.read, warm_only). */
    struct iovec iov = {buf, (size_t)length};
    do
        got = preadv2((int)fd, &iov, 1, (off_t)offset, RWF_NOWAIT);
    while (got < 0 && errno == EINTR);
    if (got < 0 && errno == EOPNOTSUPP)
#endif
        do
            got = pread((int)fd, buf, (size_t)length, (off_t)offset);
        while (got < 0 && errno == EINTR);
    if (got < 0 && errno == EAGAIN) {
        /* Not in the page cache: no answerer reads it on the loop, the handler reads it off
         * the loop, from where it was just found. */
        result = PyObject_CallFunction(self->disk_cold, "OOLL", key, region, offset, length);
        goto done;
    }
    if (got != (ssize_t)length || memcmp(buf, MAGIC, 4) != 0 || u32_at(buf + 4) != length)
        goto done;
    Py_ssize_t stored_key_len = u16_at(buf + 12), meta_len = u32_at(buf + 14);
    Py_ssize_t body_at = HEADER_SIZE + stored_key_len + meta_len;
    if (stored_key_len != key_len || meta_len < META_SIZE || body_at > length ||
        memcmp(buf + HEADER_SIZE, key_text, key_len) != 0)
        goto done;
    int checksum_ok = checksum_holds(self, buf, (Py_ssize_t)length);
    if (checksum_ok <= 0)
        goto done;
    const char *m = buf + HEADER_SIZE + key_len;
    double stored_at = f64_at(m + 2), lifetime = f64_at(m + 10), initial_age = f64_at(m + 18);
    unsigned flags = (unsigned char)m[26];
    Py_ssize_t head_len = u32_at(m + 31);
    if (u32_at(m + 27) != self->stamp || !(flags & FLAG_PLAIN) || head_len == 0 ||
        META_SIZE + head_len > meta_len)
        goto done;
    double age = stored_age(initial_age, stored_at, now);
    if (!answers_plain(age, lifetime))
        goto done;
    Py_ssize_t at = META_SIZE + head_len;
    if (!pairs_fit(m, meta_len, &at, 0) || !pairs_fit(m, meta_len, &at, 1))
        goto done;
    Py_ssize_t body_len = (Py_ssize_t)length - body_at;
    /* The body apart from the head: a view of the record's own buffer (read into one, as
     * the record is at least as long as its body). */
    if (!head && body_len >= self->join_below) {
        PyObject *record_view = PyMemoryView_FromObject(record_bytes);
        body = record_view ? PySequence_GetSlice(record_view, body_at, (Py_ssize_t)length)
                           : NULL;
        Py_XDECREF(record_view);
        if (body == NULL)
            goto done;
    }
    status = PyLong_FromLong(u16_at(m));
    if (status == NULL)
        goto done;
    /* Rendered first, then counted and kept: a render that fails leaves the request to the
     * handler, which then counts it once, as it finds it. */
    result = render(self, m + META_SIZE, head_len, flags & FLAG_DATED, "; detail=disk",
                    buf + body_at, body_len, body, head, lifetime, age, status);
    int admitted = result == NULL ? -1 : count_disk_hit(self, key, hash, body_len, now);
    if (admitted < 0) {
        Py_CLEAR(result);
        goto done;
    }
    /* Kept in memory too: the entry is the proxy's to make, from the record's meta. The hit
     * is counted: what this raises is reported, never the answer's. */
    if (admitted) {
        PyObject *record = make_record_meta(self, m, meta_len, head_len, status);
        PyObject *payload = record ? PyBytes_FromStringAndSize(buf + body_at, body_len) : NULL;
        PyObject *promote_args[] = {key, payload, record};
        PyObject *kept =
            payload ? PyObject_Vectorcall(self->disk_promote, promote_args, 3, NULL) : NULL;
        if (kept == NULL)
            PyErr_WriteUnraisable(self->disk_promote);
        Py_XDECREF(kept);
        Py_XDECREF(payload);
        Py_XDECREF(record);
    }
done:
    Py_XDECREF(region);
    Py_XDECREF(record_bytes);
    Py_XDECREF(body);
    Py_XDECREF(status);
    return result;
}
