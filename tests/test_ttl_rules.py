"""The operator's TTL rules (``[[ttl]]``, ``proxy.core.ttl_rules``): read through
``response_meta``, the one place an origin response is judged, and live through the proxy."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from conftest import base

from proxy.config.settings import ConfigError, load
from proxy.core.events import RequestMeta
from proxy.core.responses import response_meta
from proxy.core.ttl_rules import TtlRule, TtlRules, host_and_path

URL = "http://example.test/static/app.js"


def judged(headers, status=200, rules=(), request_headers=(), url=URL):
    """(storable, reason, lifetime, by_rule) of a response to a GET of ``url``."""
    meta = response_meta(RequestMeta(url, "GET", tuple(request_headers)), status,
                         tuple(headers), 1000.0, 1000.0, rules=TtlRules(rules))  # fmt: skip
    return meta.cacheable, meta.reason, meta.lifetime, meta.by_rule


def test_a_default_gives_a_response_without_freshness_its_lifetime():
    rule = TtlRule(default=600.0)
    assert judged([("Content-Length", "1")], rules=[rule]) == (True, "", 600.0, True)
    # Without the rule: RFC 9111 alone, no freshness and nothing to guess from.
    assert judged([("Content-Length", "1")])[2] == 0.0


def test_the_origins_freshness_wins_over_a_default():
    rule = TtlRule(default=600.0)
    assert judged([("Cache-Control", "max-age=30")], rules=[rule]) == (True, "", 30.0, False)
    assert judged([("Cache-Control", "s-maxage=40, max-age=5")], rules=[rule])[2] == 40.0


def test_a_default_stands_in_for_the_last_modified_heuristic():
    headers = [("Date", "Thu, 01 Jan 1970 01:00:00 GMT"),
               ("Last-Modified", "Thu, 01 Jan 1970 00:00:00 GMT")]  # fmt: skip
    assert judged(headers)[2] == 360.0  # 10% of an hour
    assert judged(headers, rules=[TtlRule(default=5.0)])[2] == 5.0


def test_min_and_max_bound_the_lifetime_whoever_set_it():
    rule = TtlRule(min=60.0, max=300.0)
    assert judged([("Cache-Control", "max-age=10")], rules=[rule])[2:] == (60.0, True)
    assert judged([("Cache-Control", "max-age=3600")], rules=[rule])[2:] == (300.0, True)
    assert judged([("Cache-Control", "max-age=100")], rules=[rule])[2:] == (100.0, False)


def test_rfc9110_15_4_3_a_302_is_stored_only_with_a_default():
    """A 302 is not heuristically cacheable: only explicit freshness, or an operator's
    default (nginx's ``proxy_cache_valid 302``), stores it."""
    moved = [("Location", "/elsewhere")]
    assert judged(moved, status=302)[:2] == (False, "status")
    assert judged(moved, status=302, rules=[TtlRule(default=60.0)]) == (True, "", 60.0, True)
    # A rule for other statuses leaves it alone.
    assert judged(moved, status=302, rules=[TtlRule(statuses=frozenset({200}), default=60.0)])[
        :2
    ] == (False, "status")


@pytest.mark.parametrize("directive", ["no-store", "private"])
def test_rfc9111_5_2_2_a_directive_that_forbids_storing_is_overridden_only_when_named(directive):
    headers = [("Cache-Control", f"{directive}, max-age=60")]
    assert judged(headers, rules=[TtlRule(default=10.0)])[:2] == (False, directive)
    named = TtlRule(default=10.0, override=frozenset({directive}))
    assert judged(headers, rules=[named]) == (True, "", 60.0, True)


def test_overriding_no_store_leaves_private_in_force():
    headers = [("Cache-Control", "no-store, private, max-age=60")]
    rule = TtlRule(override=frozenset({"no-store"}))
    assert judged(headers, rules=[rule])[:2] == (False, "private")


def test_rfc9111_5_2_2_4_no_cache_overridden_is_served_fresh_without_revalidating():
    headers = [("Cache-Control", "no-cache")]
    rule = TtlRule(default=60.0, override=frozenset({"no-cache"}))
    meta = response_meta(RequestMeta(URL), 200, tuple(headers), 1000.0, 1000.0,
                         rules=TtlRules([rule]))  # fmt: skip
    assert (meta.cacheable, meta.lifetime, "no-cache" in meta.directives) == (True, 60.0, False)
    # The fields pass to clients as the origin sent them.
    assert ("Cache-Control", "no-cache") in meta.headers
    plain = response_meta(RequestMeta(URL), 200, tuple(headers), 1000.0, 1000.0)
    assert "no-cache" in plain.directives


def test_what_is_refused_for_the_requests_sake_no_rule_lifts():
    rule = TtlRule(default=60.0, override=frozenset({"no-store", "private", "no-cache"}))
    asked = [("Authorization", "Bearer x")]
    assert judged([], rules=[rule], request_headers=asked)[:2] == (False, "authorization")
    assert judged([("Set-Cookie", "a=1")], rules=[rule])[:2] == (False, "set-cookie")
    assert judged([("Vary", "*")], rules=[rule])[:2] == (False, "vary-star")
    assert judged([], status=304, rules=[TtlRule(statuses=None, default=60.0)])[:2] == (
        False, "status",
    )  # fmt: skip


def test_the_first_rule_that_matches_host_path_and_status_is_the_responses():
    rules = [
        TtlRule(host="other.test", default=1.0),
        TtlRule(path="/static/", statuses=frozenset({404}), default=2.0),
        TtlRule(path="/static/", default=3.0),
        TtlRule(default=4.0),
    ]
    assert judged([], rules=rules)[2] == 3.0
    assert judged([], status=404, rules=rules)[2] == 2.0
    assert judged([], rules=rules, url="http://other.test:8080/static/x")[2] == 1.0
    assert judged([], rules=rules, url="http://example.test/api?x=/static/")[2] == 4.0


def test_a_store_keys_host_and_path():
    assert host_and_path("http://Example.test:8080/a/b?c=/d") == ("example.test", "/a/b")
    assert host_and_path("http://[::1]:80/x\0v:gzip") == ("[::1]", "/x")
    assert host_and_path("http://example.test") == ("example.test", "/")


def rules_of(*tables):
    overrides = {"upstream.origin": "http://127.0.0.1:1", "ttl": list(tables)}
    return load(env={}, overrides=overrides).ttl


def test_a_ttl_table_is_read_into_a_rule_and_shown_as_written():
    [rule] = rules_of({"host": "CDN.example", "path": "/img/", "status": [200, 404],
                       "default": "10m", "max": "1h", "override": ["no-cache"]})  # fmt: skip
    assert rule == TtlRule("cdn.example", "/img/", frozenset({200, 404}), 600.0, None, 3600.0,
                           frozenset({"no-cache"}))  # fmt: skip
    [default_statuses] = rules_of({"default": "1m"})
    assert default_statuses.statuses == frozenset({200, 301, 302})


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"status": [304], "default": "1m"}, "status [304]"),
        ({"status": "all", "default": "1m"}, "status 'all'"),
        ({"default": "soon"}, "default 'soon'"),
        ({"min": "1h", "max": "1m"}, "min '1h' is above max '1m'"),
        ({"override": ["public"]}, "override ['public']"),
        ({"override": [{}]}, "override [{}]"),
        ({"path": "static/", "default": "1m"}, "path 'static/'"),
        ({"path": "/x"}, "sets nothing"),
        ({"defualt": "1m"}, "unknown: defualt"),
    ],
)
def test_a_bad_ttl_rule_names_its_key_and_the_fix(table, named):
    with pytest.raises(ConfigError, match="ttl") as raised:
        rules_of(table)
    assert named in str(raised.value)


