"""What a request and a response are to the cache engine, and what it tells a driver: small
immutable events, as h11 models a protocol's.

* A request is a ``RequestMeta`` (its key, method, fields); an origin response a
  ``ResponseMeta`` (built by ``responses.response_meta``).
* ``lookup`` finds a ``Hit``, ``Stale``, ``Miss`` or ``Bypass``; ``plan`` gives one ``Action``:
  ``FromCache``, ``Revalidate``, ``Fetch`` or ``Refuse``, or ``Behind`` (ask the tier behind
  memory first, then one of those); a response head is ``Keep`` or
  ``NotStored`` for memory (``responses.Decided`` adds the tiers that write it), and a finished
  one a ``Store`` or ``NotStored``; a client's conditional or
  Range is answered as an ``Answer``.
* The request fields the cache's rules read are listed here once (``RULE_FIELDS``), and every
  path, the compiled ones included, takes them from here: a GET or HEAD carrying none of them
  is answered by its key alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from proxy.core import rfc9111
from proxy.core._native import StoreIndex
from proxy.core.rfc9110 import Headers
from proxy.core.stats import Counters
from proxy.core.store import Entry


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
    # When its request went to the origin: a purge made since reaches it (``RecentPurges``);
    # -inf (a trace's response) none does.
    requested_at: float = float("-inf")
    # Whether an operator's TTL rule set its lifetime or storing (``proxy.core.ttl_rules``).
    by_rule: bool = False


# What ``lookup`` found.


class Hit(NamedTuple):
    """A fresh stored response and its age. A named tuple, as ``Keep``: one is made for every
    hit, the live proxy's hottest allocation."""

    entry: Entry
    age: float


class RequestSample(Protocol):
    """What the engine feeds a sample of the requests it answers to (``proxy.core.whatif``):
    the keys hashed below ``below`` are the sample."""

    below: int

    def record(
        self, key: str, size: int, now: float, *, missed: bool = False, key_hash: int = 0
    ) -> None: ...


class HitState(NamedTuple):
    """What ``CacheEngine.lookup`` reads and changes for a hit, for a compiled driver that
    finds and counts plain hits itself (a GET or HEAD carrying none of ``RULE_FIELDS``): it
    must find a hit, and count it, as ``lookup`` does; and a hit it answered from a tier
    behind the store as ``_hit_behind`` does: counted, then kept in the store (``promote``)
    when the store's admission (``admit``) takes it and the promotion filter
    (``promotion_admit``, None: none) does. The compiled driver's whole contract with the engine."""

    entries: dict[int, Entry]  # the store's entries by their key's hash
    vary: dict[str, Any]  # URLs with stored variants (a plain hit declines them)
    index: StoreIndex  # the store's eviction order and hit counts
    counters: Counters
    observe: Callable[[str, int, float], None] | None  # the admission's, when it observes
    uncacheable: Mapping[str, Any]  # URLs remembered uncacheable (``plan`` passes them by)
    whatif: Callable[[str, int, float], None] | None  # the what-if's record, when there is one
    sample_below: int  # the hits whose sample point is below it are the what-if's to record
    sample_key: int  # the what-if sample's secret (``proxy.core.whatif``)
    admit: Callable[[str, int, float], bool]  # the store's admission: keep a tier's hit?
    promotion_admit: Callable[[str, int, float], bool] | None  # and the promotion filter's
    promote: Callable[[Entry], None]  # keep a tier's hit in the store, counted as promoted


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
    behind: bool = False  # a tier behind the memory store held it (``Behind``)


@dataclass(frozen=True, slots=True)
class Revalidate:
    """Send the origin a conditional GET with ``conditions`` (the entry's validators).
    ``on_error``: what lets the entry answer if the origin fails: ``"stale-if-error"``
    (RFC 5861, or a request's ``max-stale``), ``"grace"`` (``[cache] grace``), or ``""``
    (nothing: the failure is the answer)."""

    entry: Entry
    age: float
    conditions: tuple[tuple[str, str], ...]
    on_error: str


# Why a request goes to the origin: RFC 9211's ``fwd`` values, the reasons ``Fetch``,
# ``Refuse`` and ``Bypass`` give, which ``proxy.core.cache_status`` writes.
FWD_URI_MISS = "uri-miss"  # nothing stored answers it
FWD_STALE = "stale"  # what is stored is stale
FWD_BYPASS = "bypass"  # the URL was uncacheable a moment ago (hit-for-miss), or the request said so
FWD_METHOD = "method"  # a method the cache does not answer
FWD_REQUEST = "request"  # the request could not be answered from the cache
FWD_PARTIAL = "partial"  # part of what it asks for is stored (slices)


