/* The simulator's per-request loop, and the trace helpers it needs: key hashes, footprints. */
#include "native.h"

enum {
    C_REQUESTS, C_HITS, C_MISSES, C_HIT_BYTES, C_BYTES_SERVED, C_ORIGIN_FETCHES,
    C_ORIGIN_BYTES, C_TOO_LARGE, C_REJECTED, C_BYTES_NOT_WRITTEN, C_ADMISSIONS,
    C_BYTES_WRITTEN, C_COUNT
};

static const char *counter_names[C_COUNT] = {
    "requests", "hits", "misses", "hit_bytes", "bytes_served", "origin_fetches",
    "origin_bytes", "too_large", "rejected_first_sighting", "bytes_not_written", "admissions",
    "bytes_written",
};

static int get_array(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t itemsize,
                     char kind) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    char f = view->format ? view->format[strlen(view->format) - 1] : 'B';
    int ok = view->itemsize == itemsize &&
             (kind == 'f' ? f == 'd' : (kind == 'u' ? (f == 'Q' || f == 'L')
                                                   : (f == 'q' || f == 'l')));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s array", what,
                     kind == 'f' ? "float64" : (kind == 'u' ? "uint64" : "int64"));
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int format_decimal(char *out, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

PyObject *py_simulate_chunk(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"index", "admission", "times", "ids", "sizes", "prefix",
                             "prefix_chars", "ttl", "entry_overhead", "max_object_bytes",
                             "names_h1", "names_h2", "names_chars", NULL};
    PyObject *index_obj, *admission_obj, *times_obj, *ids_obj, *sizes_obj;
    PyObject *nh1_obj = Py_None, *nh2_obj = Py_None, *nchars_obj = Py_None;
    Py_buffer prefix;
    long long prefix_chars, overhead, max_object;
    double ttl;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOy*LdLL|OOO", kwlist, &IndexType,
                                     &index_obj, &AdmissionType, &admission_obj, &times_obj,
                                     &ids_obj, &sizes_obj,
                                     &prefix, &prefix_chars, &ttl, &overhead, &max_object,
                                     &nh1_obj, &nh2_obj, &nchars_obj))
        return NULL;
    IndexObject *x = (IndexObject *)index_obj;
    AdmissionObject *a = (AdmissionObject *)admission_obj;
    Py_buffer tv, iv, sv, h1v = {0}, h2v = {0}, cv = {0};
    int named = nh1_obj != Py_None;
    PyObject *result = NULL;
    int have_t = 0, have_i = 0, have_s = 0, have_named = 0;
    if (get_array(times_obj, &tv, "times", 8, 'f') < 0) goto done;
    have_t = 1;
    if (get_array(ids_obj, &iv, "ids", 8, named ? 'i' : 'u') < 0) goto done;
    have_i = 1;
    if (get_array(sizes_obj, &sv, "sizes", 8, 'i') < 0) goto done;
    have_s = 1;
    if (named) {
        if (get_array(nh1_obj, &h1v, "names_h1", 8, 'u') < 0) goto done;
        if (get_array(nh2_obj, &h2v, "names_h2", 8, 'u') < 0) {
            PyBuffer_Release(&h1v);
            goto done;
        }
        if (get_array(nchars_obj, &cv, "names_chars", 8, 'i') < 0) {
            PyBuffer_Release(&h1v);
            PyBuffer_Release(&h2v);
            goto done;
        }
        have_named = 1;
    }
    Py_ssize_t n = tv.len / 8;
    if (iv.len / 8 != n || sv.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "times, ids and sizes must have one length");
        goto done;
    }
    const double *times = tv.buf;
    const uint64_t *ids = iv.buf;
    const long long *sizes = sv.buf;
    const uint64_t *nh1 = named ? h1v.buf : NULL, *nh2 = named ? h2v.buf : NULL;
    const long long *nchars = named ? cv.buf : NULL;
    Py_ssize_t names = named ? h1v.len / 8 : 0;
    long long c[C_COUNT] = {0};
    char *key = PyMem_Malloc((size_t)prefix.len + 24);
    if (key == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(key, prefix.buf, (size_t)prefix.len);
    const int finite_ttl = !isinf(ttl);
    for (Py_ssize_t r = 0; r < n; r++) {
        const double now = times[r];
        const long long size = sizes[r];
        uint64_t h1, h2;
        long long chars;
        if (named) {
            uint64_t id = ids[r];
            if (id >= (uint64_t)names) {
                PyErr_Format(PyExc_IndexError, "key id %llu has no name", (unsigned long long)id);
                PyMem_Free(key);
                goto done;
            }
            h1 = nh1[id];
            h2 = nh2[id];
            chars = nchars[id];
        } else {
            int digits = format_decimal(key + prefix.len, ids[r]);
            murmur3_128((const uint8_t *)key, prefix.len + digits, &h1, &h2);
            chars = prefix_chars + digits;
        }
        c[C_REQUESTS]++;
        int32_t i = index_find(x, h1);
        if (i >= 0) {
            index_touch(x, i);
            Node *node = &x->nodes[i];
            /* The trace's responses arrive with no age, and live ttl seconds. */
            if (!finite_ttl || fresh_for_plain(stored_age(0.0, node->stored_at, now), ttl)) {
                if (admission_observe(a, h1, h2, node->size, now) < 0) {
                    PyMem_Free(key);
                    goto done;
                }
                c[C_HITS]++;
                c[C_HIT_BYTES] += node->size;
                c[C_BYTES_SERVED] += node->size;
                index_record_hit(x, i);
                continue;
            }
        }
        c[C_MISSES]++;
        c[C_ORIGIN_FETCHES]++;
        c[C_ORIGIN_BYTES] += size;
        c[C_BYTES_SERVED] += size;
        if (admission_observe(a, h1, h2, size, now) < 0) {
            PyMem_Free(key);
            goto done;
        }
        if (size > max_object) {
            c[C_TOO_LARGE]++;
            continue;
        }
        if (i < 0) {
            int admit = admission_admit(a, h1, h2, size, now);
            if (admit < 0) {
                PyMem_Free(key);
                goto done;
            }
            if (!admit) {
                c[C_REJECTED]++;
                c[C_BYTES_NOT_WRITTEN] += size;
                continue;
            }
        }
        long long charge = overhead ? size + overhead + 2 * chars : size;
        if (charge > x->max_charge) {
            c[C_TOO_LARGE]++;
            continue;
        }
        if (index_put(x, h1, size, charge, 0, now, NULL) < 0) {
            PyMem_Free(key);
            goto done;
        }
        c[C_ADMISSIONS]++;
        c[C_BYTES_WRITTEN] += size;
    }
    PyMem_Free(key);
    result = PyDict_New();
    if (result == NULL) goto done;
    for (int k = 0; k < C_COUNT; k++) {
        PyObject *v = PyLong_FromLongLong(c[k]);
        if (v == NULL || PyDict_SetItemString(result, counter_names[k], v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(v);
    }
done:
    PyBuffer_Release(&prefix);
    if (have_t) PyBuffer_Release(&tv);
    if (have_i) PyBuffer_Release(&iv);
    if (have_s) PyBuffer_Release(&sv);
    if (have_named) {
        PyBuffer_Release(&h1v);
        PyBuffer_Release(&h2v);
        PyBuffer_Release(&cv);
    }
    return result;
}

/* h1 of each numeric id's key (prefix, then the id in decimal), as the simulator hashes it. */
PyObject *py_hash_ids(PyObject *module, PyObject *args) {
    PyObject *ids_obj, *out_obj;
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "Oy*O", &ids_obj, &prefix, &out_obj)) return NULL;
    Py_buffer iv, ov;
    PyObject *result = NULL;
    if (get_array(ids_obj, &iv, "ids", 8, 'u') < 0) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &ov, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        goto release_ids;
    if (ov.itemsize != 8 || ov.len != iv.len) {
        PyErr_SetString(PyExc_ValueError, "out must be a writable uint64 array as long as ids");
        goto release_all;
    }
    char *key = PyMem_Malloc((size_t)prefix.len + 24);
    if (key == NULL) {
        PyErr_NoMemory();
        goto release_all;
    }
    memcpy(key, prefix.buf, (size_t)prefix.len);
    const uint64_t *ids = iv.buf;
    uint64_t *out = ov.buf;
    Py_ssize_t n = iv.len / 8;
    for (Py_ssize_t r = 0; r < n; r++) {
        uint64_t h2;
        int digits = format_decimal(key + prefix.len, ids[r]);
        murmur3_128((const uint8_t *)key, prefix.len + digits, &out[r], &h2);
    }
    PyMem_Free(key);
    result = Py_NewRef(Py_None);
release_all:
    PyBuffer_Release(&ov);
release_ids:
    PyBuffer_Release(&iv);
    PyBuffer_Release(&prefix);
    return result;
}

