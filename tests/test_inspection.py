"""A look inside the cache (``GET /cache`` on the admin port, ``onehit-proxy inspect``): what is
stored for a URL and what the cache thinks of it, read without changing any of it."""

from __future__ import annotations

import asyncio
import os
import sys

from conftest import admin, base

HOST = {"Host": "example.test"}


async def look(client, service, **query):
    async with client.get(admin(service) + "/cache", params=query) as r:
        return r.status, await r.json()


async def get(client, service, path, headers=HOST):
    async with client.get(base(service) + path, headers=headers) as r:
        await r.read()
        return r.headers.get("X-Cache")


async def test_a_stored_url_is_shown_with_its_freshness_validators_and_hits(
    origin, start_proxy, client
):
    origin.set("/a", headers={"Cache-Control": "max-age=600", "ETag": '"v1"',
                              "Surrogate-Key": "shop item-1"})  # fmt: skip
    service = await start_proxy()
    for _ in range(5):  # two sightings store it, three hits
        await get(client, service, "/a")
    status, seen = await look(client, service, url="http://example.test/a")
    assert status == 200 and seen["key"] == "http://example.test/a"
    memory = seen["memory"]
    assert (memory["status"], memory["size"], memory["hits"]) == (200, 21, 3)
    assert memory["fresh"] and 595 <= memory["ttl"] <= 600 and memory["lifetime"] == 600
    assert memory["validators"]["etag"] == '"v1"' and sorted(memory["tags"]) == ["item-1", "shop"]
    assert seen["disk"] == "no disk tier" and seen["admission"]["seen_in_window"] is True


async def test_looking_changes_no_count_no_order_and_no_sighting(origin, start_proxy, client):
    service = await start_proxy()
    for _ in range(3):
        await get(client, service, "/a")
    before = service.proxy.engine.stats()
    for _ in range(3):
        _, seen = await look(client, service, url="http://example.test/a")
        _, unseen = await look(client, service, url="http://example.test/new")
    assert service.proxy.engine.stats() == before and seen["memory"]["hits"] == 1
    assert unseen["memory"] is None and unseen["admission"]["seen_in_window"] is False
    # Asked about three times, /new is still a first sighting: its first response is not kept.
    await get(client, service, "/new")
    _, after = await look(client, service, url="http://example.test/new")
    assert after["memory"] is None and after["admission"]["seen_in_window"] is True


async def test_a_record_on_disk_and_the_variants_in_memory_are_shown(
    origin, start_proxy, client, tmp_path
):
    origin.set("/v", headers={"Cache-Control": "max-age=60", "Vary": "Accept-Language"})
    service = await start_proxy(admission__policy="always", disk__path=str(tmp_path),
                                disk__size="4MiB", disk__region_size="1MiB",
                                disk__policy="always")  # fmt: skip
    await get(client, service, "/a")
    for language in ("en", "fr"):
        await get(client, service, "/v", {**HOST, "Accept-Language": language})
    service.proxy.engine.store.delete("http://example.test/a")  # only the disk holds it now
    _, seen = await look(client, service, url="http://example.test/a")
    assert seen["memory"] is None and seen["disk"]["status"] == 200
    assert seen["disk"]["size"] == 21 and seen["disk"]["hits"] is None
    _, varied = await look(client, service, url="http://example.test/v")
    assert varied["variants"]["vary"] == ["accept-language"]
    assert len(varied["variants"]["memory"]) == 2 and varied["memory"] is None


async def test_a_url_passed_to_the_origin_for_a_while_says_for_how_long(
    origin, start_proxy, client
):
    origin.set("/private", headers={"Cache-Control": "private"})
    service = await start_proxy(cache__hit_for_miss="30s")
    await get(client, service, "/private")
    _, seen = await look(client, service, url="http://example.test/private")
    assert 29 <= seen["hit_for_miss"] <= 30


async def test_a_prefix_lists_memorys_keys_bounded(origin, start_proxy, client):
    service = await start_proxy(admission__policy="always")
    for i in range(12):
        await get(client, service, f"/dir/{i}")
    await get(client, service, "/other")
    _, some = await look(client, service, prefix="http://example.test/dir/", limit="5")
    assert len(some["keys"]) == 5 and some["truncated"]
    _, every = await look(client, service, prefix="http://example.test/dir/", limit="100")
    assert (
        sorted(k["key"] for k in every["keys"])
        == sorted(f"http://example.test/dir/{i}" for i in range(12))
        and not every["truncated"]
        and every["scanned"] == 13
    )


async def test_a_query_that_names_nothing_or_too_much_is_refused_with_the_fix(start_proxy, client):
    service = await start_proxy()
    for query in ({}, {"prefix": "http://example.test/", "limit": "0"},
                  {"prefix": "http://example.test/", "limit": "many"},
                  {"url": "http://bad host/x"}):  # fmt: skip
        status, answer = await look(client, service, **query)
        assert status == 400 and answer["error"], query


async def test_the_inspect_command_asks_the_running_proxy(origin, start_proxy, client):
    service = await start_proxy()
    for _ in range(2):
        await get(client, service, "/a")
    host, port = service.admin_address
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "--admin-listen", f"{host}:{port}", "--origin",
        origin.url, "inspect", "http://example.test/a",  # the order docs/operations.md shows
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err
    assert b'"key": "http://example.test/a"' in out and b'"status": 200' in out
