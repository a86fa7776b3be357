"""The disk tier's bookkeeping: its own admission, whole-region eviction out of the index, and
counts of what it wrote and what it spared the device."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import disk as disk_module
from proxy.core._native import DiskIndex
from proxy.core.admission import AdmissionConfig
from proxy.core.disk import DISK_POLICIES, DiskTier, WriteBudget
from proxy.core.regions import Regions


def tier(policy: str = "second-hit", region_size: int = 1000, regions: int = 3) -> DiskTier:
    return DiskTier(Regions(region_size, regions), AdmissionConfig(policy=policy, window=60.0))


def test_second_hit_writes_a_key_to_disk_on_its_second_sighting_only():
    disk = tier()
    assert disk.offer("http://a/x", 100, 130, now=0.0) is None  # first sighting
    slot = disk.offer("http://a/x", 100, 130, now=1.0)
    assert slot is not None and (slot.region, slot.offset, slot.length) == (0, 0, 130)
    assert disk.find("http://a/x") == slot
    assert disk.offer("http://a/x", 100, 130, now=2.0) is None  # already on disk
    c = disk.counters
    assert (c.admissions, c.rejected, c.bytes_written, c.bytes_not_written) == (1, 1, 130, 130)
    assert disk.find("http://a/y") is None
    disk.answered(True)
    disk.answered(False)
    assert (c.hits, c.misses) == (1, 1)


def test_one_hit_wonders_cost_the_device_nothing():
    disk = tier()
    for i in range(1000):
        assert disk.offer(f"http://a/{i}", 100, 130, now=float(i)) is None
    assert disk.counters.bytes_written == 0 and disk.regions.bytes_written == 0
    assert disk.counters.bytes_not_written == 130_000


def test_a_region_evicted_whole_takes_every_key_placed_in_it_out_of_the_index():
    disk = tier("always", region_size=1000, regions=2)
    keys = [f"k{i}" for i in range(10)]
    slots = {k: disk.offer(k, 250, 300, now=0.0) for k in keys}
    # Three records a region; regions 0 to 3 opened, the ring keeps the last two.
    assert [slots[k].region for k in keys] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert [k for k in keys if disk.find(k) is not None] == keys[6:] and len(disk) == 4
    assert disk.counters.evicted_objects == 6
    assert disk.bytes_held == 4 * 300
    assert disk.find("k9") == slots["k9"]


def test_a_dropped_key_is_a_miss_and_leaves_the_counts_right():
    disk = tier("always")
    disk.offer("k", 10, 40, now=0.0)
    disk.drop("k")
    disk.drop("k")
    assert disk.find("k") is None and disk.bytes_held == 0 and disk.counters.dropped == 1


def test_a_purge_by_prefix_reaches_records_written_before_it_not_after():
    disk = tier("always", region_size=1000, regions=3)
    for key in ("http://a/img/1", "http://a/img/2", "http://a/css/1"):
        disk.offer(key, 100, 130, now=0.0)
    disk.ban("http://a/img/")
    disk.offer("http://a/img/3", 100, 130, now=1.0)  # written after the purge: kept
    assert disk.find("http://a/img/1") is None and disk.find("http://a/img/2") is None
    assert disk.find("http://a/css/1") is not None and disk.find("http://a/img/3") is not None
    assert (disk.counters.purged, disk.counters.dropped, len(disk)) == (2, 0, 2)


def test_a_ban_goes_with_the_region_it_was_issued_in_and_bans_stay_bounded(monkeypatch):
    disk = tier("always", region_size=1000, regions=2)
    disk.offer("k0", 100, 400, now=0.0)
    disk.ban("k")
    assert len(disk.bans) == 1
    for i in range(1, 6):  # 2 records a region: region 0 is evicted by the fifth
        disk.offer(f"x{i}", 100, 400, now=0.0)
    assert disk.regions.live[0] > 0 and disk.bans == []
    monkeypatch.setattr(disk_module, "MAX_BANS", 3)
    for i in range(5):
        disk.ban(f"p{i}/")
    # Past the bound one ban of everything written so far replaced them: still correct.
    assert len(disk.bans) <= 3 and all(disk.find(f"x{i}") is None for i in range(1, 6))


def test_a_record_larger_than_a_region_is_not_written():
    disk = tier("always", region_size=1000)
    assert disk.offer("big", 2000, 2030, now=0.0) is None
    assert disk.counters.too_large == 1 and disk.counters.bytes_written == 0


def test_the_index_holds_an_object_in_a_few_bytes():
    disk = tier("always", region_size=1 << 30, regions=4)
    for i in range(100_000):
        disk.offer(f"http://a/{i}", 10, 100, now=0.0)
    assert len(disk) == 100_000
    # 20-byte slots, at least three eighths full (and a count per region).
    assert disk.index.memory_bytes / len(disk) <= 54


def test_the_auto_window_follows_the_records_the_ring_holds_when_full():
    disk = DiskTier(Regions(1000, 4), AdmissionConfig(policy="always"))
    assert disk.estimated_capacity_objects() == 0
    for i in range(5):
        disk.offer(f"k{i}", 80, 100, now=0.0)
    assert disk.estimated_capacity_objects() == 40  # 4,000 bytes of 100-byte records


@pytest.mark.parametrize("policy", ["tinylfu", "adaptive"])
def test_a_policy_that_needs_a_victim_by_key_is_refused_naming_those_that_work(policy):
    with pytest.raises(ValueError, match="use one of always, second-hit") as refused:
        tier(policy)
    assert all(name in str(refused.value) for name in DISK_POLICIES)


@pytest.mark.parametrize("policy", ["always", "second-hit", "nth-hit:3", "probabilistic:0.5",
                                    "size-below:1000"])  # fmt: skip
def test_every_other_policy_of_the_family_works_on_disk(policy):
    disk = tier(policy)
    written = [disk.offer("k", 100, 130, now=float(t)) for t in range(4)]
    assert sum(slot is not None for slot in written) <= 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        # Key hashes from 1: a hash of 0 is kept as 1 (0 marks an empty slot), and the record's
        # own key, which every read checks, tells those two apart.
        st.tuples(st.sampled_from(["put", "put", "delete", "evict", "get"]), st.integers(1, 3000)),
        max_size=2500,
    )
)
def test_the_compiled_index_answers_as_a_dict_of_live_regions_does(ops):
    ring = 4
    index = DiskIndex(ring)
    model: dict[int, tuple[int, int, int]] = {}
    first, newest = 0, 0
    for op, key in ops:
        if op == "put":
            index.put(key, newest, key * 10, key + 1)
            model[key] = (newest, key * 10, key + 1)
            if key % 7 == 0 and newest - first < ring - 1:
                newest += 1  # a new region opens now and then
        elif op == "delete":
            place = model.get(key, (newest, key * 10, 0))
            assert not index.delete_at(key, place[0], place[1] + 1), "only where it lies"
            assert index.delete_at(key, *place[:2]) == (model.pop(key, None) is not None)
        elif op == "evict" and first < newest:
            gone = [k for k, slot in model.items() if slot[0] == first]
            assert index.evict_region(first) == len(gone)
            for k in gone:
                del model[k]
            first += 1
        assert index.get(key) == model.get(key)
        assert len(index) == len(model)
        assert index.bytes == sum(length for _, _, length in model.values())
    assert all(index.get(k) == slot for k, slot in model.items())


def test_a_write_budget_keeps_the_rate_near_it_and_counts_what_it_turned_away():
    budget = 100_000  # bytes a second; the offered rate is ten times that
    disk = DiskTier(Regions(1 << 30, 4), AdmissionConfig(policy="always"),
                    budget=WriteBudget(budget))  # fmt: skip
    for i in range(100_000):  # 100 s of 1,000 offers a second, 1 KB each
        disk.offer(f"k{i}", 900, 1000, now=i / 1000)
    c = disk.counters
    assert 0.7 * budget * 100 <= c.bytes_written <= 1.3 * budget * 100
    assert c.throttled > 0 and c.bytes_not_written == c.throttled * 1000


def test_without_a_budget_every_admitted_record_is_written():
    disk = DiskTier(Regions(1 << 30, 4), AdmissionConfig(policy="always"))
    for i in range(10_000):
        disk.offer(f"k{i}", 900, 1000, now=i / 1000)
    assert disk.counters.bytes_written == 10_000 * 1000 and disk.counters.throttled == 0
