"""A byte-bounded store that knows which of its writes were ever read.

Rules this module keeps:

* The bookkeeping is compiled (``proxy.core._native.StoreIndex``, the simulator's too): keys as
  their 64-bit hash, each with its size, charge and hits, in the order of the eviction policy
  (``proxy.core.evictions``: ``lru``, ``sieve``, ``s3fifo``, ``wtinylfu``, ``twoq``, with
  their knobs; ``reshape`` changes it with every entry kept). Inserting evicts
  until the new entry fits (W-TinyLFU may evict the new entry itself);
  ``bytes_used <= capacity_bytes`` always. The entries themselves stay here, by key hash; an
  entry whose key is not the one asked for (a hash collision) is a miss, never another key's
  answer.
* An entry is charged its body plus ``entry_overhead`` (the memory of its Python objects,
  measured at about 1.2 KB for an entry with 200 B of headers), its key, and more for header
  text past what that estimate covers, so the capacity bounds memory, not only bodies. With
  ``entry_overhead=0`` only body bytes count, as in most cache simulators.
* An entry larger than ``max_object_bytes``, or than the whole store, is never stored; with
  ``s3fifo`` and ``twoq`` neither is one larger than their entry queue (S3-FIFO's tenth of
  the store, 2Q's quarter, by default), as S3-FIFO specifies.
* Every entry counts its hits. An entry that leaves by eviction with no hit is a *dead write*:
  bytes written that never served anyone. Entries still resident with no hit are reported apart,
  so a run's dead writes are ``evicted_unread + resident_unread``.
* Replacing or deleting an entry is not an eviction and never a dead write.
* Stored entries, and the dict that holds them, are kept out of the cyclic garbage
  collector's view (``_native.untrack``). A full collection walks every tracked object; with a
  million tracked entries it took about 0.6 s, a stall of every request in flight. Reference
  counting still frees an entry when it leaves. Sound because an entry can never be part of a
  reference cycle: its fields are strings, bytes, numbers, and tuples and dicts of them, and a
  driver's ``payload``, and what a driver's subclass of ``Entry`` adds, must be the same (a
  cycle through an entry would never be collected).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from proxy.core._native import StoreIndex, hash64, untrack
from proxy.core.evictions import eviction as parse_eviction


@dataclass(slots=True, eq=False)
class Entry:
    """One stored response.

    It is fresh while ``initial_age + (now - stored_at) < lifetime`` (RFC 9111 section 4.2);
    ``headers`` are the stored response's fields and ``directives`` its parsed cache directives
    (parsed once, read on every hit); ``payload`` is the driver's (status, body), never read by
    the core. A driver may store a subclass (``CacheEngine.entry_type``) to keep what it
    derives from an entry beside it.
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
    charge: int = field(default=0)  # bytes counted against capacity, set by the store
    key_hash: int = field(default=0)  # the index's key, set by the store: no rehash per hit
    tags: tuple[str, ...] = ()  # its purge tags (``proxy.core.tags``), set by the engine
    # Made stale by a soft purge: served stale only where the response's own rules allow,
    # never for a client's ``max-stale`` or ``stale-if-error``.
    soft_purged: bool = False

    def age(self, now: float) -> float:
        """Current age at ``now`` (section 4.2.3); never negative, whatever the clock did."""
        resident = now - self.stored_at
        return self.initial_age + (resident if resident > 0.0 else 0.0)


# Bytes charged per entry for its Python objects (Entry, key, header tuples, parsed directives,
# the index's node): 1,208 B measured with tracemalloc for 7 header fields of 201 B.
ENTRY_OVERHEAD = 1536
# Header text that ENTRY_OVERHEAD covers, counted 4 times: the tuples and strings that hold it,
# and a driver's rendered head (the proxy's ``ServedEntry.rendered``), which holds it once more.
_HEADER_ALLOWANCE = 1024
# Bytes a purge tag costs in the engine's tag index at most, when no other entry carries it:
# its string, its own set, the dict's entry (tracemalloc, 15-character tags: 318 bytes).
TAG_CHARGE = 320


