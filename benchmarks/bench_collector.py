"""The garbage collector's pause over a full cache: a full collection with N stored entries.

Every tracked object is visited by each full collection, which stops the event loop: every
request in flight waits. The store keeps its entries (and the dict holding them) out of the
collector's view. This fills an engine with N small entries, as the proxy stores them, then
times full collections of the process's heap (start-up objects frozen, as ``onehit-proxy``
freezes them), against a reference measured in the same run: the same N entries held tracked
in a dict, as any Python container would hold them.

    .venv/bin/python benchmarks/bench_collector.py [--entries N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from proxy.config.settings import load
from proxy.core.events import RequestMeta
from proxy.core.responses import response_meta
from proxy.core.store import Entry
from proxy.ops.service import build_engine

HEADERS = [
    ("Cache-Control", "max-age=3600"),
    ("ETag", '"b1"'),
    ("Content-Type", "application/octet-stream"),
    ("Date", "Mon, 30 Nov 2026 23:06:24 GMT"),
]


def full_collection_ms(rounds: int = 5) -> float:
    """Median milliseconds of a full collection."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()
    n = args.entries
    config = load(
        env={},
        overrides={
            "upstream.origin": "http://127.0.0.1:9",
            "admission.policy": "always",
            "cache.size": "16GiB",
        },
    )
    engine = build_engine(config)
    gc.collect()
    gc.freeze()
    empty = full_collection_ms()
    tracked_empty = len(gc.get_objects())
    now = time.time()
    body = b"x" * 100
    for i in range(n):
        meta = RequestMeta(f"http://cdn.example/obj/{i}", "GET", ())
        response = response_meta(meta, 200, HEADERS, now, now, payload=body)
        decision = engine.on_response_head(meta, response, len(body), now)
        engine.finish(meta, decision, len(body), now, payload=body)
    assert engine.stats()["entries"] == n
    stored = full_collection_ms()
    tracked_stored = len(gc.get_objects())
    # Each as the engine builds one: its own header tuple and parsed directives.
    reference = {
        i: Entry(
            f"http://cdn.example/ref/{i}", len(body), now, 3600.0, 0.0,
            tuple(HEADERS), {"max-age": "3600"}, body,
        )
        for i in range(n)
    }  # fmt: skip
    held = full_collection_ms()
    print(f"entries: {n:,} stored, then {len(reference):,} more held in a dict (the reference)")
    rows = [
        ("empty cache", empty, tracked_empty),
        (f"{n:,} entries stored", stored, tracked_stored),
        (f"+ {n:,} held tracked (reference)", held, len(gc.get_objects())),
    ]
    for name, ms, tracked in rows:
        print(f"  full collection, {name:36s} {ms:8.1f} ms  {tracked:>10,} objects tracked")
    print(
        f"  the stored entries' share of a pause: {max(0.0, stored - empty):.1f} ms, against "
        f"{held - stored:.1f} ms for the same number tracked"
    )


if __name__ == "__main__":
    main()