@dataclass(frozen=True, slots=True)
class Fetch:
    """Go to the origin. ``whole``: fetch the whole representation without the client's
    conditionals and Range, and answer them from it. ``collapse``: share the fetch with
    concurrent requests for the same URL. ``reason`` is the Cache-Status ``fwd`` value:
    ``uri-miss``, ``method``, ``stale`` (a HEAD on a stale entry), or ``bypass`` (the URL was
    uncacheable a moment ago: hit-for-miss). ``content``: the request's body goes with it (a
    GET or HEAD that carries one, passed by)."""

    reason: str
    whole: bool
    collapse: bool
    content: bool = False


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer ``status`` without contacting the origin."""

    status: int
    text: str
    reason: str


@dataclass(frozen=True, slots=True)
class Behind:
    """The memory store holds nothing for the request: ask the tier behind it what it holds
    (``CacheEngine.found_behind`` judges that), and do ``then`` when it answers nothing."""

    then: Fetch | Refuse


class AskAdmission:
    """The engine's own policy is not the one to ask: a backend the driver awaits (the
    fleet's shared filter) says whether this sighting admits the response. The driver asks
    it, then gives the engine its answer (``admitted``); nothing was counted or changed."""

    __slots__ = ()


ASK_ADMISSION = AskAdmission()

# What a driver carries out in one step; a ``Behind`` is answered with one of them.
Step = FromCache | Revalidate | Fetch | Refuse
Action = Step | Behind

# What becomes of a response.


class Keep(NamedTuple):
    """Copy the body while it streams; ``finish`` stores it if it ends whole and fits. (A
    named tuple: one is made for every admitted miss, the simulator's hottest allocation.)"""

    key: str
    response: ResponseMeta
    tags: tuple[str, ...] = ()  # its purge tags (``proxy.core.tags``), read once at its head


@dataclass(frozen=True, slots=True)
class Store:
    entry: Entry
    evicted: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class NotStored:
    reason: str


Outcome = Store | NotStored

# How a client's conditional or Range request is answered from a whole response.


@dataclass(frozen=True, slots=True)
class Purged:
    """What a purge did: ``count`` entries removed (or, ``soft``, marked stale) from the
    memory store, and whether every tier behind it holds the purge on stable storage."""

    count: int
    soft: bool
    durable: bool


class Answer(NamedTuple):
    """``status`` 304 (a matching validator), 206 (bytes ``first``..``last``), 416, or the
    response's own status with the whole body."""

    status: int
    first: int = 0
    last: int = -1


URI_MISS = Miss(FWD_URI_MISS)
METHOD_BYPASS = Bypass(FWD_METHOD)
TOO_LARGE = NotStored("too-large")
# Within the cache's largest object, past a worker's memory share: the tier behind keeps it.
BEYOND_MEMORY = NotStored("beyond-memory")
TOO_MANY_TAGS = NotStored("too-many-tags")
# No freshness, none to guess from and no validator: never a hit, never revalidated.
NEVER_FRESH = NotStored("never-fresh")
FIRST_SIGHTING = NotStored("first-sighting")
COLLAPSED = NotStored("collapsed")
CUT_SHORT = NotStored("cut-short")
TOO_MANY_VARIANTS = NotStored("variants")
# Its fetch began before a purge that reaches it: storing it would undo the purge.
PURGED_IN_FLIGHT = NotStored("purged-in-flight")
# A stored response that a request with a cookie may not be answered with.
PRIVATE_MISS = Miss("cookie")
# The request fields the cache's rules read, and no others: a GET or HEAD carrying none of
# them is found by its key alone (``HitState``), on every path. One list, which the
# proxy's paths (the compiled one included) take from here.
CONDITIONALS = ("if-none-match", "if-modified-since")  # a match is answered 304 (RFC 9110 13.1)
PRECONDITIONS = ("if-match", "if-unmodified-since")  # the origin's to judge
# Fields a stored response answers itself: a 304, or a range's 206 or 416 (section 14).
ANSWERED_FIELDS = frozenset({*CONDITIONALS, "range", "if-range"})
# What a whole-object fetch leaves out of the client's request (``Fetch.whole``).
CLIENT_ASKS = ANSWERED_FIELDS | frozenset(PRECONDITIONS)
RULE_FIELDS = CLIENT_ASKS | {"cookie", "cache-control", "pragma"}
# Request fields that keep a hit off a fast path, whatever is stored: a precondition, and a
# body's framing (a GET with content passes the cache by). What a request carries of
# ``RULE_FIELDS`` the rules then read as on any path.
NOT_FAST = frozenset({*PRECONDITIONS, "transfer-encoding", "content-length"})
# The fetches ``plan`` asks for, made once: each is immutable.
FETCH_WHOLE = Fetch(FWD_URI_MISS, whole=True, collapse=True)
FETCH_AS_ASKED = Fetch(FWD_URI_MISS, whole=False, collapse=False)
FETCH_BYPASS = Fetch(FWD_BYPASS, whole=False, collapse=False)
FETCH_WITH_CONTENT = Fetch(FWD_BYPASS, whole=False, collapse=False, content=True)
FETCH_STALE = Fetch(FWD_STALE, whole=False, collapse=False)