def entry_charge(entry: Entry, overhead: int) -> int:
    """Bytes an entry counts against the store's capacity: its body, and with an overhead its
    objects too, its key twice (the store's, and the Vary index's copy of its URL), its
    header text past what the overhead covers, and its purge tags' place in the tag index."""
    if not overhead:
        return entry.size
    text = sum(map(len, chain.from_iterable(entry.headers)))
    tags = TAG_CHARGE * len(entry.tags)
    return entry.size + overhead + 2 * len(entry.key) + max(0, 4 * text - _HEADER_ALLOWANCE) + tags


def _checked(capacity_bytes: int, max_object_bytes: int | None, entry_overhead: int) -> int:
    """The largest object's size (``capacity_bytes`` when None); ValueError for sizes no
    store can have."""
    if not isinstance(capacity_bytes, int) or capacity_bytes < 1:
        raise ValueError(f"capacity_bytes must be a positive integer, got {capacity_bytes!r}")
    if not 0 <= entry_overhead < capacity_bytes:
        raise ValueError(
            f"entry_overhead must be >= 0 and below capacity_bytes, got {entry_overhead!r}"
        )
    if max_object_bytes is None:
        max_object_bytes = capacity_bytes
    if not isinstance(max_object_bytes, int) or max_object_bytes < 1:
        raise ValueError(f"max_object_bytes must be a positive integer, got {max_object_bytes!r}")
    return max_object_bytes


