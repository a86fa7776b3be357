"""Slices (``[cache] slice_size``): large objects fetched from the origin and stored as byte
ranges of one size, each admitted on its own; a client Range answered from the slices it spans,
a whole GET stitched from them, and an object whose slices disagree on their version refetched.
"""

from __future__ import annotations

import asyncio
import socket
import time
import tracemalloc
from dataclasses import dataclass, field
from email.utils import formatdate

import aiohttp
import pytest
from aiohttp import web
from conftest import admin_purge, base, until
from multidict import CIMultiDict

from proxy.config.settings import ConfigError, load
from proxy.core import slices
from proxy.core.store import Entry
from proxy.core.tiers import PURGE

KIB, MIB = 1 << 10, 1 << 20
CYCLE = bytes(range(251))  # a prime period: a byte out of place, or of another version, shows


def content(version: int, first: int, last: int) -> bytes:
    """Bytes ``first``..``last`` of the object's ``version``: byte i is (i + version) % 251."""
    start, size = (first + version) % 251, last - first + 1
    return (CYCLE * ((start + size) // 251 + 1))[start : start + size]


@dataclass
class Large:
    """An object the test origin serves, Range included, without holding it."""

    length: int
    version: int = 1
    etag: bool = True
    ignores_range: bool = False
    failing: set[int] = field(default_factory=set)  # first bytes of ranges answered with 503
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=lambda: {"Cache-Control": "max-age=600"})
    asked: list[str | None] = field(default_factory=list)  # the Range of each request

    def fields(self) -> dict[str, str]:
        fields = {**self.headers, "Accept-Ranges": "bytes"}
        if self.etag:
            fields["ETag"] = f'"v{self.version}"'
        return fields

    async def respond(self, request: web.Request) -> web.Response:
        asked = request.headers.get("Range")
        self.asked.append(asked)
        await asyncio.sleep(self.delay)
        if asked is None or self.ignores_range:
            body = content(self.version, 0, self.length - 1)
            return web.Response(body=body, headers=self.fields())
        first_text, _, last_text = asked.removeprefix("bytes=").partition("-")
        first, last = int(first_text), min(int(last_text or self.length), self.length - 1)
        if first in self.failing:
            return web.Response(status=503)
        if first >= self.length:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{self.length}"})
        fields = {**self.fields(), "Content-Range": f"bytes {first}-{last}/{self.length}"}
        return web.Response(status=206, body=content(self.version, first, last), headers=fields)


def serve(origin, **objects: Large) -> None:
    async def respond(request: web.Request) -> web.StreamResponse:
        return await objects[request.path.strip("/")].respond(request)

    origin.responder = respond


KEY = "http://example.test"  # the cache key of a path, as the Host the test sends


async def get(service, path: str, **fields: str) -> tuple[int, CIMultiDict[str], bytes]:
    url, headers = base(service) + path, {"Host": "example.test", **fields}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        return r.status, r.headers.copy(), await r.read()


def ranges_of(n: int, size: int) -> str:
    return f"bytes={n * size}-{(n + 1) * size - 1}"


# The rules


def test_slice_bounds_cover_the_object_and_the_last_one_ends_with_it():
    assert slices.bounds(0, 100, 250) == (0, 99)
    assert slices.bounds(2, 100, 250) == (200, 249)
    assert list(slices.covering(99, 100, 100)) == [0, 1]
    assert list(slices.covering(150, 160, 100)) == [1]


def test_the_first_slice_wanted_is_the_one_a_range_starts_in_else_the_first():
    assert slices.first_wanted((("Range", "bytes=250-300"),), 100) == 2
    assert slices.first_wanted((("Range", "bytes=250-"),), 100) == 2
    for other in ("bytes=-50", "bytes=1-2, 5-6", "items=1-2", "bytes=x-1"):
        assert slices.first_wanted((("Range", other),), 100) == 0, other
    assert slices.first_wanted((), 100) == 0


def test_rfc9110_14_4_content_range_is_read_only_when_whole_and_valid():
    assert slices.content_range((("Content-Range", "bytes 0-99/250"),)) == (0, 99, 250)
    for bad in ("bytes 0-99/*", "bytes */250", "bytes 9-1/250", "bytes 0-250/250", "items 0-1/2"):
        assert slices.content_range((("Content-Range", bad),)) is None, bad


def test_rfc9110_8_8_3_the_validator_is_the_strong_etag_and_nothing_else():
    modified = ("Last-Modified", "Thu, 01 Jan 1970 00:00:00 GMT")  # SOURCE_DATE_EPOCH=0
    later = ("Date", "Tue, 01 Dec 2026 10:01:00 GMT")  # long after: a strong one by the dates
    assert slices.validator((("ETag", '"a"'), modified)) == '"a"'
    assert slices.validator((("ETag", 'W/"a"'), modified, later)) is None
    assert slices.validator((modified, later)) is None
    assert slices.validator((("ETag", 'W/"a"'),)) is None


def test_the_slice_index_holds_stored_slices_only_and_no_other_key():
    index = slices.SliceIndex()
    for key in ("http://a/v" + "\0accept-encoding=gzip", slices.slice_key("http://a/v", 3)):
        index.add(key)
    index.add(slices.slice_key("http://a/v", 4))
    assert index.keys("http://a/v") == [slices.slice_key("http://a/v", n) for n in (3, 4)]
    index.forget([Entry(slices.slice_key("http://a/v", 3), 1, 0.0)])
    assert index.pop("http://a/v") == [slices.slice_key("http://a/v", 4)] and not index.urls


def test_slice_size_must_be_off_or_between_64kib_and_the_max_object_size():
    with pytest.raises(ConfigError, match=r"\[cache\] slice_size = 1024: expected 0 \(off\)"):
        load(env={}, overrides={"upstream.origin": "http://o", "cache.slice_size": "1KiB"})
    with pytest.raises(ConfigError, match="max_object_size"):
        load(env={}, overrides={"upstream.origin": "http://o", "cache.slice_size": "32MiB"})
    assert load(env={}, overrides={"upstream.origin": "http://o"}).cache.slice_size == 0


# A live proxy in front of an origin that serves ranges


async def test_a_1mib_range_of_a_cold_512mib_object_fetches_two_slices_and_stores_2mib(
    origin, start_proxy
):
    video = Large(512 * MIB)
    serve(origin, video=video)
    service = await start_proxy(cache__size="64MiB", cache__slice_size="1MiB",
                                admission__policy="always")  # fmt: skip
    first, last = 300 * MIB + 12345, 301 * MIB + 12344  # 1 MiB across slices 300 and 301
    status, headers, body = await get(service, "/video", Range=f"bytes={first}-{last}")
    assert (status, headers["Content-Range"]) == (206, f"bytes {first}-{last}/{512 * MIB}")
    assert body == content(1, first, last)
    assert video.asked == [ranges_of(300, MIB), ranges_of(301, MIB)]
    counters = service.proxy.engine.counters
    assert (counters.bytes_written, counters.slice_fetches) == (2 * MIB, 2)
    assert service.proxy.engine.store.bytes_used < 2 * MIB + 16 * KIB
    status, headers, again = await get(service, "/video", Range=f"bytes={first}-{last}")
    assert (status, again, len(video.asked)) == (206, body, 2)
    assert headers["Cache-Status"] == "onehit; hit; detail=slices"
    assert (counters.hits, counters.slice_hits) == (1, 2)


async def test_a_whole_get_is_stitched_from_slices_each_admitted_on_its_own(origin, start_proxy):
    """Second hit admits each slice on its second request: a Range stores its slices, then
    a whole GET fetches only the others; the next whole GET is a hit from slices alone."""
    size = 64 * KIB
    clip = Large(5 * size + 1000)
    serve(origin, clip=clip)
    service = await start_proxy(cache__size="8MiB", cache__slice_size="64KiB")
    for _ in range(2):
        status, _, body = await get(
            service, "/clip", Range=f"bytes={2 * size + 10}-{2 * size + 99}"
        )
        assert (status, body) == (206, content(1, 2 * size + 10, 2 * size + 99))
    engine = service.proxy.engine
    assert engine.slices.keys(f"{KEY}/clip") == [slices.slice_key(f"{KEY}/clip", 2)]
    clip.asked.clear()
    for _ in range(2):
        status, headers, body = await get(service, "/clip")
        assert (status, body) == (200, content(1, 0, clip.length - 1))
        assert headers["Content-Length"] == str(clip.length) and "Content-Range" not in headers
    assert headers["Cache-Status"] == "onehit; fwd=partial; detail=slices"
    assert clip.asked == [ranges_of(n, size) for n in (0, 1, 3, 4, 5)] * 2
    status, headers, body = await get(service, "/clip")
    assert (status, len(clip.asked), headers["X-Cache"]) == (200, 10, "HIT")
    assert body == content(1, 0, clip.length - 1)
    assert len(engine.slices.keys(f"{KEY}/clip")) == 6


async def test_an_object_no_larger_than_a_slice_is_stored_whole_and_hits_as_any_other(
    origin, start_proxy
):
    small = Large(1000)
    serve(origin, small=small)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    status, headers, body = await get(service, "/small")
    assert (status, body, headers["Cache-Status"]) == (200, content(1, 0, 999),
                                                       "onehit; fwd=uri-miss; stored")  # fmt: skip
    assert "Content-Range" not in headers and small.asked == [ranges_of(0, 64 * KIB)]
    status, headers, body = await get(service, "/small", Range="bytes=10-19")
    assert (status, body, headers["X-Cache"]) == (206, content(1, 10, 19), "HIT")
    assert headers["Content-Range"] == "bytes 10-19/1000" and len(small.asked) == 1
    assert service.proxy.engine.store.peek(f"{KEY}/small").status == 200


async def test_an_origin_that_ignores_range_is_answered_as_without_slices(origin, start_proxy):
    plain = Large(100 * KIB, ignores_range=True)
    serve(origin, plain=plain)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    status, _, body = await get(service, "/plain", Range="bytes=70000-70009")
    assert (status, body) == (206, content(1, 70000, 70009))
    status, headers, body = await get(service, "/plain")
    assert (status, body, headers["X-Cache"]) == (200, content(1, 0, plain.length - 1), "HIT")
    assert len(plain.asked) == 1


async def test_a_range_past_the_end_is_the_origins_416_and_an_empty_object_is_fetched_whole(
    origin, start_proxy
):
    video, empty = Large(200 * KIB), Large(0)
    serve(origin, video=video, empty=empty)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    status, headers, _ = await get(service, "/video", Range=f"bytes={300 * KIB}-")
    assert (status, headers["Content-Range"]) == (416, f"bytes */{200 * KIB}")
    # Not stored, so the client's own Range is the origin's to answer, as without slices.
    assert video.asked == [ranges_of(4, 64 * KIB), f"bytes={300 * KIB}-"]
    status, _, body = await get(service, "/empty")
    assert (status, body, empty.asked) == (200, b"", [ranges_of(0, 64 * KIB), None])


async def test_rfc9110_13_a_matching_conditional_is_a_304_without_the_other_slices(
    origin, start_proxy
):
    video = Large(300 * KIB)
    serve(origin, video=video)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    status, headers, body = await get(service, "/video", **{"If-None-Match": '"v1"'})
    assert (status, body, headers["ETag"]) == (304, b"", '"v1"')
    assert video.asked == [ranges_of(0, 64 * KIB)]


async def test_slices_of_another_version_are_refetched_and_never_stitched(origin, start_proxy):
    """The object changes between requests: a stored slice of the old version is dropped
    when the first slice is new; a fetched slice of a new version under an answer begun with
    the old one cuts that answer, and the object's slices are removed and fetched anew."""
    size = 64 * KIB
    video = Large(4 * size)
    serve(origin, video=video)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    assert (await get(service, "/video", Range=f"bytes=0-{2 * size - 1}"))[0] == 206  # 0, 1
    video.version = 2
    url = base(service) + "/video"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Host": "example.test"}) as r,
    ):
        assert r.headers["ETag"] == '"v1"'  # begun from stored slice 0
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    engine = service.proxy.engine
    assert engine.counters.slice_mismatches == 1
    assert engine.slices.keys(f"{KEY}/video") == []
    status, headers, body = await get(service, "/video")
    assert (status, headers["ETag"], body) == (200, '"v2"', content(2, 0, video.length - 1))
    video.version = 3  # stored slice 1 (v2) is older than a freshly fetched first slice
    engine.removals.forget(slices.slice_key(f"{KEY}/video", 0), PURGE)
    status, headers, body = await get(service, "/video", Range=f"bytes=0-{2 * size - 1}")
    assert (status, headers["ETag"], body) == (206, '"v3"', content(3, 0, 2 * size - 1))


