"""Purges across a fleet: three instances on one Redis, a purge asked of one reaches all."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import redis.asyncio
from conftest import REDIS, admin_purge, base

pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")


async def get(service, path: str) -> str:
    url = base(service) + path
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Host": "cdn.example"}) as r:
        await r.read()
        return r.headers["X-Cache"]


async def test_a_purge_asked_of_one_instance_reaches_all_three(redis_server, origin, start_proxy):
    for path in ("/a/1", "/a/2", "/b"):
        origin.set(path, body=b"x" * 100, headers={"Cache-Control": "max-age=600",
                                                  "Surrogate-Key": f"t{path[1]}"})  # fmt: skip
    fleet = {"admission__backend": "redis", "admission__redis_url": redis_server.url,
             "admission__redis_budget": "200ms"}  # fmt: skip
    proxies = [await start_proxy(**fleet) for _ in range(3)]
    await asyncio.gather(*(asyncio.wait_for(p.proxy.fleet.subscribed.wait(), 5) for p in proxies))
    for proxy in proxies:
        for path in ("/a/1", "/a/2", "/b"):
            seen = [await get(proxy, path) for _ in range(3)]  # stored on its second sighting
            assert seen[-1] == "HIT"
    answer = await admin_purge(proxies[0], {"prefix": "http://cdn.example/a/"})
    fleet = answer.pop("fleet")
    assert answer == {"removed": 2, "prefix": "http://cdn.example/a/"}
    # What each other instance removed, and that none was left to answer.
    assert (fleet["reached"], fleet["missing"]) == (2, 0)
    assert sorted(i["removed"] for i in fleet["instances"]) == [2, 2]
    ids = {p.proxy.fleet.id[:12] for p in proxies[1:]}
    assert {i["instance"] for i in fleet["instances"]} == ids
    # The replies' list is gone once read (and would expire unread): Redis keeps nothing.
    channel = proxies[0].proxy.fleet.channel
    assert await proxies[0].proxy.fleet.client.keys(f"{channel}:reply:*") == []
    answer = await admin_purge(proxies[1], {"tags": ["tb"], "soft": True})
    assert answer["stale"] == 1 and answer["fleet"]["reached"] == 2
    for _ in range(50):  # the others apply it as it arrives
        if all(p.proxy.fleet.received == (1 if p is proxies[1] else 2) for p in proxies[1:]):
            break
        await asyncio.sleep(0.05)
    for proxy in proxies:
        assert await get(proxy, "/a/1") != "HIT" and await get(proxy, "/a/2") != "HIT"
        assert proxy.proxy.engine.counters.soft_purged == 1
    assert [p.proxy.fleet.received for p in proxies] == [1, 1, 2]


async def test_a_purge_is_answered_when_the_fleet_cannot_be_told(redis_server, start_proxy):
    fleet = {"admission__backend": "redis", "admission__redis_url": redis_server.url}
    proxy = await start_proxy(**fleet)
    await asyncio.wait_for(proxy.proxy.fleet.subscribed.wait(), 5)
    redis_server.stop()
    answer = await admin_purge(proxy, {"url": "http://cdn.example/x"})
    assert answer == {"removed": 0, "key": "http://cdn.example/x", "fleet": None}


async def test_hostile_messages_on_the_purge_channel_neither_stop_it_nor_flood_the_log(
    redis_server, origin, start_proxy, caplog, tmp_path
):
    origin.set("/x", body=b"x", headers={"Cache-Control": "max-age=600"})
    fleet = {"admission__backend": "redis", "admission__redis_url": redis_server.url,
             "admission__redis_budget": "200ms"}  # fmt: skip
    one = await start_proxy(**fleet)
    two = await start_proxy(**fleet, disk__path=str(tmp_path))  # a key's hash needs UTF-8
    await asyncio.gather(
        *(asyncio.wait_for(p.proxy.fleet.subscribed.wait(), 5) for p in (one, two))
    )
    for _ in range(3):
        await get(two, "/x")
    client = redis.asyncio.Redis.from_url(redis_server.url)
    channel = two.proxy.fleet.channel
    nested = "[" * 100_000 + "]" * 100_000  # past the JSON parser's depth: RecursionError
    surrogate = '{"kind": "url", "value": "http://cdn.example/\\ud800"}'  # a lone surrogate
    for message in [nested, surrogate] * 20:
        await client.publish(channel, message)
    await admin_purge(one, {"url": "http://cdn.example/x"})  # after them, on the same channel
    await client.aclose()
    for _ in range(100):
        if two.proxy.fleet.received >= 21:
            break
        await asyncio.sleep(0.05)
    assert two.proxy.fleet.received == 21  # the 20 surrogates, then the purge: no gap
    assert await get(two, "/x") != "HIT"
    fleet_lines = [r for r in caplog.records if r.name == "onehit.fleet"]
    assert len(fleet_lines) <= 3 and not any(r.exc_info for r in fleet_lines)


@pytest.mark.slow
async def test_a_subscriber_that_never_replies_costs_a_purge_its_wait_not_its_answer(
    redis_server, start_proxy
):
    """A monitoring client (or an older instance) on the channel never replies: the purge
    still says what the other instance removed, and one missing; and a storm of such purges
    leaves the admission filter's connections alone (misses still judged by the fleet's
    filter, /readyz's redis check still ok). The filter's budget is roomy: what is measured
    is whether it can have a connection, not how fast a loaded machine answers."""
    fleet = {"admission__backend": "redis", "admission__redis_url": redis_server.url,
             "admission__redis_budget": "2s", "admission__redis_budget_max": "2s"}  # fmt: skip
    proxies = [await start_proxy(**fleet) for _ in range(2)]
    await asyncio.gather(*(asyncio.wait_for(p.proxy.fleet.subscribed.wait(), 5) for p in proxies))
    silent = redis.asyncio.from_url(redis_server.url).pubsub()
    await silent.subscribe(proxies[0].proxy.fleet.channel)
    try:
        answer = await admin_purge(proxies[0], {"url": "http://cdn.example/x"})
        assert answer["fleet"]["reached"] == 2 and answer["fleet"]["missing"] == 1
        assert [i["removed"] for i in answer["fleet"]["instances"]] == [0]
        storm = [admin_purge(proxies[0], {"url": f"http://cdn.example/{i}"}) for i in range(16)]
        misses = [get(proxies[0], f"/m{i}") for i in range(20)]
        await asyncio.gather(*storm, *misses)
        assert proxies[0].proxy.shared.healthy
    finally:
        await silent.aclose()
