"""What ``--workers`` costs "cache on second hit", against one process in the same run.

What a new user does on a many-core machine: ``onehit-proxy --workers N`` in front of an
origin, each request on a new connection (the kernel spreads connections over the workers).
400 URLs are asked three times each, in rounds; the proxy's ``/stats`` gives the responses
stored (admissions, all on second requests) and the third requests' answers say whether they
hit. Then one worker is killed (SIGKILL) and the time until the parent has replaced it and
the admin answers healthy again is measured. ``--baseline DIR``: an onehit from another
checkout (an earlier commit) measured the same way, in the same run. With ``--disk``, each
runs with a disk tier too, and after the three rounds the proxy is stopped and started again
on the same port (every memory tier empty): a fourth round says how many objects the disk
tier answered ("after a restart").

    .venv/bin/python benchmarks/bench_workers.py [--urls 400] [--workers 2] [--disk]
        [--baseline /tmp/onehit-before]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from loadgen.live.processes import free_port


@contextlib.asynccontextmanager
async def origin() -> AsyncIterator[str]:
    async def handle(request: web.Request) -> web.Response:
        # /b...: 16 KiB bodies, /m...: 64 KiB, the others 1,000 bytes
        size = {"b": 16384, "m": 65536}.get(request.path[1:2], 1000)
        return web.Response(
            body=body_of(request.path, size), headers={"Cache-Control": "max-age=600"}
        )

    runner = web.AppRunner(web.Application(handler_args=None), access_log=None)
    runner.app.router.add_get("/{path:.*}", handle)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def body_of(path: str, size: int = 1000) -> bytes:
    """The origin's body of ``path``: its own, so a wrong one shows."""
    unit = path.encode() + b"|"
    return (unit * (size // len(unit) + 1))[:size]


@contextlib.asynccontextmanager
async def proxy(
    origin_url: str,
    workers: int,
    cwd: str | None,
    *settings: str,
    port: int | None = None,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, str]]:
    """onehit (``cwd``: another checkout's) on ``port`` (default: a free one), with ``--set``
    ``settings``; the process, its URL and its admin URL once healthy."""
    port, admin = port or free_port(), free_port()
    args = [sys.executable, "-m", "proxy", "--origin", origin_url, "--listen",
            f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
            "--set", "server.access_log=false"]  # fmt: skip
    for setting in settings:
        args += ["--set", setting]
    if workers > 1:
        args += ["--workers", str(workers)]
    env = None if cwd is None else {**os.environ, "PYTHONPATH": cwd}
    process = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as session:
            await healthy(session, f"http://127.0.0.1:{admin}/healthz", 30)
        yield process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()


async def healthy(session: aiohttp.ClientSession, url: str, within: float) -> float:
    """Seconds until ``url`` answers 200 (polled every 10 ms); RuntimeError past ``within``."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(url) as r:
                if r.status == 200:
                    return time.monotonic() - started
        await asyncio.sleep(0.01)
    raise RuntimeError(f"{url} did not answer within {within} s")


async def measure(
    origin_url: str, workers: int, urls: int, cwd: str | None, disk: bool = False
) -> dict[str, object]:
    directory = tempfile.mkdtemp(prefix="onehit-bench-disk-") if disk else None
    settings = (
        (f"disk.path={directory}", "disk.size=256MiB", "disk.region_size=4MiB") if disk else ()
    )
    port = free_port()
    try:
        row = await _measure(origin_url, workers, urls, cwd, settings, port)
        if disk:
            async with proxy(origin_url, workers, cwd, *settings, port=port) as (_, url, _admin):
                row["after_restart"] = await disk_hits(url, urls)
        return row
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


async def disk_hits(url: str, urls: int) -> int:
    """Of ``urls`` URLs asked once, each on a new connection: the hits the disk answered with
    the URL's own body."""
    connector = aiohttp.TCPConnector(force_close=True)
    hits = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(urls):
            async with session.get(f"{url}/u{i}") as r:
                body = await r.read()
                if "detail=disk" in r.headers.get("Cache-Status", "") and body == body_of(f"/u{i}"):
                    hits += 1
    return hits


async def _measure(
    origin_url: str, workers: int, urls: int, cwd: str | None, settings: tuple[str, ...], port: int
) -> dict[str, object]:
    async with proxy(origin_url, workers, cwd, *settings, port=port) as (_, url, admin):
        connector = aiohttp.TCPConnector(force_close=True)
        hits = 0
        async with aiohttp.ClientSession(connector=connector) as session:
            for round_ in range(3):
                for i in range(urls):
                    async with session.get(f"{url}/u{i}") as r:
                        await r.read()
                        if round_ == 2 and "hit" in r.headers.get("Cache-Status", "").split(";")[1]:
                            hits += 1
                async with session.get(admin + "/stats") as r:
                    stats = await r.json()
                metrics = stats["sum"] if workers > 1 else stats["metrics"]
                if round_ == 1:
                    second = metrics["admissions"]
            replaced = None
            if workers > 1 and "workers_replaced" in stats:
                pid = stats["workers"][0]["pid"]
                os.kill(pid, signal.SIGKILL)
                started = time.monotonic()
                while True:
                    with contextlib.suppress(aiohttp.ClientError, OSError):
                        async with session.get(admin + "/stats") as r:
                            now = await r.json()
                        if now["workers_replaced"] == 1:
                            break
                    await asyncio.sleep(0.01)
                await healthy(session, admin + "/healthz", 10)
                replaced = round(time.monotonic() - started, 2)
        return {
            "stored": second,
            "third_hits": hits,
            "copies": metrics["admissions"],
            "replaced_s": replaced,
        }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline", help="another checkout, measured the same way")
    parser.add_argument("--disk", action="store_true", help="with a disk tier, and a restart")
    args = parser.parse_args()
    async with origin() as origin_url:
        one = await measure(origin_url, 1, args.urls, None, args.disk)
        rows = [("one process", one)]
        if args.baseline:
            before = await measure(origin_url, args.workers, args.urls, args.baseline)
            rows.append((f"--workers {args.workers}, baseline", before))
        now = await measure(origin_url, args.workers, args.urls, None, args.disk)
        rows.append((f"--workers {args.workers}", now))
    print(f"{args.urls} URLs, three requests each, every request on a new connection"
          + (", a disk tier" if args.disk else ""))  # fmt: skip
    print(
        "(stored: by the second requests; copies: stored in memory in all, a URL once per "
        "worker that stored it)"
    )
    print(f"{'':28} {'stored':>7} {'vs one':>7} {'3rd hits':>9} {'vs one':>7} {'copies':>7} "
          f"{'replaced':>9} {'after restart':>14}")  # fmt: skip
    for name, row in rows:
        stored, hits = row["stored"], row["third_hits"]
        replaced = "-" if row["replaced_s"] is None else f"{row['replaced_s']} s"
        restart = row.get("after_restart", "-")
        print(f"{name:28} {stored:>7} {stored / one['stored']:>7.2f} {hits:>9} "
              f"{hits / one['third_hits']:>7.2f} {row['copies']:>7} {replaced:>9} "
              f"{restart:>14}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
