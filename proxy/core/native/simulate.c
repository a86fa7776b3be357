/* The simulator's per-request loop, for one tier or two, and the trace helpers it needs: key
 * hashes, footprints.
 *
 * One loop (replay) keeps the cache engine's rules for a cacheable response of a trace
 * (proxy/core/engine.py), with a disk tier behind the memory tier when one is given
 * (proxy/core/disk.py, the rules of loadgen/sim/tiers.py's model):
 *
 * - a fresh memory hit is answered from memory; a stale one is fetched again, the disk not
 *   asked;
 * - a response lives the trace's ttl, or the request's own lifetime where an operator's TTL
 *   rules gave each key its own (lifetimes: a key's every request carries its key's);
 * - a memory miss asks the disk: a record fresh by the trace's ttl (from when it was written)
 *   is a hit from disk, kept in memory too (promoted) when memory's admission takes it (asked
 *   as for a fetched response), then the promotion filter (CacheEngine._promotes), and it fits;
 * - a fetched response goes to memory if the admission (asked only for a key memory does not
 *   hold) takes it and it fits; one too large drops a stale copy it supersedes. The disk
 *   forgets its record of the key (the fetched response is the newest), then its own
 *   admission and write budget decide whether the response is written (tiers.c).
 *
 * tests/test_parity.py holds these counts equal to the live proxy's, and tests/test_tiers.py
 * the two-tier counts equal to the model's, request for request, on drawn traces. */
#include "native.h"

static const char *counter_names[T_COUNT] = {
    "requests", "hits", "misses", "hit_bytes", "bytes_served", "origin_fetches",
    "origin_bytes", "too_large", "rejected_first_sighting", "bytes_not_written", "admissions",
    "bytes_written", "hits_from_disk", "promoted", "beyond_memory",
    "disk_hits", "disk_misses", "disk_admissions", "disk_rejected", "disk_too_large",
    "disk_throttled", "disk_bytes_written", "disk_bytes_not_written", "disk_evicted_objects",
    "disk_dropped", "ring_oldest", "ring_next", "ring_fill", "ring_bytes_written",
    "ring_evictions",
};

