"""The live proxy over real sockets: admission, HTTP caching rules, coalescing, faults, refusals.

Each test that pins an HTTP rule names its section (RFC 9111 unless said otherwise).
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest
from aiohttp import web
from conftest import Clock, admin, answers_on_every_way, base, raw
from multidict import CIMultiDict


async def fetch(
    client: aiohttp.ClientSession, url: str, **kwargs
) -> tuple[int, CIMultiDict, bytes]:
    async with client.get(url, **kwargs) as r:
        return r.status, r.headers.copy(), await r.read()


async def test_first_request_is_a_first_sighting_second_stored_third_hit_with_age(
    origin, start_proxy, client
):
    clock = Clock()
    proxy = await start_proxy(clock=clock)
    url = base(proxy) + "/a"
    s1, h1, b1 = await fetch(client, url)
    s2, h2, _ = await fetch(client, url)
    clock.now += 1.05
    s3, h3, b3 = await fetch(client, url)
    assert (s1, s2, s3) == (200, 200, 200) and b1 == b3 == b"hello from the origin"
    assert h1["Cache-Status"] == "onehit; fwd=uri-miss; detail=first-sighting"
    assert h1["X-Cache"] == "MISS" and "Age" not in h1
    assert h2["Cache-Status"] == "onehit; fwd=uri-miss; stored"
    assert h3["X-Cache"] == "HIT" and h3["Cache-Status"].startswith("onehit; hit")
    assert int(h3["Age"]) >= 1
    assert origin.hits["/a"] == 2


async def test_always_admission_stores_on_the_first_request(origin, start_proxy, client):
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/a"
    _, h1, _ = await fetch(client, url)
    _, h2, _ = await fetch(client, url)
    assert h1["Cache-Status"] == "onehit; fwd=uri-miss; stored" and h2["X-Cache"] == "HIT"
    assert origin.hits["/a"] == 1


@pytest.mark.parametrize(
    ("response_headers", "request_headers", "detail"),
    [
        ({"Cache-Control": "no-store"}, {}, "no-store"),  # 5.2.2.5
        ({"Cache-Control": "private, max-age=60"}, {}, "private"),  # 5.2.2.7
        ({"Cache-Control": "max-age=60", "Set-Cookie": "s=1"}, {}, "set-cookie"),
        ({"Cache-Control": "max-age=60"}, {"Authorization": "Bearer t"}, "authorization"),  # 3.5
        ({"Cache-Control": "max-age=60", "Vary": "*"}, {}, "vary-star"),  # 4.1
    ],
)
async def test_rfc9111_3_responses_a_shared_cache_must_not_store(
    origin, start_proxy, client, response_headers, request_headers, detail
):
    origin.set("/u", headers=response_headers)
    proxy = await start_proxy(admission__policy="always")
    # Then hit-for-miss: straight to the origin, unless the request alone made it uncacheable.
    later = "uri-miss" if request_headers else "bypass"
    for fwd in ("uri-miss", later, later):
        _, headers, _ = await fetch(client, base(proxy) + "/u", headers=request_headers)
        assert headers["Cache-Status"] == f"onehit; fwd={fwd}; detail={detail}"
    assert origin.hits["/u"] == 3


async def test_rfc9111_3_5_authorization_allowed_with_public(origin, start_proxy, client):
    origin.set("/p", headers={"Cache-Control": "public, max-age=60"})
    proxy = await start_proxy(admission__policy="always")
    auth = {"Authorization": "Bearer t"}
    await fetch(client, base(proxy) + "/p", headers=auth)
    _, headers, _ = await fetch(client, base(proxy) + "/p", headers=auth)
    assert headers["X-Cache"] == "HIT"


async def test_rfc9111_4_1_vary_keeps_one_variant_per_header_value(origin, start_proxy, client):
    origin.set("/v", headers={"Cache-Control": "max-age=60", "Vary": "Accept-Language"})
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/v"
    en, fr = {"Accept-Language": "en"}, {"Accept-Language": "fr"}
    assert (await fetch(client, url, headers=en))[1]["X-Cache"] == "MISS"
    assert (await fetch(client, url, headers=fr))[1]["X-Cache"] == "MISS"
    assert (await fetch(client, url, headers=en))[1]["X-Cache"] == "HIT"
    assert (await fetch(client, url, headers=fr))[1]["X-Cache"] == "HIT"
    assert origin.hits["/v"] == 2


async def test_rfc9111_4_3_revalidation_with_304_updates_stored_headers(
    origin, start_proxy, client
):
    origin.set(
        "/r",
        headers={"Cache-Control": "max-age=0", "ETag": '"v1"', "X-Version": "1"},
        not_modified_etag='"v1"',
        headers_304={"Cache-Control": "max-age=60", "X-Version": "2"},
    )
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/r"
    _, h1, b1 = await fetch(client, url)
    _, h2, b2 = await fetch(client, url)
    _, h3, b3 = await fetch(client, url)
    assert h1["X-Version"] == "1" and b1 == b2 == b3
    assert origin.seen_headers["/r"]["If-None-Match"] == '"v1"'
    assert h2["Cache-Status"] == "onehit; fwd=stale; fwd-status=304" and h2["X-Version"] == "2"
    assert h3["X-Cache"] == "HIT" and h3["Cache-Control"] == "max-age=60"
    assert origin.hits["/r"] == 2


async def test_rfc5861_stale_if_error_serves_the_stored_response(origin, start_proxy, client):
    origin.set("/e", headers={"Cache-Control": "max-age=0, stale-if-error=60"})
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/e"
    await fetch(client, url)
    origin.set("/e", status=503, body=b"down", headers={})
    status, headers, body = await fetch(client, url)
    assert status == 200 and body == b"hello from the origin"
    assert headers["Cache-Status"] == "onehit; hit; detail=stale-if-error"


@pytest.mark.parametrize(
    ("cache_control", "served"),
    [("max-age=1", True), ("max-age=1, must-revalidate", False)],
)
async def test_grace_serves_a_stale_response_while_the_origin_fails_and_says_so(
    origin, start_proxy, client, cache_control, served
):
    """[cache] grace (as Varnish's): past what the response allows, within grace, while the
    origin fails; never past must-revalidate (RFC 9111 section 5.2.2.2)."""
    now = [1000.0]
    origin.set("/g", headers={"Cache-Control": cache_control})
    proxy = await start_proxy(clock=lambda: now[0], admission__policy="always",
                              cache__grace="60s")  # fmt: skip
    url = base(proxy) + "/g"
    await fetch(client, url)
    now[0] += 30  # stale for 29 s: within grace
    origin.set("/g", status=503, body=b"down", headers={})
    status, headers, body = await fetch(client, url)
    if not served:
        assert status == 503 and body == b"down"
        return
    assert (status, body) == (200, b"hello from the origin")
    assert headers["Cache-Status"] == "onehit; hit; detail=grace"
    await origin.stop()  # unreachable, not only failing
    assert (await fetch(client, url))[0] == 200
    counters = proxy.proxy.engine.counters
    assert counters.served_in_grace == 2 and counters.stale_served == 2
    now[0] += 60  # 89 s stale: past grace
    assert (await fetch(client, url))[0] == 502


async def test_rfc9111_5_2_1_7_only_if_cached_answers_504_on_a_miss(origin, start_proxy, client):
    proxy = await start_proxy()
    status, _, _ = await fetch(
        client, base(proxy) + "/o", headers={"Cache-Control": "only-if-cached"}
    )
    assert status == 504 and origin.hits["/o"] == 0


async def test_head_range_and_conditionals_are_answered_from_the_stored_get(
    origin, start_proxy, client
):
    origin.set("/f", headers={"Cache-Control": "max-age=60", "ETag": '"f1"'}, body=b"0123456789")
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/f"
    await fetch(client, url)
    async with client.head(url) as r:  # RFC 9110 9.3.2
        assert r.status == 200 and r.headers["Content-Length"] == "10"
        assert r.headers["X-Cache"] == "HIT" and await r.read() == b""
    status, headers, body = await fetch(client, url, headers={"Range": "bytes=2-4"})  # 14
    assert (status, body, headers["Content-Range"]) == (206, b"234", "bytes 2-4/10")
    status, headers, _ = await fetch(client, url, headers={"Range": "bytes=50-"})
    assert status == 416 and headers["Content-Range"] == "bytes */10"
    status, headers, body = await fetch(client, url, headers={"If-None-Match": '"f1"'})  # 13.1.2
    assert status == 304 and body == b"" and headers["ETag"] == '"f1"'
    assert origin.hits["/f"] == 1


async def test_100_concurrent_misses_make_one_origin_request(origin, start_proxy, client):
    released = asyncio.Event()

    async def held(request: web.Request) -> web.Response:
        await released.wait()  # until all 99 followers wait on the leader's fetch
        return web.Response(body=b"x" * 5000, headers={"Cache-Control": "max-age=60"})

    origin.responder = held
    proxy = await start_proxy()
    url = base(proxy) + "/hot"
    fetches = asyncio.gather(*(fetch(client, url) for _ in range(100)))
    key = "http://{}:{}/hot".format(*proxy.proxy_address)
    for _ in range(1000):  # counted, not timed: however slow the machine
        if proxy.proxy.flights.waiting(key) == 99:
            break
        await asyncio.sleep(0.01)
    released.set()
    results = await fetches
    assert origin.hits["/hot"] == 1
    assert all(status == 200 and body == b"x" * 5000 for status, _, body in results)
    collapsed = [h for _, h, _ in results if "collapsed" in h["Cache-Status"]]
    assert len(collapsed) == 99 and proxy.proxy.engine.stats()["collapsed"] == 99
    # The burst counted as many sightings (like proxy_cache_min_uses): the URL is now stored.
    _, headers, _ = await fetch(client, url)
    assert headers["X-Cache"] == "HIT" and origin.hits["/hot"] == 1


def fields_of(head: bytes) -> list[tuple[bytes, bytes]]:
    """A head's fields in order, without the ones whose values move with each answer."""
    lines = head.split(b"\r\n")[1:]
    pairs = [tuple(line.split(b": ", 1)) for line in lines]
    return [p for p in pairs if p[0].lower() not in (b"date", b"age", b"connection")]


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ({"Content-Range": "bytes 0-20/99"}, [b"Content-Range: bytes 0-20/99"]),
        ({"Accept-Ranges": "none"}, [b"Accept-Ranges: none"]),
        ({}, [b"Accept-Ranges: bytes"]),
    ],
    ids=["content-range", "accept-ranges-none", "accept-ranges-added"],
)
async def test_rfc9110_14_a_hit_carries_the_stored_range_fields_once_on_every_way(
    origin, start_proxy, stored, expected
):
    origin.set("/r", headers={"Cache-Control": "max-age=60", **stored})
    # The cache's time stands still: answers on either side of a second would differ in the
    # ttl their Cache-Status gives.
    now = time.time()
    proxy = await start_proxy(clock=lambda: now, admission__policy="always")
    await raw(proxy, b"GET /r HTTP/1.1\r\nHost: a.example\r\n\r\n")
    heads = await answers_on_every_way(proxy, b"/r")
    for way, head in heads.items():
        lines = head.split(b"\r\n")
        for line in expected:
            name = line.partition(b":")[0].lower()
            assert [x for x in lines if x.lower().startswith(name + b":")] == [line], (way, head)
    assert fields_of(heads["compiled"]) == fields_of(heads["fast"]) == fields_of(heads["handler"])