async def test_a_slice_without_a_validator_answers_but_is_never_stored(origin, start_proxy):
    video = Large(200 * KIB, etag=False)
    serve(origin, video=video)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    for _ in range(2):
        status, _, body = await get(service, "/video", Range="bytes=100-199")
        assert (status, body) == (206, content(1, 100, 199))
    assert service.proxy.engine.counters.admissions == 0
    # Then straight to the origin for hit_for_miss, unsliced: the client's own Range.
    assert video.asked == [ranges_of(0, 64 * KIB), "bytes=100-199"]


async def test_an_object_that_may_not_be_stored_goes_unsliced_after_its_first_miss(
    origin, start_proxy
):
    video = Large(200 * KIB, headers={"Cache-Control": "no-store"})
    serve(origin, video=video)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    for _ in range(2):
        status, headers, body = await get(service, "/video")
        assert (status, body) == (200, content(1, 0, video.length - 1))
    assert video.asked == [ranges_of(n, 64 * KIB) for n in range(4)] + [None]
    assert headers["Cache-Status"] == "onehit; fwd=bypass; detail=no-store"


async def test_a_purge_by_url_or_tag_removes_every_slice(origin, start_proxy):
    tagged = Large(200 * KIB, headers={"Cache-Control": "max-age=600", "Surrogate-Key": "film"})
    serve(origin, a=Large(200 * KIB), b=tagged)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    for path in ("/a", "/b"):
        assert (await get(service, path))[0] == 200
    engine = service.proxy.engine
    assert len(engine.store) == 8
    assert (await admin_purge(service, {"url": f"{KEY}/a"}))["removed"] == 4
    assert (await admin_purge(service, {"tags": ["film"]}))["removed"] == 4
    assert len(engine.store) == 0 and not engine.slices.urls


