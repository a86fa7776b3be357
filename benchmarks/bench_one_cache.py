"""``--workers`` as one cache under load: workers killed at random, a trace replayed through
four workers, and what a hit costs, each against one process (and nginx) in the same run.

1. ``kills``: two workers with a disk tier that takes everything, four clients asking 300 URLs
   at random, each request on a new connection, while a random worker is SIGKILLed
   ``--rounds`` times at random moments. Counted: answers whose body is not their URL's
   (must be 0), the time until the parent replaced each worker (the admin healthy with both),
   the longest gap between two good answers (the other worker never stops answering), and,
   after a clean stop, whether every record the tier's index holds is a whole record of its key
   (a scan of the region files agrees with it).
2. ``replay``: a Zipf(0.8) trace with 25% one-hit wonders replayed live (``onehit-loadgen
   replay``, 8 connections) through one process and through ``--workers 4``, the same
   ``[cache] size`` and disk: hit ratio and disk bytes written.
3. ``cost``: CPU-seconds of the servers' processes (from ``/proc``) per 100,000 hits under
   ``wrk`` (URLs at random): hits from memory (100 URLs of 1 KiB), and hits from the tier
   behind memory (2,000 URLs of 16 KiB, a memory tier of 1 MiB in all, a disk tier holding
   them all), for one process, two workers, and nginx ``proxy_cache`` (one worker, its cache
   on disk, warm) where installed; ``--baseline DIR``: two workers of another checkout (an
   earlier commit, whose workers shared no tier) from memory too. On two cores, two workers
   and wrk share the cores, one process and wrk do not: the baseline's two workers are the
   like-for-like reference for what sharing the tier costs a memory hit.
4. ``memory``: ``[cache] size`` 128 MiB, 3,000 URLs of 64 KiB each asked twice in a row (each
   stored; more than the cache holds): the resident memory (RSS) of one process, and of the
   parent and each of two workers, with the bytes the shared tier keeps in ``/dev/shm``.

    .venv/bin/python benchmarks/bench_one_cache.py [--part kills,replay,cost,memory] [--rounds 20]
        [--baseline /tmp/onehit-before]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from bench_workers import body_of, origin, proxy

from loadgen.live.nginx import nginx_binary, nginx_config
from loadgen.live.processes import free_port
from proxy.config.settings import DiskSection
from proxy.disk.store import DiskStore


async def admin_stats(session: aiohttp.ClientSession, admin: str) -> dict:
    async with session.get(admin + "/stats") as r:
        return await r.json()


async def kills(origin_url: str, rounds: int) -> dict[str, object]:
    directory = tempfile.mkdtemp(prefix="onehit-bench-kills-")
    size, region = 64 << 20, 1 << 20
    settings = (f"disk.path={directory}", f"disk.size={size}", f"disk.region_size={region}",
                "disk.policy=always")  # fmt: skip
    paths = [f"/k{i}" for i in range(300)]
    rng = random.Random(11)
    counts = {"good": 0, "wrong": 0, "cut": 0}
    last_good = [time.monotonic()]
    longest_gap = 0.0
    replaced: list[float] = []
    stopping = asyncio.Event()
    try:
        async with proxy(origin_url, 2, None, *settings) as (_, url, admin):

            async def client() -> None:
                nonlocal longest_gap
                connector = aiohttp.TCPConnector(force_close=True)
                async with aiohttp.ClientSession(connector=connector) as session:
                    while not stopping.is_set():
                        path = rng.choice(paths)
                        try:
                            async with session.get(url + path) as r:
                                body = await r.read()
                        except aiohttp.ClientError:
                            counts["cut"] += 1
                            continue
                        if r.status != 200:
                            counts["cut"] += 1
                        elif body != body_of(path):
                            counts["wrong"] += 1
                        else:
                            counts["good"] += 1
                            now = time.monotonic()
                            longest_gap = max(longest_gap, now - last_good[0])
                            last_good[0] = now

            last_good[0] = time.monotonic()
            clients = [asyncio.ensure_future(client()) for _ in range(4)]
            async with aiohttp.ClientSession() as session:
                for n in range(rounds):
                    await asyncio.sleep(rng.uniform(0.2, 0.6))
                    pid = rng.choice((await admin_stats(session, admin))["workers"])["pid"]
                    os.kill(pid, signal.SIGKILL)
                    started = time.monotonic()
                    while True:
                        stats = await admin_stats(session, admin)
                        if stats["workers_replaced"] == n + 1 and stats["missing"] == 0:
                            break
                        await asyncio.sleep(0.01)
                    replaced.append(time.monotonic() - started)
            stopping.set()
            await asyncio.gather(*clients)
        consistent, slots = index_agrees(Path(directory), size, region)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {**counts, "replaced_max_s": round(max(replaced), 3),
            "replaced_median_s": round(sorted(replaced)[len(replaced) // 2], 3),
            "longest_gap_s": round(longest_gap, 3), "index_agrees": consistent,
            "slots": slots}  # fmt: skip


def index_agrees(directory: Path, size: int, region: int) -> tuple[bool, int]:
    """Whether every slot of the tier's index (its checkpoint, after a clean stop) is a whole
    record of its key in the region files; and how many slots."""
    store = DiskStore(DiskSection(path=str(directory), size=size, region_size=region))
    try:
        agrees, held = store.keeping.agrees_with_files()
        return agrees and store.keeping.scanned == 0, held
    finally:
        store.close()


async def replay(requests: int) -> list[tuple[str, dict[str, float]]]:
    work = Path(tempfile.mkdtemp(prefix="onehit-bench-replay-"))
    loadgen = [sys.executable, "-m", "loadgen"]
    try:
        trace = work / "trace.csv"
        subprocess.run([*loadgen, "gen", "--objects", "20000", "--requests", str(requests),
                        "--alpha", "0.8", "--one-hit-share", "0.25", "--sizes",
                        "lognormal:median=4096,sigma=1,max=262144", "--seed", "3", "-o",
                        str(trace)], check=True, capture_output=True)  # fmt: skip
        port = free_port()
        served = subprocess.Popen([*loadgen, "origin", "--trace", str(trace), "--port", str(port),
                                   "--max-age", "3600"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)  # fmt: skip
        rows = []
        try:
            await asyncio.sleep(1.0)
            for workers in (1, 4):
                directory = work / f"disk-{workers}"
                settings = ("cache.size=8MiB", f"disk.path={directory}", "disk.size=64MiB",
                            "disk.region_size=2MiB")  # fmt: skip
                async with (
                    proxy(f"http://127.0.0.1:{port}", workers, None, *settings) as (_, url, admin),
                    aiohttp.ClientSession() as session,
                ):
                    subprocess.run([*loadgen, "replay", "--trace", str(trace), "--target", url,
                                    "--concurrency", "8", "--output", str(work / "out.json")],
                                   check=True, capture_output=True)  # fmt: skip
                    stats = await admin_stats(session, admin)
                metrics = stats["sum"] if workers > 1 else stats["metrics"]
                rows.append((f"{workers} process" + ("es" if workers > 1 else ""), {
                    "hit_ratio": metrics["hit_ratio"],
                    "disk_bytes_written": stats["disk"]["bytes_written"],
                    "requests": metrics["requests"],
                }))  # fmt: skip
        finally:
            served.terminate()
            served.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU-seconds of ``pids`` so far (``/proc/PID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def wrk_random(url: str, prefix: str, urls: int, seconds: float) -> int:
    """Requests ``wrk`` made to ``url`` in ``seconds``, each to one of ``urls`` URLs; the
    origin (on this loop) answers the misses meanwhile."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f'request = function() return wrk.format(nil, "{prefix}" .. '
                      f"math.random(0, {urls - 1})) end\n")  # fmt: skip
    try:
        process = await asyncio.create_subprocess_exec(
            "wrk", "-t1", "-c32", f"-d{seconds:g}s", "-s", str(script), url,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        out = (await asyncio.wait_for(process.communicate(), seconds + 30))[0].decode()
    finally:
        script.unlink()
    return int(out.split(" requests in ")[0].split()[-1])


async def warm(url: str, prefix: str, urls: int) -> None:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(3):
            for i in range(urls):
                async with session.get(f"{url}{prefix}{i}") as r:
                    await r.read()


async def cost(
    origin_url: str, seconds: float, baseline: str | None
) -> list[tuple[str, float, float]]:
    """(case, CPU-seconds per 100,000 hits, hits a second) for each server and hit source."""
    rows = []
    for source, prefix, urls, settings in (
        ("memory", "/u", 100, ()),
        ("behind memory", "/b", 2000, ("cache.size=1MiB", "disk.size=256MiB",
                                       "disk.region_size=4MiB", "disk.policy=always")),
    ):  # fmt: skip
        runs = [(1, None), (2, None)]
        if baseline and not settings:
            runs.append((2, baseline))
        for workers, cwd in runs:
            directory = tempfile.mkdtemp(prefix="onehit-bench-cost-")
            extra = (*settings, f"disk.path={directory}") if settings else ()
            try:
                async with (
                    proxy(origin_url, workers, cwd, *extra) as (process, url, admin),
                    aiohttp.ClientSession() as session,
                ):
                    await warm(url, prefix, urls)
                    stats = await admin_stats(session, admin)
                    pids = [process.pid] + [w["pid"] for w in stats.get("workers", [])]
                    hits0 = (stats["sum"] if workers > 1 else stats["metrics"])["hits"]
                    cpu0, t0 = cpu_seconds(pids), time.monotonic()
                    await wrk_random(url, prefix, urls, seconds)
                    cpu1, t1 = cpu_seconds(pids), time.monotonic()
                    stats = await admin_stats(session, admin)
                    hits = (stats["sum"] if workers > 1 else stats["metrics"])["hits"] - hits0
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            name = f"{source}, " + ("one process" if workers == 1 else f"{workers} workers")
            name += ", baseline" if cwd else ""
            rows.append((name, (cpu1 - cpu0) / hits * 1e5, hits / (t1 - t0)))
        nginx = nginx_binary()
        if nginx is not None:
            per, rate = await nginx_cost(nginx, origin_url, prefix, urls, seconds)
            rows.append((f"{source}, nginx proxy_cache", per, rate))
    return rows


async def nginx_cost(
    nginx: str, origin_url: str, prefix: str, urls: int, seconds: float
) -> tuple[float, float]:
    """nginx ``proxy_cache`` (one worker, its cache on disk) warmed with ``urls`` URLs:
    CPU-seconds per 100,000 hits and hits a second under the same load."""
    root = Path(tempfile.mkdtemp(prefix="onehit-bench-nginx-"))
    port = free_port()
    config = nginx_config(root, port, origin_url, 1 << 30)
    process = subprocess.Popen([nginx, "-c", str(config), "-p", str(root)],
                               stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        await asyncio.sleep(0.5)
        url = f"http://127.0.0.1:{port}"
        await warm(url, prefix, urls)
        pids = [process.pid, *child_pids(process.pid)]
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        requests = await wrk_random(url, prefix, urls, seconds)
        cpu1, t1 = cpu_seconds(pids), time.monotonic()
        return (cpu1 - cpu0) / requests * 1e5, requests / (t1 - t0)
    finally:
        process.send_signal(signal.SIGQUIT)
        process.wait()
        shutil.rmtree(root, ignore_errors=True)


def child_pids(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(p) for p in children.read_text().split()]
    except OSError:
        return []


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` (``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def memory(origin_url: str) -> list[tuple[str, int]]:
    """(process, resident bytes) after 3,000 URLs of 64 KiB asked twice through a cache of
    128 MiB: one process, then the parent, each worker and the shared tier of two workers."""
    rows = []
    paths = [f"/m{i}" for i in range(3000)]
    for workers in (1, 2):
        before = set(Path("/dev/shm").glob("onehit-tier-*"))
        async with (
            proxy(origin_url, workers, None, "cache.size=128MiB") as (process, url, admin),
            aiohttp.ClientSession() as session,
        ):
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as client:
                for path in paths:
                    for _ in range(2):  # the second sighting at once: each is stored
                        async with client.get(url + path) as r:
                            await r.read()
            stats = await admin_stats(session, admin)
            if workers == 1:
                rows.append(("one process", rss(process.pid)))
                continue
            rows.append(("parent", rss(process.pid)))
            for n, worker in enumerate(stats["workers"]):
                rows.append((f"worker {n} (memory tier {worker['store']['bytes_used']:,} B)",
                             rss(worker["pid"])))  # fmt: skip
            tier = set(Path("/dev/shm").glob("onehit-tier-*")) - before
            held = sum(f.stat().st_size for d in tier for f in d.glob("region-*.log"))
            rows.append(("shared tier in /dev/shm", held))
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="kills,replay,cost,memory")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--baseline", help="another checkout: its two workers, from memory")
    args = parser.parse_args()
    parts = set(args.part.split(","))
    async with origin() as origin_url:
        if "kills" in parts:
            print(f"SIGKILL of a worker at random moments under load, {args.rounds} rounds:")
            print(json.dumps(await kills(origin_url, args.rounds), indent=2))
        if "replay" in parts:
            print(f"Zipf(0.8) trace, {args.requests:,} requests, replayed live (8 connections):")
            rows = await replay(args.requests)
            one = rows[0][1]
            for name, row in rows:
                written = row["disk_bytes_written"]
                share = written / max(1, one["disk_bytes_written"])
                delta = row["hit_ratio"] - one["hit_ratio"]
                print(f"  {name:14} hit ratio {row['hit_ratio']:.4f} ({delta:+.4f})  "
                      f"disk bytes written {written:,} (x{share:.3f})")  # fmt: skip
        if "memory" in parts:
            print("Resident memory, [cache] size 128 MiB, 3,000 URLs of 64 KiB stored:")
            for name, held in await memory(origin_url):
                print(f"  {name:44} {held / 2**20:8.1f} MiB")
        if "cost" in parts and shutil.which("wrk"):
            print(f"CPU-seconds of the servers per 100,000 hits, wrk -c32 for {args.seconds:g} s:")
            rows = await cost(origin_url, args.seconds, args.baseline)
            for name, per, rate in rows:
                print(f"  {name:36} {per:7.3f} CPU-s   {rate:9,.0f} hits/s")


if __name__ == "__main__":
    asyncio.run(main())
