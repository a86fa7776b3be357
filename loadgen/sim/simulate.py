"""Offline replay of a trace through the real cache core, with the trace's time as the clock.

Every request is a lookup; every miss (absent or stale) is an origin fetch whose response is
offered for storing, by the rules the live proxy's engine applies, to the same compiled store
and admission filter. Responses are cacheable and never expire unless ``ttl`` says otherwise:
each arrives as an origin's ``max-age=ttl`` without an ``Age`` does (an initial age of 0), so
it is fresh while it has been stored less than ``ttl``, the engine's rule (``initial_age`` plus
residence under the lifetime); an expired one is fetched again and stored again without asking
admission, as the live proxy refreshes a URL it holds (``tests/test_parity.py`` replays a
trace with ttls through both).

A sweep runs every (cache size x admission) cell over one trace, in parallel worker processes that
share the trace by fork, and derives the space saved at equal hit ratio from the size curve.
"""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

import numpy as np

from loadgen.traces.trace import Trace
from proxy.core._native import hash_ids
from proxy.core.admission import AdmissionConfig
from proxy.core.engine import CacheEngine
from proxy.core.replay import KeyArrays, build_engine, replay, rule_lifetimes
from proxy.core.store import ENTRY_OVERHEAD
from proxy.core.ttl_rules import TtlRules
from proxy.core.tuning import MIN_SAMPLED_OBJECTS, TuneSettings, Tuning, enough_rate, take
from proxy.core.units import format_size, parse_size
from proxy.core.whatif import sample_below, shards_ratio

CHUNK = 1 << 16

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SimResult:
    """One simulated run: its configuration, its counters and how long it took."""

    label: str
    cache_bytes: int
    admission: AdmissionConfig
    requests: int
    stats: dict[str, int | float]
    elapsed: float
    timeline: list[dict[str, float]] = field(default_factory=list)
    sample_rate: float = 1.0
    eviction: str = "lru"
    tuning: dict[str, object] | None = None  # the tuner's state, when it chose (``auto``)
    # The disk admission ``auto``'s state at the end (``AutoPolicy.state``), when it chose.
    disk_auto: dict[str, object] | None = None

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.elapsed if self.elapsed > 0 else math.inf

    def to_dict(self) -> dict[str, object]:
        return {
            "policy": self.label,
            "cache_bytes": self.cache_bytes,
            "admission": {
                k: getattr(self.admission, k) for k in self.admission.__dataclass_fields__
            },
            "requests": self.requests,
            "elapsed_s": round(self.elapsed, 3),
            "sample_rate": self.sample_rate,
            "eviction": self.eviction,
            **({"tuning": self.tuning} if self.tuning is not None else {}),
            **({"disk_auto": self.disk_auto} if self.disk_auto is not None else {}),
            "stats": self.stats,
            "timeline": self.timeline,
        }


@dataclass(frozen=True)
class Sample:
    """A spatially sampled trace (SHARDS, Waldspurger et al., FAST'15): the requests whose key
    hash falls under ``rate`` of the hash space, with what the whole trace held."""

    trace: Trace
    rate: float
    full_requests: int
    full_bytes: int


def sample_warning(sample: Sample, cache_bytes: int) -> str | None:
    """Why the run of ``sample`` at ``cache_bytes`` is not to be taken (its cache, scaled by
    the rate, holds fewer than ``MIN_SAMPLED_OBJECTS`` of the sample's objects at their mean
    size), with the rate that would hold enough; None when it holds enough."""
    if sample.rate >= 1.0:  # the whole trace: exact, whatever the cache holds
        return None
    objects = sample.trace.distinct_objects()
    if not objects:
        return f"the {sample.rate:g} sample holds no request: sample more, or simulate whole"
    scaled = cache_bytes * sample.rate
    mean = max(1.0, sample.trace.distinct_bytes() / objects)  # objects of no bytes: one each
    held = scaled / mean
    if held >= MIN_SAMPLED_OBJECTS:
        return None
    enough = enough_rate(sample.rate, held)
    fix = f"sample at least {enough:g}, or simulate whole" if enough < 1 else "simulate whole"
    return (
        f"at {format_size(cache_bytes)} the {sample.rate:g} sample's cache is "
        f"{format_size(round(scaled))}, about {int(held)} of its objects (fewer than "
        f"{MIN_SAMPLED_OBJECTS}): its estimate may be far off; {fix}"
    )


