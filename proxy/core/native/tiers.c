/* The disk tier's part of the simulator's loop (simulate.c): what DiskTier (proxy/core/disk.py)
 * does for a trace's responses, over the same DiskIndex, Admission and WriteBudget, and a ring
 * of regions kept as (oldest, next, fill) as proxy/core/regions.py's Regions keeps it. */
#include "native.h"

/* When each key's record was written (key hash -> time), kept only with a finite ttl: open
 * addressing, key 0 empty (a hash of 0 kept as 1, as the disk index keeps it), never shrunk,
 * as loadgen/sim/tiers.py's model keeps a dict. */
static int written_grow(Written *w) {
    uint64_t size = w->keys == NULL ? 1024 : (w->mask + 1) * 2;
    uint64_t *keys = PyMem_Calloc((size_t)size, sizeof(uint64_t));
    double *times = PyMem_Malloc((size_t)size * sizeof(double));
    if (keys == NULL || times == NULL) {
        PyMem_Free(keys);
        PyMem_Free(times);
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; w->keys != NULL && i <= w->mask; i++) {
        if (w->keys[i] == 0) continue;
        uint64_t s = slot_of(w->keys[i], size - 1);
        while (keys[s] != 0) s = (s + 1) & (size - 1);
        keys[s] = w->keys[i];
        times[s] = w->times[i];
    }
    PyMem_Free(w->keys);
    PyMem_Free(w->times);
    w->keys = keys;
    w->times = times;
    w->mask = size - 1;
    return 0;
}

static uint64_t written_slot(const Written *w, uint64_t key) {
    uint64_t s = slot_of(key, w->mask);
    while (w->keys[s] != 0 && w->keys[s] != key) s = (s + 1) & w->mask;
    return s;
}

static int written_set(Written *w, uint64_t key, double now) {
    key = key ? key : 1;
    if (w->keys == NULL || (uint64_t)(w->used + 1) * 2 > w->mask + 1) {
        if (written_grow(w) < 0) return -1;
    }
    uint64_t s = written_slot(w, key);
    if (w->keys[s] == 0) {
        w->keys[s] = key;
        w->used++;
    }
    w->times[s] = now;
    return 0;
}

int disk_answers(Disk *d, uint64_t h1, double now, double ttl, double *written) {
    const int found = disk_index_get(d->index, h1) != NULL;
    if (!found) {
        d->c[D_MISSES]++;
        return 0;
    }
    *written = 0.0;
    if (!isinf(ttl)) {
        /* a key on disk was written, so its slot is there */
        *written = d->written.times[written_slot(&d->written, h1 ? h1 : 1)];
        if (!fresh_for_plain(stored_age(0.0, *written, now), ttl)) {
            d->c[D_MISSES]++;
            return 0;
        }
    }
    d->c[D_HITS]++;
    return 1;
}

int disk_forget(Disk *d, uint64_t h1) {
    const DiskSlot *slot = disk_index_get(d->index, h1);
    if (slot == NULL) return 0;
    int done = disk_index_delete_at(d->index, h1, slot->region, slot->offset);
    if (done > 0) d->c[D_DROPPED]++;
    return done < 0 ? -1 : 0;
}

/* The ring's next region opened, its oldest evicted when it is full. */
static void disk_open_region(Disk *d) {
    if (d->next - d->oldest >= d->regions) {
        d->oldest++;
        d->c[R_EVICTIONS]++;
    }
    d->next++;
}

int disk_offer(Disk *d, uint64_t h1, uint64_t h2, long long size, long long length,
               double now, double ttl) {
    long long *c = d->c;
    if (disk_index_get(d->index, h1) != NULL) return 0;
    /* A ghost's record may be longer than its region, up to its tier's; never over the ring's
     * every region, which would evict its own start. */
    if (length < 1 || (length > d->region_size &&
                       (length > d->longest || (length - 1) / d->region_size + 1 >= d->regions))) {
        c[D_TOO_LARGE]++;
        return 0;
    }
    int admit = admission_admit(d->admission, h1, h2, size, now);
    if (admit <= 0) {
        if (admit < 0) return -1;
        c[D_REJECTED]++;
        c[D_BYTES_NOT_WRITTEN] += length;
        return 0;
    }
    if (!budget_allow(d->budget, now)) {
        c[D_THROTTLED]++;
        c[D_BYTES_NOT_WRITTEN] += length;
        return 0;
    }
    /* A tier's records never straddle two regions; a ghost's are written on from where the
     * last one ended (its regions are a share of its tier's, each of which holds many). */
    if (d->longest > 0 ? d->fill >= d->region_size : d->fill + length > d->region_size) {
        disk_open_region(d);
        d->fill = 0;
    }
    const uint32_t region = (uint32_t)(d->next - 1), offset = (uint32_t)d->fill;
    d->fill += length;
    for (; d->fill > d->region_size; d->fill -= d->region_size) disk_open_region(d);
    c[R_BYTES_WRITTEN] += length;
    DiskIndexObject *x = d->index;
    /* An empty index starts at the ring's oldest region: nothing older to drop one at a time. */
    if (x->live == 0 && x->first < d->oldest) x->first = (uint32_t)d->oldest;
    while (x->first < d->oldest) {
        long long gone = disk_index_evict_region(x, x->first);
        if (gone < 0) return -1;
        c[D_EVICTED_OBJECTS] += gone;
    }
    if (disk_index_put(x, h1, region, offset, (uint32_t)length) < 0) return -1;
    c[D_ADMISSIONS]++;
    c[D_BYTES_WRITTEN] += length;
    d->budget->bytes += length;
    if (!isinf(ttl) && written_set(&d->written, h1 ? h1 : 1, now) < 0) return -1;
    return 1;
}

void disk_done(Disk *d) {
    PyMem_Free(d->written.keys);
    PyMem_Free(d->written.times);
    d->written = (Written){0};
}
