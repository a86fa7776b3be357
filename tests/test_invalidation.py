"""One invalidation contract: whatever the engine removes from memory, it removes from the disk
tier behind it too, journaled, so that no tier answers with what another has forgotten; after a
restart, clean or kill -9, the removal holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiohttp import web
from conftest import Clock, admin_purge, until
from conftest import fetch_as_client as get

from loadgen.sim.simulate import build_engine
from loadgen.sim.tiers import DiskSpec
from proxy.core import slices
from proxy.core.admission import AdmissionConfig
from proxy.core.disk import DiskTier
from proxy.core.engine import CacheEngine
from proxy.core.events import FETCH_WHOLE, Behind, FromCache, RequestMeta, ResponseMeta
from proxy.core.purges import RecentPurges
from proxy.core.responses import response_meta
from proxy.core.store import Entry
from proxy.core.tags import MAX_TAGS

DISK = {"disk__size": "8MiB", "disk__region_size": "1MiB", "cache__size": "1MiB",
        "cache__max_object_size": "256KiB", "disk__policy": "always",
        "cache__hit_for_miss": "5s"}  # fmt: skip


URL = "http://a/x"
ALWAYS = AdmissionConfig(policy="always")
TAGGED = ResponseMeta(lifetime=600.0, headers=(("Surrogate-Key", "t1"), ("ETag", '"v1"')))


def two_tiers() -> tuple[CacheEngine, DiskTier]:
    """An engine whose memory store and disk tier (the simulator's, without I/O) both hold
    ``URL``, a slice of it and the anchors of both."""
    engine = build_engine(1 << 20, ALWAYS)
    tier = DiskSpec(8 << 20, region_size=1 << 20, admission=ALWAYS).behind(engine, None)
    engine.on_response(RequestMeta(URL), TAGGED, 100, 0.0)  # the engine writes the tier
    assert tier.find(URL) is not None
    for key in (slices.anchor_key(URL), slices.slice_key(URL, 0)):
        assert tier.offer(key, 100, 200, 0.0) is not None
    return engine, tier


def uncacheable(directive: str) -> ResponseMeta:
    request = RequestMeta(URL)
    return response_meta(request, 200, (("Cache-Control", directive),), 1.0, 1.0)


REMOVALS: dict[str, Callable[[CacheEngine], object]] = {
    "unsafe method": lambda e: e.on_unsafe_response(RequestMeta(URL, "POST"), 204, 0.0),
    "now private": lambda e: e.on_response(RequestMeta(URL), uncacheable("private"), 1, 1.0),
    "now no-store": lambda e: e.on_response(RequestMeta(URL), uncacheable("no-store"), 1, 1.0),
    "304 past the tag limit": lambda e: e.on_not_modified(
        e.store.peek(URL), (("Surrogate-Key", " ".join(map(str, range(MAX_TAGS + 1)))),), 1, 1
    ),
    "a 304 that makes it private": lambda e: e.on_not_modified(
        e.store.peek(URL), (("Cache-Control", "private"),), 1, 1
    ),
    "a newer response": lambda e: e.on_response(RequestMeta(URL), TAGGED, 100, 1.0),
    "a newer response too large to keep": lambda e: e.on_response(
        RequestMeta(URL), TAGGED, 2 << 20, 1.0
    ),
    "now varies": lambda e: e.on_response(
        RequestMeta(URL), ResponseMeta(lifetime=60.0, vary=("accept",)), 1, 1.0
    ),
    "purge": lambda e: e.removals.purge("url", URL, 1.0),
    "soft purge": lambda e: e.removals.purge("url", URL, 1.0, soft=True),
    "purge by prefix": lambda e: e.removals.purge("prefix", "http://a/", 1.0),
    "soft purge by prefix": lambda e: e.removals.purge("prefix", "http://a/", 1.0, soft=True),
}


@pytest.mark.parametrize("removal", REMOVALS)
def test_every_removal_the_engine_decides_reaches_the_tier_behind_the_store(removal):
    engine, tier = two_tiers()
    before = tier.find(URL)
    REMOVALS[removal](engine)
    after = tier.find(URL)
    if removal == "a newer response":  # the tier takes it: written after the older copy
        assert after is not None and after.offset > before.offset
    else:
        assert after is None, f"{removal} left the disk's copy"
    # The slices and variants of the URL are found only after their anchors: gone with them.
    assert tier.find(slices.anchor_key(URL)) is None


def test_rfc9111_4_3_4_a_304_rewrites_the_tiers_copy_with_the_refreshed_fields():
    engine, tier = two_tiers()
    before = tier.find(URL)
    engine.on_not_modified(engine.store.peek(URL), (("Cache-Control", "max-age=1"),), 1, 1)
    after = tier.find(URL)
    assert after is not None and (after.region, after.offset) > (before.region, before.offset)
    assert tier.find(slices.anchor_key(URL)) is not None  # its slices stay: the same object


@pytest.mark.parametrize("case", ["memory evicted it meanwhile", "nothing to match"])
def test_a_304_the_simulators_tier_cannot_match_to_its_copy_forgets_the_copy(case):
    """The simulator's tier keeps no fields to compare validators with: it trusts only the
    copy memory still holds, and a 304 that answered validators at all."""
    engine, tier = two_tiers()
    entry = engine.store.peek(URL)
    if case == "memory evicted it meanwhile":
        engine.store.delete(URL)
    else:
        entry.headers = (("Surrogate-Key", "t1"),)  # no validator: it was asked unconditionally
    engine.on_not_modified(entry, (("Cache-Control", "max-age=1"),), 1, 1)
    assert tier.find(URL) is None


@pytest.mark.parametrize("soft", [False, True])
def test_a_purge_by_tag_reaches_the_tier_behind_the_store(soft):
    engine, tier = two_tiers()
    purged = engine.removals.purge("tags", ["t1"], 1.0, soft=soft)
    assert purged.count == 1 and purged.durable
    # The index holds hashes, not tags: the ban is met when a record carrying it is read.
    assert [(tag, by_tag) for tag, _, _, by_tag in tier.bans] == [("t1", True)]
    assert tier.tag_banned(("t1",), tier.find(URL))


@pytest.mark.parametrize(
    "credentials", [("Cookie", "session=1"), ("Authorization", "Bearer x")], ids=lambda c: c[0]
)
def test_a_private_answer_to_a_request_with_credentials_leaves_the_shared_copy(credentials):
    """The origin may answer one user privately while every other client shares the public
    copy: a client sending a cookie must not empty the cache for everyone."""
    engine, tier = two_tiers()
    request = RequestMeta(URL, headers=(credentials,))
    private = response_meta(request, 200, (("Cache-Control", "private"),), 1.0, 1.0)
    engine.on_response(request, private, 1, 1.0)
    assert URL in engine.store and tier.find(URL) is not None
    engine.on_response(RequestMeta(URL), uncacheable("private"), 1, 1.0)  # without: it goes
    assert URL not in engine.store and tier.find(URL) is None


def test_slices_of_a_changed_object_leave_every_tier():
    engine, tier = two_tiers()
    engine.removals.remove_slices(URL)
    assert tier.find(slices.anchor_key(URL)) is None and tier.find(URL) is not None


@pytest.mark.parametrize("directive", ["private", "no-store"])
async def test_a_url_the_origin_made_uncacheable_is_not_served_from_the_disk_copy(
    origin, start_proxy, tmp_path, directive
):
    clock = Clock()
    origin.set("/x", body=b"old-public", headers={"Cache-Control": "public, max-age=60"})
    proxy = await start_proxy(clock=clock, disk__path=str(tmp_path), **DISK)
    assert (await get(proxy, "/x"))[2] == b"old-public"  # stored in memory and on disk
    origin.set("/x", body=b"new-private", headers={"Cache-Control": f"{directive}, max-age=60"})
    _, headers, body = await get(proxy, "/x", **{"Cache-Control": "no-cache"})
    assert body == b"new-private"
    clock.now += 6  # past hit_for_miss: the next request consults the cache again
    _, headers, body = await get(proxy, "/x")
    # RFC 9111 section 4.3.4/3: the origin replaced the stored response and said no shared
    # cache may keep the new one; the old copy is gone from every tier.
    assert body == b"new-private", headers.get("Cache-Status")
    assert "detail=disk" not in headers["Cache-Status"]


async def test_the_disk_copy_of_a_url_made_uncacheable_stays_gone_after_a_restart(
    origin, start_proxy, tmp_path
):
    settings = {"disk__path": str(tmp_path), **DISK}
    origin.set("/x", body=b"old-public", headers={"Cache-Control": "public, max-age=60"})
    first = await start_proxy(**settings)
    assert (await get(first, "/x"))[2] == b"old-public"
    origin.set("/x", body=b"new-private", headers={"Cache-Control": "private"})
    assert (await get(first, "/x", **{"Cache-Control": "no-cache"}))[2] == b"new-private"
    await first.stop()
    second = await start_proxy(**settings)
    _, headers, body = await get(second, "/x")
    assert body == b"new-private" and "detail=disk" not in headers["Cache-Status"]


@pytest.mark.parametrize("kind", ["url", "prefix", "tags"])
async def test_a_purge_the_device_cannot_keep_says_so_and_drops_what_it_could_reach(
    origin, start_proxy, tmp_path, kind
):
    """A purge is often a takedown: when the disk cannot journal it (a full device), the
    answer says so and the disk drops the regions the purge could reach, so that no restart
    brings a purged record back."""
    settings = {"disk__path": str(tmp_path), **DISK}
    origin.set("/x", body=b"taken down", headers={"Cache-Control": "max-age=60",
                                                  "Surrogate-Key": "t1"})  # fmt: skip
    first = await start_proxy(**settings)
    assert (await get(first, "/x"))[2] == b"taken down"
    # The journal and the bans cannot be written: their paths are taken by directories.
    (tmp_path / "drops.log").mkdir()
    (tmp_path / "bans.new").mkdir()
    value = {"url": "http://example.test/x", "prefix": "http://example.test/", "tags": ["t1"]}
    answer = await admin_purge(first, {kind: value[kind]})
    assert answer["durable"] is False and "dropped" in answer["detail"]
    await first.stop()
    second = await start_proxy(**settings)
    _, headers, body = await get(second, "/x")
    assert "detail=disk" not in headers["Cache-Status"] and origin.hits["/x"] == 2
    assert body == b"taken down"  # from the origin, which still serves it


async def test_a_purge_the_device_keeps_answers_durable(origin, start_proxy, tmp_path):
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    # Written to disk at once; its first disk hit is not kept in memory, its second is.
    for _ in range(3):
        assert (await get(first, "/x"))[0] == 200
    answer = await admin_purge(first, {"prefix": "http://example.test/"})
    assert answer == {"removed": 1, "prefix": "http://example.test/"}
    assert (tmp_path / "bans.json").exists()


def test_the_engine_writes_a_tier_what_it_took_only_once_the_body_ended_whole():
    """The disk write is the engine's: offered at the head (the tier's admission), written
    by ``finish`` when the body ended whole with a copy in hand, never when cut short or
    when the driver kept no copy."""
    other = "http://a/y"
    for complete, payload, written in ((True, b"y" * 100, True), (False, b"y" * 100, False),
                                       (True, None, False)):  # fmt: skip
        engine, tier = two_tiers()
        decided = engine.on_response_head(RequestMeta(other), TAGGED, 100, 1.0)
        assert decided.tiers == (tier,)
        engine.finish(RequestMeta(other), decided, 100, 1.0, payload=payload, complete=complete)
        assert (tier.find(other) is not None) is written, (complete, payload)


def test_a_purge_made_before_a_responses_head_arrived_keeps_it_from_every_tier_at_its_head():
    """Its request went out before the purge: the head already says it is not stored
    (Cache-Status tells no "stored"), and neither memory nor the disk takes it."""
    engine, tier = two_tiers()
    engine.recent_purges.horizon = 60.0
    engine.removals.purge("url", URL, 5.0)
    response = TAGGED._replace(requested_at=4.0)
    decided = engine.on_response_head(RequestMeta(URL), response, 100, 6.0)
    assert decided.memory.reason == "purged-in-flight" and decided.tiers == ()
    engine.finish(RequestMeta(URL), decided, 100, 6.0, payload=b"x" * 100)
    assert engine.store.peek(URL) is None and tier.find(URL) is None
    assert engine.counters.purged_in_flight == 1


def test_a_collapsed_requests_sighting_is_offered_to_the_tiers_as_memory_takes_it():
    """A request answered by another's fetch counts as a sighting for the disk's admission as
    for memory's: the fetch's own was the first, the follower's the second, and the disk takes
    it then (before: only the fetch was ever offered, so a burst never reached the disk)."""
    engine = build_engine(1 << 20, ALWAYS)
    second_hit = AdmissionConfig(policy="second-hit")
    tier = DiskSpec(8 << 20, region_size=1 << 20, admission=second_hit).behind(engine, None)
    other = RequestMeta("http://a/burst")
    decided = engine.on_response_head(other, TAGGED, 100, 1.0)
    assert decided.tiers == ()  # the disk's first sighting
    engine.finish(other, decided, 100, 1.0, payload=b"b" * 100)
    assert tier.find(other.key) is None
    engine.on_shared(other, TAGGED, 100, 1.0, payload=b"b" * 100)
    assert tier.find(other.key) is not None
    engine.on_shared(other, TAGGED, 100, 1.0, payload=b"b" * 100)  # held: not written again
    assert tier.counters.admissions == 1


def test_a_purge_made_while_the_body_arrives_keeps_it_from_every_tier():
    """Its head came before the purge: the purge is caught as the body ends, for memory and
    for the tiers that took it at its head."""
    engine, tier = two_tiers()
    engine.recent_purges.horizon = 60.0
    response = TAGGED._replace(requested_at=4.0)
    decided = engine.on_response_head(RequestMeta(URL), response, 100, 4.5)
    assert decided.tiers == (tier,)
    engine.removals.purge("url", URL, 5.0)
    engine.finish(RequestMeta(URL), decided, 100, 6.0, payload=b"x" * 100)
    assert engine.store.peek(URL) is None and tier.find(URL) is None


def test_rfc9111_4_a_newer_response_the_store_cannot_keep_takes_its_older_copy_away():
    engine, _ = two_tiers()
    assert engine.on_response(RequestMeta(URL), TAGGED, 2 << 20, 1.0).reason == "too-large"
    assert engine.store.peek(URL) is None  # never answered with the older copy again


def test_a_newer_response_that_outgrows_the_store_takes_the_old_copy_with_it():
    """Of unknown length at its head it was to be kept; it ended too large: the stored copy
    it superseded goes (from every tier), never served again as a hit."""
    engine, tier = two_tiers()
    decision = engine.on_response_head(RequestMeta(URL), TAGGED, None, 1.0)
    engine.finish(RequestMeta(URL), decision, 2 << 20, 1.0, payload=b"")
    assert engine.store.peek(URL) is None and tier.find(URL) is None


@pytest.mark.parametrize("kept", [False, True], ids=["not admitted", "kept"])
def test_a_response_that_starts_to_vary_takes_the_unvaried_copy_with_it(kept):
    engine, tier = two_tiers()
    if not kept:
        engine.admission = build_engine(1 << 20, AdmissionConfig(policy="nth-hit:3")).admission
    varied = ResponseMeta(lifetime=60.0, vary=("accept-language",))
    engine.on_response(RequestMeta(URL, headers=(("Accept-Language", "fr"),)), varied, 10, 1.0)
    assert engine.store.peek(URL) is None and tier.find(URL) is None
    assert (URL in engine.variants) is kept


def test_a_304_for_an_entry_purged_meanwhile_refreshes_nothing_and_indexes_no_tag():
    """The purge reached every tier while the revalidation was in flight: its 304 must not
    write the purged record back, nor leave the entry's tags indexed for nothing."""
    engine, tier = two_tiers()
    entry = engine.store.peek(URL)
    engine.removals.purge("tags", ["t1"], 1.0)
    engine.on_not_modified(entry, (("Cache-Control", "max-age=60"),), 2.0, 2.0)
    assert tier.find(URL) is None and len(engine.tags) == 0
    assert engine.removals.purge("tags", ["t1"], 3.0).count == 0


