"""CacheStore: the byte bound, LRU order, too-large objects and dead-write accounting."""

import gc
import tracemalloc

import pytest

from proxy.core.store import CacheStore, Entry, entry_charge


def entry(key: str, size: int) -> Entry:
    return Entry(key, size, stored_at=0.0)


def test_evicts_least_recently_used_to_stay_within_bytes():
    store = CacheStore(300)
    for k in "abc":
        store.put(entry(k, 100))
    store.get("a")  # a is now most recent; b is the oldest
    evicted = store.put(entry("d", 100))
    assert [e.key for e in evicted] == ["b"]
    assert "b" not in store and {"a", "c", "d"} <= {k for k in "abcd" if k in store}
    assert store.bytes_used == 300 and len(store) == 3


def test_one_big_entry_evicts_as_many_as_it_needs():
    store = CacheStore(300)
    for k in "abc":
        store.put(entry(k, 100))
    evicted = store.put(entry("big", 250))
    assert [e.key for e in evicted] == ["a", "b", "c"]
    assert store.bytes_used == 250


def test_entry_over_max_object_bytes_is_never_stored():
    store = CacheStore(1000, max_object_bytes=100)
    assert not store.fits(101) and store.fits(100)
    with pytest.raises(ValueError, match="max_object_bytes"):
        store.put(entry("x", 101))
    assert len(store) == 0


def test_max_object_bytes_cannot_exceed_capacity():
    assert CacheStore(100, max_object_bytes=10_000).max_object_bytes == 100


def test_dead_writes_count_evicted_and_resident_entries_never_hit():
    store = CacheStore(200)
    store.put(entry("read", 100))
    store.record_hit(store.get("read"))
    store.put(entry("unread", 100))
    assert (store.resident_unread, store.resident_unread_bytes) == (1, 100)
    store.put(entry("new", 100))  # evicts "read" (LRU), which was served: not dead
    assert (store.evicted_unread, store.evictions) == (0, 1)
    store.put(entry("newer", 150))  # evicts "unread" and "new", neither served
    assert (store.evicted_unread, store.evicted_unread_bytes) == (2, 200)
    assert (store.resident_unread, store.resident_unread_bytes) == (1, 150)


def test_replacing_or_deleting_is_not_an_eviction():
    store = CacheStore(500)
    store.put(entry("a", 100))
    store.put(entry("a", 200))
    assert store.evictions == 0 and store.bytes_used == 200 and store.resident_unread == 1
    assert store.delete("a").size == 200
    assert store.delete("a") is None
    assert (store.resident_unread, store.evicted_unread, len(store)) == (0, 0, 0)


def test_estimated_capacity_objects_extrapolates_mean_size():
    store = CacheStore(1000)
    assert store.estimated_capacity_objects() == 0
    store.put(entry("a", 100))
    store.put(entry("b", 300))
    assert store.estimated_capacity_objects() == 5


@pytest.mark.parametrize(("cap", "max_obj"), [(0, None), (-1, None), (10, 0)])
def test_bad_sizes_are_refused(cap, max_obj):
    with pytest.raises(ValueError):
        CacheStore(cap, max_obj)


def test_entries_are_charged_their_overhead_and_key_so_capacity_bounds_memory():
    store = CacheStore(10_020, entry_overhead=1000)
    for i in range(20):
        store.put(entry(f"{i:02d}", 1000))
    assert len(store) == 5 and store.bytes_used == 10_020  # 5 x (1000 + 1000 + 2 x 2)
    assert store.max_object_bytes == 9020
    heavy = Entry("h", 100, 0.0, headers=(("X-Big", "v" * 2000),))
    assert entry_charge(heavy, 1000) == 100 + 1000 + 2 + 4 * 2005 - 1024
    long_key = Entry("k" * 8000, 100, 0.0)
    assert entry_charge(long_key, 1000) == 100 + 1000 + 16_000
    assert entry_charge(heavy, 0) == 100
    with pytest.raises(ValueError, match="entry_overhead"):
        CacheStore(100, entry_overhead=100)


def test_stored_entries_and_their_dict_are_out_of_the_collectors_view():
    store = CacheStore(1 << 20)
    for i in range(1000):
        store.put(Entry(f"k{i}", 10, 0.0, headers=(("ETag", '"v"'),), payload=b"x" * 10))
    store.delete("k0")
    store.put(entry("k1", 20))  # a replacement
    assert not gc.is_tracked(store._entries)
    assert not any(gc.is_tracked(e) for e in store._entries.values())
    before = len(gc.get_objects())
    store.put(entry("one more", 10))
    assert len(gc.get_objects()) == before


