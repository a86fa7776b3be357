"""The compiled plain hit (``Proxy.plain_hits``, ``proxy/_hits.c``): for every request it
answers, the bytes ``Proxy.answer_hit`` would write and the counts ``CacheEngine.served`` would
make; every other request it declines, counting nothing.

Each test drives two proxies over engines in the same state and on the same clock: one asks
the compiled answer, the other ``answer_hit`` (Python), and they must agree."""

from __future__ import annotations

import asyncio
from email.utils import formatdate

import pytest
from aiohttp.http_parser import HttpRequestParser, HttpRequestParserPy

from proxy.config import load
from proxy.core.engine import RequestMeta, response_meta
from proxy.server import Proxy
from proxy.service import build_engine
from proxy.upstream import Upstream

HOST = "example.test"
NOW = 1_800_000_000.0


class _Protocol:
    """What aiohttp's request parser asks of its protocol."""

    _reading_paused = False

    def pause_reading(self) -> None:
        pass


class Pair:
    """Two proxies over identical engines on one clock: ``compiled`` answers with
    ``plain_hits``, ``python`` with ``answer_hit``."""

    def __init__(self, parser: type = HttpRequestParser, **settings: object) -> None:
        overrides = {"upstream.origin": "http://127.0.0.1:9", "admission.policy": "always"}
        overrides.update(settings)
        config = load(env={}, overrides=overrides)
        self.now = NOW
        self.compiled, self.python = (
            Proxy(config, build_engine(config), Upstream(config.upstream), clock=self.clock)
            for _ in range(2)
        )
        self.parser = parser(_Protocol(), asyncio.get_running_loop(), 2**16)

    def clock(self) -> float:
        return self.now

    def store(self, path, body, headers, status=200, host=HOST):
        for proxy in (self.compiled, self.python):
            meta = RequestMeta(f"http://{host}{path}", "GET", ())
            response = response_meta(meta, status, headers, self.now, self.now, payload=body)
            decision = proxy.engine.on_response_head(meta, response, len(body), self.now)
            proxy.engine.finish(meta, decision, len(body), self.now, payload=body)

    def parse(self, request: bytes):
        [(message, _)], _, _ = self.parser.feed_data(request)
        self.parser.message_consumed()
        return message

    def answers(self, request: bytes):
        """(compiled answer, Python answer) to ``request``; a first ``answer_hit`` on each
        proxy has rendered the entry's head and made its Host known, as a live proxy's first
        hit does."""
        message = self.parse(request)
        compiled = self.compiled.plain_hits.answer(message, "127.0.0.1", "http")
        python = self.python.answer_hit(message, "127.0.0.1", "http")
        return compiled, python

    def warm(self, request: bytes) -> None:
        message = self.parse(request)
        for proxy in (self.compiled, self.python):
            proxy.answer_hit(message, "127.0.0.1", "http")


def get(path: str = "/a", method: str = "GET", fields: str = "", version: str = "1.1") -> bytes:
    return f"{method} {path} HTTP/{version}\r\nHost: {HOST}\r\n{fields}\r\n".encode()


DATED = [("Cache-Control", "max-age=600"), ("Date", formatdate(NOW, usegmt=True))]


@pytest.mark.parametrize(
    ("method", "body", "headers"),
    [
        ("GET", b"x" * 1024, DATED),
        ("HEAD", b"x" * 1024, DATED),
        ("GET", b"y" * (300 << 10), DATED),  # past the size written apart from the head
        ("GET", b"", DATED),
        # No Date or Content-Type from the origin: a Date is added per hit, no type.
        ("GET", b"z" * 10, [("Cache-Control", "max-age=600"), ("ETag", '"v1"')]),
        ("HEAD", b"z" * 10, [("Cache-Control", "max-age=600"), ("Content-Type", "text/css")]),
    ],
)
async def test_a_compiled_plain_hit_is_answer_hits_bytes_and_counts(method, body, headers):
    pair = Pair()
    pair.store("/a", body, headers)
    pair.warm(get())
    for elapsed in (0.0, 1.5, 59.9, 599.0):
        pair.now = NOW + elapsed
        compiled, python = pair.answers(get(method=method))
        assert compiled is not None and compiled == python
    assert pair.compiled.engine.stats() == pair.python.engine.stats()
    assert pair.compiled.plain_hits.answered == 4
    assert pair.compiled.fast_hits == pair.python.fast_hits == 5


async def test_a_message_from_aiohttps_pure_python_parser_is_answered_the_same():
    # Its messages keep their fields as a named tuple, not in C slots: read by name instead.
    pair = Pair(parser=HttpRequestParserPy)
    pair.store("/a", b"x" * 1024, DATED)
    pair.warm(get())
    compiled, python = pair.answers(get())
    assert compiled is not None and compiled == python
    assert pair.compiled.plain_hits.answer(pair.parse(get(version="1.0")), "", "") is None
    assert pair.compiled.engine.stats() == pair.python.engine.stats()