async def answered_after(origin, asking, meanwhile, response: web.Response):
    """What ``asking`` (a request through the proxy) gets when the origin answers it with
    ``response`` only after ``meanwhile()`` (a purge) has run: the request is at the origin
    then. The origin answers as set again after."""
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        asked.set()
        await answer.wait()
        return response

    origin.responder = held
    try:
        request = asyncio.ensure_future(asking)
        await asyncio.wait_for(asked.wait(), 5)
        await meanwhile()
        answer.set()
        return await request
    finally:
        origin.responder = None


async def test_a_purge_by_tag_during_a_revalidation_stays_purged_after_a_restart(
    origin, start_proxy, tmp_path
):
    clock = Clock()
    fields = {"Cache-Control": "max-age=60", "ETag": '"v1"', "Surrogate-Key": "t1"}
    origin.set("/t", body=b"purged", headers=fields)
    settings = {"disk__path": str(tmp_path), **DISK}
    proxy = await start_proxy(clock=clock, **settings)
    assert (await get(proxy, "/t"))[2] == b"purged"  # in memory and on disk
    clock.now += 61

    async def purge() -> None:
        assert (await admin_purge(proxy, {"tags": ["t1"]}))["removed"] == 1

    not_modified = web.Response(status=304, headers={"ETag": '"v1"'})
    await answered_after(origin, get(proxy, "/t"), purge, not_modified)
    origin.set("/t", body=b"new", headers={"Cache-Control": "max-age=60"})
    assert (await get(proxy, "/t"))[2] == b"new"
    await proxy.stop()
    again = await start_proxy(clock=clock, **settings)
    _, headers, body = await get(again, "/t")
    assert body == b"new", headers["Cache-Status"]