def test_entries_leaving_the_store_are_freed_though_the_collector_never_sees_them():
    body = b"x" * 10_000
    store = CacheStore(1 << 20, entry_overhead=0)  # room for about 100 of them
    tracemalloc.start()
    try:
        for i in range(50):
            store.put(Entry(f"warm{i}", len(body), 0.0, payload=bytes(body)))
        baseline, _ = tracemalloc.get_traced_memory()
        for i in range(5000):  # 50 MB through the store: evictions, then deletions
            store.put(Entry(f"k{i}", len(body), 0.0, payload=bytes(body)))
        for key in list(store):
            store.delete(key)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(store) == 0
    assert after < baseline + (256 << 10)


@pytest.mark.parametrize("eviction", ["lru", "sieve", "s3fifo", "wtinylfu", "twoq"])
@pytest.mark.parametrize("smaller", [3_000, 200])
def test_a_store_made_smaller_evicts_as_its_policy_does_until_the_rest_fit(eviction, smaller):
    store = CacheStore(10_000, eviction=eviction)
    for i in range(100):
        store.put(entry(f"k{i}", 100))
    before = set(store)
    evictions = store.evictions
    gone = store.resize(smaller)
    assert store.bytes_used <= store.capacity_bytes == smaller
    # The sizes the policy derives from its capacity follow it (S3-FIFO's largest entry).
    assert store.max_object_bytes == CacheStore(smaller, eviction=eviction).max_object_bytes
    assert {e.key for e in gone} == before - set(store) and len(gone) >= 1
    assert store.evictions == evictions + len(gone)  # counted as evictions are
    assert all(store.get(e.key) is None for e in gone)
    assert store.resize(20_000) == []  # larger: nothing leaves, and more fits
    for i in range(100, 250):
        store.put(entry(f"k{i}", 100))
    assert smaller < store.bytes_used <= 20_000


def test_a_lru_store_made_smaller_keeps_the_most_recently_used():
    store = CacheStore(1_000)
    for k in "abcdefghij":
        store.put(entry(k, 100))
    store.get("a")
    assert [e.key for e in store.resize(300)] == list("bcdefgh")
    assert set(store) == {"i", "j", "a"}


@pytest.mark.parametrize(("cap", "max_obj"), [(0, None), (100, 0)])
def test_bad_new_sizes_are_refused_and_change_nothing(cap, max_obj):
    store = CacheStore(1_000)
    store.put(entry("a", 100))
    with pytest.raises(ValueError):
        store.resize(cap, max_obj)
    assert store.capacity_bytes == 1_000 and "a" in store


@pytest.mark.parametrize("to", ["lru", "sieve", "s3fifo:small=0.2:move=1", "wtinylfu", "twoq"])
@pytest.mark.parametrize("was", ["lru", "s3fifo", "wtinylfu", "twoq"])
def test_a_reshaped_store_keeps_every_entry_and_its_hits(was, to):
    store = CacheStore(10_000, eviction=was)
    for i in range(60):  # past full: the policy's queues and ghosts are in use
        store.put(entry(f"k{i}", 200))
        if i % 3 == 0 and (stored := store.get(f"k{i}")) is not None:  # W-TinyLFU may not
            store.record_hit(stored)
    before = {key: store.index.hits(store.peek(key).key_hash) for key in store}
    used, unread = store.bytes_used, store.resident_unread
    store.reshape(to)
    assert store.eviction == to and store.index.eviction == to.split(":")[0]
    assert {key: store.index.hits(store.peek(key).key_hash) for key in store} == before
    assert (store.bytes_used, store.resident_unread, store.index.ghosts) == (used, unread, 0)
    for i in range(60, 200):  # it goes on evicting, within its bytes
        store.put(entry(f"k{i}", 200))
        assert store.bytes_used <= 10_000


def test_a_store_reshaped_to_its_own_policy_evicts_in_the_order_it_would_have():
    kept, reshaped = CacheStore(1000), CacheStore(1000)
    for store in (kept, reshaped):
        for k in "abcde":
            store.put(entry(k, 200))
        store.get("b")
    reshaped.reshape("lru")
    assert [e.key for e in kept.put(entry("f", 500))] == ["a", "c", "d"]
    assert [e.key for e in reshaped.put(entry("f", 500))] == ["a", "c", "d"]


