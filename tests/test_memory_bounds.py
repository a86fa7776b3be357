"""Memory bounds of the live proxy: a 1 GiB response streams through with bounded buffering,
and concurrent first sightings of large objects are streamed, never buffered.

The RSS bounds (``perf``) assume Linux's ``/proc/PID/status`` and a machine that runs the
proxy, its origin and the client side by side with a GiB or two to spare; they hold with a
margin of several times what this 2-core, 24 GiB machine measures."""

import asyncio
import gc
import socket
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from conftest import base

from loadgen.live.processes import free_port, onehit_process

GIB = 1 << 30
CHUNK = b"\x5a" * (1 << 20)


def status_bytes(pid: int, name: str) -> int:
    """A size in bytes from ``/proc/PID/status`` (``VmHWM``: peak RSS, ``VmRSS``: RSS now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {name}")


def peak_rss(pid: int) -> int:
    return status_bytes(pid, "VmHWM")


async def serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@pytest.mark.perf
@pytest.mark.slow
async def test_a_1gib_response_streams_through_with_rss_growth_under_64mib():
    async def huge(request: web.Request) -> web.StreamResponse:
        if request.path == "/small":
            return web.Response(body=CHUNK, headers={"Cache-Control": "max-age=60"})
        response = web.StreamResponse(headers={"Cache-Control": "max-age=60"})
        response.content_length = GIB
        await response.prepare(request)
        for _ in range(GIB // len(CHUNK)):
            await response.write(CHUNK)
        return response

    runner, origin = await serve(huge)
    try:
        async with (
            onehit_process(origin, {"admission.policy": "always"}) as proxy,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client,
        ):
            async with client.get(f"{proxy.url}/small") as r:  # warm the code paths
                assert len(await r.read()) == len(CHUNK)
            before = peak_rss(proxy.process.pid)
            received = 0
            async with client.get(f"{proxy.url}/big") as r:
                assert r.headers["Cache-Status"] == "onehit; fwd=uri-miss; detail=too-large"
                async for chunk in r.content.iter_chunked(1 << 20):
                    received += len(chunk)
            growth = peak_rss(proxy.process.pid) - before
        assert received == GIB
        print(f"proxy peak RSS grew by {growth / (1 << 20):.1f} MiB for 1 GiB streamed")
        assert growth < 64 << 20, f"proxy peak RSS grew by {growth >> 20} MiB"
    finally:
        await runner.cleanup()


# Socket and stream buffers cost a bounded amount a connection, whatever the object's size,
# set by ``[upstream] read_buffer``: at its default (128 KiB) about 0.6 MiB on asyncio's loop
# and 1.1 MiB on uvloop, which reads on past it sooner; at 64 KiB about 0.6 on both. A
# buffered body would cost its whole 4 MiB.
@pytest.mark.perf
@pytest.mark.parametrize(
    "loop, read_buffer, per_client",
    [("asyncio", "128KiB", 1 << 20), ("uvloop", "128KiB", 3 << 19), ("uvloop", "64KiB", 1 << 20)],
)
async def test_concurrent_first_sightings_of_large_objects_stream_with_flat_rss(
    loop, read_buffer, per_client
):
    """50 clients miss 50 different 4 MiB objects at once: second hit stores none of them, so
    none is buffered (buffered, they would take 200 MiB)."""
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    object_size, clients = 4 << 20, 50

    async def large(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Cache-Control": "max-age=60"})
        response.content_length = object_size
        await response.prepare(request)
        for _ in range(object_size // len(CHUNK)):
            await response.write(CHUNK)
        return response

    runner, origin = await serve(large)
    settings = {
        "admission.policy": "second-hit",
        "server.event_loop": loop,
        "upstream.read_buffer": read_buffer,
    }
    try:
        async with (
            onehit_process(origin, settings) as proxy,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client,
        ):

            async def get(path: str) -> int:
                received = 0
                async with client.get(f"{proxy.url}{path}") as r:
                    assert r.headers["Cache-Status"].endswith("detail=first-sighting")
                    async for chunk in r.content.iter_chunked(1 << 16):
                        received += len(chunk)
                return received

            await get("/warm")
            before = peak_rss(proxy.process.pid)
            sizes = await asyncio.gather(*(get(f"/o{i}") for i in range(clients)))
            growth = peak_rss(proxy.process.pid) - before
        assert sizes == [object_size] * clients
        print(f"proxy peak RSS grew by {growth / (1 << 20):.1f} MiB for {clients} x 4 MiB misses")
        assert growth < clients * per_client, f"proxy peak RSS grew by {growth >> 20} MiB"
    finally:
        await runner.cleanup()


# Each way a client may ask for a stored body: kept alive (the fast path), closing after it,
# HTTP/1.0, the whole of it as a range, and a part of it (206) through aiohttp's handler.
SLOW_READS = (
    b"GET /big HTTP/1.1\r\nHost: %s\r\n\r\n",
    b"GET /big HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
    b"GET /big HTTP/1.0\r\nHost: %s\r\n\r\n",
    b"GET /big HTTP/1.1\r\nHost: %s\r\nRange: bytes=0-\r\n\r\n",
    b"GET /big HTTP/1.1\r\nHost: %s\r\nRange: bytes=1-\r\nConnection: close\r\n\r\n",
)


# uvloop holds the bytes it is given; asyncio's transport copies what the socket does not
# take, up to a piece (256 KiB) a client.
@pytest.mark.slow
@pytest.mark.perf
@pytest.mark.parametrize("loop, bound", [("uvloop", 20 << 20), ("asyncio", 64 << 20)])
async def test_200_clients_that_never_read_a_stored_4mib_body_pin_no_copies_of_it(loop, bound):
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    body, clients = b"\x5a" * (4 << 20), 200

    async def stored(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Cache-Control": "max-age=600"})

    runner, origin = await serve(stored)
    settings = {"admission.policy": "always", "server.event_loop": loop}
    sockets = []
    try:
        async with (
            onehit_process(origin, settings) as proxy,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client,
        ):
            for _ in range(2):  # stored, then a hit: every path's code is loaded
                async with client.get(f"{proxy.url}/big") as r:
                    assert len(await r.read()) == len(body)
            host, port = proxy.url.removeprefix("http://").split(":")
            before = status_bytes(proxy.process.pid, "VmRSS")
            for i in range(clients):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
                request = SLOW_READS[i % len(SLOW_READS)] % f"{host}:{port}".encode()
                await asyncio.get_running_loop().sock_sendall(sock, request)
                sockets.append(sock)
            hits = 0
            for _ in range(200):  # until every one of them was answered from the cache
                async with client.get(f"{proxy.admin_url}/stats") as r:
                    hits = (await r.json())["metrics"]["hits"]
                if hits >= clients + 1:
                    break
                await asyncio.sleep(0.05)
            growth = status_bytes(proxy.process.pid, "VmRSS") - before
            for sock in sockets:  # before the proxy stops: it would drain them for its timeout
                sock.close()
            sockets.clear()
        assert hits == clients + 1
        print(f"{loop}: RSS grew by {growth / (1 << 20):.1f} MiB for {clients} clients not reading")
        assert growth < bound, f"RSS grew by {growth >> 20} MiB"
    finally:
        for sock in sockets:
            sock.close()
        await runner.cleanup()


async def test_requests_leave_no_reference_cycles_for_the_collector(start_proxy, client):
    """The served process collects young objects rarely (``proxy.__main__``), which is only
    sound while what a request leaves behind is freed at once: by reference counts, not by
    the cyclic collector. Misses, stored misses, hits and origin failures are counted here."""
    proxy = await start_proxy(admission__policy="second-hit")
    failing = await start_proxy(upstream__origin=f"http://127.0.0.1:{free_port()}")

    async def requests(tag: str) -> None:
        for i in range(30):
            for _ in range(3):  # a first sighting, a stored second one, then a hit
                async with client.get(f"{base(proxy)}/{tag}{i}") as r:
                    assert r.status == 200
                    await r.read()
            async with client.get(f"{base(failing)}/{tag}{i}") as r:
                assert r.status == 502
                await r.read()

    await requests("warm")
    gc.collect()
    gc.disable()
    try:
        await requests("measured")
        gc.set_debug(gc.DEBUG_SAVEALL)
        found = gc.collect()
        kinds = Counter(type(o).__qualname__ for o in gc.garbage).most_common(8)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    # 120 requests; the client's own objects may leave a few.
    assert found < 12, f"{found} objects in reference cycles: {kinds}"


@pytest.mark.perf
async def test_a_disk_tier_20_times_the_memory_tier_costs_rss_only_the_memory_tier_and_index(
    tmp_path,
):
    body = b"\x5a" * (256 << 10)

    async def objects(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Cache-Control": "max-age=600"})

    runner, origin = await serve(objects)
    memory, disk = 4 << 20, 80 << 20
    settings = {
        "admission.policy": "always", "cache.size": str(memory),
        "cache.max_object_size": str(1 << 20), "disk.path": str(tmp_path / "disk"),
        "disk.size": str(disk), "disk.region_size": str(4 << 20), "disk.policy": "always",
    }  # fmt: skip
    count = disk // len(body) * 3 // 4  # 15 times what memory holds; the disk keeps them all
    try:
        async with (
            onehit_process(origin, settings) as proxy,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client,
        ):
            for i in range(4):  # every path's code loaded: a miss, a disk write, a hit
                async with client.get(f"{proxy.url}/warm-{i % 2}") as r:
                    assert len(await r.read()) == len(body)
            before = status_bytes(proxy.process.pid, "VmRSS")
            for path in [f"/obj-{i}" for i in range(count)] * 2:  # written, then read back
                async with client.get(f"{proxy.url}{path}") as r:
                    assert await r.read() == body
            growth = status_bytes(proxy.process.pid, "VmRSS") - before
            async with client.get(f"{proxy.admin_url}/stats") as r:
                stats = (await r.json())["disk"]
        assert stats["bytes_written"] >= count * len(body) and stats["hits"] >= count - 16
        print(f"RSS grew by {growth / (1 << 20):.1f} MiB with {disk >> 20} MiB on disk")
        assert growth < memory + stats["index_bytes"] + (16 << 20), f"grew {growth >> 20} MiB"
    finally:
        await runner.cleanup()
