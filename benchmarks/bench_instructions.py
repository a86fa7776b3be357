"""The instructions a server runs per cache miss, counted by valgrind: a figure that does not
move with the machine's load, unlike time.

On a shared 2-core VM, time per miss swings by 15% or more between identical runs, which hides
the 2-5% that most single changes to the miss path are worth. Instructions retired in user
space do not swing: the same build gives the same count to within 0.2%. They leave out the
kernel's share (the socket calls, the same for every build of one design) and say nothing of
cache misses or stalls, so they rank changes to the code, and time still judges the whole.

Each server runs under ``valgrind --tool=callgrind`` twice, answering ``--small`` and then
``--large`` sequential keep-alive GETs of URLs never asked before (after a warm-up), and the
difference of the two counts over the difference of requests is its count per miss (start-up
and shutdown cancel out). Servers: onehit (asyncio's loop, admission ``always``, so every miss
is also stored, as a second sighting is); optionally onehit from another checkout
(``--baseline DIR``, an earlier commit); and a minimal aiohttp pass-through (no cache: a
``web.Server`` handler fetching through a ``ClientSession``), the reference. The origin runs
outside valgrind and answers 1 KiB bodies. Needs ``valgrind``; takes about 2 minutes a server.
``--post``: each request is instead a POST with a 1 KiB body, which no cache stores: the
pass-through path (unsafe methods, uploads), against the same reference forwarding it.
``--hits``: each request is a GET of one stored URL (a plain fresh hit, on the compiled path
after the first), against a minimal aiohttp cache (a dict in a ``web.Server`` handler).
``--disk-hits``: GETs of two stored URLs in turn, onehit's memory tier holding only one of
them and its disk tier both: every request a hit from disk (compiled, from the page cache),
against the same minimal cache. ``--whatif 0,0.01,1``: onehit once per what-if sample
(``[whatif] sample``) instead of at its default, for what the ghosts cost a request (with
``--hits``, one URL: at 0.01 it is outside the sample, so that run costs the check alone, and
at 1 every hit is recorded). ``--log``: onehit a second time with its access log on (its
shipped ``combined`` format and buffering, to a file), for what a line costs a request.

    .venv/bin/python benchmarks/bench_instructions.py [--baseline DIR] [--post | --hits |
        --disk-hits] [--whatif RATES] [--log]
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import sys
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path

from bench_proxy import spawn, wait_ready

from loadgen.live.processes import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def misses(port: int, count: int, post: bool = False, hits: bool | str = False) -> None:
    """``count`` sequential GETs (``post``: POSTs of 1 KiB), each of a URL never asked before
    (``hits``: all of one URL, stored by the warm-up's; "disk": two such URLs in turn), on one
    connection."""
    tag = uuid.uuid4().hex[:8]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    method, upload = ("POST", b"u" * 1024) if post else ("GET", None)
    try:
        for i in range(count):
            path = f"/1k/stored-{i % 2}" if hits == "disk" else (
                "/1k/stored" if hits else f"/1k/count-{tag}-{i}")  # fmt: skip
            connection.request(method, path, body=upload)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200 or len(body) != 1024:
                raise RuntimeError(f"a miss got {response.status} with {len(body)} bytes")
    finally:
        connection.close()


def instructions(
    command: list[str],
    cwd: Path,
    port: int,
    count: int,
    warm: int,
    post: bool = False,
    hits: bool | str = False,
) -> int:
    """User-space instructions ``command`` runs from its start to its exit after SIGTERM,
    having answered ``warm`` and then ``count`` misses."""
    with tempfile.TemporaryDirectory(prefix="onehit-callgrind-") as tmp:
        log = Path(tmp) / "valgrind.log"
        valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                    f"--log-file={log}"]  # fmt: skip
        with ExitStack() as stack:
            spawn(stack, *valgrind, *command, cwd=str(cwd))
            wait_ready(f"http://127.0.0.1:{port}/1k/warm-{uuid.uuid4().hex[:8]}", timeout=180)
            misses(port, warm, post, hits)
            misses(port, count, post, hits)
        found = re.search(r"Collected : (\d+)", log.read_text())
        if found is None:
            raise RuntimeError(f"no instruction count in valgrind's log:\n{log.read_text()}")
        return int(found.group(1))


def per_miss(
    command: list[str],
    cwd: Path,
    port: int,
    small: int,
    large: int,
    post: bool = False,
    hits: bool | str = False,
) -> float:
    low = instructions(command, cwd, port, small, 50, post, hits)
    high = instructions(command, cwd, port, large, 50, post, hits)
    return (high - low) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=300, help="misses of the first run")
    parser.add_argument("--large", type=int, default=1300, help="misses of the second run")
    parser.add_argument("--baseline", help="a checkout of onehit to count beside this one")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--post", action="store_true", help="POSTs of 1 KiB instead of GETs")
    kind.add_argument("--hits", action="store_true", help="GETs of one stored URL")
    kind.add_argument("--disk-hits", action="store_true", help="GETs answered from disk")
    parser.add_argument("--whatif", help="what-if samples to run onehit at, like 0,0.01,1")
    parser.add_argument("--log", action="store_true", help="onehit with its access log on too")
    args = parser.parse_args()
    # numpy's OpenBLAS starts a pool of threads that spin waiting for work the proxy never
    # gives them: their instructions follow the wall clock, and swung the counts by 40%.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian/Ubuntu: apt-get install valgrind)")
    if args.large <= args.small:
        sys.exit("--large must be more than --small")
    hits = "disk" if args.disk_hits else args.hits
    what = "POST" if args.post else "disk hit" if args.disk_hits else "hit" if hits else "miss"
    py = sys.executable
    origin_port = free_port()
    origin = f"http://127.0.0.1:{origin_port}"
    servers: dict[str, tuple[list[str], Path, int]] = {}
    samples: list[str | None] = args.whatif.split(",") if args.whatif else [None]
    sources = {
        "onehit" if rate is None else f"onehit whatif={rate}": (ROOT, rate) for rate in samples
    } | ({"onehit@baseline": (Path(args.baseline).resolve(), None)} if args.baseline else {})
    if args.log:
        sources["onehit, access log on"] = (ROOT, None)
    disks = Path(tempfile.mkdtemp(prefix="onehit-bench-disk-"))
    for name, (source, rate) in sources.items():
        port = free_port()
        logged = name.endswith("access log on")
        command = [py, "-m", "proxy", "--origin", origin, "--listen", f"127.0.0.1:{port}",
                   "--admin-listen", f"127.0.0.1:{free_port()}", "--admission", "always",
                   "--cache-size", "1GiB", "--set", f"server.access_log={str(logged).lower()}",
                   "--set", f"server.access_log_file={disks / 'access.log'}",
                   "--set", "server.event_loop=asyncio"]  # fmt: skip
        if rate is not None:
            command += ["--set", f"whatif.sample={rate}"]
        if args.disk_hits:
            # Memory holds one of the two URLs: each request evicts the other to disk.
            command += ["--cache-size", "4KiB", "--set", "cache.max_object_size=2KiB",
                        "--set", f"disk.path={disks / name}", "--set", "disk.policy=always",
                        "--set", "disk.size=64MiB"]  # fmt: skip
        servers[name] = (command, source, port)
    port = free_port()
    reference_name = "minimal aiohttp cache (reference)" if hits else (
        "aiohttp pass-through (reference)")  # fmt: skip
    servers[reference_name] = (
        [py, str(HERE / "bench_proxy.py"), "--role", "mini" if hits else "passthrough",
         str(port), origin],
        ROOT,
        port,
    )  # fmt: skip
    counts: dict[str, float] = {}
    with ExitStack() as stack:
        spawn(stack, py, str(HERE / "bench_proxy.py"), "--role", "origin", str(origin_port))
        wait_ready(f"{origin}/1k/ready")
        for name, (command, cwd, port) in servers.items():
            counts[name] = per_miss(command, cwd, port, args.small, args.large, args.post,
                                    hits)  # fmt: skip
            print(f"{name}: {counts[name]:,.0f} instructions per {what}", flush=True)
    reference = counts[reference_name]
    print(f"\n{'server':36} {'instructions/' + what:>18} {'x reference':>12}")
    for name, count in counts.items():
        print(f"{name:36} {count:18,.0f} {count / reference:12.2f}")


if __name__ == "__main__":
    main()
