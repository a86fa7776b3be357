"""The disk tier's bookkeeping, without I/O: which keys it holds and where, what its own
admission lets in, and what it wrote. The live tier (``proxy.region_log`` writes what this
places) and the simulator drive the same object, so a simulated run's disk writes are the
device's.

Rules it keeps:

* A response reaches the disk tier only when the tier's own admission says so (``offer``):
  by default the windowed filter, so only a second sighting within the window costs a write.
  A key already on disk is not written again.
* Every record goes where ``Regions`` places it, at the end of the open region. Opening a
  region past the ring's size evicts the oldest whole, and every key placed in it leaves the
  index at once.
* ``find`` counts a disk hit or a disk miss; ``drop`` forgets a key whose record could not be
  written or read whole (it is then a miss, never a wrong body).
* Admission policies that compare with the store's next victim (``tinylfu``, ``adaptive``)
  need an eviction order by key, which a ring of regions does not have: they are refused
  for the disk tier, naming the ones that work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.core.admission import AdmissionConfig, AdmissionPolicy, make_policy, parse_policy
from proxy.core.regions import Regions

# The admission policies a disk tier takes.
DISK_POLICIES = ("always", "second-hit", "nth-hit", "probabilistic", "size-below")


@dataclass(slots=True)
class DiskCounters:
    hits: int = 0
    misses: int = 0
    admissions: int = 0
    rejected: int = 0
    too_large: int = 0
    bytes_written: int = 0
    bytes_not_written: int = 0
    evicted_objects: int = 0
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a key's record lies: region, offset, whole length."""

    region: int
    offset: int
    length: int


@dataclass(slots=True)
class DiskTier:
    """The index and counters of a disk tier writing into ``regions``, admitting by
    ``admission``."""

    regions: Regions
    admission_config: AdmissionConfig = field(default_factory=AdmissionConfig)
    counters: DiskCounters = field(default_factory=DiskCounters)
    slots: dict[str, Slot] = field(default_factory=dict)
    by_region: dict[int, list[str]] = field(default_factory=dict)
    bytes_held: int = 0
    admission: AdmissionPolicy = field(init=False, repr=False)

    def __post_init__(self) -> None:
        name, _ = parse_policy(self.admission_config.policy)
        if name not in DISK_POLICIES:
            raise ValueError(
                f"disk admission {self.admission_config.policy!r}: it compares with the next "
                f"victim by key, which a ring of regions has not; use one of "
                f"{', '.join(DISK_POLICIES)}"
            )
        self.admission = make_policy(self.admission_config, self)  # type: ignore[arg-type]

    def estimated_capacity_objects(self) -> int:
        """Records of the mean length held that the ring holds when full (0 when empty):
        what ``window = "auto"`` sizes the disk admission's filter by."""
        if not self.slots:
            return 0
        return round(self.regions.capacity_bytes * len(self.slots) / self.bytes_held)

    def find(self, key: str) -> Slot | None:
        """Where ``key``'s record lies, counted as a disk hit; None, counted as a miss."""
        slot = self.slots.get(key)
        if slot is None:
            self.counters.misses += 1
        else:
            self.counters.hits += 1
        return slot

    def offer(self, key: str, size: int, length: int, now: float) -> Slot | None:
        """A response of ``size`` body bytes, a record of ``length`` bytes, fetched for
        ``key``: where to write it when the tier takes it, else None."""
        c = self.counters
        if key in self.slots:
            return None
        if not self.admission.admit(key, size, now):
            c.rejected += 1
            c.bytes_not_written += length
            return None
        placement = self.regions.place(length)
        if placement is None:
            c.too_large += 1
            return None
        if placement.evicted is not None:
            self._evict(placement.evicted)
        slot = Slot(placement.region, placement.offset, length)
        self.slots[key] = slot
        self.by_region.setdefault(slot.region, []).append(key)
        self.bytes_held += length
        c.admissions += 1
        c.bytes_written += length
        return slot

    def drop(self, key: str) -> None:
        """Forget ``key``: its record could not be written or read whole."""
        slot = self.slots.pop(key, None)
        if slot is not None:
            self.bytes_held -= slot.length
            self.counters.dropped += 1

    def _evict(self, region: int) -> None:
        for key in self.by_region.pop(region, ()):
            slot = self.slots.get(key)
            if slot is not None and slot.region == region:
                del self.slots[key]
                self.bytes_held -= slot.length
                self.counters.evicted_objects += 1
