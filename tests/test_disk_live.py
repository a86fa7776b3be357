"""The proxy's disk tier, live: what its own admission takes is written to region files, served
from them on a memory miss, and served again after a restart; a damaged record is a miss."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import socket
import time
from email.utils import formatdate

import aiohttp
import pytest
from aiohttp import web
from conftest import admin_purge, base, cold_reads
from conftest import fetch_as_client as get

from proxy.disk import store as disk_store
from proxy.disk.reads import READ_INLINE
from proxy.disk.record_meta import record_stamp as stamp

DISK = {"disk__size": "8MiB", "disk__region_size": "1MiB", "cache__size": "1MiB",
        "cache__max_object_size": "256KiB"}  # fmt: skip


async def admin_stats(service) -> dict:
    host, port = service.admin_address
    url = f"http://{host}:{port}/stats"
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        return await r.json()


async def test_a_second_sighting_goes_to_disk_and_is_served_from_it_after_a_restart(
    origin, start_proxy, tmp_path
):
    origin.set("/x", body=b"x" * 5000)
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    for _ in range(2):  # the second sighting is stored, in memory and on disk
        status, _, body = await get(first, "/x")
        assert status == 200 and body == b"x" * 5000
    disk = (await admin_stats(first))["disk"]
    assert (disk["admissions"], disk["rejected"], disk["objects"]) == (1, 1, 1)
    assert disk["bytes_written"] > 5000 and sum(f.stat().st_size for f in tmp_path.iterdir())
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), **DISK)
    status, headers, body = await get(second, "/x")
    assert (status, body) == (200, b"x" * 5000)
    assert "detail=disk" in headers["Cache-Status"] and headers["X-Cache"] == "HIT"
    assert origin.hits["/x"] == 2  # the restart cost the origin nothing
    # Memory's admission had not seen it in this process: the second disk hit promotes it.
    status, headers, _ = await get(second, "/x")
    assert status == 200 and "detail=disk" in headers["Cache-Status"]
    status, headers, _ = await get(second, "/x")  # promoted: now a memory hit
    assert status == 200 and "detail=disk" not in headers["Cache-Status"]
    assert (await admin_stats(second))["disk"]["hits"] == 2


async def test_one_hit_wonders_never_reach_the_disk(origin, start_proxy, tmp_path):
    for i in range(30):
        origin.set(f"/once-{i}", body=b"o" * 1000)
    service = await start_proxy(disk__path=str(tmp_path), **DISK)
    for i in range(30):
        assert (await get(service, f"/once-{i}"))[0] == 200
    disk = (await admin_stats(service))["disk"]
    assert disk["bytes_written"] == 0 and disk["rejected"] == 30
    assert disk["bytes_not_written"] > 30 * 1000


async def test_a_damaged_record_is_a_miss_never_a_wrong_body(origin, start_proxy, tmp_path):
    origin.set("/x", body=b"good" * 1000)
    first = await start_proxy(disk__path=str(tmp_path), disk__policy="always", **DISK)
    assert (await get(first, "/x"))[2] == b"good" * 1000
    await first.stop()
    [region] = list(tmp_path.glob("region-*.log"))
    data = bytearray(region.read_bytes())
    data[-10:] = b"bad!" * 2 + b"!!"  # the body's last bytes, under the record's checksum
    region.write_bytes(bytes(data))
    second = await start_proxy(disk__path=str(tmp_path), disk__policy="always", **DISK)
    status, headers, body = await get(second, "/x")
    # The checkpoint still points at the record; its checksum fails when it is read, so it
    # is dropped, the origin is asked, and the right body served.
    assert (status, body) == (200, b"good" * 1000) and "detail=disk" not in headers["Cache-Status"]
    assert origin.hits["/x"] == 2
    assert (await admin_stats(second))["disk"]["dropped"] == 1


async def test_the_disk_counters_are_on_the_metrics_page(origin, start_proxy, tmp_path):
    service = await start_proxy(disk__path=str(tmp_path), **DISK)
    host, port = service.admin_address
    url = f"http://{host}:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        text = await r.text()
    assert "onehit_disk_bytes_written_total 0.0" in text and "onehit_disk_objects 0.0" in text


@pytest.mark.perf
async def test_the_device_writes_are_counted_as_the_kernel_sees_them(origin, start_proxy, tmp_path):
    origin.set("/big", body=b"w" * 200_000)
    service = await start_proxy(disk__path=str(tmp_path), disk__policy="always", **DISK)
    before = (await admin_stats(service))["disk"]["process_write_bytes"]
    if before is None:
        pytest.skip("no /proc/self/io here")
    assert (await get(service, "/big"))[0] == 200
    service.proxy.disk.checkpoint()  # a rate is measured between checkpoints
    disk = (await admin_stats(service))["disk"]
    assert disk["bytes_written"] > 200_000
    # Counted when the pages were dirtied: the record's bytes at least, and the checkpoint's.
    assert disk["process_write_bytes"] - before >= disk["bytes_written"]
    assert disk["bytes_written_per_second"] > 0


async def test_rfc9111_4_4_an_unsafe_method_and_a_purge_invalidate_the_disk_copy_too(
    origin, start_proxy, tmp_path
):
    origin.set("/x", body=b"v1" * 1000)
    settings = {"disk__path": str(tmp_path), "disk__policy": "always", **DISK}
    first = await start_proxy(**settings)
    assert (await get(first, "/x"))[2] == b"v1" * 1000  # on disk (and not in memory: second hit)
    url, host_field = base(first) + "/x", {"Host": "example.test"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=b"new", headers=host_field) as r,
    ):
        assert r.status == 200
    status, headers, _ = await get(first, "/x")
    assert status == 200 and "detail=disk" not in headers["Cache-Status"]
    assert origin.hits["/x"] == 3  # GET, POST, and the GET after it went to the origin
    # A purge of the URL reaches the disk too.
    host, port = first.admin_address
    await get(first, "/x")
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{host}:{port}/purge", json={"url": "http://example.test/x"}) as r,
    ):
        assert (await r.json())["removed"] >= 1
    status, headers, _ = await get(first, "/x")
    assert "detail=disk" not in headers["Cache-Status"]


async def test_a_purge_by_prefix_reaches_the_objects_only_the_disk_holds_and_a_restart(
    origin, start_proxy, tmp_path
):
    for path in ("/img/a", "/img/b", "/css/c"):
        origin.set(path, body=path.encode() * 500, headers={"Cache-Control": "max-age=600"})
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    for _ in range(2):
        for path in ("/img/a", "/img/b", "/css/c"):
            assert (await get(first, path))[0] == 200
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), **DISK)  # memory empty, disk holds 3
    host, port = second.admin_address
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://{host}:{port}/purge", json={"prefix": "http://example.test/img/"}
        ) as r,
    ):
        assert r.status == 200
    assert (await admin_stats(second))["disk"]["bans"] == 1
    await second.stop()  # the ban outlives a restart
    third = await start_proxy(disk__path=str(tmp_path), **DISK)
    assert "detail=disk" in (await get(third, "/css/c"))[1]["Cache-Status"]  # opens the region
    for path in ("/img/a", "/img/b"):  # the compiled reader leaves them to the ban
        status, headers, body = await get(third, path)
        assert (status, body) == (200, path.encode() * 500)
        assert "detail=disk" not in headers["Cache-Status"]
    assert (origin.hits["/img/a"], origin.hits["/img/b"], origin.hits["/css/c"]) == (3, 3, 2)
    disk = (await admin_stats(third))["disk"]
    assert (disk["purged"], disk["hits"]) == (2, 1)


async def test_a_disk_hit_is_the_same_answer_compiled_in_python_and_from_the_handler(
    origin, start_proxy, tmp_path, monkeypatch
):
    """The compiled reader answers a record this proxy wrote; one whose stored head another
    rendering wrote (its stamp differs) is answered by ``HitAnswers.answer`` from its fields,
    rendered again; with fast hits off, the handler answers. Same bytes, same counts. (The
    first read of a region after a start is ``answer``'s: it opens the region's file.)"""
    # One instant for the cache and the origin's Date: the same ttl on every path.
    now = float(int(time.time()))
    origin.set("/d", body=b"q" * 3000, headers={"Cache-Control": "max-age=600", "ETag": '"v"',
                                                "Date": formatdate(now, usegmt=True)})  # fmt: skip
    origin.set("/opens", body=b"o" * 100, headers={"Cache-Control": "max-age=600"})
    answers, counts = [], []
    frozen = {"clock": lambda: now, **DISK}
    for way in ("compiled", "python", "handler"):
        path = tmp_path / way
        if way == "python":
            monkeypatch.setattr(disk_store, "record_stamp", lambda hidden: stamp(hidden) ^ 1)
        first = await start_proxy(disk__path=str(path), **frozen)
        for _ in range(2):
            assert (await get(first, "/opens"))[0] == (await get(first, "/d"))[0] == 200
        await first.stop()
        monkeypatch.undo()
        second = await start_proxy(disk__path=str(path), server__fast_hits=way != "handler",
                                   **frozen)  # fmt: skip
        assert (await get(second, "/opens"))[0] == 200
        status, headers, body = await get(second, "/d")
        per_answer = ("Date", "Age", "X-Origin-Count")
        answers.append((status, {k: v for k, v in headers.items() if k not in per_answer}, body))
        hits = second.proxy.hits
        assert (hits.plain_hits.answered, hits.answered) == {
            "compiled": (1, 1), "python": (0, 2), "handler": (0, 0)}[way]  # fmt: skip
        stats = await admin_stats(second)
        metrics = stats["metrics"]
        counted = ("requests", "hits", "misses", "hits_from_disk", "promoted", "entries")
        counts.append(({k: metrics[k] for k in counted}, stats["disk"]["hits"]))
        # The second sighting in the process: memory's admission keeps it, on every path.
        again = await get(second, "/d")
        assert "detail=disk" in again[1]["Cache-Status"]
        stats = await admin_stats(second)
        counts.append(({k: stats["metrics"][k] for k in counted}, stats["disk"]["hits"]))
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][1]["Cache-Status"] == "onehit; hit; ttl=600; detail=disk"
    # Each a first sighting in the process: memory's admission keeps neither, then /d.
    assert counts[0] == counts[2] == counts[4]
    assert counts[1] == counts[3] == counts[5]
    assert counts[0] == ({"requests": 2, "hits": 2, "misses": 0, "hits_from_disk": 2,
                          "promoted": 0, "entries": 0}, 2)  # fmt: skip
    assert counts[1] == ({"requests": 3, "hits": 3, "misses": 0, "hits_from_disk": 3,
                          "promoted": 1, "entries": 1}, 3)  # fmt: skip


async def test_a_damaged_record_is_never_answered_by_the_compiled_reader(
    origin, start_proxy, tmp_path
):
    origin.set("/d", body=b"z" * 3000, headers={"Cache-Control": "max-age=600"})
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    for _ in range(2):
        assert (await get(first, "/d"))[0] == 200
    await first.stop()
    region = next(tmp_path.glob("region-*.log"))
    data = bytearray(region.read_bytes())
    data[-10] ^= 0xFF  # a byte of the body, after the record's checksum was written
    region.write_bytes(bytes(data))
    second = await start_proxy(disk__path=str(tmp_path), **DISK)
    status, headers, body = await get(second, "/d")
    assert (status, body) == (200, b"z" * 3000) and "detail=disk" not in headers["Cache-Status"]
    assert origin.hits["/d"] == 3
    assert (await admin_stats(second))["disk"]["objects"] == 0  # dropped from the index


async def test_a_record_too_large_to_read_on_the_loop_is_served_by_the_handler_from_a_thread(
    origin, start_proxy, tmp_path
):
    body = bytes(range(256)) * ((READ_INLINE + 4096) // 256)
    origin.set("/big", body=body)
    large = {"disk__size": "16MiB", "disk__region_size": "4MiB", "cache__size": "4MiB",
             "cache__max_object_size": "2MiB"}  # fmt: skip
    first = await start_proxy(disk__path=str(tmp_path), **large)
    for _ in range(2):
        assert (await get(first, "/big"))[2] == body
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), **large)
    status, headers, served = await get(second, "/big")
    assert (status, served) == (200, body) and "detail=disk" in headers["Cache-Status"]
    stats = await admin_stats(second)
    assert (stats["fast_hits"], stats["disk"]["hits"]) == (0, 1)  # the handler answered it
    assert origin.hits["/big"] == 2


def resident_pages(path) -> int:
    """How many of ``path``'s pages the page cache holds now (``mincore`` of a mapping that
    is never touched, so asking reads nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = os.path.getsize(path)
    if size == 0:
        return 0
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            held = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, held) == 0, os.strerror(ctypes.get_errno())
            return sum(byte & 1 for byte in held.raw[:pages])
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def drop_from_page_cache(path) -> None:
    """Have the kernel drop ``path``'s pages from the page cache: its next read goes to the
    device, as after a cold start. Asked again until no page is held: a read-ahead an
    earlier read started may land after the first drop (it did, in CI, once)."""
    for _ in range(200):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if resident_pages(path) == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"the kernel keeps {path}'s pages in its page cache")