def sample_warnings(sample: Sample, sizes: Iterable[int]) -> list[str]:
    """``sample_warning`` of each of ``sizes`` that has one."""
    return [said for size in sizes if (said := sample_warning(sample, size))]


def sample_trace(trace: Trace, rate: float, key_prefix: str = "") -> Sample:
    """Keep every request of the keys whose 64-bit hash (the store's, of ``key_prefix + key``)
    is below ``rate * 2**64``: each key is kept whole or not at all."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a sampling rate is in (0, 1], got {rate!r}")
    keep = key_hashes(trace, key_prefix) < np.uint64(sample_below(rate))
    kept = Trace(trace.times[keep], trace.ids[keep], trace.sizes[keep], trace.names)
    return Sample(kept, rate, len(trace), int(trace.sizes.sum()))


def key_hashes(trace: Trace, key_prefix: str = "") -> np.ndarray:
    """Each request's key's 64-bit hash (the store's, of ``key_prefix + key``): what a
    spatial sample keeps or leaves, unkeyed as the simulator samples."""
    if trace.names is None:
        hashes = np.empty(len(trace), dtype=np.uint64)
        hash_ids(np.ascontiguousarray(trace.ids).astype(np.uint64, copy=False),
                 key_prefix.encode(), hashes)  # fmt: skip
        return hashes
    return trace.name_hashes(key_prefix)[0][trace.ids]


def simulate(
    trace: Trace | Sample,
    cache_bytes: int,
    admission: AdmissionConfig,
    *,
    max_object_bytes: int | None = None,
    entry_overhead: int = ENTRY_OVERHEAD,
    ttl: float = math.inf,
    key_prefix: str = "",
    progress: Progress | None = None,
    timeline_points: int = 50,
    eviction: str = "lru",
    ttl_rules: TtlRules | None = None,
    tune: TuneSettings | None = None,
) -> SimResult:
    """Replay ``trace`` through a fresh engine; ``key_prefix`` is prepended to every key.
    Each response lives ``ttl``, or what the operator's ``ttl_rules`` make of it
    (``proxy.core.ttl_rules.trace_lifetime``), as the live proxy's rules would.

    A ``Sample`` runs a cache ``rate`` times ``cache_bytes`` with ``scaled`` admission; its
    stats are estimates for the whole trace (see ``_estimated``). The per-request loop is
    compiled (``proxy.core._native.simulate_chunk``): it drives the
    engine's own store index and admission filter with the engine's rules for a cacheable
    response, so its counters are the ones the live proxy would count.

    ``eviction="auto"`` runs the live proxy's tuner (``proxy.core.tuning``, with ``tune``'s
    settings): its ghosts are fed the trace's requests its sample keeps, and each choice it
    makes is taken by the engine right after the sampled request that decided it, as the
    live proxy takes it; the decisions are in the result's ``tuning``."""
    sample = trace if isinstance(trace, Sample) else None
    rate = 1.0 if sample is None else sample.rate
    trace = trace if sample is None else sample.trace
    tuning = None
    if eviction == "auto":
        if sample is not None:
            raise ValueError("the tuner samples the trace itself: simulate it whole")
        tuning = Tuning(cache_bytes, admission, tune or TuneSettings(), max_object_bytes,
                        entry_overhead)  # fmt: skip
    start_eviction = eviction if tuning is None else tuning.choice.eviction
    first = admission if tuning is None else admission.as_policy(tuning.choice.admission)
    engine = build_engine(cache_bytes, first, max_object_bytes, entry_overhead, start_eviction,
                          rate=rate)  # fmt: skip
    keys = key_arrays(trace, key_prefix)
    times = np.ascontiguousarray(trace.times, dtype=np.float64)
    sizes = np.ascontiguousarray(trace.sizes, dtype=np.int64)
    lifetimes = trace_lifetimes(trace, key_prefix, ttl_rules, ttl)
    run = functools.partial(replay, engine, keys, times, sizes, ttl=ttl, lifetimes=lifetimes)
    if tuning is not None:
        tuning.apply = lambda was, choice: take(engine, choice, admission, was=was)
        run = functools.partial(_replay_tuned, run, tuning, keys, times, sizes,
                                _Sampled(key_hashes(trace, key_prefix)))  # fmt: skip
    total = len(trace)
    every = max(1, total // max(1, timeline_points))
    step = min(CHUNK, every)  # a short trace still gets its timeline points
    timeline: list[dict[str, float]] = []
    started = time.perf_counter()
    for start in range(0, total, step):
        stop = min(total, start + step)
        run(start, stop)
        if stop == total or stop // every != start // every:
            timeline.append(_timeline_point(engine, stop, float(times[stop - 1])))
        if progress is not None:
            progress(stop, total)
    elapsed = time.perf_counter() - started
    label = policy_label(admission, eviction)
    tuned = None if tuning is None else tuning.state()
    if sample is None:
        return SimResult(label, cache_bytes, admission, total, engine.stats(), elapsed,
                         timeline, 1.0, eviction, tuned)  # fmt: skip
    stats = _estimated(engine.stats(), sample)
    return SimResult(label, cache_bytes, admission, sample.full_requests, stats, elapsed,
                     timeline, sample.rate, eviction)  # fmt: skip


@dataclass
class _Sampled:
    """The positions of the requests a sample keeps, in order, by its rate: the tuner's
    changes once (``sample = "auto"``)."""

    hashes: np.ndarray
    rate: float = math.nan
    positions: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def at(self, rate: float) -> np.ndarray:
        if rate != self.rate:
            self.rate, self.positions = (
                rate,
                np.flatnonzero(self.hashes < np.uint64(sample_below(rate))),
            )
        return self.positions


def _replay_tuned(
    run: Callable[[int, int], None],
    tuning: Tuning,
    keys: KeyArrays,
    times: np.ndarray,
    sizes: np.ndarray,
    sampled_by: _Sampled,
    start: int,
    stop: int,
) -> None:
    """Requests ``start:stop`` through the engine (``run``) and their sampled ones through
    the tuner's ghosts, cut after each sampled request that closes a period (or its sizing):
    the tuner's choice reaches the engine before the next request, as it does live."""
    while start < stop:
        sampled = sampled_by.at(tuning.rate)
        first = int(np.searchsorted(sampled, start))
        closing = first + tuning.left() - 1
        end = stop if closing >= len(sampled) else min(stop, int(sampled[closing]) + 1)
        run(start, end)
        picked = sampled[first : int(np.searchsorted(sampled, end))]
        tuning.feed(replace(keys, ids=keys.ids[picked]),
                    times[picked], sizes[picked])  # fmt: skip
        start = end


def policy_label(admission: AdmissionConfig, eviction: str = "lru") -> str:
    """A run's policy in reports: the admission's label, and the eviction unless it is LRU
    (``always`` alone is plain LRU, the baseline)."""
    return admission.label() if eviction == "lru" else f"{admission.label()} / {eviction}"


# Stats of a sampled run that are not counts of requests, bytes or entries.
_UNSCALED = frozenset(
    {"hit_ratio", "byte_hit_ratio", "writes_saved", "filter_fill", "filter_fp_estimate",
     "rotations", "forced_rotations"}
)  # fmt: skip


def _estimated(stats: dict[str, int | float], sample: Sample) -> dict[str, int | float]:
    """A sampled run's stats as estimates for the whole trace: counts over the rate, and the
    hit ratios corrected as SHARDS_adj does. Heavy keys make the sample hold more or fewer
    requests (and bytes) than ``rate`` of the whole; the difference is counted as hits,
    which is what those keys' requests mostly are."""
    rate = sample.rate
    out = {k: v if k in _UNSCALED else round(v / rate) for k, v in stats.items()}
    out["hit_ratio"] = shards_ratio(stats["hits"], stats["requests"], sample.full_requests * rate)
    out["byte_hit_ratio"] = shards_ratio(
        stats["hit_bytes"], stats["bytes_served"], sample.full_bytes * rate
    )
    out["requests"] = sample.full_requests
    out["hits"] = round(out["hit_ratio"] * sample.full_requests)
    out["bytes_served"] = sample.full_bytes
    out["hit_bytes"] = round(out["byte_hit_ratio"] * sample.full_bytes)
    return out


def trace_lifetimes(
    trace: Trace, prefix: str, rules: TtlRules | None, ttl: float
) -> np.ndarray | None:
    """Each request's lifetime under ``rules`` (``rule_lifetimes``), its key as the proxy
    keys it (``prefix`` and the name or id); None without rules. Computed once per prefix,
    ttl and rules: every simulated cell of a sweep reads them."""
    if not rules:
        return None
    cache = trace.__dict__.setdefault("_lifetimes", {})
    asked = (prefix, ttl, rules.rules)
    if asked not in cache:
        names = trace.names

        def key_of(i: int) -> str:
            return prefix + (names[i] if names is not None else str(i))

        cache[asked] = rule_lifetimes(trace.ids, key_of, rules, ttl)
    return cache[asked]


def key_arrays(trace: Trace, prefix: str) -> KeyArrays:
    """``trace``'s keys, each after ``prefix``, as the compiled loop takes them."""
    if trace.names is None:
        ids = np.ascontiguousarray(trace.ids).astype(np.uint64, copy=False)
        return KeyArrays(ids, prefix.encode(), len(prefix), ())
    ids = np.ascontiguousarray(trace.ids, dtype=np.int64)
    return KeyArrays(ids, b"", 0, trace.name_hashes(prefix))


def _timeline_point(engine: CacheEngine, done: int, now: float) -> dict[str, float]:
    c = engine.counters
    fs = engine.admission.filter_stats()
    return {
        "requests": done,
        "time": now,
        "hit_ratio": c.hits / c.requests if c.requests else 0.0,
        "bytes_written": c.bytes_written,
        "filter_fill": fs.fill if fs else 0.0,
        "filter_fp_estimate": fs.estimated_fp_rate if fs else 0.0,
    }


@dataclass(frozen=True)
class Cell:
    cache_bytes: int
    admission: AdmissionConfig
    eviction: str = "lru"


_SHARED_TRACE: Trace | Sample | None = None


@dataclass(frozen=True)
class Run:
    """What every cell of a sweep is run with besides its own size and policy."""

    max_object_bytes: int | None = None
    entry_overhead: int = ENTRY_OVERHEAD
    ttl: float = math.inf
    ttl_rules: TtlRules | None = None
    tune: TuneSettings | None = None


def _run_cell(cell: Cell, run: Run) -> SimResult:
    assert _SHARED_TRACE is not None
    return _cell(_SHARED_TRACE, cell, run)


def _cell(trace: Trace | Sample, cell: Cell, run: Run) -> SimResult:
    return simulate(trace, cell.cache_bytes, cell.admission, eviction=cell.eviction,
                    max_object_bytes=run.max_object_bytes, entry_overhead=run.entry_overhead,
                    ttl=run.ttl, ttl_rules=run.ttl_rules, tune=run.tune)  # fmt: skip


Policy = AdmissionConfig | tuple[AdmissionConfig, str]
"""An admission, evicting by LRU, or an (admission, eviction) pair."""


def sweep(
    trace: Trace | Sample,
    cache_sizes: Sequence[int],
    policies: Sequence[Policy],
    *,
    max_object_bytes: int | None = None,
    entry_overhead: int = ENTRY_OVERHEAD,
    workers: int | None = None,
    report: Callable[[int, int, SimResult], None] | None = None,
    ttl: float = math.inf,
    ttl_rules: TtlRules | None = None,
    tune: TuneSettings | None = None,
) -> list[SimResult]:
    """Every (size, policy) cell over ``trace``; results in size-major, policy-minor order.
    ``ttl``, ``ttl_rules`` and ``tune`` (the tuner's, for an ``auto`` eviction): as
    ``simulate`` takes them."""
    global _SHARED_TRACE
    run = Run(max_object_bytes, entry_overhead, ttl, ttl_rules, tune)
    pairs = [p if isinstance(p, tuple) else (p, "lru") for p in policies]
    cells = [Cell(size, adm, ev) for size in cache_sizes for adm, ev in pairs]
    workers = max(1, min(workers or os.cpu_count() or 1, len(cells)))
    results: dict[Cell, SimResult] = {}
    if workers == 1:
        for cell in cells:
            result = _cell(trace, cell, run)
            results[cell] = result
            if report:
                report(len(results), len(cells), result)
        return [results[c] for c in cells]
    requests = trace.trace if isinstance(trace, Sample) else trace
    if requests.names is not None:
        requests.name_hashes()  # once, before the workers fork, not once a cell
    trace_lifetimes(requests, "", ttl_rules, ttl)  # the same
    _SHARED_TRACE = trace
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = {pool.submit(_run_cell, c, run): c for c in cells}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if report:
                    report(len(results), len(cells), results[futures[future]])
    finally:
        _SHARED_TRACE = None
    return [results[c] for c in cells]


def resolve_sizes(texts: Sequence[str], trace: Trace, what: str = "cache size") -> dict[int, str]:
    """Bytes of each size (a percentage is of the trace's distinct bytes) -> its label;
    ValueError names ``what`` the size is."""
    sizes: dict[int, str] = {}
    footprint: int | None = None
    for text in texts:
        text = str(text).strip()
        if text.endswith("%"):
            try:
                share = float(text[:-1]) / 100
            except ValueError:
                raise ValueError(f"{what} {text!r} is not a percentage like 1%") from None
            if not math.isfinite(share):
                raise ValueError(f"{what} {text!r} is not a percentage like 1%")
            footprint = trace.distinct_bytes() if footprint is None else footprint
            size = round(footprint * share)
        else:
            size = parse_size(text)
        if size < 1:
            raise ValueError(f"{what} {text!r} is under one byte")
        sizes[size] = f"{text} ({format_size(size)})" if text.endswith("%") else format_size(size)
    if not sizes:
        raise ValueError(f"at least one {what} is needed")
    return sizes


def space_saved(
    baseline: Sequence[tuple[int, float]], candidate: Sequence[tuple[int, float]], size: int
) -> tuple[float | None, bool]:
    """1 - S'/S: S' the smallest cache at which ``candidate`` reaches ``baseline``'s hit ratio at S.

    Both curves are (cache bytes, hit ratio) points of a sweep; S' is interpolated linearly in
    log(size) between the candidate's points. Returns (saving, is_lower_bound): None when the
    candidate never reaches the target inside the sweep; a lower bound when it already does at
    its smallest size.
    """
    target = dict(baseline)[size]
    points = sorted(candidate)
    if points[0][1] >= target:
        return 1.0 - points[0][0] / size, True
    for (s0, h0), (s1, h1) in itertools.pairwise(points):
        if h0 < target <= h1:
            frac = (target - h0) / (h1 - h0)
            needed = math.exp(math.log(s0) + frac * (math.log(s1) - math.log(s0)))
            return 1.0 - needed / size, False
    return None, False


def progress_line(label: str) -> Progress:
    """A progress callback that draws one updating line on stderr once a run passes two seconds."""
    started = time.perf_counter()
    shown = False

    def show(done: int, total: int) -> None:
        nonlocal shown
        elapsed = time.perf_counter() - started
        if not shown and elapsed < 2.0:
            return
        shown = True
        rate = done / elapsed if elapsed else 0.0
        end = "\n" if done >= total else ""
        print(
            f"\r{label}: {done:,}/{total:,} requests ({done / total:.0%}), {rate:,.0f} req/s",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    return show


def describe_cell(result: SimResult) -> str:
    speed = (
        f"{result.requests_per_second:,.0f} req/s"
        if result.sample_rate == 1.0
        else f"sampled at {result.sample_rate:g}"
    )
    return (
        f"{result.label} @ {format_size(result.cache_bytes)}: hit ratio "
        f"{result.stats['hit_ratio']:.3f} ({result.elapsed:.1f}s, {speed})"
    )