async def test_an_object_no_larger_than_a_slice_reaches_the_disk_tier(
    origin, start_proxy, tmp_path
):
    serve(origin, small=Large(1000))
    disk = {
        "disk__path": str(tmp_path),
        "disk__size": "8MiB",
        "disk__region_size": "1MiB",
        "disk__policy": "always",
    }
    first = await start_proxy(cache__slice_size="64KiB", admission__policy="always", **disk)
    assert (await get(first, "/small"))[0] == 200
    await first.stop()
    second = await start_proxy(cache__slice_size="64KiB", admission__policy="always", **disk)
    status, headers, body = await get(second, "/small")
    assert (status, body) == (200, content(1, 0, 999))
    assert "detail=disk" in headers["Cache-Status"]


async def test_an_origin_failing_on_a_slice_cuts_the_answer_and_keeps_the_stored_slices(
    origin, start_proxy
):
    size = 64 * KIB
    video = Large(4 * size, failing={2 * size})
    serve(origin, video=video)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    url = base(service) + "/video"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Host": "example.test"}) as r,
    ):
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    engine = service.proxy.engine
    assert engine.counters.slice_mismatches == 0
    assert engine.slices.keys(f"{KEY}/video") == [
        slices.slice_key(f"{KEY}/video", n) for n in (0, 1)
    ]
    video.failing.clear()
    status, _, body = await get(service, "/video")
    assert (status, body) == (200, content(1, 0, video.length - 1))
    assert video.asked[-2:] == [ranges_of(2, size), ranges_of(3, size)]


