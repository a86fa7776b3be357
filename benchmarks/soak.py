"""A bounded soak: many keep-alive clients, Zipf traffic, the embedded origin, one onehit.

Phase 1 sends Zipf traffic for ``--seconds`` over ``--connections`` keep-alive connections
(closed loop) and samples the proxy's RSS and open file descriptors. Phase 2 starts a fresh
proxy, loads it, sends SIGTERM in the middle and checks that no request it had accepted was
lost. Exits non-zero on any 5xx the origin did not send (the origin never sends one), any
response cut short, or memory that keeps growing.

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
from hdrh.histogram import HdrHistogram

from loadgen.experiment import LiveSettings, Running, onehit_process, origin_process
from loadgen.workload import SizeSpec, WorkloadSpec, generate

MiB = 1 << 20


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Load:
    """Closed-loop keep-alive clients cycling through a trace's keys until told to stop."""

    def __init__(self, target: str, keys: list[str], connections: int) -> None:
        self.target, self.keys, self.connections = target, keys, connections
        self.completed = 0
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
        while not self.stop.is_set():
            url = f"{self.target}/obj/{self.keys[i % len(self.keys)]}"
            i += self.connections
            started = time.perf_counter()
            try:
                async with session.get(url) as r:
                    await r.read()
                    self.statuses[r.status] += 1
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
    failures: list[str] = []
    settings = {"cache.size": args.cache_size, "server.drain_timeout": "20s"}
    async with origin_process(trace, LiveSettings(origin_latency=0.002)) as origin_url:
        async with onehit_process(origin_url, settings) as proxy:
            failures += await phase_one(args, proxy, keys)
        async with onehit_process(origin_url, settings) as proxy:
            failures += await phase_two(args, proxy, keys)
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


async def phase_two(args: argparse.Namespace, proxy: Running, keys: list[str]) -> list[str]:
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
        f"phase 2: SIGTERM under load: exit {code}, responses {load.completed:,}, "
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
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.connections)), hard))
    sys.exit(asyncio.run(soak(args)))


if __name__ == "__main__":
    main()
