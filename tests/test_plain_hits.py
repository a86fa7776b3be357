"""The compiled plain hit (``Proxy.plain_hits``, ``proxy/handler/hitpath/``): for every request it
answers, the bytes ``Proxy.answer_hit`` would write and the counts ``CacheEngine.lookup`` would
make; every other request it declines, counting nothing.

Each test drives two proxies over engines in the same state and on the same clock: one asks
the compiled answer, the other ``answer_hit`` (Python), and they must agree."""

from __future__ import annotations

import asyncio
import inspect
from email.utils import formatdate

import pytest
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.http_parser import SINGLETON_HEADERS, HttpRequestParser, HttpRequestParserPy
from aiohttp.streams import EMPTY_PAYLOAD
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config.settings import load
from proxy.core.events import FETCH_WHOLE, RequestMeta
from proxy.core.responses import response_meta
from proxy.front.fastpath import HitServer
from proxy.handler.hits import Planned
from proxy.handler.routing import hosts
from proxy.handler.server import Proxy
from proxy.ops.service import build_engine
from proxy.origin.upstream import Upstream

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
        """(compiled answer, Python answer) to ``request``, each None when it declined; a
        first ``answer_hit`` on each proxy has rendered the entry's head and made its Host
        known, as a live proxy's first hit does. A request the compiled answer declines is
        then planned on its proxy as a live one plans it (``answer_hit``, which the lane
        carries out), so that both engines have counted it."""
        message = self.parse(request)
        compiled = self.compiled.plain_hits.answer(message, "127.0.0.1", "http")
        if type(compiled) is not tuple:
            self.compiled.answer_hit(message, "127.0.0.1", "http")
        python = self.python.answer_hit(message, "127.0.0.1", "http")
        return (
            compiled if type(compiled) is tuple else None,
            python if type(python) is tuple else None,
        )

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
    message = pair.parse(get("/nothing"))
    assert pair.compiled.plain_hits.answer(message, "", "") is False
    assert pair.compiled.engine.stats() == before
    # The Python answerer routes and plans it, as the handler would (a miss, counted once),
    # and hands the plan to the lane, which carries it out.
    python = pair.python.answer_hit(message, "", "")
    assert type(python) is Planned and python.action is FETCH_WHOLE
    assert python.url == "http://127.0.0.1:9/nothing"
    after = pair.python.engine.stats()
    assert (after["requests"], after["misses"], after["hits"]) == (
        before["requests"] + 1, before["misses"] + 1, before["hits"],
    )  # fmt: skip
    # Stored but stale: the rules judge it, so None.
    pair.now = NOW + 601
    assert pair.compiled.plain_hits.answer(pair.parse(get()), "", "") is None


async def test_the_compiled_path_declines_an_entry_until_its_head_is_rendered():
    pair = Pair()
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get("/b"))  # the Host is known; /a's head is not rendered yet
    assert pair.compiled.plain_hits.answer(pair.parse(get()), "", "") is None
    assert pair.compiled.engine.stats()["hits"] == 0


async def test_rfc9111_4_3_4_a_head_rendered_before_a_304_refresh_is_rendered_again_on_both_paths():
    pair = Pair()
    pair.store("/a", b"x" * 100, [*DATED, ("ETag", '"v1"')])
    pair.warm(get())
    for proxy in (pair.compiled, pair.python):
        entry = next(iter(proxy.engine.store.by_hash.values()))
        proxy.engine.on_not_modified(entry, [("ETag", '"v2"'), ("X-Fresh", "yes")], NOW, NOW)
    # Rendered from the old fields: the compiled path declines; the Python one renders anew.
    assert pair.compiled.plain_hits.answer(pair.parse(get()), "", "") is None
    pair.warm(get())
    compiled, python = pair.answers(get())
    assert compiled is not None and compiled == python
    assert b'ETag: "v2"\r\n' in compiled[0] and b"X-Fresh: yes\r\n" in compiled[0]
    assert b'"v1"' not in compiled[0]


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
    assert len(proxy.hits.routed_hosts) == 1024


