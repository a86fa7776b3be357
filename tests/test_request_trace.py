"""One request's decisions on demand (``GET /trace`` on the admin port, ``onehit-proxy
trace URL``, ``proxy.wire.trace``): a real request through the data port, and what the proxy
decided for it, step by step."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp
import pytest
from conftest import Clock, admin, base, served
from test_disk_live import DISK, drop_from_page_cache
from test_servers import Backend

HOST = {"Host": "example.test"}


async def trace(client, service, url="http://example.test/a", **query):
    async with client.get(admin(service) + "/trace", params={"url": url, **query}) as r:
        return r.status, await r.json()


def steps_of(answer) -> dict[str, list[dict]]:
    named: dict[str, list[dict]] = {}
    for step in answer["steps"]:
        named.setdefault(step["step"], []).append(step)
    return named


async def test_a_miss_then_a_store_then_a_hit_are_traced_step_by_step(origin, start_proxy, client):
    origin.set("/a", body=b"a" * 300, headers={"Cache-Control": "max-age=600"})
    service = await start_proxy()
    _, first = await trace(client, service)
    _, second = await trace(client, service)
    _, third = await trace(client, service)
    assert first["status"] == 200 and first["bytes_after_head"] == 300
    route, plan, fetched, response = (steps_of(first)[n][0]
                                      for n in ("route", "plan", "origin", "response"))  # fmt: skip
    assert route["key"] == "http://example.test/a" and route["origin"] == origin.url + "/a"
    assert route["pid"] == os.getpid() and plan["action"] == "fetch"
    assert plan["reason"] == "uri-miss" and fetched == {"step": "origin", "server": origin.url,
                                                       "status": 200}  # fmt: skip
    assert response["storable"] and response["lifetime"] == 600
    assert response["memory"] == "first-sighting"  # admission's verdict: seen once
    assert steps_of(second)["response"][0]["memory"] == "keeps"  # the second sighting
    [hit] = steps_of(third)["plan"]
    assert (hit["action"], hit["tier"], hit["lifetime"]) == ("hit", "memory", 600)
    assert "origin" not in steps_of(third) and third["steps"][-1]["origin_ms"] is None
    assert first["steps"][-1]["origin_ms"] > 0 and origin.hits["/a"] == 2
    cache_status = dict(third["headers"])["Cache-Status"]
    assert cache_status.startswith("onehit; hit")
    # Traced requests are real: the proxy counted them as any client's.
    assert service.proxy.engine.stats()["hits"] == 1


async def test_a_revalidation_and_a_background_refresh_are_traced_as_they_went(
    origin, start_proxy, client
):
    """A stale entry revalidated (304): the plan names its validators, the step after the
    origin's the refreshed lifetime. One served stale while it is refreshed in the
    background (stale-while-revalidate): the refresh is another task's, not in the trace."""
    fields = {"Cache-Control": "max-age=10, stale-while-revalidate=30", "ETag": '"v1"'}
    origin.set("/r", headers=fields, not_modified_etag='"v1"')
    origin.set("/s", headers={"Cache-Control": "max-age=10, stale-while-revalidate=30"})
    clock = Clock()
    service = await start_proxy(clock=clock)
    for path in ("/r", "/s"):
        for _ in range(2):
            await trace(client, service, f"http://example.test{path}")
    clock.now += 15  # /s: stale, within its stale-while-revalidate
    _, answer = await trace(client, service, "http://example.test/s")
    named = steps_of(answer)
    assert (named["plan"][0]["action"], named["plan"][0]["refresh"]) == ("stale", True)
    await origin.arrived("/s", 3)  # the background refresh went to the origin
    assert "origin" not in named and answer["steps"][-1]["origin_ms"] is None
    clock.now += 60  # past both: /r revalidates
    _, answer = await trace(client, service, "http://example.test/r")
    named = steps_of(answer)
    assert named["plan"][0]["action"] == "revalidate"
    assert named["plan"][0]["validators"] == ["If-None-Match"]
    assert named["origin"][0]["status"] == 304 and named["refreshed"][0]["lifetime"] == 10


async def test_the_trace_field_never_reaches_the_origin_nor_a_client_without_the_token(
    origin, start_proxy, client
):
    service = await start_proxy()
    await trace(client, service, "http://example.test/t")
    assert not any(k.lower() == "onehit-trace" for k in origin.seen_headers["/t"])
    for shown in ("guess", service.proxy.trace_token[:-1]):
        headers = {**HOST, "Onehit-Trace": shown, "Connection": "close"}
        async with client.get(base(service) + "/u", headers=headers) as r:
            await r.read()
            assert r.status == 200 and "Onehit-Trace" not in r.headers
        assert not any(k.lower() == "onehit-trace" for k in origin.seen_headers["/u"])


