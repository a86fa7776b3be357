"""CacheEngine with both admission policies: decisions, counters and the policy registry."""

import pytest

from proxy.core.admission import AdmissionConfig, make_policy
from proxy.core.engine import (
    CacheEngine,
    Hit,
    Miss,
    NotStored,
    RequestMeta,
    ResponseMeta,
    Stale,
    Store,
)
from proxy.core.store import LRUStore

OK = ResponseMeta()


def engine(policy: str = "second-hit", cache: int = 10_000, **kw) -> CacheEngine:
    store = LRUStore(cache, kw.pop("max_object_bytes", None))
    return CacheEngine(store, make_policy(AdmissionConfig(policy=policy, **kw), store))


def fetch(e: CacheEngine, key: str, now: float, size: int = 100, response=OK):
    request = RequestMeta(key)
    decision = e.lookup(request, now)
    if isinstance(decision, Hit):
        return decision, None
    return decision, e.on_response(request, response, size, now)


def test_second_hit_stores_on_second_request_and_hits_on_third():
    e = engine()
    d1, o1 = fetch(e, "/a", 0.0)
    d2, o2 = fetch(e, "/a", 1.0)
    d3, _ = fetch(e, "/a", 2.0)
    assert d1 == Miss("uri-miss") and o1 == NotStored("first-sighting")
    assert d2 == Miss("uri-miss") and isinstance(o2, Store)
    assert isinstance(d3, Hit) and d3.age == 1.0
    s = e.stats()
    assert (s["requests"], s["hits"], s["misses"], s["admissions"]) == (3, 1, 2, 1)
    assert (s["rejected_first_sighting"], s["bytes_not_written"]) == (1, 100)
    assert s["writes_saved"] == 0.5 and s["hit_ratio"] == pytest.approx(1 / 3)


def test_always_stores_on_first_request():
    e = engine("always")
    _, outcome = fetch(e, "/a", 0.0)
    assert isinstance(outcome, Store)
    assert isinstance(fetch(e, "/a", 1.0)[0], Hit)


def test_uncacheable_response_is_not_stored_and_does_not_touch_the_filter():
    e = engine()
    _, o = fetch(e, "/a", 0.0, response=ResponseMeta(cacheable=False))
    assert o == NotStored("uncacheable")
    _, o = fetch(e, "/a", 1.0)
    assert o == NotStored("first-sighting")


def test_too_large_response_is_counted_and_never_stored():
    e = engine("always", max_object_bytes=50)
    _, o = fetch(e, "/big", 0.0, size=51)
    assert o == NotStored("too-large")
    assert e.stats()["too_large"] == 1 and e.stats()["entries"] == 0


def test_expired_entry_is_stale_and_refresh_skips_admission():
    e = engine()
    short = ResponseMeta(ttl=10.0)
    fetch(e, "/a", 0.0, response=short)
    fetch(e, "/a", 1.0, response=short)
    decision, outcome = fetch(e, "/a", 20.0, response=short)
    assert isinstance(decision, Stale) and decision.age == 19.0
    assert isinstance(outcome, Store)  # already admitted: a refresh is stored again
    assert isinstance(fetch(e, "/a", 21.0)[0], Hit)


def test_byte_hit_ratio_and_dead_writes():
    e = engine("always", cache=250)
    fetch(e, "/a", 0.0, size=100)
    fetch(e, "/a", 1.0, size=100)  # hit
    fetch(e, "/b", 2.0, size=100)
    fetch(e, "/c", 3.0, size=100)  # evicts /a (LRU), which was served
    s = e.stats()
    assert s["byte_hit_ratio"] == pytest.approx(100 / 400)
    assert (s["evictions"], s["dead_writes"], s["dead_bytes"]) == (1, 2, 200)


def test_stats_name_every_metric_and_filter_health():
    s = engine().stats()
    for name in ("filter_fill", "filter_fp_estimate", "rotations", "forced_rotations"):
        assert name in s
    assert s["filter_bytes"] > 0
    assert engine("always").stats()["filter_bytes"] == 0


def test_unknown_policy_names_the_known_ones_and_a_close_match():
    store = LRUStore(100)
    with pytest.raises(ValueError, match=r"'second-hit'\?.*always, second-hit"):
        make_policy(AdmissionConfig(policy="second_hit"), store)


def test_auto_window_sizes_generations_from_cache_turnover():
    # 100-byte objects in a 100 KB cache: the cache holds 1000 objects when full.
    e = engine(cache=100_000, min_keys=16)
    for i in range(5000):
        fetch(e, f"/k{i % 1500}", float(i))
    fs = e.admission.filter_stats()
    assert fs.rotations > 0
    assert fs.generation_capacity == pytest.approx(1000, rel=0.05)


def test_auto_scale_multiplies_the_generation_size():
    e = engine(cache=100_000, min_keys=16, auto_scale=2.0)
    for i in range(8000):
        fetch(e, f"/k{i % 1500}", float(i))
    assert e.admission.filter_stats().generation_capacity == pytest.approx(2000, rel=0.05)


def test_fixed_window_forgets_after_window():
    e = engine(window=60.0, capacity=1000)
    fetch(e, "/a", 0.0)
    _, o = fetch(e, "/a", 200.0)  # beyond window * g/(g-1): a first sighting again
    assert o == NotStored("first-sighting")


def test_labels_name_the_policy_and_window():
    assert AdmissionConfig(policy="always").label() == "always"
    assert AdmissionConfig().label() == "second-hit(auto)"
    assert AdmissionConfig(auto_scale=0.25).label() == "second-hit(auto x0.25)"
    assert AdmissionConfig(window=600.0).label() == "second-hit(10m)"
