"""The disk tier's bookkeeping, without I/O: which keys it holds and where, what its own
admission lets in, and what it wrote. The live tier (``proxy.disk.region_log`` writes what this
places) and the simulator drive the same object, so a simulated run's disk writes are the
device's.

Rules it keeps:

* A response reaches the disk tier only when the tier's own admission says so (``offer``):
  by default the windowed filter, so only a second sighting within the window costs a write.
  A key already on disk is not written again.
* Every record goes where ``Regions`` places it, at the end of the open region. Opening a
  region past the ring's size evicts the oldest whole, and every key placed in it leaves the
  index at once.
* ``find`` says where a key's record lies; ``answered`` counts a memory miss the disk
  answered or did not; ``drop`` forgets a key whose record could not be written or read
  whole (it is then a miss, never a wrong body).
* A purge by prefix or by tag (``ban``) cannot visit the records it purges: the index keeps
  hashes, not keys or tags. It is kept instead as a ban, as Varnish keeps its bans: a key
  under the prefix whose record was written before the ban (an earlier place in the ring) is
  dropped when ``find`` next meets it, one whose response carries the tag when its record is
  next read (``tag_banned``), and counted ``purged``. A ban goes once the region it was issued
  in is evicted, with every record it could purge; past ``MAX_BANS`` outstanding, one ban of
  every key written so far replaces them, so the list stays bounded.
* The index is compiled (``proxy.core._native.DiskIndex``): 20-byte slots, three eighths to
  three quarters full, so 27 to 54 bytes of RAM an object, by the 64-bit hash of its key.
  Two keys of one hash share a slot; the record holds its whole key, which every read checks.
  It counts its records and their bytes per region, so those of an evicted region leave the
  counts at once.
* The workers of one machine share one tier (``--workers``): its index and its ring's head
  in shared memory (``proxy.core._native.SharedIndex`` and ``proxy.core.regions.SharedRegions``,
  the same calls), changed without locks. The table is fixed: 8 records a bucket, one slot
  for every 2 KiB of the ring. Where records are smaller than that on average, a full bucket
  gives up the record of its oldest region (a miss, counted ``pushed_out``), the one the ring
  would evict first. A reader may meet a slot being taken over; the record's key, checked on
  every read, makes that a miss. The disk admission's window is shared too
  (``admission_memory``).
* A write budget (``WriteBudget``, compiled: bytes a second; none by default) tightens
  admission when the tier writes faster: what the admission takes is then written with a
  probability set each second from the last second's rate (its ratio to the budget, up to
  all), as CacheLib's dynamic random admission keeps flash within its endurance, drawn from a
  seeded generator so that runs repeat. What it turns away is counted as ``throttled``.
* Admission policies that compare with the store's next victim (``tinylfu``, ``adaptive``)
  need an eviction order by key, which a ring of regions does not have: they are refused
  for the disk tier, naming the ones that work.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from proxy.core import variants
from proxy.core._native import Admission, DiskIndex, SharedIndex, WriteBudget, hash64
from proxy.core.admission import (
    AdaptivePolicy,
    AdmissionConfig,
    AdmissionPolicy,
    compiled_admission,
    make_policy,
    parse_policy,
)
from proxy.core.regions import Regions, Ring
from proxy.core.rfc9110 import Headers
from proxy.core.store import Entry
from proxy.core.tags import response_tags
from proxy.core.tiers import forgotten_keys
from proxy.core.units import format_size

if TYPE_CHECKING:
    from proxy.core.events import RequestMeta, ResponseMeta
    from proxy.core.window import SharedMemory

# A record's header (``proxy.disk.region_log`` writes and reads records): magic, the whole record's
# length, the checksum of what follows it, the key's length, the meta's length.
RECORD = struct.Struct("<4sIIHI")
# A slot as the index's ``dump`` gives it: the key's hash, region, offset, length.
SLOT = struct.Struct("=QIII")
RECORD_HEADER = RECORD.size
# The admission policies a disk tier takes.
DISK_POLICIES = ("always", "second-hit", "nth-hit", "probabilistic", "size-below", "auto")
# ``auto``'s candidates (each with a ghost tier of ``AUTO_RATE`` of the keys and of the
# disk's size): the rules, then size classes, size-below at these percentiles of the sizes
# looked up, on a power of 2 (video chunks of megabytes get classes of their own). How often
# they are compared, how close to the best hit ratio counts as tied (the least writer of the
# tied decides), and the share of the most written (admit-all's) past which a candidate is
# left out while one within it is left and admit-all's ghost evicts (a flash device's writes
# bounded: on a block trace admit-all leads the ghosts for a while, and its writes push out
# what the size classes would keep). A ghost's record is its body and the assumed meta.
AUTO_CANDIDATES = ("always", "second-hit", "nth-hit:3", "probabilistic:0.1", "size-below:16KiB",
                   "size-below:64KiB")  # fmt: skip
AUTO_CLASSES = (25, 50, 75)
AUTO_RATE = 1 / 16
AUTO_LONGEST_HELD = 4  # a ghost's rate is at least this many of its tier's regions, of all
AUTO_PERIOD = 1024
AUTO_MARGIN = 0.005
AUTO_SHARE = 0.15
# The bytes of status, fields and times a record is assumed to hold where its encoder is not
# at hand (the simulator, ghost tiers): about what a CDN response's head takes.
ASSUMED_META = 512
# Bans kept at most (a few hundred bytes each): past this, one ban of everything replaces them.
MAX_BANS = 1024

# A purge by prefix or by tag: records of keys starting with the prefix, or (a tag ban, the
# last item true) whose response carries the tag, written before ``region`` and ``offset``
# (the ring's next write at the purge) are purged.
Ban = tuple[str, int, int, bool]


class AutoPolicy(AdaptivePolicy):
    """``auto``, a disk tier's admission (``proxy.core.native.auto``): its candidates named
    as they decide now (a size class by its limit and percentile, the core's
    ``classes``, its last candidates) and what its ghosts found."""

    def keys(self) -> list[str]:
        """Each candidate's name that stays: a size class as ``size-below:p50``."""
        classes = [f"size-below:p{p}" for p in self.native.classes]
        return [c.name for c in self.candidates[: len(self.candidates) - len(classes)]] + classes

    def names(self) -> list[str]:
        """Each candidate's name: a size class as ``size-below:32KiB (class p50)`` once the
        core has set its limit (a power of 2, not the percentile itself), its key before."""
        out = self.keys()
        rules = len(self.candidates) - len(self.native.classes)
        for j, (p, c) in enumerate(zip(self.native.classes, self.candidates[rules:],
                                       strict=True), rules):  # fmt: skip
            if c.native.limit:
                out[j] = f"size-below:{format_size(c.native.limit)} (class p{p})"
        return out

    @property
    def choice(self) -> str:
        return self.names()[self.native.choice]

    def said(self) -> str:
        """The choice and why, in a line: each candidate's recent ghost hit ratio and share of
        the most written."""
        state = self.state()
        found = ", ".join(
            f"{c['admission']} {c['recent_hit_ratio']:.3f} writing {c['recent_write_share']:.0%}"
            for c in state["candidates"]  # type: ignore[attr-defined]
            if c["recent_hit_ratio"] is not None and c["recent_write_share"] is not None
        )
        return (f"{state['choice']} decides (switch {state['switches']}); recent hit ratio "
                f"and share of the most written, of each ghost: {found or 'none yet'}")  # fmt: skip

    def state(self) -> dict[str, object]:
        """What /stats shows of it (``disk_auto``): the candidate deciding, its switches, and
        each candidate's recent ghost hit ratio and share of the most written (admit-all's)."""
        native = self.native
        seen, written = native.seen, native.written()
        most = max(written, default=0.0)
        return {
            "choice": self.choice,
            "choice_key": self.keys()[native.choice],
            "switches": native.switches,
            "sampled_lookups": native.sampled,
            "candidates": [
                {"admission": name, "key": key,
                 "recent_hit_ratio": round(score / seen, 4) if seen else None,
                 "recent_write_share": round(w / most, 4) if most else None}
                for name, key, score, w in zip(self.names(), self.keys(), native.scores(),
                                               written, strict=True)
            ],
        }  # fmt: skip


