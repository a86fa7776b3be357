"""The origin client of requests to plain-HTTP origins whose body, if any, is in hand: aiohttp's
strict C response parser and body streams, driven by a small connection protocol of its own
over a keep-alive pool of its own. The ``ClientSession`` machinery around them cost a miss more
than everything else the proxy does for one, and aiohttp's ``ResponseHandler`` (a message
queue, a loop timer per read, a timer context per request) another tenth; its header writer
also drops field bytes that are not UTF-8. Requests whose body is still arriving (past
``[server] body_buffer_size``), and HTTPS origins, stay on the session.

Rules it keeps (its connections', in ``proxy.origin.connection``):

* The request is written as given: its request line, ``Host`` (the origin's, as the session
  sends it) and the fields the proxy forwards, byte for byte, nothing of a client library's
  own. A body goes with a ``Content-Length`` of its own length, in place of the client's.
* At most ``max_connections`` connections are in use at once (later requests wait for one); a
  connection goes back to the pool only once its response was read to the end and nothing
  says it must close, and an idle one is dropped after ``idle_timeout`` seconds.
* Timeouts as the session's ``ClientTimeout``: ``connect_timeout`` to connect, ``read_timeout``
  between reads, ``total_timeout`` from the request to the body's end. Each ends in a
  ``TimeoutError`` (the body's, in the body's stream). The read and total timeouts are checked
  by one sweep of the requests in flight, every eighth of the shorter one (at most a second),
  so each fires within that much after it is due (the session rounds a total timeout of 5 s or
  more up to the next second): a loop timer made and cancelled per request and per read cost
  about a tenth of a bare pass-through's time per miss.
* A request that fails on a pooled connection before any byte of an answer (the origin closed
  or reset it while idle) is sent once more on a new connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import EMPTY_PAYLOAD, ClientOSError, ServerDisconnectedError, StreamReader

from proxy.config.settings import UpstreamSection
from proxy.core._native import field_lines
from proxy.core.rfc9110 import digits
from proxy.origin.connection import Address, Fields, Interim, OriginConnection
from proxy.origin.health import OriginHealth
from proxy.wire.seam import FlowControl

log = logging.getLogger("onehit.upstream")


class Unreachable(Exception):
    """The origin could not be connected to; ``os_error`` says why."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class Sent:
    """A request ``OriginPool.send_now`` wrote, its answer not yet taken."""

    __slots__ = ("address", "exchange", "head", "method", "pool")

    def __init__(
        self, pool: OriginPool, address: Address, head: bytes, method: str, exchange: _Exchange
    ) -> None:
        self.pool = pool
        self.address = address
        self.head = head
        self.method = method
        self.exchange = exchange

    def offer(self, on_whole: Callable[[int, str, Fields, bytes], bool],
              on_other: Callable[[], None]) -> None:  # fmt: skip
        """Offer the answer to ``on_whole`` when it arrives whole and plain (True: taken; its
        connection is then ``whole``'s to release); else, or on a failure first, call
        ``on_other``, which takes it with ``OriginPool.resume``."""
        protocol = self.exchange.protocol
        assert protocol is not None
        protocol.on_whole = on_whole
        protocol.on_other = on_other

    def whole(self, status: int, reason: str, fields: Fields, body: bytes) -> OriginResponse:
        """The answer its connection offered whole."""
        self.pool.health.answered(self.address, self.method, status)
        return OriginResponse(self.pool, self.address, self.exchange, status, reason, fields,
                              EMPTY_PAYLOAD, body)  # fmt: skip

    def abandon(self) -> None:
        """Nobody will take the answer: the connection closes."""
        protocol = self.exchange.protocol
        assert protocol is not None
        protocol.on_whole = protocol.on_other = None
        protocol.close()
        self.pool._ended(self.exchange)


class _Exchange:
    """A request in flight: its total deadline, its wait for a free connection while it
    waits, and its connection once it has one."""

    __slots__ = ("deadline", "protocol", "waiter")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.protocol: OriginConnection | None = None
        self.waiter: asyncio.Future[None] | None = None