async def test_rfc9111_5_2_2_4_no_cache_with_stale_while_revalidate_is_validated_before_use(
    origin, start_proxy, client
):
    origin.set("/nc", headers={"Cache-Control": "max-age=60, no-cache, stale-while-revalidate=60"})
    proxy = await start_proxy(admission__policy="always")
    _, first, _ = await fetch(client, base(proxy) + "/nc")
    _, second, _ = await fetch(client, base(proxy) + "/nc")
    assert first["Cache-Status"].endswith("stored")
    assert second["X-Cache"] != "STALE" and origin.hits["/nc"] == 2


async def test_purge_removes_the_entry(origin, start_proxy, client):
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/gone"
    await fetch(client, url)
    async with client.post(admin(proxy) + "/purge", json={"url": url}) as r:
        assert r.status == 200 and (await r.json()) == {"removed": 1, "key": url}
    _, headers, _ = await fetch(client, url)
    assert headers["X-Cache"] == "MISS" and origin.hits["/gone"] == 2


async def test_unsafe_method_passes_through_and_invalidates(origin, start_proxy, client):
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/item"
    await fetch(client, url)
    async with client.post(url, data=b"change") as r:  # 4.4
        assert r.status == 200 and r.headers["X-Cache"] == "BYPASS"
    _, headers, _ = await fetch(client, url)
    assert headers["X-Cache"] == "MISS" and origin.hits["/item"] == 3


