"""The live what-if: what the traffic this cache has seen would have done to other caches.

Ghost caches (keys and sizes only, no bodies) of the configured policy and of alternatives, at
``SCALES`` times the configured size, are fed a spatial sample of the requests (SHARDS,
Waldspurger et al., FAST'15): the keys whose 64-bit hash falls under ``rate`` of the hash
space, each key whole or not at all, into ghosts ``rate`` times the size (admission key counts
scaled alike, as ``AdmissionConfig.scaled`` does). Each ghost is the compiled store and
admission the proxy runs, driven by the simulator's own loop (``proxy.core.replay``), so a
curve is what ``onehit-loadgen simulate --sample RATE`` gives for the same requests.

Rules it keeps:

* A request is recorded once it is answered, with its body's size: a hit (any tier) with the
  stored size, a miss once its cacheable response is decided (kept or not). Requests the cache
  cannot store (other methods, uncacheable answers) are not recorded: the ghosts model what
  the cache could have done.
* Recording is cheap for the 99% not sampled (a hash compared); sampled requests are kept in a
  buffer of at most ``BATCH`` and replayed through every ghost at once, so the ghosts cost a
  compiled loop per batch, not Python per request. ``curves`` replays what is buffered first.
* Each curve's miss ratio is corrected as SHARDS_adj corrects it (heavy keys make the sample
  hold more or fewer requests than ``rate`` of the whole); its counts are the sample's over
  ``rate``, estimates for the whole traffic.
* With a disk tier, the disk alternatives (``DiskGhosts``) run behind ghosts of the
  configured memory tier, at each scale of the disk's size: the hit ratio of both tiers and
  the bytes each disk rule would have written. A disk ghost's regions are the sample's share
  of the disk's, but at least the largest record the cache writes (a region scaled down would
  refuse large objects the disk takes); a scale of the disk too small for two of them has no
  ghost. Under ``--workers`` one disk is behind every worker's private memory tier, so the
  disk ghosts are the machine's: each worker hands its sampled requests over (``forward``),
  and one ``DiskGhosts`` replays them through a memory ghost of that worker's own (``place``)
  and the one disk ghost they share. Batches from different workers are replayed in the order
  they arrive, each whole, their times never going back.
* A ghost holds every response until it is evicted: freshness is not modelled, so behind an
  origin that sends short lifetimes the ghosts' hit ratios are those of responses that stay
  fresh. A ghost with no sampled request yet, or that the loop refused a batch (it is fed no
  more, and says why: ``failed``), has no miss ratio.
* A reload that changes what the ghosts are built of starts them afresh (``start``): the
  cache's hits before it are not theirs.
* With ``[cache] eviction = "auto"`` it records for the tuner too (``tuning``,
  ``proxy.core.tuning``), whose sample may be larger: a request is recorded when either
  sample takes it, and each batch is cut into what each sample takes (the two keyed alike,
  the smaller is within the larger), and flushed at the request that ends a tuner's
  period, so that its choice is made with that request, as the simulator makes it. A
  what-if of no ghosts (``[whatif] sample = 0``) records for the tuner alone.
* Bounded: the ghosts hold ``rate`` of the cache's keys (27 to 54 bytes a key in memory, 20
  in a disk ghost's index), and the buffer ``BATCH`` requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from proxy.core._native import hash64, sample_point
from proxy.core.admission import AdmissionConfig
from proxy.core.disk import ASSUMED_META, RECORD_HEADER, DiskTier, WriteBudget
from proxy.core.engine import CacheEngine
from proxy.core.regions import Regions
from proxy.core.replay import KeyArrays, build_engine, replay, replay_tiers
from proxy.core.tuning import MIN_SAMPLED_OBJECTS, Tuning, enough_rate

SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
MEMORY_ALTERNATIVES = ("always", "second-hit", "tinylfu")
DISK_ALTERNATIVES = ("always", "second-hit", "nth-hit:3", "probabilistic:0.1")
BATCH = 1024  # a batch through every ghost: a few milliseconds of the event loop at most
# What a worker's ``Samples`` may carry, at most: a key's characters, a body's bytes (past
# both, a record's length would overflow the ghosts' 64-bit counts), the requests a batch
# stands for.
LONGEST_KEY = 1 << 20
LARGEST_BODY = 1 << 40
MOST_REQUESTS = 1 << 53


@dataclass(frozen=True)
class DiskShape:
    """The disk tier the what-if models alternatives of: its size, region, admission and
    write budget (bytes a second; 0: none)."""

    size: int
    region_size: int
    admission: AdmissionConfig
    max_write_rate: float = 0.0


@dataclass
class Ghost:
    """One ghost of the memory tier: its policy, its scale of the configured size and the
    bytes it stands for; its engine at ``rate``."""

    policy: str
    scale: float
    size: int
    engine: CacheEngine
    failed: str | None = None  # why the loop refused a batch: the ghost is fed no more
    tier: str = "memory"


@dataclass
class DiskGhost:
    """One ghost of the disk tier: its policy, its scale of the configured size and the bytes
    it stands for; its disk at ``rate``, and the memory ghosts in front of it, one per place
    that feeds it (``fronts``), with what those that began afresh had counted (``retired``:
    hits, requests)."""

    policy: str
    scale: float
    size: int
    disk: DiskTier
    fronts: dict[int, CacheEngine] = field(default_factory=dict)
    retired: tuple[int, int] = (0, 0)
    failed: str | None = None
    tier: str = "disk"

    def counted(self) -> tuple[int, int]:
        """Hits and requests of every memory ghost in front of it, with the disk's hits."""
        hits, requests = self.retired
        for front in self.fronts.values():
            hits += front.counters.hits
            requests += front.counters.requests
        return hits, requests


