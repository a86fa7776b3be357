"""Offline replay of a trace through two tiers: the memory tier the proxy has today, in front
of a disk tier with its own admission, to predict the hit ratio and the bytes a device would
be written.

The rules, which the live disk tier will keep:

* The memory tier first, by the engine's own rules (``CacheEngine.plan`` and
  ``on_response``, as the live proxy drives them).
* A memory miss asks the disk tier (``DiskTier.find``): a disk hit is answered from disk, with
  no origin fetch, counted, and kept in memory too when memory's admission and its promotion
  filter take it (``CacheEngine.found_behind``, ``_promotes``), as the live proxy counts and
  keeps it.
* A miss of both fetches from the origin: the memory tier decides as always, and the disk
  tier's own admission decides whether the response is written to disk (``DiskTier.offer``),
  as a record of ``DiskSpec.record_length`` bytes (given the live encoder's, as the parity
  test gives it, regions end where the live proxy's end; else its key, its body and
  ``meta_bytes`` of status, fields and times), at the end of the open region (``Regions``).
* With a ``ttl`` responses expire, in memory and on disk alike (see ``model_tiers``).

``simulate_tiers`` runs the compiled loop (``proxy.core._native.simulate_tiers``: millions of
requests a second) over the engine's own store, admission, disk index and write budget;
``model_tiers`` runs each request through the engine's and the disk tier's Python rules, a few
hundred thousand a second: the model the compiled loop is held equal to, count for count
(``tests/test_tiers.py``), and the one ``tests/test_parity.py`` holds equal to the live proxy.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np

from loadgen.sim.simulate import (
    SimResult,
    build_engine,
    key_arrays,
    policy_label,
    trace_lifetimes,
)
from loadgen.traces.trace import Trace
from proxy.core.admission import AdmissionConfig, key_sample
from proxy.core.disk import (
    ASSUMED_META,
    RECORD_HEADER,
    AutoPolicy,
    DiskTier,
    WriteBudget,
    assumed_record_length,
)
from proxy.core.engine import CacheEngine
from proxy.core.events import Behind, FromCache, RequestMeta, ResponseMeta
from proxy.core.regions import Regions
from proxy.core.replay import replay_tiers
from proxy.core.store import ENTRY_OVERHEAD
from proxy.core.ttl_rules import TtlRules

_STORED = ResponseMeta(cacheable=True)


@dataclass(frozen=True)
class DiskSpec:
    """A disk tier of ``size`` bytes in regions of ``region_size``, admitting by
    ``admission`` (by default second hit, its window sized by the records it holds)."""

    size: int
    region_size: int = 16 << 20
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    meta_bytes: int = ASSUMED_META
    # The length of the record of ``key`` with a body of ``size`` bytes, when known (a live
    # proxy's ``DiskStore.record_length`` for the responses its origin sends); else a record
    # of ``meta_bytes`` of meta is assumed.
    record_length: Callable[[str, int], int] | None = None
    max_write_rate: float = 0.0  # bytes a second of the trace's time; 0: no budget
    # The secret an admission that samples keys (``auto``'s ghosts) chooses them by, as a
    # live proxy keys its own (``key_sample``); 0: by the hash itself.
    sample_key: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.region_size < 1 << 32:
            raise ValueError(
                f"a region of {self.region_size} bytes: regions are 1 byte to 4 GiB (a "
                "record's place in its region is 32 bits)"
            )
        if self.size < 2 * self.region_size:
            raise ValueError(
                f"a disk tier of {self.size} bytes holds fewer than 2 regions of "
                f"{self.region_size}: give it at least {2 * self.region_size} bytes"
            )

    def behind(self, engine: CacheEngine, max_object_bytes: int | None) -> DiskTier:
        """A fresh tier of this spec behind ``engine``'s memory tier, keeping bodies past
        memory's largest (``CacheEngine.behind_largest``): a region less a record's header and
        assumed meta, up to ``max_object_bytes``. The live proxy's (``Config.behind_largest``)
        leaves room for the longest URL and head it accepts instead; a record longer than its
        region, its key counted, is refused by the disk either way (``disk_too_large``)."""
        regions = Regions(self.region_size, self.size // self.region_size)
        length = self.record_length or partial(assumed_record_length, meta=self.meta_bytes)
        tier = DiskTier(regions, self.admission, budget=WriteBudget(self.max_write_rate),
                        record_length=length)  # fmt: skip
        key_sample(tier.admission, self.sample_key)
        largest = self.region_size - RECORD_HEADER - self.meta_bytes
        engine.behind = (tier,)
        engine.behind_largest = (
            largest if max_object_bytes is None else min(largest, max_object_bytes)
        )
        return tier


def simulate_tiers(
    trace: Trace,
    memory_bytes: int,
    admission: AdmissionConfig,
    disk: DiskSpec,
    *,
    max_object_bytes: int | None = None,
    entry_overhead: int = ENTRY_OVERHEAD,
    ttl: float = math.inf,
    key_prefix: str = "",
    eviction: str = "lru",
    ttl_rules: TtlRules | None = None,
) -> SimResult:
    """Replay ``trace`` through a fresh memory tier of ``memory_bytes`` and the disk tier
    ``disk`` describes, in the compiled loop. The stats are the engine's, counted as the live
    proxy counts them (``hits`` of either tier, ``hits_from_memory`` and ``hits_from_disk``
    among them), and the disk tier's own (``disk_*``: its lookups, writes and evictions).

    With a finite ``ttl`` every response lives that long, memory's copy and the disk's record
    alike (each from when it was written), and has no validator, as the live proxy meets it:
    a stale entry in memory is fetched again (the disk is not asked), a stale record on disk
    answers nothing and the response is fetched again, and what is fetched replaces both.
    The operator's ``ttl_rules`` give each key its own lifetime, as in ``simulate``."""
    engine = build_engine(memory_bytes, admission, max_object_bytes, entry_overhead, eviction)
    tier = disk.behind(engine, max_object_bytes)
    sizes = np.ascontiguousarray(trace.sizes, dtype=np.int64)
    started = time.perf_counter()
    replay_tiers(
        engine, tier, key_arrays(trace, key_prefix),
        np.ascontiguousarray(trace.times, dtype=np.float64), sizes,
        record_overhead=RECORD_HEADER + disk.meta_bytes,
        lengths=_record_lengths(trace, key_prefix, disk, sizes), ttl=ttl,
        lifetimes=trace_lifetimes(trace, key_prefix, ttl_rules, ttl),
    )  # fmt: skip
    return _result(engine, tier, trace, disk, admission, eviction, started)


