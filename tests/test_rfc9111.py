"""HTTP caching rules of a shared cache; each test names the section it pins."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import rfc9110 as h
from proxy.core import rfc9111 as r

DATE = "Sun, 06 Nov 1994 08:49:37 GMT"
T0 = 784111777.0


def test_rfc9111_5_2_directives_parse_forgivingly():
    d = r.parse_directives(['max-age="60", No-Cache ,  private="set-cookie, x"', "max-age=5"])
    assert d == {"max-age": "60", "no-cache": None, "private": "set-cookie, x"}


def test_rfc9111_1_2_2_delta_seconds_cap_and_invalid_values():
    assert r.delta_seconds("10") == 10
    assert r.delta_seconds("99999999999999") == 2**31
    for bad in ("-1", "1.5", "ten", "", None, "١٢"):
        assert r.delta_seconds(bad) is None


def test_rfc9110_5_6_7_http_date_three_forms():
    for form in (DATE, "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"):
        assert h.http_date(form) == T0
    assert (
        h.http_date("06 Nov 1994") is None and h.http_date("Sun, 32 Nov 1994 08:49:37 GMT") is None
    )


@pytest.mark.parametrize(
    ("req", "resp", "status", "ok", "why"),
    [
        ([], [("Cache-Control", "max-age=60")], 200, True, ""),
        ([], [], 200, True, ""),  # heuristically cacheable
        ([], [], 302, False, "status"),  # not heuristically cacheable, no explicit freshness
        ([], [("Cache-Control", "max-age=60")], 302, True, ""),
        ([], [("Cache-Control", "no-store")], 200, False, "no-store"),
        ([], [("Cache-Control", "private")], 200, False, "private"),
        ([("Cache-Control", "no-store")], [], 200, False, "request-no-store"),
        ([], [("Vary", "Accept, *")], 200, False, "vary-star"),
        ([("Authorization", "Bearer x")], [], 200, False, "authorization"),
        ([("Authorization", "Bearer x")], [("Cache-Control", "public")], 200, True, ""),
        ([("Authorization", "Bearer x")], [("Cache-Control", "s-maxage=5")], 200, True, ""),
        ([], [("Set-Cookie", "a=b")], 200, False, "set-cookie"),
        ([], [("Set-Cookie2", "a=b")], 200, False, "set-cookie"),
        ([], [], 500, False, "status"),
        # Answers to the request's own preconditions or Range, whatever their freshness: stored,
        # they would answer requests without them (a cache-poisoning denial of service).
        ([("If-Match", '"x"')], [("Cache-Control", "max-age=60")], 412, False, "status"),
        ([("Range", "bytes=9-")], [("Cache-Control", "public, max-age=60")], 416, False, "status"),
    ],
)
def test_rfc9111_3_storing_responses_in_a_shared_cache(req, resp, status, ok, why):
    assert r.storable("GET", status, req, resp) == (ok, why)


@pytest.mark.parametrize(
    ("stored", "answer", "selects"),
    [
        ([("ETag", '"v1"')], [("ETag", '"v1"')], True),
        ([("ETag", '"v1"')], [("ETag", '"v2"')], False),
        ([("ETag", 'W/"v1"')], [("ETag", 'W/"v1"')], True),
        ([("ETag", '"v1"')], [("ETag", 'W/"v1"')], True),  # a weak one: the weak comparison
        ([("ETag", 'W/"v1"')], [("ETag", '"v1"')], False),  # a strong one: the same strong tag
        ([("ETag", '"v1"')], [("ETag", '"v1"'), ("ETag", '"v2"')], False),
        ([("ETag", '"v1"')], [("ETag", '"v1", "v2"')], False),
        ([], [("ETag", '"v1"')], False),
        ([("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT")],
         [("Last-Modified", "Thursday, 01-Jan-26 00:00:00 GMT")], True),
        ([("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT")],
         [("Last-Modified", "Fri, 02 Jan 2026 00:00:00 GMT")], False),
        ([], [("Last-Modified", "Fri, 02 Jan 2026 00:00:00 GMT")], False),
        ([("ETag", '"v1"')], [("Date", "Fri, 02 Jan 2026 00:00:00 GMT")], True),
    ],
)  # fmt: skip
def test_rfc9111_4_3_4_a_304_selects_the_stored_response_its_validators_name(
    stored, answer, selects
):
    assert r.validates(stored, answer) is selects


def test_rfc9111_3_set_cookie_may_be_stored_when_configured():
    assert r.storable("GET", 200, [], [("Set-Cookie", "a=b")], allow_set_cookie=True)[0]
    assert r.storable("POST", 200, [], [])[1] == "method"
    assert r.storable("HEAD", 200, [], [])[1] == "method"


def test_rfc9213_cdn_cache_control_overrides_cache_control():
    headers = [("Cache-Control", "no-store"), ("CDN-Cache-Control", "max-age=30")]
    assert r.storable("GET", 200, [], headers) == (True, "")
    assert r.freshness_lifetime(200, headers) == 30


@pytest.mark.parametrize(
    ("headers", "lifetime"),
    [
        ([("Cache-Control", "max-age=60, s-maxage=10")], 10),  # 5.2.2.10 shared caches
        ([("Cache-Control", "max-age=60")], 60),
        ([("Cache-Control", "max-age=bogus")], 0),  # 4.2.1 invalid: stale
        ([("Date", DATE), ("Expires", "Sun, 06 Nov 1994 08:59:37 GMT")], 600),
        ([("Date", DATE), ("Expires", "0")], 0),  # 5.3 invalid Expires: already expired
        ([("Date", DATE), ("Last-Modified", "Sun, 06 Nov 1994 06:49:37 GMT")], 720),  # 4.2.2
        ([("Date", DATE), ("Last-Modified", "Sun, 06 Nov 1960 06:49:37 GMT")], 86400),  # capped
        ([], 0),
    ],
)
def test_rfc9111_4_2_1_freshness_lifetime(headers, lifetime):
    assert r.freshness_lifetime(200, headers) == lifetime


def test_rfc9111_4_2_3_current_age():
    headers = [("Date", DATE), ("Age", "5")]
    # sent at T0-2, received at T0+3 (apparent age 3, delay 5: corrected age 10), now T0+13
    assert r.current_age(headers, T0 - 2, T0 + 3, T0 + 13) == 20
    assert r.current_age([], T0, T0, T0 + 7) == 7


def test_rfc9111_5_2_request_directives_max_age_min_fresh():
    def fresh(*headers):
        return r.fresh_enough(60, 10, r.request_directives(list(headers)))

    assert fresh()
    assert not fresh(("Cache-Control", "max-age=5"))
    assert not fresh(("Cache-Control", "min-fresh=55"))
    assert fresh(("Cache-Control", "min-fresh=40"))


def test_rfc9111_5_4_pragma_no_cache_without_cache_control():
    def revalidate(response, request):
        return r.must_revalidate_before_use(
            r.response_directives(response), r.request_directives(request)
        )

    assert revalidate([], [("Pragma", "no-cache")])
    assert not revalidate([], [("Pragma", "no-cache"), ("Cache-Control", "x")])
    assert revalidate([("Cache-Control", "no-cache")], [])


def stale_ok(age, request=(), response=(), origin_failed=False, lifetime=10):
    return r.may_serve_stale(
        lifetime,
        age,
        r.request_directives(list(request)),
        r.response_directives(list(response)),
        origin_failed=origin_failed,
    )


def test_rfc9111_5_2_2_must_revalidate_forbids_stale_and_max_stale_allows_it():
    assert stale_ok(20, [("Cache-Control", "max-stale")])
    assert stale_ok(20, [("Cache-Control", "max-stale=15")])
    assert not stale_ok(20, [("Cache-Control", "max-stale=5")])
    for directive in ("must-revalidate", "proxy-revalidate", "s-maxage=10"):
        assert not stale_ok(20, [("Cache-Control", "max-stale")], [("Cache-Control", directive)])


def test_rfc5861_stale_while_revalidate_and_stale_if_error():
    swr = [("Cache-Control", "max-age=10, stale-while-revalidate=30")]
    assert stale_ok(35, response=swr)
    assert not stale_ok(45, response=swr)
    sie = [("Cache-Control", "max-age=10, stale-if-error=60")]
    assert not stale_ok(35, response=sie)
    assert stale_ok(35, response=sie, origin_failed=True)


def test_rfc9111_4_2_4_without_grace_a_response_exactly_its_lifetime_old_is_not_served_on_error():
    """Fresh means younger than its lifetime: at exactly its lifetime a response is stale, and
    with no grace and no stale-if-error nothing lets it answer for a failed origin (before,
    ``staleness <= grace`` held at 0 stale seconds with no grace at all)."""
    assert not r.may_serve_stale(10.0, 10.0, {}, {}, origin_failed=True)
    assert r.may_serve_stale(10.0, 10.0, {}, {}, origin_failed=True, grace=5.0)
    assert r.may_serve_stale(10.0, 15.0, {}, {}, origin_failed=True, grace=5.0)
    assert not r.may_serve_stale(10.0, 15.5, {}, {}, origin_failed=True, grace=5.0)


def test_rfc9213_2_1_a_quoted_max_age_leaves_cache_control_no_store_in_force():
    headers = [("CDN-Cache-Control", 'max-age="10000"'), ("Cache-Control", "no-store")]
    assert r.storable("GET", 200, [], headers) == (False, "no-store")


@pytest.mark.parametrize("side", ["response", "request"])
@pytest.mark.parametrize(
    "stale", ["stale-while-revalidate=30", "stale-if-error=60"], ids=["swr", "sie"]
)
def test_rfc9111_5_2_2_4_no_cache_forbids_any_stale_answer_swr_and_sie_included(side, stale):
    """Section 4.2.4: a cache must not serve a stale response a directive prohibits."""
    response = [("Cache-Control", f"max-age=10, {stale}")]
    request = [("Cache-Control", "no-cache")]
    if side == "response":
        response, request = [("Cache-Control", f"max-age=10, no-cache, {stale}")], []
    for failed in (False, True):
        assert not stale_ok(5, request, response, origin_failed=failed)
        assert not stale_ok(15, request, response, origin_failed=failed)


@pytest.mark.parametrize(
    "value",
    ["bytes=\u00b2-", "bytes=0-\u00b2", "bytes=-\u0663", "bytes=" + "9" * 5000 + "-",
     "bytes=0-" + "9" * 5000, "bytes=-" + "9" * 5000],
)  # fmt: skip
def test_rfc9110_14_1_1_a_range_of_odd_digits_is_ignored_or_unsatisfiable_never_an_error(value):
    answer = h.byte_range([("Range", value)], [], 100)
    if "9" * 5000 in value and not value.startswith("bytes=9"):
        assert answer == (0, 99)  # a last byte past the end is the end
    elif value.startswith("bytes=9"):
        assert answer is False  # a first byte past the end: 416
    else:
        assert answer is None  # not ASCII digits: not a valid range-spec


def test_rfc9111_1_2_2_delta_seconds_of_thousands_of_digits_are_capped_not_parsed():
    assert r.delta_seconds("9" * 5000) == r.DELTA_SECONDS_CAP
    assert r.delta_seconds("0" * 5000 + "7") == 7
    assert r.delta_seconds("\u00b2") is None
    assert r.freshness_lifetime(200, [("Cache-Control", "max-age=" + "9" * 5000)]) == 2**31


@pytest.mark.parametrize(
    ("cookie", "private"),
    [
        ("_ga=GA1.1; _gid=x", False),
        ("_ga=1, session=alice", True),  # a comma some servers split on: a second pair
        ("=alice", True),  # no name: what an origin reads of it is not ours to guess
        ("alice", True),
        ("_ga=1;", False),
        ("session=alice", True),
    ],
)
def test_rfc6265_5_4_a_cookie_that_is_not_a_plain_ignored_pair_makes_a_request_private(
    cookie, private
):
    assert r.carries_cookie([("Cookie", cookie)], ("_ga", "_gid")) is private


def test_rfc9111_5_2_1_7_only_if_cached():
    assert r.only_if_cached([("Cache-Control", "only-if-cached")])


def test_rfc9111_4_1_vary_selects_variants_by_normalized_values():
    names = r.vary_names([("Vary", "Accept-Encoding, accept-language"), ("Vary", "")])
    assert names == ("accept-encoding", "accept-language")
    a = r.vary_key(names, [("Accept-Encoding", "gzip,  br"), ("Accept-Language", "en")])
    b = r.vary_key(names, [("accept-encoding", "gzip, br"), ("ACCEPT-LANGUAGE", "en")])
    c = r.vary_key(names, [("Accept-Encoding", "identity")])
    assert a == b != c
    # Language tags and codings are case-insensitive: spacing and case select nothing new.
    d = r.vary_key(names, [("Accept-Encoding", "GZIP ,br"), ("Accept-Language", "EN")])
    assert d == a
    e = r.vary_key(names, [("Accept-Language", "en-US;q=0.8, fr")])
    f = r.vary_key(names, [("Accept-Language", "en-us; q=0.8,fr")])
    assert e == f != r.vary_key(names, [("Accept-Language", "fr, en-US;q=0.8")])


def test_rfc9111_4_3_1_validators_become_conditional_headers():
    stored = [("ETag", '"v1"'), ("Last-Modified", DATE)]
    assert r.conditional_headers(stored) == [("If-None-Match", '"v1"'), ("If-Modified-Since", DATE)]


def test_rfc9111_4_3_4_304_updates_stored_headers_but_not_framing():
    stored = [("ETag", '"v1"'), ("Cache-Control", "max-age=1"), ("Content-Length", "5")]
    fresh = [("Cache-Control", "max-age=99"), ("Content-Length", "0"), ("X-New", "1")]
    updated = r.updated_by_304(stored, fresh)
    assert r.get_all(updated, "cache-control") == ["max-age=99"]
    assert r.get_all(updated, "content-length") == ["5"]
    assert r.get_first(updated, "x-new") == "1" and r.get_first(updated, "etag") == '"v1"'


def test_rfc9110_13_1_client_conditionals_answered_from_stored_validators():
    stored = [("ETag", 'W/"v1"'), ("Last-Modified", DATE)]
    assert h.not_modified([("If-None-Match", '"v0", "v1"')], stored)  # weak comparison
    assert h.not_modified([("If-None-Match", "*")], stored)
    assert not h.not_modified([("If-None-Match", '"v2"')], stored)
    assert h.not_modified([("If-Modified-Since", DATE)], stored)
    assert not h.not_modified([("If-Modified-Since", "Sat, 05 Nov 1994 08:49:37 GMT")], stored)


def test_rfc9111_4_4_unsafe_methods_invalidate_on_success_only():
    assert r.invalidates("POST", 200) and r.invalidates("DELETE", 302)
    assert not r.invalidates("POST", 500) and not r.invalidates("GET", 200)


header_text = st.text(alphabet=st.characters(codec="latin-1"), max_size=80)
header_lists = st.lists(
    st.tuples(st.sampled_from(["Cache-Control", "CDN-Cache-Control", "Expires", "Date", "Age",
                               "Last-Modified", "Vary", "ETag", "Pragma", "Authorization",
                               "If-None-Match", "If-Modified-Since"]), header_text),
    max_size=8,
)  # fmt: skip


@given(header_lists, header_lists, st.integers(100, 599), st.floats(-1e9, 1e10))
def test_parsers_never_raise_on_hostile_headers(req, resp, status, now):
    lifetime = r.freshness_lifetime(status, resp)
    assert lifetime >= 0
    r.storable("GET", status, req, resp)
    age = r.current_age(resp, now, now, now)
    assert age >= 0
    r.fresh_enough(lifetime, age, r.request_directives(req))
    stale_ok(age, req, resp, origin_failed=True, lifetime=lifetime)
    r.vary_key(r.vary_names(resp), req)
    h.not_modified(req, resp)
    r.updated_by_304(resp, req)


response_values = st.one_of(
    header_text,
    st.sampled_from(['max-age=60', 'no-cache, max-age="5"', 'private="a, b", s-maxage=9',
                     "public", "max-age=0, must-understand", DATE, "0", "12, 30", "Accept, *",
                     "accept-encoding", "x=1; y=2"]),
)  # fmt: skip
response_lists = st.lists(
    st.tuples(st.sampled_from(["Cache-Control", "cache-control", "CDN-Cache-Control", "Expires",
                               "Date", "DATE", "Age", "Last-Modified", "Vary", "Set-Cookie"]),
              response_values),
    max_size=8,
)  # fmt: skip


@given(response_lists, st.integers(100, 599))
def test_response_rules_read_fields_indexed_once_as_they_read_the_pairs(resp, status):
    fields = r.Fields(resp)
    assert r.response_directives(fields) == r.response_directives(resp)
    assert r.storable("GET", status, [("Cookie", "a=1")], fields) == r.storable(
        "GET", status, [("Cookie", "a=1")], resp
    )
    assert r.freshness_lifetime(status, fields, T0) == r.freshness_lifetime(status, resp, T0)
    assert r.current_age(fields, T0, T0 + 1, T0 + 5) == r.current_age(resp, T0, T0 + 1, T0 + 5)
    assert r.vary_names(fields) == r.vary_names(resp)
    for name in ("expires", "Set-Cookie", "date"):
        assert r.get_all(fields, name) == r.get_all(resp, name)
        assert r.get_first(fields, name) == r.get_first(resp, name)


request_lists = st.lists(
    st.tuples(st.sampled_from(["Cache-Control", "Pragma", "Cookie", "cookie", "Range", "If-Range",
                               "If-None-Match", "If-Modified-Since", "Accept-Encoding", "Host"]),
              st.one_of(header_text, st.sampled_from(["no-cache", "max-age=5, only-if-cached",
                                                      "a=1; b=2", "bytes=0-9", '"v1"', DATE,
                                                      "gzip, br"]))),
    max_size=8,
)  # fmt: skip


@given(request_lists, response_lists)
def test_request_rules_read_fields_indexed_once_as_they_read_the_pairs(req, stored):
    fields = r.Fields(req)
    assert list(fields) == req and len(fields) == len(req) and fields == tuple(req)
    assert r.request_directives(fields) == r.request_directives(req)
    assert r.carries_cookie(fields, ("b*",)) == r.carries_cookie(req, ("b*",))
    assert r.vary_key(("accept-encoding", "cookie"), fields) == r.vary_key(
        ("accept-encoding", "cookie"), req
    )
    assert h.not_modified(fields, stored) == h.not_modified(req, stored)
    assert h.byte_range(fields, stored, 100) == h.byte_range(req, stored, 100)


def test_rfc9110_7_6_1_hop_by_hop_fields_are_not_forwarded():
    headers = [
        ("Connection", "close, X-Secret"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("Proxy-Authorization", "Basic x"),
        ("X-Secret", "1"),
        ("Upgrade", "h2c"),
        ("TE", "trailers"),
        ("Content-Type", "text/plain"),
    ]
    assert h.end_to_end(headers) == [("Content-Type", "text/plain")]


def test_rfc9111_3_partial_content_is_not_stored():
    assert r.storable("GET", 206, [], [("Cache-Control", "max-age=60")]) == (False, "partial")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bytes=0-9", (0, 9)),
        ("bytes=90-", (90, 99)),
        ("bytes=-10", (90, 99)),
        ("bytes=95-200", (95, 99)),
        ("bytes=100-", False),  # 416
        ("bytes=-0", False),
        ("bytes=0-1,5-6", None),  # several ranges: the whole representation
        ("items=0-1", None),
        ("bytes=9-2", None),  # invalid: ignored
        ("bytes=x-2", None),
    ],
)
def test_rfc9110_14_byte_ranges_of_a_stored_response(value, expected):
    assert h.byte_range([("Range", value)], [], 100) == expected


def test_rfc9110_13_1_5_if_range_sends_the_whole_when_it_does_not_match():
    stored = [("ETag", '"v1"'), ("Last-Modified", DATE)]
    ask = [("Range", "bytes=0-0")]
    assert h.byte_range([*ask, ("If-Range", '"v1"')], stored, 10) == (0, 0)
    assert h.byte_range([*ask, ("If-Range", '"v2"')], stored, 10) is None
    assert h.byte_range([*ask, ("If-Range", DATE)], stored, 10) == (0, 0)
    assert h.byte_range([*ask, ("If-Range", 'W/"v1"')], stored, 10) is None


def test_rfc9111_5_1_age_takes_the_first_member_of_a_list_and_ignores_invalid_values():
    assert r.age_value([("Age", "30")]) == 30
    assert r.age_value([("Age", "30, 60")]) == 30
    assert r.age_value([("Age", "30"), ("Age", "60")]) == 30
    assert r.age_value([("Age", "-5")]) is None
    assert r.age_value([("Age", "abc")]) is None
    assert r.age_value([]) is None
    # An invalid Age adds nothing to the age: it is ignored, not read as a number.
    assert r.current_age([("Age", "3e9")], 100.0, 100.0, 100.0) == 0.0


@pytest.mark.parametrize(
    ("status", "cc", "ok", "why"),
    [
        (402, "max-age=60", True, ""),  # any final status with explicit freshness (section 3)
        (418, "s-maxage=60", True, ""),
        (402, "", False, "status"),  # not heuristically cacheable (RFC 9110 15.1)
        (404, "", True, ""),  # heuristically cacheable
        (103, "max-age=60", False, "status"),  # not final
        (304, "max-age=60", False, "status"),
        (200, "no-store, must-understand, max-age=60", True, ""),  # 5.2.2.3
        (418, "no-store, must-understand, max-age=60", False, "status"),
        (200, "no-store", False, "no-store"),
    ],
)
def test_rfc9111_3_storable_statuses_and_must_understand(status, cc, ok, why):
    headers = [("Cache-Control", cc)] if cc else []
    assert r.storable("GET", status, [], headers) == (ok, why)


def test_rfc9111_4_2_1_expires_without_date_counts_from_the_response_time():
    headers = [("Expires", "Thu, 01 Jan 2026 00:01:40 GMT")]
    arrived = 1767225600.0  # 2026-01-01 00:00:00 UTC
    assert r.freshness_lifetime(200, headers, arrived) == 100.0
    assert r.freshness_lifetime(200, headers) == 0.0  # no time to count from: expired


def test_rfc9111_5_3_an_invalid_expires_means_already_expired():
    date = ("Date", "Thu, 01 Jan 2026 00:00:00 GMT")
    for value in ("0", "-1", "tomorrow", "Thu, 01 Jan 2026 25:00:00 GMT"):
        assert r.freshness_lifetime(200, [date, ("Expires", value)], 0.0) == 0.0


def test_rfc9110_5_6_7_the_gmt_zone_is_matched_case_insensitively():
    assert h.http_date("Thu, 01 Jan 2026 00:00:00 gmt") == 1767225600.0
    assert h.http_date("Thursday, 01-Jan-26 00:00:00 Gmt") == 1767225600.0


@pytest.mark.parametrize(
    ("targeted", "expected"),
    [
        ("max-age=60", {"max-age": "60"}),
        ("no-store", {"no-store": None}),
        ("max-age=60, no-store=?0", {"max-age": "60"}),  # a false Boolean is absent
        ('max-age=60, private="x"', {"max-age": "60", "private": "x"}),
        ("max-age=60, Bad-Key", {"max-age": "600"}),  # upper case: not a dictionary
        ("max-age=6 0", {"max-age": "600"}),  # not one item: not a dictionary
        ("max-age=60,, no-store", {"max-age": "600"}),
        # A directive whose value has the wrong type is invalid and ignored; when none is
        # left, the field is, and Cache-Control applies.
        ('max-age="10000"', {"max-age": "600"}),
        ("max-age=-5", {"max-age": "600"}),
        ("max-age=1.5, no-store", {"no-store": None}),
        ('max-age="10", stale-if-error=30', {"stale-if-error": "30"}),
    ],
)
def test_rfc9213_2_1_cdn_cache_control_is_a_structured_dictionary_or_ignored(targeted, expected):
    headers = [("Cache-Control", "max-age=600"), ("CDN-Cache-Control", targeted)]
    assert r.response_directives(headers) == expected


FIELD_NAMES = ("Content-Type", "ETag", "Cache-Control", "connection", "Keep-Alive", "TE",
               "Trailer", "Transfer-Encoding", "Upgrade", "Proxy-Authorization",
               "proxy-connection", "PROXY-", "Proxy", "X-Caf\u00e9", "\u212a-Kelvin", "",
               "x-a", "X-A")  # fmt: skip


def _random_fields(rng: random.Random) -> list:
    fields: list = []
    for _ in range(rng.randrange(0, 9)):
        name = "".join(c.upper() if rng.random() < 0.3 else c for c in rng.choice(FIELD_NAMES))
        value = rng.choice(["1", "", "x-a, Keep-Alive", " te ", "close", "caf\u00e9"])
        fields.append((name, value) if rng.random() < 0.9 else [name, value])
    return fields


def test_rfc9110_7_6_1_the_compiled_end_to_end_filter_answers_as_the_rule_in_full():
    rng = random.Random(7)
    compiled = 0
    for _ in range(3000):
        fields = _random_fields(rng)
        assert h.end_to_end(fields) == h._end_to_end(fields), fields
        compiled += not any(k.lower() == "connection" for k, _ in fields)
    assert compiled > 1000  # most cases took the compiled filter, not the fallback


def test_fields_index_their_values_by_name_lower_cased_as_str_lower_does():
    rng = random.Random(11)
    for _ in range(3000):
        fields = _random_fields(rng)
        expected: dict[str, list[str]] = {}
        for k, v in fields:
            expected.setdefault(k.lower(), []).append(v)
        by_name = r.Fields(fields).by_name
        assert by_name == expected and list(by_name) == list(expected), fields
        assert all(type(k) is str for k in by_name)
    with pytest.raises(ValueError):
        r.Fields([("a", "1", "2")])
    with pytest.raises(ValueError):
        h.end_to_end([("a",)])


def test_names_are_lower_cased_alike_before_and_past_the_bound_on_those_remembered():
    # The compiled pass remembers the lower-cased form of up to 512 names; a client inventing
    # more gets the same index, the rest lower-cased anew.
    for round_ in range(2):
        names = [f"X-Invented-{i}-Name" for i in range(1200)]
        by_name = r.Fields([(name, str(round_)) for name in names]).by_name
        assert list(by_name) == [name.lower() for name in names]
        assert all(type(k) is str for k in by_name)
        again = r.Fields([(name.upper(), "v") for name in names]).by_name
        assert list(again) == list(by_name)


def _indexed_as_given(fields: r.Fields) -> tuple:
    """What a ``Fields`` holds, with its index made apart from the pass that chose it."""
    pairs = tuple(fields)
    assert all(type(pair) is tuple for pair in pairs)
    return pairs, fields.by_name, r.Fields(pairs).by_name


def test_rfc9110_7_6_1_end_to_end_fields_are_the_end_to_end_ones_indexed_in_one_pass():
    rng = random.Random(13)
    for _ in range(3000):
        fields = _random_fields(rng)
        without = frozenset(rng.sample(["x-a", "etag", "te", "proxy"], rng.randrange(3)))
        pairs, by_name, apart = _indexed_as_given(
            h.end_to_end_fields(fields, h.HOP_BY_HOP | without)
        )
        assert list(pairs) == h._end_to_end(fields, h.HOP_BY_HOP | without), fields
        assert by_name == apart and list(by_name) == list(apart), fields


def test_rfc9110_7_6_1_fields_a_proxy_adds_come_after_and_no_connection_names_them_away():
    rng = random.Random(17)
    extra = (("Via", "1.1 onehit"), ("X-Forwarded-For", "10.0.0.1"))
    for _ in range(3000):
        fields = _random_fields(rng)
        if rng.random() < 0.3:
            fields = [*fields, ("Connection", "x-forwarded-for, via")]
        pairs, by_name, apart = _indexed_as_given(h.end_to_end_fields(fields, h.HOP_BY_HOP, extra))
        assert pairs == (*h._end_to_end(fields, h.HOP_BY_HOP), *extra), fields
        assert by_name == apart and list(by_name) == list(apart), fields