# The columns of a ``Sample``, in order: when, the key's two hashes, its characters, the size.
COLUMN_TYPES = (np.float64, np.uint64, np.uint64, np.int64, np.int64)


class Sample(NamedTuple):
    """Sampled requests, in the order they were answered: when, the key's two hashes and
    characters, the body's size (``COLUMN_TYPES``)."""

    times: np.ndarray
    h1: np.ndarray
    h2: np.ndarray
    chars: np.ndarray
    sizes: np.ndarray

    def keys(self) -> KeyArrays:
        """The keys as the compiled loop takes them."""
        return KeyArrays(np.arange(len(self.times), dtype=np.int64), b"", 0,
                         (self.h1, self.h2, self.chars))  # fmt: skip


@dataclass(frozen=True)
class Samples:
    """A batch of samples a worker hands the machine's ``DiskGhosts``: its place and process,
    the sampling rate, the requests sampled and how many requests they were sampled from;
    as JSON (``as_json``), the body of the parent's ``POST /whatif``."""

    place: int
    pid: int
    rate: float
    sample: Sample
    requests: int

    def as_json(self) -> dict[str, object]:
        return {"from": self.place, "pid": self.pid, "rate": self.rate,
                "requests": self.requests,
                "sample": [column.tolist() for column in self.sample]}  # fmt: skip

    @classmethod
    def from_json(cls, body: object, places: int) -> Samples | None:
        """The ``Samples`` ``as_json`` gave from one of ``places`` workers: equal columns of at
        most ``4 * BATCH``, each value of its kind and within its bounds (a record's length
        must fit the ghosts' counts); None for anything else."""
        if not isinstance(body, dict):
            return None
        place, pid, rate = body.get("from"), body.get("pid"), body.get("rate")
        requests, columns = body.get("requests"), body.get("sample")
        if not (
            _whole(place, 0, places - 1)
            and _whole(pid, 1, 1 << 31)
            and _whole(requests, 0, MOST_REQUESTS)
            and type(rate) is float
            and 0 < rate <= 1
            and isinstance(columns, list)
            and len(columns) == len(Sample._fields)
            and all(isinstance(c, list) and len(c) == len(columns[0]) for c in columns)
            and len(columns[0]) <= 4 * BATCH
        ):
            return None  # fmt: skip
        times, h1, h2, chars, sizes = columns
        if not (
            all(type(t) in (int, float) and math.isfinite(t) for t in times)
            and all(_whole(h, 0, 2**64 - 1) for h in h1 + h2)
            and all(_whole(n, 0, LONGEST_KEY) for n in chars)
            and all(_whole(n, 0, LARGEST_BODY) for n in sizes)
        ):
            return None  # fmt: skip
        sample = Sample(*(np.array(c, t) for c, t in zip(columns, COLUMN_TYPES, strict=True)))
        return cls(place, pid, rate, sample, requests)