async def test_a_206_past_the_slice_asked_has_the_object_fetched_whole(origin, start_proxy):
    async def whole_rest(request: web.Request) -> web.Response:
        fields = {"Cache-Control": "max-age=600", "ETag": '"v1"'}
        if "Range" not in request.headers:
            return web.Response(body=content(1, 0, 200 * KIB - 1), headers=fields)
        first = int(request.headers["Range"].removeprefix("bytes=").partition("-")[0])
        fields["Content-Range"] = f"bytes {first}-{200 * KIB - 1}/{200 * KIB}"
        return web.Response(status=206, body=content(1, first, 200 * KIB - 1), headers=fields)

    origin.responder = whole_rest
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    status, _, body = await get(service, "/rest", Range="bytes=10-19")
    assert (status, body) == (206, content(1, 10, 19))
    assert origin.hits["/rest"] == 2  # the slice, then the whole object


async def test_concurrent_misses_of_one_object_fetch_each_slice_once(origin, start_proxy):
    """Ten clients ask for a cold object at once: each slice is fetched for one of them and
    the others are answered with it (single flight); a small object, likewise, once."""
    size = 64 * KIB
    video, small = Large(3 * size, delay=0.05), Large(1000, delay=0.05)
    serve(origin, video=video, small=small)
    service = await start_proxy(cache__slice_size="64KiB")
    answers = await asyncio.gather(*(get(service, "/video") for _ in range(10)))
    assert {(status, body) for status, _, body in answers} == {(200, content(1, 0, 3 * size - 1))}
    assert sorted(video.asked) == sorted(ranges_of(n, size) for n in range(3))
    engine = service.proxy.engine
    assert len(engine.slices.keys(f"{KEY}/video")) == 3  # nine sightings each: second hit
    answers = await asyncio.gather(*(get(service, "/small") for _ in range(10)))
    assert {(status, body) for status, _, body in answers} == {(200, content(1, 0, 999))}
    assert len(small.asked) == 1 and engine.store.peek(f"{KEY}/small") is not None
    assert sum("collapsed" in headers["Cache-Status"] for _, headers, _ in answers) == 9


