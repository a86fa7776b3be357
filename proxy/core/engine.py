"""The cache engine: a store, an admission policy and the HTTP rules that decide between them.

Rules this module keeps:

* A driver (the live proxy) asks ``plan`` what to do with a request and gets one action, a small
  frozen dataclass: ``FromCache`` (answer from a stored response), ``Revalidate`` (ask the origin
  about a stored one), ``Fetch`` (go to the origin) or ``Refuse`` (answer with an error, no origin
  contact). The offline simulator calls ``lookup`` and ``on_response`` directly: the same
  counting, the same store, the same admission.
* ``lookup``: a method other than GET or HEAD is a ``Bypass`` (counted apart). A fresh entry is a
  ``Hit`` (counted; the entry's hit count goes up). An entry that is expired, or that the request
  or response says must be revalidated (``no-cache``, request ``max-age``/``min-fresh``), is
  ``Stale`` (a miss; ``serve_stale`` says whether RFC 9111/5861 allow answering with it while
  revalidating). Nothing stored is a ``Miss``.
* ``fresh`` (and ``fresh_plain``, for a request without Cookie, Cache-Control or Pragma)
  peeks for a driver that writes hits itself: the hit ``lookup`` would find, with nothing
  counted or moved; ``served`` then counts it exactly as ``lookup`` does.
* ``plan`` on top of it: ``only-if-cached`` never contacts the origin (a stale entry answers only
  when it may be served stale; else 504, section 5.2.1.7). A GET miss fetches the whole
  representation (``Fetch.whole``): the client's conditionals and Range are answered from what
  arrives (``answer``), so what revalidating browsers and video players ask for is cached too.
  A URL whose response was uncacheable a moment ago (``hit_for_miss`` seconds) goes straight to
  the origin with the client's own fields and is not collapsed.
* Responses are decided from their head, before their body: ``on_response_head`` says ``Keep``
  (copy the body as it streams) or ``NotStored`` (stream it, keep nothing). An uncacheable
  response is ``NotStored(reason)``; one over the max object size is ``NotStored("too-large")``
  without consulting the policy; a URL already stored (a refresh) is kept without consulting the
  policy; otherwise the admission policy decides on the URL, and a refusal is
  ``NotStored("first-sighting")``. ``finish`` then stores a kept body that ended whole and fits;
  a body cut short is never stored. ``on_response`` is both steps for a body already in hand;
  ``on_shared`` counts a request answered by another's fetch as a sighting, not a fetch.
* A full response to a revalidation that may not be stored removes the stored one (section
  4.3.4); a 304 refreshes it, keeping its status, and re-charges its size.
* Variants (``Vary``) are stored under the URL plus the selecting request header values; the
  admission policy sees only the URL. The index of a URL's variants holds only stored variants:
  a variant leaves it when evicted or deleted, so it is bounded by the store's byte budget.
  ``invalidate`` removes a URL with all its variants.
* Cookies (as Varnish's built-in policy): a request carrying a cookie that is not ignored is
  never answered from a stored response, nor collapsed with another request, and its response
  is stored only when it is meant for shared caches (``public``, ``s-maxage``,
  CDN-Cache-Control), as with ``Authorization``. A stored response never carries a
  ``Set-Cookie``.
* Memory is bounded by configuration: at most ``max_variants`` variants per URL (responses for
  more are not stored, ``NotStored("variants")``), the hit-for-miss memory by bytes, the Vary
  index by the stored variants, the store by its capacity (which charges keys and headers).
* Time is an argument. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, NamedTuple

from cachetools import LRUCache

from proxy.core import rfc9111
from proxy.core._native import StoreIndex
from proxy.core.admission import AdmissionPolicy
from proxy.core.rfc9111 import Headers
from proxy.core.stats import Counters, snapshot
from proxy.core.store import CacheStore, Entry

CACHEABLE_METHODS = frozenset({"GET", "HEAD"})
# Bytes of URLs remembered as uncacheable (hit-for-miss); least recently used forgotten past
# this, so a flood of long uncacheable URLs cannot grow the process.
HIT_FOR_MISS_BYTES = 4 << 20
# What one remembered URL costs beyond its characters (dict slot, float, tuple).
_REMEMBERED_OVERHEAD = 160


class RequestMeta(NamedTuple):
    """What the engine needs of a request: its URL key, method and header fields.

    Named tuples, this and ``ResponseMeta``, ``Answer`` and ``Keep``, not frozen dataclasses
    like the other events: one of each is made for every miss, and a tuple is made three
    times as fast while being just as immutable."""

    key: str
    method: str = "GET"
    headers: Headers = ()


class ResponseMeta(NamedTuple):
    """What the engine needs of an origin response. ``response_meta`` builds one from HTTP."""

    cacheable: bool = True
    lifetime: float = float("inf")
    initial_age: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    vary: tuple[str, ...] = ()
    reason: str = ""
    payload: object = None
    status: int = 200
    # The cache directives of ``headers`` as ``rfc9111.response_directives`` parses them, when
    # already parsed; None: parsed from ``headers`` when the response is stored.
    directives: rfc9111.Directives | None = None


# What ``lookup`` found.


class Hit(NamedTuple):
    """A fresh stored response and its age. A named tuple, as ``Keep``: one is made for every
    hit, the live proxy's hottest allocation."""

    entry: Entry
    age: float