async def test_a_disk_hit_and_a_ttl_rule_are_in_the_trace(origin, start_proxy, client, tmp_path):
    origin.set("/d", body=b"d" * 5000)  # max-age=60, which the rule's floor lifts to 120 s
    rules = [{"status": [200], "min": "120s"}]
    first = await start_proxy(disk__path=str(tmp_path), ttl=rules, **DISK)
    for _ in range(2):
        _, answer = await trace(client, first, "http://example.test/d")
    response = steps_of(answer)["response"][0]
    assert response["by_ttl_rule"] and response["lifetime"] == 120
    assert response["tiers_behind_write"] == 1
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), ttl=rules, **DISK)
    drop_from_page_cache(next(tmp_path.glob("region-*.log")))
    _, answer = await trace(client, second, "http://example.test/d")
    named = steps_of(answer)
    assert named["plan"][0]["action"] == "ask the disk tier"
    assert (named["disk"][0]["found"], named["disk"][0]["tier"]) == (True, "disk")
    assert answer["status"] == 200 and answer["bytes_after_head"] == 5000


async def test_a_failed_server_and_the_next_one_asked_are_both_traced(start_proxy, client):
    a, b = Backend("a"), Backend("b")
    await b.start()  # a is never started: its connections are refused
    try:
        routes = [{"host": "www.example.test", "servers": [a.url, b.url]}]
        service = await start_proxy(routes=routes)
        for _ in range(2):  # the round robin may begin on either server
            _, answer = await trace(client, service, "http://www.example.test/s")
            asked = steps_of(answer)["origin"]
            if len(asked) == 2:
                break
        assert [s["server"] for s in asked] == [a.url, b.url]
        assert "failed" in asked[0] and asked[1]["status"] == 200
        assert answer["status"] == 200
    finally:
        await b.stop()


async def test_a_trace_that_cannot_be_sent_says_what_to_give(origin, start_proxy, client):
    service = await start_proxy()
    for query, said in (
        ({"url": ""}, "give ?url="),
        ({"url": "/relative"}, "give an absolute URL"),
        ({"url": "http://example.test/a", "method": "POST"}, "a trace sends GET or HEAD"),
        ({"url": "http://[::1/a"}, "Invalid IPv6 URL"),
        ({"url": "http://exämple.test/a"}, "its IDNA form"),
    ):
        async with client.get(admin(service) + "/trace", params=query) as r:
            assert r.status == 400 and said in (await r.json())["error"]
    assert origin.hits["/a"] == 0
    _, head = await trace(client, service, method="HEAD")
    assert head["status"] == 200 and head["bytes_after_head"] == 0


async def test_a_url_beyond_ascii_is_sent_as_a_client_sends_it_and_the_token_never_shown(
    origin, start_proxy, client
):
    """A path beyond ASCII is percent-encoded, as a client sends it (it was not: the error
    that said so quoted the request, token and all); credentials in an origin's URL are not
    shown."""
    service = await start_proxy(upstream__origin=origin.url.replace("://", "://u:pw@"))
    status, answer = await trace(client, service, "http://example.test/caf\u00e9?q=\u2713")
    assert status == 200 and answer["status"] == 200
    assert answer["request"]["target"] == "/caf%C3%A9?q=%E2%9C%93"
    assert sum(origin.hits.values()) == 1  # it reached the origin
    assert service.proxy.trace_token not in json.dumps(answer)
    assert "pw@" not in json.dumps(answer["steps"])


async def test_a_trace_through_a_proxy_protocol_listener(origin, start_proxy, client):
    service = await start_proxy(server__proxy_protocol=True)
    status, answer = await trace(client, service)
    assert status == 200 and answer["status"] == 200 and steps_of(answer)["plan"]


async def test_the_trace_command_prints_the_running_proxys_answer(origin, start_proxy):
    service = await start_proxy()
    host, port = service.admin_address
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "trace", "http://example.test/c",
        "--origin", origin.url, "--admin-listen", f"{host}:{port}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err
    assert b'"step": "plan"' in out and origin.hits["/c"] == 1


async def test_an_admin_with_a_token_traces_only_for_its_holder(origin, start_proxy):
    service = await start_proxy(admin__token="s3cret")
    async with aiohttp.ClientSession() as client:
        url = admin(service) + "/trace?url=http://example.test/a"
        async with client.get(url) as r:
            assert r.status == 401
        async with client.get(url, headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 200 and (await r.json())["steps"]
    assert origin.hits["/a"] == 1


@pytest.mark.slow
async def test_under_workers_the_parent_traces_through_the_machines_port(origin):
    origin.set("/w", headers={"Cache-Control": "max-age=600"})
    args = ("--origin", origin.url, "--workers", "2", "--set", "server.access_log=false")
    async with served(*args) as (process, _, admin_url), aiohttp.ClientSession() as client:
        async with client.get(admin_url + "/stats") as r:
            pids = {w["pid"] for w in (await r.json())["workers"]}
        answers = []
        for _ in range(3):
            async with client.get(admin_url + "/trace",
                                  params={"url": "http://example.test/w"}) as r:  # fmt: skip
                assert r.status == 200
                answers.append(await r.json())
        assert all(steps_of(a)["route"][0]["pid"] in pids for a in answers)
        # The third is a hit: from the worker's memory, or the tier the workers share.
        decided = [step for step in answers[-1]["steps"] if "action" in step]
        assert decided[-1]["action"] == "hit", answers[-1]["steps"]
        assert origin.hits["/w"] == 2
        process.terminate()
        await process.wait()
