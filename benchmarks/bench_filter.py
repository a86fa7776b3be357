"""Bloom filter speed and accuracy on 1,000,000 URL-like keys.

Prints ops/s of BloomFilter.add, `in`, and WindowedBloomFilter.seen_before (all compiled), each
as a ratio to a Python ``set`` doing the same job in the same run and to rbloom (a Rust Bloom
filter; ``pip install -e '.[bench]'``), plus the measured false-positive rate and bits per key.
Every operation is driven the same way (``map`` over the keys), so the ratios compare the
filters, not the loops.

    .venv/bin/python benchmarks/bench_filter.py [--keys N] [--fp-rate P]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat

from proxy.core.bloom import BloomFilter
from proxy.core.window import WindowedBloomFilter


def rate(fn: Callable[..., object], keys: Iterable[str], n: int, *more: Iterable) -> float:
    """Calls per second of ``fn`` over ``keys`` (best of three passes)."""
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        deque(map(fn, keys, *more), maxlen=0)
        best = min(best, time.perf_counter() - started)
    return n / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--fp-rate", type=float, default=0.01)
    args = parser.parse_args()
    n, p = args.keys, args.fp_rate
    keys = [f"https://cdn.example.com/assets/{i:08d}/image.jpg?v={i % 97}" for i in range(n)]
    absent = [f"https://cdn.example.com/missing/{i:08d}.css" for i in range(n)]

    reference: set[str] = set()
    set_add = rate(reference.add, keys, n)
    set_in = rate(reference.__contains__, keys, n)

    bf = BloomFilter(n, p)
    bf_add = rate(bf.add, keys, n)
    bf_in = rate(bf.__contains__, keys, n)
    bf_absent = rate(bf.__contains__, absent, n)
    measured_fp = sum(k in bf for k in absent) / n

    window = WindowedBloomFilter(n, p, window=3600.0, generations=2)
    seen = window.seen_before
    # every key new: test + record; then every key present in the newest generation
    wb_first = n / _once(lambda: deque(map(seen, keys, repeat(0.0)), maxlen=0))
    wb_again = rate(seen, keys, n, repeat(0.0))
    window_fp = sum(window.contains(k, 0.0) for k in absent) / n

    print(f"keys: {n:,}  target fp rate: {p}  (ratios are to a Python set in this run)")
    rows = [
        ("set.add (reference)", set_add, set_add),
        ("set in (reference)", set_in, set_in),
        ("BloomFilter.add", bf_add, set_add),
        ("BloomFilter in (present)", bf_in, set_in),
        ("BloomFilter in (absent)", bf_absent, set_in),
        ("WindowedBloomFilter.seen_before (new key)", wb_first, set_add),
        ("WindowedBloomFilter.seen_before (repeat)", wb_again, set_add),
    ]
    rows += _rbloom_rows(keys, n, p, set_add, set_in)
    for name, ops, ref in rows:
        print(f"  {name:44s} {ops:>12,.0f} ops/s  {1e6 / ops:6.2f} us/op  x{ops / ref:.2f} of set")
    rb = {name: ops for name, ops, _ in rows if name.startswith("rbloom")}
    if rb:
        both = rb["rbloom test-and-add (in, then add)"]
        print(
            f"  seen_before against rbloom's test-and-add: new key x{wb_first / both:.2f}, "
            f"repeat x{wb_again / both:.2f}; BloomFilter.add x{bf_add / rb['rbloom.add']:.2f} "
            "of rbloom.add"
        )
    theory = -math.log(p) / math.log(2) ** 2
    print(f"  BloomFilter bits/key {bf.size_bits / n:.2f} (theory {theory:.2f}), k={bf.num_hashes}")
    print(f"  BloomFilter measured fp rate {measured_fp:.4%} (target {p:.2%})")
    stats = window.stats()
    print(
        f"  Windowed (g=2) measured fp rate {window_fp:.4%}, bits/key "
        f"{stats.memory_bytes * 8 / n:.2f} over both generations, set memory for comparison "
        f"~{(len(reference) * 8 * 1.5 + sum(map(len, keys)) + 49 * n) / n:.0f} bytes/key"
    )


def _once(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _rbloom_rows(keys: list[str], n: int, p: float, set_add: float, set_in: float) -> list:
    try:
        from rbloom import Bloom
    except ImportError:
        print("  (rbloom not installed: pip install -e '.[bench]' to compare with a Rust filter)")
        return []
    rb = Bloom(n, p)
    fresh = Bloom(n, p)

    def test_and_add(key: str) -> bool:
        present = key in fresh
        fresh.add(key)
        return present

    return [
        ("rbloom.add", rate(rb.add, keys, n), set_add),
        ("rbloom in", rate(rb.__contains__, keys, n), set_in),
        ("rbloom test-and-add (in, then add)", n / _once(lambda: deque(map(test_and_add, keys), 0)),
         set_add),
    ]  # fmt: skip


if __name__ == "__main__":
    main()