def record_key(request: RequestMeta, response: ResponseMeta) -> str:
    """The key a response's record is written under: its URL's, or its variant's."""
    if response.vary:
        return variants.variant_key(request.key, response.vary, request.headers)
    return request.key


def assumed_record_length(key: str, size: int, meta: int = ASSUMED_META) -> int:
    """A record's bytes for a body of ``size`` bytes under ``key`` with ``meta`` bytes of meta:
    what a simulated tier counts when it is not told (``DiskTier.record_length``)."""
    return RECORD_HEADER + len(key.encode()) + meta + size


def slots(dump: bytes) -> list[tuple[int, Slot]]:
    """The (key hash, place) of each slot of an index's ``dump``; a key whose hash is 0 is
    kept as 1 (the index's empty key is 0: both indexes keep that rule)."""
    return [(key, Slot(region, offset, length))
            for key, region, offset, length in SLOT.iter_unpack(dump)]  # fmt: skip


def index_key(key: str) -> int:
    """The hash the index keeps for ``key`` (``slots``)."""
    return hash64(key)[0] or 1


@dataclass(slots=True)
class DiskCounters:
    hits: int = 0
    misses: int = 0
    admissions: int = 0
    rejected: int = 0
    too_large: int = 0
    throttled: int = 0
    bytes_written: int = 0
    bytes_not_written: int = 0
    evicted_objects: int = 0
    dropped: int = 0
    purged: int = 0


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

    regions: Ring
    admission_config: AdmissionConfig = field(default_factory=AdmissionConfig)
    counters: DiskCounters = field(default_factory=DiskCounters)
    budget: WriteBudget = field(default_factory=lambda: WriteBudget(0.0))
    # Outstanding purges by prefix or tag, oldest first; changed in place only (a compiled
    # reader holds this list).
    bans: list[Ban] = field(default_factory=list)
    # The index a machine's workers share (``regions`` then shares its ring), and the memory
    # of the admission window they share; None: the process's own.
    index: DiskIndex | SharedIndex | None = field(default=None, repr=False)
    admission_memory: SharedMemory | None = field(default=None, repr=False)
    # Called before each ``find``: brings in the bans the other workers of the machine took
    # (``proxy.disk.keeping``); None for a tier of one process.
    follow_bans: Callable[[], None] | None = field(default=None, repr=False)
    # The bytes of the record of a body of ``size`` bytes under ``key``, as the simulator
    # counts it (``takes``, ``put``; the live tier writes records of its own length).
    record_length: Callable[[str, int], int] = field(default=assumed_record_length, repr=False)
    admission: AdmissionPolicy = field(init=False, repr=False)

    def __post_init__(self) -> None:
        name, _ = parse_policy(self.admission_config.policy)
        if name not in DISK_POLICIES:
            raise ValueError(
                f"disk admission {self.admission_config.policy!r}: it compares with the next "
                f"victim by key, which a ring of regions has not; use one of "
                f"{', '.join(DISK_POLICIES)}"
            )
        if self.index is None:
            self.index = DiskIndex(self.regions.regions)
        if name == "auto":
            self.admission = self._auto()
            return
        self.admission = make_policy(
            self.admission_config,
            self,  # type: ignore[arg-type]
            shared=self.admission_memory,
        )

    def _auto(self) -> AdmissionPolicy:
        """``auto``: the candidates deciding for this tier, and a ghost tier each."""
        if isinstance(self.index, SharedIndex):
            raise ValueError(
                "disk admission 'auto' keeps its candidates' state in one process: under "
                "--workers give the disk tier one of " + ", ".join(DISK_POLICIES[:-1])
            )
        candidates, ghosts = [], []
        ring = self.regions
        # A ghost holds a few of its tier's longest records, or sees none of them.
        rate = min(1.0, max(AUTO_RATE, AUTO_LONGEST_HELD / ring.regions))
        region = max(1, round(ring.region_size * rate))
        # A size class is size-below whose limit the core sets from the sizes it is asked for
        # (0, admitting nothing, until then; 1 here is a placeholder).
        names = AUTO_CANDIDATES + ("size-below:1",) * len(AUTO_CLASSES)
        for name in names:
            config = replace(self.admission_config, policy=name)
            candidates.append(make_policy(config, self))  # type: ignore[arg-type]
            ghosts.append(DiskTier(Regions(region, ring.regions), config.scaled(rate)))
        native = Admission(
            "auto",
            candidates=tuple(compiled_admission(c) for c in candidates),
            shadows=tuple(g.index for g in ghosts),
            shadow_policies=tuple(compiled_admission(g.admission) for g in ghosts),
            rate=rate, period=AUTO_PERIOD, margin=AUTO_MARGIN,
            choice=AUTO_CANDIDATES.index("second-hit"), region_size=region,
            regions=ring.regions, overhead=RECORD_HEADER + ASSUMED_META,
            budget=float(self.budget.rate), share=AUTO_SHARE, classes=AUTO_CLASSES,
            longest=ring.region_size,
        )  # fmt: skip
        return AutoPolicy(native, candidates, "auto")  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.index)

    @property
    def bytes_held(self) -> int:
        """Bytes of the records the index holds."""
        return self.index.bytes

    def estimated_capacity_objects(self) -> int:
        """Records of the mean length held that the ring holds when full (0 when empty):
        what ``window = "auto"`` sizes the disk admission's filter by."""
        if not self.bytes_held:
            return 0
        return round(self.regions.capacity_bytes * len(self.index) / self.bytes_held)

    def find(self, key: str) -> Slot | None:
        """Where ``key``'s record lies, or None; nothing counted (see ``answered``) but a
        record a ban purges, which is dropped."""
        if self.follow_bans is not None:
            self.follow_bans()
        found = self.index.get(hash64(key)[0])
        if found is None:
            return None
        slot = Slot(*found)
        if self.bans and self.banned(key, slot):
            self.drop(key, purged=True)
            return None
        return slot

    def banned(self, key: str, slot: Slot) -> bool:
        """Whether a ban by prefix purges ``key``'s record at ``slot``."""
        return any(
            not by_tag and key.startswith(prefix) and (slot.region, slot.offset) < (region, offset)
            for prefix, region, offset, by_tag in self.bans
        )

    def tag_banned(self, tags: tuple[str, ...], slot: Slot) -> bool:
        """Whether a ban by tag purges a record at ``slot`` whose response carries ``tags``."""
        return any(
            by_tag and tag in tags and (slot.region, slot.offset) < (region, offset)
            for tag, region, offset, by_tag in self.bans
        )

    def ban(self, prefix: str, *, by_tag: bool = False) -> None:
        """Purge every record written so far of a key starting with ``prefix``, or (``by_tag``)
        whose response carries the tag ``prefix``."""
        live = self.regions.live
        if not live:
            return
        position = (live[-1], self.regions.fill)
        if len(self.bans) >= MAX_BANS:
            self.bans[:] = [("", *position, False)]
        else:
            self.bans.append((prefix, *position, by_tag))

    def answered(self, hit: bool) -> None:
        """Count a memory miss the disk answered (``hit``) or did not."""
        if hit:
            self.counters.hits += 1
        else:
            self.counters.misses += 1

    def served(self, key: str, size: int, now: float) -> None:
        """``key``'s record (``size`` body bytes) answered a request at ``now``: an admission
        that observes (``auto``) sees the lookup."""
        if self.admission.observes:
            self.admission.observe(key, size, now)

    def takes(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        kept: bool,
        now: float,
    ) -> bool:
        """``proxy.core.tiers.Tier.takes`` for the simulator: ``admit`` of the key its record
        is written under (``record_key``), its record as ``record_length`` counts it."""
        size = length or 0
        key = record_key(request, response)
        return self.admit(key, size, self.record_length(key, size), now)

    def put(
        self, request: RequestMeta, response: ResponseMeta, body: object, size: int, now: float
    ) -> None:
        """``proxy.core.tiers.Tier.put`` for the simulator: the record placed and indexed."""
        key = record_key(request, response)
        length = self.record_length(key, size)
        placement = self.regions.place(length)
        assert placement is not None, "admit checked that the record fits a region"
        self.recorded(key, placement.region, placement.offset, length)

    def offer(self, key: str, size: int, length: int, now: float) -> Slot | None:
        """A response of ``size`` body bytes, a record of ``length`` bytes, fetched for
        ``key``: where it is written when the tier takes it (``admit``, then placed and
        ``recorded``), else None: ``admit`` and ``put`` in one call, for a key and its
        record's length alone."""
        if not self.admit(key, size, length, now):
            return None
        placement = self.regions.place(length)
        assert placement is not None, "admit checked that the record fits a region"
        return self.recorded(key, placement.region, placement.offset, length)

    def admit(self, key: str, size: int, length: int, now: float) -> bool:
        """Whether the tier takes a response of ``size`` body bytes (a record of ``length``
        bytes) for ``key``: not on disk yet, no larger than a region, and its admission says
        so. Counted either way; an admission that observes (``auto``) sees the lookup."""
        c = self.counters
        if self.admission.observes:
            self.admission.observe(key, size, now)
        if self.index.get(hash64(key)[0]) is not None:
            return False
        if length > self.regions.region_size:
            c.too_large += 1
            return False
        if not self.admission.admit(key, size, now):
            c.rejected += 1
            c.bytes_not_written += length
            return False
        if not self.budget.allow(now):
            c.throttled += 1
            c.bytes_not_written += length
            return False
        return True

    def recorded(self, key: str, region: int, offset: int, length: int) -> Slot:
        """``key``'s record was written at ``region`` and ``offset`` (where ``regions``
        placed it): index it, after dropping the regions the placement evicted."""
        self._follow_evictions()
        slot = Slot(region, offset, length)
        self.index.put(hash64(key)[0], region, offset, length)
        self.counters.admissions += 1
        self.counters.bytes_written += length
        self.budget.wrote(length)
        return slot

    def restore(self, key: str, region: int, offset: int, length: int) -> None:
        """Index a record found on disk at start-up (``RegionLog.recover``): no write counted."""
        self._from_ring()
        self.index.put(hash64(key)[0], region, offset, length)

    def restore_slots(self, slots: bytes) -> int:
        """Put back the slots a checkpoint holds (``DiskIndex.dump``): those of regions no
        longer live are left out. How many were put."""
        self._from_ring()
        return self.index.load(slots)

    def drop(self, key: str, *, purged: bool = False, at: Slot | None = None) -> Slot | None:
        """Forget ``key`` (``at``: only while its record lies there, as a reader found it: a
        newer one another worker of the machine wrote stays): its record could not be written
        or read whole, its URL was invalidated, or (``purged``) a ban purges it. Where its
        record lay, or None when the tier held none."""
        h1 = hash64(key)[0]
        found = self.index.get(h1) if at is None else (at.region, at.offset, at.length)
        if found is None or not self.index.delete_at(h1, found[0], found[1]):
            return None
        region, offset, length = found
        if purged:
            self.counters.purged += 1
        else:
            self.counters.dropped += 1
        return Slot(region, offset, length)

    def forget(self, key: str, why: str) -> bool:
        """``proxy.core.tiers.Tier.forget``, journaled by nothing: the simulator's tier (the
        live one journals each drop); whether it held ``key`` itself."""
        own, *parts = forgotten_keys(key)
        for part in parts:
            self.drop(part)
        return self.drop(own) is not None

    def refreshable(self, entry: Entry) -> bool:
        """Whether the tier holds a record of ``entry``'s key that a 304 refreshes: one no
        purge reached (by prefix, ``find``; by a tag of the entry, ``tag_banned``). One a
        purge reached is dropped, as a read of it would."""
        slot = self.find(entry.key)
        if slot is None:
            return False
        if self.bans and self.tag_banned(response_tags(entry.headers), slot):
            self.drop(entry.key, purged=True)
            return False
        return True

    def refreshed(self, entry: Entry, validated: Headers, held: bool) -> None:
        """``proxy.core.tiers.Tier.refreshed`` in the simulator, and in the engine's tests: the
        index keeps no fields to match ``validated`` against, and one process writes it, so a
        ``refreshable`` record of the key memory still ``held`` is written again at the ring's
        head, as long as it was (the live tier also needs the body in hand and the write
        budget's leave); any other is forgotten."""
        if not self.refreshable(entry):
            return
        slot = self.drop(entry.key)
        assert slot is not None, "refreshable: the tier holds it"
        if not held or not validated:
            return
        placement = self.regions.place(slot.length)
        if placement is not None:
            self.recorded(entry.key, placement.region, placement.offset, slot.length)

    def durable(self) -> bool:
        """Nothing to put on a device: always durable."""
        return True

    def forget_at(self, key_hash: int, region: int, offset: int) -> bool:
        """Drop the record of ``key_hash`` if the index holds it at ``region`` and ``offset``
        (a drop journaled before a crash, made again); whether it did."""
        if not self.index.delete_at(key_hash, region, offset):
            return False
        self.counters.dropped += 1
        return True

    def _from_ring(self) -> None:
        """An empty index starts at the ring's oldest live region: nothing older to drop one
        region at a time."""
        live = self.regions.live
        if live and len(self.index) == 0 and self.index.first < live[0]:
            self.index.resume(live[0])

    def _follow_evictions(self) -> None:
        """Drop from the index the regions ``regions`` evicted, oldest first."""
        live = self.regions.live
        self._from_ring()
        while live and self.index.first < live[0]:
            self.counters.evicted_objects += self.index.evict_region(self.index.first)
        self.expire_bans()

    def expire_bans(self) -> None:
        """Forget the bans whose region is evicted: every record they purge went with it."""
        live = self.regions.live
        if self.bans and live:
            self.bans[:] = [ban for ban in self.bans if ban[1] >= live[0]]
