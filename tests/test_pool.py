"""The origin pool of bodiless GET and HEAD requests (``proxy.origin.pool``), against origins that
speak raw bytes on real sockets: connections reused and bounded, closed when their response
was not read to its end, timeouts as the session's client keeps them."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import read_request, until

from proxy.config.settings import load
from proxy.core._native import field_lines
from proxy.origin.pool import OriginPool, Unreachable

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture
def pool() -> Iterator[Callable[..., OriginPool]]:
    """Pools made with ``[upstream]`` settings, closed when the test ends."""
    made: list[OriginPool] = []

    def make(**settings: object) -> OriginPool:
        overrides = {"upstream.origin": "http://127.0.0.1:9"}
        overrides.update({f"upstream.{k}": v for k, v in settings.items()})
        made.append(OriginPool(load(env={}, overrides=overrides).upstream))
        return made[-1]

    yield make
    for p in made:
        p.close()


class Counting:
    """A raw origin that answers every request on a connection with ``answer`` (or its parts,
    each apart from the last by 50 ms), counting connections and the most open at once."""

    def __init__(self, answer: bytes | tuple[bytes, ...] = OK, delay: float = 0.0) -> None:
        self.answer = answer
        self.delay = delay
        self.connections = self.open = self.most_open = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while await read_request(reader):
                await asyncio.sleep(self.delay)
                parts = self.answer if isinstance(self.answer, tuple) else (self.answer,)
                for i, part in enumerate(parts):
                    await asyncio.sleep(0.05 if i else 0)
                    writer.write(part)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1


async def get(p: OriginPool, url: str, method: str = "GET") -> tuple[int, bytes]:
    async with await p.request(method, url, [("X-Test", "1")]) as response:
        return response.status, await response.content.read()


async def test_sequential_requests_share_one_kept_alive_connection(raw_origin, pool):
    origin = Counting()
    url = await raw_origin(origin)
    p = pool()
    for i in range(5):
        assert await get(p, f"{url}/{i}") == (200, b"ok")
    assert origin.connections == 1


async def test_connections_in_use_are_bounded_and_later_requests_wait(raw_origin, pool):
    origin = Counting(delay=0.05)
    url = await raw_origin(origin)
    p = pool(max_connections=2)
    results = await asyncio.gather(*(get(p, f"{url}/{i}") for i in range(8)))
    assert results == [(200, b"ok")] * 8
    assert origin.most_open == 2


async def test_a_waiter_cancelled_as_it_is_woken_passes_the_connection_on(raw_origin, pool):
    release = asyncio.Event()

    async def first_body_held(reader, writer):
        head = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no")
        await writer.drain()
        if head.startswith(b"GET /a "):
            await release.wait()
        writer.write(b"k")
        while await read_request(reader):
            writer.write(OK)

    url = await raw_origin(first_body_held)
    p = pool(max_connections=1)
    holder = await p.request("GET", f"{url}/a", [])
    second = asyncio.create_task(get(p, f"{url}/b"))
    third = asyncio.create_task(get(p, f"{url}/c"))
    await until(lambda: len(p._waiting) == 2)  # both wait for the one connection
    assert p._in_use == 1
    release.set()
    assert await holder.content.read() == b"ok"  # released: the second is woken...
    second.cancel()  # ...and cancelled before it runs
    assert await asyncio.wait_for(third, 2) == (200, b"ok")
    assert p._in_use == 0


async def test_a_wait_for_a_free_connection_ends_at_the_total_timeout(raw_origin, pool):
    release = asyncio.Event()

    async def first_body_held(reader, writer):
        while head := await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no")
            await writer.drain()
            if head.startswith(b"GET /a "):
                await release.wait()
            writer.write(b"k")

    url = await raw_origin(first_body_held)
    p = pool(max_connections=1, total_timeout=0.4)
    holder = await p.request("GET", f"{url}/a", [])  # holds the one connection
    # As a request that took the connection after this one began to wait would: it is in use
    # past the waiter's deadline.
    (exchange,) = p._exchanges
    exchange.deadline = math.inf
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError, match="waiting for a free connection"):
        await asyncio.wait_for(get(p, f"{url}/b"), 5)
    waited = asyncio.get_running_loop().time() - started
    # The deadline, within the sweep's tick (and uvloop's clock, of millisecond grain).
    assert 0.4 - 1e-3 <= waited < 1.5
    assert p._waiting == [] and p._in_use == 1  # the holder's connection alone is in use
    release.set()
    assert await holder.content.read() == b"ok"
    holder.close()
    assert await get(p, f"{url}/c") == (200, b"ok")  # the connection was not lost
    assert p._in_use == 0


async def test_a_response_not_read_to_its_end_closes_its_connection(raw_origin, pool):
    connections = 0

    async def body_in_two_parts(reader, writer):
        nonlocal connections
        connections += 1
        while await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst")
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(b"-last")
            await writer.drain()

    url = await raw_origin(body_in_two_parts)
    p = pool()
    response = await p.request("GET", f"{url}/a", [])
    response.close()  # half the body is still to come: the connection cannot carry another
    assert await get(p, f"{url}/b") == (200, b"first-last")
    assert connections == 2
    assert await get(p, f"{url}/c") == (200, b"first-last")
    assert connections == 2  # read to its end: kept


async def test_a_body_without_a_length_ends_with_the_connection(raw_origin, pool):
    async def http10(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    url = await raw_origin(http10)
    p = pool()
    assert await get(p, f"{url}/a") == (200, b"until the end")
    assert p._idle == {}


async def test_a_head_response_has_no_body_and_keeps_its_connection(raw_origin, pool):
    origin = Counting(answer=b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
    url = await raw_origin(origin)
    p = pool()
    for _ in range(2):
        async with await p.request("HEAD", f"{url}/a", []) as response:
            assert response.content_length == 50 and await response.content.read() == b""
    assert origin.connections == 1


async def test_gets_and_heads_in_turn_on_one_connection_are_each_parsed_as_their_own(
    raw_origin, pool
):
    connections = 0

    async def by_method(reader, writer):
        nonlocal connections
        connections += 1
        while head := await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
            if head.startswith(b"GET"):
                writer.write(b"hello")
            await writer.drain()

    url = await raw_origin(by_method)
    p = pool()
    methods = ["GET", "HEAD", "HEAD", "GET", "GET", "HEAD", "GET"]
    got = [await get(p, f"{url}/a", method) for method in methods]
    assert got == [(200, b"hello" if method == "GET" else b"") for method in methods]
    assert connections == 1


async def test_total_timeout_ends_a_body_that_keeps_trickling(raw_origin, pool):
    async def trickles(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(100):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)  # never silent for the read timeout

    url = await raw_origin(trickles)
    p = pool(total_timeout="400ms", read_timeout="5s")
    response = await p.request("GET", f"{url}/a", [])
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(5):
            await response.content.read()
    response.close()


async def test_read_timeout_fires_once_due_and_within_a_tick_of_it(raw_origin, pool):
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    url = await raw_origin(silent)
    p = pool(read_timeout="300ms")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await p.request("GET", f"{url}/a", [])
    waited = loop.time() - started
    # The sweep runs every eighth of the shortest timeout: never early, at most a tick late.
    assert 0.3 <= waited < 0.3 + 0.3 / 8 + 0.5


async def test_nothing_is_watched_once_the_requests_end(raw_origin, pool):
    origin = Counting()
    url = await raw_origin(origin)
    p = pool(read_timeout="200ms")
    await asyncio.gather(*(get(p, f"{url}/{i}") for i in range(20)))
    response = await p.request("GET", f"{url}/closed-early", [])
    response.close()
    assert p._exchanges == set()
    await asyncio.sleep(0.1)  # past one tick: the sweep saw nothing in flight and stopped
    assert p._ticker is None


async def test_an_origin_that_refuses_connections_is_unreachable(pool):
    p = pool()
    with pytest.raises(Unreachable):
        await p.request("GET", "http://127.0.0.1:9/a", [])
    assert p._in_use == 0


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/a", [("X-Test", "1\r\nX-Injected: 1")]),
        ("/a", [("Accept", "*/*"), ("X-Test", "1\nX-Injected: 1")]),
        ("/a", [("X-Test", "1\r")]),
        ("/a", [("X-Test\r\nX-Injected", "1")]),
        ("/a\r\nX-Injected: 1", []),
    ],
)
async def test_a_field_carrying_a_line_of_its_own_is_refused(raw_origin, pool, path, fields):
    origin = Counting()
    url = await raw_origin(origin)
    p = pool()
    with pytest.raises(ValueError, match="newline"):
        await p.request("GET", f"{url}{path}", fields)
    assert origin.connections == 0


def test_field_lines_are_written_as_given():
    rng = random.Random(5)
    names = ["Accept", "X-Caf\u00e9", "x-a", "", "Via"]
    values = ["", "*/*", "caf\u00e9", "caf\udce9", " a, b ", "\t1"]
    for _ in range(2000):
        fields = [(rng.choice(names), rng.choice(values)) for _ in range(rng.randrange(6))]
        assert field_lines(fields) == "".join(f"{k}: {v}\r\n" for k, v in fields)


@pytest.mark.parametrize("text", ["a", "caf\u00e9", "caf\udce9", "\U0001f600"])  # each kind
@pytest.mark.parametrize("brk", ["\r", "\n"])
def test_field_lines_refuse_a_line_break_in_a_name_or_value_of_any_string_kind(text, brk):
    assert field_lines([("X-A", text)]) == f"X-A: {text}\r\n"
    for at in (0, len(text)):
        broken = text[:at] + brk + text[at:]
        assert field_lines([("X-A", broken)]) is None
        assert field_lines([(broken, "1")]) is None


async def test_a_response_nobody_asked_for_closes_its_idle_connection(raw_origin, pool):
    connections = 0

    async def answers_then_adds_one(reader, writer):
        nonlocal connections
        connections += 1
        first = True
        while await read_request(reader):
            writer.write(OK)
            if first:
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
                first = False

    url = await raw_origin(answers_then_adds_one)
    p = pool()
    assert await get(p, f"{url}/a") == (200, b"ok")
    await asyncio.sleep(0.2)  # the unasked response arrives while the connection is idle
    assert await get(p, f"{url}/b") == (200, b"ok")
    assert connections == 2


async def test_a_response_glued_after_the_answer_is_never_served_to_the_next_request(
    raw_origin, pool
):
    origin = Counting(answer=OK + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
    url = await raw_origin(origin)
    p = pool()
    for path in ("a", "b", "c"):
        assert await get(p, f"{url}/{path}") == (200, b"ok")
    assert origin.connections == 3


@pytest.mark.parametrize(
    "stray",
    [
        b"HTTP/1.1 302 Found\r\nLocation: /evil\r\nCache-Control: max-age=999\r\nX-Junk: ",
        b"H",
        b"\r\nHTTP/1.1 302 Found\r\n",
    ],
    ids=["forged-head-in-part", "one-byte", "crlf-then-a-head"],
)
async def test_bytes_past_the_content_length_close_the_connection_and_never_reach_the_next(
    raw_origin, pool, stray
):
    """The answer is served whole; what came after it in the same read, a response begun
    that nobody asked for, never meets the next request's (the connection closes)."""
    origin = Counting(answer=OK + stray)
    url = await raw_origin(origin)
    p = pool()
    for path in ("a", "b", "c"):
        assert await get(p, f"{url}/{path}") == (200, b"ok")
    assert origin.connections == 3


