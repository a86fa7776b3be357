"""Simulator throughput: requests per second through the real cache core.

Replays one Zipf trace (2,000,000 requests by default) at 1% cache with plain LRU and with
second-hit, and prints requests/s beside two references measured in the same run: a minimal
OrderedDict LRU over the same requests (the least a Python simulator can do per request) and the
bare loop over the trace. Then it splits where the second-hit run's time goes.

    .venv/bin/python benchmarks/bench_simulate.py [--requests N]
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict

from loadgen.simulate import simulate
from loadgen.trace import Trace
from loadgen.workload import WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig
from proxy.core.engine import RequestMeta
from proxy.core.store import Entry, LRUStore
from proxy.core.window import WindowedBloomFilter


def bare_loop(trace: Trace) -> float:
    """The loop every driver runs: walk the trace and build each request."""
    rows = list(zip(trace.times.tolist(), trace.key_strings(), trace.sizes.tolist(), strict=True))
    started = time.perf_counter()
    for _now, key, _size in rows:
        RequestMeta(key)
    return time.perf_counter() - started


def ordered_dict_lru(trace: Trace, capacity: int) -> tuple[float, int]:
    keys, sizes = trace.key_strings(), trace.sizes.tolist()
    started = time.perf_counter()
    cache: OrderedDict[str, int] = OrderedDict()
    used = hits = 0
    for key, size in zip(keys, sizes, strict=True):
        if key in cache:
            cache.move_to_end(key)
            hits += 1
            continue
        while used + size > capacity:
            used -= cache.popitem(last=False)[1]
        cache[key] = size
        used += size
    return time.perf_counter() - started, hits


def store_alone(trace: Trace, capacity: int) -> float:
    """The LRU run's store work by itself: a get per request, an Entry and a put per miss."""
    keys, sizes = trace.key_strings(), trace.sizes.tolist()
    store = LRUStore(capacity)
    get, put = store.get, store.put
    started = time.perf_counter()
    for key, size in zip(keys, sizes, strict=True):
        if get(key) is None:
            put(Entry(key, size, 0.0))
    return time.perf_counter() - started


def filter_alone(keys: list[str], capacity: int) -> float:
    window = WindowedBloomFilter(capacity, 0.01, 3600.0, 2)
    seen = window.seen_before
    started = time.perf_counter()
    for key in keys:
        seen(key, 0.0)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_000_000)
    args = parser.parse_args()
    trace = generate(WorkloadSpec(objects=200_000, requests=args.requests, one_hit_share=0.25))
    n = len(trace)
    capacity = round(trace.distinct_bytes() * 0.01)

    loop = bare_loop(trace)
    ref_time, ref_hits = ordered_dict_lru(trace, capacity)
    # Body bytes only (entry_overhead=0), like the OrderedDict reference it is checked against.
    lru = simulate(trace, capacity, AdmissionConfig(policy="always"), entry_overhead=0)
    sh = simulate(trace, capacity, AdmissionConfig(policy="second-hit"), entry_overhead=0)
    assert lru.stats["hits"] == ref_hits, "the simulator's LRU disagrees with the reference"

    print(f"trace: {n:,} requests, cache 1% of distinct bytes; one process, one core")
    rows = [
        ("bare loop over the trace (reference)", loop),
        ("OrderedDict LRU (reference)", ref_time),
        ("onehit simulate, always (LRU)", lru.elapsed),
        ("onehit simulate, second-hit(auto)", sh.elapsed),
    ]
    for name, seconds in rows:
        print(
            f"  {name:40s} {n / seconds:>11,.0f} req/s  {1e6 * seconds / n:5.2f} us/req  "
            f"x{ref_time / seconds:.2f} of OrderedDict LRU"
        )
    store = store_alone(trace, capacity)
    print(
        f"  where LRU's time goes: the bare loop {loop / lru.elapsed:.0%}, the store (cachetools "
        f"LRU, entries, eviction accounting) {store / lru.elapsed:.0%}, the engine's rules and "
        f"counters the other {1 - (loop + store) / lru.elapsed:.0%}"
    )
    misses = int(sh.stats["misses"])
    miss_keys = trace.key_strings()[:misses]
    per_call = filter_alone(miss_keys, misses) / misses
    print(
        f"  where second-hit's time goes: {misses:,} misses call the filter "
        f"(~{1e6 * per_call:.2f} us each, {per_call * misses / sh.elapsed:.0%} of the run); "
        f"the bare loop is {loop / sh.elapsed:.0%}; the rest is the engine and the store"
    )


if __name__ == "__main__":
    main()