def test_a_reshape_takes_the_new_policys_largest_object_and_keeps_a_larger_entry():
    store = CacheStore(10_000, max_object_bytes=5_000)
    store.put(entry("big", 4_000))
    store.reshape("s3fifo:small=0.2")  # S3-FIFO stores nothing larger than its small queue
    assert store.max_object_bytes == 2_000 and "big" in store
    store.reshape("lru")
    assert store.max_object_bytes == 5_000  # as asked, once the policy allows it again
    assert store.index.knobs == {"small": None, "ghost": None, "move": None}
    store.reshape("s3fifo:small=0.2:move=1")
    assert store.index.knobs == {"small": 0.2, "ghost": None, "move": 1}


@pytest.mark.parametrize(
    "bad", ["fifo", "lru:small=0.1", "s3fifo:small=1", "s3fifo:small=1e-9", "s3fifo:move=4",
            "s3fifo:", "s3fifo:small=0.05:"],
)  # fmt: skip
def test_a_bad_reshape_is_refused_and_changes_nothing(bad):
    store = CacheStore(1000, eviction="s3fifo")
    store.put(entry("a", 50))
    with pytest.raises(ValueError):
        store.reshape(bad)
    assert store.eviction == "s3fifo" and store.index.eviction == "s3fifo" and "a" in store


def test_a_reshape_keeps_the_order_across_the_old_policys_queues():
    """S3-FIFO's main queue holds the older entries, its small queue the newer: reshaped to
    LRU, main's leave first, each queue from its oldest."""
    store = CacheStore(10_000, eviction="s3fifo")  # a small queue of 1,000 bytes
    # k0 and k1 enter the small queue, k2 to k10 main (the small queue is full before the
    # first eviction); k11 and k12 evict k0 and k1 into the ghost and take their place.
    for i in range(13):
        store.put(entry(f"k{i}", 900))
    assert "k0" not in store and "k1" not in store
    store.reshape("lru")
    evicted = [e.key for e in store.put(entry("big", 9_000))]
    assert evicted == [f"k{i}" for i in range(2, 12)] and "k12" in store


def test_a_store_index_made_directly_refuses_knobs_out_of_range():
    from proxy.core._native import StoreIndex

    for knobs in ({"small": 2.0}, {"small": 0.0}, {"ghost": 5.0}, {"ghost": float("nan")},
                  {"move": 4}, {"move": 0}):  # fmt: skip
        with pytest.raises(ValueError, match="out of its range"):
            StoreIndex(1000, "s3fifo", **knobs)
        with pytest.raises(ValueError, match="out of its range"):
            StoreIndex(1000, "lru").reshape("s3fifo", **knobs)


def test_a_reshape_sends_entries_never_read_to_the_entry_queue_to_leave_first():
    """What the old policy let in and nobody read goes to S3-FIFO's small queue, which
    evicts first; what was read goes to main and stays."""
    store = CacheStore(10_000)
    for i in range(10):
        store.put(entry(f"k{i}", 900))
        if i % 2:  # the odd ones read once, the even ones never
            store.record_hit(store.get(f"k{i}"))
    store.reshape("s3fifo:small=0.2")
    gone = [e.key for e in store.put(entry("new", 1_800))]
    assert gone and all(int(k[1:]) % 2 == 0 for k in gone)
    assert all(f"k{i}" in store for i in range(1, 10, 2))


def test_a_sample_of_a_store_keeps_what_the_full_store_keeps_up_to_its_bytes():
    full = CacheStore(1_000_000, eviction="s3fifo")  # S3-FIFO's small queue: 100,000 bytes
    sample = CacheStore(20_000, eviction="s3fifo")  # a 2% sample's: 2,000
    assert sample.max_object_bytes == 2_000
    sample.sample_of(full)
    assert sample.max_object_bytes == 20_000  # the full store's bound, up to its own bytes
    sample.put(entry("large", 5_000))
    assert "large" in sample
    for i in range(40):  # and it goes on evicting within its bytes
        sample.put(entry(f"k{i}", 900))
        assert sample.bytes_used <= 20_000


def test_a_store_reshaped_to_wtinylfu_keeps_what_was_read_against_newcomers():
    """Its sketch, new, learns the residents' reads: a resident read three times wins its duel
    with a newcomer seen once, as under W-TinyLFU all along (a sketch of zeros would give
    every newcomer the place of every resident)."""
    store = CacheStore(10_000)
    for i in range(10):
        store.put(entry(f"k{i}", 1_000))
        for _ in range(3):
            store.record_hit(store.get(f"k{i}"))
    store.reshape("wtinylfu")
    for i in range(5):
        store.put(entry(f"new{i}", 1_000))
    assert all(f"k{i}" in store for i in range(10))
    assert not any(f"new{i}" in store for i in range(5))