def _whole(value: object, low: int, high: int) -> bool:
    """``value`` is an int (not a bool) from ``low`` to ``high``."""
    return type(value) is int and low <= value <= high


class MemoryShape(NamedTuple):
    """The memory tier ghosts model: its size, admission, eviction, the store's per-entry
    overhead and largest object."""

    size: int
    admission: AdmissionConfig
    eviction: str = "lru"
    entry_overhead: int = 0
    max_object_bytes: int | None = None

    def ghost(self, scale: float, policy: str, rate: float) -> CacheEngine:
        """A ghost of this tier at ``scale`` of its size, admitting by ``policy``."""
        return build_engine(round(self.size * scale), self.admission.as_policy(policy),
                            self.max_object_bytes, self.entry_overhead, self.eviction,
                            rate=rate)  # fmt: skip


class WhatIf:
    """Ghosts of the memory tier ``memory`` describes and of its ``alternatives``, and of
    ``disk``'s alternatives when given, fed a ``rate`` sample of the requests. ``forward``,
    when set, is handed each batch sampled too (a worker's, for the machine's
    ``DiskGhosts``)."""

    def __init__(
        self,
        memory: MemoryShape,
        *,
        rate: float = 0.01,
        disk: DiskShape | None = None,
        scales: tuple[float, ...] = SCALES,
        alternatives: tuple[str, ...] = MEMORY_ALTERNATIVES,
        disk_alternatives: tuple[str, ...] = DISK_ALTERNATIVES,
        tuning: Tuning | None = None,
    ) -> None:
        _check_rate(rate)
        self.rate = rate
        self.tuning = tuning
        # The sample's secret (``sample_point``): a driver that serves clients sets one of its
        # own, so that none can choose URLs in or out of the sample; 0 (the offline
        # simulator's) samples by the hash itself.
        self.sample_key = 0
        self.missed = 0  # misses recorded, sampled or not (``curves`` is told the hits)
        self.hits_before = 0  # the cache's hits when these ghosts began (``start``)
        self.forward: Callable[[Sample], None] | None = None
        self._buffer: list[tuple[float, int, int, int, int]] = []
        self._points: list[int] = []  # each buffered request's sample point
        self._tuned = 0  # buffered requests of the tuner's sample
        policies = dict.fromkeys((memory.admission.policy, *alternatives))
        self.ghosts = [Ghost(policy, scale, round(memory.size * scale),
                             memory.ghost(scale, policy, rate))
                       for policy in policies for scale in scales]  # fmt: skip
        self.disk = None if disk is None else DiskGhosts(
            disk, memory, rate=rate, scales=scales, alternatives=disk_alternatives)  # fmt: skip
        # The ghosts' sample (none without ghosts), the tuner's, and what is recorded.
        self.own_below = sample_below(rate) if self.ghosts or self.disk is not None else 0
        self.tune_below = 0 if tuning is None else sample_below(tuning.rate)
        self.below = max(self.own_below, self.tune_below)
        # Told when the tuner's sample changed (``sample = "auto"``): a compiled path that
        # copied ``below`` copies it again.
        self.resampled: Callable[[], None] | None = None

    def start(self, hits: int) -> None:
        """The ghosts begin now, when the cache has counted ``hits``: ``curves`` is told the
        cache's hits since its start, and counts those since the ghosts'."""
        self.hits_before = hits

    def requests(self, hits: int) -> int:
        """The requests recorded since the ghosts began, the cache having counted ``hits``."""
        return hits - self.hits_before + self.missed

    def record(
        self, key: str, size: int, now: float, *, missed: bool = False, key_hash: int = 0
    ) -> None:
        """A request for ``key`` answered with a body of ``size`` bytes at ``now``: a hit, or
        (``missed``) a miss. ``key_hash``: ``key``'s ``hash64`` h1 when the caller has it (a
        stored entry's), so that the 99% not sampled cost no hashing. A compiled path that
        counts its hits itself calls this for the sampled ones alone (``sampled``)."""
        if missed:
            self.missed += 1
        if key_hash and sample_point(key_hash, self.sample_key) >= self.below:
            return
        h1, h2 = hash64(key)
        point = sample_point(h1, self.sample_key)
        if point < self.below:
            self._buffer.append((now, h1, h2, len(key), size))
            self._points.append(point)
            tuning = self.tuning
            if tuning is not None and point < self.tune_below:
                self._tuned += 1
                if self._tuned >= tuning.left():  # the tuner judges with this request
                    self.flush()
                    return
            if len(self._buffer) >= BATCH:
                self.flush()

    def flush(self) -> None:
        """Replay the buffered requests through every ghost (and hand them to ``forward``),
        and those of the tuner's sample through the tuner's."""
        if not self._buffer:
            return
        columns = zip(*self._buffer, strict=True)
        sample = Sample(*(np.array(c, k) for c, k in zip(columns, COLUMN_TYPES, strict=True)))
        points = np.array(self._points, dtype=np.uint64)
        self._buffer.clear()
        self._points.clear()
        self._tuned = 0
        own = _within(sample, points, self.own_below)
        if len(own.times):
            for ghost in self.ghosts:
                _replay(ghost, own)
            if self.disk is not None:
                self.disk.feed(0, own)
            if self.forward is not None:
                self.forward(own)
        if self.tuning is not None and self.tuning.failed is None:
            tuned = _within(sample, points, self.tune_below)
            try:
                self.tuning.feed(tuned.keys(), tuned.times, tuned.sizes)
            except (ValueError, OverflowError, MemoryError) as exc:
                # A tuner the loop refuses is a tuner lost, never a request: the tier keeps
                # its choice, and /stats says why.
                self.tuning.failed = f"{type(exc).__name__}: {exc}"
            if sample_below(self.tuning.rate) != self.tune_below:  # its sample, chosen
                self.tune_below = sample_below(self.tuning.rate)
                self.below = max(self.own_below, self.tune_below)
                if self.resampled is not None:
                    self.resampled()

    def curves(self, hits: int) -> list[dict[str, object]]:
        """Each ghost's estimates for the whole traffic recorded (``hits``, counted by the
        cache, and the misses recorded): its miss ratio (both tiers, for a disk ghost) and
        the bytes it would have written (to memory, or to the disk), and how many requests
        of the sample it saw (a few hundred make a rough estimate)."""
        self.flush()
        requests = self.requests(hits)
        out = []
        for ghost in self.ghosts:
            c = ghost.engine.counters
            curve = _curve(ghost, (c.hits, c.requests), c.bytes_written, requests, self.rate)
            held = len(ghost.engine.store)
            # Sampled enough to hold more, it holds a handful (full, or each too large).
            if c.requests >= MIN_SAMPLED_OBJECTS and held < MIN_SAMPLED_OBJECTS:
                enough = enough_rate(self.rate, held)
                curve["warning"] = (
                    f"its {self.rate:g} sample's cache holds {held} objects, fewer than "
                    f"{MIN_SAMPLED_OBJECTS}: the estimate may be far off; raise [whatif] sample"
                    + (f" to {enough:g} or more" if enough < 1 else " to 1")
                )
            out.append(curve)
        return out + ([] if self.disk is None else self.disk.curves(requests))