PURGES = {
    "url": {"url": "http://example.test/f"},
    "prefix": {"prefix": "http://example.test/"},
    "tag": {"tags": ["t1"]},
    "soft": {"tags": ["t1"], "soft": True},
}


@pytest.mark.parametrize("purge", PURGES)
async def test_a_fetch_in_flight_never_stores_what_a_purge_made_since_removed(
    origin, start_proxy, tmp_path, purge
):
    """A response whose request went out before a purge reaching it (its URL, a prefix, a
    tag; hard or soft) is answered, and stored in no tier: memory, nor the disk after a
    restart. The purge is not undone by a fetch already in flight."""
    clock = Clock()
    settings = {"disk__path": str(tmp_path), **DISK, "admission__policy": "always"}
    fields = {"Cache-Control": "max-age=600", "Surrogate-Key": "t1"}
    origin.set("/f", body=b"before", headers=fields)
    proxy = await start_proxy(clock=clock, **settings)
    assert (await get(proxy, "/f"))[2] == b"before"  # stored: the purge has one to reach
    clock.now += 601

    async def purged() -> None:
        clock.now += 1
        await admin_purge(proxy, PURGES[purge])

    before = web.Response(body=b"from before the purge", headers=fields)
    fetched = await answered_after(origin, get(proxy, "/f"), purged, before)
    assert fetched[2] == b"from before the purge"  # its client is answered
    clock.now += 1  # a fetch begun after the purge is stored
    origin.set("/f", body=b"after", headers=fields)
    assert (await get(proxy, "/f"))[2] == b"after"
    assert proxy.proxy.engine.counters.purged_in_flight == 1
    await proxy.stop()
    origin.set("/f", body=b"later", headers=fields)
    again = await start_proxy(clock=clock, **settings)
    _, headers, body = await get(again, "/f")
    assert body == b"after", headers["Cache-Status"]