class OriginResponse:
    """An origin response whose head has arrived: what the proxy reads of one, as aiohttp's
    ``ClientResponse`` offers it, but for its fields: ``fields``, (name, value) pairs as sent.
    Closing it before its body's end drops the connection."""

    def __init__(
        self,
        pool: OriginPool,
        address: Address,
        exchange: _Exchange,
        status: int,
        reason: str,
        fields: Fields,
        content: StreamReader,
        whole: bytes | None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.fields = fields
        self._pool = pool
        self._address = address
        self._exchange: _Exchange | None = exchange
        self._content = content
        self._whole = whole
        if whole is not None:
            self.content_length: int | None = len(whole)
            self._finish(reuse=True)
            return
        length = next((v for k, v in fields if k.lower() == "content-length"), None)
        self.content_length = digits(length) if length is not None else None
        content.on_eof(self._ended)

    @property
    def content(self) -> StreamReader:
        """The body's stream, without what ``in_hand`` took."""
        whole, self._whole = self._whole, None
        if whole:
            self._content = StreamReader(FlowControl(self._pool._loop), len(whole),
                                         loop=self._pool._loop)  # fmt: skip
            self._content.feed_data(whole)
            self._content.feed_eof()
        return self._content

    def in_hand(self) -> bytes:
        """Take the body bytes that arrived with the head, as ``StreamReader.read_nowait``."""
        whole, self._whole = self._whole, None
        return whole if whole is not None else self._content.read_nowait()

    def _ended(self) -> None:
        self._finish(reuse=True)

    def close(self) -> None:
        """Done with the response: a connection whose body was not read to its end closes."""
        self._finish(reuse=False)

    def _finish(self, *, reuse: bool) -> None:
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            protocol = exchange.protocol
            assert protocol is not None
            self._pool._unwatch(exchange)
            reuse = reuse and not protocol.should_close
            self._pool._release(self._address, protocol, reuse=reuse)

    async def __aenter__(self) -> OriginResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class OriginPool:
    """Keep-alive connections to plain-HTTP origins, shared by every request of the proxy."""

    def __init__(self, config: UpstreamSection, health: OriginHealth | None = None) -> None:
        self._config = config
        self.health = health if health is not None else OriginHealth()
        self._idle: dict[Address, list[tuple[OriginConnection, float]]] = {}
        self._exchanges: set[_Exchange] = set()
        self._tick = min(1.0, config.read_timeout / 8, config.total_timeout / 8)
        self._ticker: asyncio.TimerHandle | None = None
        # The address and Host of each origin asked (the configured ones: few).
        self._origins: dict[str, tuple[Address, str]] = {}
        self._in_use = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._expiry: asyncio.TimerHandle | None = None  # closes idle connections (_expire)
        self._closed = False
        # The loop of the first request: the pool's connections belong to it. Looked up once,
        # as each lookup asks the kernel for the process's id.
        self._loop: asyncio.AbstractEventLoop | None = None
        # New connections on which the origin spoke before it was asked: closed unused.
        self.unasked = 0

    @staticmethod
    def serves(url: str) -> bool:
        return url.startswith("http://")

    async def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes | None = None,
        interim: Interim | None = None,
    ) -> OriginResponse:
        """Send a ``method`` request for ``url``, with ``body`` (None: none) framed by a
        Content-Length of its own; the response's head has arrived. ``interim`` is given
        each interim (1xx) response before it."""
        address, head = self._request(method, url, headers, body)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        exchange = _Exchange(loop.time() + self._config.total_timeout)
        self._watch(exchange)
        try:
            if self._in_use >= self._config.max_connections:
                await self._free_one(exchange)
            self._in_use += 1
            try:
                return await self._exchange(address, head, method, exchange, interim=interim)
            except BaseException:
                self._in_use -= 1
                self._wake()
                raise
        except BaseException:
            self._unwatch(exchange)
            raise

    def send_now(self, method: str, url: str, headers: list[tuple[str, str]]) -> Sent | None:
        """Write a bodiless request at once on an idle pooled connection, as ``request``
        would; None, having done nothing, when no pooled connection is idle, all that may be
        used are, or no request ran yet. Its answer is then ``Sent.whole`` once it arrives
        whole (``Sent.offer``), else ``resume``'s."""
        loop = self._loop
        if loop is None or self._in_use >= self._config.max_connections:
            return None
        address, head = self._request(method, url, headers, None)
        protocol = self._pooled(address)
        if protocol is None:
            return None
        exchange = _Exchange(loop.time() + self._config.total_timeout)
        exchange.protocol = protocol
        self._watch(exchange)
        self._in_use += 1
        protocol.send(head, skip_payload=method == "HEAD", read_timeout=self._config.read_timeout)
        return Sent(self, address, head, method, exchange)

    async def resume(self, sent: Sent, interim: Interim | None = None) -> OriginResponse:
        """The response to ``sent`` when its connection did not offer it whole, with the
        failures and the retry on a new connection of ``request``."""
        try:
            return await self._exchange(sent.address, sent.head, sent.method, sent.exchange,
                                        sent.exchange.protocol, interim)  # fmt: skip
        except BaseException:
            self._ended(sent.exchange)
            raise

    def _ended(self, exchange: _Exchange) -> None:
        """``exchange`` holds its connection no more, and is no longer timed."""
        self._in_use -= 1
        self._wake()
        self._unwatch(exchange)

    def _request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> tuple[Address, bytes]:
        """The origin's address and the request's bytes, body included."""
        netloc, slash, rest = url.removeprefix("http://").partition("/")
        origin = self._origins.get(netloc)
        if origin is None:
            origin = self._origins[netloc] = _origin(netloc)
        address, host = origin
        target = (slash + rest).partition("#")[0] or "/"
        request_line = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"
        if body is not None:
            # The body goes as it is in hand: its length frames it, whatever the client's did.
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
        # As aiohttp's client refuses it: a field may not smuggle in a line of its own.
        fields = field_lines(headers)
        if fields is None or request_line.count("\n") != 2 or request_line.count("\r") != 2:
            raise ValueError("a newline or carriage return in a request line or field")
        head = (request_line + fields + "\r\n").encode("utf-8", "surrogateescape")
        if body:
            head += body
        return address, head

    async def _exchange(
        self,
        address: Address,
        head: bytes,
        method: str,
        exchange: _Exchange,
        written_on: OriginConnection | None = None,
        interim: Interim | None = None,
    ) -> OriginResponse:
        """The response to ``head``, sent on a pooled connection or a new one (``written_on``:
        the pooled one it was already written on)."""
        protocol = written_on if written_on is not None else self._pooled(address)
        pooled = protocol is not None
        while True:
            try:
                if protocol is None:
                    protocol = await self._connected(address, exchange.deadline)
                if written_on is None:
                    exchange.protocol = protocol
                    if protocol._loop.time() >= exchange.deadline:
                        raise TimeoutError("the total timeout passed before the request was sent")
                    protocol.send(head, skip_payload=method == "HEAD",
                                  read_timeout=self._config.read_timeout)  # fmt: skip
                written_on = None
                answer = await protocol.response()
                while 100 <= answer[0] < 200 and answer[0] != 101:
                    if interim is not None:
                        interim(answer[0], answer[1], answer[2])
                    answer = await protocol.response()
                return OriginResponse(self, address, exchange, *answer)
            except (ServerDisconnectedError, ClientOSError) as exc:
                if protocol is not None:
                    protocol.close()
                if not pooled:
                    raise
                log.info("%r on a pooled connection to %s:%d; retrying on a new one", exc,
                         *address)  # fmt: skip
                pooled, protocol = False, None
            except BaseException:
                if protocol is not None:
                    protocol.close()
                raise

    async def _connected(self, address: Address, deadline: float) -> OriginConnection:
        """A new connection on which nothing arrived before the request it is made for: bytes
        the origin sent first (read by the loop, which closed it, or waiting in the socket)
        answer no request. Such a connection is closed and counted (``unasked``), and one
        more is tried; ``ServerDisconnectedError`` when that one spoke first too."""
        for _ in range(2):
            protocol = await self._connect(address, deadline)
            if protocol.is_connected() and not protocol.has_unread():
                return protocol
            protocol.close()
            self.unasked += 1
            log.warning("the origin %s:%d sent bytes, or closed, before it was asked: "
                        "connection closed unused", *address)  # fmt: skip
        raise ServerDisconnectedError("the origin sent bytes before it was asked")

    async def _connect(self, address: Address, deadline: float) -> OriginConnection:
        loop = asyncio.get_running_loop()
        limit = min(self._config.connect_timeout, deadline - loop.time())
        read_buffer = self._config.read_buffer
        try:
            async with asyncio.timeout(limit):
                _, protocol = await loop.create_connection(
                    lambda: OriginConnection(loop, read_buffer), *address
                )
        except OSError as exc:
            raise Unreachable(exc) from exc
        return protocol

    def _pooled(self, address: Address) -> OriginConnection | None:
        idle = self._idle.get(address)
        assert self._loop is not None
        limit = self._loop.time() - self._config.idle_timeout
        while idle:
            protocol, since = idle.pop()
            if since >= limit and protocol.is_connected() and not protocol.has_unread():
                return protocol
            protocol.close()
        return None

    async def _free_one(self, exchange: _Exchange) -> None:
        """Wait in turn until fewer than ``max_connections`` are in use; the sweep ends a wait
        that reaches the exchange's total deadline (TimeoutError), as the session's total
        timeout covers its wait for a connection."""
        while self._in_use >= self._config.max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            exchange.waiter = waiter
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._wake()  # woken for a free connection, but leaving: pass it on
                raise
            finally:
                exchange.waiter = None
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    def _watch(self, exchange: _Exchange) -> None:
        self._exchanges.add(exchange)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(self._tick, self._sweep_timeouts)

    def _unwatch(self, exchange: _Exchange) -> None:
        self._exchanges.discard(exchange)

    def _sweep_timeouts(self) -> None:
        """End the requests past their total deadline, and the reads silent for the read
        timeout; come back in a tick while any request is in flight."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for exchange in list(self._exchanges):
            protocol = exchange.protocol
            if now >= exchange.deadline:
                self._exchanges.discard(exchange)
                waiter = exchange.waiter
                if protocol is not None:
                    protocol.fail(TimeoutError("the total timeout passed"))
                elif waiter is not None and not waiter.done():
                    waiter.set_exception(
                        TimeoutError("the total timeout passed waiting for a free connection")
                    )
            elif protocol is not None:
                protocol.check_read_timeout(now)
        self._ticker = (
            loop.call_later(self._tick, self._sweep_timeouts) if self._exchanges else None
        )

    def _release(self, address: Address, protocol: OriginConnection, *, reuse: bool) -> None:
        self._in_use -= 1
        self._wake()
        if reuse and not self._closed and protocol.is_connected():
            protocol.rest()
            loop = protocol._loop
            self._idle.setdefault(address, []).append((protocol, loop.time()))
            if self._expiry is None:
                self._expiry = loop.call_later(self._config.idle_timeout, self._expire)
        else:
            protocol.close()

    def _expire(self) -> None:
        """Close the connections idle for ``idle_timeout``; come back for the next one due."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        limit = loop.time() - self._config.idle_timeout
        earliest: float | None = None
        for address, idle in list(self._idle.items()):
            kept = []
            for protocol, since in idle:
                if since <= limit or not protocol.is_connected():
                    protocol.close()
                else:
                    kept.append((protocol, since))
                    earliest = since if earliest is None else min(earliest, since)
            if kept:
                self._idle[address] = kept
            else:
                del self._idle[address]
        if earliest is not None:
            self._expiry = loop.call_at(earliest + self._config.idle_timeout, self._expire)

    def close(self) -> None:
        """Close every idle connection; those in use close as their responses end."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for idle in self._idle.values():
            for protocol, _ in idle:
                protocol.close()
        self._idle.clear()


def _origin(netloc: str) -> tuple[Address, str]:
    """The address to connect to and the Host field of an origin's ``host[:port]``."""
    parts = urlsplit("http://" + netloc)
    return (parts.hostname or "", parts.port or 80), netloc.rpartition("@")[2].removesuffix(":80")
