"""The admission family on generated workloads, against libCacheSim's W-TinyLFU and S3-FIFO.

Eight workloads (Zipf alpha 0.8 and 1.0; with and without churn; 25% and 50% one-hit
wonders), 2,000,000 requests each by default, body bytes only. For each: the hit ratio, byte
hit ratio and bytes written of ``always`` (LRU), ``second-hit``, ``tinylfu``, ``adaptive`` and
S3-FIFO at 0.1%, 1%, 10%, 30% and 60% of the footprint; libCacheSim's W-TinyLFU and S3-FIFO at
1% on the same trace in the same run. Then whether ``adaptive`` met each goal:

- at every size, a hit ratio no lower than the better of ``always`` and ``second-hit`` minus
  0.005, and a byte hit ratio no lower than theirs minus 0.01;
- at 1%, W-TinyLFU's hit ratio or better, with at most 15% of LRU's bytes written.

    .venv/bin/python benchmarks/bench_policies.py [--requests N]
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

import libcachesim
import numpy as np

from loadgen.sim.simulate import sweep
from loadgen.traces.trace import Trace, write_trace
from loadgen.traces.workload import WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig

SHARES = (0.001, 0.01, 0.1, 0.3, 0.6)
POLICIES = [
    (AdmissionConfig(policy="always"), "lru"),
    (AdmissionConfig(policy="second-hit"), "lru"),
    (AdmissionConfig(policy="tinylfu"), "lru"),
    (AdmissionConfig(policy="adaptive"), "lru"),
    (AdmissionConfig(policy="always"), "s3fifo"),
]
NAMES = ["lru", "second-hit", "tinylfu", "adaptive", "s3fifo"]


def reference(trace: Trace, size: int, cache: type) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.oracleGeneral.bin"
        write_trace(trace, path)
        reader = libcachesim.TraceReader(str(path), libcachesim.TraceType.ORACLE_GENERAL_TRACE)
        return 1 - cache(size).process_trace(reader)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_000_000)
    args = parser.parse_args()
    met: dict[str, list[bool]] = {"every size": [], "byte hit ratio": [], "1%": []}
    for alpha, churn, one_hit in itertools.product((0.8, 1.0), (0.0, 0.05), (0.25, 0.5)):
        spec = WorkloadSpec(
            objects=args.requests // 10, requests=args.requests, alpha=alpha,
            one_hit_share=one_hit, churn=churn, churn_period=args.requests // 20,
        )  # fmt: skip
        generated = generate(spec)
        trace = Trace(np.floor(generated.times), generated.ids, generated.sizes)
        footprint = trace.distinct_bytes()
        sizes = [round(footprint * share) for share in SHARES]
        results = sweep(trace, sizes, POLICIES, entry_overhead=0)
        print(f"\nalpha {alpha}, churn {churn}, one-hit wonders {one_hit:.0%}: hit ratio "
              "(byte hit ratio) and bytes written as a share of LRU's")  # fmt: skip
        print("  cache  " + "".join(f"{name:>24s}" for name in NAMES))
        for i, share in enumerate(SHARES):
            cells = results[i * len(POLICIES) : (i + 1) * len(POLICIES)]
            stats = dict(zip(NAMES, (c.stats for c in cells), strict=True))
            lru_bytes = max(1, stats["lru"]["bytes_written"])
            row = "".join(
                f"{s['hit_ratio']:>9.4f} ({s['byte_hit_ratio']:.4f})"
                f" {s['bytes_written'] / lru_bytes:>4.0%}"
                for s in stats.values()
            )
            print(f"  {share:>5.1%}  {row}")
            adaptive, lru, second = stats["adaptive"], stats["lru"], stats["second-hit"]
            floor = max(lru["hit_ratio"], second["hit_ratio"]) - 0.005
            byte_floor = max(lru["byte_hit_ratio"], second["byte_hit_ratio"]) - 0.01
            met["every size"].append(adaptive["hit_ratio"] >= floor)
            met["byte hit ratio"].append(adaptive["byte_hit_ratio"] >= byte_floor)
            if share == 0.01:
                wtinylfu = reference(trace, sizes[i], libcachesim.WTinyLFU)
                s3fifo = reference(trace, sizes[i], libcachesim.S3FIFO)
                written = adaptive["bytes_written"] / lru_bytes
                met["1%"].append(adaptive["hit_ratio"] >= wtinylfu and written <= 0.15)
                print(
                    f"         libCacheSim at 1%: W-TinyLFU {wtinylfu:.4f}, S3-FIFO "
                    f"{s3fifo:.4f}; adaptive {adaptive['hit_ratio']:.4f} writing {written:.1%} "
                    "of LRU's bytes"
                )
    print("\nadaptive's goals met:")
    for goal, checks in met.items():
        print(f"  {goal:16s} {sum(checks)} of {len(checks)}")


if __name__ == "__main__":
    main()