def test_purges_are_remembered_within_a_bound_and_past_it_nothing_is_stored_on_a_guess():
    purges = RecentPurges(limit=3)
    purges.url("http://a/x\0slice 2", 10.0)
    assert purges.reach("http://a/x", (), 10.0) and purges.reach("http://a/x\0v", (), 9.0)
    assert not purges.reach("http://a/x", (), 10.5) and not purges.reach("http://a/y", (), 1.0)
    purges.prefix("http://b/", 11.0)
    purges.tags(["t"], 12.0)
    assert purges.reach("http://b/z", (), 11.0) and not purges.reach("http://c/z", (), 11.0)
    assert purges.reach("http://c/z", ("u", "t"), 12.0)
    assert not purges.reach("http://c/z", ("u",), 0.0)
    purges.url("http://b/", 13.0)
    purges.url("http://b/", 13.5)  # a URL purged again is kept once, at its latest
    assert len(purges) == 3 and purges.reach("http://b/", (), 13.2)
    purges.url("http://d/", 14.0)  # the first two are dropped for room: reached, on no guess
    assert len(purges) == 3
    assert purges.reach("http://e/", (), 11.0) and not purges.reach("http://e/", (), 12.5)


def test_purges_older_than_any_fetch_in_flight_are_forgotten_and_time_never_runs_back():
    purges = RecentPurges(horizon=60.0)
    for i in range(10_000):  # a POST-heavy site: each invalidates its URL
        purges.url(f"http://a/{i}", i / 100)
    assert len(purges) <= 6_001  # the last 60 s of them, none dropped for room
    assert not purges.reach("http://a/video.mp4", (), 50.0)  # a long fetch is stored
    assert purges.reach("http://a/9999", (), 99.0)
    purges.url("http://a/back", 10.0)  # the wall clock stepped back: recorded at the latest
    assert purges.reach("http://a/back", (), 99.9)
    purges.url("http://a/later", 5_000.0)  # jumped forward: all forgotten for age, and so
    assert len(purges) == 1 and purges.reach("http://a/video.mp4", (), 99.0)  # reached


