"""The cache engine: a store, an admission policy and the HTTP rules that decide between them.

Rules this module keeps:

* Drivers (the live proxy, the offline simulator) call ``lookup`` for every request, and
  ``on_response`` for every response fetched from the origin for a GET whose lookup did not hit.
  Every answer is a small frozen dataclass; drivers match on it.
* ``lookup``: a method other than GET or HEAD is a ``Bypass`` (counted apart). A fresh entry is a
  ``Hit`` (counted; the entry's hit count goes up). An entry that is expired, or that the request
  or response says must be revalidated (``no-cache``, request ``max-age``/``min-fresh``), is
  ``Stale`` (a miss; ``serve_stale`` says whether RFC 9111/5861 allow answering with it while
  revalidating). Nothing stored is a ``Miss``.
* ``on_response``: an uncacheable response is ``NotStored("uncacheable")``; one over the max
  object size is ``NotStored("too-large")`` without consulting the policy; a URL already stored
  (a refresh) is stored again without consulting the policy; otherwise the admission policy
  decides on the URL, and a refusal is ``NotStored("first-sighting")``.
* Variants (``Vary``) are stored under the URL plus the selecting request header values; the
  admission policy sees only the URL. ``invalidate`` removes a URL with all its variants.
* Time is an argument. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetools import LRUCache

from proxy.core import rfc9111
from proxy.core.admission import AdmissionPolicy
from proxy.core.rfc9111 import Headers
from proxy.core.stats import Counters, snapshot
from proxy.core.store import Entry, LRUStore

CACHEABLE_METHODS = frozenset({"GET", "HEAD"})
# URLs whose variant names are remembered; least recently used forgotten past this.
VARY_INDEX_SIZE = 1 << 20


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What the engine needs of a request: its URL key, method and header fields."""

    key: str
    method: str = "GET"
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What the engine needs of an origin response. ``response_meta`` builds one from HTTP."""

    cacheable: bool = True
    lifetime: float = float("inf")
    initial_age: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    vary: tuple[str, ...] = ()
    reason: str = ""
    payload: object = None


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    age: float


@dataclass(frozen=True, slots=True)
class Stale:
    entry: Entry
    age: float
    serve_stale: bool = False


@dataclass(frozen=True, slots=True)
class Miss:
    reason: str


@dataclass(frozen=True, slots=True)
class Bypass:
    reason: str


@dataclass(frozen=True, slots=True)
class Store:
    entry: Entry
    evicted: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class NotStored:
    reason: str


Lookup = Hit | Stale | Miss | Bypass
Outcome = Store | NotStored

_NO_DIRECTIVES: rfc9111.Directives = {}
URI_MISS = Miss("uri-miss")
METHOD_BYPASS = Bypass("method")
TOO_LARGE = NotStored("too-large")
FIRST_SIGHTING = NotStored("first-sighting")
COLLAPSED = NotStored("collapsed")


def response_meta(
    request: RequestMeta,
    status: int,
    headers: Headers,
    request_time: float,
    response_time: float,
    *,
    allow_set_cookie: bool = False,
    payload: object = None,
) -> ResponseMeta:
    """The engine's view of an origin response, by RFC 9111: storable or why not, lifetime,
    the age it already had when it arrived, and what it varies on."""
    ok, reason = rfc9111.storable(
        request.method, status, request.headers, headers, allow_set_cookie=allow_set_cookie
    )
    initial_age = rfc9111.current_age(headers, request_time, response_time, response_time)
    return ResponseMeta(
        cacheable=ok,
        lifetime=rfc9111.freshness_lifetime(status, headers),
        initial_age=initial_age,
        headers=tuple(headers),
        vary=rfc9111.vary_names(headers),
        reason=reason,
        payload=payload,
    )


class CacheEngine:
    """Drives ``store`` and ``admission`` and keeps the counters of both."""

    def __init__(self, store: LRUStore, admission: AdmissionPolicy) -> None:
        self.store = store
        self.admission = admission
        self.counters = Counters()
        # URL -> (varied-on header names, store keys of its variants)
        self._vary: LRUCache[str, tuple[tuple[str, ...], set[str]]] = LRUCache(VARY_INDEX_SIZE)

    def lookup(self, request: RequestMeta, now: float) -> Lookup:
        c = self.counters
        if request.method not in CACHEABLE_METHODS:
            c.bypass += 1
            return METHOD_BYPASS
        c.requests += 1
        entry = self.store.get(self._store_key(request))
        if entry is None:
            c.misses += 1
            return URI_MISS
        age = entry.age(now)
        fresh = age < entry.lifetime
        req = rfc9111.request_directives(request.headers) if request.headers else _NO_DIRECTIVES
        if fresh and (req or "no-cache" in entry.directives):
            fresh = rfc9111.fresh_enough(
                entry.lifetime, age, req
            ) and not rfc9111.must_revalidate_before_use(entry.directives, req)
        if fresh:
            c.hits += 1
            c.hit_bytes += entry.size
            c.bytes_served += entry.size
            self.store.record_hit(entry)
            return Hit(entry, age)
        c.misses += 1
        serve = rfc9111.may_serve_stale(entry.lifetime, age, req, entry.directives)
        return Stale(entry, age, serve)

    def on_response(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        size: int,
        now: float,
        *,
        fetched: bool = True,
        served: bool = True,
        admitted: bool | None = None,
    ) -> Outcome:
        """Decide whether an origin response to a request that did not hit is stored (``now``
        is when it arrived). ``fetched=False``: a response shared with a collapsed request, which
        counts as a sighting but not as an origin fetch, and is not stored twice.
        ``served=False``: a background refresh no client is waiting for. ``admitted``: the
        admission answer when the driver already asked an asynchronous backend (see
        ``admission_pending``); None asks the engine's own policy."""
        c = self.counters
        if fetched:
            c.origin_fetches += 1
            c.origin_bytes += size
        if served:
            c.bytes_served += size
        if not response.cacheable:
            c.uncacheable += 1
            return NotStored(response.reason or "uncacheable")
        store = self.store
        if not store.fits(size):
            c.too_large += 1
            return TOO_LARGE
        url = request.key
        key, known = self._storage_key(request, response)
        if known and not fetched:
            return COLLAPSED
        if admitted is None and not known:
            admitted = self.admission.admit(url, size, now)
        if not known and not admitted:
            c.rejected_first_sighting += 1
            c.bytes_not_written += size
            return FIRST_SIGHTING
        if response.vary:
            self._remember_variant(url, response.vary, key)
        elif url in self._vary:
            self.invalidate(url)  # the origin stopped varying: its old variants are unreachable
        entry = Entry(
            key,
            size,
            now,
            response.lifetime,
            response.initial_age,
            response.headers,
            rfc9111.response_directives(response.headers) if response.headers else {},
            response.payload,
        )
        try:
            evicted = store.put(entry)
        except ValueError:  # the body fits, but with headers past the overhead estimate it does not
            c.too_large += 1
            return TOO_LARGE
        c.admissions += 1
        c.bytes_written += size
        return Store(entry, tuple(evicted))

    def admission_pending(self, request: RequestMeta, response: ResponseMeta, size: int) -> bool:
        """Whether ``on_response`` for this response would consult the admission policy: a
        driver with an asynchronous backend asks it first, and only then."""
        if not response.cacheable or not self.store.fits(size):
            return False
        return not self._storage_key(request, response)[1]

    def _storage_key(self, request: RequestMeta, response: ResponseMeta) -> tuple[str, bool]:
        """The key a response is stored under (its variant, if it varies), and whether its URL
        is already known (stored, or has variants): a known URL skips admission."""
        url = request.key
        key = url
        if response.vary:
            key = _variant(url, rfc9111.vary_key(response.vary, request.headers))
        return key, key in self.store or url in self._vary

    def on_not_modified(
        self,
        entry: Entry,
        headers_304: Headers,
        request_time: float,
        now: float,
        *,
        served: bool = True,
    ) -> Entry:
        """A 304 answered a revalidation of ``entry``: refresh it (RFC 9111 section 4.3.4) and,
        when a client gets it, count the stored body as served from cache."""
        headers = tuple(rfc9111.updated_by_304(entry.headers, headers_304))
        entry.headers = headers
        entry.directives = rfc9111.response_directives(headers)
        entry.lifetime = rfc9111.freshness_lifetime(200, headers)
        entry.initial_age = rfc9111.current_age(headers_304, request_time, now, now)
        entry.stored_at = now
        c = self.counters
        c.revalidated += 1
        c.origin_fetches += 1
        if served:
            c.hit_bytes += entry.size
            c.bytes_served += entry.size
            self.store.record_hit(entry)
        return entry

    def served_stale(self, entry: Entry) -> None:
        """The driver answered with a stale ``entry`` (allowed by ``Stale.serve_stale``, or by
        ``stale-if-error`` after an origin failure)."""
        c = self.counters
        c.stale_served += 1
        c.hit_bytes += entry.size
        c.bytes_served += entry.size
        self.store.record_hit(entry)

    def may_serve_on_error(self, stale: Stale, request: RequestMeta) -> bool:
        """RFC 5861 ``stale-if-error``: may ``stale`` answer now that the origin failed?"""
        entry = stale.entry
        return rfc9111.may_serve_stale(
            entry.lifetime,
            stale.age,
            rfc9111.request_directives(request.headers),
            entry.directives,
            origin_failed=True,
        )

    def invalidate(self, url: str) -> int:
        """Remove ``url`` and every stored variant of it; returns how many entries went."""
        removed = 0
        _, variants = self._vary.pop(url, ((), set()))
        for key in (url, *variants):
            if self.store.delete(key) is not None:
                removed += 1
        return removed

    def on_unsafe_response(self, request: RequestMeta, status: int) -> int:
        """RFC 9111 section 4.4: a successful unsafe method invalidates its URL."""
        return self.invalidate(request.key) if rfc9111.invalidates(request.method, status) else 0

    def purge_prefix(self, prefix: str) -> int:
        """Remove every stored URL starting with ``prefix`` (with its variants)."""
        urls = {key.split("\0", 1)[0] for key in self.store if key.startswith(prefix)}
        return sum(self.invalidate(url) for url in urls)

    def stats(self) -> dict[str, int | float]:
        """Every metric of DESIGN.md section 4 at this instant."""
        return snapshot(self.counters, self.store, self.admission.filter_stats())

    def _store_key(self, request: RequestMeta) -> str:
        if not self._vary:
            return request.key
        known = self._vary.get(request.key)
        if known is None:
            return request.key
        return _variant(request.key, rfc9111.vary_key(known[0], request.headers))

    def _remember_variant(self, url: str, names: tuple[str, ...], key: str) -> None:
        known = self._vary.get(url)
        if known is None or known[0] != names:
            known = (names, set())
            self._vary[url] = known
        known[1].add(key)


def _variant(url: str, selected: tuple[tuple[str, str], ...]) -> str:
    return url + "\0" + "\0".join(f"{name}={value}" for name, value in selected)
