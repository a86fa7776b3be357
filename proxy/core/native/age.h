/* The age and freshness of a stored response, as the Python core computes them: one definition
 * for the compiled hit paths (proxy/handler/hitpath/: memory and disk) and the compiled simulator.
 *
 * - stored_age is Entry.age (RFC 9111 section 4.2.3): the age it arrived with, plus the time
 *   it has been stored, never negative whatever the clock did.
 * - fresh_for_plain is CacheEngine._fresh for a request with no cache directives and a stored
 *   response without no-cache: younger than its freshness lifetime. A lifetime that leaves no
 *   finite ttl (never expires) is fresh there too.
 * - answers_plain is what a compiled hit path answers: fresh_for_plain with a finite ttl to
 *   write (a response that never expires is the handler's).
 * tests/test_plain_hits.py holds the compiled answers equal to the Python ones. */
#ifndef ONEHIT_AGE_H
#define ONEHIT_AGE_H

#include <math.h>

static inline double stored_age(double initial_age, double stored_at, double now) {
    double resident = now - stored_at;
    return initial_age + (resident > 0.0 ? resident : 0.0);
}

static inline int fresh_for_plain(double age, double lifetime) { return age < lifetime; }

static inline int answers_plain(double age, double lifetime) {
    return fresh_for_plain(age, lifetime) && isfinite(lifetime - age);
}

#endif