async def test_rfc9110_9_3_2_a_head_is_answered_from_a_stored_slice(origin, start_proxy):
    video = Large(300 * KIB)
    serve(origin, video=video)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    url, host = base(service) + "/video", {"Host": "example.test"}
    async with aiohttp.ClientSession() as session:
        async with session.head(url, headers=host) as r:  # nothing stored: the origin's
            assert (r.status, r.headers["Content-Length"]) == (200, str(300 * KIB))
        assert (await get(service, "/video", Range="bytes=70000-70009"))[0] == 206
        async with session.head(url, headers=host) as r:
            assert (r.status, r.headers["Content-Length"]) == (200, str(300 * KIB))
            assert r.headers["Cache-Status"] == "onehit; hit; detail=slices"
            assert "Content-Range" not in r.headers and await r.read() == b""
    assert video.asked == [None, ranges_of(1, 64 * KIB)]


DISK = {"disk__size": "8MiB", "disk__region_size": "1MiB", "disk__policy": "always",
        "cache__slice_size": "64KiB", "admission__policy": "always"}  # fmt: skip


async def test_slices_reach_the_disk_tier_and_outlive_a_restart(origin, start_proxy, tmp_path):
    size = 64 * KIB
    video = Large(4 * size)
    serve(origin, video=video)
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    assert (await get(first, "/video"))[0] == 200
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), **DISK)  # memory empty
    async with (
        aiohttp.ClientSession() as session,
        session.head(base(second) + "/video", headers={"Host": "example.test"}) as r,
    ):
        assert (r.status, r.headers["Content-Length"]) == (200, str(video.length))
        assert r.headers["Cache-Status"] == "onehit; hit; detail=slices"
    status, headers, body = await get(second, "/video", Range=f"bytes={size - 10}-{size + 9}")
    assert (status, body, headers["Cache-Status"]) == (206, content(1, size - 10, size + 9),
                                                       "onehit; hit; detail=slices")  # fmt: skip
    status, _, body = await get(second, "/video")
    assert (status, body, len(video.asked)) == (200, content(1, 0, video.length - 1), 4)
    # Each read once, then kept in memory: 0 for the HEAD, 1 for the Range, 2 and 3 for the GET.
    assert second.proxy.disk.tier.counters.hits == 4
    assert len(second.proxy.engine.slices.keys(f"{KEY}/video")) == 4  # kept in memory too
    # Each of the three answers took a slice from disk: a hit from disk, not from memory.
    counters = second.proxy.engine.counters
    assert (counters.hits, counters.hits_from_disk) == (3, 3)
    status, _, _ = await get(second, "/video")
    assert (status, counters.hits, counters.hits_from_disk) == (200, 4, 3)  # all in memory now


