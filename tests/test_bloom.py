"""BloomFilter: sizing, no false negatives, false-positive rate, serialization."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.bloom import BloomFilter, optimal_size

N = 200_000
P = 0.01


@pytest.fixture(scope="module")
def full_filter() -> BloomFilter:
    bf = BloomFilter(N, P)
    for i in range(N):
        bf.add(f"https://cdn.example/obj/{i}")
    return bf


def test_no_false_negative_among_200k_added_keys(full_filter):
    assert all(f"https://cdn.example/obj/{i}" in full_filter for i in range(N))


def test_false_positive_rate_at_full_capacity_within_125pct_of_target(full_filter):
    false_positives = sum(f"https://cdn.example/absent/{i}" in full_filter for i in range(N))
    measured = false_positives / N
    assert measured <= 1.25 * P
    # The estimate from the fill ratio tracks what was measured.
    assert full_filter.estimated_fp_rate() == pytest.approx(measured, rel=0.3)


def test_bits_per_key_within_5pct_of_theory():
    for p in (0.1, 0.01, 0.001, 0.005):
        bf = BloomFilter(N, p)
        theory = -math.log(p) / math.log(2) ** 2
        assert bf.size_bits / N == pytest.approx(theory, rel=0.05)
        assert bf.num_hashes == round(theory * math.log(2))


def test_len_counts_distinct_adds(full_filter):
    # An add whose bits were all set already is invisible; at 1% that is about 1% of keys.
    assert N * 0.98 <= len(full_filter) <= N


def test_add_reports_whether_key_was_present():
    bf = BloomFilter(1000, P)
    assert bf.add("a") is False
    assert bf.add("a") is True
    assert "a" in bf and b"a" in bf
    assert len(bf) == 1


def test_clear_forgets_everything():
    bf = BloomFilter(1000, P)
    bf.add("x")
    bf.clear()
    assert "x" not in bf and len(bf) == 0 and bf.fill_ratio() == 0.0


@given(st.lists(st.one_of(st.text(), st.binary()), max_size=200))
def test_any_added_key_is_present_and_survives_serialization(keys):
    bf = BloomFilter(500, 0.02)
    for key in keys:
        bf.add(key)
    copy = BloomFilter.from_bytes(bf.to_bytes())
    assert all(key in bf and key in copy for key in keys)
    assert (copy.size_bits, copy.num_hashes, len(copy)) == (bf.size_bits, bf.num_hashes, len(bf))


def test_from_bytes_rejects_foreign_data():
    with pytest.raises(ValueError, match="not a BloomFilter"):
        BloomFilter.from_bytes(b"nope")
    data = bytearray(BloomFilter(100).to_bytes())
    with pytest.raises(ValueError, match="do not match"):
        BloomFilter.from_bytes(bytes(data[:-1]))


@pytest.mark.parametrize(("capacity", "p"), [(0, 0.01), (-5, 0.01), (10, 0.0), (10, 1.0)])
def test_bad_sizing_is_refused(capacity, p):
    with pytest.raises(ValueError):
        optimal_size(capacity, p)