async def test_a_record_the_page_cache_does_not_hold_is_served_whole_from_disk(
    origin, start_proxy, tmp_path
):
    """The compiled reader and ``answer`` read only what the page cache holds (their reads
    start the device's read-ahead); the handler reads the rest on a worker thread."""
    origin.set("/cold", body=b"c" * 5000, headers={"Cache-Control": "max-age=600"})
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    for _ in range(2):
        assert (await get(first, "/cold"))[0] == 200
    await first.stop()  # the region's bytes reach the device at the checkpoint
    second = await start_proxy(disk__path=str(tmp_path), **DISK)
    drop_from_page_cache(next(tmp_path.glob("region-*.log")))
    status, headers, body = await get(second, "/cold")
    assert (status, body) == (200, b"c" * 5000) and "detail=disk" in headers["Cache-Status"]
    assert (await admin_stats(second))["disk"]["hits"] == 1
    assert origin.hits["/cold"] == 2


class CountingIndex:
    """A disk tier's index that counts the lookups asked of it (``get``)."""

    def __init__(self, index) -> None:
        self.index = index
        self.gets = 0

    def get(self, key_hash):
        self.gets += 1
        return self.index.get(key_hash)

    def __len__(self) -> int:
        return len(self.index)

    def __getattr__(self, name):
        return getattr(self.index, name)