async def test_a_response_without_freshness_is_stored_by_a_rule_and_says_so(origin, start_proxy):
    origin.set("/plain", headers={})  # no Cache-Control, no validators
    service = await start_proxy(admission__policy="always",
                                ttl=[{"path": "/plain", "default": "90s"}])  # fmt: skip
    async with aiohttp.ClientSession() as session:
        async with session.get(base(service) + "/plain") as miss:
            assert "stored; detail=ttl-rule" in miss.headers["Cache-Status"]
        async with session.get(base(service) + "/plain") as hit:
            status = hit.headers["Cache-Status"]
            assert "hit" in status and 85 <= int(status.rpartition("ttl=")[2].split(";")[0]) <= 90
    assert origin.hits["/plain"] == 1


async def test_a_cap_shortens_what_the_origin_allows_and_no_cache_overridden_hits(
    origin, start_proxy
):
    origin.set("/long", headers={"Cache-Control": "max-age=86400"})
    origin.set("/nocache", headers={"Cache-Control": "no-cache"})
    service = await start_proxy(admission__policy="always", ttl=[
        {"path": "/long", "max": "30s"},
        {"path": "/nocache", "default": "1m", "override": ["no-cache"]},
    ])  # fmt: skip
    async with aiohttp.ClientSession() as session:
        for path in ("/long", "/nocache"):
            for _ in range(2):
                async with session.get(base(service) + path) as answer:
                    status, cache_control = (
                        answer.headers["Cache-Status"],
                        answer.headers["Cache-Control"],
                    )
            assert "hit" in status, path
            # What the origin said passes as it said it.
            assert cache_control == origin.paths[path].headers["Cache-Control"]
        assert int(status.rpartition("ttl=")[2]) <= 60
    assert origin.hits["/long"] == origin.hits["/nocache"] == 1