def test_a_removal_another_worker_made_reaches_only_what_began_before_it():
    """Another worker's removal arrives after this one recorded later ones: it is dated when
    it was made (a fetch begun after it is stored), never at the latest (it was, and the
    second sighting of a URL on another worker was dropped on a busy machine)."""
    purges = RecentPurges()
    purges.url("http://a/other", 10.5)
    purges.url("http://a/x", 10.0, as_made=True)
    assert not purges.reach("http://a/x", (), 10.2) and purges.reach("http://a/x", (), 9.9)
    assert purges.reach("http://a/other", (), 10.4)
    purges.prefix("http://a/", 10.6)  # a later purge that reaches it still does
    assert purges.reach("http://a/x", (), 10.55)
    purges.url("http://b/y", 11.0)
    purges.url("http://b/y", 10.0, as_made=True)  # purged again: the later purge stands
    assert purges.reach("http://b/y", (), 10.9)
    purges.url("http://a/x", 10.7, as_made=True)  # a later removal of x: it reaches past 10.2
    assert purges.reach("http://a/x", (), 10.65)


async def test_a_304_in_flight_never_refreshes_what_a_soft_purge_made_stale_since(
    origin, start_proxy
):
    """A revalidation goes out; a soft purge marks the entry stale; the origin's 304 arrives
    after: it refreshes nothing, so the next request revalidates again (the purge stands)."""
    fields = {"Cache-Control": "max-age=600", "ETag": '"v1"', "Surrogate-Key": "t1"}
    origin.set("/r", body=b"v1", headers=fields)
    proxy = await start_proxy(admission__policy="always")
    assert (await get(proxy, "/r"))[2] == b"v1"

    async def soft_purge() -> None:
        assert await admin_purge(proxy, {"tags": ["t1"], "soft": True}) == {"stale": 1}

    asking = get(proxy, "/r", **{"Cache-Control": "no-cache"})
    not_modified = web.Response(status=304, headers={"ETag": '"v1"'})
    revalidated = await answered_after(origin, asking, soft_purge, not_modified)
    assert revalidated[2] == b"v1"  # the client that asked is answered
    origin.set("/r", body=b"v2", headers={**fields, "ETag": '"v2"'})
    status, headers, body = await get(proxy, "/r")
    assert (status, body) == (200, b"v2"), headers["Cache-Status"]