@pytest.mark.parametrize("chunked", [False, True])
async def test_large_response_streams_through_and_is_not_stored(
    origin, start_proxy, client, chunked
):
    body = bytes(range(256)) * 4096  # 1 MiB
    origin.set("/big", body=body, chunked=chunked)
    proxy = await start_proxy(admission__policy="always", cache__max_object_size="256KiB")
    for _ in range(2):
        status, headers, got = await fetch(client, base(proxy) + "/big")
        assert status == 200 and got == body
        if not chunked:  # the length is known from the head: nothing is copied at all
            assert headers["Cache-Status"].endswith("detail=too-large")
    stats = proxy.proxy.engine.stats()
    assert stats["too_large"] == 2 and stats["admissions"] == 0 and stats["entries"] == 0
    assert origin.hits["/big"] == 2


async def test_bodies_pass_byte_for_byte_with_their_content_encoding(origin, start_proxy, client):
    import gzip

    packed = gzip.compress(b"compressible " * 1000)
    origin.set(
        "/z", body=packed, headers={"Cache-Control": "max-age=60", "Content-Encoding": "gzip"}
    )
    proxy = await start_proxy(admission__policy="always")
    for _ in range(2):
        _, headers, got = await fetch(client, base(proxy) + "/z")
        assert got == packed and headers["Content-Encoding"] == "gzip"


