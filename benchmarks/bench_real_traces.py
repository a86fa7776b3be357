"""onehit's policy family on real traces, beside libCacheSim's own policies in the same run.

The traces are libCacheSim's (``loadgen/traces/real_traces.py``: fetched on first use into
``~/.cache/onehit/traces``): CloudPhysics (block I/O) and the first 10M requests of Twitter's
cache cluster 52. Cache sizes are shares of each trace's unique bytes (0.1% to 10%). onehit
runs every admission x eviction pair asked (``--admissions``, ``--evictions``) with no
per-object overhead, as libCacheSim counts; libCacheSim (its Python package) runs LRU, S3-FIFO,
SIEVE, 2Q, W-TinyLFU, ARC and LHD on the same oracleGeneral file (``--more-peers``: the rest
of its set, learned policies and tuned leaders among them). Printed per trace and size:
each policy's miss ratio, the bytes onehit's policies wrote (admissions' bytes; LRU writes
every miss), and which policy, onehit's or libCacheSim's, is lowest. ``--json FILE`` keeps the
table; ``--report-dir DIR`` writes a report (``index.html``, plots, ``summary.md``) with the
miss-ratio curves of the whole family, libCacheSim's beside onehit's, and onehit's hit ratio
against the bytes it wrote (libCacheSim does not count writes). ``--evictions`` takes knobs
(``s3fifo:small=0.05:move=1``) and ``auto``, the tuner (``proxy.core.tuning``), whose
decisions go into the JSON with its cells.

``--disk`` adds the flash question (``loadgen/sim/flash.py``): behind a memory tier of
``--memory-share`` of the unique bytes (LRU), a disk tier of each of ``--disk-shares``, and at
each the whole disk admission family (always, second hit, nth hit, probabilistic, size below,
dynamic random at second hit's write rate), each rule's hit ratio against the bytes it wrote
to the device, the Pareto front marked, in the report's flash section and plot.

    .venv/bin/python benchmarks/bench_real_traces.py [--traces cloudphysics,twitter52]
        [--shares 0.001,0.003,0.01,0.03,0.1] [--admissions always,second-hit,tinylfu,adaptive]
        [--evictions lru,s3fifo,sieve,wtinylfu,twoq] [--more-peers] [--json results.json]
        [--report-dir DIR]
        [--disk [--memory-share 0.001] [--disk-shares 0.025,0.1,0.25]]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import libcachesim

from loadgen.reports import report
from loadgen.reports.provenance import provenance
from loadgen.sim.flash import flash_sweep
from loadgen.sim.simulate import describe_cell, policy_label, sweep
from loadgen.traces.real_traces import REAL, TRACES, TraceUnavailable, fetch
from loadgen.traces.trace import read_trace
from proxy.core.admission import AdmissionConfig
from proxy.core.stats import METRICS
from proxy.core.units import format_size

PEERS = {
    "LRU": libcachesim.LRU,
    "S3-FIFO": libcachesim.S3FIFO,
    "SIEVE": libcachesim.Sieve,
    "2Q": libcachesim.TwoQ,
    "W-TinyLFU": libcachesim.WTinyLFU,
    "ARC": libcachesim.ARC,
    "LHD": libcachesim.LHD,
}
# ``--more-peers``: the rest of libCacheSim's set that runs on these traces, its learned
# policies (GLCache, 3L-Cache) among them, and the leaders with other parameters than their
# defaults: how far the state of the art reaches on a trace, beyond the six.
MORE_PEERS = {
    "Clock2QPlus": libcachesim.Clock2QPlus,
    "LIRS": libcachesim.LIRS,
    "MQ": libcachesim.MQ,
    "SLRU": libcachesim.SLRU,
    "LeCaR": libcachesim.LeCaR,
    "Cacheus": libcachesim.Cacheus,
    "Hyperbolic": libcachesim.Hyperbolic,
    "GLCache": libcachesim.GLCache,
    "3L-Cache": libcachesim.ThreeLCache,
    "2Q (Ain 10%, Aout 100%)": partial(libcachesim.TwoQ, a_in_size_ratio=0.1,
                                       a_out_size_ratio=1.0),
    "S3-FIFO (small 20%)": partial(libcachesim.S3FIFO, small_size_ratio=0.2),
    "W-TinyLFU (window 5%)": partial(libcachesim.WTinyLFU, window_size=0.05),
    "W-TinyLFU (window 20%)": partial(libcachesim.WTinyLFU, window_size=0.2),
}  # fmt: skip


def peers(
    path: Path, size: int, table: dict[str, Any] = PEERS, say: Any = None
) -> dict[str, tuple[float, float]]:
    """libCacheSim's (miss ratio, byte miss ratio) of each peer of ``table`` at ``size``
    bytes; ``say`` is told of each as it ends (its name, how many of them, the seconds)."""
    out = {}
    for done, (name, cache) in enumerate(table.items(), 1):
        started = time.perf_counter()
        reader = libcachesim.TraceReader(str(path), libcachesim.TraceType.ORACLE_GENERAL_TRACE)
        out[name] = cache(size).process_trace(reader)
        if say is not None:
            say(f"libCacheSim [{done}/{len(table)}] {name} @ {format_size(size)}: "
                f"{time.perf_counter() - started:.1f}s")  # fmt: skip
    return out


def _swept(done: int, total: int, result: Any) -> None:
    _progress(f"onehit [{done}/{total}] {describe_cell(result)}")


def _progress(line: str) -> None:
    """A line of progress on stderr, the table staying on stdout."""
    print(f"  {line}", file=sys.stderr, flush=True)


def peer_cell(workload: str, peer: str, size: int, share: float, ratios: tuple[float, float]):
    """A report cell of a libCacheSim run: its hit ratios; what it does not count, None."""
    stats = dict.fromkeys(METRICS)
    stats.update(hit_ratio=1 - ratios[0], byte_hit_ratio=1 - ratios[1])
    return {"workload": workload, "mode": "simulate", "policy": f"libCacheSim {peer}",
            "cache": f"{share:.1%} ({format_size(size)})", "cache_bytes": size,
            "stats": stats, "timeline": []}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--shares", default="0.001,0.003,0.01,0.03,0.1")
    parser.add_argument("--admissions", default="always,second-hit,tinylfu,adaptive")
    parser.add_argument("--evictions", default="lru,s3fifo,sieve,wtinylfu,twoq")
    parser.add_argument(
        "--more-peers",
        action="store_true",
        help="libCacheSim's other policies too, learned ones and tuned leaders (minutes more)",
    )
    parser.add_argument("--json", type=Path, help="write every cell here too")
    parser.add_argument("--report-dir", type=Path, help="write a report of every trace here")
    parser.add_argument(
        "--disk", action="store_true", help="the disk admission family behind a memory tier, too"
    )
    parser.add_argument(
        "--memory-share",
        type=float,
        default=0.001,
        help="--disk: the memory tier, a share of the unique bytes",
    )
    parser.add_argument(
        "--disk-shares",
        default="0.025,0.1,0.25",
        help="--disk: the disk sizes, shares of the unique bytes",
    )
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    pairs = [(AdmissionConfig(policy=a), e) for e in args.evictions.split(",")
             for a in args.admissions.split(",")]  # fmt: skip
    cells = []
    report_cells = []
    flash_cells = []
    began = time.time()
    traces: dict[str, Path | None] = {}
    for name in args.traces.split(","):
        try:
            path = fetch(name)
        except TraceUnavailable as exc:
            sys.exit(f"{name}: {exc}")
        traces[REAL + name] = path
        trace = read_trace(path)
        unique = trace.distinct_bytes()
        sizes = [max(1, round(unique * share)) for share in shares]
        print(f"\n{name}: {TRACES[name].about}; {len(trace):,} requests, "
              f"{trace.distinct_objects():,} objects, {format_size(unique)} unique")  # fmt: skip
        started = time.perf_counter()
        ours = sweep(trace, sizes, pairs, entry_overhead=0, report=_swept)
        ours_seconds = time.perf_counter() - started
        labels = {
            size: f"{share:.1%} ({format_size(size)})"
            for share, size in zip(shares, sizes, strict=True)
        }
        report_cells += [report.sim_cell(r, name, labels[r.cache_bytes]) for r in ours]
        for share, size in zip(shares, sizes, strict=True):
            row = {r.label if r.eviction == "lru" else policy_label(r.admission, r.eviction): r
                   for r in ours if r.cache_bytes == size}  # fmt: skip
            theirs = peers(path, size, {**PEERS, **(MORE_PEERS if args.more_peers else {})},
                           _progress)  # fmt: skip
            report_cells += [peer_cell(name, peer, size, share, ratios)
                             for peer, ratios in theirs.items()]  # fmt: skip
            lru_written = row["always"].stats["bytes_written"] if "always" in row else None
            print(f"\n  cache {format_size(size)} ({share:.1%} of unique bytes): miss ratio")
            entries = [(1 - r.stats["hit_ratio"], label, "onehit", r.stats["bytes_written"],
                        1 - r.stats["byte_hit_ratio"]) for label, r in row.items()]  # fmt: skip
            entries += [(mr, label, "libCacheSim", None, bmr)
                        for label, (mr, bmr) in theirs.items()]  # fmt: skip
            best = min(entries)[0]
            for miss_ratio, label, source, written, byte_miss_ratio in sorted(entries):
                wrote = ""
                if written is not None:
                    wrote = f"  wrote {format_size(written)}"
                    if lru_written:
                        wrote += f" ({written / lru_written:.0%} of LRU's)"
                mark = "  <- lowest" if miss_ratio == best else ""
                print(f"    {source:11s} {label:36s} {miss_ratio:.4f} (bytes "
                      f"{byte_miss_ratio:.4f}){wrote}{mark}")  # fmt: skip
                cells.append({"trace": name, "share": share, "cache_bytes": size,
                              "source": source, "policy": label, "miss_ratio": miss_ratio,
                              "byte_miss_ratio": byte_miss_ratio,
                              "bytes_written": written})  # fmt: skip
                tuned = row.get(label) if source == "onehit" else None
                if tuned is not None and tuned.tuning is not None:
                    cells[-1]["tuning"] = tuned.tuning["decisions"]
        print(f"\n  onehit: {len(ours)} cells in {ours_seconds:.1f}s")
        if args.disk:
            started = time.perf_counter()
            disks = [round(unique * float(share)) for share in args.disk_shares.split(",")]
            found = flash_sweep(trace, name, round(unique * args.memory_share), disks)
            print("\n" + report.flash_table(found))
            flash_cells += found
            print(f"\n  flash: {len(found)} two-tier cells in {time.perf_counter() - started:.1f}s")
    if args.json:
        args.json.write_text(json.dumps({"memory": cells, "flash": flash_cells}, indent=1))
    if args.report_dir:
        report.add_space_saved(report_cells)
        doc = {"title": "onehit and libCacheSim on real traces",
               "meta": {name: TRACES[name].about for name in args.traces.split(",")},
               "cells": report_cells, "provenance": provenance(traces, began)}  # fmt: skip
        if flash_cells:
            doc["flash"] = flash_cells
        for written in report.write_report(args.report_dir, doc):
            print(f"wrote {written}")


if __name__ == "__main__":
    main()
