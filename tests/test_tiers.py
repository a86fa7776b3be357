"""The simulator's two tiers: the memory tier by the engine's own rules, then a disk tier with
its own admission, written sequentially into regions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.sim.simulate import simulate
from loadgen.sim.tiers import DiskSpec, model_tiers, simulate_tiers
from loadgen.traces.trace import Trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig

ALWAYS = AdmissionConfig(policy="always")


@pytest.fixture(scope="module")
def trace() -> Trace:
    spec = WorkloadSpec(objects=5_000, requests=60_000, alpha=0.8, one_hit_share=0.5,
                        sizes=SizeSpec(kind="fixed", fixed=4096), seed=3)  # fmt: skip
    return generate(spec)


def test_the_memory_tier_alone_counts_as_the_compiled_simulator_does(trace):
    # A disk tier that admits nothing leaves the memory tier's counts to compare.
    nothing = DiskSpec(
        2 << 20, region_size=1 << 20, admission=AdmissionConfig(policy="size-below:1")
    )
    for admission in (ALWAYS, AdmissionConfig(policy="second-hit")):
        tiers = simulate_tiers(trace, 2 << 20, admission, nothing)
        one = simulate(trace, 2 << 20, admission)
        for name in ("requests", "hits", "misses", "hit_bytes", "admissions", "bytes_written",
                     "evictions"):  # fmt: skip
            assert tiers.stats[name] == one.stats[name], (admission.policy, name)
        assert tiers.stats["disk_hits"] == 0 and tiers.stats["disk_bytes_written"] == 0


def test_a_disk_tier_that_holds_everything_misses_each_key_once(trace):
    disk = DiskSpec(1 << 30, region_size=16 << 20, admission=ALWAYS)
    result = simulate_tiers(trace, 64 << 10, ALWAYS, disk)
    s = result.stats
    distinct = len(np.unique(trace.ids))
    assert s["origin_fetches"] == distinct  # every other request a hit, in memory or on disk
    assert s["hits"] == s["hits_from_memory"] + s["hits_from_disk"] == len(trace) - distinct
    assert s["hits_from_disk"] == s["disk_hits"]
    assert s["hit_ratio"] == pytest.approx((len(trace) - distinct) / len(trace))
    # Each disk hit was written to memory again: counted among the admissions.
    assert s["promoted"] == s["hits_from_disk"] and s["admissions"] >= s["promoted"]
    assert s["dead_writes"] <= s["admissions"]
    assert s["disk_objects"] == distinct and s["disk_evicted_objects"] == 0


def test_second_hit_to_disk_writes_a_fraction_of_an_admit_all_disk_at_no_lower_hit_ratio(trace):
    # Half the requests are one-hit wonders: admit-all writes each of them to the device.
    runs = {
        policy: simulate_tiers(trace, 1 << 20, ALWAYS,
                               DiskSpec(32 << 20, region_size=1 << 20,
                                        admission=AdmissionConfig(policy=policy)))
        for policy in ("always", "second-hit")
    }  # fmt: skip
    always, second = runs["always"].stats, runs["second-hit"].stats
    assert second["disk_bytes_written"] < 0.4 * always["disk_bytes_written"]
    assert second["hit_ratio"] >= always["hit_ratio"] - 0.01
    assert second["disk_bytes_not_written"] > 0


def test_a_full_disk_evicts_whole_regions_and_its_index_stays_small(trace):
    disk = DiskSpec(4 << 20, region_size=1 << 20, admission=ALWAYS)
    s = simulate_tiers(trace, 64 << 10, ALWAYS, disk).stats
    assert s["disk_evicted_objects"] > 0
    assert s["disk_objects"] * (4096 + 512) <= 4 << 20
    assert s["disk_index_bytes"] <= 64 * max(s["disk_objects"], 1024)


def test_a_disk_of_fewer_than_two_regions_is_refused():
    with pytest.raises(ValueError, match="fewer than 2 regions"):
        DiskSpec(16 << 20)


MEMORY_POLICIES = ("always", "second-hit", "nth-hit:3", "tinylfu", "probabilistic:0.5",
                   "size-below:3000", "adaptive")  # fmt: skip
DISK_POLICIES = ("always", "second-hit", "nth-hit:2", "probabilistic:0.3", "size-below:2500",
                 "auto")  # fmt: skip


@st.composite
def drawn_traces(draw) -> Trace:
    """A short trace: few keys (so they repeat), sizes that change between requests of a key,
    numeric ids or names (some not ASCII), times that may stand still."""
    n = draw(st.integers(1, 400))
    keys = draw(st.integers(1, 60))
    ids = draw(st.lists(st.integers(0, keys - 1), min_size=n, max_size=n))
    sizes = draw(st.lists(st.sampled_from([0, 1, 700, 1500, 3000, 9000]), min_size=n,
                          max_size=n))  # fmt: skip
    steps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.3, 1.0, 4.0]), min_size=n, max_size=n))
    names = None
    if draw(st.booleans()):
        names = [f"{k}-{draw(st.sampled_from(['a', 'é', '日本']))}" for k in range(keys)]
    return Trace(np.cumsum(steps), np.array(ids, dtype=np.int64 if names else np.uint64),
                 np.array(sizes, dtype=np.int64), names)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=drawn_traces(),
    memory=st.sampled_from([2_000, 8_000, 40_000]),
    admission=st.sampled_from(MEMORY_POLICIES),
    eviction=st.sampled_from(["lru", "s3fifo", "sieve", "wtinylfu", "twoq"]),
    disk_admission=st.sampled_from(DISK_POLICIES),
    regions=st.sampled_from([(4_000, 2), (8_000, 3), (64_000, 4)]),
    ttl=st.sampled_from([math.inf, 1.0, 5.0]),
    overhead=st.sampled_from([0, 300]),
    max_object=st.sampled_from([None, 2_000]),
    budget=st.sampled_from([0.0, 3_000.0]),
    named_record=st.booleans(),
)
def test_the_compiled_loop_counts_as_the_model_does(
    trace, memory, admission, eviction, disk_admission, regions, ttl, overhead, max_object,
    budget, named_record,
):  # fmt: skip
    """Every count of both tiers, request for request (small tiers: evictions of memory
    entries and of disk regions, stale copies in either, responses too large for one or the
    other, a write budget that throttles)."""
    region_size, count = regions
    record_length = (lambda key, size: 40 + 3 * len(key) + size) if named_record else None
    disk = DiskSpec(region_size * count, region_size, AdmissionConfig(policy=disk_admission),
                    meta_bytes=100, record_length=record_length, max_write_rate=budget)  # fmt: skip
    args = (trace, memory, AdmissionConfig(policy=admission), disk)
    options = {"ttl": ttl, "entry_overhead": overhead, "max_object_bytes": max_object,
               "eviction": eviction, "key_prefix": "/o/"}  # fmt: skip
    assert simulate_tiers(*args, **options).stats == model_tiers(*args, **options).stats


def test_auto_disk_admission_keeps_one_hit_wonders_off_the_disk_at_admit_alls_hit_ratio(trace):
    """Half the requests are one-hit wonders: auto's ghosts find that admitting all writes
    them for nothing, and it follows a rule that writes a fraction of that, hitting as often."""
    runs = {
        policy: simulate_tiers(trace, 1 << 20, ALWAYS,
                               DiskSpec(8 << 20, region_size=256 << 10,
                                        admission=AdmissionConfig(policy=policy)))
        for policy in ("always", "auto")
    }  # fmt: skip
    always, auto = runs["always"].stats, runs["auto"].stats
    assert auto["disk_bytes_written"] < 0.5 * always["disk_bytes_written"]
    assert auto["hit_ratio"] >= always["hit_ratio"] - 0.005


def _megabyte_chunks(chunk: int, cycles: int = 40_000, apart: int = 200, seed: int = 5) -> Trace:
    """Each cycle one of 96 popular 1 MiB objects, and chunks of ``chunk`` bytes each asked
    three times, ``apart`` cycles apart (a chunk new at every cycle): three lookups of a chunk
    to one of 1 MiB. A disk of 128 MiB keeps the popular set when it admits nothing else."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    sizes: list[int] = []
    for cycle in range(cycles):
        ids.append(int(rng.integers(96)))
        sizes.append(1 << 20)
        for seen in range(3):
            if (first := cycle - seen * apart) >= 0:
                ids.append(1_000 + first)
                sizes.append(chunk)
    n = len(ids)
    return Trace(np.arange(n, dtype=np.float64), np.array(ids, dtype=np.uint64),
                 np.array(sizes, dtype=np.int64))  # fmt: skip