async def test_a_request_after_a_purge_never_takes_the_answer_of_a_fetch_begun_before_it(
    origin, start_proxy
):
    """A miss's fetch goes out; the URL is purged; requests arrive and would join that fetch:
    they share one fetch of their own instead (one origin request, not one each), and none
    gets what was fetched before the purge."""
    fields = {"Cache-Control": "max-age=600"}
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held_first(request: web.Request) -> web.StreamResponse:
        if origin.hits["/c"] == 1:
            asked.set()
            await answer.wait()
            return web.Response(body=b"before the purge", headers=fields)
        await asyncio.sleep(0.1)  # the followers gather on this fetch
        return web.Response(body=b"after the purge", headers=fields)

    origin.responder = held_first
    proxy = await start_proxy(admission__policy="always")
    leading = asyncio.ensure_future(get(proxy, "/c"))
    await asyncio.wait_for(asked.wait(), 5)
    await admin_purge(proxy, {"url": "http://example.test/c"})
    following = [asyncio.ensure_future(get(proxy, "/c")) for _ in range(5)]
    key = proxy.proxy.router.url_key("http://example.test/c")
    await until(lambda: proxy.proxy.flights.waiting(key) == 5)
    answer.set()
    assert (await leading)[2] == b"before the purge"
    assert {(await f)[2] for f in following} == {b"after the purge"}
    assert origin.hits["/c"] == 2


def test_a_soft_purge_marks_an_entry_already_stale_too():
    """An entry stale already is marked as a soft purge's: a client's max-stale does not
    serve it (the leeway a soft purge takes away)."""
    engine = build_engine(1 << 20, AdmissionConfig(policy="always"))
    engine.on_response(
        RequestMeta(URL), ResponseMeta(lifetime=10.0, headers=(("Cache-Tag", "t"),)), 5, 0.0
    )
    assert engine.removals.purge("tags", ["t"], 20.0, soft=True).count == 0  # nothing fresh to mark
    asks = RequestMeta(URL, headers=(("Cache-Control", "max-stale=3600"),))
    assert not engine.lookup(asks, 21.0).serve_stale


