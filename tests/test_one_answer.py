"""One answer, whatever path serves it: for random stored responses and random requests, the
compiled fast path, the fast path's Python and aiohttp's handler give the same status, fields,
body and counters.

Three proxies run in front of one scripted origin: one as shipped (the compiled reader and
hit, then ``Proxy.answer_hit``, then the lane), one whose fast path is ``answer_hit`` alone,
and one with ``[server] fast_hits = false`` (every request through aiohttp's handler). Each
example stores a response in all three (the miss's answer is compared too), sends them the
same request as bytes, and compares what comes back byte for byte but the Date's value."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.front.fastpath import HitServer

LAST_MODIFIED = "Mon, 02 Nov 2026 10:00:00 GMT"
EARLIER = "Sun, 01 Nov 2026 10:00:00 GMT"

# What a stored response may hold. Freshness is always explicit (a heuristic lifetime moves
# with each proxy's own response time, and so would its ttl by a second now and then).
stored_responses = st.fixed_dictionaries(
    {
        "status": st.sampled_from([200, 200, 200, 203, 301, 404, 410]),
        "max_age": st.sampled_from(["max-age=100", "max-age=2000", "s-maxage=100"]),
        "directives": st.lists(
            st.sampled_from(
                [
                    "no-cache",
                    "must-revalidate",
                    "public",
                    "stale-while-revalidate=5000",
                    "stale-if-error=5000",
                    "proxy-revalidate",
                ]
            ),
            max_size=2,
            unique=True,
        ),
        "age": st.sampled_from([None, "3", "1000", "abc"]),
        "etag": st.sampled_from([None, '"v1"', 'W/"v1"']),
        "last_modified": st.sampled_from([None, LAST_MODIFIED]),
        "vary": st.sampled_from([None, "Accept-Language"]),
        "content_range": st.sampled_from([None, "bytes 0-9/10"]),
        "accept_ranges": st.sampled_from([None, "none", "bytes"]),
        "body": st.binary(max_size=24),
    }
)

requests = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["GET", "GET", "HEAD"]),
        "version": st.sampled_from(["1.1", "1.1", "1.1", "1.0"]),
        "connection": st.sampled_from([None, None, "close", "keep-alive"]),
        "if_none_match": st.sampled_from([None, None, '"v1"', 'W/"v1"', '"other"', "*"]),
        "if_modified_since": st.sampled_from([None, None, LAST_MODIFIED, EARLIER]),
        "range": st.sampled_from(
            [
                None,
                None,
                "bytes=0-3",
                "bytes=2-",
                "bytes=-3",
                "bytes=100-",
                "bytes=0-1,3-4",
                "bytes=\u00b2-",
                "items=0-1",
            ]
        ),
        "if_range": st.sampled_from([None, None, '"v1"', LAST_MODIFIED]),
        "cookie": st.sampled_from([None, None, "_ga=1", "session=alice", "_ga=1, s=2"]),
        "cache_control": st.sampled_from(
            [
                None,
                None,
                "no-cache",
                "max-age=0",
                "max-stale",
                "only-if-cached",
                "min-fresh=100000",
                "max-age=" + "9" * 30,
            ]
        ),
        "pragma": st.sampled_from([None, None, "no-cache"]),
    }
)


def response_bytes(spec: dict, conditional: bytes) -> bytes:
    """The origin's answer to a request whose head is ``conditional``: a 304 when it asks
    If-None-Match of the stored ETag, else the whole response (no body to a HEAD; no Date:
    each proxy then dates its answers itself, and their ages do not depend on when each
    fetched)."""
    cc = ", ".join([spec["max_age"], *spec["directives"]])
    fields = [("Cache-Control", cc)]
    for name, key in (("Age", "age"), ("ETag", "etag"), ("Last-Modified", "last_modified"),
                      ("Vary", "vary"), ("Content-Range", "content_range"),
                      ("Accept-Ranges", "accept_ranges")):  # fmt: skip
        if spec[key] is not None:
            fields.append((name, spec[key]))
    etag = spec["etag"]
    if etag is not None and f"if-none-match: {etag}".encode() in conditional.lower():
        head = "HTTP/1.1 304 Not Modified\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
        return head.encode() + b"\r\n"
    body = spec["body"]
    fields.append(("Content-Length", str(len(body))))
    head = f"HTTP/1.1 {spec['status']} Whatever\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
    return head.encode() + b"\r\n" + (b"" if conditional.startswith(b"HEAD ") else body)


def request_bytes(path: str, spec: dict) -> bytes:
    fields = {
        "Connection": spec["connection"],
        "If-None-Match": spec["if_none_match"],
        "If-Modified-Since": spec["if_modified_since"],
        "Range": spec["range"],
        "If-Range": spec["if_range"],
        "Cookie": spec["cookie"],
        "Cache-Control": spec["cache_control"],
        "Pragma": spec["pragma"],
    }
    head = f"{spec['method']} {path} HTTP/{spec['version']}\r\nHost: a.example\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in fields.items() if v is not None)
    return (head + "\r\n").encode()


async def exchange(address: tuple[str, int], request: bytes, method: str) -> bytes:
    """Send ``request`` on a new connection; the whole answer, its Date's value blanked."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.partition(b":")[2])
        bodiless = method == "HEAD" or status in (204, 304)
        body = b"" if bodiless else await asyncio.wait_for(reader.readexactly(length), 5)
    finally:
        writer.close()
    lines = [b"Date: -" if x.startswith(b"Date: ") else x for x in head.split(b"\r\n")]
    return b"\r\n".join(lines) + body


class Three:
    """The three proxies, the origin's responses by path, and a fresh path for each example."""

    def __init__(self, proxies: tuple, specs: dict[str, dict]) -> None:
        self.proxies = proxies
        self.specs = specs
        self.serial = itertools.count()


@pytest.fixture
async def three(raw_origin, start_proxy) -> Three:
    specs: dict[str, dict] = {}

    async def origin(reader, writer):
        while head := await reader.readuntil(b"\r\n\r\n"):
            path = head.split(b" ", 2)[1].decode()
            writer.write(response_bytes(specs[path], head))
            await writer.drain()

    url = await raw_origin(origin)
    common = {"upstream__origin": url, "admission__policy": "always", "cache__hit_for_miss": 0}
    shipped = await start_proxy(**common)
    python = await start_proxy(**common)
    server = python.proxy_runner.server
    assert isinstance(server, HitServer)
    server.answers, server.answer_bytes = (python.proxy.answer_hit,), None
    handler = await start_proxy(server__fast_hits=False, **common)
    return Three((shipped, python, handler), specs)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(stored=stored_responses, asked=requests)
async def test_every_path_gives_one_answer_and_one_count(three, stored, asked):
    path = f"/p{next(three.serial)}"
    three.specs[path] = stored
    plain = request_bytes(path, {**dict.fromkeys(asked), "method": "GET", "version": "1.1"})
    for request, method in ((plain, "GET"), (request_bytes(path, asked), asked["method"])):
        answers = []
        for proxy in three.proxies:
            answers.append(await exchange(proxy.proxy_address, request, method))
            # A stale-while-revalidate refresh: let it land.
            while proxy.proxy.revalidation.background:
                await asyncio.sleep(0.005)
        assert answers[0] == answers[1] == answers[2], (request, *answers)
        counts = [asdict(proxy.proxy.engine.counters) for proxy in three.proxies]
        assert counts[0] == counts[1] == counts[2], request
