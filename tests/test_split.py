"""``simulate --workers-split``: N workers, requests spread at random over them; a shared
admission window makes a URL's second request a second sighting whichever worker takes it."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.sim.simulate import simulate
from loadgen.sim.split import simulate_split, split_table
from loadgen.traces.trace import Trace
from proxy.core.admission import AdmissionConfig

SECOND_HIT = AdmissionConfig(policy="second-hit", window=3600.0)


def twice_each(urls: int) -> Trace:
    """Every URL asked twice, all first requests before all second ones."""
    ids = np.concatenate([np.arange(urls), np.arange(urls)]).astype(np.uint64)
    return Trace(np.arange(2 * urls, dtype=np.float64), ids, np.full(2 * urls, 1000))


def test_one_worker_is_one_cache():
    trace = twice_each(500)
    one = simulate(trace, 10 << 20, SECOND_HIT)
    split = simulate_split(trace, 10 << 20, SECOND_HIT, 1)
    assert split.stats["admissions"] == one.stats["admissions"] == 500
    assert split.stats["hits"] == one.stats["hits"]


@pytest.mark.parametrize("workers", [2, 4])
def test_a_shared_window_stores_every_second_request_and_private_ones_one_in_n(workers):
    trace = twice_each(2000)
    shared = simulate_split(trace, 100 << 20, SECOND_HIT, workers, window="shared")
    private = simulate_split(trace, 100 << 20, SECOND_HIT, workers, window="private")
    assert shared.stats["admissions"] >= 1990  # the filter's false positives aside
    # A second request meets its first on the same worker one time in N.
    assert private.stats["admissions"] == pytest.approx(2000 / workers, rel=0.15)


def test_the_table_compares_one_cache_with_n():
    table = split_table(twice_each(200), 10 << 20, SECOND_HIT, 2)
    assert "one cache" in table and "2 workers, shared window, memory divided" in table


def test_workers_count_a_shared_window_once_and_their_own_windows_each():
    trace = twice_each(100)
    alone = simulate_split(trace, 10 << 20, SECOND_HIT, 1).stats["filter_bytes"]
    shared = simulate_split(trace, 10 << 20, SECOND_HIT, 4, window="shared")
    private = simulate_split(trace, 10 << 20, SECOND_HIT, 4, window="private")
    assert shared.stats["filter_bytes"] == alone > 0
    assert private.stats["filter_bytes"] == 4 * alone
