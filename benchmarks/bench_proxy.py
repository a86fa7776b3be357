"""Cache-hit throughput and latency of onehit beside caches doing the same job, in one run.

Servers, each a separate process on 127.0.0.1, each pinned to the second core and the load
generator to the first where ``taskset`` exists: onehit (on its default loop, uvloop where
installed, and on asyncio's, the fallback, answering hits as they are parsed; and with
``fast_hits = false``, every hit through aiohttp's request handler, as before); a minimal
aiohttp cache on both loops (a dict lookup in a ``web.Server`` handler: the least an aiohttp
cache can do per hit; on asyncio, the reference); nginx ``proxy_cache`` and Varnish
(``varnishd -s malloc``) when installed. Bodies of 1 KiB, 16 KiB and 256 KiB, requested as one
URL and as 1,000 URLs. The origin counts its requests: a cell in which a cache sent it any is
flagged, so only hits are measured. The origin direct and a minimal aiohttp pass-through (no
cache) are measured apart, as the miss path's floor.
Misses are measured last: every request a URL never asked before (the origin counts them all),
as misses per second under the same load, as the CPU time each server spent per miss (its
processes' user and system time, from ``/proc``), and as the p50 latency one connection sees,
added to the origin's own. The origin shares the servers' core, or with ``--origin-core load``
the load generator's, which leaves each server its core alone: a server's own cost per miss
then sets its rate.
Load comes from ``wrk`` when installed, else from a closed-loop aiohttp client.

``--disk``: onehit with a disk tier too, its memory 1 MiB, so that in the 1,000-URL cells nearly
every hit is read from the disk's region files (page cache warm, as nginx's hits are); the
share of its hits the disk answered is printed under each cell.

Each cell is the median of ``--runs`` runs (requests/s; p99 of the same run).
``--baseline DIR``: onehit from another checkout too (an earlier commit, its compiled modules
built in place: ``python setup.py build_ext --inplace`` there), on its default loop, and the
ratio of this checkout's onehit to it in each cell: a change measured against what it changed.

    .venv/bin/python benchmarks/bench_proxy.py [--seconds 5] [--connections 64] [--runs 3]
        [--baseline /tmp/onehit-before] [--disk]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

from loadgen.live.nginx import nginx_binary, nginx_config
from loadgen.live.processes import free_port

SIZES = {"1k": 1024, "16k": 16 * 1024, "256k": 256 * 1024}
BASELINE = "onehit at the baseline checkout"
DISK = "onehit, memory 1 MiB, hits from disk"
URLS = 1000  # the many-URL cells spread their requests over this many objects of one size


# Roles this script plays in its own subprocesses.


def serve_origin(port: int) -> None:
    from aiohttp import web

    bodies = {name: b"o" * size for name, size in SIZES.items()}
    served = 0

    async def handle(request: web.BaseRequest) -> web.Response:
        nonlocal served
        if request.path == "/__count":
            return web.Response(text=str(served))
        served += 1
        name = request.path.strip("/").split("/")[0]
        return web.Response(
            body=bodies[name], headers={"Cache-Control": "max-age=3600", "ETag": '"b1"'}
        )

    run_server(handle, port)


def serve_mini_cache(port: int, origin: str) -> None:
    """The reference: a dict of whole responses by path, filled from the origin on a miss."""
    import aiohttp
    from aiohttp import web

    cache: dict[str, tuple[int, dict[str, str], bytes]] = {}
    session: aiohttp.ClientSession | None = None

    async def handle(request: web.BaseRequest) -> web.Response:
        nonlocal session
        hit = cache.get(request.raw_path)
        if hit is None:
            if session is None:
                session = aiohttp.ClientSession(auto_decompress=False)
            async with session.get(origin + request.raw_path) as upstream:
                body = await upstream.read()
                kept = {k: upstream.headers[k] for k in ("Cache-Control", "ETag")}
                hit = cache[request.raw_path] = (upstream.status, kept, body)
        status, headers, body = hit
        return web.Response(status=status, body=body, headers=headers)

    run_server(handle, port)


def serve_passthrough(port: int, origin: str) -> None:
    import aiohttp
    from aiohttp import web

    session: aiohttp.ClientSession | None = None

    async def handle(request: web.BaseRequest) -> web.Response:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession(auto_decompress=False)
        data = await request.read() if request.body_exists else None
        async with session.request(
            request.method, origin + request.raw_path, data=data
        ) as upstream:
            body = await upstream.read()
            return web.Response(status=upstream.status, body=body)

    run_server(handle, port)


def run_server(handler, port: int) -> None:  # type: ignore[no-untyped-def]
    """Serve ``handler`` (an aiohttp low-level handler) on 127.0.0.1:``port`` until killed, on
    uvloop when ``ONEHIT_BENCH_UVLOOP`` is set."""
    import os

    from aiohttp import web

    if os.environ.get("ONEHIT_BENCH_UVLOOP"):
        import uvloop

        uvloop.install()

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


def spawn(
    stack: ExitStack, *args: str, cwd: str | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``args`` (in ``cwd``, with ``env`` added), to be stopped by SIGTERM when
    ``stack`` closes."""
    environ = None if env is None else {**os.environ, **env}
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=cwd, env=environ)  # fmt: skip

    def stop() -> None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    stack.callback(stop)
    return process