@pytest.mark.parametrize("chunk", [4 << 20, 9 << 19])
def test_auto_disk_admission_learns_a_size_class_from_megabyte_objects(chunk):
    """No fixed rule keeps the popular megabyte objects from the chunks' churn (the fixed size
    classes, 16 and 64 KiB, admit none of either): the size class at the median of the sizes
    looked up, the power of 2 at or below the chunks' (4 MiB for 4 and 4.5 MiB chunks), does,
    and auto follows it. Its ghosts hold records longer than their own regions (written on
    over whole ones): before, a ghost refused any body past a sixteenth of the tier's region,
    and saw none of these."""
    chunks = _megabyte_chunks(chunk)
    disk = DiskSpec(128 << 20, region_size=8 << 20, admission=AdmissionConfig(policy="auto"))
    run = simulate_tiers(chunks, 8 << 20, ALWAYS, disk, entry_overhead=0)
    assert run.disk_auto is not None
    assert run.disk_auto["choice"] in ("size-below:4MiB (class p50)", "size-below:4MiB (class p75)")
    auto = run.stats["hit_ratio"]
    for rule in ("always", "second-hit", "nth-hit:3", "probabilistic:0.1", "size-below:4MiB"):
        spec = DiskSpec(128 << 20, region_size=8 << 20, admission=AdmissionConfig(policy=rule))
        fixed = simulate_tiers(chunks, 8 << 20, ALWAYS, spec, entry_overhead=0).stats
        if rule == "size-below:4MiB":
            assert auto >= fixed["hit_ratio"] - 0.03  # less its first periods, learning
        else:
            assert auto > fixed["hit_ratio"] + 0.05, rule