async def test_a_response_a_purge_reached_in_flight_leaves_a_copy_stored_since_the_purge(
    origin, start_proxy, tmp_path
):
    """Request A went out before a purge and its answer comes last; B went out after it and
    was stored. A's head says purged-in-flight and takes nothing away: B's copy is newer than
    A's, and the next request is a hit on it (before: A's head deleted it, and the next
    request went to the origin)."""
    clock = Clock()
    release, asked = asyncio.Event(), asyncio.Event()
    versions = iter(range(1, 10))

    async def responder(request: web.Request) -> web.StreamResponse:
        n = next(versions)
        if n == 1:
            asked.set()
            await release.wait()
        fields = {"Cache-Control": "max-age=600", "ETag": f'"v{n}"'}
        return web.Response(body=f"v{n}".encode() * 100, headers=fields)

    origin.responder = responder
    proxy = await start_proxy(clock=clock, admission__policy="always",
                              disk__path=str(tmp_path), **DISK)  # fmt: skip
    a = asyncio.ensure_future(get(proxy, "/x"))
    await asyncio.wait_for(asked.wait(), 5)
    clock.now += 1
    await admin_purge(proxy, {"url": "http://example.test/x"})
    clock.now += 1
    # A precondition keeps B off A's flight: it goes to the origin after the purge.
    _, headers, body = await get(proxy, "/x", **{"If-Match": "*"})
    assert body[:2] == b"v2" and "stored" in headers["Cache-Status"], headers["Cache-Status"]
    release.set()
    _, headers, body = await a
    assert body[:2] == b"v1" and "purged-in-flight" in headers["Cache-Status"]
    _, headers, body = await get(proxy, "/x")
    assert body[:2] == b"v2" and "hit" in headers["Cache-Status"], headers["Cache-Status"]


async def test_a_cookie_request_neither_reads_nor_writes_the_disk_tier(
    origin, start_proxy, tmp_path
):
    """A request answered for its user alone (a cookie) is fetched as it was asked: no tier
    is read for it, and none is written with its response, however often it comes."""
    body = b"c" * 5000
    origin.set("/a", body=body, headers={"Cache-Control": "public, max-age=600"})
    settings = {"disk__path": str(tmp_path), **DISK, "admission__policy": "size-below:1KiB"}
    first = await start_proxy(**settings)
    assert (await get(first, "/a"))[2] == body
    assert first.proxy.disk.tier.counters.admissions == 1
    await first.stop()
    again = await start_proxy(**settings)
    for _ in range(5):
        status, _, got = await get(again, "/a", Cookie="session=abc")
        assert status == 200 and got == body
    assert again.proxy.disk.tier.counters.admissions == 0


async def test_a_burst_collapsed_onto_one_fetch_reaches_the_disk_on_its_second_sighting(
    origin, start_proxy, tmp_path
):
    """Three requests collapsed onto one fetch are three sightings for the disk's second-hit
    admission as for memory's: the fetch's own is the first, a follower's the second, and the
    disk takes the response then, once (before: only the fetch was ever offered)."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def responder(request: web.Request) -> web.StreamResponse:
        asked.set()
        await release.wait()
        return web.Response(body=b"b" * 1000, headers={"Cache-Control": "max-age=600"})

    origin.responder = responder
    proxy = await start_proxy(admission__policy="second-hit", disk__path=str(tmp_path),
                              **{**DISK, "disk__policy": "second-hit"})  # fmt: skip
    first = asyncio.ensure_future(get(proxy, "/burst"))
    await asyncio.wait_for(asked.wait(), 5)
    followers = [asyncio.ensure_future(get(proxy, "/burst")) for _ in range(2)]
    await until(lambda: proxy.proxy.flights.waiting("http://example.test/burst") == 2)
    release.set()
    for answer in await asyncio.gather(first, *followers):
        assert answer[0] == 200 and answer[2] == b"b" * 1000
    assert proxy.proxy.disk.tier.counters.admissions == 1
    assert proxy.proxy.disk.tier.find("http://example.test/burst") is not None


def _passed_304(engine: CacheEngine, headers, requested_at: float, now: float):
    """A 304 to a client's own conditional, fetched as it came (not for the cache)."""
    request = RequestMeta(URL, headers=(("If-Match", '"v1"'),))
    response = response_meta(request, 304, headers, requested_at, now)
    decided = engine.on_response_head(request, response, 0, now, whole=False)
    engine.finish(request, decided, 0, now, payload=None)


def test_rfc9111_4_3_4_a_passed_304_freshens_the_stored_response_it_names():
    engine, _ = two_tiers()
    entry = engine.store.peek(URL)
    _passed_304(engine, (("ETag", '"v1"'), ("Cache-Control", "max-age=900")), 700.0, 700.0)
    assert entry.lifetime == 900 and entry.stored_at == 700.0


