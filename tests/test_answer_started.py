"""A request knows whether its answer has begun: a failure after that closes the connection
(logged and counted), and never writes a second status line the client would read as the
answer to its next request (RFC 9112 section 9.3: responses answer requests in order)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy.config.logs import HTTP_ERRORS, OneLineEvery
from proxy.ops.service import Service

BIG = bytes(range(256)) * 1024  # 256 KiB: streamed, not written with its head


async def read_all(service: Service, request: bytes) -> bytes:
    """Every byte the proxy sends back on one connection for ``request`` (pipelined
    requests), until it closes the connection or goes quiet."""
    host, port = service.proxy_address
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        got = b""
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(1 << 20), 2)
            except TimeoutError:
                return got
            if not chunk:
                return got + b"<closed>"
            got += chunk
    finally:
        writer.close()


def two_gets(path: str, http10: bool = False) -> bytes:
    if http10:
        one = f"GET {path}{{}} HTTP/1.0\r\nHost: example.test\r\nConnection: keep-alive\r\n\r\n"
    else:
        one = f"GET {path}{{}} HTTP/1.1\r\nHost: example.test\r\n\r\n"
    return (one.format("?a") + one.format("?b")).encode()


SHAPES = {
    # A small miss written whole as its response arrives (``PendingMiss``).
    "written at once": ({}, b"small body", False),
    # A miss relayed as its body arrives.
    "streamed": ({}, BIG, False),
    # Through aiohttp's request handler (HTTP/1.0 keep-alive is handed over).
    "aiohttp's handler": ({}, b"small body", True),
    # With a disk tier, which takes every response at its head.
    "with a disk tier": (
        {"disk__size": "4MiB", "disk__region_size": "1MiB", "disk__policy": "always"},
        b"small",
        False,
    ),
    # A slice miss.
    "sliced": ({"cache__slice_size": "64KiB"}, BIG, False),
}


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_failure_after_the_answer_began_closes_the_connection_never_a_second_status(
    origin, start_proxy, caplog, monkeypatch, tmp_path, shape
):
    overrides, body, http10 = SHAPES[shape]
    if "disk__size" in overrides:
        overrides = {**overrides, "disk__path": str(tmp_path / "disk")}
    monkeypatch.setattr(HTTP_ERRORS, "filters", [OneLineEvery()])
    origin.set("/p", body=body, headers={"Cache-Control": "max-age=60"})
    service = await start_proxy(**overrides)
    engine = service.proxy.engine
    real = engine.finish
    failures = []

    def fails_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise RuntimeError("a bug after the answer went out")
        return real(*args, **kwargs)

    engine.finish = fails_once
    with caplog.at_level(logging.ERROR, logger="onehit.http"):
        got = await read_all(service, two_gets("/p", http10))
    assert failures, "the failure was never reached"
    assert got.count(b"HTTP/1.") == 1, got[:300]
    assert got.startswith((b"HTTP/1.1 200 ", b"HTTP/1.0 200 "))
    assert got.endswith(b"<closed>")
    answer = got[: -len(b"<closed>")]
    assert answer.endswith(body) or b"Transfer-Encoding: chunked" in answer
    assert b"500" not in answer.split(b"\r\n", 1)[0]
    assert "after its answer began" in caplog.text
    assert service.proxy.answers_cut == 1
    # The proxy goes on: a new connection is answered.
    again = await read_all(
        service, b"GET /p?c HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"
    )
    assert again.startswith(b"HTTP/1.1 200 ") and again.count(b"HTTP/1.") == 1
