"""What a hit costs onehit as operators run it, beside nginx ``proxy_cache`` in the same run:
CPU-seconds of the server's processes (``/proc``) per request, the access log on in both, then
off in both.

Cells: bodies of 1 KiB, 16 KiB, 64 KiB and 1 MiB, hit from memory (100 URLs, a memory tier that
holds them all) and from the disk tier (onehit's memory tier a few MiB, its disk holding every
URL: 2,000 URLs, 200 of 1 MiB; nginx's cache is always on disk, the page cache warm). Each
server (all its processes: nginx's master, worker and cache processes; onehit's parent and
workers) is pinned to the second core, ``wrk`` (one thread, 32 connections, URLs at
random) to the first. With the log on, both write it to a file: onehit its shipped ``combined``
format (its shipped buffering), nginx its default ``combined`` log (unbuffered, nginx's
default). With it off, the 1 KiB memory cell also runs nginx answering 1 KiB with ``return
200`` from its configuration (no cache at all: the ceiling), printed last. Before each cell
every URL is asked three times; then the cell runs ``--seconds`` of load. Printed per cell:
microseconds of CPU per request for each server, and nginx's over onehit's (its efficiency
beside nginx: above 1, onehit spends less). onehit's share of hits from disk (its /stats) is
printed beside the disk cells, counted over the load alone. A cell whose load saw an answer
other than 2xx, or whose onehit lost or gained a process under it, stops the bench.
``--baseline DIR``: onehit from another checkout too (its compiled modules built in place),
and this checkout's cost over it. ``--sizes``, ``--sources`` and ``--logs`` pick cells.
``--repeat K`` runs each cell K times and prints the medians (of the µs, and of each run's
ratios). ``--workers N`` runs onehit with ``--workers N`` (every process on the server's core:
the CPU of all of them counts), and one process in the same cell beside it: the workers' cost
over one process's (that one process with the workers' settings: the memory cells'
``[cache] size`` is then such that a worker's share holds every URL); nginx then runs as many
worker processes (each with a ``reuseport`` socket of its own, as onehit's workers have, so
the kernel spreads connections over all of them), and one beside them, so its cost of more
processes on one core is printed beside onehit's; its ``return 200`` runs as many.
``--set cache.eviction=auto`` (repeatable) sets this checkout's onehit otherwise in every
cell: beside ``--baseline`` the same checkout, what a setting costs.

    .venv/bin/python benchmarks/bench_hit_cost.py [--seconds 5] [--baseline /tmp/before]
        [--sizes 1k,64k] [--sources memory,disk] [--logs on,off] [--repeat 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from statistics import median

from aiohttp import web
from bench_one_cache import child_pids, cpu_seconds

from loadgen.live.nginx import main_context, nginx_binary
from loadgen.live.processes import free_port

HERE = Path(__file__).resolve().parent
SIZES = {"1k": 1024, "16k": 16 << 10, "64k": 64 << 10, "1m": 1 << 20}
SERVER_CORE, LOAD_CORE = ("taskset", "-c", "1"), ("taskset", "-c", "0")


def cells(workers: int = 1) -> list[tuple[str, str, int, list[str]]]:
    """(size name, source, URLs, onehit's settings) of each cell, for ``workers`` processes:
    in the memory cells each one's memory holds every URL (128 MiB, a worker's share of
    ``[cache] size`` being size / 4N beside the tier in ``/dev/shm``)."""
    memory = 256 if workers == 1 else 128 * 4 * workers
    out = []
    for name, size in SIZES.items():
        out.append((name, "memory", 100, [f"cache.size={memory}MiB",
                                          "cache.max_object_size=2MiB"]))  # fmt: skip
        small = ["cache.size=1MiB"] if size < 1 << 20 else [
            "cache.size=4MiB", "cache.max_object_size=2MiB"]  # fmt: skip
        disk = [*small, "disk.size=512MiB", "disk.region_size=16MiB", "disk.policy=always"]
        out.append((name, "disk", 2000 if size < 1 << 20 else 200, disk))
    return out


async def origin(port: int) -> web.AppRunner:
    """``/SIZE/N``: a body of SIZE bytes, fresh for an hour."""

    async def body(request: web.Request) -> web.Response:
        size = SIZES[request.match_info["size"]]
        return web.Response(body=b"x" * size, headers={"Cache-Control": "max-age=3600"})

    app = web.Application()
    app.router.add_get("/{size}/{n}", body)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def wait_listening(port: int) -> None:
    for _ in range(300):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


async def warm(port: int, prefix: str, urls: int) -> None:
    """Every URL asked three times (stored on its second sighting, hit on the third)."""
    loop = asyncio.get_running_loop()

    def ask() -> None:
        for _ in range(3):
            for i in range(urls):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{prefix}{i}") as r:
                    r.read()

    await loop.run_in_executor(None, ask)


async def load(port: int, prefix: str, urls: int, seconds: float) -> int:
    """Requests ``wrk`` made in ``seconds``, each to one of ``urls`` URLs at random."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f'request = function() return wrk.format(nil, "{prefix}" .. '
                      f"math.random(0, {urls - 1})) end\n")  # fmt: skip
    try:
        process = await asyncio.create_subprocess_exec(
            *LOAD_CORE, "wrk", "-t1", "-c32", f"-d{seconds:g}s", "-s", str(script),
            f"http://127.0.0.1:{port}", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        out = (await asyncio.wait_for(process.communicate(), seconds + 30))[0].decode()
    finally:
        script.unlink()
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw answers that were not hits:\n{out}")
    return int(out.split(" requests in ")[0].split()[-1])


async def measure(
    pids: list[int], port: int, prefix: str, urls: int, seconds: float, parent: int | None = None
) -> float:
    """Microseconds of CPU the processes ``pids`` spent per request under load; with
    ``parent``, its processes must be the same at the end (a worker replaced under load would
    take its CPU with it). nginx's cache loader leaves a minute after the start, its CPU next
    to none: nginx is not held to it."""
    before = cpu_seconds(pids)
    requests = await load(port, prefix, urls, seconds)
    spent = cpu_seconds(pids) - before
    if parent is not None and sorted([parent, *child_pids(parent)]) != sorted(pids):
        raise RuntimeError("the server's processes changed under load: its CPU is not all here")
    return spent / requests * 1e6


def hits(admin: int) -> tuple[int, int]:
    """onehit's hits so far, and those from the tier behind memory (summed over workers)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats") as r:
        stats = json.load(r)
    metrics = stats["metrics"] if "metrics" in stats else stats["sum"]
    return metrics["hits"], metrics["hits_from_disk"]


async def onehit_cost(
    cwd: Path,
    origin_url: str,
    settings: list[str],
    prefix: str,
    urls: int,
    seconds: float,
    log: bool,
    workers: int = 1,
) -> tuple[float, float]:
    """onehit (from the checkout ``cwd``, its access log on or off, ``workers`` processes
    serving the port): CPU µs per request of all its processes, and its share of hits from
    disk (with workers, from the tier behind each worker's memory)."""
    work = Path(tempfile.mkdtemp(prefix="onehit-bench-hit-"))
    port, admin = free_port(), free_port()
    sets = [*settings, f"server.access_log={str(log).lower()}",
            f"server.access_log_file={work}/access.log"]  # fmt: skip
    if any(s.startswith("disk.") for s in settings):
        sets.append(f"disk.path={work}/disk")
    flags = [arg for s in sets for arg in ("--set", s)]
    process = subprocess.Popen(
        [*SERVER_CORE, sys.executable, "-m", "proxy", "--origin", origin_url, "--listen",
         f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}", "--workers",
         str(workers), *flags],
        cwd=cwd, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_listening(admin)
        await wait_listening(port)
        pids = [process.pid, *child_pids(process.pid)]
        await warm(port, prefix, urls)
        hit, from_disk = hits(admin)
        per = await measure(pids, port, prefix, urls, seconds, process.pid)
        now_hit, now_from_disk = hits(admin)
        return per, (now_from_disk - from_disk) / max(1, now_hit - hit)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait()
        shutil.rmtree(work, ignore_errors=True)


async def nginx_cost(
    nginx: str,
    origin_url: str,
    prefix: str,
    urls: int,
    seconds: float,
    log: bool,
    returns: bool = False,
    workers: int = 1,
) -> float:
    """nginx ``proxy_cache`` (``workers`` worker processes, its cache on disk, its access log
    to a file or off): CPU µs per request; ``returns``: nginx answering 1 KiB from its
    configuration instead."""
    root = Path(tempfile.mkdtemp(prefix="onehit-bench-nginx-"))
    port = free_port()
    config = root / "nginx.conf"
    location = (f'return 200 "{"x" * 1024}";' if returns else """proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache onehit;
            proxy_cache_min_uses 2;""")  # fmt: skip
    config.write_text(f"""{main_context(root, workers)}
http {{
    access_log {f"{root}/access.log" if log else "off"};
    upstream origin {{ server {origin_url.removeprefix("http://")}; keepalive 64; }}
    proxy_cache_path {root}/cache levels=1:2 keys_zone=onehit:32m max_size=2g;
    server {{
        listen 127.0.0.1:{port}{" reuseport" if workers > 1 else ""};
        location / {{
            {location}
        }}
    }}
}}
""")
    process = subprocess.Popen([*SERVER_CORE, nginx, "-c", str(config), "-p", str(root)],
                               stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        await wait_listening(port)
        pids = [process.pid, *child_pids(process.pid)]
        await warm(port, prefix, urls)
        return await measure(pids, port, prefix, urls, seconds)
    finally:
        process.send_signal(signal.SIGQUIT)
        process.wait()
        shutil.rmtree(root, ignore_errors=True)


def mid(runs: list[dict[str, float]], name: str, over: str | None = None) -> float:
    """The median over ``runs`` of their ``name`` figure, or of its ratio to ``over``."""
    return median([r[name] / (r[over] if over else 1) for r in runs])


async def one_cell(
    args: argparse.Namespace,
    nginx: str,
    origin_url: str,
    prefix: str,
    urls: int,
    settings: list[str],
    log: bool,
    ceiling: bool = False,
) -> dict[str, float]:
    """One run of a cell, each server in turn: CPU µs per hit of ``onehit`` and ``nginx``
    (and of ``baseline``, ``onehit one`` and ``nginx one`` where asked, and with ``ceiling``
    of nginx's ``return 200``), and onehit's share of ``disk hits``."""
    ours, from_disk = await onehit_cost(HERE.parent, origin_url, [*settings, *args.set],
                                        prefix, urls, args.seconds, log,
                                        args.workers)  # fmt: skip
    run = {"onehit": ours, "disk hits": from_disk,
           "nginx": await nginx_cost(nginx, origin_url, prefix, urls, args.seconds, log,
                                     workers=args.workers)}  # fmt: skip
    if args.workers > 1:
        run["onehit one"], _ = await onehit_cost(HERE.parent, origin_url,
                                                 [*settings, *args.set], prefix, urls,
                                                 args.seconds, log)  # fmt: skip
        run["nginx one"] = await nginx_cost(nginx, origin_url, prefix, urls, args.seconds, log)
    if ceiling:
        run["return 200"] = await nginx_cost(nginx, origin_url, prefix, urls, args.seconds,
                                             False, returns=True,
                                             workers=args.workers)  # fmt: skip
    if args.baseline:
        run["baseline"], _ = await onehit_cost(Path(args.baseline), origin_url, settings,
                                               prefix, urls, args.seconds, log,
                                               args.workers)  # fmt: skip
    return run


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--baseline", help="another checkout of onehit to measure beside this")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each cell, their median printed (a cell moves by 10%% between runs)",
    )
    parser.add_argument("--sizes", default=",".join(SIZES), help="of " + ",".join(SIZES))
    parser.add_argument("--sources", default="memory,disk")
    parser.add_argument("--logs", default="on,off", help="the access log on, off, or both")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="onehit's --workers (all pinned to the server's core)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="a setting of this checkout's onehit in every cell (cache.eviction=auto), as "
        "onehit-proxy --set takes it; the baseline runs without",
    )
    args = parser.parse_args()
    nginx = nginx_binary()
    if nginx is None or shutil.which("wrk") is None or shutil.which("taskset") is None:
        raise SystemExit("needs nginx, wrk and taskset (Debian: nginx-light wrk util-linux)")
    port = free_port()
    runner = await origin(port)
    origin_url = f"http://127.0.0.1:{port}"
    sizes, sources = args.sizes.split(","), args.sources.split(",")
    logs = [state == "on" for state in args.logs.split(",")]
    rows = []
    try:
        for log in logs:
            for size, source, urls, settings in cells(args.workers):
                if size not in sizes or source not in sources:
                    continue
                ceiling = (size, source, log) == ("1k", "memory", False)
                runs = [await one_cell(args, nginx, origin_url, f"/{size}/", urls, settings, log,
                                       ceiling)
                        for _ in range(args.repeat)]  # fmt: skip
                rows.append((log, size, source, runs))
    finally:
        await runner.cleanup()
    print(f"\nCPU µs per hit ({args.seconds:g} s of wrk per cell, --workers {args.workers}"
          + (f", the median of {args.repeat} runs: µs and each run's ratio" if args.repeat > 1
             else "") + ")")  # fmt: skip
    head = (f"{'log':>3} {'body':>5} {'from':>7} {'onehit':>9} {'nginx':>9} "
            f"{'nginx/onehit':>13} {'disk hits':>10}")  # fmt: skip
    head += f" {'baseline':>9} {'onehit/baseline':>16}" if args.baseline else ""
    if args.workers > 1:
        head += (f" {'onehit one':>11} {'its workers/one':>16} {'nginx one':>10} "
                 f"{'its workers/one':>16}")  # fmt: skip
    print(head)
    for log, size, source, runs in rows:
        line = (f"{'on' if log else 'off':>3} {size:>5} {source:>7} {mid(runs, 'onehit'):>9.1f} "
                f"{mid(runs, 'nginx'):>9.1f} {mid(runs, 'nginx', 'onehit'):>13.2f}"
                f" {mid(runs, 'disk hits'):>10.0%}")  # fmt: skip
        if args.baseline:
            line += f" {mid(runs, 'baseline'):>9.1f} {mid(runs, 'onehit', 'baseline'):>16.2f}"
        if args.workers > 1:
            line += (f" {mid(runs, 'onehit one'):>11.1f}"
                     f" {mid(runs, 'onehit', 'onehit one'):>16.2f}"
                     f" {mid(runs, 'nginx one'):>10.1f}"
                     f" {mid(runs, 'nginx', 'nginx one'):>16.2f}")  # fmt: skip
        print(line)
    for _, _, _, runs in rows:
        if "return 200" in runs[0]:
            print(f"nginx return 200 (1 KiB, log off): {mid(runs, 'return 200'):.1f}"
                  " µs; onehit's 1 KiB memory hit against it: "
                  f"{mid(runs, 'return 200', 'onehit'):.2f}")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main())
