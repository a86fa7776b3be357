"""The miss path over real sockets: whole-object fetches that answer what clients really send,
streaming, single flight, hit-for-miss and upstream connections. Tests name the RFC section or
the behaviour they pin."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from aiohttp import web
from conftest import base, raw, read_request, until

BODY = bytes(range(256)) * 40  # 10,240 bytes


def stalls_after_one_body(release: asyncio.Event):
    """An origin handler that sends BODY, waits for ``release``, then sends BODY again."""

    async def handler(request):
        response = web.StreamResponse(headers={"Cache-Control": "max-age=60"})
        response.content_length = 2 * len(BODY)
        await response.prepare(request)
        await response.write(BODY)
        await release.wait()
        await response.write(BODY)
        return response

    return handler


async def fetch(client, url, **kwargs):
    async with client.get(url, **kwargs) as r:
        return r.status, r.headers.copy(), await r.read()


async def test_rfc9110_13_1_conditional_misses_fetch_the_whole_object_and_are_cached(
    origin, start_proxy, client
):
    origin.set("/c", headers={"Cache-Control": "max-age=60", "ETag": '"c1"'}, body=BODY)
    proxy = await start_proxy()
    url = base(proxy) + "/c"
    answers = [await fetch(client, url, headers={"If-None-Match": '"c1"'}) for _ in range(5)]
    assert [status for status, _, _ in answers] == [304] * 5
    assert all(body == b"" and h["ETag"] == '"c1"' for _, h, body in answers)
    assert "If-None-Match" not in origin.seen_headers["/c"]
    assert answers[0][1]["Cache-Status"] == "onehit; fwd=uri-miss; detail=first-sighting"
    assert answers[1][1]["Cache-Status"] == "onehit; fwd=uri-miss; stored"
    assert [h["X-Cache"] for _, h, _ in answers[2:]] == ["HIT"] * 3
    assert origin.hits["/c"] == 2
    stats = proxy.proxy.engine.stats()
    assert stats["not_modified_answers"] == 5 and stats["admissions"] == 1
    status, _, body = await fetch(client, url, headers={"If-None-Match": '"c0"'})
    assert (status, body) == (200, BODY)


async def test_rfc9110_14_range_misses_fetch_the_whole_object_and_are_cached(
    origin, start_proxy, client
):
    origin.set("/v.mp4", headers={"Cache-Control": "max-age=60"}, body=BODY)
    proxy = await start_proxy()
    url = base(proxy) + "/v.mp4"
    for _ in range(5):
        status, headers, body = await fetch(client, url, headers={"Range": "bytes=100-199"})
        assert (status, body) == (206, BODY[100:200])
        assert headers["Content-Range"] == f"bytes 100-199/{len(BODY)}"
    assert "Range" not in origin.seen_headers["/v.mp4"] and origin.hits["/v.mp4"] == 2
    status, headers, _ = await fetch(client, url, headers={"Range": f"bytes={len(BODY)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(BODY)}"
    assert proxy.proxy.engine.stats()["range_answers"] == 6


async def test_rfc9110_14_a_range_miss_answers_from_the_first_bytes_without_waiting_for_the_rest(
    origin, start_proxy, client
):
    release = asyncio.Event()
    origin.responder = stalls_after_one_body(release)
    proxy = await start_proxy()  # second hit: a first sighting keeps nothing
    status, _, body = await asyncio.wait_for(
        fetch(client, base(proxy) + "/r", headers={"Range": "bytes=0-99"}), 5
    )
    release.set()
    assert (status, body) == (206, BODY[:100])


@pytest.mark.parametrize(
    ("behaviour", "asked"),
    [
        ({"headers": {"Cache-Control": "no-store"}}, {"Range": "bytes=0-9"}),
        ({"headers": {"Cache-Control": "max-age=60"}, "body": BODY * 10}, {"Range": "bytes=0-9"}),
        ({"headers": {"Cache-Control": "no-store", "ETag": '"n"'}}, {"If-None-Match": '"n"'}),
    ],
    ids=["no-store", "too-large", "no-store-conditional"],
)
async def test_what_cannot_be_stored_passes_the_clients_own_fields_to_the_origin(
    origin, start_proxy, client, behaviour, asked
):
    async def honours_range(request):
        headers = dict(behaviour["headers"])
        body = behaviour.get("body", BODY)
        if "ETag" in headers and request.headers.get("If-None-Match") == headers["ETag"]:
            return web.Response(status=304, headers=headers)
        if "Range" in request.headers:
            headers["Content-Range"] = f"bytes 0-9/{len(body)}"
            return web.Response(status=206, body=body[:10], headers=headers)
        return web.Response(body=body, headers=headers)

    origin.responder = honours_range
    proxy = await start_proxy(cache__max_object_size="64KiB")
    for _ in range(2):
        status, headers, body = await fetch(client, base(proxy) + "/n", headers=asked)
        if "Range" in asked:  # the origin's 206 and its Content-Range pass through (RFC 9110 14.4)
            assert (status, body) == (206, behaviour.get("body", BODY)[:10])
            assert headers["Content-Range"].startswith("bytes 0-9/")
        else:
            assert status == 304
        for name, value in asked.items():
            assert origin.seen_headers["/n"][name] == value
    # The first request asked for the whole object, then again with the client's fields; the
    # second went straight to the origin (hit-for-miss).
    assert origin.hits["/n"] == 3
    assert proxy.proxy.engine.stats()["hit_for_miss"] == 1


async def test_rfc9111_4_2_3_the_origins_age_reaches_the_client_on_a_miss(
    origin, start_proxy, client
):
    origin.set("/aged", headers={"Cache-Control": "max-age=600", "Age": "120"})
    proxy = await start_proxy(admission__policy="always")
    _, first, _ = await fetch(client, base(proxy) + "/aged")
    _, second, _ = await fetch(client, base(proxy) + "/aged")
    assert first["Age"] == "120" and first["X-Cache"] == "MISS"
    assert second["X-Cache"] == "HIT" and int(second["Age"]) >= 120


async def test_a_miss_streams_its_first_bytes_before_the_origin_has_sent_the_rest(
    origin, start_proxy, client
):
    release = asyncio.Event()
    origin.responder = stalls_after_one_body(release)
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/s"
    async with client.get(url) as r:
        first = await asyncio.wait_for(r.content.readexactly(len(BODY)), 5)
        assert first == BODY and r.headers["Cache-Status"] == "onehit; fwd=uri-miss; stored"
        release.set()
        assert await r.read() == BODY
    _, headers, body = await fetch(client, url)
    assert headers["X-Cache"] == "HIT" and body == BODY * 2


@pytest.mark.parametrize("asked", [{}, {"Range": "bytes=5000-5009"}], ids=["whole", "range"])
async def test_a_miss_head_reaches_the_client_before_the_origin_sends_its_body(
    origin, start_proxy, client, asked
):
    release = asyncio.Event()

    async def head_then_body(request):
        response = web.StreamResponse(headers={"Cache-Control": "max-age=60"})
        response.content_length = len(BODY)
        await response.prepare(request)
        await release.wait()
        await response.write(BODY)
        return response

    origin.responder = head_then_body
    proxy = await start_proxy(admission__policy="always")
    async with asyncio.timeout(5):
        async with client.get(base(proxy) + "/h", headers=asked) as r:
            assert r.status == (206 if asked else 200)  # the head, with no body byte sent yet
            release.set()
            assert await r.read() == (BODY[5000:5010] if asked else BODY)


async def test_single_flight_elects_one_new_leader_when_the_leader_fails(
    origin, start_proxy, client
):
    async def first_fails(request):
        if origin.hits[request.path_qs] == 1:
            # Every other request follows the leader before its fetch fails.
            await until(lambda: proxy.proxy.flights.waiting(key) == 19)
            return web.Response(status=503, body=b"busy")
        return web.Response(body=BODY, headers={"Cache-Control": "max-age=60"})

    origin.responder = first_fails
    proxy = await start_proxy()
    url = base(proxy) + "/flaky"
    key = "http://{}:{}/flaky".format(*proxy.proxy_address)
    results = await asyncio.gather(*(fetch(client, url) for _ in range(20)))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] * 19 + [503]
    assert origin.hits["/flaky"] == 2, "one new leader, not a stampede of 19"


async def test_hit_for_miss_sends_concurrent_requests_for_an_uncacheable_url_at_once(
    origin, start_proxy, client
):
    in_flight = peak = 0
    all_in = asyncio.Event()

    async def private(request):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if peak == 10:
            all_in.set()
        # Answer once all ten are here (or after a while, if they were queued one by one).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), 1.0)
        in_flight -= 1
        return web.Response(body=b"yours", headers={"Cache-Control": "private"})

    origin.responder = private
    proxy = await start_proxy()
    url = base(proxy) + "/me"
    await fetch(client, url)
    results = await asyncio.gather(*(fetch(client, url) for _ in range(10)))
    assert all(h["Cache-Status"] == "onehit; fwd=bypass; detail=private" for _, h, _ in results)
    assert peak == 10, "the requests were queued behind one another"
    assert origin.hits["/me"] == 11


async def test_followers_of_an_uncacheable_response_go_to_the_origin_at_once(
    origin, start_proxy, client
):
    origin.set("/mine", delay=0.3, headers={"Cache-Control": "private"}, body=b"mine")
    proxy = await start_proxy()
    results = await asyncio.gather(*(fetch(client, base(proxy) + "/mine") for _ in range(10)))
    assert all(status == 200 and body == b"mine" for status, _, body in results)
    assert not any("collapsed" in h["Cache-Status"] for _, h, _ in results), "never shared"
    assert origin.hits["/mine"] == 10


class DropsItsFirstConnection:
    """A raw origin that answers a connection's first request, then hangs up on its second
    (``reset``: with a TCP reset) unanswered; later connections are answered once each."""

    def __init__(self, reset: bool = False) -> None:
        self.reset = reset
        self.connections = 0

    async def __call__(self, reader, writer) -> None:
        self.connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
        await writer.drain()
        if self.connections == 1:
            await read_request(reader)  # the reused connection: read, then hang up unanswered
            if self.reset:
                writer.transport.abort()


async def test_a_request_body_survives_an_origin_that_closed_its_pooled_connection(
    raw_origin, start_proxy, client, caplog
):
    origin = DropsItsFirstConnection()
    proxy = await start_proxy(upstream__origin=await raw_origin(origin))
    async with client.post(base(proxy) + "/a", data=b"first") as r:
        assert r.status == 200
    caplog.set_level("INFO", logger="onehit.upstream")
    async with client.post(base(proxy) + "/b", data=b"payload") as r:
        assert r.status == 200 and await r.read() == b"ok"
    assert origin.connections == 2
    assert "retrying on a new one" in caplog.text


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
async def test_a_miss_on_a_pooled_connection_the_origin_dropped_is_sent_again(
    raw_origin, start_proxy, client, caplog, reset
):
    origin = DropsItsFirstConnection(reset)
    proxy = await start_proxy(upstream__origin=await raw_origin(origin))
    assert (await fetch(client, base(proxy) + "/a"))[:3:2] == (200, b"ok")
    caplog.set_level("INFO", logger="onehit.upstream")
    assert (await fetch(client, base(proxy) + "/b"))[:3:2] == (200, b"ok")
    assert origin.connections == 2
    assert "retrying on a new one" in caplog.text


async def test_upstream_failures_are_logged_with_their_cause(origin, start_proxy, client, caplog):
    proxy = await start_proxy()
    await origin.stop()
    caplog.set_level("WARNING", logger="onehit.upstream")
    status, _, _ = await fetch(client, base(proxy) + "/down")
    assert status == 502 and "origin unreachable" in caplog.text and "/down" in caplog.text
    await origin.start()


async def test_rfc5861_stale_if_error_covers_an_origin_that_resets_the_connection(
    raw_origin, start_proxy, client
):
    stored = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n"
        b"Cache-Control: max-age=0, stale-if-error=60\r\n\r\nfresh"
    )
    replies = [stored]

    async def then_resets(reader, writer):
        await read_request(reader)
        if replies:
            writer.write(replies.pop())
            await writer.drain()
        else:
            writer.transport.abort()  # RST, no response

    url = await raw_origin(then_resets)
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    assert (await fetch(client, base(proxy) + "/x"))[2] == b"fresh"
    status, headers, body = await fetch(client, base(proxy) + "/x")
    assert (status, body) == (200, b"fresh")
    assert headers["Cache-Status"] == "onehit; hit; detail=stale-if-error"


async def test_rfc9111_4_3_4_a_revalidation_answered_by_an_unstorable_response_removes_the_entry(
    origin, start_proxy, client
):
    origin.set("/rv", headers={"Cache-Control": "max-age=0"}, body=b"v1")
    proxy = await start_proxy(admission__policy="always")
    await fetch(client, base(proxy) + "/rv")
    origin.set("/rv", headers={"Cache-Control": "no-store"}, body=b"v2")
    _, headers, body = await fetch(client, base(proxy) + "/rv")
    assert body == b"v2" and headers["Cache-Status"] == "onehit; fwd=stale; detail=no-store"
    assert proxy.proxy.engine.stats()["entries"] == 0


async def test_rfc9111_5_2_1_7_only_if_cached_answers_504_on_a_stale_entry(
    origin, start_proxy, client
):
    origin.set("/oc", headers={"Cache-Control": "max-age=0"})
    proxy = await start_proxy(admission__policy="always")
    await fetch(client, base(proxy) + "/oc")
    offline = {"Cache-Control": "only-if-cached"}
    status, _, _ = await fetch(client, base(proxy) + "/oc", headers=offline)
    assert status == 504 and origin.hits["/oc"] == 1
    stale_ok = {"Cache-Control": "only-if-cached, max-stale"}
    status, headers, _ = await fetch(client, base(proxy) + "/oc", headers=stale_ok)
    assert status == 200 and headers["X-Cache"] == "STALE" and origin.hits["/oc"] == 1


async def test_the_client_of_a_cut_body_is_cut_off_too(origin, start_proxy, client):
    origin.set("/cut", body=BODY * 20, cut_after=len(BODY))
    proxy = await start_proxy()
    with pytest.raises(aiohttp.ClientPayloadError):
        await fetch(client, base(proxy) + "/cut")
    assert proxy.proxy.engine.stats()["cut_short"] == 1


async def test_idle_origin_connections_are_closed_before_the_origins_own_timeout(
    raw_origin, start_proxy, client
):
    closed = asyncio.Event()

    async def answers_then_waits(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
        await writer.drain()
        if await reader.read() == b"":  # the proxy, not this origin, ends the idle connection
            closed.set()

    url = await raw_origin(answers_then_waits)
    proxy = await start_proxy(upstream__origin=url, upstream__idle_timeout="300ms")
    assert (await fetch(client, base(proxy) + "/i"))[0] == 200
    await asyncio.wait_for(closed.wait(), 5)


async def test_a_client_that_leaves_mid_body_does_not_stop_a_response_being_stored(
    origin, start_proxy, client
):
    release = asyncio.Event()
    origin.responder = stalls_after_one_body(release)
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/left"
    async with aiohttp.ClientSession() as leaving, leaving.get(url) as r:
        assert await r.content.readexactly(len(BODY)) == BODY
    release.set()  # the client has gone; the origin sends the rest
    engine = proxy.proxy.engine
    for _ in range(100):
        if engine.stats()["entries"] == 1:
            break
        await asyncio.sleep(0.05)
    _, headers, body = await fetch(client, url)
    assert headers["X-Cache"] == "HIT" and body == BODY * 2 and origin.hits["/left"] == 1


@pytest.mark.parametrize("framing", [b"Content-Length: 2\r\n\r\nok",
                                     b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"],
                         ids=["length", "chunked"])  # fmt: skip
async def test_field_names_reach_the_client_spelled_as_the_origin_spelled_them(
    raw_origin, start_proxy, framing
):
    answer = (
        b'HTTP/1.1 200 OK\r\nETag: "v1"\r\nCONTENT-TYPE: text/plain\r\nx-origin-case: yes\r\n'
        b"cache-control: max-age=60\r\n" + framing
    )

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(answer)

    proxy = await start_proxy(upstream__origin=await raw_origin(origin))
    request = b"GET /named HTTP/1.1\r\nHost: example.test\r\n\r\n"
    answers = [await raw(proxy, request) for _ in range(3)]  # miss, stored miss, hit
    assert b"X-Cache: HIT" in answers[2]
    for got in answers:
        for line in (b'ETag: "v1"', b"CONTENT-TYPE: text/plain", b"x-origin-case: yes"):
            assert b"\r\n" + line + b"\r\n" in got