def test_a_body_past_memorys_largest_is_kept_on_disk_as_the_engine_keeps_it():
    """Bodies of 2 MiB behind a memory tier of 1 MiB: the live engine keeps them on a disk of
    8 MiB regions (``Config.behind_largest``), counting each memory would not hold as
    ``beyond_memory``. The compiled loop had capped every tier at memory's largest, and the
    disk tier saw none of them."""
    ids = np.tile(np.arange(20, dtype=np.uint64), 5)
    big = Trace(np.arange(len(ids), dtype=np.float64), ids, np.full(len(ids), 2 << 20))
    disk = DiskSpec(64 << 20, region_size=8 << 20, admission=ALWAYS)
    compiled = simulate_tiers(big, 1 << 20, ALWAYS, disk).stats
    assert compiled == model_tiers(big, 1 << 20, ALWAYS, disk).stats
    assert compiled["disk_hits"] == 4 * 20 and compiled["beyond_memory"] == 20
    assert compiled["too_large"] == 0


def test_nth_hit_in_front_of_an_empty_disk_starts_writing():
    """A sketch sized by the records the disk holds (window auto) starts at its smallest (1,024
    keys) while the disk is empty: 4,000 keys asked in turn, twelve rounds, each key's
    sightings 4,000 apart. It must remember longer each turn, or it forgets every key before a
    fourth sighting and the disk stays empty for good (it did: 0 records)."""
    keys = 4_000
    ids = np.tile(np.arange(keys, dtype=np.uint64), 12)
    rounds = Trace(np.arange(len(ids), dtype=np.float64), ids, np.full(len(ids), 1000))
    disk = DiskSpec(32 << 20, region_size=1 << 20, admission=AdmissionConfig(policy="nth-hit:4"))
    s = simulate_tiers(rounds, 64 << 10, ALWAYS, disk, entry_overhead=0).stats
    assert s["disk_admissions"] == keys and s["disk_hits"] > 4 * keys


def test_a_disk_hit_is_kept_in_memory_only_when_hit_again_within_memorys_turnover():
    """A record whose hits are 4,000 keys apart is not copied into a memory tier of 64 objects
    on each hit (it would only evict another; before, every disk hit was); one hit twice in a
    row is, on its second disk hit. Memory's admission (second hit) takes both."""
    keys = 4_000
    ids = np.tile(np.arange(keys, dtype=np.uint64), 6)
    apart = Trace(np.arange(len(ids), dtype=np.float64), ids, np.full(len(ids), 1000))
    disk = DiskSpec(64 << 20, region_size=1 << 20, admission=ALWAYS)
    second_hit = AdmissionConfig(policy="second-hit")
    args = (apart, 64 * 1000, second_hit, disk)
    s = simulate_tiers(*args, entry_overhead=0).stats
    assert s == model_tiers(*args, entry_overhead=0).stats
    assert s["hits"] == 5 * keys and s["hits_from_disk"] > 0.99 * 5 * keys
    assert s["promoted"] < 0.02 * s["hits_from_disk"]  # false positives of the filter only
    twice = np.repeat(np.arange(keys, dtype=np.uint64), 3)  # each key thrice in a row
    close = Trace(np.arange(len(twice), dtype=np.float64), twice, np.full(len(twice), 1000))
    s = simulate_tiers(close, 64 * 1000, second_hit, disk, entry_overhead=0).stats
    assert s == model_tiers(close, 64 * 1000, second_hit, disk, entry_overhead=0).stats
    # The first is fetched and written to disk, the second a disk hit, the third kept (but
    # where memory's filter took a first sighting for a second, a false positive).
    assert s["hits"] == 2 * keys and s["hits_from_disk"] > 0.98 * 2 * keys
    assert 0.98 * keys < s["promoted"] <= keys