# Requests read from their bytes (``PlainHits.answer_bytes``): the same answers and counts as
# from aiohttp's parsed message, and nothing but whole plain requests taken.


@pytest.mark.parametrize(
    "fields",
    ["", "User-Agent: wrk\r\nAccept: */*\r\n", "Connection: keep-alive\r\n",
     "X-Tab:\tvalue \t\r\nX-Empty:\r\n", "Accept-Encoding: gzip, br\r\nX-Odd: a:b;c=d\r\n"],
)  # fmt: skip
@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_hit_read_from_its_bytes_is_the_answer_to_its_parsed_message(method, fields):
    pair = Pair()
    path = "/a?b=1&c=%2F:@!$'()*+,;="
    pair.store(path, b"x" * 1024, DATED)
    pair.warm(get(path))
    request = get(path, method, fields)
    pipelined = request + b"GET /next HTTP/1.1\r\n"  # what follows is not read
    found = pair.compiled.plain_hits.answer_bytes(pipelined, 0)
    parsed = pair.python.plain_hits.answer(pair.parse(request), "", "")
    assert found is not None and found[0] == len(request) and found[1:] == parsed
    assert pair.compiled.engine.stats() == pair.python.engine.stats()
    # Read from where the bytes before it end, as a second pipelined request is.
    found = pair.compiled.plain_hits.answer_bytes(b"padding" + request, 7)
    assert found is not None and found[0] == 7 + len(request)


async def test_a_whole_plain_request_that_is_no_hit_is_measured_for_the_parser():
    pair = Pair()
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get())
    answer_bytes = pair.compiled.plain_hits.answer_bytes
    before = pair.compiled.engine.stats()
    nothing = get("/nothing")
    assert answer_bytes(nothing, 0) == (len(nothing), False)  # nothing stored: the lane's
    cookie = get(fields="Cookie: id=1\r\n")
    assert answer_bytes(cookie, 0) == (len(cookie), None)  # the Python rules judge it
    assert pair.compiled.engine.stats() == before


# Not one whole plain request: aiohttp's parser is to read each of these, and judge it.
NOT_WHOLE_AND_PLAIN = {
    "a head not yet ended": get()[:-2],
    "a request line in part": b"GET /a HTT",
    "HTTP/1.0": get(version="1.0"),
    "POST": get(method="POST"),
    "a lower-case method": get(method="get"),
    "two spaces": b"GET  /a HTTP/1.1\r\nHost: example.test\r\n\r\n",
    "an absolute target": b"GET http://example.test/a HTTP/1.1\r\nHost: example.test\r\n\r\n",
    "a fragment": get("/a#top"),
    "a byte not ASCII in the target": get("/caf\u00e9"),
    "a byte not ASCII in a value": get(fields="X-Name: caf\u00e9\r\n"),
    "a control byte in a value": get(fields="X-Odd: a\x01b\r\n"),
    "a NUL in a value": get(fields="X-Odd: a\x00b\r\n"),
    "a bare LF": b"GET /a HTTP/1.1\nHost: example.test\n\n",
    "a bare LF ending a field": b"GET /a HTTP/1.1\r\nHost: example.test\nX: y\r\n\r\n",
    "a space before the colon": get(fields="X-Pad : 1\r\n"),
    "a folded line": get(fields="X-Fold: a\r\n b\r\n"),
    "an empty name": get(fields=": value\r\n"),
    "no Host": b"GET /a HTTP/1.1\r\nAccept: */*\r\n\r\n",
    "two Hosts": get(fields="Host: example.test\r\n"),
    "Content-Length: 0": get(fields="Content-Length: 0\r\n"),
    "Content-Length and Transfer-Encoding": get(
        fields="Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"
    ),
    "Transfer-Encoding": get(fields="Transfer-Encoding: chunked\r\n"),
    "Connection: close": get(fields="Connection: close\r\n"),
    "Connection naming another field": get(fields="Connection: keep-alive, x-secret\r\n"),
    "Upgrade": get(fields="Connection: upgrade\r\nUpgrade: websocket\r\n"),
    "Expect": get(fields="Expect: 100-continue\r\n"),
    "a leading blank line": b"\r\n" + get(),
    # aiohttp's parser refuses a second of these (400), and reads Proxy-Connection as
    # Connection: the parser's to judge, so the answer never depends on what is stored.
    "two Content-Types": get(fields="Content-Type: a\r\nContent-Type: b\r\n"),
    "two ETags": get(fields='ETag: "a"\r\nEtag: "b"\r\n'),
    "two Content-Ranges": get(fields="Content-Range: bytes 0-1/2\r\nContent-Range: x\r\n"),
    "two User-Agents": get(fields="User-Agent: a\r\nuser-agent: b\r\n"),
    "Proxy-Connection: close": get(fields="Proxy-Connection: close\r\n"),
    "Proxy-Connection: keep-alive": get(fields="Proxy-Connection: keep-alive\r\n"),
    "more fields than it reads": get(fields="X-F: 1\r\n" * 100),
    "a URL over the limit": get(LONG),
    "fields over the limit": get(fields=f"X-Big: {'b' * 300}\r\n"),
}