int get_array(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t itemsize,
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

int format_decimal(char *out, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

/* A trace's requests as the loop reads them: numeric ids it formats after prefix, or ids into
 * per-name hashes and lengths; lengths, when given, each request's record on disk. */
typedef struct {
    Py_ssize_t n;
    const double *times;
    const uint64_t *ids;
    const long long *sizes;
    const long long *lengths;
    const uint64_t *nh1, *nh2;
    const long long *nchars;
    Py_ssize_t names;
    const char *prefix;
    Py_ssize_t prefix_len;
    long long prefix_chars;
    const double *lifetimes; /* each request's key's lifetime, or NULL: the call's ttl */
} Requests;

/* Memory stores h1 (replacing a stale entry): 1, or 0 when it is charged more than the store
 * holds, and then a stale entry it supersedes is dropped (the engine's _put refuses it and
 * _superseded drops the old one); -1 on error. */
static int memory_store(IndexObject *x, uint64_t h1, long long size, long long charge,
                        double stored_at) {
    if (charge > x->max_charge) {
        index_delete(x, h1);
        return 0;
    }
    return index_put(x, h1, size, charge, 0, stored_at, NULL) < 0 ? -1 : 1;
}

/* The requests through the memory tier x (admitting by a) and the disk tier d (NULL: none),
 * counted into c; -1 with an exception set. No tier keeps a body past max_object; memory none
 * past memory_max (a disk tier's may be larger: counted beyond_memory, as the engine does). */
static int replay(IndexObject *x, AdmissionObject *a, Disk *d, const Requests *q, double ttl,
                  long long overhead, long long max_object, long long memory_max,
                  long long *c) {
    char *key = PyMem_Malloc((size_t)q->prefix_len + 24);
    if (key == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(key, q->prefix, (size_t)q->prefix_len);
    const double call_ttl = ttl;
    for (Py_ssize_t r = 0; r < q->n; r++) {
        ttl = q->lifetimes != NULL ? q->lifetimes[r] : call_ttl;
        const int finite_ttl = !isinf(ttl);
        const double now = q->times[r];
        const long long size = q->sizes[r];
        uint64_t h1, h2;
        long long chars, key_bytes;
        if (q->nh1 != NULL) {
            uint64_t id = q->ids[r];
            if (id >= (uint64_t)q->names) {
                PyErr_Format(PyExc_IndexError, "key id %llu has no name", (unsigned long long)id);
                goto fail;
            }
            h1 = q->nh1[id];
            h2 = q->nh2[id];
            chars = key_bytes = q->nchars[id];
        } else {
            int digits = format_decimal(key + q->prefix_len, q->ids[r]);
            murmur3_128((const uint8_t *)key, q->prefix_len + digits, &h1, &h2);
            chars = q->prefix_chars + digits;
            key_bytes = q->prefix_len + digits;
        }
        c[C_REQUESTS]++;
        int32_t i = index_find(x, h1);
        if (i >= 0) {
            index_touch(x, i);
            Node *node = &x->nodes[i];
            /* The trace's responses arrive with no age, and live ttl seconds. */
            if (!finite_ttl || fresh_for_plain(stored_age(0.0, node->stored_at, now), ttl)) {
                if (admission_observe(a, h1, h2, node->size, now) < 0) goto fail;
                c[C_HITS]++;
                c[C_HIT_BYTES] += node->size;
                c[C_BYTES_SERVED] += node->size;
                index_record_hit(x, i);
                continue;
            }
        } else if (d != NULL) {
            double written;
            if (disk_answers(d, h1, now, ttl, &written)) {
                c[C_HITS]++;
                c[C_HITS_FROM_DISK]++;
                if (admission_observe(a, h1, h2, size, now) < 0 ||
                    admission_observe(d->admission, h1, h2, size, now) < 0)
                    goto fail;
                c[C_HIT_BYTES] += size;
                c[C_BYTES_SERVED] += size;
                int admitted = admission_admit(a, h1, h2, size, now);
                int again = d->promotion == NULL
                                ? 1 : admission_admit(d->promotion, h1, h2, size, now);
                if (admitted < 0 || again < 0) goto fail;
                admitted = admitted && again;
                if (admitted && size <= memory_max) {
                    int kept = memory_store(x, h1, size, overhead ? size + overhead + 2 * chars
                                                                  : size, written);
                    if (kept < 0) goto fail;
                    c[C_PROMOTED] += kept;
                    c[C_ADMISSIONS] += kept;
                    c[C_BYTES_WRITTEN] += kept * size;
                }
                continue;
            }
        }
        c[C_MISSES]++;
        c[C_ORIGIN_FETCHES]++;
        c[C_ORIGIN_BYTES] += size;
        c[C_BYTES_SERVED] += size;
        if (d != NULL && disk_forget(d, h1) < 0) goto fail;
        if (admission_observe(a, h1, h2, size, now) < 0) goto fail;
        int admit = 1;
        if (size > max_object) {
            c[C_TOO_LARGE]++;
            if (i >= 0) index_delete(x, h1);
            admit = 0;
        } else if (i < 0) {
            admit = admission_admit(a, h1, h2, size, now);
            if (admit < 0) goto fail;
            if (!admit) {
                c[C_REJECTED]++;
                c[C_BYTES_NOT_WRITTEN] += size;
            }
        }
        if (admit && size > memory_max) {
            c[C_BEYOND_MEMORY]++;
            if (i >= 0) index_delete(x, h1);
        } else if (admit) {
            int kept = memory_store(x, h1, size, overhead ? size + overhead + 2 * chars : size,
                                    now);
            if (kept < 0) goto fail;
            if (kept) {
                c[C_ADMISSIONS]++;
                c[C_BYTES_WRITTEN] += size;
            } else {
                c[C_TOO_LARGE]++;
            }
        }
        /* No tier is offered a body past the largest object: no copy of it is kept. */
        if (d != NULL && size <= max_object) {
            long long length = q->lengths != NULL ? q->lengths[r]
                                                  : d->record_overhead + key_bytes + size;
            if (admission_observe(d->admission, h1, h2, size, now) < 0 ||
                disk_offer(d, h1, h2, size, length, now, ttl) < 0)
                goto fail;
        }
    }
    PyMem_Free(key);
    return 0;
fail:
    PyMem_Free(key);
    return -1;
}

static PyObject *counted(const long long *c, int count) {
    PyObject *result = PyDict_New();
    if (result == NULL) return NULL;
    for (int k = 0; k < count; k++) {
        PyObject *v = PyLong_FromLongLong(c[k]);
        if (v == NULL || PyDict_SetItemString(result, counter_names[k], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(v);
    }
    return result;
}

/* The request arrays of a call (times, ids, sizes, lengths, names_h1, names_h2, names_chars,
 * lifetimes; None where absent) into q, their views in views (released by release_views). */
typedef struct {
    Py_buffer views[8];
    int held;
} Views;

static void release_views(Views *v) {
    for (int k = 0; k < v->held; k++) {
        if (v->views[k].obj != NULL) PyBuffer_Release(&v->views[k]);
    }
    v->held = 0;
}

static int read_requests(PyObject *const objs[8], Py_buffer *prefix, long long prefix_chars,
                         Requests *q, Views *v) {
    static const char *what[8] = {"times", "ids", "sizes", "lengths", "names_h1", "names_h2",
                                  "names_chars", "lifetimes"};
    const int named = objs[4] != Py_None;
    const char kinds[8] = {'f', named ? 'i' : 'u', 'i', 'i', 'u', 'u', 'i', 'f'};
    if (named && (objs[5] == Py_None || objs[6] == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "names_h1, names_h2 and names_chars come together");
        return -1;
    }
    for (v->held = 0; v->held < 8; v->held++) {
        Py_buffer *view = &v->views[v->held];
        if (objs[v->held] == Py_None) {
            memset(view, 0, sizeof(*view));
            continue;
        }
        if (get_array(objs[v->held], view, what[v->held], 8, kinds[v->held]) < 0) return -1;
    }
    Py_ssize_t n = v->views[0].len / 8;
    if (v->views[1].len / 8 != n || v->views[2].len / 8 != n ||
        (objs[3] != Py_None && v->views[3].len / 8 != n) ||
        (objs[7] != Py_None && v->views[7].len / 8 != n)) {
        PyErr_SetString(PyExc_ValueError,
                        "times, ids, sizes, lengths and lifetimes must have one length");
        return -1;
    }
    *q = (Requests){n, v->views[0].buf, v->views[1].buf, v->views[2].buf, v->views[3].buf,
                    v->views[4].buf, v->views[5].buf, v->views[6].buf, v->views[4].len / 8,
                    prefix->buf, prefix->len, prefix_chars, v->views[7].buf};
    return 0;
}

PyObject *py_simulate_chunk(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"index", "admission", "times", "ids", "sizes", "prefix",
                             "prefix_chars", "ttl", "entry_overhead", "max_object_bytes",
                             "names_h1", "names_h2", "names_chars", "lifetimes", NULL};
    PyObject *index_obj, *admission_obj;
    PyObject *objs[8] = {NULL, NULL, NULL, Py_None, Py_None, Py_None, Py_None, Py_None};
    Py_buffer prefix;
    long long prefix_chars, overhead, max_object;
    double ttl;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOy*LdLL|OOOO", kwlist, &IndexType,
                                     &index_obj, &AdmissionType, &admission_obj, &objs[0],
                                     &objs[1], &objs[2], &prefix, &prefix_chars, &ttl,
                                     &overhead, &max_object, &objs[4], &objs[5], &objs[6],
                                     &objs[7]))
        return NULL;
    Requests q;
    Views v = {.held = 0};
    long long c[T_COUNT] = {0};
    PyObject *result = NULL;
    if (read_requests(objs, &prefix, prefix_chars, &q, &v) == 0 &&
        replay((IndexObject *)index_obj, (AdmissionObject *)admission_obj, NULL, &q, ttl,
               overhead, max_object, max_object, c) == 0)
        result = counted(c, C_ONE_TIER);
    release_views(&v);
    PyBuffer_Release(&prefix);
    return result;
}

PyObject *py_simulate_tiers(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"index", "admission", "promotion", "disk_index", "disk_admission",
                             "budget", "ring", "times", "ids", "sizes", "prefix",
                             "prefix_chars", "ttl", "entry_overhead", "max_object_bytes",
                             "record_overhead", "lengths", "names_h1", "names_h2",
                             "names_chars", "lifetimes", "memory_max_bytes", NULL};
    PyObject *index_obj, *admission_obj, *promotion_obj, *dindex_obj, *dadmission_obj,
        *budget_obj;
    PyObject *objs[8] = {NULL, NULL, NULL, Py_None, Py_None, Py_None, Py_None, Py_None};
    Py_buffer prefix;
    long long prefix_chars, overhead, max_object, record_overhead, memory_max = -1;
    long long region_size, regions, oldest, next, fill;
    double ttl;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "O!O!OO!O!O!(LLLLL)OOOy*LdLLL|OOOOOL", kwlist, &IndexType, &index_obj,
            &AdmissionType, &admission_obj, &promotion_obj, &DiskIndexType, &dindex_obj,
            &AdmissionType,
            &dadmission_obj, &WriteBudgetType, &budget_obj, &region_size, &regions, &oldest,
            &next, &fill, &objs[0], &objs[1], &objs[2], &prefix, &prefix_chars, &ttl,
            &overhead, &max_object, &record_overhead, &objs[3], &objs[4], &objs[5], &objs[6],
            &objs[7], &memory_max))
        return NULL;
    if (memory_max < 0 || memory_max > max_object) memory_max = max_object;
    if (promotion_obj != Py_None && !PyObject_TypeCheck(promotion_obj, &AdmissionType)) {
        PyErr_SetString(PyExc_TypeError, "promotion is an Admission, or None");
        return NULL;
    }
    long long c[T_COUNT] = {0};
    Disk d = {(DiskIndexObject *)dindex_obj, (AdmissionObject *)dadmission_obj,
              (WriteBudgetObject *)budget_obj, region_size, regions, oldest, next, fill,
              record_overhead, {0}, c,
              promotion_obj == Py_None ? NULL : (AdmissionObject *)promotion_obj};
    Requests q;
    Views v = {.held = 0};
    PyObject *result = NULL;
    if (region_size < 1 || region_size > UINT32_MAX || regions < 2 || oldest > next ||
        next - oldest > regions || next >= UINT32_MAX || fill < 0 || fill > region_size) {
        PyErr_SetString(PyExc_ValueError, "ring = (region_size, regions, oldest, next, fill) of "
                        "a ring of at least 2 regions of at most 4 GiB");
    } else if ((!isinf(ttl) || objs[7] != Py_None) && d.index->live > 0) {
        /* When each record was written is known within one call only. */
        PyErr_SetString(PyExc_ValueError, "a finite ttl, or lifetimes, are replayed in one "
                        "call, from an empty disk tier");
    } else if (read_requests(objs, &prefix, prefix_chars, &q, &v) == 0 &&
               replay((IndexObject *)index_obj, (AdmissionObject *)admission_obj, &d, &q, ttl,
                      overhead, max_object, memory_max, c) == 0) {
        c[R_OLDEST] = d.oldest;
        c[R_NEXT] = d.next;
        c[R_FILL] = d.fill;
        result = counted(c, T_COUNT);
    }
    disk_done(&d);
    release_views(&v);
    PyBuffer_Release(&prefix);
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

