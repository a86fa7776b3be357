"""Slices of a large object: what a Range of 1 MiB from a cold 512 MiB video costs the origin
and the cache, beside nginx with and without its slice module, in one run.

The origin is nginx serving a 512 MiB file of random bytes from disk (Range, ETag and
Last-Modified as a real static origin sends them, and ``Cache-Control: max-age=3600``: the file
is new, so the heuristic freshness of its Last-Modified would be seconds), logging the bytes it
sends. In front of it, each a separate process with an empty cache, every one storing what it
fetches:

* onehit without slices (``[admission] policy = "always"``): the object is over its
  ``max_object_size``, so it is streamed from its first byte until the range is out;
* onehit with ``[cache] slice_size = "1MiB"``;
* the same with a disk tier behind 2 MiB of memory, so that its warm answers read the slices
  from the disk tier's region files (the page cache warm, as nginx's are);
* nginx ``proxy_cache`` with ``slice 1m`` (its documented recipe: the slice range in the key
  and sent to the origin);
* nginx ``proxy_cache`` without ``slice``: it fetches the whole object to store it.

For each: the cold request's time, the origin's requests and bytes (counted once the origin has
been quiet for a second, so a fetch that goes on after the answer is counted), the bytes
stored, and the median time of the same Range answered warm, over sequential requests on one
connection. Then the median time of a whole GET of a 64 MiB object, warm: what stitching
slices costs a full download (onehit without slices stores it whole: its max object size is
raised to 128 MiB). Every body is checked against the file.

    .venv/bin/python benchmarks/bench_slices.py [--warm 200] [--whole 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from bench_proxy import spawn, wait_ready

from loadgen.live.nginx import main_context, nginx_binary
from loadgen.live.processes import free_port

MIB = 1 << 20
OBJECT = 512 * MIB
FIRST = 300 * MIB + 12345  # a 1 MiB range across two slices, as a player's seek asks
LAST = FIRST + MIB - 1
CLIP = 64 * MIB  # a whole object, downloaded whole: what slicing costs a full GET


def origin_config(root: Path, port: int, files: Path) -> Path:
    path = root / "nginx.conf"
    path.write_text(f"""{main_context(root)}
http {{
    log_format sent '$body_bytes_sent "$http_range"';
    access_log {root}/sent.log sent;
    server {{
        listen 127.0.0.1:{port};
        location / {{ root {files}; expires 1h; }}
    }}
}}
""")
    return path


def cache_config(root: Path, port: int, origin_port: int, sliced: bool) -> Path:
    key = "$uri$slice_range" if sliced else "$uri"
    slicing = "slice 1m; proxy_set_header Range $slice_range;" if sliced else ""
    path = root / "nginx.conf"
    path.write_text(f"""{main_context(root)}
