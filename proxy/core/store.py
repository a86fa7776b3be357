"""A byte-bounded LRU store that knows which of its writes were ever read.

Rules this module keeps:

* The capacity loop is cachetools': inserting evicts least recently used entries until the new
  entry fits; ``bytes_used <= capacity_bytes`` always.
* An entry is charged its body plus ``entry_overhead`` (the memory of its Python objects,
  measured at about 1.2 KB for an entry with 200 B of headers), its key, and more for header
  text past what that estimate covers, so the capacity bounds memory, not only bodies. With
  ``entry_overhead=0`` only body bytes count, as in most cache simulators.
* An entry larger than ``max_object_bytes`` (or than the whole store) is never stored.
* Every entry counts its hits. An entry that leaves by eviction with no hit is a *dead write*:
  bytes written that never served anyone. Entries still resident with no hit are reported apart,
  so a run's dead writes are ``evicted_unread + resident_unread``.
* Replacing or deleting an entry is not an eviction and never a dead write.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache


@dataclass(slots=True, eq=False)
class Entry:
    """One stored response.

    It is fresh while ``initial_age + (now - stored_at) < lifetime`` (RFC 9111 section 4.2);
    ``headers`` are the stored response's fields and ``directives`` its parsed cache directives
    (parsed once, read on every hit); ``payload`` is the driver's (status, body), never read by
    the core.
    """

    key: str
    size: int
    stored_at: float
    lifetime: float = float("inf")
    initial_age: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    directives: dict[str, str | None] = field(default_factory=dict)
    payload: Any = None
    status: int = 200
    hits: int = field(default=0)
    charge: int = field(default=0)  # bytes counted against capacity, set by the store

    def age(self, now: float) -> float:
        """Current age at ``now`` (section 4.2.3); never negative, whatever the clock did."""
        resident = now - self.stored_at
        return self.initial_age + (resident if resident > 0.0 else 0.0)


# Bytes charged per entry for its Python objects (Entry, key, header tuples, parsed directives,
# cachetools' bookkeeping): 1,208 B measured with tracemalloc for 7 header fields of 201 B.
ENTRY_OVERHEAD = 1536
# Header text (times 3, for the tuples and strings that hold it) that ENTRY_OVERHEAD covers.
_HEADER_ALLOWANCE = 1024


def _charged(entry: Entry) -> int:
    return entry.charge


def entry_charge(entry: Entry, overhead: int) -> int:
    """Bytes an entry counts against the store's capacity: its body, and with an overhead its
    objects too, its key twice (the store's, and the Vary index's copy of its URL) and its
    header text past what the overhead covers."""
    if not overhead:
        return entry.size
    text = sum(len(k) + len(v) for k, v in entry.headers)
    return entry.size + overhead + 2 * len(entry.key) + max(0, 3 * text - _HEADER_ALLOWANCE)


class _EvictionLog(LRUCache):
    """cachetools' LRU with its evictions handed back to the store."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize, getsizeof=_charged)
        self.evicted: list[Entry] = []

    def popitem(self) -> tuple[str, Entry]:
        key, entry = super().popitem()
        self.evicted.append(entry)
        return key, entry


class LRUStore:
    """Byte-bounded LRU over ``Entry`` objects with hit and dead-write accounting."""

    def __init__(
        self, capacity_bytes: int, max_object_bytes: int | None = None, entry_overhead: int = 0
    ) -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be a positive integer, got {capacity_bytes!r}")
        if not 0 <= entry_overhead < capacity_bytes:
            raise ValueError(
                f"entry_overhead must be >= 0 and below capacity_bytes, got {entry_overhead!r}"
            )
        if max_object_bytes is None:
            max_object_bytes = capacity_bytes
        if not isinstance(max_object_bytes, int) or max_object_bytes < 1:
            raise ValueError(
                f"max_object_bytes must be a positive integer, got {max_object_bytes!r}"
            )
        self.capacity_bytes = capacity_bytes
        self.entry_overhead = entry_overhead
        self.max_object_bytes = min(max_object_bytes, capacity_bytes - entry_overhead)
        self._lru = _EvictionLog(capacity_bytes)
        self.evictions = 0
        self.evicted_bytes = 0
        self.evicted_unread = 0
        self.evicted_unread_bytes = 0
        self.resident_unread = 0
        self.resident_unread_bytes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: str) -> bool:
        return key in self._lru

    @property
    def bytes_used(self) -> int:
        return self._lru.currsize

    def get(self, key: str) -> Entry | None:
        """The entry for ``key`` (now most recently used), or None."""
        # Cache.get tests membership first: a miss costs no KeyError.
        return self._lru.get(key)

    def record_hit(self, entry: Entry) -> None:
        """Count one answer served from ``entry``."""
        if entry.hits == 0:
            self.resident_unread -= 1
            self.resident_unread_bytes -= entry.size
        entry.hits += 1

    def fits(self, size: int) -> bool:
        return size <= self.max_object_bytes

    def put(self, entry: Entry) -> list[Entry]:
        """Store ``entry`` (replacing any entry of its key); returns the entries evicted for room.

        Raises ValueError for an entry over ``max_object_bytes`` or charged more than the whole
        capacity: callers check ``fits`` first.
        """
        entry.charge = entry_charge(entry, self.entry_overhead)
        if entry.size > self.max_object_bytes or entry.charge > self.capacity_bytes:
            raise ValueError(
                f"entry of {entry.size} bytes (charged {entry.charge}) does not fit: "
                f"max_object_bytes={self.max_object_bytes}, capacity_bytes={self.capacity_bytes}"
            )
        lru = self._lru
        if entry.key in lru:
            self.delete(entry.key)
        lru[entry.key] = entry
        evicted = lru.evicted
        if evicted:
            lru.evicted = []
            for old in evicted:
                self._forget(old)
                self.evictions += 1
                self.evicted_bytes += old.size
                if old.hits == 0:
                    self.evicted_unread += 1
                    self.evicted_unread_bytes += old.size
        if entry.hits == 0:
            self.resident_unread += 1
            self.resident_unread_bytes += entry.size
        return evicted

    def recharge(self, entry: Entry) -> list[Entry]:
        """Charge a stored ``entry`` again after its headers changed (it stays most recently
        used); returns the entries evicted for room. An entry no longer resident is left out."""
        lru = self._lru
        if lru.get(entry.key) is not entry:
            return []
        charge = entry_charge(entry, self.entry_overhead)
        if charge == entry.charge:
            return []
        if charge > self.capacity_bytes:
            self.delete(entry.key)
            return []
        hits = entry.hits
        self.delete(entry.key)
        entry.hits = 0  # put counts it as unread until the hits are restored
        evicted = self.put(entry)
        if hits:
            self.record_hit(entry)
            entry.hits = hits
        return evicted

    def delete(self, key: str) -> Entry | None:
        """Remove ``key``'s entry (not an eviction); returns it, or None if absent."""
        entry = self._lru.pop(key, None)
        if entry is not None:
            self._forget(entry)
        return entry

    def __iter__(self) -> Iterator[str]:
        """Every stored key, from a snapshot: the store may change while this is iterated."""
        return iter(list(self._lru))

    def estimated_capacity_objects(self) -> int:
        """How many objects of the resident mean size the store holds when full (0 when empty)."""
        used = self._lru.currsize
        if used == 0:
            return 0
        return round(self.capacity_bytes * len(self._lru) / used)

    def _forget(self, entry: Entry) -> None:
        if entry.hits == 0:
            self.resident_unread -= 1
            self.resident_unread_bytes -= entry.size
