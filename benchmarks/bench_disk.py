"""The disk tier back in service after a restart: 1,000,000 stored objects, after a clean stop
(the index read back from its checkpoint) and after a crash (the region files scanned).

Fills a disk tier in a temporary directory with ``--objects`` records (``--body`` bytes each)
through ``DiskStore``, as the proxy writes them, then times a fresh ``DiskStore`` opening the
same files:

1. after a clean stop: the checkpoint written on closing is read back, nothing scanned;
2. after ``kill -9`` with no checkpoint since the first write (the worst case: every region
   scanned, each record's checksum verified);
3. after ``kill -9`` half-way through a checkpoint interval: the records since it scanned.

Each start is checked: every object is found again. The issue's goals are 2 s and 10 s.

    .venv/bin/python benchmarks/bench_disk.py [--objects 1000000] [--body 200]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from proxy.config.settings import DiskSection
from proxy.core.events import RequestMeta, ResponseMeta
from proxy.disk.store import DiskStore

STORED = ResponseMeta(cacheable=True, lifetime=3600.0, headers=(("Cache-Control", "max-age=3600"),))


def fill(
    path: Path, objects: int, body: bytes, checkpoint_at: int | None, clean: bool
) -> DiskSection:
    """A disk tier at ``path`` holding ``objects`` records; its index checkpointed after
    ``checkpoint_at`` of them (None: never), then stopped cleanly or left as a crash leaves
    it."""
    section = DiskSection(path=str(path), size=64 << 30, region_size=16 << 20, policy="always")
    store = DiskStore(section)
    now = time.time()
    for i in range(objects):
        key = f"http://bench.example/obj/{i}"
        store.takes(RequestMeta(key), STORED, len(body), True, now)
        store.write(key, STORED, body, now)
        if checkpoint_at is not None and i + 1 == checkpoint_at:
            store.checkpoint()
    if clean:
        store.close()
    else:
        store.log.close()
    return section


def timed_start(section: DiskSection, objects: int) -> tuple[float, DiskStore]:
    started = time.perf_counter()
    store = DiskStore(section)
    elapsed = time.perf_counter() - started
    if len(store.tier) != objects:
        raise RuntimeError(f"{len(store.tier):,} of {objects:,} objects came back")
    return elapsed, store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=200, help="body bytes per object")
    args = parser.parse_args()
    body = b"b" * args.body
    rows = []
    with tempfile.TemporaryDirectory(prefix="onehit-disk-bench-") as tmp:
        for name, checkpoint_at, clean in (
            ("clean stop (checkpoint on close)", None, True),
            ("kill -9, no checkpoint (every region scanned)", None, False),
            ("kill -9 half-way (half scanned)", args.objects // 2, False),
        ):
            path = Path(tmp) / "disk"
            started = time.perf_counter()
            section = fill(path, args.objects, body, checkpoint_at, clean)
            written = time.perf_counter() - started
            elapsed, store = timed_start(section, args.objects)
            stats = store.stats()
            restored, scanned = stats["restored_from_checkpoint"], stats["restored_by_scan"]
            rows.append((name, elapsed, restored, scanned, stats["index_bytes"], written))
            store.log.close()
            shutil.rmtree(path)
            print(f"{name}: back in {elapsed:.2f}s", flush=True)
    print(f"\n{args.objects:,} objects of {args.body} body bytes, regions of 16 MiB")
    heads = f"{'seconds':>8} {'from checkpoint':>16} {'scanned':>10} {'index MiB':>10}"
    print(f"{'restart':48} {heads}")
    for name, elapsed, restored, scanned, index_bytes, _ in rows:
        print(f"{name:48} {elapsed:8.2f} {restored:16,} {scanned:10,} {index_bytes / 2**20:10.1f}")
    print(f"(filling took {rows[0][5]:.0f}s; goals: clean 2 s, kill -9 10 s)")


if __name__ == "__main__":
    main()
