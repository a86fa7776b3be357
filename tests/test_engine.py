"""CacheEngine with both admission policies: decisions, counters and the policy registry."""

import pytest

from proxy.core import rfc9111
from proxy.core.admission import AdmissionConfig, make_policy
from proxy.core.engine import CacheEngine
from proxy.core.events import (
    FIRST_SIGHTING,
    Answer,
    Bypass,
    Fetch,
    FromCache,
    Hit,
    Miss,
    NotStored,
    Refuse,
    RequestMeta,
    ResponseMeta,
    Revalidate,
    Stale,
    Store,
)
from proxy.core.responses import response_meta
from proxy.core.store import CacheStore

OK = ResponseMeta()
DATE = "Sun, 06 Nov 1994 08:49:37 GMT"


def engine(policy: str = "second-hit", cache: int = 10_000, **kw) -> CacheEngine:
    store = CacheStore(cache, kw.pop("max_object_bytes", None))
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
    short = ResponseMeta(lifetime=10.0)
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
    store = CacheStore(100)
    with pytest.raises(
        ValueError, match=r"'second-hit'\?.*always, auto, nth-hit:N, probabilistic:P, second-hit"
    ):
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


# HTTP semantics: the engine driven with real header lists, as the proxy drives it.


def get(url: str, *headers: tuple[str, str]) -> RequestMeta:
    return RequestMeta(url, "GET", tuple(headers))


def origin(e: CacheEngine, request: RequestMeta, now: float, status=200, *headers, size=100):
    meta = response_meta(request, status, list(headers), now, now)
    return e.on_response(request, meta, size, now)


def test_rfc9111_4_1_vary_stores_one_variant_per_selecting_header_value():
    e = engine("always")
    gz, br = get("/a", ("Accept-Encoding", "gzip")), get("/a", ("Accept-Encoding", "br"))
    vary = ("Vary", "Accept-Encoding")
    origin(e, gz, 0.0, 200, ("Cache-Control", "max-age=60"), vary)
    assert isinstance(e.lookup(gz, 1.0), Hit)
    assert e.lookup(br, 1.0) == Miss("uri-miss")
    origin(e, br, 1.0, 200, ("Cache-Control", "max-age=60"), vary)
    assert isinstance(e.lookup(br, 2.0), Hit) and isinstance(e.lookup(gz, 2.0), Hit)
    assert e.removals.invalidate("/a") == 2 and e.lookup(gz, 3.0) == Miss("uri-miss")


def test_second_hit_counts_a_url_not_its_variants():
    e = engine()
    vary, fresh = ("Vary", "Accept-Language"), ("Cache-Control", "max-age=60")
    assert origin(e, get("/v", ("Accept-Language", "en")), 0.0, 200, fresh, vary) == FIRST_SIGHTING
    stored = origin(e, get("/v", ("Accept-Language", "fr")), 1.0, 200, fresh, vary)
    assert isinstance(stored, Store)


def test_rfc9111_4_3_4_304_refreshes_headers_and_lifetime():
    e = engine("always")
    request = get("/r")
    origin(e, request, 0.0, 200, ("Cache-Control", "max-age=10"), ("ETag", '"v1"'))
    stale = e.lookup(request, 20.0)
    assert isinstance(stale, Stale) and not stale.serve_stale
    e.on_not_modified(stale.entry, [("Cache-Control", "max-age=100"), ("X-Fresh", "1")], 20.0, 20.0)
    hit = e.lookup(request, 50.0)
    assert isinstance(hit, Hit) and hit.age == 30.0
    assert ("X-Fresh", "1") in hit.entry.headers and ("ETag", '"v1"') in hit.entry.headers
    assert e.stats()["revalidated"] == 1


@pytest.mark.parametrize("eviction", ["lru", "s3fifo", "sieve", "wtinylfu", "twoq"])
def test_a_peeked_hit_counts_and_moves_nothing_where_lookup_counts_and_moves_it(eviction):
    def filled() -> CacheEngine:
        store = CacheStore(1_200, eviction=eviction)
        e = CacheEngine(store, make_policy(AdmissionConfig(policy="always"), store))
        for i in range(8):
            origin(e, get(f"/{i}"), 0.0, 200, ("Cache-Control", "max-age=60"))
        return e

    peeked, untouched, looked_up = filled(), filled(), filled()
    before = peeked.stats()
    hit = peeked.fresh(get("/0"), 1.0)
    assert isinstance(hit, Hit) and peeked.stats() == before  # nothing counted
    found = looked_up.lookup(get("/0"), 1.0)
    assert isinstance(found, Hit) and (found.entry.key, found.age) == ("/0", hit.age)
    assert looked_up.stats()["hits"] == before["hits"] + 1
    for i in range(8, 14):  # past capacity: the oldest entry stays only if its hit moved it
        for e in (peeked, untouched, looked_up):
            origin(e, get(f"/{i}"), 2.0, 200, ("Cache-Control", "max-age=60"))
    assert peeked.stats() == untouched.stats()
    assert sorted(peeked.store) == sorted(untouched.store)