async def test_hop_by_hop_stripped_and_forwarding_headers_replaced(origin, start_proxy, client):
    proxy = await start_proxy()
    sent = {
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "secret",
        "X-Forwarded-For": "6.6.6.6",
        "Via": "1.1 forged",
        "X-Custom": "kept",
    }
    async with client.post(base(proxy) + "/h", headers=sent, data=b"x") as r:  # RFC 9110 7.6.1
        await r.read()
    seen = origin.seen_headers["/h"]
    assert "X-Hop" not in seen and seen["X-Custom"] == "kept"
    assert seen["X-Forwarded-For"] == "127.0.0.1" and seen["Via"] == "1.1 onehit"
    assert seen["X-Forwarded-Proto"] == "http"


# Field values as an origin may send them (RFC 9110 section 5.5): a byte that is not UTF-8,
# and a control character other than CR, LF or NUL, which a recipient may keep.
ODD_FIELDS = b"X-Name: caf\xe9\r\nX-Odd: a\x01b\r\n"

# Each way an origin's fields reach a client: (proxy settings, requests sent one after the
# other, the X-Cache of the last answer).
FIELD_WAYS = {
    "miss written at once": ({}, [b"GET /f HTTP/1.1"], "MISS"),
    "miss streamed": ({}, [b"GET /apart HTTP/1.1"], "MISS"),
    "miss through the handler": ({"server__fast_hits": False}, [b"GET /f HTTP/1.1"], "MISS"),
    "HTTP/1.0 miss": ({}, [b"GET /f HTTP/1.0"], "MISS"),
    "hit written at once": ({}, [b"GET /f HTTP/1.1"] * 3, "HIT"),
    "hit through the handler": ({"server__fast_hits": False}, [b"GET /f HTTP/1.1"] * 3, "HIT"),
    "HTTP/1.0 hit": ({}, [b"GET /f HTTP/1.1"] * 2 + [b"GET /f HTTP/1.0"], "HIT"),
    "range from the handler's hit": (
        {"server__fast_hits": False},
        [b"GET /f HTTP/1.1"] * 2 + [b"GET /f HTTP/1.1\r\nRange: bytes=0-1"],
        "HIT",
    ),
    "pass-through": ({}, [b"POST /f HTTP/1.1\r\nContent-Length: 0"], "BYPASS"),
    "pass-through streamed": ({}, [b"POST /apart HTTP/1.1\r\nContent-Length: 0"], "BYPASS"),
}


