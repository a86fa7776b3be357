"""Purges by tag: ``Surrogate-Key`` and ``Cache-Tag`` indexed for the entries stored, charged
against the cache's size, and purged in memory and on disk by ``POST /purge {"tags": [...]}``."""

from __future__ import annotations

import gc
import tracemalloc

import aiohttp
from conftest import admin_purge, base
from conftest import fetch_as_client as get

from loadgen.sim.simulate import build_engine
from proxy.core.admission import AdmissionConfig
from proxy.core.events import TOO_MANY_TAGS, RequestMeta, ResponseMeta
from proxy.core.tags import MAX_TAGS, response_tags

DISK = {"disk__size": "8MiB", "disk__region_size": "1MiB", "cache__size": "1MiB",
        "cache__max_object_size": "256KiB"}  # fmt: skip


def test_tags_are_surrogate_key_tokens_and_cache_tag_items_once_each_in_order():
    headers = (("Surrogate-Key", "p1  all"), ("Cache-Tag", "p2, all ,p3"), ("surrogate-key", "p4"))
    assert response_tags(headers) == ("p1", "all", "p4", "p2", "p3")
    assert response_tags((("Content-Type", "text/html"),)) == ()


def tagged(tags: str) -> ResponseMeta:
    return ResponseMeta(lifetime=600.0, headers=(("Surrogate-Key", tags),))


def test_a_purge_by_tag_removes_the_entries_carrying_it_and_no_other():
    engine = build_engine(1 << 20, AdmissionConfig(policy="always"))
    for key, tags in (("http://a/1", "p1 all"), ("http://a/2", "p2 all"), ("http://a/3", "")):
        engine.on_response(RequestMeta(key), tagged(tags), 100, 0.0)
    assert engine.removals.purge("tags", ["p1"], 3.0).count == 1
    assert engine.store.peek("http://a/1") is None and engine.store.peek("http://a/2")
    assert engine.removals.purge("tags", ["all", "nothing"], 3.0).count == 1
    assert engine.store.peek("http://a/3") is not None and len(engine.tags) == 0
    # A stored response refreshed with other tags is indexed under the new ones only.
    engine.on_response(RequestMeta("http://a/3"), tagged("old"), 100, 1.0)
    engine.on_response(RequestMeta("http://a/3"), tagged("new"), 100, 2.0)
    assert set(engine.tags.keys) == {"new"}
    assert engine.removals.purge("tags", ["old"], 3.0).count == 0
    engine.removals.invalidate("http://a/3")
    assert len(engine.tags) == 0


def test_a_response_with_more_tags_than_a_purge_may_name_is_not_stored():
    engine = build_engine(1 << 20, AdmissionConfig(policy="always"))
    many = " ".join(f"t{i}" for i in range(MAX_TAGS + 1))
    assert engine.on_response(RequestMeta("http://a/x"), tagged(many), 100, 0.0) == TOO_MANY_TAGS
    assert engine.store.peek("http://a/x") is None and len(engine.tags) == 0


def test_a_304_that_brings_more_tags_than_a_purge_may_name_removes_the_stored_entry():
    engine = build_engine(1 << 20, AdmissionConfig(policy="always"))
    engine.on_response(RequestMeta("http://a/x"), tagged("t1"), 100, 0.0)
    entry = engine.store.peek("http://a/x")
    many = " ".join(f"t{i}" for i in range(MAX_TAGS + 1))
    engine.on_not_modified(entry, (("Surrogate-Key", many),), 1.0, 1.0)
    assert engine.store.peek("http://a/x") is None and len(engine.tags) == 0


def test_100000_tags_keep_the_engine_within_its_cache_size():
    """Each tag is charged to its entry: the store evicts for it, and what the engine holds,
    entries and tag index together, stays within the size it was given."""
    size = 8 << 20
    engine = build_engine(size, AdmissionConfig(policy="always"))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2_000):  # 50 tags each, none shared: 100,000 tags
            tags = " ".join(f"tag-{i:05d}-{t:02d}" for t in range(50))
            engine.on_response(RequestMeta(f"http://a/{i}"), tagged(tags), 1_000, float(i))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert engine.store.evictions > 0  # the tags' charge made room
    assert held <= size, f"{held:,} bytes held for a cache of {size:,}"
    assert sum(len(keys) for keys in engine.tags.keys.values()) == 50 * len(engine.store)