async def test_bytes_past_a_body_that_came_after_its_head_close_the_connection(raw_origin, pool):
    # The body arrives while the answer is being read, with a response begun after it.
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
    origin = Counting(answer=(head, b"okHTTP/1.1 302 Found\r\nLocation: /evil\r\nX-Junk: "))
    url = await raw_origin(origin)
    p = pool()
    for path in ("a", "b"):
        assert await get(p, f"{url}/{path}") == (200, b"ok")
    assert origin.connections == 2


async def test_total_timeout_ends_the_wait_for_a_head(raw_origin, pool):
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    url = await raw_origin(silent)
    p = pool(total_timeout="300ms", read_timeout="5s")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await p.request("GET", f"{url}/a", [])
    assert 0.3 <= loop.time() - started < 0.3 + 0.5
    assert p._in_use == 0


async def test_the_read_timeout_does_not_count_a_pause_the_reader_made(raw_origin, pool):
    body = b"x" * (1 << 20)  # far past the body stream's buffer: reading pauses

    async def sends_at_once(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        await asyncio.sleep(10)

    url = await raw_origin(sends_at_once)
    p = pool(read_timeout="200ms")
    async with await p.request("GET", f"{url}/a", []) as response:
        await asyncio.sleep(0.6)  # three read timeouts, with the origin done and waiting
        assert await response.content.read() == body


@contextlib.contextmanager
def threaded_origin(
    answer: Callable[[socket.socket, bool], None],
) -> Iterator[tuple[str, list[socket.socket]]]:
    """A raw origin on threads of its own, so that it sends while the event loop is busy:
    each connection answered by ``answer(conn, first)`` (``first``: the first connection).
    Its URL and the connections it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    connections: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            connections.append(conn)
            first = len(connections) == 1
            threading.Thread(target=answered, args=(conn, first), daemon=True).start()

    def answered(conn: socket.socket, first: bool) -> None:
        with contextlib.suppress(OSError):  # the test closes the connections under it
            answer(conn, first)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", connections
    finally:
        server.close()
        for conn in connections:
            conn.close()


async def test_a_response_waiting_unread_in_the_socket_is_never_taken_for_the_next_answer(pool):
    """The origin sends an unasked response 30 ms after an answer; the event loop has not
    read it yet when the next request would go on the connection (it is busy): the
    connection is checked before reuse, and closed, and the request goes on a new one."""

    def answer(conn: socket.socket, first: bool) -> None:
        while conn.recv(65536):
            conn.sendall(OK)
            if first:
                time.sleep(0.03)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
                first = False

    with threaded_origin(answer) as (url, connections):
        p = pool()
        try:
            assert await get(p, f"{url}/a") == (200, b"ok")
            time.sleep(0.2)  # the loop is busy: the unasked bytes wait unread in the socket
            assert await get(p, f"{url}/b") == (200, b"ok")
            assert len(connections) == 2
        finally:
            p.close()
            await asyncio.sleep(0)  # the transports close on the loop that runs them


async def test_a_response_sent_before_the_request_on_a_new_connection_is_never_its_answer(pool):
    """An origin that answers as soon as it accepts, before any request was written on the
    connection (a hostile or broken one): those bytes are no request's answer. The
    connection is closed and counted, and the request goes on a new one."""

    forged = threading.Event()

    def answer(conn: socket.socket, first: bool) -> None:
        if first:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforged")
            forged.set()
        while conn.recv(65536):
            conn.sendall(OK)

    with threaded_origin(answer) as (url, connections):
        p = pool()
        # Each new connection waits, before its request goes, until the forged bytes were
        # sent on the first: they are in its socket first, as a hostile origin would have it.
        real = p._connect

        async def slowly(address, deadline):
            protocol = await real(address, deadline)
            assert forged.wait(5)
            time.sleep(0.01)  # from the origin's send to this socket: loopback, no more
            return protocol

        p._connect = slowly
        try:
            assert await get(p, f"{url}/a") == (200, b"ok")
            assert len(connections) == 2 and p.unasked == 1
        finally:
            p.close()
            await asyncio.sleep(0)