async def test_a_purge_or_a_new_version_reaches_the_slices_on_disk(origin, start_proxy, tmp_path):
    size = 64 * KIB
    video, other = Large(4 * size), Large(2 * size)
    serve(origin, video=video, other=other)
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    for path in ("/video", "/other"):
        assert (await get(first, path))[0] == 200
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), **DISK)
    await admin_purge(second, {"url": f"{KEY}/video"})
    video.asked.clear()
    status, _, body = await get(second, "/video")  # every slice from the origin again
    assert (status, body, len(video.asked)) == (200, content(1, 0, video.length - 1), 4)
    await second.stop()
    other.version = 2  # slice 0 of version 1 on disk begins an answer; slice 1 is version 2
    third = await start_proxy(disk__path=str(tmp_path), **DISK)
    third.proxy.engine.removals.forget(slices.slice_key(f"{KEY}/other", 1), PURGE)
    url = base(third) + "/other"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Host": "example.test"}) as r,
    ):
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    status, headers, body = await get(third, "/other")
    assert (status, headers["ETag"], body) == (200, '"v2"', content(2, 0, other.length - 1))


async def test_an_object_of_billions_of_slices_is_answered_without_a_walk_over_them(
    origin, start_proxy
):
    """An origin (hostile, or serving a huge object) tells a length of 1 PiB: the head goes
    out at once, each slice is fetched as the client reads, and its leaving ends it."""
    huge = Large(1 << 50)
    serve(origin, huge=huge)
    service = await start_proxy(cache__slice_size="64KiB", admission__policy="always")
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(base(service) + "/huge", headers={"Host": "example.test"}) as r,
    ):
        assert (r.status, r.headers["Content-Length"]) == (200, str(1 << 50))
        assert await r.content.readexactly(100 * KIB) == content(1, 0, 100 * KIB - 1)
    assert len(huge.asked) <= 8  # what the client read, and what was in flight as it left


class Overlap:
    """Holds the origin's answers until the proxy has taken in every client's request
    (``clients``, counted by the engine as each is planned): the test then proves what it
    claims of concurrent misses, since they were all in flight at once."""

    def __init__(self) -> None:
        self.service = None
        self.clients = 0

    async def meet(self) -> None:
        async def all_in() -> None:
            while self.service.proxy.engine.counters.requests < self.clients:
                await asyncio.sleep(0.005)

        await asyncio.wait_for(all_in(), 5)