async def restarted_over_disk(origin, start_proxy, tmp_path):
    """A proxy started over a disk tier that holds ``/cold`` and ``/warm`` (5,000 bytes of
    "c" each, stored by a proxy before it), its memory empty, after one disk hit on
    ``/warm``, in the same region file: the compiled reader knows the host and reads through
    the region file's descriptor, as in a proxy that has served a while."""
    for path in ("/cold", "/warm"):
        origin.set(path, body=b"c" * 5000, headers={"Cache-Control": "max-age=600"})
    first = await start_proxy(disk__path=str(tmp_path), **DISK)
    for path in ("/cold", "/cold", "/warm", "/warm"):
        assert (await get(first, path))[0] == 200
    await first.stop()
    second = await start_proxy(disk__path=str(tmp_path), **DISK)
    assert "detail=disk" in (await get(second, "/warm"))[1]["Cache-Status"]
    return second


async def test_a_cold_disk_hit_asks_the_index_at_most_twice_past_the_compiled_reader(
    origin, start_proxy, tmp_path, monkeypatch
):
    """The walk of a cold disk hit (docs/architecture.md): the compiled reader's one lookup
    finds a record the page cache does not hold and hands where it lies to the handler
    (``ColdRecord``), which asks the index only for the variants' anchor and, when its read
    went off the loop, again after it (the record may have moved meanwhile); the request is
    routed once (its meta made there alone), and nothing else asks (before: the handler
    asked for the URL's record again, three lookups; at 3d9ec66 the Python answerer looked
    it up and routed it again too)."""
    second = await restarted_over_disk(origin, start_proxy, tmp_path)
    tier, router = second.proxy.disk.tier, second.proxy.router
    counting = tier.index = CountingIndex(tier.index)  # the compiled reader keeps its own
    routed: list[str] = []

    def counted(name: str):
        step = getattr(router, name)

        def counting_step(*args, **kwargs):
            routed.append(name)
            return step(*args, **kwargs)

        return counting_step

    for name in ("route", "meta"):
        monkeypatch.setattr(router, name, counted(name))
    # The compiled reader's read may have the kernel read ahead: the handler's read must still
    # go off the loop.
    cold_reads(second.proxy.disk.log)
    drop_from_page_cache(next(tmp_path.glob("region-*.log")))
    status, headers, body = await get(second, "/cold")
    assert (status, body) == (200, b"c" * 5000) and "detail=disk" in headers["Cache-Status"]
    assert counting.gets == 2 and routed == ["route", "meta"], (counting.gets, routed)


