"""The disk tier's ``auto`` admission against the whole disk admission family, on real traces,
as its goals ask: at each disk size, a hit ratio at least admit-all's, at most 15% of its
bytes written, within 0.005 of the family's best fixed rule.

Behind a memory tier of ``--memory-share`` of the unique bytes (LRU, admitting all), a disk of
each of ``--disk-shares``, as ``bench_real_traces.py --disk`` runs them (``loadgen.sim.flash``).
auto samples the keys its ghosts see: the simulator by the key's hash, the live proxy by a
secret of its own. Which keys fall in the sample moves auto's choices, on a short phased
trace by much; so auto is run once per ``--secrets`` secrets (the first, 0: the hash, as the
simulator samples), each a whole trace: its hit ratio printed as the median and the range,
its writes as the median.

    .venv/bin/python benchmarks/bench_disk_auto.py [--traces cloudphysics,twitter52]
        [--memory-share 0.001] [--disk-shares 0.025,0.1,0.25] [--secrets 10]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor

from loadgen.sim.flash import DYNAMIC, flash_sweep, region_size
from loadgen.sim.tiers import DiskSpec, simulate_tiers
from loadgen.traces.real_traces import load
from loadgen.traces.trace import Trace
from proxy.core.admission import AdmissionConfig
from proxy.core.units import format_size

_TRACE: Trace | None = None


def _auto(memory: int, disk: int, secret: int) -> tuple[float, int]:
    """auto's hit ratio and disk bytes written over the whole trace, its sample keyed by
    ``secret``, as ``flash_sweep``'s auto cell runs it unkeyed."""
    assert _TRACE is not None
    spec = DiskSpec(disk, region_size(disk), AdmissionConfig(policy="auto"), sample_key=secret)
    stats = simulate_tiers(_TRACE, memory, AdmissionConfig(policy="always"), spec,
                           entry_overhead=0).stats  # fmt: skip
    return stats["hit_ratio"], stats["disk_bytes_written"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="cloudphysics,twitter52")
    parser.add_argument("--memory-share", type=float, default=0.001)
    parser.add_argument("--disk-shares", default="0.025,0.1,0.25")
    parser.add_argument("--secrets", type=int, default=10)
    args = parser.parse_args()
    global _TRACE
    secrets = [0] + [(0x9E3779B97F4A7C15 * k) % 2**64 | 1 for k in range(1, args.secrets)]
    print(f"{'trace':13} {'disk':>9} {'admit all':>9} {'best fixed rule':>32} {'auto, median':>12} "
          f"{'range':>15} {'writes':>7}  goals (>= all, <= 15%, within 0.005)")  # fmt: skip
    for name in args.traces.split(","):
        trace = load(name)
        unique = trace.distinct_bytes()
        memory = round(unique * args.memory_share)
        disks = [round(unique * float(s)) for s in args.disk_shares.split(",")]
        cells = flash_sweep(trace, name, memory, disks)
        # The unkeyed sample is the sweep's own auto cell; the others, in one map.
        keyed = [(d, k) for d in disks for k in secrets[1:]]
        _TRACE = trace
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
            done = list(pool.map(_auto, [memory] * len(keyed), *zip(*keyed, strict=True)))
        _TRACE = None
        runs = {d: [(c["hit_ratio"], c["disk_bytes_written"])] for d in disks
                for c in cells if c["disk_bytes"] == d and c["rule"] == "auto"}  # fmt: skip
        for (d, _), run in zip(keyed, done, strict=True):
            runs[d].append(run)
        for disk in disks:
            at = [c for c in cells if c["disk_bytes"] == disk]
            admit_all = next(c for c in at if c["rule"] == "always")
            fixed = [c for c in at if c["rule"] not in ("auto", DYNAMIC)]
            best = max(fixed, key=lambda c: c["hit_ratio"])
            ratios = [hit_ratio for hit_ratio, _ in runs[disk]]
            median = statistics.median(ratios)
            written = statistics.median(w for _, w in runs[disk])
            share = written / admit_all["disk_bytes_written"]
            goals = (median >= admit_all["hit_ratio"], share <= 0.15,
                     median >= best["hit_ratio"] - 0.005)  # fmt: skip
            print(f"{name:13} {format_size(disk):>9} {admit_all['hit_ratio']:9.4f} "
                  f"{best['policy']:>25} {best['hit_ratio']:.4f} {median:12.4f} "
                  f"{min(ratios):.4f}-{max(ratios):.4f} {share:7.1%}  "
                  f"{' '.join('met' if g else 'NOT' for g in goals)}")  # fmt: skip


if __name__ == "__main__":
    main()