async def test_a_slice_whose_fetch_failed_is_fetched_again_by_one_follower_not_by_all(
    origin, start_proxy
):
    """The rule of every flight (``SingleFlight.join``): a failed leader frees the slice, the
    first follower to wake leads the next fetch, the others follow it."""
    size = 64 * KIB
    video = Large(2 * size)
    overlap = Overlap()

    async def failing_once(request: web.Request) -> web.Response:
        if not video.asked:  # the first fetch of slice 0 fails, once every client is in
            video.asked.append(request.headers.get("Range"))
            await overlap.meet()
            return web.Response(status=503)
        return await video.respond(request)

    origin.responder = failing_once
    service = overlap.service = await start_proxy(cache__slice_size="64KiB")
    overlap.clients = 5
    answers = await asyncio.gather(*(get(service, "/video") for _ in range(5)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses.count(200) >= 4, statuses  # the leader's own client got the 503's answer
    # Slice 0: the failed fetch and one more; slice 1: once. Not five fetches of slice 0.
    assert sorted(video.asked) == sorted([ranges_of(0, size)] * 2 + [ranges_of(1, size)])


async def test_rfc9111_4_1_a_concurrent_miss_is_never_given_another_variants_slice(
    origin, start_proxy
):
    """Requests for one object that select different variants share no slice's fetch: each
    gets the body of its own Accept-Encoding, small (one slice) or large."""

    overlap = Overlap()

    async def negotiated(request: web.Request) -> web.Response:
        gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        await overlap.meet()
        length = 1000 if request.path == "/small" else 3 * 64 * KIB
        first_text, _, last_text = request.headers["Range"][6:].partition("-")
        first, last = int(first_text), min(int(last_text), length - 1)
        fields = {"Cache-Control": "max-age=600", "Vary": "Accept-Encoding", "ETag": '"v1"',
                  "Content-Range": f"bytes {first}-{last}/{length}"}  # fmt: skip
        return web.Response(status=206, body=content(2 if gzip else 1, first, last),
                            headers=fields)  # fmt: skip

    origin.responder = negotiated
    service = overlap.service = await start_proxy(cache__slice_size="64KiB",
                                                  admission__policy="always")  # fmt: skip
    for path, length in (("/small", 1000), ("/large", 3 * 64 * KIB)):
        asks = [{"Accept-Encoding": "gzip" if i % 2 else "identity"} for i in range(6)]
        overlap.clients += len(asks)
        answers = await asyncio.gather(*(get(service, path, **ask) for ask in asks))
        for ask, (status, _, body) in zip(asks, answers, strict=True):
            version = 2 if ask["Accept-Encoding"] == "gzip" else 1
            assert (status, body) == (200, content(version, 0, length - 1)), (path, ask)


async def test_a_slice_that_may_not_be_shared_is_never_given_to_a_concurrent_client(
    origin, start_proxy
):
    """A private answer (here to a request with Authorization) is each client's own: the
    concurrent misses of one object do not share its slices' fetches."""

    overlap = Overlap()

    async def personal(request: web.Request) -> web.Response:
        user = 2 if request.headers.get("Authorization") == "Bearer two" else 1
        await overlap.meet()
        first_text, _, last_text = request.headers["Range"][6:].partition("-")
        first, last = int(first_text), min(int(last_text), 3 * 64 * KIB - 1)
        fields = {"Cache-Control": "private", "ETag": '"v1"',
                  "Content-Range": f"bytes {first}-{last}/{3 * 64 * KIB}"}  # fmt: skip
        return web.Response(status=206, body=content(user, first, last), headers=fields)

    origin.responder = personal
    service = overlap.service = await start_proxy(cache__slice_size="64KiB",
                                                  admission__policy="always")  # fmt: skip
    asks = [{"Authorization": "Bearer two" if i % 2 else "Bearer one"} for i in range(6)]
    overlap.clients = len(asks)
    answers = await asyncio.gather(*(get(service, "/mine", **ask) for ask in asks))
    for ask, (status, _, body) in zip(asks, answers, strict=True):
        user = 2 if ask["Authorization"] == "Bearer two" else 1
        assert (status, body) == (200, content(user, 0, 3 * 64 * KIB - 1)), ask


@pytest.mark.parametrize("modified", ["within the Date's minute", "SOURCE_DATE_EPOCH=0"])
async def test_rfc9110_8_8_3_an_object_changed_under_one_last_modified_is_never_stitched(
    origin, start_proxy, modified
):
    """An mtime-preserving deploy: the same Last-Modified (within a minute of the Date, or
    the 1970 of a reproducible build) for two versions of one length, the second deployed
    while an answer is being fetched. Its slices are not stored, and the answer, which
    spans several, is fetched whole: never stitched from slices of both versions."""
    size = 64 * KIB
    now = formatdate(time.time(), usegmt=True)
    stamp = now if modified.startswith("within") else "Thu, 01 Jan 1970 00:00:00 GMT"
    headers = {"Cache-Control": "max-age=0", "Last-Modified": stamp, "Date": now}
    video = Large(4 * size, etag=False, headers=headers)

    async def deploy_after_the_first_request(request: web.Request) -> web.Response:
        answer = await video.respond(request)
        video.version += 1
        return answer

    origin.responder = deploy_after_the_first_request
    service = await start_proxy(cache__size="8MiB", cache__slice_size="64KiB",
                                admission__policy="always")  # fmt: skip
    for _ in range(3):
        status, _, body = await get(service, "/video")
        assert status == 200 and body in [content(v, 0, video.length - 1) for v in range(9)]
    assert service.proxy.engine.slices.keys(f"{KEY}/video") == []


async def test_slices_held_for_clients_that_do_not_read_stay_within_slice_memory(
    origin, start_proxy
):
    """Sixteen clients that never read (each from an address of its own), each a miss of its
    own large object: each slice in flight takes room (its body and what its client has not
    taken), and past ``[cache] slice_memory`` the others wait instead of growing the
    process."""
    clients = 16
    serve(origin, **{f"v{i}": Large(8 * MIB) for i in range(clients)})
    # Second hit (the default): no slice of these first sightings is stored, so what the
    # proxy holds is what is in flight.
    service = await start_proxy(cache__size="64MiB", cache__slice_size="64KiB",
                                cache__slice_memory="256KiB")  # fmt: skip
    room = service.proxy.slicer.room
    host, port = service.proxy_address
    tracemalloc.start()
    before = _proxy_bytes()
    sockets = []
    try:
        for i in range(clients):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.bind((f"127.0.0.{i + 2}", 0))
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            request = f"GET /v{i} HTTP/1.1\r\nHost: example.test\r\n\r\n".encode()
            await asyncio.get_running_loop().sock_sendall(sock, request)
            sockets.append(sock)
        await until(lambda: room.held == room.limit)  # every socket's buffers are full
        await asyncio.sleep(0.3)  # time in which nothing may grow: the others wait
        held = _proxy_bytes() - before
    finally:
        tracemalloc.stop()
        for sock in sockets:
            sock.close()
    assert room.held == room.limit and room.peak <= room.limit
    # What the proxy's code holds for them: the room's slices, and what each connection costs
    # (the test's origin, in this process too, is left out).
    assert held < room.limit + clients * 32 * KIB, f"{held >> 10} KiB held"


async def test_one_clients_idle_connections_hold_its_share_of_slice_memory_not_all_of_it(
    origin, start_proxy
):
    """Sixteen connections of one client that never read hold at most its share of
    ``[cache] slice_memory`` (an eighth): another client's slice miss is answered meanwhile,
    not refused for want of room."""
    serve(origin, **{f"v{i}": Large(8 * MIB) for i in range(17)})
    service = await start_proxy(cache__size="64MiB", cache__slice_size="64KiB",
                                cache__slice_memory="2MiB")  # fmt: skip
    room = service.proxy.slicer.room
    host, port = service.proxy_address
    sockets = []
    try:
        for i in range(16):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.bind(("127.0.0.2", 0))
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            request = f"GET /v{i} HTTP/1.1\r\nHost: example.test\r\n\r\n".encode()
            await asyncio.get_running_loop().sock_sendall(sock, request)
            sockets.append(sock)
        await until(lambda: room.by_client.get("127.0.0.2") == room.share)
        await asyncio.sleep(0.2)
        assert room.by_client["127.0.0.2"] == room.share < room.limit
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.3", 0))
        async with aiohttp.ClientSession(connector=connector) as client:
            url = f"http://{host}:{port}/v16"
            async with client.get(url, headers={"Host": "example.test"}) as r:
                assert (r.status, len(await r.read())) == (200, 8 * MIB)
    finally:
        for sock in sockets:
            sock.close()


def _proxy_bytes() -> int:
    """Bytes traced that the proxy's own code allocated."""
    proxy = tracemalloc.Filter(True, "*/proxy/*")
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([proxy]).traces)
