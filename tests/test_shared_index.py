"""The disk index and ring head the workers of one machine share (``SharedIndex``,
``SharedRegions``): the same answers as the process's own index, and no overlap, no lost
record and no wrong place when two processes write at once."""

from __future__ import annotations

import itertools
import mmap
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core._native import DiskIndex, SharedIndex, hash64, shared_index_bytes
from proxy.core.disk import DiskTier
from proxy.core.regions import Regions, SharedRegions

pytestmark = pytest.mark.unit

RING, REGION = 4, 1 << 16


def shared(ring: int = RING, region: int = REGION) -> tuple[mmap.mmap, SharedIndex]:
    memory = mmap.mmap(-1, shared_index_bytes(ring, region))
    return memory, SharedIndex(memory, ring, region)


def shared_tier(ring: int = RING, region: int = REGION) -> DiskTier:
    _, index = shared(ring, region)
    return DiskTier(SharedRegions(index, region, ring), index=index)


# A run of records offered, forgotten and forgotten where they lay.
steps = st.lists(
    st.tuples(
        st.sampled_from(["offer", "drop", "forget_at"]),
        st.integers(0, 40),
        st.integers(1, REGION // 3),
    ),
    max_size=120,
)


@given(steps)
@settings(max_examples=150, deadline=None)
def test_a_shared_tier_places_finds_and_evicts_as_a_private_one(run):
    """Below a bucket's worth of records per bucket, the shared index and ring give every
    answer the process's own give: places, finds, drops, evictions, bytes held."""
    own = DiskTier(Regions(REGION, RING))
    machine = shared_tier()
    for op, n, size in run:
        key = f"http://a/{n}"
        if op == "offer":
            assert own.offer(key, size, size, 0.0) == machine.offer(key, size, size, 0.0)
        elif op == "drop":
            assert own.drop(key) == machine.drop(key)
        else:
            slot = own.find(key)
            if slot is not None:
                assert machine.forget_at(hash64(key)[0], slot.region, slot.offset + 1) is False
                assert own.forget_at(hash64(key)[0], slot.region, slot.offset)
                assert machine.forget_at(hash64(key)[0], slot.region, slot.offset)
        assert own.find(key) == machine.find(key)
        assert len(own) == len(machine)
        assert own.bytes_held == machine.bytes_held
        assert own.counters == machine.counters
        assert list(own.regions.live) == list(machine.regions.live)
    assert _slots(own.index.dump()) == _slots(machine.index.dump())


def _slots(dump: bytes) -> list[bytes]:
    return sorted(dump[i : i + 20] for i in range(0, len(dump), 20))


def _bucket(key: int, buckets: int) -> int:
    """The bucket a key's hash falls in (shared_index.c's ``slot_of``)."""
    return ((key * 0x9E3779B97F4A7C15) % (1 << 64)) >> 17 & (buckets - 1)


def test_a_full_bucket_gives_up_its_oldest_regions_record():
    _, index = shared(2, 1 << 20)
    buckets = index.slots // 8
    same = (k for k in itertools.count(1) if _bucket(k, buckets) == _bucket(1, buckets))
    keys = list(itertools.islice(same, 9))
    index.restart(0, 1, 0)
    for n, key in enumerate(keys[:8]):
        index.put(key, 0 if n == 3 else 1, n * 100, 100)
    index.put(keys[8], 1, 900, 100)
    assert index.get(keys[3]) is None, "the record of the oldest region made room"
    assert index.get(keys[8]) == (1, 900, 100)
    assert all(index.get(k) is not None for n, k in enumerate(keys) if n != 3)
    assert index.pushed_out == 1 and len(index) == 8


def test_a_second_process_attaching_with_other_sizes_is_refused():
    memory, _ = shared()
    with pytest.raises(ValueError, match="every process must use the same"):
        SharedIndex(memory, RING, REGION * 2)


def _write_many(index: SharedIndex, regions: SharedRegions, who: int, count: int) -> None:
    for n in range(count):
        placement = regions.place(100 + who)
        assert placement is not None
        index.put((who << 32) | n, placement.region, placement.offset, 100 + who)


def test_two_processes_writing_at_once_never_overlap_nor_lose_a_place():
    """Two processes reserve places and index records as fast as they can: every place is
    reserved once (no two records overlap) and every record indexed is found where it was
    put, whichever process looks."""
    ring, region = 512, 1 << 20
    memory = mmap.mmap(-1, shared_index_bytes(ring, region))
    index = SharedIndex(memory, ring, region)
    regions = SharedRegions(index, region, ring)
    count = 20_000
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's result is its exit status
        code = 1
        try:
            _write_many(SharedIndex(memory, ring, region), regions, 1, count)
            code = 0
        finally:
            os._exit(code)
    _write_many(index, regions, 2, count)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    places = []
    for who in (1, 2):
        for n in range(count):
            found = index.get((who << 32) | n)
            if found is not None:
                assert found[2] == 100 + who
                places.append(found)
    assert len(places) == 2 * count - index.pushed_out
    assert index.pushed_out < count // 100, "a bucket overflows only where one is full"
    places.sort()
    for (r1, o1, l1), (r2, o2, _) in itertools.pairwise(places):
        assert r1 < r2 or o1 + l1 <= o2, "two records share bytes"
    assert len(index) == len(places)
    assert index.bytes == sum(length for _, _, length in places)


def test_the_process_that_opens_a_region_is_told_what_it_evicted():
    _, index = shared(2, 1000)
    regions = SharedRegions(index, 1000, 2)
    assert regions.place(600).evicted == ()
    assert regions.place(600).evicted == ()
    third = regions.place(600)
    assert (third.region, third.offset, third.evicted) == (2, 0, (0,))
    assert list(regions.live) == [1, 2] and not regions.holds(0)
    regions.close()
    assert regions.place(10).region == 3


def test_a_checkpoint_counts_begun_and_done():
    _, index = shared()
    first = index.checkpoint_begin()
    second = index.checkpoint_begin()
    index.checkpoint_end(second)
    index.checkpoint_end(first)
    assert (index.checkpoints_begun, index.checkpoints_done) == (2, 2)


def test_the_private_index_forgets_only_where_asked():
    index = DiskIndex(4)
    index.put(7, 1, 100, 50)
    assert not index.delete_at(7, 1, 0)
    assert index.bytes == 50
    assert index.delete_at(7, 1, 100)
    assert index.get(7) is None and index.bytes == 0