async def test_a_cold_disk_hit_the_python_answerer_plans_is_looked_up_once_by_it(
    origin, start_proxy, tmp_path
):
    """A request the compiled reader declines for its fields (here ``Cache-Control``) is
    planned by the Python answerer, which finds the record not in the page cache and hands
    where it lies to the handler with the plan (``Planned.cold``): its own lookup, the
    variants' anchor and the check after the read, three in all (before: four, the handler
    looking the record up again)."""
    second = await restarted_over_disk(origin, start_proxy, tmp_path)
    tier = second.proxy.disk.tier
    counting = tier.index = CountingIndex(tier.index)
    cold_reads(second.proxy.disk.log)
    drop_from_page_cache(next(tmp_path.glob("region-*.log")))
    status, headers, body = await get(second, "/cold", **{"Cache-Control": "max-stale=60"})
    assert (status, body) == (200, b"c" * 5000) and "detail=disk" in headers["Cache-Status"]
    assert counting.gets == 3, counting.gets


@pytest.mark.parametrize("kind", ["url", "prefix"])
@pytest.mark.parametrize("read", ["on the loop", "off the loop"])
async def test_a_purge_after_a_cold_records_decline_and_before_its_read_is_honoured(
    origin, start_proxy, tmp_path, kind, read
):
    """The compiled reader hands where a cold record lies to the lane (``ColdRecord``); a
    purge that lands before the lane's task reads it (an admin purge, a PURGE on another
    connection, another worker's removal) wins: the read at that place is a miss, whether
    the page cache holds the record by then or not, and the origin's new response answers
    (before: read on the loop, the purged record answered and went back into memory)."""
    second = await restarted_over_disk(origin, start_proxy, tmp_path)
    origin.set("/cold", body=b"N" * 5000, headers={"Cache-Control": "max-age=600"})
    proxy, region = second.proxy, next(tmp_path.glob("region-*.log"))
    handle = proxy._handle
    carried = []

    async def purged_in_between(request, cold=None):
        carried.append(cold)
        value = "http://example.test/cold" if kind == "url" else "http://example.test/co"
        proxy.engine.removals.purge(kind, value, time.time())
        if read == "on the loop":
            region.read_bytes()  # the page cache holds the record again
        return await handle(request, cold)

    proxy._handle = purged_in_between
    if read == "off the loop":
        cold_reads(proxy.disk.log)
    drop_from_page_cache(region)
    status, headers, body = await get(second, "/cold")
    assert carried and carried[0] is not None and carried[0].key.endswith("/cold")
    assert (status, body) == (200, b"N" * 5000), headers["Cache-Status"]
    assert (await get(second, "/cold"))[2] == b"N" * 5000