async def test_a_purge_by_tag_reaches_memory_and_the_disk_and_outlives_a_restart(
    origin, start_proxy, tmp_path
):
    tags = {"/a": "product-1 all", "/b": "product-2 all", "/c": ""}
    for path, tag in tags.items():
        origin.set(path, body=path.encode() * 300,
                   headers={"Cache-Control": "max-age=600", "Surrogate-Key": tag})  # fmt: skip
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    for _ in range(2):
        for path in tags:
            assert (await get(first, path))[0] == 200
    assert (await admin_purge(first, {"tags": ["product-1"]}))["removed"] == 1  # /a, in memory
    assert (await get(first, "/b"))[1]["X-Cache"] == "HIT"
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), **DISK)  # memory empty, disk holds b, c
    assert (await admin_purge(second, {"tags": ["all"]}))["removed"] == 0
    await second.stop()
    third = await start_proxy(disk__path=str(tmp_path), **DISK)
    for path, from_disk in (("/c", True), ("/a", False), ("/b", False)):
        status, headers, body = await get(third, path)
        assert (status, body) == (200, path.encode() * 300)
        assert ("detail=disk" in headers["Cache-Status"]) is from_disk, path
    assert (origin.hits["/a"], origin.hits["/b"], origin.hits["/c"]) == (3, 3, 2)


async def test_rfc9111_4_3_a_soft_purge_marks_entries_stale_and_the_next_request_revalidates(
    origin, start_proxy
):
    for path, tag in (("/s", "soft"), ("/k", "kept")):
        origin.set(
            path,
            body=b"v" * 500,
            not_modified_etag='"v1"',
            headers={"Cache-Control": "max-age=600", "ETag": '"v1"', "Cache-Tag": tag},
        )
    service = await start_proxy(admission__policy="always")
    for path in ("/s", "/k"):
        assert (await get(service, path))[0] == 200
    assert await admin_purge(service, {"tags": ["soft"], "soft": True}) == {"stale": 1}
    status, _, body = await get(service, "/s")  # revalidated: a 304, the stored body
    assert (status, body) == (200, b"v" * 500)
    assert origin.hits["/s"] == 2 and origin.seen_headers["/s"]["If-None-Match"] == '"v1"'
    assert (await get(service, "/s"))[1]["X-Cache"] == "HIT"  # fresh again
    assert (await get(service, "/k"))[1]["X-Cache"] == "HIT" and origin.hits["/k"] == 1
    host, port = service.admin_address
    async with aiohttp.ClientSession() as session, session.get(f"http://{host}:{port}/stats") as r:
        metrics = (await r.json())["metrics"]
    assert (metrics["soft_purged"], metrics["revalidated"]) == (1, 1)


async def test_rfc9111_5_2_1_2_a_soft_purged_entry_is_not_served_for_a_clients_max_stale(
    origin, start_proxy
):
    """A soft purge marks an entry stale; a client's ``max-stale`` or ``stale-if-error``
    cannot have it served stale (the operator's purge is not the client's to undo): the
    origin's answer is, its failure included. Its own ``stale-while-revalidate`` still may."""
    fields = {"Cache-Control": "max-age=600", "ETag": '"v1"', "Cache-Tag": "t"}
    origin.set("/s", body=b"old", headers=fields)
    service = await start_proxy(admission__policy="always")
    assert (await get(service, "/s"))[2] == b"old"
    for asks, then in (("max-stale", 200), ("max-stale=3600", 200),
                       ("stale-if-error=3600", 503)):  # fmt: skip
        assert await admin_purge(service, {"tags": ["t"], "soft": True}) == {"stale": 1}
        origin.set("/s", body=b"new", headers={**fields, "ETag": '"v2"'}, status=then)
        status, headers, body = await get(service, "/s", **{"Cache-Control": asks})
        assert (status, body) == (then, b"new"), (asks, headers.get("Cache-Status"))
    assert origin.hits["/s"] == 4
    swr = {**fields, "Cache-Control": "max-age=600, stale-while-revalidate=60"}
    origin.set("/s", body=b"swr", headers=swr)
    assert (await get(service, "/s", **{"Cache-Control": "no-cache"}))[2] == b"swr"
    assert await admin_purge(service, {"tags": ["t"], "soft": True}) == {"stale": 1}
    status, headers, body = await get(service, "/s")
    assert (body, headers["X-Cache"]) == (b"swr", "STALE")  # its own rules allow it