@pytest.mark.parametrize(
    ("asked", "cache_control"),
    [
        ({"Authorization": "Bearer alice"}, "private, must-revalidate, max-age=60"),
        ({"Authorization": "Bearer alice"},
         "max-age=0, no-cache, no-store, must-revalidate, private"),
        ({"Cookie": "session=alice"}, "private, s-maxage=60"),
    ],
)  # fmt: skip
async def test_a_rule_never_shares_what_a_user_was_answered(
    origin, start_proxy, asked, cache_control
):
    """Setting ``private`` (or ``no-store``) aside would let RFC 9111's exceptions for
    shared responses (``must-revalidate``, ``s-maxage``) store an answer to a request a user
    is known by: the rule does not set them aside for such a request."""
    origin.set("/account", body=b"alice's account", headers={"Cache-Control": cache_control})
    rule = {"status": "any", "min": "30s", "override": ["private", "no-store", "no-cache"]}
    service = await start_proxy(admission__policy="always", ttl=[rule])
    async with aiohttp.ClientSession() as session:
        async with session.get(base(service) + "/account", headers=asked) as r:
            assert "stored" not in r.headers["Cache-Status"]
        async with session.get(base(service) + "/account") as anonymous:
            assert "; hit" not in anonymous.headers["Cache-Status"]  # not the user's answer
    assert origin.hits["/account"] == 2


@pytest.mark.parametrize("directive", ["private", "no-store"])
async def test_a_304_keeps_what_its_rule_stored(origin, start_proxy, directive):
    """A stored response whose rule set ``directive`` aside is refreshed by a 304, not
    forgotten as unstorable."""
    origin.set("/page", headers={"Cache-Control": f"{directive}, max-age=1", "ETag": '"v1"'},
               not_modified_etag='"v1"')  # fmt: skip
    service = await start_proxy(admission__policy="always",
                                ttl=[{"path": "/page", "override": [directive]}])  # fmt: skip
    statuses = []
    async with aiohttp.ClientSession() as session:
        for wait in (0, 0, 1.1, 0):
            await asyncio.sleep(wait)
            async with session.get(base(service) + "/page") as r:
                statuses.append(r.headers["Cache-Status"])
    assert "stored" in statuses[0] and "hit" in statuses[1]
    assert "fwd-status=304" in statuses[2] and "hit" in statuses[3], statuses