async def test_rfc9111_4_1_variants_reach_the_disk_and_each_request_gets_its_own_back(
    origin, start_proxy, tmp_path
):
    """A response that varies on Accept-Encoding is written under its variant; after a
    restart each request is answered from the disk with the variant it selects, then from
    memory; a purge of the URL reaches every variant."""

    async def negotiated(request: web.Request) -> web.Response:
        gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        fields = {"Cache-Control": "max-age=600", "Vary": "Accept-Encoding"}
        if gzip:
            fields["Content-Encoding"] = "gzip"
        return web.Response(body=b"Z" * 3000 if gzip else b"t" * 3000, headers=fields)

    origin.responder = negotiated
    settings = {**DISK, "disk__path": str(tmp_path), "disk__policy": "always"}
    asks = {"gzip": {"Accept-Encoding": "gzip"}, "identity": {"Accept-Encoding": "identity"}}
    bodies = {"gzip": b"Z" * 3000, "identity": b"t" * 3000}

    async def ask(service, which: str) -> tuple[bytes, str]:
        url = base(service) + "/page"
        headers = {"Host": "example.test", **asks[which]}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.get(url, headers=headers) as r,
        ):
            return await r.read(), r.headers["Cache-Status"]

    first = await start_proxy(admission__policy="always", **settings)
    for which in asks:
        assert (await ask(first, which))[0] == bodies[which]
    await first.stop()
    second = await start_proxy(admission__policy="always", **settings)
    for which in ("identity", "gzip"):
        body, status = await ask(second, which)
        assert (body, "detail=disk" in status) == (bodies[which], True), which
    for which in asks:  # kept in memory as variants: memory hits now
        body, status = await ask(second, which)
        assert (body, "detail=disk" in status) == (bodies[which], False), which
    assert origin.hits["/page"] == 2
    await second.stop()
    third = await start_proxy(admission__policy="always", **settings)
    await admin_purge(third, {"url": "http://example.test/page"})
    body, status = await ask(third, "gzip")
    assert (body, origin.hits["/page"]) == (bodies["gzip"], 3) and "fwd=uri-miss" in status