@pytest.mark.parametrize("name", NOT_WHOLE_AND_PLAIN)
async def test_what_is_not_one_whole_plain_request_is_left_to_aiohttps_parser(name):
    pair = Pair(**{"server.max_url_length": 100, "server.max_header_size": 200})
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get())
    before = pair.compiled.engine.stats()
    assert pair.compiled.plain_hits.answer_bytes(NOT_WHOLE_AND_PLAIN[name], 0) is None
    assert pair.compiled.engine.stats() == before and pair.compiled.plain_hits.answered == 0


# aiohttp's parser refuses a second of each of these (Host, Content-Length and
# Transfer-Encoding have cases of their own above).
_SINGLETONS = sorted(SINGLETON_HEADERS - {"host", "content-length", "transfer-encoding"})


@pytest.mark.parametrize("name", _SINGLETONS)
async def test_a_request_with_a_field_aiohttp_takes_once_sent_twice_is_left_to_its_parser(name):
    pair = Pair()
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get())
    twice = get(fields=f"{name}: a\r\n{name.upper()}: b\r\n")
    with pytest.raises(BadHttpMessage):
        pair.parser.feed_data(twice)
    assert pair.compiled.plain_hits.answer_bytes(twice, 0) is None
    assert pair.compiled.plain_hits.answer_bytes(get(fields=f"{name}: a\r\n"), 0) is not None


async def test_the_most_fields_read_from_bytes_are_within_what_the_fronts_parser_reads():
    """The compiled reader takes a request of at most so many fields; the front's parser
    (``HitServer``'s ``max_headers``) must read every request it takes."""
    pair = Pair()
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get())
    taken = [n for n in range(1, 200)
             if pair.compiled.plain_hits.answer_bytes(get(fields="X-F: 1\r\n" * n), 0)]  # fmt: skip
    most = max(taken)
    assert taken == list(range(1, most + 1))
    limit = inspect.signature(HitServer).parameters["max_headers"].default
    parser = HttpRequestParser(_Protocol(), asyncio.get_running_loop(), 2**16, max_headers=limit)
    [(message, _)], _, _ = parser.feed_data(get(fields="X-F: 1\r\n" * most))
    assert len(message.raw_headers) == most + 1


async def test_the_callables_the_compiled_path_calls_are_never_unset():
    pair = Pair()
    plain = pair.compiled.plain_hits
    for name in ("whatif", "observe", "admit", "promotion_admit"):
        with pytest.raises(TypeError):
            delattr(plain, name)
        with pytest.raises(TypeError):
            setattr(plain, name, 3)
        setattr(plain, name, None)
        assert getattr(plain, name) is None
    pair.store("/a", b"x" * 100, DATED)
    pair.warm(get())
    assert type(plain.answer_bytes(get(), 0)[1]) is bytes


