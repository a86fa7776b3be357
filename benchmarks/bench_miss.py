"""The miss path: time to first byte and memory of misses, beside the origin itself and nginx.

Every request asks for a URL never asked before, so every one is a miss, and under second hit a
first sighting that is never stored. Measured in one run, each server a separate process on
127.0.0.1:

* time to first body byte (TTFB) and to the last byte, median and p90 over sequential requests,
  for 16 KiB and 4 MiB objects: the origin direct (the reference), onehit with second hit (first
  sightings: streamed, nothing kept), onehit with ``always`` (every miss stored: streamed while a
  copy is kept), nginx ``proxy_cache`` with ``proxy_cache_min_uses 2`` when installed, and, with
  ``--baseline DIR``, onehit from another checkout (an earlier commit) the same way;
* peak RSS growth of the proxy while 200 clients miss 200 different 4 MiB objects at once.

    .venv/bin/python benchmarks/bench_miss.py [--requests 60] [--baseline /tmp/onehit-before]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench_proxy import run_server, spawn, wait_ready

from loadgen.live.nginx import nginx_binary, nginx_config
from loadgen.live.processes import free_port

SIZES = {"16KiB": 16 << 10, "4MiB": 4 << 20}
CHUNK = 64 << 10


def serve_origin(port: int, rate: float) -> None:
    """Bodies of /SIZE/anything in 64 KiB pieces, at ``rate`` bytes/s (0: as fast as it can):
    an origin across a network, not one competing with the proxy for these two cores."""
    from aiohttp import web

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        size = int(request.path.split("/")[1])
        response = web.StreamResponse(headers={"Cache-Control": "max-age=3600"})
        response.content_length = size
        await response.prepare(request)
        piece = b"o" * CHUNK
        for start in range(0, size, CHUNK):
            await response.write(piece[: min(CHUNK, size - start)])
            if rate and start + CHUNK < size:
                await asyncio.sleep(CHUNK / rate)
        return response

    run_server(handle, port)


async def timed_get(session, url: str) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """(seconds to the first body byte, seconds to the last, bytes) of one GET."""
    started = time.perf_counter()
    async with session.get(url) as r:
        first = await r.content.readany()
        ttfb = time.perf_counter() - started
        size = len(first)
        while chunk := await r.content.readany():
            size += len(chunk)
    return ttfb, time.perf_counter() - started, size


async def ttfb_series(base: str, size: int, requests: int, tag: str) -> tuple[list, list]:
    import aiohttp

    firsts, lasts = [], []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for i in range(requests + 5):
            await asyncio.sleep(0.02)  # the server finishes storing the last one first
            ttfb, total, got = await timed_get(session, f"{base}/{size}/{tag}-{i}")
            assert got == size, f"{base}: got {got} of {size} bytes"
            if i >= 5:  # the first few warm connections and code paths
                firsts.append(ttfb)
                lasts.append(total)
    return firsts, lasts


async def concurrent_misses(base: str, size: int, clients: int) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        results = await asyncio.gather(
            *(timed_get(session, f"{base}/{size}/flood-{i}") for i in range(clients))
        )
    assert all(got == size for _, _, got in results)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def start_onehit(stack: ExitStack, origin: str, admission: str, source: str) -> tuple:
    """onehit from the checkout ``source`` (``python -m`` imports from its working directory)."""
    port, admin = free_port(), free_port()
    process = spawn(
        stack, sys.executable, "-m", "proxy", "--origin", origin,
        "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
        "--admission", admission, "--cache-size", "1GiB", "--set", "server.access_log=false",
        cwd=source,
    )  # fmt: skip
    wait_ready(f"http://127.0.0.1:{admin}/healthz")
    return f"http://127.0.0.1:{port}", process


def ms(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * q))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60, help="sequential misses per cell")
    parser.add_argument("--clients", type=int, default=200, help="concurrent 4 MiB misses")
    parser.add_argument("--baseline", help="a checkout of onehit to measure beside this one")
    parser.add_argument(
        "--origin-rate", type=float, default=100e6, help="origin bytes/s per response (0: no limit)"
    )
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1])
    origin_port = free_port()
    origin = f"http://127.0.0.1:{origin_port}"
    with ExitStack() as stack:
        spawn(stack, sys.executable, __file__, "--role", "origin", str(origin_port),
              str(args.origin_rate))  # fmt: skip
        wait_ready(f"{origin}/1/ready")
        targets: dict[str, str] = {"origin direct": origin}
        onehits: dict[str, tuple[str, subprocess.Popen]] = {}
        sources = {"onehit": here} | ({"onehit@baseline": args.baseline} if args.baseline else {})
        for label, source in sources.items():
            for admission in ("second-hit", "always"):
                url, process = start_onehit(stack, origin, admission, source)
                targets[f"{label} {admission}"] = url
                onehits[f"{label} {admission}"] = (url, process)
        nginx = nginx_binary()
        if nginx:
            root = Path(tempfile.mkdtemp(prefix="onehit-nginx-"))
            stack.callback(shutil.rmtree, root, True)
            port = free_port()
            spawn(
                stack, nginx, "-c", str(nginx_config(root, port, origin, 1 << 30)), "-p", str(root)
            )
            targets["nginx min_uses 2"] = f"http://127.0.0.1:{port}"
            wait_ready(f"{targets['nginx min_uses 2']}/1/ready")
        else:
            print("(nginx not found: skipped; apt-get install nginx-light to compare)")
        rate = f"{args.origin_rate / 1e6:g} MB/s" if args.origin_rate else "unlimited"
        print(f"misses of never-seen URLs, {args.requests} sequential requests per cell "
              f"(20 ms apart), origin sending at {rate}")  # fmt: skip
        for name, size in SIZES.items():
            print(
                f"\n  {name} objects:        TTFB p50   p90   | last byte p50   p90 | TTFB x origin"
            )
            results = {
                t: asyncio.run(ttfb_series(u, size, args.requests, t.replace(" ", "_")))
                for t, u in targets.items()
            }
            reference = statistics.median(results["origin direct"][0])
            for target, (firsts, lasts) in results.items():
                print(
                    f"    {target:26s} {ms(firsts, 0.5):6.2f} {ms(firsts, 0.9):6.2f} ms"
                    f" | {ms(lasts, 0.5):8.2f} {ms(lasts, 0.9):7.2f} ms"
                    f" | x{statistics.median(firsts) / reference:.2f}"
                )
        print(f"\n{args.clients} concurrent first-sighting misses of 4 MiB objects:")
        for label, (url, process) in onehits.items():
            if not label.endswith("second-hit"):
                continue
            asyncio.run(ttfb_series(url, 4 << 20, 1, "warm"))
            before = peak_rss(process.pid)
            started = time.perf_counter()
            asyncio.run(concurrent_misses(url, 4 << 20, args.clients))
            elapsed = time.perf_counter() - started
            growth = peak_rss(process.pid) - before
            print(
                f"    {label:26s} peak RSS +{growth / (1 << 20):7.1f} MiB"
                f" ({growth / (args.clients * (4 << 20)):.1%} of the bodies), {elapsed:.1f} s"
            )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        serve_origin(int(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
