"""Simulator speed and fidelity on a 10,000,000-request oracleGeneral trace, against libCacheSim.

1. Whole processes, trace loading included: ``onehit-loadgen simulate`` with plain LRU and with
   second hit at a 1% cache, beside libCacheSim's LRU (the ``libcachesim`` package) on the same
   file and cache size, each in its own process, in the same run. Prints requests/s, the ratio to
   libCacheSim and both hit ratios.
2. Two tiers: the compiled loop with a disk tier behind memory, in-process, beside one tier.
3. Sampling: a 10-size sweep (0.5% to 30%, LRU and second hit) at ``--sample 0.01`` against the
   full sweep of the same trace: the mean absolute hit-ratio error.
4. Sweep wall time on all cores: the README's sweep (3 sizes; LRU and second hit at 6 window
   scales) at full fidelity, and a 50-point size curve of both policies at ``--sample 0.01``.

The trace is generated once (the README's flags) and kept in the temporary directory.

    .venv/bin/python benchmarks/bench_simulate.py [--requests N] [--trace PATH] [--skip-sweeps]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from loadgen.sim.simulate import sample_trace, simulate, sweep
from loadgen.sim.tiers import DiskSpec, simulate_tiers
from loadgen.traces.trace import read_trace
from proxy.core.admission import AdmissionConfig
from proxy.core.units import format_size

GEN_FLAGS = (
    "--objects", "1000000", "--alpha", "0.8", "--one-hit-share", "0.25",
    "--sizes", "lognormal:median=16KiB,sigma=1,max=16MiB", "--seed", "1",
)  # fmt: skip
LIBCACHESIM_LRU = """
import sys, libcachesim as lcs
reader = lcs.TraceReader(sys.argv[1], lcs.TraceType.ORACLE_GENERAL_TRACE)
print(1 - lcs.LRU(int(sys.argv[2])).process_trace(reader)[0])
"""


def timed(*command: str) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, out.stdout


def loadgen(*args: str) -> tuple[float, str]:
    return timed(sys.executable, "-m", "loadgen", *args)


def trace_file(requests: int) -> Path:
    path = Path(tempfile.gettempdir()) / f"onehit-bench-zipf-{requests}.oracleGeneral.bin"
    if not path.exists():
        print(f"generating {path} ...", file=sys.stderr)
        loadgen("gen", *GEN_FLAGS, "--requests", str(requests), "-o", str(path))
    return path


def whole_processes(path: Path, n: int, cache: int) -> None:
    ref_s, ref_out = timed(sys.executable, "-c", LIBCACHESIM_LRU, str(path), str(cache))
    print(f"whole process, trace loading included: {n:,} requests, cache 1% ({cache:,} bytes)")
    rows = [("libCacheSim LRU (reference)", ref_s, float(ref_out))]
    for policy in ("always", "second-hit"):
        seconds, out = loadgen(
            "simulate", "--trace", str(path), "--cache-size", str(cache), "--admission", policy,
            "--entry-overhead", "0", "--json",
        )  # fmt: skip
        hit_ratio = json.loads(out)["cells"][0]["stats"]["hit_ratio"]
        rows.append((f"onehit simulate, {policy}", seconds, hit_ratio))
    for name, seconds, hit_ratio in rows:
        print(
            f"  {name:32s} {seconds:6.2f} s  {n / seconds:>11,.0f} req/s  "
            f"x{ref_s / seconds:.2f} of libCacheSim  hit ratio {hit_ratio:.4f}"
        )


def two_tiers(path: Path) -> None:
    """The compiled loop with a disk tier behind memory, in-process, beside one tier on the
    same trace: requests a second of each (memory 1%, disk 10% of the distinct bytes)."""
    trace = read_trace(path)
    unique = trace.distinct_bytes()
    memory, admission = round(unique * 0.01), AdmissionConfig(policy="second-hit")
    started = time.perf_counter()
    one = simulate(trace, memory, admission, entry_overhead=0)
    one_s = time.perf_counter() - started
    # 16 MiB regions, or a sixteenth of a smaller disk (Twitter52's 10% is 17 MB): a ring of
    # two regions would evict half of itself at a time.
    size = round(unique * 0.1)
    region = min(16 << 20, max(1 << 20, size // 16))
    disk = DiskSpec(size, region, admission)
    started = time.perf_counter()
    both = simulate_tiers(trace, memory, admission, disk, entry_overhead=0)
    both_s = time.perf_counter() - started
    print(f"in-process, second hit, memory 1% (and a disk of 10%, {format_size(region)} regions)")
    for name, seconds, result in (("one tier", one_s, one), ("two tiers", both_s, both)):
        print(f"  {name:10s} {seconds:6.2f} s  {len(trace) / seconds:>12,.0f} req/s  "
              f"hit ratio {result.stats['hit_ratio']:.4f}")  # fmt: skip
    print(f"  two tiers at x{one_s / both_s:.2f} of one tier's speed")


def sampling_error(path: Path) -> None:
    trace = read_trace(path)
    sizes = [round(trace.distinct_bytes() * s) for s in np.geomspace(0.005, 0.3, 10)]
    policies = [AdmissionConfig(policy="always"), AdmissionConfig(policy="second-hit")]
    started = time.perf_counter()
    full = sweep(trace, sizes, policies, entry_overhead=0)
    full_s = time.perf_counter() - started
    started = time.perf_counter()
    sampled = sweep(sample_trace(trace, 0.01), sizes, policies, entry_overhead=0)
    sampled_s = time.perf_counter() - started
    print("sampling at 0.01, 10 sizes from 0.5% to 30% (the same cells, in-process, all cores)")
    for i, policy in enumerate(policies):
        errors = [
            abs(f.stats["hit_ratio"] - s.stats["hit_ratio"])
            for f, s in zip(full[i::2], sampled[i::2], strict=True)
        ]
        print(
            f"  {policy.label():18s} mean abs hit-ratio error {np.mean(errors):.4f}, "
            f"largest {max(errors):.4f}"
        )
    print(f"  full sweep {full_s:.1f} s, sampled {sampled_s:.1f} s (x{full_s / sampled_s:.0f})")


def sweep_wall_time(path: Path) -> None:
    print("sweeps as whole processes on all cores")
    seconds, _ = loadgen(
        "simulate", "--trace", str(path), "--cache-size", "0.1%,1%,10%", "--admission",
        "always,second-hit", "--auto-scale", "0.25,0.5,1,2,4,8", "--entry-overhead", "0", "--json",
    )  # fmt: skip
    print(f"  README sweep, full fidelity (3 sizes x (LRU + 6 window scales)): {seconds:.1f} s")
    curve = ",".join(f"{s:.4g}%" for s in np.geomspace(0.1, 30, 50))
    seconds, _ = loadgen(
        "simulate", "--trace", str(path), "--cache-size", curve, "--admission",
        "always,second-hit", "--sample", "0.01", "--entry-overhead", "0", "--json",
    )  # fmt: skip
    print(f"  50-point size curve x (LRU, second hit) at --sample 0.01: {seconds:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--trace", type=Path, help="an oracleGeneral trace instead")
    parser.add_argument("--skip-sweeps", action="store_true")
    args = parser.parse_args()
    path = args.trace or trace_file(args.requests)
    trace = read_trace(path)
    n, cache = len(trace), round(trace.distinct_bytes() * 0.01)
    del trace
    whole_processes(path, n, cache)
    two_tiers(path)
    if not args.skip_sweeps:
        sampling_error(path)
        sweep_wall_time(path)


if __name__ == "__main__":
    main()