async def last_head(raw_origin, start_proxy, way: str) -> bytes:
    """The head of the last answer of ``FIELD_WAYS[way]``, from an origin whose response
    carries ``ODD_FIELDS`` and no Content-Type, Date or Server."""

    async def respond(reader, writer):
        while head := await reader.readuntil(b"\r\n\r\n"):
            start = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\n" + ODD_FIELDS
            writer.write(start + b"Content-Length: 5\r\n\r\n")
            if b" /apart " in head.partition(b"\r\n")[0]:
                await writer.drain()
                await asyncio.sleep(0.05)  # the body after the head: streamed, not at once
            writer.write(b"hello")
            await writer.drain()

    settings, requests, x_cache = FIELD_WAYS[way]
    proxy = await start_proxy(upstream__origin=await raw_origin(respond), **settings)
    for line in requests:
        host, port = proxy.proxy_address
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(line + b"\r\nHost: example.test\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        finally:
            writer.close()
    assert f"\r\nX-Cache: {x_cache}\r\n".encode() in head
    return head


@pytest.mark.parametrize("way", list(FIELD_WAYS))
async def test_rfc9110_5_5_field_values_reach_the_client_byte_for_byte(
    raw_origin, start_proxy, way
):
    head = await last_head(raw_origin, start_proxy, way)
    assert b"\r\nX-Name: caf\xe9\r\n" in head and b"\r\nX-Odd: a\x01b\r\n" in head


@pytest.mark.parametrize("way", list(FIELD_WAYS))
async def test_rfc9110_an_answer_gets_no_content_type_or_server_its_origin_did_not_send(
    raw_origin, start_proxy, way
):
    head = await last_head(raw_origin, start_proxy, way)
    # Section 8.3: without one, a client may look at the body to tell its type (a browser
    # renders a page); a made-up application/octet-stream would have it download the page.
    assert b"\r\nContent-Type:" not in head
    # Section 10.2.4: Server names the origin's software; the proxy says what it is in Via.
    assert b"\r\nServer:" not in head and b"\r\nVia: 1.1 onehit\r\n" in head
    assert b"\r\nDate: " in head  # section 6.6.1: a recipient forwarding one without adds it


@pytest.mark.parametrize("connection", [None, "keep-alive, X-Hop"])
@pytest.mark.parametrize(
    ("method", "extra"), [("GET", {}), ("HEAD", {}), ("GET", {"Cookie": "s=1"})]
)  # a whole fetch, and two sent as asked
async def test_rfc9110_7_6_1_a_get_or_head_reaches_the_origin_without_hop_by_hop_fields(
    origin, start_proxy, client, method, extra, connection
):
    proxy = await start_proxy()
    sent = {"TE": "trailers", "Keep-Alive": "timeout=5", "Proxy-Authorization": "Basic eA==",
            "X-Hop": "secret", "X-Custom": "kept", **extra}  # fmt: skip
    if connection is not None:
        sent["Connection"] = connection
    async with client.request(method, base(proxy) + "/hh", headers=sent) as r:
        assert r.status == 200
        await r.read()
    seen = {k.lower(): v for k, v in origin.seen_headers["/hh"].items()}
    assert not {"te", "keep-alive", "proxy-authorization", "connection"} & set(seen), seen
    assert seen["x-custom"] == "kept"
    assert ("x-hop" in seen) is (connection is None)  # named by Connection: hop-by-hop too


async def test_every_end_to_end_field_reaches_the_origin_by_default(origin, start_proxy, client):
    proxy = await start_proxy()
    sent = {
        "X-Api-Key": "k1",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "X-Requested-With": "XMLHttpRequest",
        "Accept-Language": "fr",
        "User-Agent": "test/1",
    }
    await fetch(client, base(proxy) + "/g", headers=sent)
    seen = origin.seen_headers["/g"]
    assert {k: seen.get(k) for k in sent} == sent


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_a_request_with_a_body_reaches_the_origin_with_no_field_added_but_forwarding(
    origin, start_proxy, method
):
    proxy = await start_proxy()
    head = f"{method} /b HTTP/1.1\r\nHost: example.test\r\nContent-Length: 3\r\n"
    assert (await raw(proxy, f"{head}\r\nabc".encode())).startswith(b"HTTP/1.1 200 ")
    forwarding = {"Via", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host"}
    # No Accept or Content-Type of an HTTP client library's own: the client sent none.
    assert set(origin.seen_headers["/b"]) == {"Host", "Content-Length"} | forwarding
    asked = f"{head}Content-Type: text/csv\r\nAccept: text/html\r\n\r\nabc"
    assert (await raw(proxy, asked.encode())).startswith(b"HTTP/1.1 200 ")
    seen = origin.seen_headers["/b"]
    assert (seen["Content-Type"], seen["Accept"]) == ("text/csv", "text/html")


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 5\r\n\r\nhello",
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ],
    ids=["length", "chunked"],
)
@pytest.mark.parametrize("method", [b"GET", b"POST", b"PUT"])
async def test_rfc9110_5_5_request_field_values_reach_the_origin_byte_for_byte(
    raw_origin, start_proxy, method, framing
):
    heads: list[bytes] = []

    async def respond(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head + await reader.readexactly(5 if method != b"GET" else 0))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    proxy = await start_proxy(upstream__origin=await raw_origin(respond))
    body = framing if method != b"GET" else b"\r\n"
    sent = method + b" /b HTTP/1.1\r\nHost: example.test\r\nX-Name: caf\xe9\r\n" + body
    assert (await raw(proxy, sent)).startswith(b"HTTP/1.1 200 ")
    [got] = heads
    assert b"\r\nX-Name: caf\xe9\r\n" in got
    if method != b"GET":
        # The body as it was in hand, framed by its own length whatever the client's framing.
        assert b"\r\nContent-Length: 5\r\n" in got and got.endswith(b"\r\n\r\nhello")
        assert b"Transfer-Encoding" not in got


