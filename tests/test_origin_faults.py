"""Origin faults: the client gets a proper answer, nothing wrong is stored, and the proxy goes on
serving; the next request for the same URL is fetched again and served correctly."""

import asyncio

import aiohttp
import pytest
from conftest import base, read_request

from proxy.config.logs import HTTP_ERRORS, OneLineEvery

OK = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: max-age=60\r\n"
    b"Connection: keep-alive\r\n\r\nfresh"
)


async def get(client, url, **kwargs):
    async with client.get(url, **kwargs) as r:
        return r.status, r.headers.copy(), await r.read()


def scripted(*replies):
    """A raw origin handler answering successive connections with ``replies`` in turn (a reply
    is bytes, or a coroutine function taking (reader, writer)); the last one repeats."""
    queue = list(replies)

    async def handler(reader, writer):
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        if callable(reply):
            await reply(reader, writer)
            return
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(0.05)

    return handler


async def then_fine(client, proxy, path="/x"):
    status, headers, body = await get(client, base(proxy) + path)
    assert (status, body) == (200, b"fresh"), "the next request is fetched again and served"
    return headers


async def test_accept_then_never_answer_gives_504(raw_origin, start_proxy, client):
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    url = await raw_origin(scripted(silent, OK))
    proxy = await start_proxy(upstream__origin=url, upstream__read_timeout="300ms",
                              admission__policy="always")  # fmt: skip
    status, _, body = await get(client, base(proxy) + "/x")
    assert status == 504 and b"timed out" in body
    await then_fine(client, proxy)


async def test_slow_body_times_out_mid_body_and_is_not_stored(raw_origin, start_proxy, client):
    async def stalls(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nCache-Control: max-age=60\r\n\r\n")
        writer.write(b"part")
        await writer.drain()
        await asyncio.sleep(10)

    url = await raw_origin(scripted(stalls, OK))
    proxy = await start_proxy(upstream__origin=url, upstream__read_timeout="300ms",
                              admission__policy="always")  # fmt: skip
    with pytest.raises(aiohttp.ClientPayloadError):  # the head was streamed: cut off
        await get(client, base(proxy) + "/x")
    headers = await then_fine(client, proxy)
    assert headers["X-Cache"] == "MISS"


async def test_invalid_chunked_encoding_is_a_502_and_not_stored(raw_origin, start_proxy, client):
    bad = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nCache-Control: max-age=60\r\n\r\n"
           b"5\r\nhello\r\nZZZ\r\nnot a chunk\r\n0\r\n\r\n")  # fmt: skip
    url = await raw_origin(scripted(bad, OK))
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    status, _, _ = await get(client, base(proxy) + "/x")
    assert status == 502
    assert (await then_fine(client, proxy))["X-Cache"] == "MISS"


async def test_5xx_without_a_stale_entry_passes_through_as_sent(raw_origin, start_proxy, client):
    down = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\nRetry-After: 5\r\n\r\n"
            b"maintenance")  # fmt: skip
    url = await raw_origin(scripted(down, OK))
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    status, headers, body = await get(client, base(proxy) + "/x")
    assert (status, body, headers["Retry-After"]) == (503, b"maintenance", "5")
    await then_fine(client, proxy)


EARLY = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"


async def test_interim_1xx_before_the_final_response(raw_origin, start_proxy, client):
    url = await raw_origin(scripted(EARLY + OK))
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    status, _, body = await get(client, base(proxy) + "/x")
    assert (status, body) == (200, b"fresh")
    _, headers, body = await get(client, base(proxy) + "/x")
    assert headers["X-Cache"] == "HIT" and body == b"fresh"