/* Distinct objects and their bytes, each at its largest requested size, through one
 * open-addressing table of (id, largest size) slots, -1 marking an empty one: linear in the
 * trace where sorting it would not be, and sized by the objects rather than the requests. */
typedef struct {
    uint64_t id;
    long long largest;
} Seen;

static Seen *seen_table(uint64_t slots) {
    Seen *t = PyMem_Malloc(sizeof(Seen) * slots);
    if (t != NULL) {
        for (uint64_t i = 0; i < slots; i++) t[i].largest = -1;
    }
    return t;
}

PyObject *py_footprint(PyObject *module, PyObject *args) {
    PyObject *ids_obj, *sizes_obj;
    if (!PyArg_ParseTuple(args, "OO", &ids_obj, &sizes_obj)) return NULL;
    Py_buffer iv, sv;
    if (get_array(ids_obj, &iv, "ids", 8, 'u') < 0) return NULL;
    if (get_array(sizes_obj, &sv, "sizes", 8, 'i') < 0) {
        PyBuffer_Release(&iv);
        return NULL;
    }
    Py_ssize_t n = iv.len / 8;
    PyObject *result = NULL;
    if (sv.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "ids and sizes must have one length");
        goto done;
    }
    uint64_t mask = 1023;
    Seen *table = seen_table(mask + 1);
    if (table == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const uint64_t *ids = iv.buf;
    const long long *sizes = sv.buf;
    long long objects = 0, bytes = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (sizes[r] < 0) {
            PyMem_Free(table);
            PyErr_Format(PyExc_ValueError, "request %zd has a negative size", r);
            goto done;
        }
        uint64_t s = slot_of(ids[r], mask);
        while (table[s].largest >= 0 && table[s].id != ids[r]) s = (s + 1) & mask;
        if (table[s].largest < 0) {
            table[s].id = ids[r];
            table[s].largest = sizes[r];
            objects++;
            bytes += sizes[r];
            if ((uint64_t)objects * 2 > mask + 1) {
                uint64_t bigger = (mask + 1) * 2 - 1;
                Seen *grown = seen_table(bigger + 1);
                if (grown == NULL) {
                    PyMem_Free(table);
                    PyErr_NoMemory();
                    goto done;
                }
                for (uint64_t i = 0; i <= mask; i++) {
                    if (table[i].largest < 0) continue;
                    uint64_t t = slot_of(table[i].id, bigger);
                    while (grown[t].largest >= 0) t = (t + 1) & bigger;
                    grown[t] = table[i];
                }
                PyMem_Free(table);
                table = grown;
                mask = bigger;
            }
        } else if (sizes[r] > table[s].largest) {
            bytes += sizes[r] - table[s].largest;
            table[s].largest = sizes[r];
        }
    }
    PyMem_Free(table);
    result = Py_BuildValue("(LL)", objects, bytes);
done:
    PyBuffer_Release(&iv);
    PyBuffer_Release(&sv);
    return result;
}

