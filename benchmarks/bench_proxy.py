"""Cache-hit throughput and latency of onehit beside references measured in the same run.

Targets, each a separate process on 127.0.0.1: the origin itself (aiohttp), a minimal aiohttp
pass-through proxy (no cache: the floor any aiohttp proxy pays), onehit serving hits, and nginx
``proxy_cache`` when an ``nginx`` binary is on PATH. Load comes from ``wrk`` when installed,
else from a closed-loop aiohttp client in its own process. Bodies of 1 KiB and 64 KiB.

    .venv/bin/python benchmarks/bench_proxy.py [--seconds 5] [--connections 32]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from loadgen.experiment import free_port
from loadgen.nginx import nginx_binary, nginx_config

SIZES = {"1k": 1024, "64k": 64 * 1024}


# Roles this script plays in its own subprocesses.


def serve_origin(port: int) -> None:
    from aiohttp import web

    bodies = {f"/{name}": b"o" * size for name, size in SIZES.items()}

    async def handle(request: web.BaseRequest) -> web.Response:
        return web.Response(
            body=bodies[request.path], headers={"Cache-Control": "max-age=3600", "ETag": '"b1"'}
        )

    run_server(handle, port)


def serve_passthrough(port: int, origin: str) -> None:
    import aiohttp
    from aiohttp import web

    session: aiohttp.ClientSession | None = None

    async def handle(request: web.BaseRequest) -> web.Response:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession(auto_decompress=False)
        async with session.get(origin + request.raw_path) as upstream:
            body = await upstream.read()
            return web.Response(status=upstream.status, body=body)

    run_server(handle, port)


def run_server(handler, port: int) -> None:  # type: ignore[no-untyped-def]
    """Serve ``handler`` (an aiohttp low-level handler) on 127.0.0.1:``port`` until killed."""
    from aiohttp import web

    async def main() -> None:
        runner = web.ServerRunner(web.Server(handler, access_log=None))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def client_load(url: str, seconds: float, connections: int) -> None:
    """Closed loop: ``connections`` workers each send a request as soon as the last returns."""
    import aiohttp

    async def main() -> None:
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def worker() -> None:
                while time.perf_counter() < deadline:
                    started = time.perf_counter()
                    async with session.get(url) as r:
                        await r.read()
                    latencies.append(time.perf_counter() - started)

            began = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(connections)))
            elapsed = time.perf_counter() - began
        latencies.sort()
        n = len(latencies)
        print(n / elapsed, latencies[n // 2] * 1e3, latencies[min(n - 1, int(n * 0.99))] * 1e3)

    asyncio.run(main())


# The driver


def wait_ready(url: str, timeout: float = 15.0) -> str:
    """Fetch ``url`` once it answers; returns its X-Cache header ("" if none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                r.read()
                return r.headers.get("X-Cache", "")
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


def spawn(stack: ExitStack, *args: str, cwd: str | None = None) -> subprocess.Popen:
    """Start ``args`` (in ``cwd``), to be stopped by SIGTERM when ``stack`` closes."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)

    def stop() -> None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    stack.callback(stop)
    return process


def measure(url: str, seconds: float, connections: int) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of ``url`` under load."""
    wrk = shutil.which("wrk")
    if wrk:
        out = subprocess.run(
            [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", url],
            capture_output=True, text=True, timeout=seconds + 30, check=True,
        ).stdout  # fmt: skip
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        return rps, _wrk_ms(out, "50%"), _wrk_ms(out, "99%")
    out = subprocess.run(
        [sys.executable, __file__, "--role", "client", url, str(seconds), str(connections)],
        capture_output=True, text=True, timeout=seconds + 60, check=True,
    ).stdout  # fmt: skip
    rps, p50, p99 = (float(x) for x in out.split())
    return rps, p50, p99


def _wrk_ms(out: str, percentile: str) -> float:
    value, unit = re.search(rf"{percentile}\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def start_nginx(stack: ExitStack, port: int, origin: str) -> bool:
    nginx = nginx_binary()
    if nginx is None:
        print("  (nginx not found: skipped; apt-get install nginx to compare)")
        return False
    root = Path(tempfile.mkdtemp(prefix="onehit-nginx-"))
    stack.callback(shutil.rmtree, root, True)
    config = nginx_config(root, port, origin, 1 << 30)
    spawn(stack, nginx, "-c", str(config), "-p", str(root))
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    ports = {name: free_port() for name in ("origin", "pass", "onehit", "admin", "nginx")}
    origin = f"http://127.0.0.1:{ports['origin']}"
    py = sys.executable
    with ExitStack() as stack:
        spawn(stack, py, __file__, "--role", "origin", str(ports["origin"]))
        spawn(stack, py, __file__, "--role", "passthrough", str(ports["pass"]), origin)
        spawn(
            stack, py, "-m", "proxy", "--origin", origin, "--listen",
            f"127.0.0.1:{ports['onehit']}", "--admin-listen", f"127.0.0.1:{ports['admin']}",
            "--admission", "always", "--set", "server.access_log=false",
        )  # fmt: skip
        targets = {
            "origin direct": f"http://127.0.0.1:{ports['origin']}",
            "aiohttp pass-through": f"http://127.0.0.1:{ports['pass']}",
            "onehit (hits)": f"http://127.0.0.1:{ports['onehit']}",
        }
        if start_nginx(stack, ports["nginx"], origin):
            targets["nginx proxy_cache (hits)"] = f"http://127.0.0.1:{ports['nginx']}"
        for target, url in targets.items():
            for name in SIZES:
                for _ in range(3):  # warm: min_uses 2 has stored by the third request
                    last = wait_ready(f"{url}/{name}")
                if "(hits)" in target and last.upper() != "HIT":
                    raise SystemExit(f"{target} is not serving {name} from cache (X-Cache: {last})")
        tool = "wrk" if shutil.which("wrk") else "aiohttp client loop"
        print(
            f"load: {tool}, {args.connections} connections, {args.seconds:g}s per cell, "
            f"2 cores shared by load and server"
        )
        for name in SIZES:
            results = {
                t: measure(f"{u}/{name}", args.seconds, args.connections)
                for t, u in targets.items()
            }
            floor = results["aiohttp pass-through"][0]
            print(f"\n  body {name}:")
            for target, (rps, p50, p99) in results.items():
                print(
                    f"    {target:26s} {rps:>10,.0f} req/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms"
                    f"  x{rps / floor:.2f} of pass-through"
                )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, rest = sys.argv[2], sys.argv[3:]
        if role == "origin":
            serve_origin(int(rest[0]))
        elif role == "passthrough":
            serve_passthrough(int(rest[0]), rest[1])
        elif role == "client":
            client_load(rest[0], float(rest[1]), int(rest[2]))
    else:
        main()
