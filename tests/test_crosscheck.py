"""The simulator against libCacheSim, the reference simulator its users compare with (LRU,
S3-FIFO and SIEVE eviction), and sampled runs (SHARDS) against full runs of the same trace."""

import libcachesim
import numpy as np
import pytest

from loadgen.sim.simulate import sample_trace, simulate, sweep
from loadgen.traces.trace import Trace, write_trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig

LRU = AdmissionConfig(policy="always")


@pytest.fixture(scope="module")
def trace() -> Trace:
    sizes = SizeSpec.parse("lognormal:median=8KiB,sigma=1.2,max=4MiB")
    t = generate(WorkloadSpec(objects=20_000, requests=200_000, one_hit_share=0.25, sizes=sizes))
    return Trace(np.floor(t.times), t.ids, t.sizes)  # oracleGeneral times are whole seconds


REFERENCES = {"lru": libcachesim.LRU, "s3fifo": libcachesim.S3FIFO, "sieve": libcachesim.Sieve,
              "twoq": libcachesim.TwoQ}  # fmt: skip


@pytest.mark.parametrize("eviction", sorted(REFERENCES))
@pytest.mark.parametrize("share", [0.005, 0.05, 0.3])
def test_eviction_matches_libcachesim_to_four_digits(trace, tmp_path, share, eviction):
    path = tmp_path / "t.oracleGeneral.bin"
    write_trace(trace, path)
    size = round(trace.distinct_bytes() * share)
    reader = libcachesim.TraceReader(str(path), libcachesim.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio, byte_miss_ratio = REFERENCES[eviction](size).process_trace(reader)
    ours = simulate(trace, size, LRU, entry_overhead=0, eviction=eviction).stats
    assert ours["hit_ratio"] == pytest.approx(1 - miss_ratio, abs=5e-5)
    assert ours["byte_hit_ratio"] == pytest.approx(1 - byte_miss_ratio, abs=5e-5)
    assert 0.05 < ours["hit_ratio"] < 0.95


def test_sampled_sweep_is_within_a_hundredth_of_the_full_one():
    """Rate 0.1 on 1M requests samples as many requests (100k) as 0.01 does on 10M."""
    sizes = SizeSpec.parse("lognormal:median=8KiB,sigma=1.2,max=4MiB")
    spec = WorkloadSpec(objects=300_000, requests=1_000_000, one_hit_share=0.25, sizes=sizes)
    trace = generate(spec)
    sizes = [round(trace.distinct_bytes() * s) for s in np.geomspace(0.005, 0.3, 6)]
    policies = [LRU, AdmissionConfig(policy="second-hit")]
    full = sweep(trace, sizes, policies, entry_overhead=0, workers=1)
    sample = sample_trace(trace, 0.1)
    assert 0.05 * len(trace) < len(sample.trace) < 0.15 * len(trace)
    sampled = sweep(sample, sizes, policies, entry_overhead=0, workers=1)
    errors = [
        abs(f.stats["hit_ratio"] - s.stats["hit_ratio"]) for f, s in zip(full, sampled, strict=True)
    ]
    assert np.mean(errors) <= 0.01, errors
    assert all(s.sample_rate == 0.1 and s.requests == len(trace) for s in sampled)


def test_sampling_keeps_each_key_whole_or_not_at_all(trace):
    sample = sample_trace(trace, 0.2)
    ids, counts = np.unique(trace.ids, return_counts=True)
    kept = dict(zip(*np.unique(sample.trace.ids, return_counts=True), strict=True))
    assert 0.1 * len(ids) < len(kept) < 0.3 * len(ids)
    assert all(kept.get(i, n) == n for i, n in zip(ids, counts, strict=True))
    with pytest.raises(ValueError, match=r"a sampling rate is in \(0, 1\]"):
        sample_trace(trace, 0)


# Knobs as libCacheSim names them: S4-FIFO's settings of S3-FIFO, and 2Q's queue shares.
KNOBBED = [
    ("s3fifo:small=0.05:move=1", libcachesim.S3FIFO,
     {"small_size_ratio": 0.05, "move_to_main_threshold": 1}),
    ("s3fifo:small=0.3:ghost=0.5:move=3", libcachesim.S3FIFO,
     {"small_size_ratio": 0.3, "ghost_size_ratio": 0.5, "move_to_main_threshold": 3}),
    ("twoq:small=0.1:ghost=1", libcachesim.TwoQ, {"a_in_size_ratio": 0.1, "a_out_size_ratio": 1.0}),
]  # fmt: skip


@pytest.mark.parametrize(("eviction", "reference", "knobs"), KNOBBED, ids=[k[0] for k in KNOBBED])
def test_an_evictions_knobs_match_libcachesims_to_four_digits(
    trace, tmp_path, eviction, reference, knobs
):
    path = tmp_path / "t.oracleGeneral.bin"
    write_trace(trace, path)
    size = round(trace.distinct_bytes() * 0.05)
    reader = libcachesim.TraceReader(str(path), libcachesim.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio, byte_miss_ratio = reference(size, **knobs).process_trace(reader)
    ours = simulate(trace, size, LRU, entry_overhead=0, eviction=eviction).stats
    assert ours["hit_ratio"] == pytest.approx(1 - miss_ratio, abs=5e-5)
    assert ours["byte_hit_ratio"] == pytest.approx(1 - byte_miss_ratio, abs=5e-5)
    default = simulate(trace, size, LRU, entry_overhead=0, eviction=eviction.split(":")[0])
    assert default.stats["hit_ratio"] != ours["hit_ratio"]  # the knobs made a difference