class HitState(NamedTuple):
    """What ``fresh_plain`` and ``served`` read and change, for a compiled driver that finds
    and counts plain hits itself: it must find a hit as ``fresh_plain`` does and count it as
    ``served`` does."""

    entries: dict[int, Entry]  # the store's entries by their key's hash
    vary: dict[str, Any]  # URLs with stored variants (``fresh_plain`` declines them)
    index: StoreIndex  # the store's eviction order and hit counts
    counters: Counters
    observe: Callable[[str, int, float], None] | None  # the admission's, when it observes


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


Lookup = Hit | Stale | Miss | Bypass

# What ``plan`` tells the driver to do.


@dataclass(frozen=True, slots=True)
class FromCache:
    """Answer from ``entry``. ``fresh``: a hit; else a stale answer RFC 9111/5861 allow, and
    ``refresh`` asks for a background revalidation (stale-while-revalidate)."""

    entry: Entry
    age: float
    fresh: bool = True
    refresh: bool = False


@dataclass(frozen=True, slots=True)
class Revalidate:
    """Send the origin a conditional GET with ``conditions`` (the entry's validators).
    ``stale_if_error``: the entry may answer if the origin fails (RFC 5861)."""

    entry: Entry
    age: float
    conditions: tuple[tuple[str, str], ...]
    stale_if_error: bool


