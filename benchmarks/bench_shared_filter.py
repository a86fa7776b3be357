"""What the shared (Redis) admission window costs on the miss path, beside the in-process one.

Starts its own redis-server on a free loopback port (and a three-node Redis Cluster when
redis-cli is installed), then measures, in the same run: the latency one miss's admission
decision adds (p50, p99) with the in-process filter and with Redis (one Lua round trip), and
the filter operations per second Redis sustains with many decisions in flight, one script
call each and in the batches the proxy sends (the misses of one event-loop turn).

    .venv/bin/python benchmarks/bench_shared_filter.py [--keys 20000] [--in-flight 64]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import redis.asyncio as aioredis
from hdrh.histogram import HdrHistogram
from redis.asyncio.cluster import RedisCluster

from loadgen.live.processes import redis_cluster_process, redis_process
from proxy.core.window import WindowedBloomFilter
from proxy.fleet.shared import RedisWindow


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
            await measure(client, keys, in_flight, "one Redis")
        finally:
            await client.aclose()
    async with redis_cluster_process(3) as url:
        if url is None:
            print("(redis-cli not found: the cluster is skipped; apt-get install redis-tools)")
            return
        cluster = RedisCluster.from_url(url)
        try:
            await measure(cluster, keys, in_flight, "a 3-node Redis Cluster")
        finally:
            await cluster.aclose()


async def measure(client: aioredis.Redis, keys: int, in_flight: int, label: str) -> None:
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
    print(f"{label}: admission decision on the miss path, {keys:,} URLs, one at a time:")
    print(f"  in-process WindowedBloomFilter  {percentiles(local_us)}")
    print(f"  Redis (one Lua round trip)      {percentiles(remote_us)}")
    print(f"  Redis adds x{sum(remote_us) / sum(local_us):.0f} the in-process time per miss")
    for batch in (1, 16):
        rate = await throughput(remote, urls * 3, in_flight, batch)
        print(
            f"  {in_flight} calls in flight, {batch} decision(s) a call: {rate:,.0f} filter "
            f"operations/s (x{rate / (1e6 / (sum(local_us) / len(local_us))):.2f} in-process)"
        )


async def throughput(remote: RedisWindow, urls: list[str], in_flight: int, batch: int) -> float:
    """Decisions per second with ``in_flight`` script calls outstanding, ``batch`` each."""
    chunks = iter([urls[i : i + batch] for i in range(0, len(urls), batch)])
    done = 0

    async def worker() -> None:
        nonlocal done
        for chunk in chunks:
            await remote.seen_before_many(chunk, 2.0)
            done += len(chunk)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return done / (time.perf_counter() - started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.keys, args.in_flight))
