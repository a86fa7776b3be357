/* time.perf_counter's clock, read from C: the compiled paths time an answer from when its
 * request was read (the front's loop) to its log line (the access log), and a start taken by
 * either side is read against the other's. On Linux, perf_counter is CLOCK_MONOTONIC; the
 * compiled parts are Linux's (preadv2, memfd), and tests/test_log_lines.py holds the two
 * equal. */
#ifndef ONEHIT_CLOCK_H
#define ONEHIT_CLOCK_H

#include <time.h>

static inline double perf_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#endif