http {{
    access_log off;
    proxy_cache_path {root}/cache levels=1:2 keys_zone=c:32m max_size=2g;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            {slicing}
            proxy_cache c;
            proxy_cache_key {key};
            proxy_cache_valid 200 206 1h;
            proxy_http_version 1.1;
            proxy_pass http://127.0.0.1:{origin_port};
        }}
    }}
}}
""")
    return path


def origin_sent(log: Path, since: int) -> tuple[int, int]:
    """(requests, body bytes) the origin logged past line ``since``, once it has been quiet
    for a second."""
    last = None
    while True:
        lines = log.read_text().splitlines()[since:] if log.exists() else []
        now = (len(lines), sum(int(line.split()[0]) for line in lines))
        if now == last:
            return now
        last = now
        time.sleep(1.0)


def timed_get(
    base: str,
    path: str = "/video.bin",
    asked: str | None = f"bytes={FIRST}-{LAST}",
    connection: http.client.HTTPConnection | None = None,
) -> tuple[float, bytes]:
    """(seconds, body) of one GET of ``path`` (``asked``: its Range, or None)."""
    conn = connection or http.client.HTTPConnection(base.removeprefix("http://"), timeout=120)
    started = time.perf_counter()
    conn.request("GET", path, headers={"Range": asked} if asked else {})
    response = conn.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - started
    if response.status != (206 if asked else 200):
        raise RuntimeError(f"{base}: {response.status} to GET {path} ({asked})")
    if connection is None:
        conn.close()
    return elapsed, body


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=200, help="warm Range requests per target")
    parser.add_argument("--whole", type=int, default=10, help="warm whole GETs per target")
    args = parser.parse_args()
    nginx = nginx_binary()
    if nginx is None:
        sys.exit("nginx not found (apt-get install nginx): it is the origin here")
    here = str(Path(__file__).resolve().parents[1])
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="onehit-slices-"))
        stack.callback(shutil.rmtree, work, True)
        files = work / "files"
        files.mkdir()
        (files / "ready.txt").write_text("ready")
        with open(files / "video.bin", "wb") as out:
            for _ in range(OBJECT // (8 * MIB)):
                out.write(os.urandom(8 * MIB))
        expected = (files / "video.bin").read_bytes()[FIRST : LAST + 1]
        (files / "clip.bin").write_bytes(os.urandom(CLIP))
        origin_port = free_port()
        origin_root = work / "origin"
        origin_root.mkdir()
        spawn(stack, nginx, "-c", str(origin_config(origin_root, origin_port, files)),
              "-p", str(origin_root))  # fmt: skip
        log = origin_root / "sent.log"
        wait_ready(f"http://127.0.0.1:{origin_port}/ready.txt")
        targets: dict[str, tuple[str, str | Path]] = {}
        memory = ("--cache-size", "1GiB", "--set", "cache.max_object_size=128MiB")
        sliced = ("--set", "cache.slice_size=1MiB")
        # Memory for one slice only: the two slices a Range spans are read from the disk.
        on_disk = ("--cache-size", "2MiB", "--set", "cache.max_object_size=1MiB", *sliced,
                   "--set", f"disk.path={work / 'disk'}", "--set", "disk.size=1GiB",
                   "--set", "disk.policy=always")  # fmt: skip
        onehits = {"onehit": memory, "onehit slice_size=1MiB": (*memory, *sliced),
                   "onehit slices, on disk": on_disk}  # fmt: skip
        for label, settings in onehits.items():
            port, admin = free_port(), free_port()
            spawn(stack, sys.executable, "-m", "proxy", "--origin",
                  f"http://127.0.0.1:{origin_port}", "--listen", f"127.0.0.1:{port}",
                  "--admin-listen", f"127.0.0.1:{admin}", "--admission", "always",
                  "--set", "server.access_log=false", *settings, cwd=here)  # fmt: skip
            wait_ready(f"http://127.0.0.1:{admin}/healthz")
            targets[label] = (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}/stats")
        for label, sliced in (("nginx slice 1m", True), ("nginx proxy_cache", False)):
            root = work / label.replace(" ", "-")
            root.mkdir()
            port = free_port()
            config = cache_config(root, port, origin_port, sliced)
            spawn(stack, nginx, "-c", str(config), "-p", str(root))
            wait_ready(f"http://127.0.0.1:{port}/ready.txt")
            targets[label] = (f"http://127.0.0.1:{port}", root / "cache")
        print(f"a Range of 1 MiB (bytes {FIRST}-{LAST}) from a cold {OBJECT // MIB} MiB object")
        rows = {}
        for label, (base, stored_at) in targets.items():
            since = len(log.read_text().splitlines()) if log.exists() else 0
            cold, body = timed_get(base)
            if body != expected:
                raise RuntimeError(f"{label}: the body is not the file's bytes")
            requests, sent = origin_sent(log, since)
            if isinstance(stored_at, Path):
                stored = dir_bytes(stored_at)
            else:
                with urllib.request.urlopen(stored_at) as r:
                    stats = json.load(r)
                disk = stats["disk"]  # what the disk tier wrote, records' heads included
                stored = (
                    stats["metrics"]["bytes_written"] if disk is None else disk["bytes_written"]
                )
            conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=120)
            warm = statistics.median(timed_get(base, connection=conn)[0] for _ in range(args.warm))
            conn.close()
            rows[label] = (cold, requests, sent, stored, warm)
        reference = rows["nginx slice 1m"]
        print(f"  {'':24s} {'cold':>8s} {'origin requests':>16s} {'origin bytes':>14s} "
              f"{'stored':>12s} {'warm p50':>9s}  (x nginx slice: origin bytes, warm)")  # fmt: skip
        for label, (cold, requests, sent, stored, warm) in rows.items():
            print(f"  {label:24s} {cold * 1e3:6.0f}ms {requests:16d} {sent / MIB:10.1f} MiB "
                  f"{stored / MIB:8.1f} MiB {warm * 1e3:7.2f}ms  "
                  f"x{sent / reference[2]:.2f}, x{warm / reference[4]:.2f}")  # fmt: skip

        print(f"\na whole GET of a {CLIP // MIB} MiB object, warm (the first two GETs store it)")
        clip = (files / "clip.bin").read_bytes()
        times = {}
        for label, (base, _) in targets.items():
            conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=120)
            for _ in range(2):
                timed_get(base, "/clip.bin", None, conn)
            runs = []
            for _ in range(args.whole):
                seconds, body = timed_get(base, "/clip.bin", None, conn)
                if body != clip:
                    raise RuntimeError(f"{label}: the body is not the file's bytes")
                runs.append(seconds)
                del body  # a client that kept every body would time its own page faults
            conn.close()
            times[label] = statistics.median(runs)
        for label, seconds in times.items():
            print(f"  {label:24s} {seconds * 1e3:7.1f}ms  {CLIP / seconds / 1e9:5.2f} GB/s  "
                  f"x{seconds / times['nginx slice 1m']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