LOAD_CORE = ("taskset", "-c", "0") if shutil.which("taskset") else ()
SERVER_CORE = ("taskset", "-c", "1") if shutil.which("taskset") else ()
# Every wrk run gets its own prefix: wrk's Lua starts each run from the same random seed.
NEW_URLS_LUA = """
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, wrk.path .. "/miss-{prefix}-" .. counter)
end
"""
MANY_URLS_LUA = f"""
request = function()
  return wrk.format(nil, wrk.path .. "/" .. math.random(0, {URLS - 1}))
end
"""


def measure(
    url: str, seconds: float, connections: int, script: Path | None = None
) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of ``url`` under load (``script``: wrk's request picker)."""
    wrk = shutil.which("wrk")
    if wrk:
        extra = ["-s", str(script)] if script is not None else []
        out = subprocess.run(
            [*LOAD_CORE, wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency",
             *extra, url],
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


T = TypeVar("T")


def median(runs: list[T]) -> T:
    """The middle run (by requests/s for measurements): a run, not an average of runs."""
    return sorted(runs)[len(runs) // 2]  # type: ignore[type-var]


def _wrk_ms(out: str, percentile: str) -> float:
    value, unit = re.search(rf"{percentile}\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def start_nginx(stack: ExitStack, port: int, origin: str) -> subprocess.Popen | None:
    nginx = nginx_binary()
    if nginx is None:
        print("  (nginx not found: skipped; apt-get install nginx to compare)")
        return None
    root = Path(tempfile.mkdtemp(prefix="onehit-nginx-"))
    stack.callback(shutil.rmtree, root, True)
    config = nginx_config(root, port, origin, 1 << 30)
    return spawn(stack, *SERVER_CORE, nginx, "-c", str(config), "-p", str(root))


def start_varnish(stack: ExitStack, port: int, origin_port: int) -> subprocess.Popen | None:
    varnishd = shutil.which("varnishd")
    if varnishd is None:
        print("  (varnishd not found: skipped; apt-get install varnish to compare)")
        return None
    root = Path(tempfile.mkdtemp(prefix="onehit-varnish-"))
    root.chmod(0o755)  # varnishd's compiler runs as its own user (vcache) and writes in here
    stack.callback(shutil.rmtree, root, True)
    return spawn(stack, *SERVER_CORE, varnishd, "-F", "-a", f"127.0.0.1:{port}",
                 "-b", f"127.0.0.1:{origin_port}", "-s", "malloc,1g", "-n", str(root))  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` and of every process under it (nginx's
    workers, Varnish's child), from ``/proc``; 0.0 where there is no ``/proc``."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process ended while being read
        child = int(stat.parent.name)
        parents[child] = int(fields[1])
        times[child] = (int(fields[11]) + int(fields[12])) / tick
    tree, total = [pid], 0.0
    while tree:
        current = tree.pop()
        total += times.get(current, 0.0)
        tree += [child for child, parent in parents.items() if parent == current]
    return total


def disk_hits(ports: dict[str, int]) -> tuple[int, int]:
    """(hits, of which the disk answered) of the onehit with a disk tier, from its ``/stats``."""
    url = f"http://127.0.0.1:{ports['onehit-disk-admin']}/stats"
    with urllib.request.urlopen(url, timeout=5) as r:
        stats = json.load(r)
    return stats["metrics"]["hits"], stats["metrics"]["hits_from_disk"]


def origin_count(origin: str) -> int:
    with urllib.request.urlopen(f"{origin}/__count", timeout=5) as r:
        return int(r.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--runs", type=int, default=1, help="runs per cell; the median is shown")
    parser.add_argument("--sizes", default=",".join(SIZES), help="body sizes, e.g. 1k,256k")
    parser.add_argument("--baseline", help="another checkout of onehit to measure beside this")
    parser.add_argument("--no-misses", action="store_true", help="measure hits only")
    parser.add_argument("--disk", action="store_true", help="onehit with a disk tier too")
    parser.add_argument(
        "--origin-core", choices=("server", "load"), default="server",
        help="the core the origin shares: the servers' (default) or the load generator's, which"
        " leaves each server its core alone for misses",
    )  # fmt: skip
    args = parser.parse_args()
    onehits = {
        "onehit": ("auto", True),
        "onehit-asyncio": ("asyncio", True),
        "onehit-handler": ("auto", False),
    }
    if args.baseline:
        onehits["onehit-baseline"] = ("auto", True)
    if args.disk:
        onehits["onehit-disk"] = ("auto", True)
    names = ("origin", "pass", "mini", "mini-uvloop", "nginx", "varnish", *onehits,
             *(f"{name}-admin" for name in onehits))  # fmt: skip
    ports = {name: free_port() for name in names}
    origin = f"http://127.0.0.1:{ports['origin']}"
    py = sys.executable
    with ExitStack() as stack:
        script = Path(tempfile.mkdtemp(prefix="onehit-wrk-")) / "many.lua"
        stack.callback(shutil.rmtree, script.parent, True)
        script.write_text(MANY_URLS_LUA)
        pids = {
            "origin": spawn(stack, *(SERVER_CORE if args.origin_core == "server" else LOAD_CORE),
                            py, __file__, "--role", "origin", str(ports["origin"])).pid,
            "pass": spawn(stack, *SERVER_CORE, py, __file__, "--role", "passthrough",
                          str(ports["pass"]), origin).pid,
            "mini": spawn(stack, *SERVER_CORE, py, __file__, "--role", "mini", str(ports["mini"]),
                          origin).pid,
            "mini-uvloop": spawn(stack, *SERVER_CORE, py, __file__, "--role", "mini",
                                 str(ports["mini-uvloop"]), origin,
                                 env={"ONEHIT_BENCH_UVLOOP": "1"}).pid,
        }  # fmt: skip
        for name, (loop, fast) in onehits.items():
            elsewhere = args.baseline if name == "onehit-baseline" else None
            tiers = ["--set", "cache.size=1GiB"]
            if name == "onehit-disk":
                disk = tempfile.mkdtemp(prefix="onehit-disk-")
                stack.callback(shutil.rmtree, disk, True)
                tiers = ["--set", "cache.size=1MiB", "--set", "cache.max_object_size=512KiB",
                         "--set", f"disk.path={disk}", "--set", "disk.size=2GiB",
                         "--set", "disk.policy=always"]  # fmt: skip
            pids[name] = spawn(
                stack, *SERVER_CORE, py, "-m", "proxy", "--origin", origin, "--listen",
                f"127.0.0.1:{ports[name]}", "--admin-listen", f"127.0.0.1:{ports[name + '-admin']}",
                "--admission", "always", "--set", "server.access_log=false", *tiers,
                "--set", f"server.event_loop={loop}",
                "--set", f"server.fast_hits={str(fast).lower()}",
                cwd=elsewhere, env=None if elsewhere is None else {"PYTHONPATH": elsewhere},
            ).pid  # fmt: skip
        caches = {
            "minimal aiohttp cache (reference)": f"http://127.0.0.1:{ports['mini']}",
            "minimal aiohttp cache on uvloop": f"http://127.0.0.1:{ports['mini-uvloop']}",
            "onehit": f"http://127.0.0.1:{ports['onehit']}",
            "onehit on asyncio's loop": f"http://127.0.0.1:{ports['onehit-asyncio']}",
            "onehit, hits via aiohttp's handler": f"http://127.0.0.1:{ports['onehit-handler']}",
        }
        if args.baseline:
            caches[BASELINE] = f"http://127.0.0.1:{ports['onehit-baseline']}"
        if args.disk:
            caches[DISK] = f"http://127.0.0.1:{ports['onehit-disk']}"
        if nginx := start_nginx(stack, ports["nginx"], origin):
            caches["nginx proxy_cache"] = f"http://127.0.0.1:{ports['nginx']}"
            pids["nginx"] = nginx.pid
        if varnish := start_varnish(stack, ports["varnish"], ports["origin"]):
            caches["varnish (malloc)"] = f"http://127.0.0.1:{ports['varnish']}"
            pids["varnish"] = varnish.pid
        floors = {
            "origin direct": origin,
            "aiohttp pass-through (no cache)": f"http://127.0.0.1:{ports['pass']}",
        }
        wait_ready(f"{origin}/__count")
        tool = "wrk" if shutil.which("wrk") else "aiohttp client loop"
        pinned = "servers on core 1, load on core 0" if SERVER_CORE else "not pinned"
        print(f"load: {tool}, {args.connections} connections, {args.seconds:g}s per cell, {pinned}")
        for name in filter(None, args.sizes.split(",")):
            # Warm every cache with this size's URLs (nginx's min_uses 2 stores on the second
            # request), just before they are measured.
            for url in caches.values():
                for path in [f"/{name}"] + [f"/{name}/{i}" for i in range(URLS)]:
                    for _ in range(2):
                        wait_ready(url + path)
            for many in (False, True):
                label = f"{name} body, {URLS:,} URLs" if many else f"{name} body, one URL"
                path = f"/{name}"
                picker = script if many else None
                runs: dict[str, list[tuple[float, float, float]]] = {t: [] for t in caches}
                before = origin_count(origin)
                disk_before = disk_hits(ports) if args.disk else (0, 0)
                # Round robin over the servers, run after run: a machine that slows down for
                # a while slows every server's runs alike, and the median drops it.
                for _ in range(args.runs):
                    for target, url in caches.items():
                        runs[target].append(
                            measure(url + path, args.seconds, args.connections, picker)
                        )
                fetched = origin_count(origin) - before
                disk_share = ""
                if args.disk:
                    hits, from_disk = (
                        b - a for a, b in zip(disk_before, disk_hits(ports), strict=True)
                    )
                    disk_share = f" ({from_disk / max(1, hits):.0%} of its hits from disk)"
                if fetched:
                    print(f"  (the origin saw {fetched} requests: not all hits)")
                results = {t: median(r) for t, r in runs.items()}
                reference = results["minimal aiohttp cache (reference)"][0]
                varnish = results.get("varnish (malloc)", (0.0,))[0]
                baseline = results.get(BASELINE, (0.0,))[0]
                print(f"\n  {label}:")
                for target, (rps, _, p99) in results.items():
                    peer = f", x{rps / varnish:.2f} of varnish" if varnish else ""
                    if baseline and target == "onehit":
                        peer += f", x{rps / baseline:.3f} of the baseline"
                    if target == DISK:
                        nginx = results.get("nginx proxy_cache", (0.0,))[0]
                        peer += (f", x{rps / nginx:.2f} of nginx" if nginx else "") + disk_share
                    print(f"    {target:38s} {rps:>10,.0f} req/s  p99 {p99:7.2f} ms  "
                          f"x{rps / reference:.2f} of the reference{peer}")  # fmt: skip
        print("\n  the miss path's floor (no cache), 1k body, one URL:")
        for target, url in floors.items():
            rps, _, p99 = measure(f"{url}/1k", args.seconds, args.connections)
            print(f"    {target:38s} {rps:>10,.0f} req/s  p99 {p99:7.2f} ms")
        if shutil.which("wrk") and not args.no_misses:
            by_url = {f"http://127.0.0.1:{ports[name]}": pid for name, pid in pids.items()}
            misses(origin, {**floors, **caches}, by_url, args, script.parent)


def misses(
    origin: str,
    servers: dict[str, str],
    pids: dict[str, int],  # by server URL
    args: argparse.Namespace,
    scripts: Path,
) -> None:
    """Every request for a URL never asked before: misses/s under load, the server's CPU time
    per miss under that load, and the p50 one connection sees, beside the origin's own; runs
    taken round robin, as for hits."""
    print(f"\n  misses, 1k body, a new URL every request (median of {args.runs}):")
    loaded: dict[str, list[tuple[float, float, float]]] = {t: [] for t in servers}
    alone: dict[str, list[tuple[float, float, float]]] = {t: [] for t in servers}
    cpu: dict[str, list[float]] = {t: [] for t in servers}
    for _ in range(args.runs):
        for target, url in servers.items():
            before = origin_count(origin)
            for connections, into in ((args.connections, loaded), (1, alone)):
                script = scripts / f"new-{uuid.uuid4().hex}.lua"
                script.write_text(NEW_URLS_LUA.format(prefix=script.stem))
                spent = cpu_seconds(pids[url])
                into[target].append(measure(url + "/1k", args.seconds, connections, script))
                if into is loaded:
                    spent = cpu_seconds(pids[url]) - spent
                    cpu[target].append(spent / (loaded[target][-1][0] * args.seconds))
            fetched = origin_count(origin) - before
            served = (loaded[target][-1][0] + alone[target][-1][0]) * args.seconds
            if fetched < 0.95 * served:
                print(f"  ({target}: the origin saw {fetched:,} of ~{served:,.0f}: not all misses)")
    p50 = {t: median([r[1] for r in runs]) for t, runs in alone.items()}
    floor = next(iter(p50.values()))
    for target in servers:
        rps, _, p99 = median(loaded[target])
        per_miss = median(cpu[target]) * 1e6
        print(
            f"    {target:38s} {rps:>10,.0f} misses/s  CPU {per_miss:5.0f} us/miss  "
            f"p99 {p99:7.2f} ms;  one connection: "
            f"p50 {p50[target]:.3f} ms, {p50[target] - floor:+.3f} ms over the origin"
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, rest = sys.argv[2], sys.argv[3:]
        if role == "origin":
            serve_origin(int(rest[0]))
        elif role == "passthrough":
            serve_passthrough(int(rest[0]), rest[1])
        elif role == "mini":
            serve_mini_cache(int(rest[0]), rest[1])
        elif role == "client":
            client_load(rest[0], float(rest[1]), int(rest[2]))
    else:
        main()
