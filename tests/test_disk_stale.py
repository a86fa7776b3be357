"""The disk tier is a whole cache tier (RFC 9111 section 4): a stale record is revalidated with
its validators, its 304 freshens it on disk too, and it is served stale where the rules allow;
a client gets the same answer whether memory or only the disk holds the response."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from conftest import Clock, Origin, admin_purge, base, cold_reads, proxy_in_front
from conftest import fetch_as_client as get
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

DISK = {"disk__size": "8MiB", "disk__region_size": "1MiB", "cache__size": "1MiB",
        "cache__max_object_size": "256KiB", "disk__policy": "always",
        "admission__policy": "always"}  # fmt: skip


FOR_10S = {"Cache-Control": "max-age=10"}
# name: (response fields, what the origin does when asked again, the request's fields)
CASES = {
    "304 revalidation": ({"Cache-Control": "max-age=10", "ETag": '"v1"'}, "304", {}),
    "stale-while-revalidate": (
        {"Cache-Control": "max-age=10, stale-while-revalidate=60", "ETag": '"v1"'}, "304", {}
    ),
    "stale-if-error": ({"Cache-Control": "max-age=10, stale-if-error=60"}, "503", {}),
    "request max-stale": (FOR_10S, "200", {"Cache-Control": "max-stale=60"}),
    "only-if-cached": (FOR_10S, "200", {"Cache-Control": "only-if-cached"}),
}  # fmt: skip


async def answer_when_stale(origin, start_proxy, tmp_path, case: str, holder: str):
    """Store a response, let it go stale (20 s on a 10 s lifetime), and ask again with
    ``holder`` holding it: the memory tier, or only the disk (a restart emptied memory)."""
    fields, then, request = CASES[case]
    clock = Clock()
    origin.set("/x", body=b"stored", headers=fields)
    setup = {"clock": clock, "disk__path": str(tmp_path / holder), **DISK}
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/x"))[2] == b"stored"
    if holder == "disk":
        await proxy.stop()
        proxy = await start_proxy(**setup)
    if then == "304":
        origin.set("/x", body=b"new", headers=fields, not_modified_etag='"v1"')
    else:
        origin.set("/x", body=b"new", headers=fields, status=int(then))
    clock.now += 20
    before = origin.hits["/x"]
    status, headers, body = await get(proxy, "/x", **request)
    # A stale answer may start a refresh in the background: counted once it is done.
    await asyncio.gather(*proxy.proxy.revalidation.background)
    asked = origin.hits["/x"] - before
    conditional = origin.seen_headers["/x"].get("If-None-Match") if asked else None
    return (status, body, asked, conditional, headers.get("Cache-Status")), proxy


@pytest.mark.parametrize("case", CASES)
async def test_a_stale_response_gets_the_same_answer_from_disk_as_from_memory(
    origin, start_proxy, tmp_path, case
):
    from_memory, _ = await answer_when_stale(origin, start_proxy, tmp_path, case, "memory")
    origin.hits.clear()
    from_disk, proxy = await answer_when_stale(origin, start_proxy, tmp_path, case, "disk")
    assert from_disk == from_memory
    counters = proxy.proxy.engine.counters
    assert counters.stale_from_disk + counters.revalidated_from_disk == (
        0 if case == "only-if-cached" else 1
    )


async def test_rfc9111_4_3_4_a_304_freshens_the_disk_record_for_the_next_restart(
    origin, start_proxy, tmp_path
):
    fields = {"Cache-Control": "max-age=10", "ETag": '"v1"'}
    (status, body, asked, conditional, cache_status), proxy = await answer_when_stale(
        origin, start_proxy, tmp_path, "304 revalidation", "disk"
    )
    assert (status, body, asked, conditional) == (200, b"stored", 1, '"v1"')
    assert "fwd=stale" in cache_status and "fwd-status=304" in cache_status
    assert proxy.proxy.engine.counters.revalidated_from_disk == 1
    await proxy.stop()
    clock = Clock()
    clock.now += 25  # stale by the first store's times, fresh by the 304's (at +20)
    origin.set("/x", body=b"new", headers=fields)
    again = await start_proxy(clock=clock, disk__path=str(tmp_path / "disk"), **DISK)
    status, headers, body = await get(again, "/x")
    assert (status, body) == (200, b"stored")
    assert "detail=disk" in headers["Cache-Status"] and "hit" in headers["Cache-Status"]


@settings(max_examples=6, deadline=None)
@given(memory=st.integers(24 << 10, 4 << 20))
def test_whatever_memory_evicted_every_stale_response_is_revalidated_alike(
    tmp_path_factory, memory
):
    """Eight responses of 20 KiB behind a memory tier of any size, from one that evicts all
    but one to the disk to one that holds them all: stale, each is revalidated with its
    validator and answered from what was stored, whichever tier held it."""
    asyncio.run(revalidate_eight(memory, tmp_path_factory.mktemp("disk")))


async def revalidate_eight(memory: int, directory) -> None:
    clock, origin = Clock(), Origin()
    await origin.start()
    fields = {"Cache-Control": "max-age=10", "ETag": '"v1"'}
    sizes = {**DISK, "cache__size": str(memory), "cache__max_object_size": "20KiB"}
    proxy = await proxy_in_front(origin.url, clock, disk__path=str(directory), **sizes)
    try:
        for i in range(8):
            origin.set(f"/o{i}", body=bytes([65 + i]) * 20_000, headers=fields,
                       not_modified_etag='"v1"')  # fmt: skip
            assert (await get(proxy, f"/o{i}"))[0] == 200
        clock.now += 20
        for i in range(8):
            origin.set(f"/o{i}", body=b"new", headers=fields, not_modified_etag='"v1"')
            status, headers, body = await get(proxy, f"/o{i}")
            assert (status, body) == (200, bytes([65 + i]) * 20_000), headers["Cache-Status"]
            assert origin.seen_headers[f"/o{i}"].get("If-None-Match") == '"v1"'
        assert proxy.proxy.engine.counters.revalidated == 8
    finally:
        await proxy.stop()
        await origin.stop()


@pytest.mark.parametrize("holder", ["memory", "disk"])
async def test_rfc9111_4_1_storing_one_variant_leaves_the_others_in_every_tier(
    origin, start_proxy, tmp_path, holder
):
    """Two variants of a URL stored; with memory or only the disk holding them, a new answer
    for one leaves the other answerable (here stale, with max-stale and only-if-cached)."""
    clock = Clock()
    fields = {"Cache-Control": "max-age=10", "Vary": "Accept-Language"}
    setup = {"clock": clock, "disk__path": str(tmp_path), **DISK}
    proxy = await start_proxy(**setup)
    for lang in ("fr", "en"):
        origin.set("/x", body=f"{lang}-1".encode(), headers=fields)
        assert (await get(proxy, "/x", **{"Accept-Language": lang}))[2] == f"{lang}-1".encode()
    if holder == "disk":
        await proxy.stop()
        proxy = await start_proxy(**setup)
    clock.now += 20
    origin.set("/x", body=b"en-2", headers=fields)
    assert (await get(proxy, "/x", **{"Accept-Language": "en"}))[2] == b"en-2"
    offline = {"Accept-Language": "fr", "Cache-Control": "max-stale=1000, only-if-cached"}
    status, _, body = await get(proxy, "/x", **offline)
    assert (status, body) == (200, b"fr-1")


@pytest.mark.parametrize("status", [203, 204, 301, 404, 410, 501])
async def test_every_status_memory_stores_is_answered_from_the_disk_alike(
    origin, start_proxy, tmp_path, status
):
    """Not only 200s: a response of any status the cache may store is a disk record too, and
    after a restart (memory empty) answered from it as memory answered it."""
    body = b"" if status == 204 else b"stored"
    origin.set("/s", status=status, body=body, headers={"Cache-Control": "max-age=60"})
    setup = {"disk__path": str(tmp_path), **DISK}
    proxy = await start_proxy(**setup)
    first = await get(proxy, "/s")
    from_memory = await get(proxy, "/s")
    await proxy.stop()
    proxy = await start_proxy(**setup)
    from_disk = await get(proxy, "/s")
    assert origin.hits["/s"] == 1
    assert first[0] == from_memory[0] == from_disk[0] == status
    assert from_memory[2] == from_disk[2] == body
    assert "detail=disk" in from_disk[1]["Cache-Status"]


async def revalidate_while_memory_evicts(origin, proxy, case: str) -> None:
    """Revalidate /x (stale, ETag v1) and, while its 304 is held back, fill memory so that it
    evicts /x. ``case`` "newer on disk": a client's no-cache request meanwhile stores a newer
    response (ETag v2) on disk, which memory evicts too; "not in the page cache": the disk's
    record cannot be read back without waiting on the device when the 304 comes."""
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held_304(request: web.Request) -> web.StreamResponse:
        if request.headers.get("If-None-Match") == '"v1"' and not asked.is_set():
            asked.set()
            await answer.wait()
            return web.Response(status=304, headers={"ETag": '"v1"', **FOR_10S})
        return web.Response(body=b"newer", headers={"ETag": '"v2"', **FOR_10S})

    origin.responder = held_304
    revalidating = asyncio.ensure_future(get(proxy, "/x"))
    try:
        await asyncio.wait_for(asked.wait(), 5)
        if case == "newer on disk":
            assert (await get(proxy, "/x", **{"Cache-Control": "no-cache"}))[2] == b"newer"
        origin.responder = None
        for i in range(6):  # 1.5 MiB through a memory tier of 1 MiB: /x is evicted
            origin.set(f"/fill{i}", body=bytes(250_000), headers=FOR_10S)
            assert (await get(proxy, f"/fill{i}"))[0] == 200
        assert not any(key.endswith("/x") for key in proxy.proxy.engine.store), "evicted /x"
        if case == "not in the page cache":
            cold_reads(proxy.proxy.disk.log)
    finally:
        answer.set()
    status, _, body = await revalidating
    assert (status, body) == (200, b"stored")


CASES_304 = {"same response": b"stored", "newer on disk": b"newer", "not in the page cache": None}


@pytest.mark.parametrize("case", CASES_304)
async def test_rfc9111_4_3_4_a_304_for_a_response_memory_evicted_meanwhile_freshens_the_disk(
    origin, start_proxy, tmp_path, case
):
    """Memory evicted the entry while its 304 was on the way: the disk's record of the same
    response (the validators the 304 answered) is refreshed, as it would be were memory still
    holding it; a newer response stored meanwhile (other validators) is left as it is; a
    record that cannot be read back to compare is dropped, never kept with its old times."""
    clock = Clock()
    origin.set("/x", body=b"stored", headers={"ETag": '"v1"', **FOR_10S})
    setup = {"clock": clock, "disk__path": str(tmp_path), **DISK}
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/x"))[2] == b"stored"
    clock.now += 20
    await revalidate_while_memory_evicts(origin, proxy, case)
    await proxy.stop()
    proxy = await start_proxy(**setup)
    before = origin.hits["/x"]
    status, headers, body = await get(proxy, "/x")
    if CASES_304[case] is None:
        assert (status, body, origin.hits["/x"]) == (200, b"stored", before + 1)
        assert "If-None-Match" not in origin.seen_headers["/x"], "no record left to revalidate"
        return
    assert (status, body) == (200, CASES_304[case]), headers["Cache-Status"]
    assert "detail=disk" in headers["Cache-Status"] and origin.hits["/x"] == before


@pytest.mark.parametrize("meanwhile", ["purge", "post", "unvaried 200"])
async def test_a_304_in_flight_never_brings_back_a_variant_removed_meanwhile(
    origin, start_proxy, tmp_path, meanwhile
):
    """The en variant of /v is revalidated; before its 304 comes, a purge, an unsafe method or
    an unvaried response removes it (on disk: its anchor goes, the record stays indexed, found
    by no read) and a de request writes a new anchor. The 304 must not write the en record
    again after that anchor, where a read would find it (RFC 9111 sections 4 and 4.4)."""
    clock = Clock()
    setup = {"clock": clock, "disk__path": str(tmp_path), **DISK}
    asked, answer = asyncio.Event(), asyncio.Event()
    state = {"generation": 1, "vary": True}

    async def responder(request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            return web.Response(body=b"posted")
        if request.headers.get("If-None-Match") == '"en1"' and not asked.is_set():
            asked.set()
            await answer.wait()
            return web.Response(status=304, headers={"ETag": '"en1"', **FOR_10S})
        lang, g = request.headers.get("Accept-Language", ""), state["generation"]
        if not state["vary"]:
            return web.Response(body=b"plain", headers={"ETag": f'"p{g}"', **FOR_10S})
        return web.Response(body=f"{lang}-{g}".encode(), headers={
            "ETag": f'"{lang}{g}"', "Vary": "Accept-Language", **FOR_10S})  # fmt: skip

    origin.responder = responder
    proxy = await start_proxy(**setup)
    en = {"Accept-Language": "en"}
    assert (await get(proxy, "/v", **en))[2] == b"en-1"
    clock.now += 20
    revalidating = asyncio.ensure_future(get(proxy, "/v", **en))
    try:
        await asyncio.wait_for(asked.wait(), 5)
        state["generation"] = 2
        if meanwhile == "purge":
            assert (await admin_purge(proxy, {"url": "http://example.test/v"}))["removed"] == 1
        elif meanwhile == "post":
            async with (
                aiohttp.ClientSession() as session,
                session.post(base(proxy) + "/v", data=b"x", headers={"Host": "example.test"}) as r,
            ):
                assert r.status == 200
        else:
            state["vary"] = False
            assert (await get(proxy, "/v", **{"Cache-Control": "no-cache"}))[2] == b"plain"
            state["vary"] = True
        de = {"Accept-Language": "de", "Cache-Control": "no-cache"}
        assert (await get(proxy, "/v", **de))[2] == b"de-2"
    finally:
        answer.set()
    await revalidating
    await proxy.stop()
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/v", **en))[2] == b"en-2"


async def test_an_older_304_never_writes_its_body_over_a_newer_response_with_its_validators(
    origin, start_proxy, tmp_path
):
    """Content changed within the second its Last-Modified names: a newer response (stored,
    memory and disk) carries the validators the older revalidation's 304 answers. The 304
    may refresh only what it validated: never the newer record with the older body."""
    clock = Clock()
    setup = {"clock": clock, "disk__path": str(tmp_path), **DISK}
    modified = {**FOR_10S, "Last-Modified": "Thu, 01 Jan 2026 00:00:00 GMT"}
    asked, answer = asyncio.Event(), asyncio.Event()
    state = {"body": b"OLD"}

    async def responder(request: web.Request) -> web.StreamResponse:
        if request.headers.get("If-Modified-Since") and not asked.is_set():
            asked.set()
            await answer.wait()
            return web.Response(status=304, headers=modified)
        return web.Response(body=state["body"], headers=modified)

    origin.responder = responder
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/x"))[2] == b"OLD"
    clock.now += 20
    revalidating = asyncio.ensure_future(get(proxy, "/x"))
    try:
        await asyncio.wait_for(asked.wait(), 5)
        state["body"] = b"NEW"
        assert (await get(proxy, "/x", **{"Cache-Control": "no-cache"}))[2] == b"NEW"
    finally:
        answer.set()
    await revalidating
    await proxy.stop()
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/x"))[2] == b"NEW"


@pytest.mark.parametrize("field", ["Set-Cookie", "Set-Cookie2"])
async def test_rfc9111_4_3_4_a_cookie_a_304_sets_is_the_revalidating_clients_alone(
    origin, start_proxy, tmp_path, field
):
    """A 304 that sets a cookie updates the stored fields, but a cookie set for one client is
    never replayed to another: the client that revalidated gets it, no hit after it does,
    from memory or from disk (RFC 2965's obsolete Set-Cookie2 alike)."""
    clock = Clock()
    cookie = {field: "session=ALICE", **FOR_10S}
    origin.set("/x", body=b"stored", headers={"ETag": '"v1"', **FOR_10S},
               not_modified_etag='"v1"', headers_304=cookie)  # fmt: skip
    setup = {"clock": clock, "disk__path": str(tmp_path), **DISK}
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/x"))[2] == b"stored"
    clock.now += 20
    _, revalidated, _ = await get(proxy, "/x")
    assert revalidated.get(field) == "session=ALICE", revalidated["Cache-Status"]
    _, hit, _ = await get(proxy, "/x")
    assert "hit" in hit["Cache-Status"] and field not in hit
    await proxy.stop()
    proxy = await start_proxy(**setup)
    _, from_disk, _ = await get(proxy, "/x")
    assert "detail=disk" in from_disk["Cache-Status"] and field not in from_disk


@pytest.mark.parametrize("holder", ["memory", "disk"])
@pytest.mark.parametrize(
    "answer_304",
    [[("ETag", '"v2"')], [("Last-Modified", "Fri, 02 Jan 2026 00:00:00 GMT")],
     [("ETag", '"v1"'), ("ETag", '"v2"')]],
    ids=["another-entity-tag", "another-last-modified", "two-entity-tags"],
)  # fmt: skip
async def test_rfc9111_4_3_4_a_304_with_another_validator_or_two_updates_nothing(
    origin, start_proxy, tmp_path, holder, answer_304
):
    """The stored response is "v1", modified on January 1st. A 304 naming another entity
    tag, another Last-Modified (and no entity tag), or two entity tags, selects no stored
    response: the old body is never served under the new validators; the response is
    fetched whole."""
    clock = Clock()
    state = {"body": b"old", "etag": '"v1"', "modified": "Thu, 01 Jan 2026 00:00:00 GMT"}

    async def responder(request: web.Request) -> web.StreamResponse:
        if request.headers.get("If-None-Match") or request.headers.get("If-Modified-Since"):
            return web.Response(status=304, headers=CIMultiDict([*answer_304, *FOR_10S.items()]))
        return web.Response(body=state["body"], headers={
            "ETag": state["etag"], "Last-Modified": state["modified"], **FOR_10S})  # fmt: skip

    origin.responder = responder
    setup = {"clock": clock, "disk__path": str(tmp_path), **DISK}
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/x"))[2] == b"old"
    if holder == "disk":
        await proxy.stop()
        proxy = await start_proxy(**setup)
    state.update(body=b"new", etag='"v2"', modified="Fri, 02 Jan 2026 00:00:00 GMT")
    clock.now += 20
    status, headers, body = await get(proxy, "/x")
    assert (status, body) == (200, b"new"), headers["Cache-Status"]
    assert (await get(proxy, "/x"))[2] == b"new"


@pytest.mark.parametrize("memory", ["kept", "emptied by a restart"])
async def test_rfc5861_3_a_background_refresh_writes_its_new_response_to_the_disk_tier(
    origin, start_proxy, tmp_path, memory
):
    fields = {"Cache-Control": "max-age=10, stale-while-revalidate=60", "ETag": '"v1"'}
    clock = Clock()
    origin.set("/x", body=b"stored", headers=fields)
    setup = {"clock": clock, "disk__path": str(tmp_path / "disk"), **DISK}
    proxy = await start_proxy(**setup)
    assert (await get(proxy, "/x"))[2] == b"stored"
    origin.set("/x", body=b"refreshed", headers={**fields, "ETag": '"v2"'})
    clock.now += 20
    status, _, body = await get(proxy, "/x")
    assert (status, body) == (200, b"stored")  # stale, while the refresh runs
    await asyncio.gather(*proxy.proxy.revalidation.background)
    if memory == "emptied by a restart":
        await proxy.stop()
        proxy = await start_proxy(**setup)
    before = origin.hits["/x"]
    status, headers, body = await get(proxy, "/x")
    assert (status, body) == (200, b"refreshed")
    assert origin.hits["/x"] == before, headers.get("Cache-Status")


async def test_rfc9110_15_4_5_a_304_that_brings_another_vary_removes_what_it_would_refresh(
    origin, start_proxy, tmp_path
):
    """A response stored unvaried is revalidated; the origin now varies on Accept-Language
    and its 304 says so. Refreshed with that Vary under its old key, it would answer every
    language: it is removed from every tier instead, and each language is fetched."""
    varies = {"value": False}

    async def respond(request: web.Request) -> web.StreamResponse:
        lang = request.headers.get("Accept-Language", "-") if varies["value"] else "-"
        # Stale at once before it varies (so it is revalidated), fresh for a minute after.
        age = "max-age=60" if varies["value"] else "max-age=0"
        fields = {"Cache-Control": age, "ETag": f'"v1-{lang}"'}
        if varies["value"]:
            fields["Vary"] = "Accept-Language"
        if request.headers.get("If-None-Match") == fields["ETag"]:
            return web.Response(status=304, headers=fields)
        return web.Response(body=f"body for {lang}".encode(), headers=fields)

    origin.responder = respond
    proxy = await start_proxy(disk__path=str(tmp_path), **DISK)
    assert (await get(proxy, "/v"))[2] == b"body for -"
    varies["value"] = True
    assert (await get(proxy, "/v"))[2] == b"body for -"  # revalidated: a 304 with a Vary
    _, headers, body = await get(proxy, "/v", **{"Accept-Language": "en"})
    assert body == b"body for en", headers["Cache-Status"]