class DiskGhosts:
    """Ghosts of a disk tier (``disk``) and of its alternatives, each at ``scales`` of its
    size, behind ghosts of the memory tier (``memory``) in front of it: one memory ghost per
    place that feeds it (a process, or each worker of a machine), one disk ghost they share,
    as the workers share the disk. Fed ``rate`` samples (``feed``)."""

    def __init__(
        self,
        disk: DiskShape,
        memory: MemoryShape,
        *,
        rate: float = 0.01,
        scales: tuple[float, ...] = SCALES,
        alternatives: tuple[str, ...] = DISK_ALTERNATIVES,
    ) -> None:
        _check_rate(rate)
        self.rate = rate
        self.memory = memory
        self.requests = 0  # requests fed, sampled or not (``feed``'s ``requests``)
        self.latest = -math.inf  # the latest time replayed: a batch is never replayed earlier
        # A ghost's region holds the largest record the cache can write: a region scaled
        # down with the sample would refuse large objects the disk takes.
        largest = RECORD_HEADER + ASSUMED_META + 4096 + (memory.max_object_bytes or memory.size)
        region = max(round(disk.region_size * rate), min(disk.region_size, largest))
        self.ghosts: list[DiskGhost] = []
        for policy in dict.fromkeys((disk.admission.policy, *alternatives)):
            for scale in scales:
                size = round(disk.size * scale * rate)
                if size < 2 * region:  # too small a sample of this disk to model
                    continue
                config = disk.admission.as_policy(policy)
                # The sample writes ``rate`` of the disk's bytes: so does its budget.
                budget = WriteBudget(disk.max_write_rate * rate)
                tier = DiskTier(Regions(region, size // region), config.scaled(rate),
                                budget=budget)  # fmt: skip
                self.ghosts.append(DiskGhost(policy, scale, round(disk.size * scale), tier))

    def restart(self, place: int) -> None:
        """The memory tier at ``place`` began afresh (a worker replaced): its ghosts do too,
        what they counted kept."""
        for ghost in self.ghosts:
            front = ghost.fronts.pop(place, None)
            if front is not None:
                c = front.counters
                ghost.retired = (ghost.retired[0] + c.hits, ghost.retired[1] + c.requests)

    def feed(self, place: int, sample: Sample, requests: int = 0) -> None:
        """Replay ``sample``, sampled at ``place`` (its memory ghosts: a worker's own), through
        every disk ghost; ``requests``: how many requests it was sampled from (the whole
        traffic's count, for the miss ratios), when the caller counts them here."""
        self.requests += requests
        if not len(sample.times):
            return
        # Batches of several places arrive each whole, a second of a worker's at most: one
        # that began before the latest time replayed is replayed from that time on (never
        # backwards: admission windows and write budgets count forward), an approximation
        # within that second.
        times = np.maximum.accumulate(np.maximum(sample.times, self.latest))
        self.latest = float(times[-1])
        keys, lengths = sample.keys(), RECORD_HEADER + ASSUMED_META + sample.chars + sample.sizes
        for ghost in self.ghosts:
            if place not in ghost.fronts:
                ghost.fronts[place] = self.memory.ghost(1.0, self.memory.admission.policy,
                                                        self.rate)  # fmt: skip
            front, disk = ghost.fronts[place], ghost.disk
            _guarded(ghost, lambda f=front, d=disk: replay_tiers(
                f, d, keys, times, sample.sizes, record_overhead=0, lengths=lengths))  # fmt: skip

    def curves(self, requests: int | None = None) -> list[dict[str, object]]:
        """Each disk ghost's estimates for the whole traffic of ``requests`` (by default the
        requests ``feed`` was told of): the miss ratio of both tiers, every place's memory
        ghost with the shared disk, and the bytes written to the disk."""
        requests = self.requests if requests is None else requests
        return [_curve(g, g.counted(), g.disk.counters.bytes_written, requests, self.rate)
                for g in self.ghosts]  # fmt: skip


def sample_below(rate: float) -> int:
    """The sample points a ``rate`` sample takes are those below this: the one threshold of
    every spatial sample, live and simulated."""
    return min(2**64 - 1, int(rate * 2**64))


def _within(sample: Sample, points: np.ndarray, below: int) -> Sample:
    """The requests of ``sample`` whose ``points`` are below ``below``."""
    keep = points < np.uint64(below)
    return sample if keep.all() else Sample(*(column[keep] for column in sample))


def _check_rate(rate: float) -> None:
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a what-if's sampling rate is in (0, 1], got {rate!r}")


def _replay(ghost: Ghost, sample: Sample) -> None:
    """``sample`` through a memory ghost."""
    keys = sample.keys()
    _guarded(ghost, lambda: replay(ghost.engine, keys, sample.times, sample.sizes, 0,
                                   len(sample.times)))  # fmt: skip


def _guarded(ghost: Ghost | DiskGhost, run: Callable[[], None]) -> None:
    """``run`` a batch through ``ghost``, unless it has failed; a batch the loop refuses
    stops it (``failed``)."""
    if ghost.failed is not None:
        return
    try:
        run()
    except (ValueError, OverflowError, MemoryError) as exc:
        # A ghost the loop refuses is a what-if lost, never a request: it stops here.
        ghost.failed = f"{type(exc).__name__}: {exc}"


def _curve(
    ghost: Ghost | DiskGhost, counted: tuple[int, int], written: int, requests: int, rate: float
) -> dict[str, object]:
    """A ghost's curve: ``counted`` hits and requests of its sample, ``written`` bytes,
    estimated for ``requests`` of the whole traffic at ``rate``."""
    hits, sampled = counted
    miss_ratio = None
    if sampled > 0 and ghost.failed is None and requests > 0:
        miss_ratio = 1.0 - shards_ratio(hits, sampled, requests * rate)
    return {
        "tier": ghost.tier, "policy": ghost.policy, "scale": ghost.scale, "size": ghost.size,
        "miss_ratio": miss_ratio, "bytes_written": round(written / rate), "sampled": sampled,
        **({"failed": ghost.failed} if ghost.failed else {}),
    }  # fmt: skip


def merged_curves(workers: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The memory curves of workers that each keep a private memory tier (``--workers``), as
    the one machine's: for each policy and scale, the miss ratio over all their traffic (each
    worker's weighted by the sampled requests its ghost saw), the bytes written and the sizes
    summed. Disk curves are left out: the machine's are its own ``DiskGhosts``, fed by every
    worker."""
    merged: dict[tuple[str, float], dict[str, Any]] = {}
    weighted: dict[tuple[str, float], float] = {}
    for curves in workers:
        for c in curves:
            if c["tier"] != "memory" or c.get("failed"):
                continue
            key = (c["policy"], c["scale"])
            m = merged.setdefault(key, {"tier": "memory", "policy": c["policy"],
                                        "scale": c["scale"], "size": 0, "miss_ratio": None,
                                        "bytes_written": 0, "sampled": 0})  # fmt: skip
            m["size"] += c["size"]
            m["bytes_written"] += c["bytes_written"]
            if "warning" in c:  # a worker's ghost of a handful of objects: the machine's too
                m["warning"] = c["warning"]
            if c["miss_ratio"] is not None:
                m["sampled"] += c["sampled"]
                weighted[key] = weighted.get(key, 0.0) + c["miss_ratio"] * c["sampled"]
    for key, m in merged.items():
        if m["sampled"]:
            m["miss_ratio"] = weighted[key] / m["sampled"]
    return list(merged.values())


def shards_ratio(hits: float, sampled: float, expected: float) -> float:
    """The hit ratio SHARDS_adj estimates from ``hits`` of the ``sampled`` requests (or bytes)
    of a spatial sample, where ``expected`` is the sampling rate times the whole's: what the
    sample holds short of (or past) it is counted as hits, which heavy keys' requests mostly
    are; clamped to [0, 1]."""
    return min(1.0, max(0.0, (hits + expected - sampled) / expected))