# Mostly what a plain request holds, with bytes the parse must not take mixed in.
_TARGET = st.text(alphabet="abcXYZ019-._~!$&'()*+,;=:@/?%" + ' #"<>^`{|}\x7f\u00e9', max_size=40)
_NAME = st.text(alphabet="abcXYZ019!#$%&'*+-.^_`|~" + ' :()"\u00e9', max_size=12) | st.sampled_from(
    ["Content-Type", "ETag", "Content-Range", "User-Agent", "Server", "Proxy-Connection"]
)
_VALUE = st.text(alphabet='abc XYZ\t019!"#:;<=>?@[\\]^_`{|}~,' + "\x01\x7f\u00e9", max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    method=st.sampled_from(["GET", "HEAD"]),
    target=_TARGET,
    fields=st.lists(st.tuples(_NAME, _VALUE), max_size=6),
)
def test_every_request_read_from_its_bytes_is_one_aiohttps_parser_reads_the_same(
    method, target, fields
):
    async def check() -> None:
        pair = Pair()
        request = (
            f"{method} /{target} HTTP/1.1\r\nHost: {HOST}\r\n"
            + "".join(f"{name}:{value}\r\n" for name, value in fields)
            + "\r\n"
        ).encode()
        found = pair.compiled.plain_hits.answer_bytes(request + b"GET", 0)
        try:
            messages, _, _ = pair.parser.feed_data(request)
        except Exception:
            messages = None
        if found is None:
            return  # left to the parser, which judges it
        # Taken: the strict parser takes the same bytes as one request, with the same
        # method, target and fields, keeping the connection open.
        assert found[0] == len(request) and messages is not None and len(messages) == 1
        message, payload = messages[0]
        assert (message.method, message.path) == (method, f"/{target}")
        assert not message.should_close and not message.upgrade and not message.chunked
        assert payload is EMPTY_PAYLOAD
        lines = (f"{name}:{value}".partition(":") for name, value in fields)
        sent = [("Host", HOST), *((name, value.strip(" \t")) for name, _, value in lines)]
        assert [(k.decode(), v.decode()) for k, v in message.raw_headers] == sent

    asyncio.run(check())


@settings(max_examples=200, deadline=None)
@given(
    max_age=st.integers(0, 10**7),
    arrived_age=st.integers(0, 10**7),
    elapsed=st.one_of(st.floats(-1e4, 2e7, allow_nan=False), st.integers(-5, 10**7)),
)
def test_the_compiled_age_and_freshness_are_the_cores(max_age, arrived_age, elapsed):
    """``proxy/core/native/age.h`` against ``Entry.age`` and ``CacheEngine._fresh``: the same
    hits answered, with the same Age and ttl, at every age, clock steps back included."""

    async def check() -> None:
        pair = Pair()
        headers = [("Cache-Control", f"max-age={max_age}"), ("Age", str(arrived_age)),
                   ("Date", formatdate(NOW, usegmt=True))]  # fmt: skip
        pair.store("/a", b"x" * 100, headers)
        pair.warm(get())
        pair.now = NOW + elapsed
        compiled, python = pair.answers(get())
        assert compiled == python
        assert pair.compiled.engine.stats() == pair.python.engine.stats()

    asyncio.run(check())


@pytest.mark.parametrize("host", ["example.test", "EXAMPLE.test", "example.test:80",
                                  "example.test:8080", "[::1]:8080", "127.0.0.1"])  # fmt: skip
async def test_the_compiled_path_keys_a_host_as_the_router_keys_it(host):
    """One key: ``Router.key`` (``key_origin`` and the keyed target), which the compiled path
    joins from the same two parts for every spelling of a Host."""
    pair = Pair()
    key = pair.python.router.key(hosts(host), "/a")
    for proxy in (pair.compiled, pair.python):
        meta = RequestMeta(key, "GET", ())
        response = response_meta(meta, 200, DATED, pair.now, pair.now, payload=b"k")
        decision = proxy.engine.on_response_head(meta, response, 1, pair.now)
        proxy.engine.finish(meta, decision, 1, pair.now, payload=b"k")
    request = f"GET /a HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    pair.warm(request)
    compiled, python = pair.answers(request)
    assert compiled is not None and compiled == python