def test_a_passed_304_from_before_a_soft_purge_leaves_the_purge_standing():
    """Its request went out before the purge: the entry the purge marked stale stays stale
    (before: the 304 refreshed it, and the purged version answered as fresh)."""
    engine, _ = two_tiers()
    engine.recent_purges.horizon = 60.0
    entry = engine.store.peek(URL)
    engine.removals.purge("url", URL, 5.0, soft=True)
    stale_from = entry.lifetime
    _passed_304(engine, (("ETag", '"v1"'), ("Cache-Control", "max-age=900")), 4.0, 6.0)
    assert entry.soft_purged and entry.lifetime == stale_from


@pytest.mark.parametrize(
    "headers",
    [
        (("ETag", '"v1"'), ("ETag", '"v2"'), ("Cache-Control", "max-age=900")),
        (("Cache-Control", "max-age=900"),),
        (("ETag", '"v2"'), ("Cache-Control", "max-age=900")),
    ],
    ids=["two entity tags", "no validator", "another entity tag"],
)
def test_a_passed_304_that_does_not_name_the_stored_response_refreshes_nothing(headers):
    """Two entity tags name none (a broken origin); none names only what the client sent,
    which need not be the stored response's; another names another response."""
    engine, _ = two_tiers()
    entry = engine.store.peek(URL)
    _passed_304(engine, headers, 700.0, 700.0)
    assert entry.lifetime == 600.0 and entry.stored_at == 0.0


def test_the_plan_asks_the_tier_behind_memory_and_its_answer_is_judged_by_the_engine():
    """One plan over both tiers: a request memory holds nothing for is ``Behind`` (the tier
    first, then the fetch); what the tier holds is judged by the engine (``found_behind``):
    a fresh copy answers, counted as the tier's hit; none gives back the fetch."""
    engine, tier = two_tiers()
    other = RequestMeta("http://a/other")
    action = engine.plan(other, 1.0)
    assert action == Behind(FETCH_WHOLE)
    assert engine.found_behind(tier, other, None, 1.0, action.then) is FETCH_WHOLE
    assert tier.counters.misses == 1
    record = Entry(URL, 100, 0.0, 600.0, 0.0, TAGGED.headers, {}, b"x" * 100)
    engine.removals.invalidate(URL)  # memory no longer holds it: the tier's copy answers
    found = engine.found_behind(tier, RequestMeta(URL), (record, ()), 1.0, FETCH_WHOLE)
    assert type(found) is FromCache and found.behind and found.fresh
    assert tier.counters.hits == 1 and engine.store.peek(URL) is not None  # kept in memory
    engine.behind = ()
    assert engine.plan(other, 1.0) is FETCH_WHOLE  # no tier: the fetch itself


@pytest.mark.parametrize("path", ["passed through", "a revalidation"])
def test_a_304_that_makes_it_private_removes_it_even_after_a_purge_since_it_went_out(path):
    """The purge stands (nothing is refreshed), but a 304 saying the response is now private
    still takes it away: a soft-purged entry kept would be served stale to everyone (before:
    the purge check returned first, and it stayed)."""
    engine, _ = two_tiers()
    engine.recent_purges.horizon = 60.0
    entry = engine.store.peek(URL)
    engine.removals.purge("url", URL, 5.0, soft=True)
    private = (("ETag", '"v1"'), ("Cache-Control", "private"))
    if path == "passed through":
        _passed_304(engine, private, 4.0, 6.0)
    else:
        engine.on_not_modified(entry, private, 4.0, 6.0)
    assert engine.store.peek(URL) is None
    assert engine.counters.purged_in_flight == 1


def test_a_304_that_gives_a_tag_a_purge_reached_since_it_went_out_refreshes_nothing():
    """A purge by tag made while a revalidation was out reaches what its 304 tags: the entry
    is not refreshed (before: only the tags the entry carried were asked, and the 304 gave
    it the purged tag and a new lifetime)."""
    engine, _ = two_tiers()
    engine.recent_purges.horizon = 60.0
    entry = engine.store.peek(URL)
    engine.removals.purge("tags", ["t9"], 5.0)
    tagged_now = (("ETag", '"v1"'), ("Surrogate-Key", "t9"), ("Cache-Control", "max-age=900"))
    engine.on_not_modified(entry, tagged_now, 4.0, 6.0)
    assert entry.lifetime == 600.0 and "t9" not in entry.tags
    assert engine.counters.purged_in_flight == 1