@pytest.mark.parametrize(
    ("request_line", "relayed"),
    [
        (b"GET /x HTTP/1.1", True),
        (b"GET /x HTTP/1.1\r\nConnection: close", True),
        (b"POST /x HTTP/1.1\r\nContent-Length: 0", True),
        (b"GET /x HTTP/1.0", False),  # an HTTP/1.0 client cannot read an interim response
    ],
    ids=["lane", "handler", "pass-through", "http-1.0"],
)
async def test_rfc9110_15_2_an_origins_103_early_hints_reach_the_client_before_its_answer(
    raw_origin, start_proxy, request_line, relayed
):
    async def hints_then_answer(reader, writer):
        while await read_request(reader):
            writer.write(EARLY)
            await writer.drain()
            await asyncio.sleep(0.05)  # the hints arrive alone, as an origin sends them
            writer.write(OK)
            await writer.drain()

    url = await raw_origin(hints_then_answer)
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    reader, writer = await asyncio.open_connection(*proxy.proxy_address)
    writer.write(request_line + b"\r\nHost: a.example\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    if relayed:
        assert first == EARLY
    else:
        assert first.partition(b"\r\n")[0].endswith(b" 200 OK")


@pytest.mark.parametrize(
    "past",
    [
        b"HTTP/1.1 302 Found\r\nLocation: /evil\r\nCache-Control: max-age=999\r\nX-A: ",
        b" and more body than its Content-Length says",
    ],
    ids=["a-forged-head-in-part", "a-longer-body"],
)
async def test_an_answer_with_bytes_past_its_content_length_is_stored_and_they_are_dropped(
    raw_origin, start_proxy, client, past
):
    url = await raw_origin(scripted(OK + past))
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    for path, x_cache in (("/x", "MISS"), ("/y", "MISS"), ("/x", "HIT"), ("/y", "HIT")):
        status, headers, body = await get(client, base(proxy) + path)
        assert (status, headers["X-Cache"], body) == (200, x_cache, b"fresh"), path


async def test_origin_closing_keep_alive_connections_between_requests(
    raw_origin, start_proxy, client
):
    async def one_then_close(reader, writer):
        await read_request(reader)
        writer.write(OK)  # claims keep-alive, then closes once the proxy has pooled it
        await writer.drain()
        await asyncio.sleep(0.05)

    url = await raw_origin(one_then_close)
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    for i in range(5):
        status, _, body = await get(client, base(proxy) + f"/k{i}")
        assert (status, body) == (200, b"fresh")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("policy", ["always", "second-hit"])
async def test_content_length_longer_than_the_body_is_never_stored(
    raw_origin, start_proxy, client, policy
):
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nCache-Control: max-age=60\r\n\r\nonly10byte"
    url = await raw_origin(scripted(short, short, OK))
    proxy = await start_proxy(upstream__origin=url, admission__policy=policy)
    for _ in range(2):
        with pytest.raises(aiohttp.ClientPayloadError):
            await get(client, base(proxy) + "/x")
    stats = proxy.proxy.engine.stats()
    assert stats["admissions"] == 0 and stats["rejected_first_sighting"] == 0
    assert stats["cut_short"] == 2
    await then_fine(client, proxy)


async def test_unexpected_exception_is_a_500_logged_as_one_throttled_line_and_the_proxy_goes_on(
    origin, start_proxy, client, caplog, monkeypatch
):
    # The limit is the process's: a fresh one, whatever an earlier test logged this second.
    monkeypatch.setattr(HTTP_ERRORS, "filters", [OneLineEvery()])
    proxy = await start_proxy()
    boom = RuntimeError("a bug")

    def broken(*args, **kwargs):
        raise boom

    real = proxy.proxy.engine.lookup
    proxy.proxy.engine.lookup = broken
    for _ in range(5):
        status, _, _ = await get(client, base(proxy) + "/x?q=1")
        assert status == 500
    logged = [r for r in caplog.records if r.name == "onehit.http"]
    assert len(logged) == 1 and logged[0].exc_info is None
    line = logged[0].getMessage()
    assert "GET /x?q=1 HTTP/1.1" in line and "RuntimeError('a bug') at " in line
    assert "\n" not in line
    proxy.proxy.engine.lookup = real
    status, _, _ = await get(client, base(proxy) + "/x")
    assert status == 200


async def test_a_chunk_malformed_mid_body_cuts_the_answer_at_once_and_is_not_stored(
    raw_origin, start_proxy, client
):
    async def turns_malformed(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                     b"Cache-Control: max-age=60\r\n\r\n5\r\nhello\r\n")  # fmt: skip
        await writer.drain()
        await asyncio.sleep(0.1)  # the head and the first chunk have been relayed
        writer.write(b"ZZZ\r\nnot a chunk\r\n0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(10)

    url = await raw_origin(scripted(turns_malformed, OK))
    proxy = await start_proxy(upstream__origin=url, admission__policy="always")
    with pytest.raises(aiohttp.ClientPayloadError):  # the head was streamed: cut off
        async with asyncio.timeout(5):  # not left waiting for the total timeout
            await get(client, base(proxy) + "/x")
    stats = proxy.proxy.engine.stats()
    assert stats["admissions"] == 0 and stats["cut_short"] == 1
    headers = await then_fine(client, proxy)
    assert headers["X-Cache"] == "MISS"


async def test_an_http_1_0_answer_whose_origin_fails_mid_body_is_reset_never_closed(
    raw_origin, start_proxy
):
    """An HTTP/1.0 client reads a body without a length to the connection's end: a plain
    close after a body that failed mid-way would read as the whole body. The connection is
    reset instead."""

    async def dies_mid_body(reader, writer):
        await read_request(reader)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nCache-Control: max-age=60\r\n"
        writer.write(head + b"\r\n1000\r\n" + b"x" * 4096 + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()

    url = await raw_origin(dies_mid_body)
    proxy = await start_proxy(upstream__origin=url)
    reader, writer = await asyncio.open_connection(*proxy.proxy_address)
    writer.write(b"GET /cut HTTP/1.0\r\nHost: example.test\r\n\r\n")
    got, ended = b"", "FIN"
    try:
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
            got += chunk
    except ConnectionResetError:
        ended = "RST"
    finally:
        writer.close()
    assert ended == "RST", got[:200]