class CacheStore:
    """Byte-bounded store over ``Entry`` objects with hit and dead-write accounting."""

    def __init__(
        self,
        capacity_bytes: int,
        max_object_bytes: int | None = None,
        entry_overhead: int = 0,
        eviction: str = "lru",
    ) -> None:
        max_object_bytes = _checked(capacity_bytes, max_object_bytes, entry_overhead)
        policy = parse_eviction(eviction)
        self.capacity_bytes = capacity_bytes
        self.entry_overhead = entry_overhead
        self.eviction = policy.name
        self.index = StoreIndex(capacity_bytes, policy.family, **policy.arguments())
        self._largest = max_object_bytes  # as asked: the policy may let an entry be less
        self._entries: dict[int, Entry] = {}

    @property
    def max_object_bytes(self) -> int:
        """The largest object: as asked, unless the eviction lets an entry be charged less
        (S3-FIFO's small queue): derived, so a resize, a reshape or a sample's bound moves it."""
        return max(0, min(self._largest, self.index.max_charge - self.entry_overhead))

    def sample_of(self, full: CacheStore) -> None:
        """This store is a spatial sample of ``full`` (its keys' share, in its share of the
        bytes): it keeps an entry ``full``'s policy would, up to its own capacity. A sampled
        S3-FIFO's small queue would otherwise refuse what the full one keeps, and a sample
        would see fewer large objects than the cache it stands for."""
        self.index.max_charge = min(full.index.max_charge, self.capacity_bytes)
        self._largest = full.max_object_bytes

    def reshape(self, eviction: str) -> None:
        """Evict by ``eviction`` from now on, every entry kept (``StoreIndex.reshape``); the
        largest object is the new policy's. An entry stored under the old largest object
        stays until it is evicted or replaced."""
        policy = parse_eviction(eviction)
        self.index.reshape(policy.family, **policy.arguments())
        self.eviction = policy.name

    def resize(self, capacity_bytes: int, max_object_bytes: int | None = None) -> list[Entry]:
        """Take a new capacity (and largest object, as in the constructor): entries are
        evicted, as the eviction policy evicts them, until the rest fit; returns them. An
        entry stored under the old largest object stays until it is evicted or replaced."""
        self._largest = _checked(capacity_bytes, max_object_bytes, self.entry_overhead)
        gone = self.index.resize(capacity_bytes)
        self.capacity_bytes = capacity_bytes
        return [self._entries.pop(h) for h in gone]

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: str) -> bool:
        entry = self._entries.get(hash64(key)[0])
        return entry is not None and entry.key == key

    @property
    def bytes_used(self) -> int:
        return self.index.bytes_used

    @property
    def evictions(self) -> int:
        return self.index.evictions

    @property
    def evicted_bytes(self) -> int:
        return self.index.evicted_bytes

    @property
    def evicted_unread(self) -> int:
        return self.index.evicted_unread

    @property
    def evicted_unread_bytes(self) -> int:
        return self.index.evicted_unread_bytes

    @property
    def resident_unread(self) -> int:
        return self.index.resident_unread

    @property
    def resident_unread_bytes(self) -> int:
        return self.index.resident_unread_bytes

    @property
    def by_hash(self) -> dict[int, Entry]:
        """The entries by their key's hash (``hash64(key)[0]``), for a compiled reader: it
        checks the entry's key as ``peek`` does, and never changes the mapping."""
        return self._entries

    def get(self, key: str) -> Entry | None:
        """The entry for ``key`` (now most recently used), or None."""
        entry = self.peek(key)
        if entry is not None:
            self.index.touch(entry.key_hash)
        return entry

    def peek(self, key: str) -> Entry | None:
        """The entry for ``key``, or None; its place in the eviction order is unchanged."""
        entry = self._entries.get(hash64(key)[0])
        return entry if entry is not None and entry.key == key else None

    def touch(self, entry: Entry) -> None:
        """``entry`` was used: what ``get`` does to its place in the eviction order."""
        if self._entries.get(entry.key_hash) is entry:
            self.index.touch(entry.key_hash)

    def record_hit(self, entry: Entry) -> None:
        """Count one answer served from ``entry``."""
        h = entry.key_hash
        if self._entries.get(h) is entry:
            self.index.record_hit(h)

    def fits(self, size: int) -> bool:
        return size <= self.max_object_bytes

    def put(self, entry: Entry) -> list[Entry]:
        """Store ``entry`` (replacing any entry of its key); returns the entries evicted for room.

        Raises ValueError for an entry over ``max_object_bytes`` or charged more than the whole
        capacity: callers check ``fits`` first.
        """
        return self._put(entry, 0)

    def recharge(self, entry: Entry) -> list[Entry]:
        """Charge a stored ``entry`` again after its headers changed (it stays most recently
        used, its hits kept); returns the entries that left the store: those evicted for
        room, or ``entry`` itself when its new charge is past what an entry may be charged.
        An entry no longer resident is left out."""
        h = entry.key_hash
        if self._entries.get(h) is not entry:
            return []
        charge = entry_charge(entry, self.entry_overhead)
        if charge == entry.charge:
            self.index.touch(h)
            return []
        if charge > self.index.max_charge:
            self.delete(entry.key)
            return [entry]
        return self._put(entry, self.index.hits(h))

    def delete(self, key: str) -> Entry | None:
        """Remove ``key``'s entry (not an eviction); returns it, or None if absent."""
        h = hash64(key)[0]
        entry = self._entries.get(h)
        if entry is None or entry.key != key:
            return None
        del self._entries[h]
        self.index.delete(h)
        return entry

    def __iter__(self) -> Iterator[str]:
        """Every stored key, from a snapshot: the store may change while this is iterated."""
        return iter([entry.key for entry in self._entries.values()])

    def estimated_capacity_objects(self) -> int:
        """How many objects of the resident mean charge the store holds when full (0 when
        empty)."""
        return self.index.estimated_capacity_objects()

    def _put(self, entry: Entry, hits: int) -> list[Entry]:
        entry.charge = entry_charge(entry, self.entry_overhead)
        if entry.size > self.max_object_bytes or entry.charge > self.index.max_charge:
            raise ValueError(
                f"entry of {entry.size} bytes (charged {entry.charge}) does not fit: "
                f"max_object_bytes={self.max_object_bytes}, capacity_bytes={self.capacity_bytes}"
            )
        h = entry.key_hash = hash64(entry.key)[0]
        entries = self._entries
        gone = self.index.put(h, entry.size, entry.charge, hits)
        entries[h] = entry
        # Out of the collector's view: the entry, and the dict, which tracks itself again
        # whenever an entry goes in (tracked, it costs a collection a visit to each entry).
        untrack(entry)
        untrack(entries)
        # W-TinyLFU may evict the new entry itself at once: a write nobody will read.
        return [entries.pop(old) for old in gone]
