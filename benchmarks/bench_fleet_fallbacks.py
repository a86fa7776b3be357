"""How often the fleet's shared (Redis) filter falls back to the local one under ordinary load.

What a new user does: one onehit with the Redis backend (a local redis-server, defaults, a 1 MiB
cache, ``expected_urls = 500``), 6,000 never-seen URLs sent by 16 concurrent clients through one
Host. Each proxy's ``/stats`` then gives its shared filter's ``fallbacks`` and
``remote_decisions``; the share of fallbacks is printed, on a quiet machine and with one core
kept busy by a spinning process. ``--baseline DIR``: an onehit from another checkout (an earlier
commit) measured the same way in the same run, before this one.

    .venv/bin/python benchmarks/bench_fleet_fallbacks.py [--urls 6000] [--clients 16]
        [--runs 3] [--baseline /tmp/onehit-before]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from loadgen.live.processes import free_port, redis_process

BENCH_PROXY = Path(__file__).with_name("bench_proxy.py")


@contextlib.asynccontextmanager
async def child(*args: str, cwd: str | None = None) -> AsyncIterator[None]:
    """``args`` running, stopped by SIGTERM (then SIGKILL) on leaving."""
    env = None if cwd is None else {**os.environ, "PYTHONPATH": cwd}
    process = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(150):
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(url) as r:
                await r.read()
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within 15 s")


async def fallback_share(
    origin: str, redis: str, tag: str, urls: int, clients: int, cwd: str | None
) -> tuple[int, int, float | None, float | None]:
    """(fallbacks, decisions, its budget in ms at the end, the p99 of Redis's round trips in
    ms) of one fresh proxy after ``urls`` first sightings from ``clients`` concurrent clients
    (the last two None where it does not say)."""
    port, admin = free_port(), free_port()
    proxy = (sys.executable, "-m", "proxy", "--origin", origin, "--listen", f"127.0.0.1:{port}",
             "--admin-listen", f"127.0.0.1:{admin}", "--set", "server.access_log=false",
             "--set", "cache.size=1MiB", "--set", "admission.backend=redis",
             "--set", f"admission.redis_url={redis}", "--set", "admission.expected_urls=500",
             "--set", f"admission.redis_prefix=bench:{tag}")  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=30)
    async with child(*proxy, cwd=cwd), aiohttp.ClientSession(timeout=timeout) as session:
        await ready(session, f"http://127.0.0.1:{admin}/stats")
        before = await stats(session, admin)
        per_client = urls // clients

        async def client(n: int) -> None:
            for i in range(per_client):
                url = f"http://127.0.0.1:{port}/1k/{tag}-{n}-{i}"
                async with session.get(url) as r:
                    assert r.status == 200, r.status
                    await r.read()

        await asyncio.gather(*(client(n) for n in range(clients)))
        after = await stats(session, admin)
    fallbacks = after["fallbacks"] - before["fallbacks"]
    decided = after["remote_decisions"] - before["remote_decisions"]
    return fallbacks, fallbacks + decided, after.get("budget_ms"), after.get("round_trip_p99_ms")


async def stats(session: aiohttp.ClientSession, admin: int) -> dict:
    async with session.get(f"http://127.0.0.1:{admin}/stats") as r:
        return (await r.json())["shared_filter"]


async def main(args: argparse.Namespace) -> None:
    proxies = {"onehit": None}
    if args.baseline:
        proxies = {"onehit at the baseline": args.baseline, **proxies}
    origin_port = free_port()
    origin = f"http://127.0.0.1:{origin_port}"
    async with (
        redis_process() as redis,
        child(sys.executable, str(BENCH_PROXY), "--role", "origin", str(origin_port)),
    ):
        if redis is None:
            sys.exit("redis-server is not installed (apt-get install redis-server)")
        print(f"{args.urls:,} first sightings from {args.clients} clients, 1 MiB cache, "
              f"expected_urls 500, redis_budget default; median of {args.runs} runs")  # fmt: skip
        for load in ("quiet", "one core busy"):
            spin = ("-c", "while True: pass") if load != "quiet" else ("-c", "")
            async with child(sys.executable, *spin):
                for name, cwd in proxies.items():
                    shares = []
                    for run in range(args.runs):
                        tag = f"{abs(hash((load, name)))}-{run}"
                        fallbacks, decided, budget, p99 = await fallback_share(
                            origin, redis, tag, args.urls, args.clients, cwd
                        )
                        shares.append(
                            (fallbacks / max(1, decided), fallbacks, decided, budget, p99)
                        )
                    share, fallbacks, decided, budget, p99 = sorted(shares)[len(shares) // 2]
                    measured = "" if p99 is None else f"; round trip p99 {p99:.1f} ms"
                    print(f"  {load:14s} {name:24s} {share:7.1%} fell back "
                          f"({fallbacks:,} of {decided:,} decisions; budget {budget:g} ms"
                          f"{measured})")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=6000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3, help="runs per cell; the median shown")
    parser.add_argument("--baseline", help="another checkout of onehit to measure beside this")
    asyncio.run(main(parser.parse_args()))
