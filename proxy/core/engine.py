"""The cache engine: a store, an admission policy and the freshness of what is stored.

Rules this module keeps:

* Drivers (the live proxy, the offline simulator) call ``lookup`` for every request that may be
  answered from cache, and ``on_response`` for every response fetched from the origin for a
  request whose lookup missed. Every answer is a small frozen dataclass; drivers match on it.
* ``lookup``: a fresh entry is a ``Hit`` (counted, and the entry's hit count goes up); an expired
  one is ``Stale`` (a miss to revalidate or refetch); nothing stored is a ``Miss``.
* ``on_response``: an uncacheable response is ``NotStored("uncacheable")``; one over the max
  object size ``NotStored("too-large")`` without consulting the policy; a key already stored
  (a refresh) is stored again without consulting the policy; otherwise the admission policy
  decides, and a refusal is ``NotStored("first-sighting")``.
* Time is an argument. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.core.admission import AdmissionPolicy
from proxy.core.stats import Counters, snapshot
from proxy.core.store import Entry, LRUStore


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What the engine needs of a request: its cache key."""

    key: str


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What the engine needs of an origin response: may it be stored, and how long is it fresh."""

    cacheable: bool = True
    ttl: float = float("inf")
    payload: object = None


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    age: float


@dataclass(frozen=True, slots=True)
class Stale:
    entry: Entry
    age: float


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


Lookup = Hit | Stale | Miss
Outcome = Store | NotStored

URI_MISS = Miss("uri-miss")
UNCACHEABLE = NotStored("uncacheable")
TOO_LARGE = NotStored("too-large")
FIRST_SIGHTING = NotStored("first-sighting")


class CacheEngine:
    """Drives ``store`` and ``admission`` and keeps the counters of both."""

    def __init__(self, store: LRUStore, admission: AdmissionPolicy) -> None:
        self.store = store
        self.admission = admission
        self.counters = Counters()

    def lookup(self, request: RequestMeta, now: float) -> Lookup:
        c = self.counters
        c.requests += 1
        entry = self.store.get(request.key)
        if entry is None:
            c.misses += 1
            return URI_MISS
        age = now - entry.stored_at
        if age < 0.0:
            age = 0.0
        if age < entry.ttl:
            c.hits += 1
            c.hit_bytes += entry.size
            c.bytes_served += entry.size
            self.store.record_hit(entry)
            return Hit(entry, age)
        c.misses += 1
        return Stale(entry, age)

    def on_response(
        self, request: RequestMeta, response: ResponseMeta, size: int, now: float
    ) -> Outcome:
        c = self.counters
        c.origin_fetches += 1
        c.origin_bytes += size
        c.bytes_served += size
        if not response.cacheable:
            c.uncacheable += 1
            return UNCACHEABLE
        store = self.store
        if size > store.max_object_bytes:
            c.too_large += 1
            return TOO_LARGE
        key = request.key
        if key not in store and not self.admission.admit(key, size, now):
            c.rejected_first_sighting += 1
            c.bytes_not_written += size
            return FIRST_SIGHTING
        entry = Entry(key, size, now, response.ttl, response.payload)
        evicted = store.put(entry)
        c.admissions += 1
        c.bytes_written += size
        return Store(entry, tuple(evicted))

    def stats(self) -> dict[str, int | float]:
        """Every metric of DESIGN.md section 4 at this instant."""
        return snapshot(self.counters, self.store, self.admission.filter_stats())
