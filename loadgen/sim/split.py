"""``simulate --workers-split N``: what N worker processes cost a cache, requests spread at
random over them as the kernel spreads connections.

Rules this module keeps:

* Each request goes to one of N caches, drawn uniformly and independently (seeded): with
  SO_REUSEPORT and a new connection per request, that is how the kernel spreads them.
* Each worker has its own store, of the cache size divided by N (``memory="divided"``, one
  machine's RAM) or of the whole size each (``memory="each"``, N times the RAM).
* ``window="private"``: each worker has its own admission policy, as ``--workers`` had before
  the workers shared a window. ``window="shared"``: second hit's window is the live one, in
  memory all the workers' policies map (``make_policy(shared=...)``, as ``proxy.ops.machine``
  shares it), recorded in the order the requests arrive; a policy without a window (or one
  whose state is its store's, like tinylfu) stays per worker either way.
* The loop is the compiled one of ``loadgen.sim.simulate``, driven over each run of consecutive
  requests that go to one worker; the counters are the workers' summed.
"""

from __future__ import annotations

import mmap
import time

import numpy as np

from loadgen.sim.simulate import SimResult, build_engine, key_arrays, policy_label
from loadgen.traces.trace import Trace
from proxy.core.admission import AdmissionConfig, shared_window_size
from proxy.core.replay import replay
from proxy.core.stats import combine
from proxy.core.store import ENTRY_OVERHEAD

WINDOWS = ("private", "shared")
MEMORIES = ("divided", "each")


def simulate_split(
    trace: Trace,
    cache_bytes: int,
    admission: AdmissionConfig,
    workers: int,
    *,
    window: str = "shared",
    memory: str = "divided",
    seed: int = 1,
    max_object_bytes: int | None = None,
    entry_overhead: int = ENTRY_OVERHEAD,
    eviction: str = "lru",
) -> SimResult:
    """``trace`` through ``workers`` caches (see the module's rules); one worker is one cache."""
    if window not in WINDOWS or memory not in MEMORIES:
        raise ValueError(f"window is one of {WINDOWS} and memory one of {MEMORIES}")
    each = cache_bytes // workers if memory == "divided" else cache_bytes
    size = shared_window_size(admission) if window == "shared" else 0
    machine = mmap.mmap(-1, size) if size else None
    engines = [
        build_engine(each, admission, max_object_bytes, entry_overhead, eviction, shared=machine)
        for _ in range(workers)
    ]
    route = np.random.default_rng(seed).integers(0, workers, len(trace))
    keys = key_arrays(trace, "")
    times = np.ascontiguousarray(trace.times, dtype=np.float64)
    sizes = np.ascontiguousarray(trace.sizes, dtype=np.int64)
    cuts = np.flatnonzero(np.diff(route)) + 1
    starts, stops = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(trace)]))
    started = time.perf_counter()
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        w = int(route[start])
        replay(engines[w], keys, times, sizes, start, stop)
    elapsed = time.perf_counter() - started
    stats = combine([e.stats() for e in engines], shared_filter=machine is not None)
    label = f"{policy_label(admission, eviction)} x{workers} {window} window, memory {memory}"
    return SimResult(label, cache_bytes, admission, len(trace), stats, elapsed, eviction=eviction)


def split_table(
    trace: Trace, cache_bytes: int, admission: AdmissionConfig, workers: int, seed: int = 1
) -> str:
    """One cache against ``workers`` caches (private and shared windows, memory divided and
    each): hit ratio and bytes written, the latter as a share of one cache's."""
    rows = [("one cache", simulate_split(trace, cache_bytes, admission, 1, window="private"))]
    for memory in MEMORIES:
        for window in WINDOWS:
            result = simulate_split(
                trace, cache_bytes, admission, workers, window=window, memory=memory, seed=seed
            )
            rows.append((f"{workers} workers, {window} window, memory {memory}", result))
    one = rows[0][1].stats["bytes_written"] or 1
    lines = [f"{'':46} {'hit ratio':>9} {'bytes written vs one':>21}"]
    for name, result in rows:
        s = result.stats
        lines.append(f"{name:46} {s['hit_ratio']:>9.4f} {s['bytes_written'] / one:>21.2f}")
    return "\n".join(lines)
