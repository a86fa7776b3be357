/* Which requests the live what-if samples (proxy/core/whatif.py): those whose key's hash64 h1,
 * mixed with the sample's secret (its key), falls below the sample's bound. One definition for
 * the compiled hit path (proxy/handler/hitpath/answer.c) and the Python core
 * (proxy.core._native.sample_point). Keyed, so that a client who knows the hash cannot choose
 * URLs in or out of the sample, and steer what the ghosts (and `auto` disk admission) see.
 * The mix is MurmurHash3's 64-bit finalizer: every bit of h1 and of the key moves the point.
 * A key of 0 leaves the hash as it is. */
#ifndef ONEHIT_SAMPLE_H
#define ONEHIT_SAMPLE_H

#include <stdint.h>

/* MurmurHash3's 64-bit finalizer (the hashes of hash.c end with it too). */
static inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static inline uint64_t sample_point(uint64_t h1, uint64_t key) {
    if (key == 0) /* unkeyed: the hash itself, as the offline simulator samples (loadgen's
                     sample_trace), where no client chooses the keys */
        return h1;
    return fmix64(h1 ^ key);
}

#endif
