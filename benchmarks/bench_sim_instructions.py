"""Instructions the simulator runs per request, counted by valgrind, beside libCacheSim's LRU on
the same trace: a figure that does not move with the machine's load, for ranking changes to
the simulator's loop (``proxy/core/native/``) against an earlier checkout.

A Zipf trace (``--requests`` and three times as many, 500,000 objects, sizes 1-21 KB) is
written once as oracleGeneral. Each simulator runs under ``valgrind --tool=callgrind`` over
both lengths, and the difference of the two counts over the difference of requests is its
count per request (start-up, imports and trace loading cancel out). onehit's run covers
every eviction (lru, sieve, s3fifo, wtinylfu, twoq) under every admission (always, second-hit,
tinylfu, adaptive) at 200 MB, so its figure is per request per run; ``--baseline DIR``
counts another checkout the same way (an earlier commit, built in place with ``python
setup.py build_ext --inplace``); libCacheSim's LRU (the ``libcachesim`` package, the ``bench``
extra) runs once per length at the same size. Needs ``valgrind``; about 3 minutes a simulator.

    .venv/bin/python benchmarks/bench_sim_instructions.py [--baseline /tmp/onehit-before]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE_BYTES = 200_000_000
EVICTIONS = ("lru", "sieve", "s3fifo", "wtinylfu", "twoq")
ADMISSIONS = ("always", "second-hit", "tinylfu", "adaptive")

ONEHIT = f"""
import sys
from loadgen.sim.simulate import simulate
from loadgen.traces.trace import read_trace
from proxy.core.admission import AdmissionConfig
trace = read_trace(sys.argv[1])
for eviction in {EVICTIONS!r}:
    for admission in {ADMISSIONS!r}:
        simulate(trace, {CACHE_BYTES}, AdmissionConfig(policy=admission), eviction=eviction)
"""
LIBCACHESIM = f"""
import sys, libcachesim as lcs
reader = lcs.TraceReader(sys.argv[1], lcs.TraceType.ORACLE_GENERAL_TRACE)
lcs.LRU({CACHE_BYTES}).process_trace(reader)
"""


def write_trace(path: Path, requests: int) -> None:
    """A Zipf(1.1) trace over 500,000 objects as oracleGeneral records (time, id, size, next)."""
    rng = np.random.default_rng(7)
    ids = rng.zipf(1.1, requests) % 500_000
    records = np.zeros(requests, dtype=[("t", "<u4"), ("id", "<u8"), ("size", "<u4"),
                                        ("next", "<i8")])  # fmt: skip
    records["t"] = np.arange(requests) // 1000
    records["id"] = ids
    records["size"] = 1000 + (ids * 2654435761) % 20000
    records["next"] = -1
    records.tofile(path)


def instructions(code: str, trace: Path, cwd: Path) -> int:
    """User-space instructions of ``code`` run over ``trace`` in a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="onehit-callgrind-") as tmp:
        log = Path(tmp) / "valgrind.log"
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(cwd)}
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
             f"--log-file={log}", sys.executable, "-c", code, str(trace)],
            cwd=cwd, env=env, check=True, timeout=3600,
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", log.read_text())
        if found is None:
            raise RuntimeError(f"no instruction count in valgrind's log:\n{log.read_text()}")
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="the shorter trace")
    parser.add_argument("--baseline", help="a checkout of onehit to count beside this one")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian/Ubuntu: apt-get install valgrind)")
    runs = len(EVICTIONS) * len(ADMISSIONS)
    simulators: dict[str, tuple[str, Path, int]] = {"onehit": (ONEHIT, ROOT, runs)}
    if args.baseline:
        simulators["onehit@baseline"] = (ONEHIT, Path(args.baseline).resolve(), runs)
    try:
        import libcachesim  # noqa: F401
    except ImportError:
        print("libcachesim is not installed (pip install -e '.[bench]'): no reference")
    else:
        simulators["libCacheSim LRU (reference)"] = (LIBCACHESIM, ROOT, 1)
    counts: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="onehit-trace-") as tmp:
        short, long = Path(tmp) / "short.bin", Path(tmp) / "long.bin"
        write_trace(short, args.requests)
        write_trace(long, 3 * args.requests)
        for name, (code, cwd, per) in simulators.items():
            low = instructions(code, short, cwd)
            high = instructions(code, long, cwd)
            counts[name] = (high - low) / (2 * args.requests) / per
            print(f"{name}: {counts[name]:,.0f} instructions per request per run", flush=True)
    reference = counts.get("libCacheSim LRU (reference)")
    print(f"\n{'simulator':32} {'instructions/request':>22} {'x reference':>12}")
    for name, count in counts.items():
        ratio = f"{count / reference:12.2f}" if reference else f"{'':>12}"
        print(f"{name:32} {count:22,.0f} {ratio}")


if __name__ == "__main__":
    main()