async def test_a_client_cycling_a_varied_fields_values_writes_nothing_to_disk(
    origin, start_proxy, tmp_path
):
    """The disk's admission counts sightings of each variant, as of each URL: twenty
    Accept-Encoding values asked once each write nothing; one asked twice is written."""

    async def echoed(request: web.Request) -> web.Response:
        fields = {"Cache-Control": "max-age=600", "Vary": "Accept-Encoding"}
        return web.Response(body=request.headers.get("Accept-Encoding", "").encode() * 100,
                            headers=fields)  # fmt: skip

    origin.responder = echoed
    service = await start_proxy(disk__path=str(tmp_path), **DISK)
    url = base(service) + "/page"
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for value in [f"x{i}" for i in range(20)] + ["x0"]:
            headers = {"Host": "example.test", "Accept-Encoding": value}
            async with session.get(url, headers=headers) as r:
                assert await r.read() == value.encode() * 100
    disk = (await admin_stats(service))["disk"]
    # Nothing written until x0's second sighting: then its variant, after the URL's anchor.
    assert (disk["admissions"], disk["rejected"], disk["objects"]) == (2, 20, 2)


async def test_a_hit_is_a_hit_whichever_tier_answers_it_counted_by_tier(
    origin, start_proxy, tmp_path
):
    origin.set("/x", body=b"x" * 5000)
    settings = {"disk__path": str(tmp_path), "disk__policy": "always", **DISK}
    first = await start_proxy(**settings)
    assert (await get(first, "/x"))[0] == 200  # on disk only: memory waits for a second sighting
    await first.stop()
    second = await start_proxy(**settings)
    for _ in range(3):  # from disk, from disk (its second sighting: kept), from memory
        assert (await get(second, "/x"))[2] == b"x" * 5000
    metrics = (await admin_stats(second))["metrics"]
    assert (metrics["requests"], metrics["hits"], metrics["misses"]) == (3, 3, 0)
    assert (metrics["hits_from_memory"], metrics["hits_from_disk"]) == (1, 2)
    assert metrics["hit_bytes"] == metrics["bytes_served"] == 3 * 5000
    # The promotion wrote memory: an admission, and not a dead write once memory served it.
    assert (metrics["promoted"], metrics["admissions"], metrics["dead_writes"]) == (1, 1, 0)
    host, port = second.admin_address
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{host}:{port}/metrics") as r,
    ):
        text = await r.text()
    assert 'onehit_tier_hits_total{tier="disk"} 2.0' in text and "onehit_hits_total 3.0" in text
    assert 'onehit_tier_hits_total{tier="memory"} 1.0' in text