@pytest.mark.parametrize("apart", [False, True], ids=["in one piece", "in pieces"])
async def test_an_answer_to_a_post_reaches_the_client_whole_as_it_arrives(
    raw_origin, start_proxy, client, apart
):
    async def respond(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(3)
        writer.write(b"HTTP/1.1 201 Made\r\nContent-Length: 10\r\nX-A: 1\r\n\r\nfirst")
        if apart:
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"-rest")
        await writer.drain()

    proxy = await start_proxy(upstream__origin=await raw_origin(respond))
    async with client.post(base(proxy) + "/p", data=b"abc") as r:
        assert (r.status, r.reason, await r.read()) == (201, "Made", b"first-rest")
        assert r.headers["X-A"] == "1" and r.headers["Content-Length"] == "10"
        assert r.headers["X-Cache"] == "BYPASS"


@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: 4\r\n\r\nbody", b"Transfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n"],
    ids=["length", "chunked"],
)
async def test_rfc9110_9_3_1_a_get_with_content_goes_to_the_origin_whole_past_the_cache(
    raw_origin, start_proxy, framing
):
    # A GET's content has no defined meaning, and the cache keys on none: it passes with its
    # body and length, or the origin would read the next request on the connection as it.
    got: list[bytes] = []

    async def respond(reader, writer):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head)[1]) if b"Length" in head else 0
            got.append(head.partition(b" HTTP")[0] + b" " + await reader.readexactly(length))
            writer.write(
                b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok"
            )
            await writer.drain()

    proxy = await start_proxy(
        upstream__origin=await raw_origin(respond), admission__policy="always"
    )
    answer = await raw(proxy, b"GET /q HTTP/1.1\r\nHost: example.test\r\n" + framing)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\nX-Cache: BYPASS\r\n" in answer
    for _ in range(2):  # the same pooled connection carries the next request, stored then hit
        answer = await raw(proxy, b"GET /q HTTP/1.1\r\nHost: example.test\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok")
    assert got == [b"GET /q body", b"GET /q "]
    assert b"\r\nX-Cache: HIT\r\n" in answer


async def test_an_allow_list_passes_only_its_fields_and_what_vary_needs(
    origin, start_proxy, client
):
    origin.set("/al", headers={"Cache-Control": "max-age=0", "ETag": '"a"', "Vary": "X-Tenant"},
               not_modified_etag='"a"')  # fmt: skip
    proxy = await start_proxy(admission__policy="always", server__forward_headers=["accept"])
    sent = {"Accept": "text/html", "X-Custom": "dropped", "X-Tenant": "t1"}
    await fetch(client, base(proxy) + "/al", headers=sent)
    seen = origin.seen_headers["/al"]
    assert seen["Accept"] == "text/html" and "X-Custom" not in seen and "X-Tenant" not in seen
    # RFC 9111 4.3.1: a revalidation carries the fields the stored response's Vary names.
    _, headers, _ = await fetch(client, base(proxy) + "/al", headers=sent)
    assert headers["X-Cache"] == "REVALIDATED"
    assert origin.seen_headers["/al"]["X-Tenant"] == "t1" and "X-Custom" not in seen