def _record_lengths(
    trace: Trace, key_prefix: str, disk: DiskSpec, sizes: np.ndarray
) -> np.ndarray | None:
    """Each request's record length where the compiled loop cannot count it from the key it
    formats (a numeric id, after the prefix): the ``record_length`` given, or the key's UTF-8
    bytes of a named trace."""
    if disk.record_length is not None:
        return np.fromiter(
            (disk.record_length(key_prefix + k, s)
             for k, s in zip(trace.key_strings(), sizes.tolist(), strict=True)),
            dtype=np.int64, count=len(trace),
        )  # fmt: skip
    if trace.names is None:
        return None
    key_bytes = np.fromiter(
        (len((key_prefix + name).encode()) for name in trace.names), dtype=np.int64
    )
    return RECORD_HEADER + disk.meta_bytes + key_bytes[trace.ids] + sizes


def _result(
    engine: CacheEngine,
    tier: DiskTier,
    trace: Trace,
    disk: DiskSpec,
    admission: AdmissionConfig,
    eviction: str,
    started: float,
) -> SimResult:
    elapsed = time.perf_counter() - started
    stats = engine.stats()
    stats.update(
        {f"disk_{name}": value for name, value in asdict(tier.counters).items()},
        disk_objects=len(tier),
        disk_index_bytes=tier.index.memory_bytes,
    )
    label = f"{policy_label(admission, eviction)} + disk {disk.admission.label()}"
    auto = tier.admission.state() if isinstance(tier.admission, AutoPolicy) else None
    return SimResult(label, engine.store.capacity_bytes, admission, len(trace), stats, elapsed,
                     [], 1.0, eviction, disk_auto=auto)  # fmt: skip


def model_tiers(
    trace: Trace,
    memory_bytes: int,
    admission: AdmissionConfig,
    disk: DiskSpec,
    *,
    max_object_bytes: int | None = None,
    entry_overhead: int = ENTRY_OVERHEAD,
    ttl: float = math.inf,
    key_prefix: str = "",
    eviction: str = "lru",
) -> SimResult:
    """``simulate_tiers``, each request through the engine's and the disk tier's Python rules
    as the live proxy drives them (``CacheEngine.plan``, then ``found_behind`` with what
    ``DiskTier.find`` holds, then ``on_response``): the engine offers each response to the
    disk tier and writes it there (``proxy.core.tiers.Tier.takes`` and ``put``)."""
    engine = build_engine(memory_bytes, admission, max_object_bytes, entry_overhead, eviction)
    stored = _STORED if math.isinf(ttl) else _STORED._replace(lifetime=ttl)
    written: dict[str, float] = {}  # key -> when its record was written
    tier = disk.behind(engine, max_object_bytes)
    keys = trace.key_strings()
    sizes = trace.sizes.tolist()
    times = trace.times.tolist()
    plan, found_behind, on_response = engine.plan, engine.found_behind, engine.on_response
    entry_type = engine.entry_type
    find = tier.find
    started = time.perf_counter()
    for name, size, now in zip(keys, sizes, times, strict=True):
        key = key_prefix + name
        request = RequestMeta(key)
        action = plan(request, now)
        if type(action) is FromCache:
            continue
        if type(action) is Behind:  # memory holds nothing: the disk is asked
            found = None
            if find(key) is not None:
                found = (entry_type(key, size, written[key], ttl, 0.0, (), {}, None), ())
            if type(found_behind(tier, request, found, now, action.then)) is FromCache:
                continue
        on_response(request, stored, size, now)
        # The fetch made the tier forget its older record: one found now was written now.
        if find(key) is not None:
            written[key] = now
    return _result(engine, tier, trace, disk, admission, eviction, started)


def tier_cells(
    trace: Trace,
    sizes: dict[int, str],
    policies: list[tuple[AdmissionConfig, str]],
    disks: list[DiskSpec],
    max_object_bytes: int | None,
    entry_overhead: int,
    say: Callable[[str], None] | None = None,
    ttl: float = math.inf,
    ttl_rules: TtlRules | None = None,
) -> list[SimResult]:
    """Every memory size x (admission, eviction) x disk tier, one after another (``ttl``
    and ``ttl_rules`` as ``simulate_tiers`` takes them)."""
    results = []
    for size in sizes:
        for (config, eviction), disk in itertools.product(policies, disks):
            result = simulate_tiers(trace, size, config, disk, max_object_bytes=max_object_bytes,
                                    entry_overhead=entry_overhead, eviction=eviction, ttl=ttl,
                                    ttl_rules=ttl_rules)  # fmt: skip
            results.append(result)
            if say is not None:
                say(f"{result.label} @ {sizes[size]}: {result.elapsed:.1f}s")
    return results