def test_a_peek_finds_no_hit_where_the_rules_say_miss():
    e = engine("always")
    origin(e, get("/s"), 0.0, 200, ("Cache-Control", "max-age=10"))
    origin(e, get("/c"), 0.0, 200, ("Cache-Control", "max-age=60"))
    origin(e, get("/v", ("Accept-Language", "en")), 0.0, 200,
           ("Cache-Control", "max-age=60"), ("Vary", "Accept-Language"))  # fmt: skip
    before = e.stats()
    assert e.fresh(get("/s"), 20.0) is None  # stale
    assert e.fresh(get("/c", ("Cache-Control", "no-cache")), 1.0) is None
    assert e.fresh(get("/c", ("Cookie", "id=1")), 1.0) is None  # private to its client
    assert e.fresh(RequestMeta("/c", "POST"), 1.0) is None
    assert e.fresh(get("/v"), 1.0) is None  # variants are chosen on fields
    assert isinstance(e.fresh(get("/v", ("Accept-Language", "en")), 1.0), Hit)
    assert e.stats() == before


def test_rfc9111_5_2_request_no_cache_and_max_age_force_revalidation():
    e = engine("always")
    origin(e, get("/n"), 0.0, 200, ("Cache-Control", "max-age=100"))
    assert isinstance(e.lookup(get("/n", ("Cache-Control", "no-cache")), 1.0), Stale)
    assert isinstance(e.lookup(get("/n", ("Pragma", "no-cache")), 3.0), Stale)
    assert isinstance(e.lookup(get("/n", ("Cache-Control", "max-age=5")), 10.0), Stale)
    assert isinstance(e.lookup(get("/n"), 10.0), Hit)


def test_a_client_makes_a_url_revalidate_at_most_once_a_second_or_never_when_ignored():
    """100 requests with no-cache in a second cost one revalidation: the others are
    answered by it (a client cannot make every request an origin fetch). With
    ``client_revalidation = "ignore"`` (nginx's way) none revalidates a fresh response; a
    stale one still does, whatever the client asked."""
    e = engine("always")
    origin(e, get("/n"), 0.0, 200, ("Cache-Control", "max-age=100"))
    asks = [e.lookup(get("/n", ("Cache-Control", "no-cache")), 1.0 + i / 100) for i in range(100)]
    assert [type(a) for a in asks] == [Stale] + [Hit] * 99
    assert isinstance(e.lookup(get("/n", ("Pragma", "no-cache")), 2.0), Stale)  # a second on
    assert e.stats()["requests"] == 101 and e.stats()["hits"] == 99
    e.client_revalidation = "ignore"
    for asks_for in (("Cache-Control", "no-cache"), ("Cache-Control", "max-age=0"),
                     ("Pragma", "no-cache"), ("Cache-Control", "min-fresh=1000")):  # fmt: skip
        assert isinstance(e.lookup(get("/n", asks_for), 50.0), Hit), asks_for
    assert isinstance(e.lookup(get("/n", ("Cache-Control", "no-cache")), 150.0), Stale)


def test_rfc5861_stale_while_revalidate_and_stale_if_error():
    e = engine("always")
    request = get("/s")
    cc = ("Cache-Control", "max-age=10, stale-while-revalidate=30, stale-if-error=300")
    origin(e, request, 0.0, 200, cc)
    swr = e.lookup(request, 20.0)
    assert isinstance(swr, Stale) and swr.serve_stale
    late = e.lookup(request, 100.0)
    assert isinstance(late, Stale) and not late.serve_stale
    # The plan: answer within stale-while-revalidate and refresh behind; past it, revalidate,
    # with the stale entry allowed to answer if the origin fails.
    planned = e.plan(request, 20.0)
    assert isinstance(planned, FromCache) and not planned.fresh and planned.refresh
    assert e.stats()["stale_served"] == 1
    revalidate = e.plan(request, 100.0)
    assert isinstance(revalidate, Revalidate) and revalidate.on_error
    assert not e.plan(request, 400.0).on_error


def test_rfc9111_4_2_3_age_includes_what_the_response_brought():
    e = engine("always")
    request = get("/age")
    origin(e, request, 100.0, 200, ("Cache-Control", "max-age=60"), ("Age", "50"))
    hit = e.lookup(request, 105.0)
    assert isinstance(hit, Hit) and hit.age == 55.0
    assert isinstance(e.lookup(request, 111.0), Stale)


