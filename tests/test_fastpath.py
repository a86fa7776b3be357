"""Hits answered as soon as they are parsed (``[server] fast_hits``): the same answer as the
request handler's, in order, under the same parser, limits and back-pressure."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import socket
import tracemalloc

import pytest
from aiohttp import web
from conftest import base, read_request, until

from proxy.config.logs import HTTP_ERRORS, OneLineEvery
from proxy.front import _loop
from proxy.front.fastpath import HOLD_LIMIT, Front, HitServer
from proxy.front.life import State
from proxy.handler import hits as hits_module
from proxy.ops.service import Service
from proxy.wire.dates import http_date

HIT = b"GET /hit HTTP/1.1\r\nHost: example.test\r\n\r\n"


async def connect(service: Service) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = service.proxy_address
    return await asyncio.open_connection(host, port)


async def read_response(reader: asyncio.StreamReader, *, head_only: bool = False):
    """(status, fields as (lower-cased name, value), body) of one response on ``reader``."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    fields = [(k.lower(), v) for k, _, v in (line.partition(": ") for line in lines[1:] if line)]
    length = int(dict(fields).get("content-length", "0"))
    body = b"" if head_only else await asyncio.wait_for(reader.readexactly(length), 5)
    return status, fields, body


async def exchange(service: Service, request: bytes, count: int = 1, *, head_only=False):
    reader, writer = await connect(service)
    try:
        writer.write(request)
        return [await read_response(reader, head_only=head_only) for _ in range(count)]
    finally:
        writer.close()


