"""The flash question: which disk admission rule earns its writes. For one trace, a memory tier
and several disk sizes, every rule of the disk admission family runs in the compiled two-tier
loop (``loadgen.sim.tiers.simulate_tiers``), and each is placed by its hit ratio (memory and disk)
against the bytes it wrote to the device.

The family, each rule a curve over its parameter:

* ``always``: every miss written (the device's worst case, the baseline);
* ``second-hit``: written on a second request within the window (onehit's rule);
* ``nth-hit``: on the 3rd or 4th (nginx's ``proxy_cache_min_uses``);
* ``probabilistic``: each miss written with probability 0.05 to 0.5 (CacheLib's random);
* ``size-below``: objects under the 25th, 50th or 75th percentile of the requested sizes;
* ``dynamic random``: every miss, within a write budget of 0.5, 1 and 2 times the rate
  second hit wrote at (CacheLib's dynamic random admission at the same write budget);
* ``auto``: the family side by side, and size classes learned from the sizes looked up,
  following the one its sampled ghost tiers find hitting within 0.005 of the best while
  writing least, none writing past 15% of admit-all's while that evicts
  (``proxy.core.disk``, ``proxy.core.native.auto``); its row names the rule deciding at the
  end.

A rule's point is on the Pareto front when no other rule at that disk size has a hit ratio at
least as high with no more bytes written, one of the two strictly better.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from loadgen.sim.cells import flash_group
from loadgen.sim.tiers import DiskSpec, simulate_tiers
from loadgen.traces.trace import Trace
from proxy.core.admission import AdmissionConfig
from proxy.core.units import format_size

# Regions of a disk at most this large, and at least this many of them: a ring coarse enough
# for a device, fine enough that evicting one region is a small share of the disk.
MAX_REGION = 16 << 20
MIN_REGIONS = 16
PROBABILITIES = (0.05, 0.1, 0.2, 0.5)
PERCENTILES = (25, 50, 75)
BUDGET_SCALES = (0.5, 1.0, 2.0)
DYNAMIC = "dynamic random"

FlashCell = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """One point of the family: its curve (``rule``), its label, the disk admission and the
    write budget (bytes a second of the trace's time; 0: none)."""

    rule: str
    label: str
    admission: str
    budget: float = 0.0


def region_size(disk_bytes: int) -> int:
    """The ring's region for a disk of ``disk_bytes``: a power of two, at most ``MAX_REGION``,
    with at least ``MIN_REGIONS`` regions (a disk too small for 2 regions of 4 KiB is refused
    by ``DiskSpec``)."""
    size = 1 << max(12, (disk_bytes // MIN_REGIONS).bit_length() - 1)
    return min(MAX_REGION, size)


def fixed_rules(trace: Trace) -> list[Rule]:
    """The family but dynamic random, whose budget follows second hit's writes."""
    limits: dict[int, int] = {}  # limit -> its percentile: a trace of few sizes repeats some
    for q, limit in zip(PERCENTILES, np.percentile(trace.sizes, PERCENTILES), strict=True):
        limits.setdefault(max(1, round(float(limit))), q)
    rules = [Rule("always", "always", "always"), Rule("second-hit", "second-hit", "second-hit")]
    rules += [Rule("nth-hit", f"nth-hit:{n}", f"nth-hit:{n}") for n in (3, 4)]
    rules += [Rule("probabilistic", f"probabilistic:{p:g}", f"probabilistic:{p:g}")
              for p in PROBABILITIES]  # fmt: skip
    rules += [Rule("size-below", f"size-below:{format_size(limit)} (p{q})", f"size-below:{limit}")
              for limit, q in limits.items()]  # fmt: skip
    rules.append(Rule("auto", "auto", "auto"))
    return rules


def dynamic_rules(second_hit_written: int, duration: float) -> list[Rule]:
    """Every miss written within a budget of ``BUDGET_SCALES`` times second hit's write rate
    (``second_hit_written`` bytes over ``duration`` seconds); none for a trace without time."""
    if duration <= 0 or second_hit_written <= 0:
        return []
    rate = second_hit_written / duration
    return [Rule(DYNAMIC, f"always within {scale:g}x second hit's rate "
                          f"({format_size(round(rate * scale))}/s)", "always", rate * scale)
            for scale in BUDGET_SCALES]  # fmt: skip


@dataclass(frozen=True)
class Point:
    memory_bytes: int
    disk_bytes: int
    rule: Rule


_TRACE: Trace | None = None


def _run(point: Point, memory_admission: str, entry_overhead: int) -> dict[str, Any]:
    assert _TRACE is not None
    disk = DiskSpec(point.disk_bytes, region_size(point.disk_bytes),
                    AdmissionConfig(policy=point.rule.admission),
                    max_write_rate=point.rule.budget)  # fmt: skip
    result = simulate_tiers(_TRACE, point.memory_bytes, AdmissionConfig(policy=memory_admission),
                            disk, entry_overhead=entry_overhead)  # fmt: skip
    decides = {} if result.disk_auto is None else {"decides": result.disk_auto["choice"]}
    return {**result.stats, "elapsed_s": round(result.elapsed, 3), **decides}


def flash_sweep(
    trace: Trace,
    workload: str,
    memory_bytes: int,
    disk_sizes: Sequence[int],
    *,
    memory_admission: str = "always",
    entry_overhead: int = 0,
    workers: int | None = None,
) -> list[FlashCell]:
    """Every rule of the family at every disk size behind one memory tier of ``memory_bytes``
    (admitting by ``memory_admission``), in worker processes that share the trace by fork;
    the cells in disk-size order, the Pareto front marked (``pareto``)."""
    global _TRACE
    fixed = fixed_rules(trace)
    workers = max(1, min(workers or os.cpu_count() or 1, len(fixed) * len(disk_sizes)))
    results: dict[Point, dict[str, Any]] = {}
    run = partial(_run, memory_admission=memory_admission, entry_overhead=entry_overhead)
    _TRACE = trace
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            points = [Point(memory_bytes, d, r) for d in disk_sizes for r in fixed]
            results.update(zip(points, pool.map(run, points), strict=True))
            second_hit = fixed[1]
            dynamic = [
                Point(memory_bytes, d, r)
                for d in disk_sizes
                for r in dynamic_rules(
                    results[Point(memory_bytes, d, second_hit)]["disk_bytes_written"],
                    trace.duration(),
                )
            ]
            results.update(zip(dynamic, pool.map(run, dynamic), strict=True))
    finally:
        _TRACE = None
    cells = [_cell(workload, p, s) for p, s in results.items()]
    cells.sort(key=lambda c: (c["disk_bytes"], _order(c)))
    mark_pareto(cells)
    return cells


def _order(cell: FlashCell) -> int:
    names = ("always", "second-hit", "nth-hit", "probabilistic", "size-below", DYNAMIC, "auto")
    return names.index(cell["rule"]) if cell["rule"] in names else len(names)


def _cell(workload: str, point: Point, stats: dict[str, Any]) -> FlashCell:
    return {
        "workload": workload,
        "memory_bytes": point.memory_bytes,
        "disk_bytes": point.disk_bytes,
        "region_bytes": region_size(point.disk_bytes),
        "rule": point.rule.rule,
        "policy": point.rule.label,
        "admission": point.rule.admission,
        "budget": point.rule.budget,
        "hit_ratio": stats["hit_ratio"],
        "byte_hit_ratio": stats["byte_hit_ratio"],
        "hits_from_disk": stats["hits_from_disk"],
        "disk_bytes_written": stats["disk_bytes_written"],
        "requests": stats["requests"],
        "elapsed_s": stats["elapsed_s"],
        **({"decides": stats["decides"]} if "decides" in stats else {}),
    }


def mark_pareto(cells: Sequence[FlashCell]) -> None:
    """Set ``pareto`` on each cell: no other cell of its workload, memory and disk size hits
    at least as often with no more bytes written, one of the two strictly better."""
    for c in cells:
        peers = [o for o in cells if flash_group(o) == flash_group(c) and o is not c]
        c["pareto"] = not any(
            o["hit_ratio"] >= c["hit_ratio"]
            and o["disk_bytes_written"] <= c["disk_bytes_written"]
            and (
                o["hit_ratio"] > c["hit_ratio"] or o["disk_bytes_written"] < c["disk_bytes_written"]
            )
            for o in peers
        )
