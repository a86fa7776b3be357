"""Where a flash-friendly disk tier writes: a ring of fixed-size regions filled one after
another, each record appended at the end of the open region, the oldest region evicted whole.

Rules it keeps (pure arithmetic, no I/O: the live disk tier and the simulator place records
alike, so the simulator's bytes written are the device's):

* Records go to the open region at its current end, so the device sees one sequential
  stream of writes. A record that does not fit in what is left of the open region closes
  it, and a new region opens (its sequence number one more than the last).
* At most ``regions`` regions are live. Opening one more evicts the oldest, whole: every
  record in it is gone at once (FIFO eviction, as CacheLib's region-based BlockCache does),
  so no region is ever rewritten in place.
* A record larger than a region is refused (``None``): it would not be stored whole.
* ``SharedRegions`` keeps the same rules for every process of one machine at once: the ring's
  head is a word of shared memory (``proxy.core._native.SharedIndex``), each record's place
  reserved with one compare-and-swap, so two workers appending to one region never overlap,
  and the worker whose record opens a region is the one told which region it evicted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from proxy.core._native import SharedIndex


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a record goes: ``region`` (a sequence number) at ``offset``; ``evicted``: the
    regions evicted to open it (none, or the one ``Regions`` evicts)."""

    region: int
    offset: int
    evicted: tuple[int, ...] = ()


class Regions:
    """The ring of regions a disk tier of ``region_size * regions`` bytes writes into."""

    def __init__(self, region_size: int, regions: int, *, first: int = 0) -> None:
        if region_size < 1 or regions < 2:
            raise ValueError(
                f"a disk tier needs regions of at least 1 byte and at least 2 regions, "
                f"got {region_size} bytes x {regions}"
            )
        self.region_size = region_size
        self.regions = regions
        self.live: deque[int] = deque()  # oldest first; the last is open
        self.fill = region_size  # bytes of the open region used: none is open yet
        self.next = first  # the sequence number of the next region to open
        self.bytes_written = 0
        self.evictions = 0

    def place(self, length: int) -> Placement | None:
        """Place a record of ``length`` bytes; None when it is larger than a region."""
        if length > self.region_size:
            return None
        evicted: tuple[int, ...] = ()
        if self.fill + length > self.region_size:
            evicted = self._open()
        offset = self.fill
        self.fill += length
        self.bytes_written += length
        return Placement(self.live[-1], offset, evicted)

    def _open(self) -> tuple[int, ...]:
        evicted: tuple[int, ...] = ()
        if len(self.live) >= self.regions:
            evicted = (self.live.popleft(),)
            self.evictions += 1
        self.live.append(self.next)
        self.next += 1
        self.fill = 0
        return evicted

    def resume(self, live: list[int], fill: int) -> None:
        """Take up the regions found on disk (oldest first), the last open at ``fill`` bytes:
        those past the ring's size are for the caller to drop first."""
        kept = live[-self.regions :]
        self.live = deque(kept)
        self.next = (kept[-1] + 1) if kept else self.next
        self.fill = fill if kept else self.region_size

    def close(self) -> None:
        """The open region takes no more records (one could not be written whole): the next
        record opens a new region."""
        self.fill = self.region_size

    def span(self) -> tuple[int, int, int]:
        """The ring as (oldest live region, next to open, fill of the open one), as the
        simulator's compiled loop takes it; the regions a simulated ring holds are always
        consecutive."""
        oldest = self.live[0] if self.live else self.next
        assert len(self.live) == self.next - oldest, "the live regions are consecutive"
        return oldest, self.next, self.fill

    def moved(self, span: tuple[int, int, int], written: int, evictions: int) -> None:
        """The ring as the compiled loop left it (``span``, as ``span`` gives it), having
        placed ``written`` bytes and evicted ``evictions`` regions."""
        oldest, self.next, self.fill = span
        self.live = deque(range(oldest, self.next))
        self.bytes_written += written
        self.evictions += evictions

    def holds(self, region: int) -> bool:
        """Whether ``region`` is live (its records may still be read)."""
        return bool(self.live) and self.live[0] <= region <= self.live[-1]

    @property
    def capacity_bytes(self) -> int:
        return self.region_size * self.regions


class SharedRegions:
    """``Regions`` whose ring every process of one machine writes into: its head in ``index``,
    the shared memory of the tier's index. ``bytes_written`` and ``evictions`` are this
    process's own."""

    def __init__(self, index: SharedIndex, region_size: int, regions: int) -> None:
        self.index = index
        self.region_size = region_size
        self.regions = regions
        self.bytes_written = 0
        self.evictions = 0

    @property
    def live(self) -> range:
        """The live regions, oldest first; the last is open."""
        open_region = self.index.open_region
        return range(self.index.oldest, open_region + 1) if open_region >= 0 else range(0)

    @property
    def fill(self) -> int:
        return self.index.fill

    def place(self, length: int) -> Placement | None:
        """``Regions.place``, reserved in the shared ring."""
        reserved = self.index.reserve(length)
        if reserved is None:
            return None
        region, offset, evicted = reserved
        self.bytes_written += length
        self.evictions += len(evicted or ())
        return Placement(region, offset, tuple(evicted or ()))

    def resume(self, live: list[int], fill: int) -> None:
        """``Regions.resume``: the ring every process shares takes up these regions."""
        kept = live[-self.regions :]
        if kept:
            self.index.restart(kept[0], kept[-1], fill)
        else:
            self.index.restart(self.index.oldest, None, 0)

    def close(self) -> None:
        """``Regions.close``, for every process."""
        self.index.close_open()

    def holds(self, region: int) -> bool:
        """Whether ``region`` is live (its records may still be read)."""
        return self.index.oldest <= region <= self.index.open_region

    @property
    def capacity_bytes(self) -> int:
        return self.region_size * self.regions


# The ring a disk tier writes into: its process's own, or the one the workers of a machine share.
Ring = Regions | SharedRegions