def test_uncacheable_reason_comes_from_the_http_rules():
    e = engine("always")
    assert origin(e, get("/p"), 0.0, 200, ("Cache-Control", "private")) == NotStored("private")
    assert origin(e, get("/c"), 0.0, 200, ("Set-Cookie", "a=1")) == NotStored("set-cookie")


def test_rfc9111_4_4_unsafe_methods_bypass_and_invalidate():
    e = engine("always")
    origin(e, get("/u"), 0.0, 200, ("Cache-Control", "max-age=60"))
    post = RequestMeta("/u", "POST")
    assert e.lookup(post, 1.0) == Bypass("method")
    assert e.on_unsafe_response(post, 500, 1.0) == 0 and isinstance(e.lookup(get("/u"), 1.0), Hit)
    assert e.on_unsafe_response(post, 201, 1.0) == 1
    assert e.lookup(get("/u"), 2.0) == Miss("uri-miss")
    assert e.stats()["bypass"] == 1


def test_purge_prefix_removes_matching_urls_only():
    e = engine("always")
    for url in ("http://h/img/1", "http://h/img/2", "http://h/css/1"):
        origin(e, get(url), 0.0, 200, ("Cache-Control", "max-age=60"))
    assert e.removals.purge("prefix", "http://h/img/", 1.0).count == 2
    assert e.stats()["entries"] == 1


def test_origin_that_stops_varying_replaces_its_variants():
    e = engine("always")
    request = get("/x", ("Accept", "a"))
    origin(e, request, 0.0, 200, ("Vary", "Accept"), ("Cache-Control", "max-age=60"))
    origin(e, get("/x"), 1.0, 200, ("Cache-Control", "max-age=60"))
    assert isinstance(e.lookup(request, 2.0), Hit) and e.stats()["entries"] == 1


def test_rfc9111_4_3_4_a_304_keeps_the_stored_status():
    e = engine("always")
    request = get("/gone")
    origin(e, request, 0.0, 404, ("Cache-Control", "max-age=10"), ("ETag", '"g"'))
    stale = e.lookup(request, 20.0)
    assert isinstance(stale, Stale)
    e.on_not_modified(stale.entry, [("Cache-Control", "max-age=100")], 20.0, 20.0)
    hit = e.lookup(request, 30.0)
    assert isinstance(hit, Hit) and hit.entry.status == 404 and hit.entry.lifetime == 100.0


def test_rfc9111_4_3_4_a_304_that_grows_the_headers_recharges_the_entry():
    store = CacheStore(100_000, entry_overhead=1536)
    e = CacheEngine(store, make_policy(AdmissionConfig(policy="always"), store))
    request = get("/h")
    origin(e, request, 0.0, 200, ("Cache-Control", "max-age=0"))
    before = store.bytes_used
    stale = e.lookup(request, 1.0)
    e.on_not_modified(stale.entry, [("X-Big", "b" * 2000)], 1.0, 1.0)
    assert store.bytes_used > before + 2000 and store.bytes_used == stale.entry.charge


def test_rfc9111_4_3_4_a_full_response_that_may_not_be_stored_replaces_the_stored_one():
    e = engine("always")
    request = get("/r")
    origin(e, request, 0.0, 200, ("Cache-Control", "max-age=0"))
    assert isinstance(e.plan(request, 1.0), Revalidate)
    outcome = origin(e, request, 1.0, 200, ("Cache-Control", "no-store"))
    assert outcome == NotStored("no-store") and e.stats()["entries"] == 0


def test_a_server_error_to_a_revalidation_keeps_the_stored_response():
    e = engine("always")
    request = get("/r")
    origin(e, request, 0.0, 200, ("Cache-Control", "max-age=0"))
    origin(e, request, 1.0, 503)
    assert e.stats()["entries"] == 1


def test_rfc9111_5_2_1_7_only_if_cached_on_a_stale_entry_never_contacts_the_origin():
    e = engine("always")
    origin(e, get("/o"), 0.0, 200, ("Cache-Control", "max-age=10"))
    offline = ("Cache-Control", "only-if-cached")
    assert e.plan(get("/o", offline), 20.0) == Refuse(
        504, "only-if-cached: the stored response is stale", "stale"
    )
    served = e.plan(get("/o", ("Cache-Control", "only-if-cached, max-stale=60")), 20.0)
    assert isinstance(served, FromCache) and not served.fresh and not served.refresh