@pytest.mark.parametrize(
    "attack",
    [
        {"X-Forwarded-Scheme": "javascript:"},
        {"X-Forwarded-Host": "attacker.example"},
        {"X-Original-URL": "/admin"},
        {"X-Rewrite-URL": "/admin"},
        {"X-HTTP-Method-Override": "DELETE"},
        {"Forwarded": "host=attacker.example"},
    ],
)
async def test_the_deny_list_keeps_poisoning_fields_from_a_cacheable_get(
    origin, start_proxy, client, attack
):
    async def reflect(request):
        evil = "".join(request.headers.get(name, "") for name in attack)  # what an origin obeys
        host = request.headers.get("X-Forwarded-Host", "")
        headers = {"Cache-Control": "max-age=60", "X-Seen-Host": host}
        return web.Response(body=f"<script src='{evil}/app.js'>".encode(), headers=headers)

    origin.responder = reflect
    proxy = await start_proxy()
    for _ in range(2):  # first sighting, then stored
        await fetch(client, base(proxy) + "/page", headers=attack)
    _, headers, body = await fetch(client, base(proxy) + "/page")
    assert headers["X-Cache"] == "HIT"
    assert not any(value.encode() in body for value in attack.values())
    assert "attacker" not in headers["X-Seen-Host"]


async def test_the_deny_list_is_configurable(origin, start_proxy, client):
    proxy = await start_proxy(server__deny_headers=["x-tenant-override"])
    sent = {"X-Tenant-Override": "other", "X-Original-URL": "/kept"}
    await fetch(client, base(proxy) + "/d", headers=sent)
    seen = origin.seen_headers["/d"]
    assert "X-Tenant-Override" not in seen and seen["X-Original-URL"] == "/kept"


async def test_host_case_and_default_port_share_one_cache_key(origin, start_proxy, client):
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/k"
    await fetch(client, url, headers={"Host": "CDN.Example:80"})
    _, headers, _ = await fetch(client, url, headers={"Host": "cdn.example"})
    assert headers["X-Cache"] == "HIT"


async def test_never_an_open_proxy(origin):
    from proxy.config.settings import load
    from proxy.ops.service import Service

    settings = {
        "server.listen": "127.0.0.1:0",
        "admin.listen": "127.0.0.1:0",
        "server.access_log": False,
    }
    routed = await Service.start(
        load(env={"ONEHIT_ROUTES": f"cdn.example={origin.url}"}, overrides=settings)
    )
    try:
        foreign = b"GET http://evil.example/x HTTP/1.1\r\nHost: cdn.example\r\n\r\n"
        assert (await raw(routed, foreign)).startswith(b"HTTP/1.1 421")
        connect = b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example\r\n\r\n"
        assert (await raw(routed, connect)).startswith(b"HTTP/1.1 405")
        unknown = b"GET /x HTTP/1.1\r\nHost: other.example\r\n\r\n"
        assert (await raw(routed, unknown)).startswith(b"HTTP/1.1 421")
        ours = b"GET http://cdn.example/x HTTP/1.1\r\nHost: cdn.example\r\n\r\n"
        assert (await raw(routed, ours)).startswith(b"HTTP/1.1 200")
        assert sum(origin.hits.values()) == 1
        assert origin.seen_headers["/x"]["X-Forwarded-Host"] == "cdn.example"
    finally:
        await routed.stop()


async def test_origin_refusing_connections_gives_502_and_the_proxy_keeps_serving(
    origin, start_proxy, client
):
    proxy = await start_proxy()
    url = base(proxy) + "/x"
    await origin.stop()
    status, _, body = await fetch(client, url)
    assert status == 502 and b"unreachable" in body
    await origin.start()  # a new port: point the proxy at it
    proxy.proxy.router.routes[""] = origin.url
    status, _, _ = await fetch(client, url)
    assert status == 200


async def test_slow_origin_gives_504(origin, start_proxy, client):
    origin.set("/slow", delay=1.0)  # past the read timeout, and over soon after the test
    proxy = await start_proxy(upstream__read_timeout="300ms")
    status, _, body = await fetch(client, base(proxy) + "/slow")
    assert status == 504 and b"timed out" in body


