"""A bounded soak: many keep-alive clients, Zipf traffic, the embedded origin, one onehit.

Phase 1 sends Zipf traffic for ``--seconds`` over ``--connections`` keep-alive connections
(closed loop) and samples the proxy's RSS and open file descriptors. Phase 2 floods a fresh
proxy (a fixed window of ``--flood-capacity`` URLs) with ten times its filter's capacity of
never-repeated URLs while Zipf traffic goes on, and checks that the filter rotated early
instead of saturating, kept its false-positive estimate and its memory, stored none of the
flood, and that the popular objects kept their hit ratio. Phase 3 starts a fresh proxy, loads
it, sends SIGTERM in the middle and checks that no request it had accepted was lost. Exits
non-zero on any 5xx the origin did not send (the origin never sends one), any response cut
short, memory that keeps growing, or a flood that got in.

    .venv/bin/python benchmarks/soak.py [--seconds 60] [--connections 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import numpy as np
from hdrh.histogram import HdrHistogram

from loadgen.live.experiment_file import LiveSettings
from loadgen.live.processes import Running, admin_metrics, onehit_process, origin_process
from loadgen.traces.trace import Trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate

MiB = 1 << 20
FLOOD_FP_RATE = 0.01
FLOOD_POPULAR_CONNECTIONS = 100
FLOOD_SCANNER_CONNECTIONS = 50


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Load:
    """Closed-loop keep-alive clients cycling through a trace's keys until told to stop
    (or, with ``once``, until every key was requested once)."""

    def __init__(self, target: str, keys: list[str], connections: int, once: bool = False) -> None:
        self.target, self.keys, self.connections, self.once = target, keys, connections, once
        self.completed = 0
        self.hits = 0
        self.statuses: Counter[int] = Counter()
        self.errors: Counter[str] = Counter()
        self.histogram = HdrHistogram(1, 120_000_000, 3)
        self.stop = asyncio.Event()

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.connections)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(self.worker(session, i) for i in range(self.connections)))

    async def worker(self, session: aiohttp.ClientSession, offset: int) -> None:
        i = offset
        while not self.stop.is_set() and not (self.once and i >= len(self.keys)):
            url = f"{self.target}/obj/{self.keys[i % len(self.keys)]}"
            i += self.connections
            started = time.perf_counter()
            try:
                async with session.get(url) as r:
                    await r.read()
                    self.statuses[r.status] += 1
                    self.hits += r.headers.get("X-Cache") == "HIT"
            except aiohttp.ClientPayloadError:
                self.errors["cut-short"] += 1  # accepted, answered, then lost: never allowed
                continue
            except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                self.errors[type(exc).__name__] += 1
                if self.stop.is_set():
                    return
                await asyncio.sleep(0.05)
                continue
            self.completed += 1
            self.histogram.record_value(max(1, int((time.perf_counter() - started) * 1e6)))


async def soak(args: argparse.Namespace) -> int:
    sizes = SizeSpec.parse("lognormal:median=4KiB,sigma=1,max=1MiB")
    trace = generate(
        WorkloadSpec(objects=50_000, requests=500_000, alpha=0.8, one_hit_share=0.25, sizes=sizes)
    )
    keys = trace.key_strings()
    flood = flood_objects(10 * args.flood_capacity, first_id=int(trace.ids.max()) + 1)
    served = Trace(
        np.concatenate([trace.times, np.full(len(flood), trace.times[-1])]),
        np.concatenate([trace.ids, flood.ids]),
        np.concatenate([trace.sizes, flood.sizes]),
    )
    failures: list[str] = []
    settings = {"cache.size": args.cache_size, "server.drain_timeout": "20s"}
    fixed_window = {
        **settings,
        "admission.window": "1h",
        "admission.expected_urls": str(args.flood_capacity),
        "admission.fp_rate": str(FLOOD_FP_RATE),
    }
    async with origin_process(served, LiveSettings(origin_latency=0.002)) as origin_url:
        async with onehit_process(origin_url, settings) as proxy:
            failures += await phase_one(args, proxy, keys)
        async with onehit_process(origin_url, fixed_window) as proxy:
            failures += await phase_flood(args, proxy, keys, flood.key_strings())
        async with onehit_process(origin_url, settings) as proxy:
            failures += await phase_shutdown(args, proxy, keys)
    for failure in failures:
        print(f"FAIL: {failure}")
    print("soak: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


async def phase_one(args: argparse.Namespace, proxy: Running, keys: list[str]) -> list[str]:
    """Zipf traffic for ``args.seconds``; the proxy's RSS sampled every second."""
    pid = proxy.process.pid
    start_rss = rss(pid)
    load = Load(proxy.url, keys, args.connections)
    running = asyncio.ensure_future(load.run())
    samples = []
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds:
        await asyncio.sleep(1.0)
        samples.append(rss(pid))
        print(
            f"\r  {time.perf_counter() - began:5.0f}s  {load.completed:,} responses, "
            f"RSS {samples[-1] / MiB:.0f} MiB, errors {sum(load.errors.values())}",
            end="",
            file=sys.stderr,
            flush=True,
        )
    load.stop.set()
    await running
    elapsed = time.perf_counter() - began
    fds, end_rss = open_fds(pid), rss(pid)
    print(file=sys.stderr)
    h = load.histogram
    print(f"phase 1: {args.connections} keep-alive connections for {elapsed:.0f}s")
    print(
        f"  responses {load.completed:,} ({load.completed / elapsed:,.0f}/s), "
        f"statuses {dict(load.statuses)}, errors {dict(load.errors) or 0}"
    )
    print(
        f"  latency p50 {h.get_value_at_percentile(50) / 1000:.1f} ms, "
        f"p99 {h.get_value_at_percentile(99) / 1000:.1f} ms, max {h.get_max_value() / 1000:.1f} ms"
    )
    print(
        f"  proxy RSS start {start_rss / MiB:.0f} MiB, peak {max(samples) / MiB:.0f} MiB, "
        f"end {end_rss / MiB:.0f} MiB; open fds at end {fds}"
    )
    failures = []
    if any(s >= 500 for s in load.statuses):
        failures.append("5xx answers the origin never sent")
    if load.errors:
        failures.append(f"lost requests: {dict(load.errors)}")
    third = samples[len(samples) // 3]
    if end_rss > third * 1.25 + 32 * MiB:
        failures.append(
            f"RSS kept growing: {third / MiB:.0f} MiB at a third, {end_rss / MiB:.0f} MiB at end"
        )
    return failures


def flood_objects(count: int, first_id: int) -> Trace:
    """``count`` 1 KiB objects the popular trace never names: a scanner's targets."""
    ids = np.arange(first_id, first_id + count, dtype=np.uint64)
    return Trace(np.zeros(count), ids, np.full(count, 1024, dtype=np.uint32))


async def phase_flood(
    args: argparse.Namespace, proxy: Running, keys: list[str], flood: list[str]
) -> list[str]:
    """Ten times the filter's capacity of unique URLs beside Zipf traffic."""
    load = Load(proxy.url, keys, FLOOD_POPULAR_CONNECTIONS)
    running = asyncio.ensure_future(load.run())
    await asyncio.sleep(args.flood_warmup)
    m0 = await admin_metrics(proxy.admin_url)
    calm_hits, calm_done = load.hits, load.completed
    await asyncio.sleep(args.flood_warmup / 2)
    calm = (load.hits - calm_hits) / max(1, load.completed - calm_done)
    flood_hits, flood_done = load.hits, load.completed
    scanner = Load(proxy.url, flood, FLOOD_SCANNER_CONNECTIONS, once=True)
    began = time.perf_counter()
    await scanner.run()
    elapsed = time.perf_counter() - began
    flooded = (load.hits - flood_hits) / max(1, load.completed - flood_done)
    load.stop.set()
    await running
    m1 = await admin_metrics(proxy.admin_url)
    stored = await count_stored(proxy, flood)
    rotations = m1["forced_rotations"] - m0["forced_rotations"]
    print(
        f"phase 2: {len(flood):,} unique URLs (10x a filter of {args.flood_capacity:,}) in "
        f"{elapsed:.0f}s beside Zipf traffic on {FLOOD_POPULAR_CONNECTIONS} connections"
    )
    print(
        f"  forced rotations {rotations}, fp estimate {m1['filter_fp_estimate']:.4f} "
        f"(target {FLOOD_FP_RATE}), filter bytes {m0['filter_bytes']:,} -> "
        f"{m1['filter_bytes']:,}, flood URLs stored {stored}"
    )
    print(
        f"  popular hit ratio {calm:.3f} before, {flooded:.3f} during the flood; "
        f"statuses {dict(scanner.statuses)}, errors {dict(scanner.errors) or 0}"
    )
    failures = []
    if rotations < 9:
        failures.append(f"the flood forced {rotations} rotations, expected at least 9")
    if m1["filter_fp_estimate"] > FLOOD_FP_RATE:
        failures.append(f"false-positive estimate {m1['filter_fp_estimate']:.4f} over target")
    if m1["filter_bytes"] != m0["filter_bytes"]:
        failures.append("the filter's memory changed under the flood")
    # Only a false positive of a filter held at its target can let a flood URL in.
    if stored > FLOOD_FP_RATE * len(flood):
        failures.append(f"{stored} flood URLs were stored")
    if flooded < calm - 0.05:
        failures.append(f"popular hit ratio fell from {calm:.3f} to {flooded:.3f}")
    if scanner.errors or load.errors or any(s >= 500 for s in scanner.statuses):
        failures.append("requests failed during the flood")
    return failures


async def count_stored(proxy: Running, keys: list[str]) -> int:
    """How many of ``keys`` the proxy holds: ``only-if-cached`` answers 504 for the others."""
    stored = 0
    connector = aiohttp.TCPConnector(limit=FLOOD_SCANNER_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def probe(chunk: list[str]) -> None:
            nonlocal stored
            for key in chunk:
                headers = {"Cache-Control": "only-if-cached"}
                async with session.get(f"{proxy.url}/obj/{key}", headers=headers) as r:
                    await r.read()
                    stored += r.status == 200

        n = FLOOD_SCANNER_CONNECTIONS
        await asyncio.gather(*(probe(keys[i::n]) for i in range(n)))
    return stored


async def phase_shutdown(args: argparse.Namespace, proxy: Running, keys: list[str]) -> list[str]:
    """SIGTERM in the middle of load: no accepted request may be lost."""
    load = Load(proxy.url, keys, min(args.connections, 200))
    running = asyncio.ensure_future(load.run())
    await asyncio.sleep(3.0)
    proxy.process.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(proxy.process.wait(), 30)
    load.stop.set()
    await running
    refused = sum(load.errors.values()) - load.errors["cut-short"]
    print(
        f"phase 3: SIGTERM under load: exit {code}, responses {load.completed:,}, "
        f"statuses {dict(load.statuses)}, cut short {load.errors['cut-short']}, "
        f"refused after stop {refused}"
    )
    if code != 0 or load.errors["cut-short"] or any(s >= 500 for s in load.statuses):
        return ["graceful shutdown lost or failed accepted requests"]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--cache-size", default="64MiB")
    parser.add_argument("--flood-capacity", type=int, default=2_000, help="filter URLs/window")
    parser.add_argument("--flood-warmup", type=float, default=10.0, help="seconds before it")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.connections)), hard))
    sys.exit(asyncio.run(soak(args)))


if __name__ == "__main__":
    main()