def test_an_uncacheable_url_goes_straight_to_the_origin_for_hit_for_miss_seconds():
    store = CacheStore(10_000)
    e = CacheEngine(store, make_policy(AdmissionConfig(policy="always"), store), hit_for_miss=5.0)
    request = get("/p")
    assert e.plan(request, 0.0) == Fetch("uri-miss", whole=True, collapse=True)
    origin(e, request, 0.0, 200, ("Cache-Control", "private"))
    assert e.plan(request, 1.0) == Fetch("bypass", whole=False, collapse=False)
    assert e.plan(request, 6.0) == Fetch("uri-miss", whole=True, collapse=True)
    assert e.stats()["hit_for_miss"] == 1


# Request fields as a plain sequence and as the proxy indexes them (``plan`` and ``answer``
# look the fields they read up at once when indexed).
FIELD_FORMS = pytest.mark.parametrize("form", [tuple, rfc9111.Fields])


@FIELD_FORMS
@pytest.mark.parametrize(
    "field", [("If-Match", '"v1"'), ("If-Unmodified-Since", DATE), ("Cache-Control", "no-store")]
)
def test_a_get_with_a_precondition_or_no_store_goes_to_the_origin_as_sent(field, form):
    e = engine()
    plan = e.plan(RequestMeta("/w", "GET", form([field, ("Range", "bytes=0-9")])), 0.0)
    assert plan == Fetch("uri-miss", whole=False, collapse=False)


@FIELD_FORMS
def test_a_miss_with_a_cookie_goes_to_the_origin_as_sent_and_is_never_collapsed(form):
    e = engine()
    plain = RequestMeta("/c", "GET", form([("Accept", "*/*")]))
    assert e.plan(plain, 0.0) == Fetch("uri-miss", whole=True, collapse=True)
    with_cookie = RequestMeta("/c", "GET", form([("Accept", "*/*"), ("Cookie", "s=1")]))
    assert e.plan(with_cookie, 0.0) == Fetch("bypass", whole=False, collapse=False)


@FIELD_FORMS
def test_rfc9110_13_1_3_if_modified_since_alone_is_answered_304_from_a_whole_response(form):
    e = engine()
    request = RequestMeta("/m", "GET", form([("If-Modified-Since", DATE)]))
    assert e.answer(request, 200, [("Last-Modified", DATE)], 10) == Answer(304)


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ((), Answer(200)),
        ((("If-None-Match", '"v"'),), Answer(304)),
        ((("If-None-Match", '"other"'),), Answer(200)),
        ((("Range", "bytes=2-4"),), Answer(206, 2, 4)),
        ((("Range", "bytes=50-"),), Answer(416)),
        ((("Range", "bytes=2-4"), ("If-Range", '"other"')), Answer(200)),
    ],
)
def test_rfc9110_13_and_14_client_conditionals_and_ranges_are_answered_from_a_whole_response(
    asked, expected
):
    e = engine()
    assert e.answer(get("/a", *asked), 200, [("ETag", '"v"')], 10) == expected
    s = e.stats()
    assert s["not_modified_answers"] == (expected.status == 304)
    assert s["range_answers"] == (expected.status in (206, 416))


def test_the_vary_index_holds_only_stored_variants():
    store = CacheStore(2_000)
    e = CacheEngine(store, make_policy(AdmissionConfig(policy="always"), store))
    for i in range(500):
        request = get("/v", ("User-Agent", f"agent {i}"))
        origin(e, request, float(i), 200, ("Cache-Control", "max-age=60"), ("Vary", "User-Agent"))
    assert len(store) == 20 and e.variants.size() == 20
    e.removals.invalidate("/v")
    assert len(store) == 0 and e.variants.size() == 0


@pytest.mark.parametrize(
    ("headers", "kept"),
    [
        ((("Content-Type", "text/html"),), False),  # nothing to be fresh for or revalidate
        ((("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"),), True),  # a heuristic, 4.2.2
        ((("ETag", '"v1"'),), True),  # stale at once, but revalidated with its tag
        ((("Cache-Control", "max-age=0"),), True),  # explicit: a client's max-stale may take it
        ((("Cache-Control", "public, stale-if-error=60"),), True),
    ],
)
def test_rfc9111_4_2_a_response_that_can_never_answer_is_not_written(headers, kept):
    e = engine("always")
    request = get("/missing")
    decision = origin(e, request, 0.0, 404, *headers)  # (a simulator's has no fields at all)
    assert (decision == NotStored("never-fresh")) is not kept
    assert ("http://example.test/missing" in e.store or "/missing" in e.store) is kept
    e.grace = 60.0  # with a grace it may yet answer while the origin fails: written
    assert isinstance(origin(e, get("/graced"), 0.0, 404, *headers), Store)