async def test_a_start_cancelled_after_the_disk_was_claimed_gives_the_directory_up(
    origin, start_proxy, tmp_path
):
    """Cancelled while it warms its Redis connection (a Redis that accepts and never
    answers), a start closes what it opened: the next start on the directory goes ahead."""
    asked, held = asyncio.Event(), []

    def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        asked.set()

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    redis_url = f"redis://127.0.0.1:{silent.sockets[0].getsockname()[1]}/0"
    try:
        starting = asyncio.ensure_future(
            start_proxy(disk__path=str(tmp_path), admission__backend="redis",
                        admission__redis_url=redis_url, **DISK)
        )  # fmt: skip
        await asyncio.wait_for(asked.wait(), 5)  # it holds the directory and waits on Redis
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
    finally:
        for writer in held:
            writer.close()
        silent.close()
        await silent.wait_closed()
    again = await start_proxy(disk__path=str(tmp_path), **DISK)
    origin.set("/x", body=b"x" * 5000)
    assert (await get(again, "/x"))[2] == b"x" * 5000


async def test_a_response_that_could_never_answer_fresh_costs_the_disk_no_write(
    origin, start_proxy, tmp_path
):
    """A 404 with no freshness and no validator: memory refuses it (never fresh), and so does
    the disk, whose record would be dropped at its first read."""
    origin.set("/gone", status=404, body=b"not here", headers={})
    proxy = await start_proxy(disk__path=str(tmp_path), disk__policy="always", **DISK)
    for _ in range(5):
        assert (await get(proxy, "/gone"))[0] == 404
    stats = await admin_stats(proxy)
    assert stats["metrics"]["uncacheable"] >= 1
    assert (stats["disk"]["admissions"], stats["disk"]["bytes_written"]) == (0, 0)


async def test_a_disk_hit_memorys_admission_takes_is_kept_only_on_its_second_disk_hit(
    origin, start_proxy, tmp_path
):
    """Memory's admission saw the URL when it was fetched, so it takes the first disk hit; the
    promotion filter (a second disk hit within memory's turnover) does not, until the second:
    the same on the compiled path and the handler's (a copy of the rule that skipped the
    filter would keep the first)."""
    origin.set("/p", body=b"p" * 3000, headers={"Cache-Control": "max-age=600"})
    seen = []
    for fast_hits in (True, False):
        service = await start_proxy(disk__path=str(tmp_path / str(fast_hits)),
                                    disk__policy="always", server__fast_hits=fast_hits,
                                    **DISK)  # fmt: skip
        counted = []
        for _ in range(4):  # a miss written to disk, two disk hits, a memory hit
            status, headers, body = await get(service, "/p")
            assert (status, body) == (200, b"p" * 3000)
            metrics = (await admin_stats(service))["metrics"]
            status_field = headers["Cache-Status"]
            where = "disk" if "detail=disk" in status_field else "memory"
            counted.append(((status_field.split("; ")[1], where), metrics["promoted"],
                            metrics["entries"]))  # fmt: skip
        if fast_hits:
            assert service.proxy.hits.plain_hits.answered == 2
        seen.append(counted)
        await service.stop()
    assert seen[0] == seen[1]
    assert [(where, promoted, entries) for (_, where), promoted, entries in seen[0][1:]] == [
        ("disk", 0, 0),
        ("disk", 1, 1),
        ("memory", 1, 1),
    ]


# What the observer raises is reported as Python reports an exception it cannot raise.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_hit_whose_observer_fails_is_counted_once_from_either_tier(
    origin, start_proxy, tmp_path
):
    """An admission's observe that raises is reported; the hit, counted already on the
    compiled path, is answered there, not counted again by the handler (before: -1 sent it
    on, and one request counted three times)."""
    origin.set("/o", body=b"o" * 3000, headers={"Cache-Control": "max-age=600"})
    origin.set("/m", body=b"m" * 3000, headers={"Cache-Control": "max-age=600"})
    first = await start_proxy(disk__path=str(tmp_path), disk__policy="always", **DISK)
    for _ in range(2):
        assert (await get(first, "/o"))[0] == 200
    await first.stop()
    service = await start_proxy(disk__path=str(tmp_path), disk__policy="always", **DISK)
    for _ in range(3):  # /m is stored in memory; /o's region opened (the Python reader's)
        assert (await get(service, "/m"))[0] == (await get(service, "/o"))[0] == 200

    def failing(key, size, now):
        raise RuntimeError("observer")

    plain = service.proxy.hits.plain_hits
    plain.observe = failing
    for path in ("/m", "/o"):
        before, answered = (await admin_stats(service))["metrics"], plain.answered
        status, headers, _ = await get(service, path)
        after = (await admin_stats(service))["metrics"]
        assert status == 200 and headers["Cache-Status"].startswith("onehit; hit")
        assert plain.answered == answered + 1, path  # answered where it was counted
        assert {k: after[k] - before[k] for k in ("requests", "hits", "misses")} == {
            "requests": 1, "hits": 1, "misses": 0}, path  # fmt: skip