async def test_the_tag_fields_are_the_caches_own_and_left_out_of_every_answer(
    origin, start_proxy, tmp_path
):
    """Surrogate-Key and Cache-Tag are kept (a purge by tag reads them) but no client is
    given them: on a miss written at once or streamed, a hit compiled or not, a range, a
    disk hit; with strip_surrogate_keys = false they pass through."""
    for path, body in (("/t", b"t" * 300), ("/big", b"b" * 300_000)):
        fields = {"Cache-Control": "max-age=600", "Surrogate-Key": "k1 k2", "Cache-Tag": "k3"}
        origin.set(path, body=body, headers=fields)
    service = await start_proxy(disk__path=str(tmp_path), **DISK)
    seen = []
    for path, fields in (("/t", {}), ("/big", {}), ("/t", {}), ("/t", {}), ("/big", {}),
                         ("/t", {"Range": "bytes=0-9"}), ("/t", {"Cookie": "a=b"})):  # fmt: skip
        async with (
            aiohttp.ClientSession() as session,
            session.get(base(service) + path, headers={"Host": "example.test", **fields}) as r,
        ):
            await r.read()
            seen.append((r.status, r.headers.get("X-Cache"), {k.lower() for k in r.headers}))
    assert [status for status, _, _ in seen] == [200, 200, 200, 200, 200, 206, 200]
    assert "HIT" in [x for _, x, _ in seen]
    assert all(names.isdisjoint({"surrogate-key", "cache-tag"}) for _, _, names in seen)
    await service.stop()
    again = await start_proxy(disk__path=str(tmp_path), **DISK)
    for _ in range(2):  # disk hits: the second, memory's admission takes
        status, headers, _ = await get(again, "/t")
        assert status == 200 and "detail=disk" in headers["Cache-Status"]
        assert {k.lower() for k in headers}.isdisjoint({"surrogate-key", "cache-tag"})
    # The tags were kept: the copy in memory, made from the record, is purged by one.
    assert (await admin_purge(again, {"tags": ["k3"]}))["removed"] == 1
    passing = await start_proxy(cache__strip_surrogate_keys=False)
    for _ in range(2):
        headers = (await get(passing, "/t"))[1]
        assert (headers["Surrogate-Key"], headers["Cache-Tag"]) == ("k1 k2", "k3")


async def test_a_response_with_more_tags_than_a_purge_may_name_says_it_was_not_stored(
    origin, start_proxy, tmp_path
):
    many = " ".join(f"t{i}" for i in range(MAX_TAGS + 1))
    origin.set("/x", body=b"x", headers={"Cache-Control": "max-age=600", "Surrogate-Key": many})
    proxy = await start_proxy(admission__policy="always", disk__path=str(tmp_path),
                              disk__policy="always", disk__size="8MiB",
                              disk__region_size="1MiB")  # fmt: skip
    url, host = base(proxy) + "/x", {"Host": "example.test"}
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.get(url, headers=host) as r:
                assert r.status == 200 and await r.read() == b"x"
                assert "stored" not in r.headers["Cache-Status"], r.headers["Cache-Status"]
                assert "detail=too-many-tags" in r.headers["Cache-Status"]
    counters = proxy.proxy.engine.counters
    # The second request went straight to the origin, remembered as uncacheable.
    assert (counters.admissions, counters.hit_for_miss, origin.hits["/x"]) == (0, 1, 2)
    # Nor written to disk, where no purge could reach it.
    assert proxy.proxy.disk.tier.counters.bytes_written == 0