@dataclass(frozen=True, slots=True)
class Fetch:
    """Go to the origin. ``whole``: fetch the whole representation without the client's
    conditionals and Range, and answer them from it. ``collapse``: share the fetch with
    concurrent requests for the same URL. ``reason`` is the Cache-Status ``fwd`` value:
    ``uri-miss``, ``method``, ``stale`` (a HEAD on a stale entry), or ``bypass`` (the URL was
    uncacheable a moment ago: hit-for-miss)."""

    reason: str
    whole: bool
    collapse: bool


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer ``status`` without contacting the origin."""

    status: int
    text: str
    reason: str


Action = FromCache | Revalidate | Fetch | Refuse

# What becomes of a response.


class Keep(NamedTuple):
    """Copy the body while it streams; ``finish`` stores it if it ends whole and fits. (A
    named tuple: one is made for every admitted miss, the simulator's hottest allocation.)"""

    key: str
    response: ResponseMeta


@dataclass(frozen=True, slots=True)
class Store:
    entry: Entry
    evicted: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class NotStored:
    reason: str


Outcome = Store | NotStored

# How a client's conditional or Range request is answered from a whole response.


class Answer(NamedTuple):
    """``status`` 304 (a matching validator), 206 (bytes ``first``..``last``), 416, or the
    response's own status with the whole body."""

    status: int
    first: int = 0
    last: int = -1


_NO_DIRECTIVES: rfc9111.Directives = {}
URI_MISS = Miss("uri-miss")
METHOD_BYPASS = Bypass("method")
TOO_LARGE = NotStored("too-large")
FIRST_SIGHTING = NotStored("first-sighting")
COLLAPSED = NotStored("collapsed")
CUT_SHORT = NotStored("cut-short")
TOO_MANY_VARIANTS = NotStored("variants")
# A stored response that a request with a cookie may not be answered with.
PRIVATE_MISS = Miss("cookie")
# The request fields the cache's rules read, and no others: a GET or HEAD carrying none of
# them is answered by its key alone (``fresh_plain``), on every path. One list, which the
# proxy's paths (the compiled one included) take from here.
CONDITIONALS = ("if-none-match", "if-modified-since")  # a match is answered 304 (RFC 9110 13.1)
PRECONDITIONS = ("if-match", "if-unmodified-since")  # the origin's to judge
# Fields a stored response answers itself: a 304, or a range's 206 or 416 (section 14).
ANSWERED_FIELDS = frozenset({*CONDITIONALS, "range", "if-range"})
# What a whole-object fetch leaves out of the client's request (``Fetch.whole``).
CLIENT_ASKS = ANSWERED_FIELDS | frozenset(PRECONDITIONS)
RULE_FIELDS = CLIENT_ASKS | {"cookie", "cache-control", "pragma"}
# Request fields that keep a hit off a fast path, whatever is stored: a precondition, and a
# body's framing (a GET with content passes the cache by).
NOT_FAST = frozenset({*PRECONDITIONS, "transfer-encoding", "content-length"})
# The fetches ``plan`` asks for, made once: each is immutable.
FETCH_WHOLE = Fetch("uri-miss", whole=True, collapse=True)
FETCH_AS_ASKED = Fetch("uri-miss", whole=False, collapse=False)
FETCH_BYPASS = Fetch("bypass", whole=False, collapse=False)
FETCH_STALE = Fetch("stale", whole=False, collapse=False)
# Request fields ``plan`` reads on a miss; most requests carry none of them.
_PLAN_FIELDS = frozenset({"cache-control", "cookie", *PRECONDITIONS})
# Reasons a response may not be stored that belong to the request, not to the URL.
_REQUEST_REASONS = frozenset({"cookie", "authorization", "request-no-store", "method"})


def response_meta(
    request: RequestMeta,
    status: int,
    headers: Headers,
    request_time: float,
    response_time: float,
    *,
    allow_set_cookie: bool = False,
    ignored_cookies: tuple[str, ...] = (),
    payload: object = None,
) -> ResponseMeta:
    """The engine's view of an origin response, by RFC 9111: storable or why not, lifetime,
    the age it already had when it arrived, and what it varies on. Its ``headers`` are what
    may be stored and shared: never a ``Set-Cookie``, whatever ``allow_set_cookie`` says (a
    cookie set for one client is never replayed to another)."""
    fields = headers if type(headers) is rfc9111.Fields else rfc9111.Fields(headers)
    ok, reason, lifetime, initial_age, vary, directives = rfc9111.response_rules(
        request.method, status, request.headers, fields, request_time, response_time,
        allow_set_cookie=allow_set_cookie, ignored_cookies=ignored_cookies,
    )  # fmt: skip
    if "set-cookie" in fields.by_name:
        headers = [h for h in headers if h[0].lower() != "set-cookie"]
    return ResponseMeta(
        cacheable=ok,
        lifetime=lifetime,
        initial_age=initial_age,
        headers=tuple(headers),
        vary=vary,
        reason=reason,
        payload=payload,
        status=status,
        directives=directives,
    )


def _directives(response: ResponseMeta) -> rfc9111.Directives:
    if response.directives is not None:
        return response.directives
    return rfc9111.response_directives(response.headers) if response.headers else {}


def _fresh(entry: Entry, age: float, req: rfc9111.Directives) -> bool:
    """Whether ``entry`` at ``age`` answers a request with directives ``req`` without
    revalidation (RFC 9111 sections 4.2, 5.2.1 and 5.2.2)."""
    if age >= entry.lifetime:
        return False
    if req or "no-cache" in entry.directives:
        return rfc9111.fresh_enough(
            entry.lifetime, age, req
        ) and not rfc9111.must_revalidate_before_use(entry.directives, req)
    return True


class CacheEngine:
    """Drives ``store`` and ``admission`` and keeps the counters of both. ``hit_for_miss``:
    seconds a URL whose response was uncacheable goes straight to the origin (0: never).
    ``max_variants``: variants stored per URL. ``ignore_cookies``: cookie names (globs) that
    do not make a request private."""

    def __init__(
        self,
        store: CacheStore,
        admission: AdmissionPolicy,
        *,
        hit_for_miss: float = 0.0,
        max_variants: int = 32,
        ignore_cookies: tuple[str, ...] = (),
    ) -> None:
        self.store = store
        self.admission = admission
        self.hit_for_miss = hit_for_miss
        self.max_variants = max_variants
        self.ignore_cookies = ignore_cookies
        self.counters = Counters()
        # The class of the entries stored: a driver's subclass keeps what it derives from an
        # entry (the proxy's rendered head) beside it, and the core never reads it.
        self.entry_type: type[Entry] = Entry
        # URL -> (varied-on header names, store keys of its stored variants)
        self._vary: dict[str, tuple[tuple[str, ...], set[str]]] = {}
        # URL -> (until when it goes straight to the origin, bytes it is charged)
        self._uncacheable: LRUCache[str, tuple[float, int]] = LRUCache(
            HIT_FOR_MISS_BYTES, getsizeof=_second
        )

    # Requests

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
        if self._private(request, entry):
            c.misses += 1
            return PRIVATE_MISS
        age = entry.age(now)
        req = rfc9111.request_directives(request.headers) if request.headers else _NO_DIRECTIVES
        if _fresh(entry, age, req):
            return self._count_hit(request.key, Hit(entry, age), now)
        c.misses += 1
        serve = rfc9111.may_serve_stale(entry.lifetime, age, req, entry.directives)
        return Stale(entry, age, serve)

    def fresh(self, request: RequestMeta, now: float) -> Hit | None:
        """The stored response that answers ``request`` as a hit, or None; nothing is counted
        or moved. A driver with a faster way to answer a hit peeks here, and then calls
        ``served`` (counted exactly as ``lookup`` counts a hit) or ``plan``."""
        if request.method not in CACHEABLE_METHODS:
            return None
        entry = self.store.peek(self._store_key(request))
        if entry is None or self._private(request, entry):
            return None
        age = entry.age(now)
        req = rfc9111.request_directives(request.headers) if request.headers else _NO_DIRECTIVES
        return Hit(entry, age) if _fresh(entry, age, req) else None

    def fresh_plain(self, key: str, now: float) -> Hit | None:
        """``fresh`` for a GET or HEAD of ``key`` whose fields the driver has checked hold
        none the rules read (Cookie, Cache-Control, Pragma), so none are scanned. None when
        the URL has variants: they are selected on fields."""
        if self._vary and key in self._vary:
            return None
        entry = self.store.peek(key)
        if entry is None:
            return None
        age = entry.age(now)
        return Hit(entry, age) if _fresh(entry, age, _NO_DIRECTIVES) else None

    def varies(self, key: str) -> bool:
        """Whether the URL ``key`` has stored variants (its hits are chosen on fields)."""
        return key in self._vary

    def hit_state(self) -> HitState:
        """The objects ``fresh_plain`` and ``served`` work on; they stay the same objects for
        the engine's life."""
        observe = self.admission.observe if self.admission.observes else None
        return HitState(self.store.by_hash, self._vary, self.store.index, self.counters, observe)

    def served(self, key: str, hit: Hit, now: float) -> Hit:
        """Count ``hit`` (from ``fresh``) on the URL ``key`` as answered, as ``lookup``
        would have."""
        self.counters.requests += 1
        self.store.touch(hit.entry)
        return self._count_hit(key, hit, now)

    def _count_hit(self, key: str, hit: Hit, now: float) -> Hit:
        entry = hit.entry
        if self.admission.observes:
            self.admission.observe(key, entry.size, now)
        c = self.counters
        c.hits += 1
        c.hit_bytes += entry.size
        c.bytes_served += entry.size
        self.store.record_hit(entry)
        return hit

    def _private(self, request: RequestMeta, entry: Entry) -> bool:
        """``request`` carries a cookie and ``entry`` is not meant for shared caches."""
        return self.carries_cookie(request) and not rfc9111.meant_for_shared_caches(
            entry.headers, entry.directives
        )

    def plan(self, request: RequestMeta, now: float) -> Action:
        """What the driver does with ``request`` (see the module's rules)."""
        found = self.lookup(request, now)
        if type(found) is Hit:
            return FromCache(found.entry, found.age)
        if type(found) is Bypass:
            return Fetch(found.reason, whole=False, collapse=False)
        headers = request.headers
        if type(found) is Miss and _none_of(headers, _PLAN_FIELDS):
            # What the rules below decide for a request without those fields, read at once.
            return self._plain_fetch(request, now)
        offline = rfc9111.only_if_cached(headers)
        if type(found) is Stale:
            entry = found.entry
            if found.serve_stale:
                self.served_stale(entry)
                return FromCache(entry, found.age, fresh=False, refresh=not offline)
            if offline:
                return Refuse(504, "only-if-cached: the stored response is stale", "stale")
            if request.method == "HEAD":
                return FETCH_STALE
            conditions = tuple(rfc9111.conditional_headers(entry.headers))
            return Revalidate(
                entry, found.age, conditions, self._may_serve_on_error(found, request)
            )
        if offline:
            return Refuse(504, "only-if-cached: not in cache", "uri-miss")
        if found is PRIVATE_MISS or self.carries_cookie(request):
            # Answered for this user alone: never shared with another request's fetch.
            return FETCH_BYPASS
        # A precondition other than a validator check (If-Match, If-Unmodified-Since) is the
        # origin's to judge, and a request that forbids storing cannot be answered from what
        # the cache fetched for itself: such requests go as the client sent them.
        whole = not any(
            rfc9111.get_first(headers, name) for name in PRECONDITIONS
        ) and "no-store" not in rfc9111.request_directives(headers)
        return self._plain_fetch(request, now, whole=whole)

    def _plain_fetch(self, request: RequestMeta, now: float, *, whole: bool = True) -> Fetch:
        """The fetch of a miss that may be shared, unless its URL was uncacheable a moment ago
        (hit-for-miss); ``whole`` when the request's fields allow it."""
        remembered = self._uncacheable.get(request.key)
        if remembered is not None:
            if now < remembered[0]:
                self.counters.hit_for_miss += 1
                return FETCH_BYPASS
            del self._uncacheable[request.key]
        return FETCH_WHOLE if whole and request.method == "GET" else FETCH_AS_ASKED

    def carries_cookie(self, request: RequestMeta) -> bool:
        """Whether ``request`` sends a cookie that is not ignored (see the module's rules)."""
        return bool(request.headers) and rfc9111.carries_cookie(
            request.headers, self.ignore_cookies
        )

    def answer(
        self, request: RequestMeta, status: int, headers: Headers, length: int | None
    ) -> Answer:
        """How a whole ``status`` response of ``length`` body bytes answers ``request``: 304
        when a client conditional matches its validators (RFC 9110 section 13.1), 206 or 416
        for a single byte range of a 200 (section 14; not when the length is unknown, which
        RFC 9110 allows: Range is optional), else the response itself."""
        asked = request.headers
        if status != 200 or _none_of(asked, ANSWERED_FIELDS):
            return Answer(status)
        conditional = any(rfc9111.get_first(asked, name) is not None for name in CONDITIONALS)
        if conditional and rfc9111.not_modified(asked, headers):
            self.counters.not_modified_answers += 1
            return Answer(304)
        if length is None or request.method != "GET" or rfc9111.get_first(asked, "range") is None:
            return Answer(status)
        wanted = rfc9111.byte_range(asked, headers, length)
        if wanted is None:
            return Answer(status)
        self.counters.range_answers += 1
        if wanted is False:
            return Answer(416)
        return Answer(206, *wanted)

    # Responses

    def on_response_head(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        now: float,
        *,
        admitted: bool | None = None,
    ) -> Keep | NotStored:
        """Decide from the head of a response fetched from the origin whether its body will
        be kept (``length``: its Content-Length, None when unknown). ``admitted``: the
        admission answer when the driver already asked an asynchronous backend (see
        ``admission_pending``); None asks the engine's own policy."""
        self.counters.origin_fetches += 1
        return self._decide(request, response, length, now, admitted, True)

    def finish(
        self,
        request: RequestMeta,
        decision: Keep | NotStored,
        size: int,
        now: float,
        *,
        payload: object = None,
        complete: bool = True,
        served: bool = True,
    ) -> Outcome:
        """The body of a decided response ended after ``size`` bytes (``complete=False``: cut
        short; ``served=False``: no client got it, as in a background refresh). A kept body
        that ended whole and fits is stored, with ``payload`` (the driver's own: the store
        never reads it)."""
        c = self.counters
        c.origin_bytes += size
        if served:
            c.bytes_served += size
        if not complete:
            c.cut_short += 1
            return CUT_SHORT
        return self._settle(request, decision, size, now, payload)

    def on_response(
        self, request: RequestMeta, response: ResponseMeta, size: int, now: float
    ) -> Outcome:
        """``on_response_head`` and ``finish`` for a fetched response whose whole body
        (``size`` bytes, ``response.payload``) is in hand: the simulator's path."""
        c = self.counters
        c.origin_fetches += 1
        c.origin_bytes += size
        c.bytes_served += size
        decision = self._decide(request, response, size, now, None, True)
        return self._settle(request, decision, size, now, response.payload)

    def on_shared(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        size: int,
        now: float,
        *,
        payload: object = None,
        admitted: bool | None = None,
    ) -> Outcome:
        """A response another request fetched (single flight) answered this one: a sighting
        of its URL, not an origin fetch. It is stored (with ``payload``) if this sighting
        admits it and no other request stored it already."""
        c = self.counters
        c.collapsed += 1
        c.bytes_served += size
        decision = self._decide(request, response, size, now, admitted, False)
        return self._settle(request, decision, size, now, payload)

    def _decide(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        now: float,
        admitted: bool | None,
        known: bool,
    ) -> Keep | NotStored:
        """Keep or not, by the HTTP rules, the size and the admission policy; a URL already
        stored is kept again (a refresh) when ``known`` says so, else it is ``COLLAPSED``."""
        c = self.counters
        if not response.cacheable:
            c.uncacheable += 1
            self._refused(request, response, now)
            return NotStored(response.reason or "uncacheable")
        if self.admission.observes:
            self.admission.observe(request.key, length or 0, now)
        if length is not None and not self.store.fits(length):
            c.too_large += 1
            self._pass_for_a_while(request, now)
            return TOO_LARGE
        key, stored = self._storage_key(request, response)
        if (
            response.vary
            and key not in self.store
            and self._variants_full(request.key, response.vary)
        ):
            c.too_many_variants += 1
            return TOO_MANY_VARIANTS
        if stored:
            return Keep(key, response) if known else COLLAPSED
        if admitted is None:
            admitted = self.admission.admit(request.key, length or 0, now)
        if not admitted:
            return FIRST_SIGHTING
        return Keep(key, response)

    def _settle(
        self,
        request: RequestMeta,
        decision: Keep | NotStored,
        size: int,
        now: float,
        payload: object,
    ) -> Outcome:
        """Store a kept body of ``size`` bytes, or count why it was not."""
        c = self.counters
        if type(decision) is NotStored:
            if decision is FIRST_SIGHTING:
                c.rejected_first_sighting += 1
                c.bytes_not_written += size
            return decision
        if not self.store.fits(size):
            c.too_large += 1
            self._pass_for_a_while(request, now)
            return TOO_LARGE
        response = decision.response
        url = request.key
        if response.vary:
            self._remember_variant(url, response.vary, decision.key)
        elif url in self._vary:
            self.invalidate(url)  # the origin stopped varying: its old variants are unreachable
        entry = self.entry_type(
            decision.key,
            size,
            now,
            response.lifetime,
            response.initial_age,
            response.headers,
            _directives(response),
            payload,
            status=response.status,
        )
        try:
            evicted = self.store.put(entry)
        except ValueError:  # the body fits, but with headers past the overhead estimate it does not
            c.too_large += 1
            return TOO_LARGE
        self._forget_variants(evicted)
        c.admissions += 1
        c.bytes_written += size
        return Store(entry, tuple(evicted))

    def admission_pending(
        self, request: RequestMeta, response: ResponseMeta, length: int | None
    ) -> bool:
        """Whether ``on_response_head`` for this response would consult the admission policy:
        a driver with an asynchronous backend asks it first, and only then."""
        if not response.cacheable or (length is not None and not self.store.fits(length)):
            return False
        return not self._storage_key(request, response)[1]

    def on_not_modified(
        self,
        entry: Entry,
        headers_304: Headers,
        request_time: float,
        now: float,
        *,
        served: bool = True,
    ) -> Entry:
        """A 304 answered a revalidation of ``entry``: refresh it (RFC 9111 section 4.3.4),
        keeping its status, re-charge its size for the new headers and, when a client gets it,
        count the stored body as served from cache."""
        headers = tuple(rfc9111.updated_by_304(entry.headers, headers_304))
        entry.headers = headers
        entry.directives = rfc9111.response_directives(headers)
        entry.lifetime = rfc9111.freshness_lifetime(entry.status, headers, now)
        entry.initial_age = rfc9111.current_age(headers_304, request_time, now, now)
        entry.stored_at = now
        self._forget_variants(self.store.recharge(entry))
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

    def invalidate(self, url: str) -> int:
        """Remove ``url`` and every stored variant of it; returns how many entries went."""
        removed = 0
        _, variants = self._vary.pop(url, ((), set()))
        for key in (url, *variants):
            if self.store.delete(key) is not None:
                removed += 1
        return removed

    def pass_by(self) -> None:
        """Count a request the driver sends past the cache whatever its method says (a GET
        or HEAD with content, on which the cache keys nothing)."""
        self.counters.bypass += 1

    def on_unsafe_response(self, request: RequestMeta, status: int) -> int:
        """RFC 9111 section 4.4: a successful unsafe method invalidates its URL."""
        return self.invalidate(request.key) if rfc9111.invalidates(request.method, status) else 0

    def purge_prefix(self, prefix: str) -> int:
        """Remove every stored URL starting with ``prefix`` (with its variants)."""
        urls = {key.split("\0", 1)[0] for key in self.store if key.startswith(prefix)}
        return sum(self.invalidate(url) for url in urls)

    def stats(self) -> dict[str, int | float]:
        """Every metric at this instant (see ``proxy.core.stats.METRICS``)."""
        admission = self.admission
        return snapshot(
            self.counters, self.store, admission.filter_stats(), admission.policy_stats()
        )

    def variant_index_size(self) -> int:
        """Store keys the Vary index holds: never more than the stored variants."""
        return sum(len(keys) for _, keys in self._vary.values())

    # Internals

    def _may_serve_on_error(self, stale: Stale, request: RequestMeta) -> bool:
        entry = stale.entry
        return rfc9111.may_serve_stale(
            entry.lifetime,
            stale.age,
            rfc9111.request_directives(request.headers),
            entry.directives,
            origin_failed=True,
        )

    def _refused(self, request: RequestMeta, response: ResponseMeta, now: float) -> None:
        """An uncacheable response: remember it (hit-for-miss), and let it supersede what was
        stored for the request, unless it is a server error (section 4.3.3 lets the cache
        keep the stored response then) or the request alone made it uncacheable."""
        if (
            response.status >= 500
            or response.status in (206, 304)
            or request.method != "GET"
            or response.reason in _REQUEST_REASONS
        ):
            return
        self._pass_for_a_while(request, now)
        stored = self._store_key(request)
        if self.store.delete(stored) is not None:
            self._forget_variants((stored,))

    def _pass_for_a_while(self, request: RequestMeta, now: float) -> None:
        if self.hit_for_miss > 0:
            url = request.key
            self._uncacheable[url] = (now + self.hit_for_miss, len(url) + _REMEMBERED_OVERHEAD)

    def _variants_full(self, url: str, names: tuple[str, ...]) -> bool:
        known = self._vary.get(url)
        return known is not None and known[0] == names and len(known[1]) >= self.max_variants

    def _storage_key(self, request: RequestMeta, response: ResponseMeta) -> tuple[str, bool]:
        """The key a response is stored under (its variant, if it varies), and whether its URL
        is already known (stored, or has variants): a known URL skips admission."""
        url = request.key
        key = url
        if response.vary:
            key = _variant(url, rfc9111.vary_key(response.vary, request.headers))
        return key, key in self.store or url in self._vary

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
            # What was stored under other selecting fields (or none) is unreachable now.
            self.invalidate(url)
            known = (names, set())
            self._vary[url] = known
        known[1].add(key)

    def _forget_variants(self, gone: tuple | list) -> None:
        """Entries (or keys) that left the store leave the Vary index with them."""
        if not self._vary:
            return
        for item in gone:
            key = item if isinstance(item, str) else item.key
            url, sep, _ = key.partition("\0")
            known = self._vary.get(url) if sep else None
            if known is not None:
                known[1].discard(key)
                if not known[1]:
                    del self._vary[url]


def fast_path_may_take(method: str, http11_kept_alive: bool, names: AbstractSet[str]) -> bool:
    """Whether a request may be answered from a stored response as soon as it is parsed,
    by a driver's fast path: a GET or HEAD, in HTTP/1.1 on a connection kept alive (nothing
    to frame but the answer), whose lower-cased field ``names`` hold none of ``NOT_FAST``.
    What it carries of ``RULE_FIELDS`` the rules then read as on any path."""
    return (
        (method == "GET" or method == "HEAD") and http11_kept_alive and names.isdisjoint(NOT_FAST)
    )


def _none_of(headers: rfc9111.Headers, names: frozenset[str]) -> bool:
    """Whether ``headers`` hold none of the lower-case ``names``: looked up when indexed."""
    if type(headers) is rfc9111.Fields:
        return names.isdisjoint(headers.by_name)
    return not any(k.lower() in names for k, _ in headers)


def _second(item: tuple[float, int]) -> int:
    return item[1]


def _variant(url: str, selected: tuple[tuple[str, str], ...]) -> str:
    return url + "\0" + "\0".join(f"{name}={value}" for name, value in selected)