async def test_reset_mid_body_is_never_stored_and_the_proxy_keeps_serving(
    origin, start_proxy, client
):
    origin.set("/cut", body=b"y" * 200_000, cut_after=1000)
    proxy = await start_proxy(admission__policy="always")
    url = base(proxy) + "/cut"
    with pytest.raises(aiohttp.ClientPayloadError):  # streamed: the client is cut off too
        await fetch(client, url)
    stats = proxy.proxy.engine.stats()
    assert stats["cut_short"] == 1 and stats["entries"] == 0
    origin.set("/cut", body=b"y" * 200_000)
    status, headers, body = await fetch(client, url)
    assert status == 200 and len(body) == 200_000 and headers["X-Cache"] == "MISS"


async def test_reset_mid_stream_closes_the_client_connection(origin, start_proxy, client):
    origin.set("/cutbig", body=b"z" * 2_000_000, cut_after=300_000)
    proxy = await start_proxy(admission__policy="always", cache__max_object_size="64KiB")
    with pytest.raises(aiohttp.ClientPayloadError):
        await fetch(client, base(proxy) + "/cutbig")
    origin.set("/ok")
    status, _, _ = await fetch(client, base(proxy) + "/ok")
    assert status == 200


async def test_rfc5861_stale_while_revalidate_answers_at_once_and_refreshes_behind(
    origin, start_proxy, client
):
    origin.set("/swr", headers={"Cache-Control": "max-age=2, stale-while-revalidate=30"})
    clock = Clock()
    proxy = await start_proxy(admission__policy="always", clock=clock)
    url = base(proxy) + "/swr"
    await fetch(client, url)
    clock.now += 2.05
    _, stale, _ = await fetch(client, url)
    assert stale["X-Cache"] == "STALE" and stale["X-Origin-Count"] == "1"
    await asyncio.gather(*proxy.proxy.revalidation.background)  # the refresh lands
    assert origin.hits["/swr"] == 2
    _, fresh, _ = await fetch(client, url)
    assert fresh["X-Cache"] == "HIT" and fresh["X-Origin-Count"] == "2"
    assert proxy.proxy.engine.stats()["stale_served"] == 1


async def test_url_too_long_is_414_and_headers_too_large_are_431(origin, start_proxy, client):
    proxy = await start_proxy(server__max_url_length=100, server__max_header_size=400)
    status, _, _ = await fetch(client, base(proxy) + "/" + "a" * 120)  # RFC 9110 15.5.15
    assert status == 414
    status, _, _ = await fetch(client, base(proxy) + "/ok", headers={"X-Big": "b" * 500})
    assert status == 431  # RFC 6585 5
    status, _, _ = await fetch(client, base(proxy) + "/ok")
    assert status == 200 and sum(origin.hits.values()) == 1


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /s HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /s HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"GET /s HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  folded\r\n\r\n",
    ],
    ids=["content-length-and-transfer-encoding", "duplicate-content-length", "obs-fold"],
)
async def test_rfc9112_ambiguous_framing_is_400_and_never_reaches_the_origin(
    origin, start_proxy, request_bytes
):
    proxy = await start_proxy()
    answer = await raw(proxy, request_bytes)
    assert answer.split(b"\r\n")[0].endswith(b"400 Bad Request")
    assert sum(origin.hits.values()) == 0


async def test_a_slow_header_client_is_cut_off_and_others_are_unaffected(
    origin, start_proxy, client
):
    proxy = await start_proxy(server__idle_timeout="1s")
    host, port = proxy.proxy_address
    reader, writer = await asyncio.open_connection(host, port)
    head = b"GET /slow HTTP/1.1\r\nHost: h\r\nX-Drip: " + b"a" * 100
    started = asyncio.get_running_loop().time()
    for byte in head:  # one byte every 50 ms: the head would take 5 s
        writer.write(bytes([byte]))
        try:
            await writer.drain()
        except ConnectionError:
            break
        status, _, _ = await fetch(client, base(proxy) + "/other")  # others are served meanwhile
        assert status == 200
        await asyncio.sleep(0.05)
        if reader.at_eof() or writer.is_closing():
            break
    data = await asyncio.wait_for(reader.read(), 3)
    closed_after = asyncio.get_running_loop().time() - started
    assert data == b"" and closed_after < 2.5
    assert origin.hits["/slow"] == 0
    writer.close()