async def test_a_compiled_hit_moves_the_entry_in_the_eviction_order_as_served_does():
    # Room for two 40 KiB entries: a third evicts the least recently used.
    pair = Pair(**{"cache.size": "100KiB", "cache.max_object_size": "50KiB"})
    for path in ("/a", "/b"):
        pair.store(path, b"x" * (40 << 10), DATED)
    pair.warm(get("/a"))
    pair.warm(get("/b"))
    compiled, python = pair.answers(get("/a"))
    assert compiled is not None and compiled == python
    pair.store("/c", b"x" * (40 << 10), DATED)
    for proxy in (pair.compiled, pair.python):
        assert list(proxy.engine.store) == [f"http://{HOST}/a", f"http://{HOST}/c"]
    assert pair.compiled.engine.stats() == pair.python.engine.stats()


async def test_a_compiled_hit_is_observed_by_an_admission_that_counts_every_request():
    pair = Pair(**{"admission.policy": "tinylfu"})
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get())
    for _ in range(3):
        compiled, python = pair.answers(get())
        assert compiled == python
    if pair.compiled.plain_hits.answered == 0:
        pytest.fail("tinylfu did not store /a: nothing was compared")
    assert pair.compiled.engine.stats() == pair.python.engine.stats()


LONG = "/a?" + "q" * 200
DECLINED = {
    "HTTP/1.0": get(version="1.0"),
    "Connection: close": get(fields="Connection: close\r\n"),
    "POST": get(method="POST", fields="Content-Length: 0\r\n"),
    "unknown Host": b"GET /a HTTP/1.1\r\nHost: other.test\r\n\r\n",
    "a URL over the limit": get(LONG),
    "fields over the limit": get(fields=f"X-Big: {'b' * 300}\r\n"),
    "Cookie": get(fields="Cookie: id=1\r\n"),
    "Cache-Control": get(fields="Cache-Control: max-age=0\r\n"),
    "Pragma": get(fields="Pragma: no-cache\r\n"),
    "If-None-Match": get(fields='If-None-Match: "v1"\r\n'),
    "If-Modified-Since": get(fields=f"If-Modified-Since: {formatdate(NOW, usegmt=True)}\r\n"),
    "Range": get(fields="Range: bytes=0-1\r\n"),
    "If-Match": get(fields='If-Match: "v1"\r\n'),
    "If-Unmodified-Since": get(fields=f"If-Unmodified-Since: {formatdate(NOW, usegmt=True)}\r\n"),
    "a lower-case declined name": get(fields="cookie: id=1\r\n"),
}


@pytest.mark.parametrize("name", DECLINED)
async def test_the_compiled_path_declines_what_is_not_a_plain_hit(name):
    pair = Pair(**{"server.max_url_length": 100, "server.max_header_size": 200})
    for path, host in (("/a", HOST), (LONG, HOST), ("/a", "other.test")):
        pair.store(path, b"x" * 100, DATED, host=host)
    pair.warm(get())
    before = pair.compiled.engine.stats()
    assert pair.compiled.plain_hits.answer(pair.parse(DECLINED[name]), "", "") is None
    assert pair.compiled.engine.stats() == before and pair.compiled.plain_hits.answered == 0


@pytest.mark.parametrize(
    ("name", "headers", "status"),
    [
        ("stale", [("Cache-Control", "max-age=5"), ("Date", formatdate(NOW, usegmt=True))], 200),
        ("no-cache", [("Cache-Control", "max-age=600, no-cache")], 200),
        ("a status without a plain body", DATED, 204),
    ],
)
async def test_the_compiled_path_declines_an_entry_the_rules_must_judge(name, headers, status):
    pair = Pair()
    pair.store("/a", b"xy", headers, status)
    pair.warm(get())
    pair.now = NOW + 10
    before = pair.compiled.engine.stats()
    assert pair.compiled.plain_hits.answer(pair.parse(get()), "", "") is None
    assert pair.compiled.engine.stats() == before


async def test_a_plain_request_for_a_url_with_nothing_stored_is_declined_as_a_miss():
    # False: no answerer can answer it as a hit, so the proxy need not ask answer_hit.
    pair = Pair()
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get())
    before = pair.compiled.engine.stats()
    compiled, python = pair.answers(get("/nothing"))
    assert compiled is False and python is None
    assert pair.compiled.engine.stats() == before == pair.python.engine.stats()
    # Stored but stale: the rules judge it, so None.
    pair.now = NOW + 601
    assert pair.compiled.plain_hits.answer(pair.parse(get()), "", "") is None


async def test_the_compiled_path_declines_an_entry_until_its_head_is_rendered():
    pair = Pair()
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get("/b"))  # the Host is known; /a's head is not rendered yet
    assert pair.compiled.plain_hits.answer(pair.parse(get()), "", "") is None
    assert pair.compiled.engine.stats()["hits"] == 0


async def test_the_compiled_path_declines_a_url_with_variants():
    pair = Pair()
    pair.store("/a", b"x" * 100, [*DATED, ("Vary", "Accept-Encoding")])
    pair.warm(get())
    assert pair.compiled.plain_hits.answer(pair.parse(get()), "", "") is None


async def test_the_hosts_the_compiled_path_knows_are_bounded():
    pair = Pair()
    proxy = pair.compiled
    for i in range(1500):
        proxy.answer_hit(pair.parse(f"GET /a HTTP/1.1\r\nHost: h{i}.test\r\n\r\n".encode()), "", "")
    assert len(proxy._routed_hosts) == 1024
