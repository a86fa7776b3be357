"""The simulator's two tiers: the memory tier by the engine's own rules, then a disk tier with
its own admission, written sequentially into regions."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.simulate import simulate
from loadgen.tiers import DiskSpec, simulate_tiers
from loadgen.trace import Trace
from loadgen.workload import SizeSpec, WorkloadSpec, generate
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