@pytest.mark.parametrize("slow", [False, True])
async def test_a_long_disk_body_is_answered_byte_for_byte_as_its_record(
    origin, start_proxy, tmp_path, slow
):
    """A compiled disk hit's body of 64 KiB or more is read into a buffer of its own and
    answered as a view of it, never copied again: the client gets the record's body byte for
    byte, and with six asked at once and read late (more than the socket's buffers take) the
    answers behind a body's rest wait for it, in order."""
    body = bytes(range(256)) * 3600  # 900 KiB
    origin.set("/long", body=body, headers={"Cache-Control": "max-age=600"})
    # Memory takes a URL at its tenth sighting: every hit here is a disk hit.
    settings = {**DISK, "disk__path": str(tmp_path), "disk__policy": "always",
                "cache__size": "4MiB", "cache__max_object_size": "2MiB",
                "admission__policy": "nth-hit:10"}  # fmt: skip
    first = await start_proxy(**settings)
    assert (await get(first, "/long"))[2] == body
    await first.stop()
    service = await start_proxy(**settings)
    again = await get(service, "/long")  # the region opened by the Python reader
    assert again[2] == body and "detail=disk" in again[1]["Cache-Status"]
    request = b"GET /long HTTP/1.1\r\nHost: example.test\r\n\r\n"
    found = service.proxy.hits.plain_hits.answer_bytes(request, 0)
    assert type(found[2]) is memoryview and found[2] == body
    answered = service.proxy.hits.plain_hits.answered
    client = socket.socket()
    if slow:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
    client.connect(service.proxy_address)
    client.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=client)
    asked = 6 if slow else 1
    try:
        writer.write(request * asked)
        if slow:
            await asyncio.sleep(0.3)
        for _ in range(asked):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert b"detail=disk" in head
            assert await asyncio.wait_for(reader.readexactly(len(body)), 10) == body
    finally:
        writer.close()
    assert service.proxy.hits.plain_hits.answered == answered + asked  # all compiled


async def test_the_disk_admission_auto_says_its_choice_on_stats_and_metrics(
    origin, start_proxy, tmp_path
):
    origin.set("/x", body=b"x" * 1000)
    service = await start_proxy(disk__path=str(tmp_path), disk__policy="auto", **DISK)
    for _ in range(3):
        assert (await get(service, "/x"))[0] == 200
    auto = (await admin_stats(service))["disk_auto"]
    assert auto["choice"] == "second-hit" and auto["switches"] == 0  # where it starts
    keys = [c["key"] for c in auto["candidates"]]
    assert keys[:2] == ["always", "second-hit"]
    assert keys[-3:] == ["size-below:p25", "size-below:p50", "size-below:p75"]
    host, port = service.admin_address
    url = f"http://{host}:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        text = await r.text()
    assert 'onehit_disk_auto_choice{admission="second-hit"} 1' in text
    assert 'onehit_disk_auto_choice{admission="size-below:p50"} 0' in text
    assert "onehit_disk_auto_switches_total 0" in text
    for series in ("recent_hit_ratio", "recent_write_share"):
        assert f"# TYPE onehit_disk_auto_{series} gauge" in text
    fixed = await start_proxy(disk__path=str(tmp_path / "fixed"), **DISK)
    assert (await admin_stats(fixed))["disk_auto"] is None
