"""The compiled parser of plain origin responses against aiohttp's own (llhttp, as the pool's
client runs it): whatever the compiled one parses, aiohttp's parses the same, and the plain
answers most origins send are parsed."""

from __future__ import annotations

import asyncio
import random

import pytest

from proxy.config.settings import UpstreamSection
from proxy.origin._origin import parse_response
from proxy.origin.connection import response_parser
from proxy.wire.seam import FlowControl

PLAIN = [
    b'HTTP/1.1 200 OK\r\nCache-Control: max-age=3600\r\nETag: "b1"\r\nContent-Length: 5\r\n'
    b"Content-Type: text/plain\r\nDate: Tue, 01 Dec 2026 14:39:32 GMT\r\n\r\nhello",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 \r\nContent-Length: 2\r\nX-Empty:\r\nX-Spaced: \t a b \t\r\n\r\nok",
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\ncontent-length: 3\r\n\r\nbad",
    b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 1\r\n"
    b"X-Name: caf\xc3\xa9 \xe9\x80\xff\r\nVary: Accept-Encoding\r\n\r\n!",
    b"HTTP/1.1 301 Moved Permanently\r\nLocation: /x?y=1&z=%20\r\nContent-Length: 3\r\n"
    b"X-Token: !#$%&'*+-.^_`|~\r\n\r\n/x\n",
]

# Each is parsed by aiohttp's parser, but not plain or not whole: declined, for it to parse.
DECLINED = {
    "HTTP/1.0": b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "204": b"HTTP/1.1 204 No Content\r\n\r\n",
    "304": b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    "no length": b"HTTP/1.1 200 OK\r\n\r\nx",
    "length with a space after": b"HTTP/1.1 200 OK\r\nContent-Length: 1 \r\n\r\nx",
    "Connection": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
    "Proxy-Connection": b"HTTP/1.1 200 OK\r\nProxy-Connection: close\r\nContent-Length: 1\r\n\r\nx",
    "Upgrade": b"HTTP/1.1 200 OK\r\nUpgrade: h2c\r\nContent-Length: 1\r\n\r\nx",
    "body short": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nx",
    "bytes after": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n",
    "head only": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n",
    "bare LF": b"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
    "obs-fold": b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 1\r\n\r\nx",
    "a control byte": b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 1\r\n\r\nx",
    "space before the colon": b"HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\nx",
    "head over 8190 bytes": b"HTTP/1.1 200 OK\r\nX-A: "
    + b"a" * 5000
    + b"\r\nX-B: "
    + b"b" * 5000
    + b"\r\nContent-Length: 1\r\n\r\nx",
}

REFUSED = {
    "NUL in a value": b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 1\r\n\r\nx",
    "Sec-WebSocket-Key1": b"HTTP/1.1 200 OK\r\nSec-WebSocket-Key1: a\r\nContent-Length: 1\r\n\r\nx",
    "two lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
    "a field over 8190 bytes": b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 8200 + b"\r\n\r\n",
}

# Bytes a mutation inserts or puts in place of another: the ones parsers disagree on.
INTERESTING = b'\r\n\t :\x00\x01\x7f\x80\xff,;"=-0123456789Hh/. aAzZ'

# Lines a mutation inserts whole.
LINES = [b"Content-Length: 1\r\n", b"Connection: close\r\n", b"Transfer-Encoding: chunked\r\n",
         b"X-B: \r\n", b" x\r\n"]  # fmt: skip


def aiohttp_parse(data: bytes) -> tuple | None:
    """What aiohttp's response parser, made as the pool makes it, makes of ``data`` fed at
    once: (status, reason, fields, body, should_close, messages, upgraded, tail), or None when
    it refuses it."""
    loop = asyncio.new_event_loop()
    try:
        parser = response_parser(
            FlowControl(loop), loop, with_body=True, read_buffer=UpstreamSection().read_buffer
        )
        try:
            messages, upgraded, tail = parser.feed_data(data)
        except Exception:
            return None
        if not messages:
            return ("incomplete",)
        message, payload = messages[0]
        body = payload.read_nowait()
        return (
            message.code,
            message.reason,
            # As sent: aiohttp's headers spell the names it knows its own way.
            [(decode(k), decode(v)) for k, v in message.raw_headers],
            body if payload.is_eof() else ("unfinished", body),
            message.should_close,
            len(messages),
            upgraded,
            tail,
        )
    finally:
        loop.close()


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def compiled(data: bytes) -> tuple | None:
    parsed = parse_response(data)
    if parsed is None:
        return None
    status, reason, fields, head = parsed
    return (status, reason, fields, data[head:], False, 1, False, b"")


@pytest.mark.parametrize("data", PLAIN)
def test_plain_answers_are_parsed_as_aiohttp_parses_them(data: bytes) -> None:
    parsed = compiled(data)
    assert parsed is not None
    assert parsed == aiohttp_parse(data)


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_what_is_not_plain_or_not_whole_is_left_to_aiohttp(name: str) -> None:
    data = DECLINED[name]
    assert aiohttp_parse(data) is not None
    assert parse_response(data) is None


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_aiohttp_refuses_is_never_parsed(name: str) -> None:
    data = REFUSED[name]
    assert aiohttp_parse(data) is None
    assert parse_response(data) is None


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(out) + 1)
        kind = rng.randrange(5)
        if kind == 0:
            out[at:at] = bytes([rng.choice(INTERESTING)])
        elif kind == 1 and at < len(out):
            del out[at]
        elif kind == 2 and at < len(out):
            out[at] = rng.choice(INTERESTING)
        elif kind == 3:
            out[at:at] = rng.choice(LINES)
        elif at < len(out):
            out[at] = out[at] ^ 0x20  # flip case, or a byte into another
    return bytes(out)


def test_every_mutation_the_compiled_parser_takes_aiohttp_parses_the_same() -> None:
    rng = random.Random(20261201)
    taken = declined = 0
    for _ in range(20000):
        data = mutate(rng.choice(PLAIN), rng)
        parsed = compiled(data)
        if parsed is None:
            declined += 1
            continue
        taken += 1
        assert parsed == aiohttp_parse(data), data
    # Both kinds are many: the comparison ran, and the mutations reach what it declines.
    assert taken > 1000 and declined > 1000
