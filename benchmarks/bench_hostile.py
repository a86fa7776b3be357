"""What one careless or hostile client costs the proxy, beside the same run of another checkout.

Each onehit is a separate process on 127.0.0.1 in front of one aiohttp origin:

* memory: 12,000 distinct 8 KB URLs that vary on Accept-Encoding, then 12,000 distinct 30 KB
  User-Agents for one URL that varies on it, through a 4 MiB cache (admission ``always``):
  the proxy's RSS growth beside what its store reports;
* stalled uploads: 600 connections send a POST head with ``Content-Length: 10`` and nothing
  more, then 50 misses from another client (16 origin connections at most): how many are
  served, and how fast.

    .venv/bin/python benchmarks/bench_hostile.py [--baseline /tmp/onehit-before]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from bench_miss import peak_rss
from bench_proxy import run_server, spawn, wait_ready

from loadgen.live.processes import free_port


def serve_origin(port: int) -> None:
    from aiohttp import web

    async def handle(request: web.BaseRequest) -> web.Response:
        vary = "User-Agent" if request.path == "/one" else "Accept-Encoding"
        return web.Response(body=b"b" * 100, headers={"Cache-Control": "max-age=600", "Vary": vary})

    run_server(handle, port)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def drive_memory(base: str, admin: str) -> int:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as session:

        async def get(path: str, headers: dict[str, str]) -> None:
            async with session.get(base + path, headers=headers) as r:
                await r.read()

        for start in range(0, 12_000, 200):
            await asyncio.gather(*(
                get(f"/{i:05d}" + "u" * 8000, {"Accept-Encoding": "gzip"})
                for i in range(start, start + 200)
            ))  # fmt: skip
        for start in range(0, 12_000, 200):
            await asyncio.gather(*(
                get("/one", {"User-Agent": f"{i:05d}" + "a" * 30_000})
                for i in range(start, start + 200)
            ))  # fmt: skip
        async with session.get(admin + "/stats") as r:
            stats = json.loads(await r.text())
    return stats["metrics"]["bytes_used"]


async def stalled_uploads(base: str, host: str, port: int) -> tuple[int, float]:
    import aiohttp

    stalled = []
    for _ in range(600):
        _, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /p HTTP/1.1\r\nHost: a.example\r\nContent-Length: 10\r\n\r\n")
        stalled.append(writer)
    await asyncio.sleep(0.5)
    timeout = aiohttp.ClientTimeout(total=5)
    latencies: list[float] = []
    served = 0
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def miss(i: int) -> None:
            nonlocal served
            started = time.perf_counter()
            try:
                async with session.get(f"{base}/miss{i}") as r:
                    await r.read()
                    served += r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                pass
            latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(miss(i) for i in range(50)))
    for writer in stalled:
        writer.close()
    return served, statistics.median(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a checkout of onehit to measure beside this one")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1])
    sources = {"onehit": here} | ({"onehit@baseline": args.baseline} if args.baseline else {})
    origin_port = free_port()
    origin = f"http://127.0.0.1:{origin_port}"
    with ExitStack() as stack:
        spawn(stack, sys.executable, __file__, "--role", "origin", str(origin_port))
        wait_ready(f"{origin}/ready")
        print("memory: 12,000 8 KB URLs x Vary: Accept-Encoding, then 12,000 30 KB User-Agents")
        for label, source in sources.items():
            port, admin = free_port(), free_port()
            process = spawn(
                stack, sys.executable, "-m", "proxy", "--origin", origin,
                "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                "--admission", "always", "--cache-size", "4MiB",
                "--set", "cache.max_object_size=1MiB", "--set", "server.access_log=false",
                cwd=source,
            )  # fmt: skip
            wait_ready(f"http://127.0.0.1:{admin}/healthz")
            before = rss(process.pid)
            used = asyncio.run(
                drive_memory(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}")
            )
            growth = peak_rss(process.pid) - before
            mib = 1 << 20
            print(f"  {label:16s} RSS +{growth / mib:6.1f} MiB, store {used / mib:.1f} MiB")
        print("600 stalled uploads, then 50 misses from another client (16 origin connections):")
        for label, source in sources.items():
            port, admin = free_port(), free_port()
            spawn(
                stack, sys.executable, "-m", "proxy", "--origin", origin,
                "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                "--set", "upstream.max_connections=16", "--set", "server.access_log=false",
                cwd=source,
            )  # fmt: skip
            wait_ready(f"http://127.0.0.1:{admin}/healthz")
            served, p50 = asyncio.run(
                stalled_uploads(f"http://127.0.0.1:{port}", "127.0.0.1", port)
            )
            print(f"  {label:16s} {served}/50 misses served, median {p50 * 1e3:,.1f} ms")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        serve_origin(int(sys.argv[3]))
    else:
        main()
