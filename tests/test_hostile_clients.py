"""Hostile or careless clients: none can starve the proxy, grow its memory past what is
configured, or be served a response built for someone else. Real sockets, raw bytes where a
client library would normalise them."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc

import aiohttp
import pytest
from aiohttp import web
from conftest import admin, answers_on_every_way, base, fetch_as_client, raw, until

from proxy.config.logs import HTTP_ERRORS, OneLineEvery
from proxy.config.settings import load
from proxy.core.events import RequestMeta
from proxy.core.responses import response_meta
from proxy.ops.service import build_engine


async def fetch(client, url, **kwargs):
    async with client.get(url, **kwargs) as r:
        return r.status, r.headers.copy(), await r.read()


# Availability


async def test_600_stalled_uploads_hold_no_origin_connection_and_other_misses_are_served(
    origin, start_proxy, client
):
    proxy = await start_proxy(upstream__max_connections=16, server__body_timeout="30s")
    host, port = proxy.proxy_address
    stalled = []
    for _ in range(600):
        _, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /p HTTP/1.1\r\nHost: a.example\r\nContent-Length: 10\r\n\r\n")
        stalled.append(writer)
    await asyncio.gather(*(w.drain() for w in stalled))
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(fetch(client, base(proxy) + f"/m{i}") for i in range(50))), 10
        )
        assert [status for status, _, _ in results] == [200] * 50
        assert origin.hits["/p"] == 0, "no stalled upload reached the origin"
    finally:
        for writer in stalled:
            writer.close()


async def read_all(reader: asyncio.StreamReader, pause: float = 0.0) -> int:
    """Bytes read until the connection ends (closed or reset), ``pause`` seconds between reads
    of at most 1 MiB."""
    received = 0
    try:
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
            received += len(chunk)
            await asyncio.sleep(pause)
    except ConnectionError:
        pass
    return received


# Larger than the kernel's socket buffers take on loopback (4 MiB at most), so that the proxy
# holds what the client does not read.
LARGE = b"\x5a" * (16 << 20)


async def stored_large(origin, start_proxy, send_timeout: str) -> tuple[object, bytes]:
    """A proxy holding ``LARGE`` at /big, and the request for it."""
    origin.set("/big", body=LARGE, headers={"Cache-Control": "max-age=600"})
    proxy = await start_proxy(
        admission__policy="always",
        server__send_timeout=send_timeout,
        cache__max_object_size="32MiB",
    )
    host, port = proxy.proxy_address
    request = f"GET /big HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request.encode())
    assert await read_all(reader) > len(LARGE)  # stored
    writer.close()
    return proxy, request.encode()


@pytest.mark.parametrize("way", ["keep-alive", "close"])
async def test_a_client_that_takes_no_bytes_for_send_timeout_is_closed(origin, start_proxy, way):
    proxy, request = await stored_large(origin, start_proxy, "300ms")
    reader, writer = await asyncio.open_connection(*proxy.proxy_address)
    writer.write(request.replace(b"close", way.encode()))
    await asyncio.sleep(1.5)  # reads nothing for five send timeouts
    assert await read_all(reader) < len(LARGE), "closed before its answer was whole"
    writer.close()


async def test_a_slow_reader_that_takes_some_bytes_in_each_send_timeout_gets_its_answer(
    origin, start_proxy
):
    # About 10 MiB/s, with several MiB in the kernel's buffers between the two: the proxy's
    # writes may wait a few hundred milliseconds for room while the client reads.
    proxy, request = await stored_large(origin, start_proxy, "2s")
    reader, writer = await asyncio.open_connection(*proxy.proxy_address)
    writer.write(request)
    assert await read_all(reader, pause=0.02) > len(LARGE)
    writer.close()


async def test_a_request_body_that_stops_arriving_gets_408(origin, start_proxy):
    proxy = await start_proxy(server__body_timeout="300ms")
    request = b"POST /p HTTP/1.1\r\nHost: a.example\r\nContent-Length: 10\r\n\r\nhalf"
    answer = await raw(proxy, request)
    assert answer.startswith(b"HTTP/1.1 408") and origin.hits["/p"] == 0


@pytest.mark.parametrize("body_with_head", [False, True], ids=["head-alone", "head-and-body"])
async def test_a_client_that_leaves_during_a_miss_is_logged_as_gone_not_as_an_error(
    origin, start_proxy, caplog, body_with_head
):
    answered = asyncio.Event()

    async def slow(request):
        await asyncio.sleep(0.3)  # the client has gone by now
        response = web.StreamResponse(headers={"Cache-Control": "max-age=60"})
        response.content_length = 5
        await response.prepare(request)
        try:
            if not body_with_head:
                await asyncio.sleep(0.1)  # the head reaches the proxy alone
            await response.write(b"hello")
        except ConnectionError:
            pass  # the proxy, whose client left, may have closed this fetch
        finally:
            answered.set()
        return response

    origin.responder = slow
    proxy = await start_proxy()
    with caplog.at_level(logging.INFO, logger="onehit.proxy"):
        _, writer = await asyncio.open_connection(*proxy.proxy_address)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: a.example\r\n\r\n")
        await writer.drain()
        writer.close()
        await asyncio.wait_for(answered.wait(), 5)
        await until(lambda: not proxy.proxy.flights)  # the proxy is done with the miss
    ours = [r for r in caplog.records if r.name.startswith("onehit")]
    assert not [r for r in ours if r.levelno >= logging.WARNING], caplog.text
    if not body_with_head:
        assert "GET /slow: the client left before its answer" in caplog.text
    assert await raw(proxy, b"GET /slow HTTP/1.1\r\nHost: a.example\r\n\r\n")


async def test_rfc9110_10_1_1_expect_100_continue_is_answered_by_the_proxy(origin, start_proxy):
    async def reads_the_body_first(request):
        body = await request.read()
        return web.Response(body=b"got " + body)

    origin.responder = reads_the_body_first
    proxy = await start_proxy()
    host, port = proxy.proxy_address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /e HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n"
                 b"Expect: 100-continue\r\n\r\n")  # fmt: skip
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    writer.write(b"hello")
    answer = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"got hello")
    assert "Expect" not in origin.seen_headers["/e"]


async def test_a_body_larger_than_the_buffer_streams_through_byte_for_byte(
    origin, start_proxy, client
):
    async def echo_length(request):
        body = await request.read()
        return web.Response(text=f"{len(body)} {body[:4].hex()} {body[-4:].hex()}")

    origin.responder = echo_length
    proxy = await start_proxy(server__body_buffer_size="16KiB")
    payload = bytes(range(256)) * 4096  # 1 MiB
    async with client.put(base(proxy) + "/big", data=payload) as r:
        assert r.status == 200 and await r.text() == "1048576 00010203 fcfdfeff"


# Nobody is served another's response


async def test_rfc3986_3_2_2_invalid_hosts_are_refused_with_400(origin, start_proxy):
    proxy = await start_proxy()
    for host in (b"\xe2\x84\xaa.example", b"a/b.example", b"user@a.example", b"::1", b""):
        answer = await raw(proxy, b"GET /x HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400"), host
    assert origin.hits["/x"] == 0


async def test_the_origin_gets_the_host_the_key_was_made_from(origin, start_proxy, client):
    origin.set("/c", headers={"Cache-Control": "max-age=60"})
    proxy = await start_proxy(admission__policy="always")
    await fetch(client, base(proxy) + "/c", headers={"Host": "T.EXAMPLE:80"})
    assert origin.seen_headers["/c"]["X-Forwarded-Host"] == "t.example"
    _, headers, _ = await fetch(client, base(proxy) + "/c", headers={"Host": "t.example"})
    assert headers["X-Cache"] == "HIT"


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_rfc9110_7_6_1_a_clients_connection_cannot_name_away_the_fields_the_proxy_adds(
    origin, start_proxy, method
):
    proxy = await start_proxy()
    named = b"X-Forwarded-For, Via, X-Forwarded-Host, X-Forwarded-Proto, X-Secret"
    answer = await raw(
        proxy,
        b"%s /conn HTTP/1.1\r\nHost: a.example\r\nConnection: %s\r\nX-Secret: 1\r\n"
        b"Content-Length: 0\r\n\r\n" % (method.encode(), named),
    )
    assert answer.startswith(b"HTTP/1.1 200")
    seen = origin.seen_headers["/conn"]
    assert seen["X-Forwarded-For"] == "127.0.0.1" and seen["Via"] == "1.1 onehit"
    assert seen["X-Forwarded-Host"] == "a.example" and seen["X-Forwarded-Proto"] == "http"
    assert "X-Secret" not in seen, "the client's own fields it names are still hop-by-hop"


async def test_an_ipv6_absolute_form_target_is_refused_like_any_unrouted_host(origin, start_proxy):
    proxy = await start_proxy()  # with a default origin
    answer = await raw(proxy, b"GET http://[::1]:8080/x HTTP/1.1\r\nHost: a.example\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 421") and origin.hits["/x"] == 0


async def test_rfc9111_4_1_variants_are_selected_on_the_forwarding_fields_the_origin_got(
    origin, start_proxy
):
    async def per_client(request):
        return web.Response(
            text=f"for {request.headers['X-Forwarded-For']}",
            headers={"Cache-Control": "max-age=60", "Vary": "X-Forwarded-For"},
        )

    origin.responder = per_client
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/mine"
    bodies = []
    for address in ("127.0.0.1", "127.0.0.2", "127.0.0.1"):
        connector = aiohttp.TCPConnector(local_addr=(address, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            _, _, body = await fetch(session, url)
            bodies.append(body)
    assert bodies == [b"for 127.0.0.1", b"for 127.0.0.2", b"for 127.0.0.1"]
    assert origin.hits["/mine"] == 2


async def test_a_request_with_a_cookie_is_neither_served_from_cache_nor_stored(
    origin, start_proxy, client
):
    async def personal(request):
        who = request.cookies.get("session", "nobody")
        return web.Response(text=f"hello {who}", headers={"Cache-Control": "max-age=60"})

    origin.responder = personal
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/home"
    await fetch(client, url)  # stored for everyone: no cookie
    _, headers, body = await fetch(client, url, headers={"Cookie": "session=alice"})
    assert body == b"hello alice" and headers["Cache-Status"] == "onehit; fwd=bypass; detail=cookie"
    _, headers, body = await fetch(client, url, headers={"Cookie": "session=alice"})
    assert body == b"hello alice" and headers["X-Cache"] == "MISS"
    _, headers, body = await fetch(client, url)
    assert body == b"hello nobody" and headers["X-Cache"] == "HIT"
    # Analytics cookies do not make a request private.
    _, headers, body = await fetch(client, url, headers={"Cookie": "_ga=GA1.1; _gid=x"})
    assert body == b"hello nobody" and headers["X-Cache"] == "HIT"


async def test_a_cookie_request_uses_what_is_meant_for_shared_caches(origin, start_proxy, client):
    origin.set("/pub", headers={"Cache-Control": "public, max-age=60"}, body=b"for all")
    proxy = await start_proxy(admission__policy="always")
    cookie = {"Cookie": "session=bob"}
    _, first, _ = await fetch(client, base(proxy) + "/pub", headers=cookie)
    _, second, body = await fetch(client, base(proxy) + "/pub", headers=cookie)
    assert first["Cache-Status"].endswith("stored") and second["X-Cache"] == "HIT"
    assert body == b"for all" and origin.hits["/pub"] == 1


async def test_a_stored_response_never_replays_a_set_cookie(origin, start_proxy, client):
    origin.set("/sc", headers={"Cache-Control": "max-age=60", "Set-Cookie": "id=alice"})
    proxy = await start_proxy(admission__policy="always", cache__store_set_cookie=True)
    _, alice, _ = await fetch(client, base(proxy) + "/sc")
    async with aiohttp.ClientSession() as bob:
        _, headers, _ = await fetch(bob, base(proxy) + "/sc")
    assert alice["Set-Cookie"] == "id=alice"
    assert headers["X-Cache"] == "HIT" and "Set-Cookie" not in headers


# Odd values get an answer, never a 500


@pytest.mark.parametrize(
    "extra",
    [
        b"Range: bytes=\xc2\xb2-\r\n",
        b"Range: bytes=0-" + b"9" * 5000 + b"\r\n",
        b"Range: bytes=" + b"9" * 5000 + b"-\r\n",
        b"Cache-Control: max-age=" + b"9" * 5000 + b"\r\n",
        b"Cache-Control: min-fresh=" + b"9" * 5000 + b"\r\n",
    ],
    ids=["superscript-two", "huge-last", "huge-first", "huge-max-age", "huge-min-fresh"],
)
async def test_rfc9110_odd_numbers_in_a_request_are_ignored_or_refused_never_a_500(
    origin, start_proxy, extra
):
    proxy = await start_proxy(admission__policy="always")
    await raw(proxy, b"GET /n HTTP/1.1\r\nHost: a.example\r\n\r\n")
    for way, head in (await answers_on_every_way(proxy, b"/n", extra)).items():
        assert head[9:12] in (b"200", b"206", b"416"), (way, head)
    assert proxy.proxy.engine.counters.requests > 3


async def test_rfc9111_4_1_a_latin1_value_under_vary_gets_its_variant_and_breaks_no_other(
    origin, start_proxy
):
    origin.set("/v", headers={"Cache-Control": "max-age=60", "Vary": "User-Agent"})
    proxy = await start_proxy(admission__policy="always")
    for agent in (b"caf\xe9", b"plain", b"caf\xe9", b"plain"):
        answer = await raw(
            proxy, b"GET /v HTTP/1.1\r\nHost: a.example\r\nUser-Agent: %s\r\n\r\n" % agent
        )
        assert answer.startswith(b"HTTP/1.1 200"), answer
    assert origin.hits["/v"] == 2, "each agent's variant stored once, then hit"


# Memory is bounded by configuration


@pytest.mark.slow
def test_long_keys_and_many_variants_stay_within_the_cache_size():
    settings = {"upstream.origin": "http://127.0.0.1:1", "cache.size": "4MiB",
                "cache.max_object_size": "1MiB", "admission.policy": "always"}  # fmt: skip
    config = load(env={}, overrides=settings)
    engine = build_engine(config)
    body = b"b" * 100
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(6_000):  # 8 KB URLs (48 MB of keys), each varying on Accept-Encoding
            request = RequestMeta(f"http://a.example/{i:05d}" + "u" * 8000, "GET",
                                  (("Accept-Encoding", "gzip"),))  # fmt: skip
            meta = response_meta(request, 200, [("Cache-Control", "max-age=60"),
                                                ("Vary", "Accept-Encoding")], 0.0, 0.0)  # fmt: skip
            engine.on_response(request, meta, len(body), 0.0)
        for i in range(6_000):  # one URL, 6,000 User-Agents of 30 KB (180 MB)
            agent = f"{i:05d}" + "a" * 30_000
            request = RequestMeta("http://a.example/one", "GET", (("User-Agent", agent),))
            meta = response_meta(request, 200, [("Cache-Control", "max-age=60"),
                                                ("Vary", "User-Agent")], 0.0, 0.0)  # fmt: skip
            engine.on_response(request, meta, len(body), 0.0)
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stats = engine.stats()
    assert stats["bytes_used"] <= 4 << 20
    assert stats["too_many_variants"] == 6_000 - config.cache.max_variants
    assert engine.variants.size() <= stats["entries"]
    print(f"traced memory grew {growth / (1 << 20):.1f} MiB for a 4 MiB cache")
    assert growth < (4 << 20) + (2 << 20), f"grew {growth >> 20} MiB for a 4 MiB cache"


# Smaller items


async def test_rfc9110_refusals_as_nginx_makes_them(origin, start_proxy):
    proxy = await start_proxy()
    head = b"Host: a.example\r\n"
    cases = {
        b"GET /x HTTP/2.0\r\n" + head + b"\r\n": b"HTTP/1.1 505",
        b"GET /x\r\n\r\n": b"HTTP/1.1 505",
        b"TRACE /x HTTP/1.1\r\n" + head + b"\r\n": b"HTTP/1.1 405",
        b"POST /x HTTP/1.1\r\n" + head + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n": (
            b"HTTP/1.1 501"
        ),
    }
    for request, status in cases.items():
        assert (await raw(proxy, request)).startswith(status), request
    assert origin.hits["/x"] == 0


async def test_rfc9110_10_2_4_errors_and_the_admin_listener_never_name_python_or_aiohttp(
    origin, start_proxy, client
):
    proxy = await start_proxy()
    answers = [
        await raw(proxy, b"GET http://elsewhere.example/x HTTP/1.1\r\nHost: a\r\n\r\n"),
        await raw(proxy, b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
                         b"Content-Length: 2\r\n\r\n"),
        await raw(proxy, b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n"),
    ]  # fmt: skip
    assert [a[9:12] for a in answers] == [b"421", b"400", b"405"]
    for answer in answers:
        assert b"\r\nserver:" not in answer.partition(b"\r\n\r\n")[0].lower(), answer
    for path in ("/stats", "/metrics", "/nowhere"):
        async with client.get(admin(proxy) + path) as r:
            assert r.headers["Server"] == "onehit", path


async def test_an_unreachable_origin_is_not_named_to_the_client(origin, start_proxy, client):
    proxy = await start_proxy()
    await origin.stop()
    status, _, body = await fetch(client, base(proxy) + "/gone")
    await origin.start()
    assert status == 502 and body == b"origin unreachable\n"


async def test_admin_posts_must_be_json_and_name_the_admin_host(start_proxy, client):
    proxy = await start_proxy()
    async with client.post(admin(proxy) + "/filter/reset", data=b"x=1") as r:
        assert r.status == 415  # a cross-site form cannot send JSON
    rebound = {"Host": "attacker.example"}
    async with client.get(admin(proxy) + "/stats", headers=rebound) as r:
        assert r.status == 403  # DNS rebinding: the page's own name, not the listener's
    async with client.get(admin(proxy) + "/healthz", headers=rebound) as r:
        assert r.status == 200
    async with client.post(admin(proxy) + "/filter/reset", json={}) as r:
        assert r.status == 200


async def test_malformed_requests_log_one_line_at_most_each_second(
    origin, start_proxy, caplog, monkeypatch
):
    # The limit is the process's: a fresh one, whatever an earlier test logged this second.
    monkeypatch.setattr(HTTP_ERRORS, "filters", [OneLineEvery()])
    proxy = await start_proxy()
    caplog.set_level(logging.INFO, logger="onehit.http")
    for _ in range(5):
        await raw(
            proxy, b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
        )
    lines = [r for r in caplog.records if r.name == "onehit.http"]
    assert len(lines) == 1 and lines[0].exc_info is None and "\n" not in lines[0].getMessage()


async def test_large_uploads_that_stall_cannot_take_every_origin_connection(
    origin, start_proxy, client
):
    async def reads_the_body(request):
        return web.Response(text=str(len(await request.read())))

    origin.responder = reads_the_body
    proxy = await start_proxy(server__body_buffer_size="1KiB", server__max_streamed_uploads=2,
                              upstream__max_connections=4)  # fmt: skip
    host, port = proxy.proxy_address
    writers = []
    for _ in range(2):  # past the buffer, then silence: each holds an origin connection
        _, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /up HTTP/1.1\r\nHost: a.example\r\nContent-Length: 100000\r\n\r\n"
                     + b"x" * 4096)  # fmt: skip
        writers.append(writer)
    await until(lambda: proxy.proxy.uploads.streamed_uploads == 2)  # both hold a connection
    third = b"POST /up HTTP/1.1\r\nHost: a.example\r\nContent-Length: 100000\r\n\r\n" + b"x" * 4096
    assert (await raw(proxy, third)).startswith(b"HTTP/1.1 503")
    results = await asyncio.gather(*(fetch(client, base(proxy) + f"/m{i}") for i in range(10)))
    assert [status for status, _, _ in results] == [200] * 10
    for writer in writers:
        writer.close()


async def test_a_hixie76_websocket_handshake_is_refused_on_every_way_as_aiohttp_refuses_it(
    origin, start_proxy
):
    proxy = await start_proxy(admission__policy="always")
    await raw(proxy, b"GET /w HTTP/1.1\r\nHost: a.example\r\n\r\n")  # stored
    heads = await answers_on_every_way(
        proxy, b"/w", b"Sec-WebSocket-Key1: 4 @1  46546xW%0l 1 5\r\n"
    )
    assert {way: head[9:12] for way, head in heads.items()} == dict.fromkeys(heads, b"400")


async def test_rfc9111_4_1_variants_on_disk_are_capped_as_in_memory(origin, start_proxy, tmp_path):
    """A client that sends a new User-Agent each time, on a URL that varies on it, leaves at
    most ``[cache] max_variants`` of its variants findable on disk, as in memory: the one past
    them starts the URL's variants afresh (the last ones stay)."""
    origin.set("/v", headers={"Cache-Control": "max-age=600", "Vary": "User-Agent"})
    settings = {"admission__policy": "always", "cache__max_variants": 4,
                "disk__path": str(tmp_path), "disk__size": "4MiB",
                "disk__region_size": "1MiB", "disk__policy": "always"}  # fmt: skip
    agents = [f"agent-{i}" for i in range(20)]
    proxy = await start_proxy(**settings)
    for agent in agents:
        await fetch_as_client(proxy, "/v", **{"User-Agent": agent})
    await proxy.stop()
    again = await start_proxy(**settings)  # memory empty: what the disk finds
    found = []
    for agent in reversed(agents):  # the last first: a miss among them would be written
        _, headers, _ = await fetch_as_client(again, "/v", **{"User-Agent": agent})
        if "detail=disk" in headers["Cache-Status"]:
            found.append(agent)
    assert found == agents[:-5:-1]
