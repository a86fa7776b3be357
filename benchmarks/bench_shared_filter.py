"""What the shared (Redis) admission window costs on the miss path, beside the in-process one.

Starts its own redis-server on a free loopback port, then measures, in the same run: the
latency one miss's admission decision adds (p50, p99) with the in-process filter and with Redis
(one Lua round trip), and the filter operations per second one Redis sustains with many
decisions in flight.

    .venv/bin/python benchmarks/bench_shared_filter.py [--keys 20000] [--in-flight 64]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import redis.asyncio as aioredis
from hdrh.histogram import HdrHistogram

from loadgen.experiment import redis_process
from proxy.core.window import WindowedBloomFilter
from proxy.shared import RedisWindow


def percentiles(samples_us: list[float]) -> str:
    h = HdrHistogram(1, 60_000_000, 3)
    for s in samples_us:
        h.record_value(max(1, int(s)))
    return f"p50 {h.get_value_at_percentile(50):>5} us, p99 {h.get_value_at_percentile(99):>5} us"


async def main(keys: int, in_flight: int) -> None:
    async with redis_process() as url:
        if url is None:
            sys.exit("redis-server is not installed (apt-get install redis-server)")
        client = aioredis.from_url(url)
        try:
            await measure(client, keys, in_flight)
        finally:
            await client.aclose()


async def measure(client: aioredis.Redis, keys: int, in_flight: int) -> None:
    urls = [f"https://cdn.example.com/assets/{i % (keys // 2)}.js" for i in range(keys)]
    local = WindowedBloomFilter(1_000_000, 0.01, 3600.0, 2)
    remote = RedisWindow(client, 1_000_000, 0.01, 3600.0, 2)
    local_us, remote_us = [], []
    for url in urls:
        started = time.perf_counter()
        local.seen_before(url, 1.0)
        local_us.append((time.perf_counter() - started) * 1e6)
    for url in urls:
        started = time.perf_counter()
        await remote.seen_before(url, 1.0)
        remote_us.append((time.perf_counter() - started) * 1e6)
    print(f"admission decision on the miss path, {keys:,} URLs, one at a time:")
    print(f"  in-process WindowedBloomFilter  {percentiles(local_us)}")
    print(f"  Redis (one Lua round trip)      {percentiles(remote_us)}")
    print(f"  Redis adds x{sum(remote_us) / sum(local_us):.0f} the in-process time per miss")

    queue = iter(urls * 3)
    done = 0

    async def worker() -> None:
        nonlocal done
        for url in queue:
            await remote.seen_before(url, 2.0)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - started
    print(
        f"one Redis, {in_flight} decisions in flight from one client process: "
        f"{done / elapsed:,.0f} filter operations/s (the client's CPU shares 2 cores)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.keys, args.in_flight))
