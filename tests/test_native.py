"""The compiled policy core against independent references: mmh3 for the hash, the textbook
formula for sizing, and an OrderedDict LRU for the store index."""

import math
from collections import OrderedDict

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core._native import StoreIndex, hash64, optimal_size
from proxy.core.bloom import BloomFilter, probe_positions


@given(st.one_of(st.text(max_size=80), st.binary(max_size=80)))
def test_hash64_is_mmh3_hash64_unsigned(key):
    assert hash64(key) == mmh3.hash64(key, signed=False)


@given(st.integers(1, 10**9), st.floats(1e-9, 0.999))
def test_sizing_is_the_textbook_optimum(capacity, fp_rate):
    bits = math.ceil(-capacity * math.log(fp_rate) / (math.log(2) ** 2))
    assert optimal_size(capacity, fp_rate) == (bits, max(1, round(bits / capacity * math.log(2))))


@given(st.lists(st.text(max_size=20), max_size=50))
def test_the_filter_sets_exactly_the_probe_positions_a_python_reader_computes(keys):
    bf = BloomFilter(40, 0.01)
    expected = set()
    for key in keys:
        bf.add(key)
        expected.update(probe_positions(hash64(key), bf.size_bits, bf.num_hashes))
    bits = int.from_bytes(bf.raw_bits(), "little")
    assert {i for i in range(bf.size_bits) if bits >> i & 1} == expected


operations = st.lists(
    st.tuples(st.sampled_from(["put", "get", "delete", "hit"]), st.integers(0, 30),
              st.integers(1, 400)),
    max_size=300,
)  # fmt: skip


@settings(max_examples=300)
@given(operations)
def test_lru_index_agrees_with_an_ordereddict_lru(ops):
    """Order, bytes, evictions and dead writes, op by op; capacity 1000 bytes."""
    index = StoreIndex(1000)
    ref: OrderedDict[int, list[int]] = OrderedDict()  # key -> [charge, hits]
    evictions = unread = 0
    for op, key, charge in ops:
        if op == "put":
            ref.pop(key, None)
            expected = []
            while ref and sum(c for c, _ in ref.values()) + charge > 1000:
                old, (_, hits) = ref.popitem(last=False)
                expected.append(old)
                evictions += 1
                unread += hits == 0
            ref[key] = [charge, 0]
            assert index.put(key, charge, charge, 0) == expected
        elif op == "get":
            assert index.touch(key) == (key in ref)
            if key in ref:
                ref.move_to_end(key)
        elif op == "hit" and key in ref:
            index.record_hit(key)
            ref[key][1] += 1
        elif op == "delete":
            assert index.delete(key) == (ref.pop(key, None) is not None)
        assert len(index) == len(ref)
        assert index.bytes_used == sum(c for c, _ in ref.values())
        assert (index.evictions, index.evicted_unread) == (evictions, unread)
        assert index.resident_unread == sum(1 for _, h in ref.values() if h == 0)


def test_lru_index_grows_past_its_first_table_and_keeps_every_key():
    index = StoreIndex(10**9)
    keys = [hash64(str(i))[0] for i in range(50_000)]
    for key in keys:
        index.put(key, 10, 10, 0)
    assert len(index) == 50_000 and all(key in index for key in keys)
    for key in keys[::2]:
        assert index.delete(key)
    assert len(index) == 25_000
    assert all((key in index) == (i % 2 == 1) for i, key in enumerate(keys))


@settings(max_examples=200)
@given(st.sampled_from(["lru", "sieve", "s3fifo", "wtinylfu", "twoq"]), operations)
def test_every_eviction_keeps_the_byte_bound_and_its_counts(eviction, ops):
    index = StoreIndex(1000, eviction)
    resident: dict[int, int] = {}
    for op, key, charge in ops:
        if op == "put" and charge <= index.max_charge:
            resident.pop(key, None)
            resident[key] = charge
            for gone in index.put(key, charge, charge, 0):  # W-TinyLFU may evict key itself
                assert resident.pop(gone) > 0
        elif op == "get":
            assert index.touch(key) == (key in resident)
        elif op == "delete":
            assert index.delete(key) == (resident.pop(key, None) is not None)
        assert index.bytes_used == sum(resident.values()) <= 1000
        assert len(index) == len(resident) and all(k in index for k in resident)


def test_sieve_spares_a_visited_entry_and_its_hand_stays():
    index = StoreIndex(300, "sieve")
    for key in (1, 2, 3):
        index.put(key, 100, 100, 0)
    index.touch(1)
    assert index.put(4, 100, 100, 0) == [2]  # 1 is visited: its mark is cleared, 2 goes
    assert index.put(5, 100, 100, 0) == [3]  # the hand goes on from where it stopped,
    assert index.put(6, 100, 100, 0) == [4]  # towards the newest, so 1 outlives 4
    assert 1 in index


def test_s3fifo_evicts_one_hit_wonders_before_reused_entries_and_remembers_them():
    index = StoreIndex(1000, "s3fifo")
    assert index.max_charge == 100  # the small queue's size
    for key in range(8):
        index.put(key, 100, 100, 0)
        index.touch(key)
        index.touch(key)
    wonders = range(100, 140)
    for key in wonders:
        index.put(key, 10, 10, 0)
    assert all(key in index for key in range(8)), "reused entries outlive a scan"
    gone = [key for key in wonders if key not in index]
    assert gone and 0 < index.ghosts <= len(gone)  # those evicted from the small queue
    index.put(gone[-1], 10, 10, 0)
    assert gone[-1] in index
    with pytest.raises(ValueError, match="exceeds the 100 bytes an entry may take"):
        index.put(999, 101, 101, 0)


def test_wtinylfu_keeps_frequent_entries_through_a_scan_of_new_ones():
    index = StoreIndex(10_000, "wtinylfu")
    for _ in range(5):
        for key in range(50):  # a hot set, requested again and again
            if not index.touch(key):
                index.put(key, 100, 100, 0)
    for key in range(1000, 3000):  # a scan twice the store's size, each key once
        index.put(key, 100, 100, 0)
    assert sum(key in index for key in range(50)) >= 45
    assert index.bytes_used <= 10_000


def test_wtinylfu_new_keys_enter_the_window_after_the_first_eviction_too():
    """A hot set larger than the protected segment (95 entries of 100 bytes in 10,000 bytes,
    80% protected): those in probation are guarded by the duel at the window's exit, which a
    scan of new keys loses. Before the fix, new keys went straight to probation once the
    window had filled, for ever, and the scan pushed 15 of the hot set out (a plain SLRU)."""
    index = StoreIndex(10_000, "wtinylfu")
    for _ in range(5):
        for key in range(95):
            if not index.touch(key):
                index.put(key, 100, 100, 0)
    for key in range(1000, 3000):
        index.put(key, 100, 100, 0)
    assert sum(key in index for key in range(95)) >= 90
