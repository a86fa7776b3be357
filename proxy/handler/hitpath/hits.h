/* The compiled plain hit's shared types: the PlainHits object, the attributes it reads in their
 * slots (attrs.c), and what the request reader finds of a request. */
#ifndef ONEHIT_HITS_H
#define ONEHIT_HITS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>

#include "../../core/native/age.h"
#include "../../core/native/sample.h"
#include "../../core/native/slots.h"
#include "../../core/native/clock.h"
#include <strings.h>

typedef struct {
    PyObject_HEAD
    PyObject *entries;  /* dict: hash64(key)[0] -> Entry */
    PyObject *vary;     /* dict: URL -> its variants */
    PyObject *index;    /* StoreIndex */
    PyObject *counters; /* the engine's Counters */
    PyObject *observe;  /* the admission's observe, or None */
    PyObject *whatif;   /* the what-if's record, or None (proxy.core.whatif) */
    unsigned long long sample_below; /* the hits whose sample point is below it are its sample */
    unsigned long long sample_key;   /* the sample's secret (sample.h) */
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
    char query_as_sent; /* 0: a target with a query is the proxy's to key ([cache] key_query) */
    /* The disk tier behind the store (attach_disk), or disk_index NULL: none. */
    PyObject *disk_index;  /* DiskIndex, SharedIndex or a worker's FollowingIndex of it */
    PyObject *disk_index_get; /* its get: hash64(key)[0] -> (region, offset, length) */
    PyObject *record_meta; /* the RecordMeta type (a tuple's) */
    PyObject *disk_fds;    /* dict: region -> a descriptor open for reading it */
    PyObject *disk_bans;   /* list: DiskTier.bans, (prefix or tag, region, offset, by_tag) */
    PyObject *uncacheable; /* URLs remembered uncacheable: the handler's, not a disk hit */
    PyObject *checksum;    /* region_log.CHECKSUM_HASH: a checksum is its low 32 bits */
    PyObject *disk_promote; /* promote(key, body, RecordMeta): keeps a disk hit in memory */
    PyObject *disk_counters; /* the disk tier's DiskCounters */
    PyObject *disk_observe;  /* the disk admission's observe, or None */
    PyObject *admit;         /* the store's admission: is a disk hit kept in memory too? */
    PyObject *promotion_admit;      /* and then the promotion filter's, or None */
    PyObject *disk_cold;   /* cold(key, region, offset, length): a record to read off the loop */
    unsigned long stamp;   /* the record stamp a stored head must carry */
    Py_ssize_t read_inline;
    char *scratch; /* the buffer disk records are read into */
    Py_ssize_t scratch_size;
} PlainHits;

enum {
    A_METHOD, A_VERSION, A_SHOULD_CLOSE, A_UPGRADE, A_CHUNKED, A_PATH, A_RAW_HEADERS,
    A_KEY, A_INITIAL_AGE, A_STORED_AT, A_LIFETIME, A_DIRECTIVES, A_RENDERED, A_HEADERS,
    A_STATUS, A_PAYLOAD, A_SIZE, A_REQUESTS, A_HITS, A_HIT_BYTES, A_BYTES_SERVED,
    A_HITS_FROM_DISK, A_COUNT
};

extern Attr attrs[A_COUNT];
extern PyObject *s_touch, *s_record_hit, *s_no_cache;

/* What parse_plain found of one request. */
typedef struct {
    Py_ssize_t end;       /* offset just past its blank line */
    int head;             /* HEAD, not GET */
    int declined;         /* it carries a field of PlainHits.declined */
    const char *path, *host;
    Py_ssize_t path_len, host_len;
} RawRequest;

/* attrs.c */
int attrs_init(void);

/* read.c */
void init_tables(void);
int parse_plain(PlainHits *self, const char *data, Py_ssize_t size, Py_ssize_t start,
                RawRequest *r);
int scan_fields(PlainHits *self, PyObject *raw, PyObject **host);
int plain_request(PlainHits *self, PyObject *msg, int *head, PyObject **path);

/* answer.c */
int call_observer(PyObject *observe, PyObject *key, PyObject *size, PyObject *now);
void record_sampled(PlainHits *self, PyObject *key, PyObject *size, PyObject *hash,
                    PyObject *now);
PyObject *answer_key(PlainHits *self, PyObject *host, PyObject *path, int head);
PyObject *render(PlainHits *self, const char *fixed, Py_ssize_t fixed_len, int dated,
                 const char *detail, const char *body, Py_ssize_t body_len, PyObject *body_obj,
                 int head, double lifetime, double age, PyObject *status);

/* log.c */
extern PyTypeObject LogLinesType;

/* disk.c */
PyObject *disk_answer(PlainHits *self, PyObject *key, PyObject *hash, double now, int head);

#endif