def comparable(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Fields with the values that move with the clock masked."""
    masked = {"date": "*", "age": "*"}
    out = [(k, masked.get(k, v)) for k, v in fields]
    return sorted((k, re.sub(r"ttl=\d+", "ttl=*", v)) for k, v in out)


async def stored(service: Service, path: str = "/hit") -> None:
    """Fetch ``path`` until it is stored (the default admission stores on a second sighting)."""
    for _ in range(2):
        await exchange(service, f"GET {path} HTTP/1.1\r\nHost: example.test\r\n\r\n".encode())


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_fast_hit_is_the_handlers_answer_status_fields_and_body(
    origin, raw_origin, start_proxy, method
):
    # An origin that sends no Date, Server or Content-Type: the proxy adds a Date only.
    async def respond(reader, writer):
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(
                b'HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nETag: "v1"\r\n'
                b"X-Cache: origin's own\r\nContent-Length: 5\r\n\r\nhello"
            )
            await writer.drain()

    url = await raw_origin(respond)
    fast = await start_proxy(upstream__origin=url)
    slow = await start_proxy(upstream__origin=url, server__fast_hits=False)
    request = f"{method} /hit HTTP/1.1\r\nHost: example.test\r\n\r\n".encode()
    answers = []
    for service in (fast, slow):
        await stored(service)
        [answer] = await exchange(service, request, head_only=method == "HEAD")
        answers.append(answer)
    assert fast.proxy.fast_hits == 1 and slow.proxy.fast_hits == 0
    (status, fields, body), (slow_status, slow_fields, slow_body) = answers
    assert (
        (status, body) == (slow_status, slow_body) == (200, b"" if method == "HEAD" else b"hello")
    )
    assert comparable(fields) == comparable(slow_fields)
    names = {k for k, _ in fields}
    assert {"date", "age", "cache-status", "via", "accept-ranges"} <= names
    assert "server" not in names and "content-type" not in names
    assert ("x-cache", "HIT") in fields and ("content-length", "5") in fields


async def test_origin_date_and_content_type_are_kept_not_doubled(origin, start_proxy, client):
    origin.set("/hit", headers={"Cache-Control": "max-age=60", "Content-Type": "text/css"})
    service = await start_proxy()
    await stored(service)
    [(_, fields, body)] = await exchange(service, HIT)
    assert service.proxy.fast_hits == 1
    names = [k for k, _ in fields]
    assert names.count("date") == names.count("content-type") == names.count("server") == 1
    assert ("content-type", "text/css") in fields and body == b"hello from the origin"


async def test_rfc9111_4_1_a_hit_on_a_variant_is_answered_as_parsed(origin, start_proxy):
    origin.set("/hit", headers={"Cache-Control": "max-age=60", "Vary": "Accept-Encoding"})
    service = await start_proxy()
    gzip = b"GET /hit HTTP/1.1\r\nHost: example.test\r\nAccept-Encoding: gzip\r\n\r\n"
    plain = b"GET /hit HTTP/1.1\r\nHost: example.test\r\n\r\n"
    for _ in range(2):  # stored on the second sighting of the URL
        await exchange(service, gzip)
    [(_, fields, _)] = await exchange(service, gzip)
    assert dict(fields)["x-cache"] == "HIT" and service.proxy.fast_hits == 1
    [(_, fields, _)] = await exchange(service, plain)  # another variant: not stored yet
    assert dict(fields)["x-cache"] == "MISS" and service.proxy.fast_hits == 1


SLOW_MISS = b"GET /slow HTTP/1.1\r\nHost: example.test\r\n\r\n"
POST = b"POST /form HTTP/1.1\r\nHost: example.test\r\nContent-Length: 2\r\n\r\nhi"


@pytest.mark.parametrize(
    ("pipelined", "x_cache", "fast"),
    [
        # The hits behind the miss are held while the lane answers it, then answered as parsed.
        (HIT + SLOW_MISS + HIT + HIT, ["HIT", "MISS", "HIT", "HIT"], 3),
        # Behind a request for aiohttp's handler, the hits take their turn there.
        (HIT + SLOW_MISS + POST + HIT + HIT, ["HIT", "MISS", "BYPASS", "HIT", "HIT"], 1),
    ],
)
async def test_pipelined_requests_are_answered_in_order_when_a_miss_sits_between_hits(
    origin, start_proxy, pipelined, x_cache, fast
):
    origin.set("/slow", delay=0.3)
    service = await start_proxy()
    await stored(service)
    answers = await exchange(service, pipelined, len(x_cache))
    assert [dict(f)["x-cache"] for _, f, _ in answers] == x_cache
    assert service.proxy.fast_hits == fast
    assert answers[1][2] == b"hello from the origin" and origin.hits["/slow"] == 1


async def test_a_connection_moves_through_the_life_table_as_it_is_served(origin, start_proxy):
    """The front's state (``proxy.front.life``) is where the connection is: reading between
    answers, answering while a miss waits on the origin, begun once the miss's head went out,
    handed over at a request it does not take."""
    gate = asyncio.Event()

    async def gated(request: web.Request) -> web.StreamResponse:
        if request.path == "/stream":  # its head and a first part, the rest after the gate
            response = web.StreamResponse(headers={"Content-Length": "8"})
            await response.prepare(request)
            await response.write(b"firs")
            await gate.wait()
            await response.write(b"t ok")
            return response
        if request.path == "/slow":
            await gate.wait()
        return web.Response(body=b"late", headers={"Cache-Control": "max-age=600"})

    origin.responder = gated
    service = await start_proxy()
    await stored(service)
    server = service.proxy_runner.server
    await until(lambda: not server.fronts)  # the connections that stored /hit closed
    reader, writer = await connect(service)
    try:
        await until(lambda: server.fronts)
        [front] = server.fronts
        assert front.state is State.READING
        writer.write(HIT)
        await read_response(reader)
        assert front.state is State.READING
        writer.write(b"GET /slow HTTP/1.1\r\nHost: example.test\r\n\r\n")
        await until(lambda: front.state is State.ANSWERING)
        gate.set()
        assert (await read_response(reader))[2] == b"late"
        await until(lambda: front.state is State.READING)
        gate.clear()
        writer.write(b"GET /stream HTTP/1.1\r\nHost: example.test\r\n\r\n")
        await until(lambda: front.state is State.BEGUN)  # relayed as it comes: its head is out
        gate.set()
        assert (await read_response(reader))[2] == b"first ok"
        await until(lambda: front.state is State.READING)
        writer.write(b"GET /hit HTTP/1.1\r\nHost: example.test\r\nContent-Length: 1\r\n\r\nx")
        await read_response(reader)
        assert front.state is State.HANDED_OVER and front.handed_over
    finally:
        writer.close()


async def test_after_a_miss_the_connection_answers_hits_fast_again(origin, start_proxy):
    service = await start_proxy()
    await stored(service)
    reader, writer = await connect(service)
    try:
        fronts = service.proxy_runner.server.fronts
        for path in (b"/hit", b"/new", b"/hit"):
            writer.write(b"GET %s HTTP/1.1\r\nHost: example.test\r\n\r\n" % path)
            await read_response(reader)
            await until(lambda: all(front.lane_idle for front in fronts))  # the miss ended
    finally:
        writer.close()
    assert service.proxy.fast_hits == 2


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ('If-Match: "b1"', 200),
        ("If-Unmodified-Since: Sun, 01 Jan 2034 00:00:00 GMT", 200),
    ],
)
async def test_preconditions_on_a_hit_are_answered_by_the_handler(
    origin, start_proxy, fields, status
):
    origin.set("/hit", headers={"Cache-Control": "max-age=60", "ETag": '"b1"'})
    service = await start_proxy()
    await stored(service)
    request = f"GET /hit HTTP/1.1\r\nHost: example.test\r\n{fields}\r\n\r\n".encode()
    [(got, _, _)] = await exchange(service, request)
    assert got == status
    assert service.proxy.fast_hits == 0


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ('If-None-Match: "b1"', 304),
        ('If-None-Match: "other"', 200),
        ("If-Modified-Since: Sun, 01 Jan 2034 00:00:00 GMT", 304),
        ("If-Modified-Since: Sun, 01 Jan 2006 00:00:00 GMT", 200),
        ("Range: bytes=0-4", 206),
        ("Range: bytes=-3", 206),
        ("Range: bytes=100-200", 416),
        ("Range: bytes=0-1,3-4", 200),
        ('Range: bytes=2-5\r\nIf-Range: "b1"', 206),
        ('Range: bytes=2-5\r\nIf-Range: "other"', 200),
    ],
)
async def test_rfc9110_13_14_a_revalidating_or_ranged_hit_is_answered_as_the_handler_would(
    origin, start_proxy, fields, status
):
    headers = {"Cache-Control": "max-age=60", "ETag": '"b1"', "Content-Type": "text/css",
               "Last-Modified": "Sun, 01 Jan 2017 00:00:00 GMT", "X-Origin-Count": "1"}  # fmt: skip
    origin.set("/hit", headers=headers)
    fast = await start_proxy()
    slow = await start_proxy(server__fast_hits=False)
    request = f"GET /hit HTTP/1.1\r\nHost: example.test\r\n{fields}\r\n\r\n".encode()
    answers = []
    for service in (fast, slow):
        await stored(service)
        [answer] = await exchange(service, request, head_only=status == 304)
        answers.append(answer)
    (got, fields_sent, body), (slow_got, slow_fields, slow_body) = answers
    assert got == slow_got == status and body == slow_body
    if status == 206:
        assert len(body) in (3, 4, 5) and body in b"hello from the origin"
    assert comparable(fields_sent) == comparable(slow_fields)
    assert fast.proxy.fast_hits == 1 and dict(fields_sent)["x-cache"] == "HIT"
    counted = fast.proxy.engine.stats(), slow.proxy.engine.stats()
    assert counted[0]["hits"] == counted[1]["hits"] == 1
    for name in ("not_modified_answers", "range_answers"):
        assert counted[0][name] == counted[1][name]
    if status == 304:
        assert "content-length" not in dict(fields_sent)
        assert "content-type" not in dict(fields_sent)


async def test_http_1_0_and_connection_close_go_to_the_handler(origin, start_proxy):
    service = await start_proxy()
    await stored(service)
    for request in (
        b"GET /hit HTTP/1.0\r\nHost: example.test\r\n\r\n",
        b"GET /hit HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n",
    ):
        reader, writer = await connect(service)
        writer.write(request)
        status, fields, _ = await read_response(reader)
        assert status == 200 and dict(fields)["x-cache"] == "HIT"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed after the answer
        writer.close()
    assert service.proxy.fast_hits == 0


@pytest.mark.parametrize(
    "bad",
    [
        # Request smuggling: both framings at once (RFC 9112 section 6.1), refused by the parser.
        b"GET /hit HTTP/1.1\r\nHost: example.test\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /hit HTTP/1.1\r\nHost: example.test\r\nContent-Length: 1\r\n"
        b"Content-Length: 2\r\n\r\n",
        b"GET /hit HTTP/1.1\r\nHost : example.test\r\n\r\n",
        b"GET /hit HTTP/1.1\r\nHost: example.test\r\n Folded: line\r\n\r\n",
        b"GET /hit HTTP/1.1\nHost: example.test\n\n",
    ],
)
async def test_what_the_strict_parser_refuses_is_refused_even_after_a_hit(origin, start_proxy, bad):
    service = await start_proxy()
    await stored(service)
    reader, writer = await connect(service)
    writer.write(HIT)
    status, _, _ = await read_response(reader)
    assert status == 200
    writer.write(bad)
    status, _, _ = await read_response(reader)
    assert status == 400
    writer.close()
    assert service.proxy.fast_hits == 1


async def test_a_hit_with_a_body_or_a_wrong_host_is_not_answered_fast(origin, start_proxy):
    service = await start_proxy()
    await stored(service)
    with_body = b"GET /hit HTTP/1.1\r\nHost: example.test\r\nContent-Length: 2\r\n\r\nab"
    [(status, fields, _)] = await exchange(service, with_body)
    # Past the cache, body and all: the cache keys on no body.
    assert status == 200 and dict(fields)["x-cache"] == "BYPASS"
    [(status, _, _)] = await exchange(service, b"GET /hit HTTP/1.1\r\nHost: a/b\r\n\r\n")
    assert status == 400
    assert service.proxy.fast_hits == 0


async def test_a_client_that_pipelines_and_never_reads_holds_a_bounded_buffer(origin, start_proxy):
    body = b"x" * (64 << 10)
    origin.set("/hit", body=body)
    service = await start_proxy()
    await stored(service)
    count = 400  # 25 MiB of answers if every one were written at once
    reader, writer = await connect(service)
    writer.write(HIT * count)
    await writer.drain()
    server = service.proxy_runner.server
    assert server is not None
    # Until the proxy can write no more: its connection stopped writing to the client.
    await until(lambda: server.connections and all(h.writing_paused for h in server.connections))
    buffered = max(h.transport.get_write_buffer_size() for h in server.connections if h.transport)
    assert buffered < 1 << 20
    answers = [await read_response(reader) for _ in range(count)]
    writer.close()
    assert all(status == 200 and got == body for status, _, got in answers)
    assert service.proxy.engine.counters.hits == count
    assert 0 < service.proxy.fast_hits < count  # the handler took over while the client lagged


async def test_a_client_that_pipelines_misses_and_never_reads_holds_a_bounded_buffer(
    origin, start_proxy
):
    body = b"x" * (8 << 10)  # arrives with its head: each answer is written at once
    count = 400  # 3.2 MiB of answers
    for i in range(count):
        origin.set(f"/miss-{i}", body=body)
    service = await start_proxy()
    # A small receive buffer, so the kernel cannot hold the answers in the client's stead.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.connect(service.proxy_address)
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    server = service.proxy_runner.server
    assert server is not None
    while not server.connections:  # accepted on the loop's next turn
        await asyncio.sleep(0.01)
    [handler] = server.connections
    assert handler.transport is not None
    handler.transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10
    )
    writer.write(b"".join(b"GET /miss-%d HTTP/1.1\r\nHost: example.test\r\n\r\n" % i
                          for i in range(count)))  # fmt: skip
    await writer.drain()
    # Until the proxy can write no more: the connection stopped writing, and handed over.
    await until(lambda: any(h.writing_paused for h in server.connections))
    assert handler.transport.get_write_buffer_size() < 1 << 20
    answers = [await read_response(reader) for _ in range(count)]
    writer.close()
    assert all(status == 200 and got == body for status, _, got in answers)
    assert service.proxy.engine.counters.misses == count


async def test_hits_keep_a_connection_open_past_the_idle_timeout(origin, start_proxy):
    service = await start_proxy(server__idle_timeout="400ms")
    await stored(service)
    reader, writer = await connect(service)
    for _ in range(6):  # 0.9 s of hits, one every 150 ms
        writer.write(HIT)
        status, _, _ = await read_response(reader)
        assert status == 200
        await asyncio.sleep(0.15)
    assert await asyncio.wait_for(reader.read(), 3) == b""  # then idle: closed
    writer.close()
    assert service.proxy.fast_hits == 6


async def test_a_slow_miss_in_the_lane_outlasts_the_idle_timeout(origin, start_proxy):
    origin.set("/slow", delay=0.8, body=b"late")
    service = await start_proxy(server__idle_timeout="300ms")
    reader, writer = await connect(service)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: example.test\r\n\r\n")
    status, fields, body = await read_response(reader)
    assert (status, dict(fields)["x-cache"], body) == (200, "MISS", b"late")
    assert await asyncio.wait_for(reader.read(), 3) == b""  # then idle: closed
    writer.close()


async def test_requests_held_behind_the_lane_stop_reading_at_the_queue_limit(origin, start_proxy):
    origin.set("/slow", delay=0.5)
    service = await start_proxy()
    await stored(service)
    count = 3000  # 3.3 MB of requests: more than the socket buffers hold
    padded = HIT[:-2] + b"X-Pad: " + b"p" * 1024 + b"\r\n\r\n"
    reader, writer = await connect(service)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: example.test\r\n\r\n" + padded * count)
    server = service.proxy_runner.server
    assert server is not None
    await origin.arrived("/slow")  # the miss is at the origin: every hit waits behind it
    await until(lambda: next(iter(server.connections)).reading_paused)
    assert not service.proxy.fast_hits
    [front] = server.connections
    # Reading stopped once the bytes held passed the limit: one read past it at most.
    assert front.reading_paused and HOLD_LIMIT < len(front.held) <= HOLD_LIMIT + (256 << 10)
    answers = [await read_response(reader) for _ in range(count + 1)]
    writer.close()
    assert [dict(f)["x-cache"] for _, f, _ in answers] == ["MISS"] + ["HIT"] * count
    assert service.proxy.fast_hits == count


async def test_a_request_the_parser_refuses_behind_the_lane_gets_its_400_after_the_miss(
    origin, start_proxy
):
    origin.set("/slow", delay=0.3, body=b"first")
    service = await start_proxy()
    reader, writer = await connect(service)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: example.test\r\n\r\n")
    await origin.arrived("/slow")  # the miss is in the lane, at the origin
    writer.write(b"GET /next HTTP/1.1\r\nHost: example.test\r\nNo colon here\r\n\r\n")
    first = await read_response(reader)
    second = await read_response(reader)
    assert (first[0], first[2]) == (200, b"first") and second[0] == 400
    assert await asyncio.wait_for(reader.read(), 3) == b""
    writer.close()
    assert origin.hits["/next"] == 0


@pytest.mark.parametrize("path", ["/hit?q=1", "/hit/%7Ea?q=%2F:@!$'()*+,;=", "/miss?q=1"])
@pytest.mark.parametrize("log_format", ["combined", "json"])
async def test_an_answer_as_parsed_or_in_the_lane_writes_the_handlers_access_log_line(
    origin, start_proxy, tmp_path, path, log_format
):
    lines = []
    for fast_hits in (True, False):
        log = tmp_path / f"{fast_hits}.log"
        service = await start_proxy(server__access_log=True, server__access_log_file=str(log),
                                    server__access_log_format=log_format,
                                    server__fast_hits=fast_hits)  # fmt: skip
        await stored(service, path if path.startswith("/hit") else "/hit?q=1")
        service.access_file.flush()  # the lines of storing it, held until the next interval
        before = len(log.read_text().splitlines())
        await exchange(
            service,
            f"GET {path} HTTP/1.1\r\nHost: example.test\r\nUser-Agent: t/1\r\n\r\n".encode(),
        )

        def written(log=log, before=before, service=service) -> bool:
            service.access_file.flush()
            return len(log.read_text().splitlines()) > before

        await until(written)
        [line] = log.read_text().splitlines()[before:]
        # What differs between any two requests: the time, the durations (the answer's and
        # its wait on the origin), the ttl, the id.
        lines.append(re.sub(r'\[.*?\]|"time":"[^"]+"|"duration_us":\d+|"origin_us":\d+|'
                            r'ttl=\d+|"request_id":"[^"]+"', "*", line))  # fmt: skip
        if fast_hits:
            assert service.proxy.fast_hits == (1 if path.startswith("/hit") else 0)
    assert lines[0] == lines[1]
    assert (f'"GET {path} HTTP/1.1" 200 ' if log_format == "combined" else path) in lines[0]


async def test_fast_hits_are_counted_on_the_admin_port(origin, start_proxy, client):
    service = await start_proxy()
    await stored(service)
    await exchange(service, HIT + HIT, 2)
    host, port = service.admin_address
    async with client.get(f"http://{host}:{port}/stats") as r:
        stats = await r.json()
    assert stats["fast_hits"] == 2 and stats["metrics"]["hits"] == 2
    # The first hit rendered the stored head (Python); the second was answered compiled.
    assert service.proxy.plain_hits.answered == 1
    async with client.get(f"http://{host}:{port}/metrics") as r:
        assert "onehit_fast_hits_total 2.0" in await r.text()
    async with client.get(base(service) + "/hit", headers={"Host": "example.test"}) as r:
        assert r.headers["X-Cache"] == "HIT"
    assert service.proxy.fast_hits == 3


async def test_rendered_heads_of_a_full_cache_stay_within_its_size(origin, start_proxy):
    # 16 KB of header text per response: its rendered head is as large again, and is charged.
    headers = {"Cache-Control": "max-age=60", "X-Large-1": "h" * 8000, "X-Large-2": "h" * 8000}
    origin.set("/", headers=headers)
    service = await start_proxy(
        cache__size="2MiB", cache__max_object_size="64KiB", admission__policy="always"
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            path = f"/large/{i}"
            origin.set(path, headers=headers)
            reader, writer = await connect(service)
            request = f"GET {path} HTTP/1.1\r\nHost: example.test\r\n\r\n".encode()
            for _ in range(3):  # stored, then a hit that renders its head, then another
                writer.write(request)
                await read_response(reader)
            writer.close()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stats = service.proxy.engine.stats()
    assert service.proxy.fast_hits == 400 and stats["evictions"] > 150
    assert stats["bytes_used"] <= 2 << 20
    print(f"traced memory grew {growth / (1 << 20):.1f} MiB for a 2 MiB cache")
    assert growth < (2 << 20) + (2 << 20), f"grew {growth >> 20} MiB for a 2 MiB cache"


async def test_a_failure_answering_as_parsed_leaves_the_answer_to_the_handler(
    origin, start_proxy, caplog, monkeypatch
):
    monkeypatch.setattr(HTTP_ERRORS, "filters", [OneLineEvery()])
    service = await start_proxy()
    await stored(service)

    def broken(message, remote, scheme):
        raise RuntimeError("a bug in the fast path")

    server = service.proxy_runner.server
    assert isinstance(server, HitServer)
    server.answers = (server.answers[0], broken)  # the answerer after the compiled one
    with caplog.at_level(logging.ERROR, logger="onehit.http"):
        [(status, fields, body)] = await exchange(service, HIT)
    assert (status, dict(fields)["x-cache"], body) == (200, "HIT", b"hello from the origin")
    assert "answering GET /hit as parsed failed" in caplog.text


def test_the_compiled_loop_finds_every_method_and_slot_it_asks_of_a_front_by_name():
    """``proxy/front/_loop.c`` calls the front's methods and reads its slots by name: a rename
    on either side fails here, not on the request that takes that branch."""
    slots = {name for cls in Front.__mro__ for name in getattr(cls, "__slots__", ())}
    assert [m for m in _loop.front_methods if not hasattr(Front, m)] == []
    assert [f for f in _loop.front_slots if f not in slots] == []


async def test_a_failure_reading_a_request_from_its_bytes_leaves_it_to_the_parser(
    origin, start_proxy, caplog, monkeypatch
):
    """The compiled loop logs what the answerer of a request's bytes raised, with its
    traceback, and the request is parsed and answered as any other."""
    monkeypatch.setattr(HTTP_ERRORS, "filters", [OneLineEvery()])
    service = await start_proxy()
    await stored(service)

    def broken(data, start):
        raise RuntimeError("a bug reading bytes")

    server = service.proxy_runner.server
    assert isinstance(server, HitServer)
    server.answer_bytes = broken
    with caplog.at_level(logging.ERROR, logger="onehit.http"):
        answers = await exchange(service, HIT * 2, count=2)
    assert [(status, dict(fields)["x-cache"], body) for status, fields, body in answers] == [
        (200, "HIT", b"hello from the origin")
    ] * 2
    assert "answering a request as its bytes came failed" in caplog.text
    assert "RuntimeError('a bug reading bytes') at " in caplog.text  # where it was raised


async def test_a_hit_whose_log_line_fails_is_answered_and_its_connection_goes_on(
    origin, start_proxy, caplog, monkeypatch, tmp_path
):
    monkeypatch.setattr(HTTP_ERRORS, "filters", [OneLineEvery()])
    service = await start_proxy(server__access_log=True,
                                server__access_log_file=str(tmp_path / "access.log"))  # fmt: skip
    await stored(service)

    class FailingLines:
        """The log's lines, but a hit's line fails."""

        def hit(self, *args):
            raise RuntimeError("a log that fails")

    server = service.proxy_runner.server
    assert isinstance(server, HitServer)
    server.hit_log.lines = FailingLines()
    fast = service.proxy.fast_hits
    with caplog.at_level(logging.ERROR, logger="onehit.http"):
        answers = await exchange(service, HIT * 3, count=3)
    assert [(status, body) for status, _, body in answers] == [(200, b"hello from the origin")] * 3
    assert service.proxy.fast_hits == fast + 3
    assert "an access log line failed" in caplog.text
    assert "RuntimeError('a log that fails') at " in caplog.text


MISS_SHAPES = {
    "typical": b"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nServer: origin\r\n"
    b'Content-Type: text/plain\r\nCache-Control: max-age=600\r\nETag: "v1"\r\n'
    b"Content-Length: 5\r\n\r\nhello",
    "no Date, Server or Content-Type": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "empty": b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 0\r\n\r\n",
    "404, a reason of its own": b"HTTP/1.1 404 Gone Fishing\r\nContent-Length: 5\r\n\r\nhello",
    "fields the proxy sets": b"HTTP/1.1 200 OK\r\nVia: 1.1 upstream\r\nX-Cache: origin's own\r\n"
    b"Content-Length: 5\r\n\r\nhello",
    "no length": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "not ASCII": b"HTTP/1.1 200 OK\r\nX-Name: caf\xc3\xa9\r\nContent-Length: 5\r\n\r\nhello",
    "no content": b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    # The body after the head, apart: streamed through aiohttp's writer, not written at once.
    "body apart": (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"hello"),
}


# The shapes a miss sent at once on a pooled connection answers in the callback that brings
# them: whole and plain (``proxy/origin/_origin.c``), with no field the proxy marks. The others go
# on in the lane's task.
ANSWERED_AS_THEY_ARRIVE = {"typical", "no Date, Server or Content-Type", "empty",
                           "404, a reason of its own", "not ASCII"}  # fmt: skip


@pytest.mark.parametrize("shape", list(MISS_SHAPES))
async def test_a_miss_in_the_lane_has_the_handlers_head_field_for_field(
    raw_origin, start_proxy, shape
):
    pieces = MISS_SHAPES[shape]
    pieces = pieces if isinstance(pieces, tuple) else (pieces,)

    async def respond(reader, writer):
        while await reader.readuntil(b"\r\n\r\n"):
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.05)

    url = await raw_origin(respond)
    fast = await start_proxy(upstream__origin=url, admission__policy="always")
    slow = await start_proxy(upstream__origin=url, admission__policy="always",
                             server__fast_hits=False)  # fmt: skip
    answers = []
    for service in (fast, slow):
        # A first miss leaves an idle pooled connection, which the measured one is sent on.
        await exchange(service, b"GET /warm HTTP/1.1\r\nHost: example.test\r\n\r\n")
        await until(lambda s=service: pool_idle(s))
        reader, writer = await connect(service)
        try:
            writer.write(b"GET /miss HTTP/1.1\r\nHost: example.test\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            body = (
                await asyncio.wait_for(reader.readuntil(b"hello"), 5)
                if b"hello" in b"".join(pieces)
                else b""
            )
        finally:
            writer.close()
        # The same fields in the same order; only a Date the proxy adds moves with the clock.
        answers.append((re.sub(rb"\r\nDate: [^\r]*", b"\r\nDate: *", head), body))
    assert answers[0] == answers[1]
    assert b"X-Cache: MISS\r\n" in answers[0][0]
    assert fast.proxy.engine.stats() == slow.proxy.engine.stats()
    assert fast.proxy.fast_misses == (1 if shape in ANSWERED_AS_THEY_ARRIVE else 0)
    assert slow.proxy.fast_misses == 0


async def test_a_miss_answered_as_its_response_arrives_is_stored_and_then_hit(origin, start_proxy):
    service = await start_proxy(admission__policy="always")
    reader, writer = await connect(service)
    try:
        for path in (b"/warm", b"/new", b"/new"):
            writer.write(b"GET %s HTTP/1.1\r\nHost: example.test\r\n\r\n" % path)
            status, fields, body = await read_response(reader)
            await until(lambda: pool_idle(service))  # the miss's connection is back in the pool
    finally:
        writer.close()
    assert (status, dict(fields)["x-cache"], body) == (200, "HIT", b"hello from the origin")
    assert service.proxy.fast_misses == 1 and service.proxy.fast_hits == 1
    assert origin.hits["/new"] == 1


async def test_concurrent_misses_share_the_fetch_of_a_miss_sent_at_once(origin, start_proxy):
    origin.set("/burst", delay=0.3, body=b"for everyone")
    service = await start_proxy()
    await exchange(service, b"GET /warm HTTP/1.1\r\nHost: example.test\r\n\r\n")
    request = b"GET /burst HTTP/1.1\r\nHost: example.test\r\n\r\n"
    answers = await asyncio.gather(*(exchange(service, request) for _ in range(5)))
    assert origin.hits["/burst"] == 1 and service.proxy.fast_misses == 1
    assert [body for [(_, _, body)] in answers] == [b"for everyone"] * 5
    statuses = sorted(dict(fields)["cache-status"] for [(_, fields, _)] in answers)
    assert [s for s in statuses if "collapsed" in s] == statuses[:4]
    # Five sightings in one burst: the URL is stored, and its next request is a hit.
    [(_, fields, _)] = await exchange(service, request)
    assert dict(fields)["x-cache"] == "HIT" and origin.hits["/burst"] == 1


async def test_a_miss_sent_at_once_that_the_origin_never_answers_is_a_504(raw_origin, start_proxy):
    connections = 0

    async def answers_once(reader, writer):
        nonlocal connections
        connections += 1
        while (head := await reader.readuntil(b"\r\n\r\n")) and b"/silent" not in head:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        await asyncio.sleep(10)

    url = await raw_origin(answers_once)
    service = await start_proxy(upstream__origin=url, upstream__read_timeout="300ms")
    reader, writer = await connect(service)
    answers = []
    try:
        for path in (b"/warm", b"/silent", b"/after"):
            writer.write(b"GET %s HTTP/1.1\r\nHost: example.test\r\n\r\n" % path)
            status, _, body = await read_response(reader)
            answers.append((status, body))
            await until(lambda: pool_idle(service))  # the request's connection left the pool's use
    finally:
        writer.close()
    assert answers == [(200, b"ok"), (504, b"origin timed out\n"), (200, b"ok")]
    assert connections == 2  # the silent request went on the pooled connection


async def test_a_client_that_leaves_before_its_miss_is_answered_leaves_the_proxy_serving(
    origin, start_proxy
):
    origin.set("/slow", delay=0.3, body=b"late")
    service = await start_proxy()
    await exchange(service, b"GET /warm HTTP/1.1\r\nHost: example.test\r\n\r\n")
    _, writer = await connect(service)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: example.test\r\n\r\n")
    await writer.drain()
    await origin.arrived("/slow")
    writer.close()
    await until(lambda: not service.proxy.flights)  # the origin answered a client that is gone
    for path in (b"/slow", b"/warm"):
        [(status, _, body)] = await exchange(
            service, b"GET %s HTTP/1.1\r\nHost: example.test\r\n\r\n" % path
        )
        assert status == 200 and body in (b"late", b"hello from the origin")
    assert len(service.proxy.flights) == 0


async def test_hits_read_from_their_bytes_or_parsed_are_answered_alike_in_order(
    origin, start_proxy
):
    # One read of three pipelined hits (read from their bytes), then a hit split over two
    # reads and a request with an odd field (both for aiohttp's parser), then a plain one.
    service = await start_proxy()
    await stored(service)
    reader, writer = await connect(service)
    try:
        writer.write(HIT * 3)
        answers = [await read_response(reader) for _ in range(3)]
        writer.write(HIT[:9])
        await writer.drain()
        fronts = service.proxy_runner.server.fronts
        await until(lambda: any(front.held == HIT[:9] for front in fronts))  # read apart
        writer.write(
            HIT[9:] + b"GET /hit HTTP/1.1\r\nHost: example.test\r\nX-Odd: caf\xc3\xa9\r\n\r\n"
        )
        answers += [await read_response(reader) for _ in range(2)]
        writer.write(HIT)
        answers.append(await read_response(reader))
    finally:
        writer.close()
    assert [(status, dict(fields)["x-cache"], body) for status, fields, body in answers] == [
        (200, "HIT", b"hello from the origin")
    ] * 6
    assert service.proxy.fast_hits == 6 and service.proxy.plain_hits.answered == 5


# Requests a client may send on one connection, plain or not, for the streams below.
STREAM_REQUESTS = [
    HIT,
    b"GET /hit HTTP/1.1\r\nHost: example.test\r\nUser-Agent: t/1\r\nConnection: keep-alive\r\n\r\n",
    b"GET /hit HTTP/1.1\r\nHost: example.test\r\nCookie: id=1\r\n\r\n",
    b"GET /hit HTTP/1.1\r\nHost: EXAMPLE.test:80\r\n\r\n",
    b"GET /hit HTTP/1.1\r\nHost: example.test\r\nX-Name: caf\xc3\xa9\r\n\r\n",
    b'GET /hit HTTP/1.1\r\nHost: example.test\r\nIf-None-Match: "nope"\r\n\r\n',
    b"GET /miss-{n} HTTP/1.1\r\nHost: example.test\r\n\r\n",
    b"GET /miss-{n}?a=%2F HTTP/1.1\r\nHost: example.test\r\nAccept: */*\r\n\r\n",
    b"GET /hit HTTP/1.1\r\nHost: other.test\r\n\r\n",
]
# Requests aiohttp's parser refuses (400, then the connection closes): a stream ends with one.
REFUSED_REQUESTS = [
    b"GET /hit HTTP/1.1\r\nHost: example.test\r\nHost: example.test\r\n\r\n",
    b"GET /hit HTTP/1.1\r\nHost: example.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n0\r\n\r\n",
    b"GET /hit HTTP/1.1\r\nHost: example.test\r\nBad Name: x\r\n\r\n",
]


async def answers_to(
    service: Service, chunks: list[bytes], pause: float = 0.01
) -> list[tuple[int, str, bytes]]:
    """(status, X-Cache, body) of every answer on one connection that sends ``chunks``, each
    apart (``pause`` seconds after each), until the proxy has answered what it will and
    closed or gone quiet."""
    reader, writer = await connect(service)
    try:
        for chunk in chunks:
            try:
                writer.write(chunk)
                await writer.drain()
            except ConnectionError:
                break  # closed after what it refused: the answers before are still to read
            await asyncio.sleep(pause)
        answers = []
        while True:
            try:
                status, fields, body = await read_response(reader)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return answers
            answers.append((status, dict(fields).get("x-cache", ""), body))
    finally:
        writer.close()


@pytest.mark.parametrize("seed", range(8))
async def test_streams_of_plain_and_odd_requests_get_the_handlers_answers_in_order(
    origin, start_proxy, seed
):
    # Requests read from their bytes or parsed, split anywhere across reads, pipelined, and
    # ending in what the parser refuses: the same answers as the handler's, in order.
    rng = random.Random(seed)
    requests = [
        rng.choice(STREAM_REQUESTS).replace(b"{n}", b"%d" % rng.randrange(3))
        for _ in range(rng.randrange(2, 7))
    ]
    stream = b"".join(requests)
    cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(0, 4)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    if seed % 2:
        # In a read of its own: sent in one read with requests before it, aiohttp's parser
        # drops those, through the handler as before.
        requests.append(rng.choice(REFUSED_REQUESTS))
        chunks.append(requests[-1])
    fast = await start_proxy(server__idle_timeout="0.5s")
    slow = await start_proxy(server__idle_timeout="0.5s", server__fast_hits=False)
    await stored(fast)
    await stored(slow)
    # The reference: the handler's answers to the same requests, each in a read of its own.
    seen = [await answers_to(fast, chunks), await answers_to(slow, requests, pause=0.1)]
    assert seen[0] == seen[1] and seen[0]


def pool_idle(service) -> bool:
    """Whether no origin connection of ``service``'s pool is in use: the last response was
    read whole and its connection went back (or was closed)."""
    return service.proxy.upstream._pool._in_use == 0


@pytest.mark.parametrize("tier", ["memory", "disk"])
async def test_a_hit_the_compiled_path_fails_to_render_is_counted_once_by_the_handler(
    raw_origin, start_proxy, monkeypatch, tmp_path, tier
):
    """The compiled path counts a hit (and keeps a disk hit in memory) only once its answer
    is rendered: when rendering fails, the handler answers the request, and it is one hit,
    not two."""

    async def undated(reader, writer):  # no Date: every hit renders one
        while await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\n"
                         b"Content-Length: 5\r\n\r\nhello")  # fmt: skip
            await writer.drain()

    failing = [True]

    def date() -> str:
        if failing and failing.pop():
            raise RuntimeError("a render that fails")
        return http_date()

    monkeypatch.setattr(hits_module, "http_date", date)
    monkeypatch.setattr(HTTP_ERRORS, "filters", [OneLineEvery()])
    url = await raw_origin(undated)
    disk = {"disk__path": str(tmp_path), "disk__size": "4MiB", "disk__region_size": "1MiB",
            "disk__policy": "always"} if tier == "disk" else {}  # fmt: skip
    service = await start_proxy(upstream__origin=url, admission__policy="always", **disk)
    request = b"GET /r HTTP/1.1\r\nHost: example.test\r\n\r\n"
    await exchange(service, request)  # stored
    await exchange(service, request)  # a hit: its head rendered, for the compiled path
    if tier == "disk":  # only the disk holds it: the compiled path reads its record
        service.proxy.engine.store.delete(service.proxy.router.url_key("http://example.test/r"))
    failing[:] = [True]
    counters = service.proxy.engine.counters
    before = counters.hits
    [(status, _, body)] = await exchange(service, request)
    assert (status, body) == (200, b"hello")
    assert counters.hits == before + 1 and not failing


LARGE = bytes(range(256)) * (32 << 10)  # 8 MiB: drained a piece at a time (SENDING)


async def large_stored(origin, start_proxy, **settings) -> Service:
    origin.set("/big", body=LARGE, headers={"Cache-Control": "max-age=600"})
    service = await start_proxy(admission__policy="always", cache__max_object_size="16MiB",
                                cache__size="64MiB", **settings)  # fmt: skip
    await exchange(service, b"GET /big HTTP/1.1\r\nHost: example.test\r\n\r\n")
    return service


async def read_slowly(
    reader: asyncio.StreamReader, length: int, pause: float, slow_for: int = 0
) -> bytes:
    """``length`` body bytes after a head, a read at a time: the first ``slow_for`` reads
    ``pause`` seconds apart, the rest at once."""
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    body, reads = b"", 0
    while len(body) < length:
        chunk = await asyncio.wait_for(reader.read(length - len(body)), 5)
        if not chunk:
            break
        body += chunk
        reads += 1
        if reads <= slow_for:
            await asyncio.sleep(pause)
    return body


async def test_the_idle_timeout_counts_from_the_end_of_a_large_hits_body(origin, start_proxy):
    """A body drained for longer than the idle timeout leaves the client the whole timeout
    after it (before: the timeout counted from its last check during the drain, and closed
    the connection just after the answer ended)."""
    service = await large_stored(origin, start_proxy, server__idle_timeout="500ms")
    # A small receive buffer: the kernel cannot take the body's rest while the client reads
    # slowly (loopback's own grows to megabytes, more so on a busy machine), so its sending
    # ends only as the client reads it.
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    client.connect(service.proxy_address)
    client.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=client)
    try:
        writer.write(b"GET /big HTTP/1.1\r\nHost: example.test\r\n\r\n")
        # Over 1 s of sending, then the rest read at once: the body ends just before that.
        assert await read_slowly(reader, len(LARGE), pause=0.15, slow_for=8) == LARGE
        await asyncio.sleep(0.3)
        writer.write(HIT.replace(b"/hit", b"/big"))
        assert await read_slowly(reader, len(LARGE), pause=0) == LARGE
    finally:
        writer.close()


async def test_a_shutdown_that_gives_up_a_large_hits_body_logs_no_error(origin, start_proxy):
    """A graceful shutdown whose wait ends while a hit's body is still going out (the client
    reads nothing) closes the connection, and nothing fails when the transport drains after
    (before: ``resume_writing`` found the body's rest gone and raised)."""
    errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    service = await large_stored(origin, start_proxy, server__drain_timeout="300ms")
    reader, writer = await connect(service)
    try:
        writer.write(b"GET /big HTTP/1.1\r\nHost: example.test\r\n\r\n")
        server = service.proxy_runner.server
        await until(lambda: any(front.state is State.SENDING for front in server.fronts))
        await asyncio.wait_for(service.proxy_runner.cleanup(), 5)
        while await asyncio.wait_for(reader.read(1 << 20), 5):
            pass  # what the transport held: then the end of the connection
    finally:
        writer.close()
    assert not errors, errors


async def test_a_large_hits_log_line_counts_to_its_last_byte_or_to_the_clients_leaving(
    origin, start_proxy, tmp_path
):
    """A hit past PIECE sent as the client reads: its line is written when the body's last
    byte is handed over (its duration the whole answer's), or when the client leaves first
    (the bytes handed over until then), as aiohttp's handler logs its answers."""
    log = tmp_path / "access.log"
    service = await large_stored(origin, start_proxy, server__access_log=True,
                                 server__access_log_file=str(log),
                                 server__access_log_format="json")  # fmt: skip
    request = b"GET /big HTTP/1.1\r\nHost: example.test\r\n\r\n"

    def small_buffer() -> socket.socket:
        # The kernel cannot take the body's rest until the client reads it (loopback's own
        # buffer grows to megabytes).
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        client.connect(service.proxy_address)
        client.setblocking(False)
        return client

    reader, writer = await asyncio.open_connection(sock=small_buffer())
    try:
        writer.write(request)
        assert await read_slowly(reader, len(LARGE), pause=0.1, slow_for=5) == LARGE
    finally:
        writer.close()
    reader, writer = await asyncio.open_connection(sock=small_buffer())
    writer.write(request)
    await asyncio.wait_for(reader.readexactly(100 << 10), 5)
    writer.transport.abort()  # the client leaves with most of the body unsent

    def lines() -> list[dict]:
        service.access_file.flush()
        return [json.loads(line) for line in log.read_text().splitlines()]

    await until(lambda: len(lines()) == 3)  # storing it, then the two hits
    whole, left = lines()[1:]
    assert whole["cache_status"].startswith("onehit; hit") and whole["target"] == "/big"
    assert whole["bytes"] > len(LARGE) and whole["duration_us"] > 400_000
    assert left["cache_status"].startswith("onehit; hit")
    assert 100 << 10 <= left["bytes"] < len(LARGE)  # what the transport took, not all
    # The first rendered the stored head (answered as parsed, logged by ``_log_parsed``),
    # the second was read from its bytes (logged by ``LogLines.hit``): both lines ended late.
    assert service.proxy.plain_hits.answered == 1 and service.proxy.fast_hits == 2


async def _trickle(writer: asyncio.StreamWriter, data: bytes, size: int) -> None:
    """``data`` written ``size`` bytes at a time, each arriving on its own."""
    for at in range(0, len(data), size):
        writer.write(data[at : at + size])
        await writer.drain()
        await asyncio.sleep(0.001)


async def test_a_head_sent_a_few_bytes_at_a_time_is_read_once_it_can_end(origin, start_proxy):
    """A head in part that grows without an empty line or a bare LF is not read again at each
    piece (it was read whole each time: quadratic in its length), and is answered once it
    ends; a bare LF sent in pieces still goes to aiohttp's parser, which refuses it."""
    service = await start_proxy()
    await stored(service)
    await exchange(service, HIT)  # the head rendered: the next hits are read from bytes
    server = service.proxy_runner.server
    answer_bytes, asked = server.answer_bytes, []

    def counted(data, start):
        asked.append(len(data) - start)
        return answer_bytes(data, start)

    server.answer_bytes = counted
    request = HIT.replace(b"\r\n\r\n", b"\r\nX-Long: " + b"v" * 6000 + b"\r\n\r\n")
    reader, writer = await connect(service)
    try:
        await _trickle(writer, request, 50)
        status, fields, _ = await read_response(reader)
        assert status == 200 and ("x-cache", "HIT") in fields
    finally:
        writer.close()
    assert len(asked) <= 3 and asked[-1] == len(request)  # not one read per piece (122)
    reader, writer = await connect(service)
    try:
        await _trickle(writer, b"GET /hit HTTP/1.1\n", 3)  # refused at its LF
        status, _, _ = await read_response(reader)
        assert status == 400
    finally:
        writer.close()
