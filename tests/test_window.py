"""WindowedBloomFilter: every guarantee its module docstring states, pinned directly."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.window import WindowedBloomFilter


def test_first_sighting_is_not_seen_second_is():
    w = WindowedBloomFilter(1000, 0.01, window=60, generations=2)
    assert w.seen_before("a", 0.0) is False
    assert w.seen_before("a", 1.0) is True
    assert w.contains("a", 1.0) and not w.contains("b", 1.0)


@pytest.mark.parametrize("g", [2, 3, 4])
def test_no_false_negative_inside_the_window_across_rotations(g):
    window, step = 100.0, 0.5
    w = WindowedBloomFilter(100_000, 0.01, window=window, generations=g)
    lag = int(window / step)
    # A key every 0.5 s for 5 windows; each is checked exactly at its deadline t + window.
    for i in range(5 * lag):
        now = i * step
        w.seen_before(f"k{i}", now)
        if i >= lag:
            assert w.contains(f"k{i - lag}", now), f"k{i - lag} forgotten at its deadline {now}"
    assert w.rotations >= 4 and w.forced_rotations == 0


@pytest.mark.parametrize("g", [2, 3, 4])
def test_keys_forgotten_after_window_g_over_g_minus_1(g):
    window = 100.0
    w = WindowedBloomFilter(10_000, 0.001, window=window, generations=g)
    keys = [f"old{i}" for i in range(200)]
    for key in keys:
        w.seen_before(key, 0.0)
    later = window * g / (g - 1) + 1e-6
    remembered = sum(w.contains(key, later) for key in keys)
    # Anything still reported is a false positive of an empty filter: none.
    assert remembered == 0


def test_time_jump_longer_than_all_generations_clears_everything():
    w = WindowedBloomFilter(1000, 0.01, window=10, generations=3)
    w.seen_before("a", 0.0)
    assert not w.contains("a", 10_000.0)
    assert w.rotations == 3


def test_clock_stepping_back_never_rotates():
    w = WindowedBloomFilter(1000, 0.01, window=10, generations=2)
    w.seen_before("a", 100.0)
    assert w.contains("a", 50.0)
    assert w.rotations == 0


def test_flood_of_10x_capacity_keeps_fp_rate_at_target_by_forced_rotation():
    capacity, p = 20_000, 0.01
    w = WindowedBloomFilter(capacity, p, window=3600, generations=2)
    for i in range(10 * capacity):
        w.seen_before(f"flood/{i}", 1.0)
    stats = w.stats()
    assert w.forced_rotations >= 9
    assert stats.estimated_fp_rate <= p
    probes = 50_000
    false_positives = sum(w.contains(f"probe/{i}", 1.0) for i in range(probes))
    assert false_positives / probes <= p
    # Memory does not grow with the flood.
    assert stats.memory_bytes == WindowedBloomFilter(capacity, p, 3600, 2).stats().memory_bytes


@pytest.mark.parametrize("g", [2, 4])
def test_combined_fp_rate_at_capacity_per_window_stays_at_target(g):
    capacity, p = 30_000, 0.01
    w = WindowedBloomFilter(capacity, p, window=100, generations=g)
    # Exactly `capacity` distinct keys per window, evenly spread over two windows.
    n = 2 * capacity
    for i in range(n):
        w.seen_before(f"key/{i}", i * (200.0 / n))
    probes = 60_000
    measured = sum(w.contains(f"absent/{i}", 200.0) for i in range(probes)) / probes
    assert measured <= p


def test_sizer_sets_each_new_generation_share():
    shares = iter([500, 2000])
    w = WindowedBloomFilter(100, 0.01, window=3600, generations=2, sizer=lambda: next(shares))
    for i in range(100):
        w.seen_before(f"a{i}", 0.0)
    assert w.forced_rotations == 1 and w.stats().generation_capacity == 500
    for i in range(500):
        w.seen_before(f"b{i}", 0.0)
    assert w.forced_rotations == 2 and w.stats().generation_capacity == 2000


def test_stats_report_health():
    w = WindowedBloomFilter(1000, 0.01, window=60, generations=3)
    for i in range(100):
        w.seen_before(str(i), 0.0)
    s = w.stats()
    assert len(s.generations) == 3
    assert s.generations[0].keys == 100
    assert 0 < s.fill < 1 and 0 <= s.estimated_fp_rate < 0.01
    assert s.memory_bytes > 0 and s.window == 60


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.floats(0, 50, allow_nan=False)), min_size=1, max_size=80
    ),
    st.integers(2, 4),
)
def test_property_no_false_negative_inside_window_for_any_clock_steps(steps, g):
    """Any keys, any forward clock steps: a key recorded at t is seen at every now <= t + window."""
    window = 40.0
    w = WindowedBloomFilter(10_000, 0.01, window=window, generations=g)
    last_recorded: dict[str, float] = {}
    now = 0.0
    for key_id, step in steps:
        now += step
        key = f"k{key_id}"
        for other, at in last_recorded.items():
            if now <= at + window:
                assert w.contains(other, now)
        w.seen_before(key, now)
        last_recorded[key] = now
    assert w.forced_rotations == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"generations": 1}, "generations"),
        ({"window": 0}, "window"),
        ({"window": float("inf")}, "window"),
        ({"capacity": 0}, "capacity"),
    ],
)
def test_bad_parameters_are_refused(kwargs, message):
    args = {"capacity": 100, "fp_rate": 0.01, "window": 10.0, "generations": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        WindowedBloomFilter(**args)


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -float("inf")])
def test_a_time_that_is_no_number_of_seconds_is_refused(now):
    window = WindowedBloomFilter(1000, 0.01, 60.0, 2)
    window.seen_before("a", 1.0)
    with pytest.raises(ValueError, match="finite time"):
        window.seen_before("a", now)


def test_a_clock_leap_past_what_an_integer_holds_forgets_everything_at_once():
    window = WindowedBloomFilter(1000, 0.01, 60.0, 2)
    window.seen_before("a", 100.0)
    assert not window.seen_before("a", 1e300)  # rotated every generation, once each
    assert window.rotations == 2
