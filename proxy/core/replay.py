"""Requests replayed through the compiled loop (``proxy.core._native.simulate_chunk`` and
``simulate_tiers``): a trace's arrays driven through an engine's own store index and compiled
admission, and a disk tier's own index, admission and write budget behind it, counted into
the engine's and the tier's counters. The one driver of that loop: the offline simulator
(``loadgen``) and the proxy's live what-if (``proxy.core.whatif``) both replay through it.

The loop keeps the engine's rules for a cacheable response (see ``simulate.c``), held equal
to the engine's Python rules by ``tests/test_parity.py`` and ``tests/test_tiers.py``.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from proxy.core._native import simulate_chunk, simulate_tiers
from proxy.core.admission import AdmissionConfig, compiled_admission, make_policy
from proxy.core.disk import DiskTier
from proxy.core.engine import CacheEngine
from proxy.core.regions import Regions
from proxy.core.store import ENTRY_OVERHEAD, CacheStore
from proxy.core.ttl_rules import TtlRule, TtlRules, trace_lifetime


def build_engine(
    cache_bytes: int,
    admission: AdmissionConfig,
    max_object_bytes: int | None = None,
    entry_overhead: int = ENTRY_OVERHEAD,
    eviction: str = "lru",
    *,
    shared: mmap.mmap | None = None,
    rate: float = 1.0,
) -> CacheEngine:
    """The engine the proxy would build: same store (charging the same per-entry overhead,
    unless told otherwise, evicting the same way) and the same admission policy (its window
    in ``shared`` memory, as ``--workers`` shares it, when given). With a ``rate`` below 1, the
    engine a spatial sample of that share of the keys runs through (SHARDS): ``rate`` of the
    bytes (never less than one entry's overhead and a byte), admission key counts scaled
    alike (``AdmissionConfig.scaled``), keeping what the full store keeps up to its bytes
    (``CacheStore.sample_of``)."""
    store = CacheStore(cache_bytes, max_object_bytes, entry_overhead, eviction)
    if rate < 1.0:
        full = store
        store = CacheStore(max(1 + entry_overhead, round(cache_bytes * rate)), max_object_bytes,
                           entry_overhead, eviction)  # fmt: skip
        store.sample_of(full)
        admission = admission.scaled(rate)
    return CacheEngine(store, make_policy(admission, store, shared=shared))


def rule_lifetimes(
    ids: np.ndarray, key_of: Callable[[int], str], rules: TtlRules, ttl: float
) -> np.ndarray | None:
    """Each request's lifetime under the operator's TTL ``rules`` (``trace_lifetime``), from
    its key's id (``ids``; ``key_of`` an id's key, asked once per id); None without rules:
    every response lives ``ttl``."""
    if not rules:
        return None
    distinct, back = np.unique(ids, return_inverse=True)
    by_rule: dict[TtlRule | None, float] = {}  # a lifetime is the rule's: judged once each

    def lifetime(rule: TtlRule | None) -> float:
        if rule not in by_rule:
            by_rule[rule] = trace_lifetime(rule, ttl)
        return by_rule[rule]

    per_key = np.fromiter((lifetime(rules.rule_for(key_of(int(i)), 200)) for i in distinct),
                          dtype=np.float64, count=len(distinct))  # fmt: skip
    return np.ascontiguousarray(per_key[back])


@dataclass(frozen=True)
class KeyArrays:
    """Keys as the compiled loop takes them: numeric ids it formats after ``prefix`` itself,
    or ids into per-name arrays (h1, h2, characters) of the names with the prefix."""

    ids: np.ndarray
    prefix: bytes
    prefix_chars: int
    names: tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[()]


def replay(
    engine: CacheEngine,
    keys: KeyArrays,
    times: np.ndarray,
    sizes: np.ndarray,
    start: int,
    stop: int,
    ttl: float = math.inf,
    lifetimes: np.ndarray | None = None,
) -> None:
    """Requests ``start:stop`` (their ``keys``, ``times`` and ``sizes``) through ``engine``'s
    store and compiled admission, counted in ``engine``'s counters; each response lives
    ``ttl``, or its request's ``lifetimes`` where given (``rule_lifetimes``)."""
    store = engine.store
    names = keys.names or (None, None, None)
    deltas = simulate_chunk(
        store.index, compiled_admission(engine.admission), times[start:stop],
        keys.ids[start:stop], sizes[start:stop], keys.prefix, keys.prefix_chars, ttl,
        store.entry_overhead, store.max_object_bytes, *names,
        None if lifetimes is None else lifetimes[start:stop],
    )  # fmt: skip
    _count(engine, deltas)


def replay_tiers(
    engine: CacheEngine,
    tier: DiskTier,
    keys: KeyArrays,
    times: np.ndarray,
    sizes: np.ndarray,
    *,
    record_overhead: int,
    lengths: np.ndarray | None = None,
    ttl: float = math.inf,
    lifetimes: np.ndarray | None = None,
) -> None:
    """Every request of the arrays through ``engine``'s store and admission, with ``tier``
    behind it (its ring a ``Regions`` of its own); a record is ``lengths`` long, or its
    key's bytes, its body and ``record_overhead``. Counted in both tiers' counters. A finite
    ``ttl``, or ``lifetimes`` (each request's, ``rule_lifetimes``), is replayed in one call,
    from an empty tier (when each record was written is known within the call only):
    ValueError otherwise."""
    regions = tier.regions
    assert isinstance(regions, Regions), "a replayed tier has a ring of its own"
    if lengths is not None and len(lengths) and int(lengths.min()) < 0:
        raise ValueError("a record's length is never negative")
    deltas = simulate_tiers(
        engine.store.index, compiled_admission(engine.admission),
        None if engine.promotion is None else compiled_admission(engine.promotion), tier.index,
        compiled_admission(tier.admission), tier.budget,
        (regions.region_size, regions.regions, *regions.span()), times, keys.ids, sizes,
        keys.prefix, keys.prefix_chars, ttl, engine.store.entry_overhead,
        engine.max_object_bytes, record_overhead, lengths,
        *(keys.names or (None, None, None)), lifetimes,
        memory_max_bytes=engine.store.max_object_bytes,
    )  # fmt: skip
    regions.moved(
        (deltas.pop("ring_oldest"), deltas.pop("ring_next"), deltas.pop("ring_fill")),
        deltas.pop("ring_bytes_written"),
        deltas.pop("ring_evictions"),
    )
    disk = tier.counters
    for name in [n for n in deltas if n.startswith("disk_")]:
        attribute = name.removeprefix("disk_")
        setattr(disk, attribute, getattr(disk, attribute) + deltas.pop(name))
    _count(engine, deltas)


def _count(engine: CacheEngine, deltas: dict[str, int]) -> None:
    counters = engine.counters
    for name, value in deltas.items():
        setattr(counters, name, getattr(counters, name) + value)
