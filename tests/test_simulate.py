"""The offline simulator: agrees with an independent LRU, pinned golden figures, space saved."""

from collections import OrderedDict

import pytest

from loadgen.sim.simulate import CHUNK, simulate, space_saved, sweep
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig
from proxy.core.store import ENTRY_OVERHEAD

LRU = AdmissionConfig(policy="always")
SECOND_HIT = AdmissionConfig(policy="second-hit")


@pytest.fixture(scope="module")
def trace():
    sizes = SizeSpec.parse("lognormal:median=8KiB,sigma=1,max=1MiB")
    return generate(WorkloadSpec(objects=5000, requests=60_000, one_hit_share=0.3, sizes=sizes))


def reference_lru_hits(trace, capacity: int, overhead: int) -> int:
    """A byte-bounded LRU from OrderedDict alone, independent of cachetools and the engine;
    each entry costs its size plus ``overhead`` and, with an overhead, twice its key."""
    cache: OrderedDict[str, int] = OrderedDict()
    used = hits = 0
    for request in trace:
        if request.key in cache:
            cache.move_to_end(request.key)
            hits += 1
            continue
        cost = request.size + overhead + (2 * len(request.key) if overhead else 0)
        if cost > capacity:
            continue
        while used + cost > capacity:
            _, size = cache.popitem(last=False)
            used -= size
        cache[request.key] = cost
        used += cost
    return hits


@pytest.mark.parametrize("overhead", [0, ENTRY_OVERHEAD])
@pytest.mark.parametrize("share", [0.001, 0.01, 0.1])
def test_plain_lru_matches_an_independent_ordereddict_lru(trace, share, overhead):
    capacity = round(trace.distinct_bytes() * share)
    result = simulate(trace, capacity, LRU, entry_overhead=overhead)
    assert result.stats["hits"] == reference_lru_hits(trace, capacity, overhead)


# Golden figures for the fixture trace at 1% of its distinct bytes. A change to the core that
# moves any of these must say why in its commit.
GOLDEN = {
    "always": {
        "hits": 10174,
        "admissions": 49826,
        "evictions": 49612,
        "dead_writes": 46394,
        "rotations": 0,
    },
    "second-hit(auto)": {
        "hits": 15452,
        "admissions": 6507,
        "evictions": 6291,
        "dead_writes": 4252,
        "rotations": 41,
    },
}


@pytest.mark.parametrize("admission", [LRU, SECOND_HIT], ids=lambda a: a.label())
def test_golden_counts_per_policy(trace, admission):
    capacity = round(trace.distinct_bytes() * 0.01)
    s = simulate(trace, capacity, admission).stats
    got = {k: s[k] for k in ("hits", "admissions", "evictions", "dead_writes", "rotations")}
    assert got == GOLDEN[admission.label()]


def test_second_hit_writes_far_less_than_lru_on_one_hit_heavy_traffic(trace):
    capacity = round(trace.distinct_bytes() * 0.01)
    lru = simulate(trace, capacity, LRU).stats
    sh = simulate(trace, capacity, SECOND_HIT).stats
    assert sh["bytes_written"] < 0.2 * lru["bytes_written"]
    assert sh["hit_ratio"] > lru["hit_ratio"]
    assert sh["writes_saved"] > 0.8 and lru["writes_saved"] == 0


def test_counters_add_up(trace):
    s = simulate(trace, round(trace.distinct_bytes() * 0.01), SECOND_HIT).stats
    assert s["requests"] == len(trace) == s["hits"] + s["misses"]
    assert s["misses"] == s["origin_fetches"]
    assert s["origin_fetches"] == s["admissions"] + s["rejected_first_sighting"] + s["too_large"]
    assert s["bytes_served"] == int(trace.sizes.sum())


def test_sweep_in_parallel_gives_the_same_figures_as_one_by_one(trace):
    sizes = [round(trace.distinct_bytes() * p) for p in (0.005, 0.05)]
    parallel = sweep(trace, sizes, [LRU, SECOND_HIT], workers=2)
    serial = sweep(trace, sizes, [LRU, SECOND_HIT], workers=1)
    assert [r.stats for r in parallel] == [r.stats for r in serial]
    assert [(r.cache_bytes, r.label) for r in serial] == [
        (sizes[0], "always"),
        (sizes[0], "second-hit(auto)"),
        (sizes[1], "always"),
        (sizes[1], "second-hit(auto)"),
    ]


def test_timeline_has_its_points_even_for_a_trace_shorter_than_a_chunk(trace):
    assert len(trace) < CHUNK
    result = simulate(trace, round(trace.distinct_bytes() * 0.01), SECOND_HIT, timeline_points=20)
    done = [point["requests"] for point in result.timeline]
    assert len(done) == 20 and done == sorted(done)
    assert done[-1] == len(trace)
    assert result.timeline[-1]["hit_ratio"] == result.stats["hit_ratio"]


def test_space_saved_interpolates_in_log_size():
    lru = [(100, 0.10), (200, 0.20), (400, 0.30)]
    better = [(100, 0.15), (200, 0.25), (400, 0.35)]
    # LRU's 0.20 at 200 is reached by `better` at sqrt(100*200) ~ 141.
    saved, bound = space_saved(lru, better, 200)
    assert saved == pytest.approx(1 - (100 * 200) ** 0.5 / 200) and not bound
    assert space_saved(lru, better, 100) == (0.0, True)
    assert space_saved(lru, [(100, 0.01), (400, 0.05)], 200) == (None, False)


def test_a_sampled_cache_too_small_to_hold_enough_objects_is_said_with_the_rate_that_would(trace):
    """A sample's estimate rests on the objects its scaled cache holds: under
    ``MIN_SAMPLED_OBJECTS`` of them it is said, with the least rate that holds enough (and at
    that rate, nothing is said)."""
    from loadgen.sim.simulate import MIN_SAMPLED_OBJECTS, sample_trace, sample_warning

    small, large = round(trace.distinct_bytes() * 0.02), round(trace.distinct_bytes() * 0.5)
    sample = sample_trace(trace, 0.05)
    said = sample_warning(sample, small)
    assert said is not None and f"fewer than {MIN_SAMPLED_OBJECTS}" in said
    assert sample_warning(sample, large) is None
    enough = float(said.split("sample at least ")[1].split(",")[0])
    assert enough < 1 and sample_warning(sample_trace(trace, enough * 1.2), small) is None
    assert sample_warning(sample_trace(trace, 1.0), 1) is None  # whole: exact
