"""The origin client of bodiless GET and HEAD requests to plain-HTTP origins: aiohttp's own
response protocol (``ResponseHandler``, its strict C parser) over a keep-alive pool of its own,
without the ``ClientSession`` machinery around it, which cost a miss more than everything else
the proxy does for one. Requests with a body, and HTTPS origins, stay on the session.

Rules it keeps:

* A response is parsed exactly as the session's client parses one: the same parser, limits and
  errors (``aiohttp.ClientPayloadError`` for a body cut short, ``ServerDisconnectedError``,
  ``HttpProcessingError`` for a malformed head). Interim 1xx responses are skipped.
* The request is written as given: its request line, ``Host`` (the origin's, as the session
  sends it) and the fields the proxy forwards, nothing of a client library's own.
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
from urllib.parse import urlsplit

from aiohttp import ClientOSError, ServerDisconnectedError
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import BaseTimerContext, TimeoutHandle
from aiohttp.http_parser import RawResponseMessage
from aiohttp.streams import StreamReader
from multidict import CIMultiDictProxy

from proxy.config import UpstreamSection

log = logging.getLogger("onehit.upstream")

Address = tuple[str, int]


class Unreachable(Exception):
    """The origin could not be connected to; ``os_error`` says why."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class _Connection(ResponseHandler):
    """aiohttp's response protocol whose read timeout is a time stamp that the pool's sweep
    checks, where aiohttp cancels and makes a loop timer on every read."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.reading_since: float | None = None  # when the read timeout started, if it runs

    def _reschedule_timeout(self) -> None:
        self.reading_since = self._loop.time() if self._read_timeout else None

    def _drop_timeout(self) -> None:
        self.reading_since = None

    def check_read_timeout(self, now: float) -> None:
        """Fail the response being read when no byte came for the read timeout."""
        since = self.reading_since
        if since is not None and self._read_timeout and now - since >= self._read_timeout:
            self.reading_since = None
            self._on_read_timeout()


class _Exchange:
    """A request in flight: its total deadline, the handle whose callbacks end it, and its
    connection once it has one."""

    __slots__ = ("deadline", "protocol", "timeout")

    def __init__(self, deadline: float, timeout: TimeoutHandle) -> None:
        self.deadline = deadline
        self.timeout = timeout
        self.protocol: _Connection | None = None


class OriginResponse:
    """An origin response whose head has arrived: what the proxy reads of one, as aiohttp's
    ``ClientResponse`` offers it. Closing it before its body's end drops the connection."""

    def __init__(
        self,
        pool: OriginPool,
        address: Address,
        exchange: _Exchange,
        status: int,
        reason: str,
        headers: CIMultiDictProxy[str],
        content: StreamReader,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.content = content
        length = headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self._pool = pool
        self._address = address
        self._exchange: _Exchange | None = exchange
        content.on_eof(self._ended)

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

    def __init__(self, config: UpstreamSection) -> None:
        self._config = config
        self._idle: dict[Address, list[tuple[_Connection, float]]] = {}
        self._exchanges: set[_Exchange] = set()
        self._tick = min(1.0, config.read_timeout / 8, config.total_timeout / 8)
        self._ticker: asyncio.TimerHandle | None = None
        # The address and Host of each origin asked (the configured ones: few).
        self._origins: dict[str, tuple[Address, str]] = {}
        self._in_use = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._expiry: asyncio.TimerHandle | None = None  # closes idle connections (_expire)
        self._closed = False

    @staticmethod
    def serves(url: str) -> bool:
        return url.startswith("http://")

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]]
    ) -> OriginResponse:
        """Send a bodiless ``method`` request for ``url``; the response's head has arrived."""
        netloc, slash, rest = url.removeprefix("http://").partition("/")
        origin = self._origins.get(netloc)
        if origin is None:
            origin = self._origins[netloc] = _origin(netloc)
        address, host = origin
        target = (slash + rest).partition("#")[0] or "/"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
        lines += [f"{name}: {value}" for name, value in headers]
        if any("\r" in line or "\n" in line for line in lines):
            # As aiohttp's client refuses it: a field may not smuggle in a line of its own.
            raise ValueError("a newline or carriage return in a request line or field")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        loop = asyncio.get_running_loop()
        # Called by the sweep at the deadline, it ends whatever of the request is running.
        timeout = TimeoutHandle(loop, self._config.total_timeout)
        exchange = _Exchange(loop.time() + self._config.total_timeout, timeout)
        self._watch(exchange)
        try:
            await self._acquire()
            try:
                return await self._exchange(address, head, method, exchange)
            except BaseException:
                self._in_use -= 1
                self._wake()
                raise
        except BaseException:
            self._unwatch(exchange)
            raise

    async def _exchange(
        self,
        address: Address,
        head: bytes,
        method: str,
        exchange: _Exchange,
    ) -> OriginResponse:
        protocol = self._pooled(address)
        pooled = protocol is not None
        timer = exchange.timeout.timer()
        while True:
            try:
                with timer:
                    if protocol is None:
                        protocol = await self._connect(address)
                    exchange.protocol = protocol
                    message, payload = await self._send(protocol, head, method, timer)
                return OriginResponse(
                    self, address, exchange, message.code, message.reason, message.headers,
                    payload,
                )  # fmt: skip
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

    async def _send(
        self, protocol: _Connection, head: bytes, method: str, timer: BaseTimerContext
    ) -> tuple[RawResponseMessage, StreamReader]:
        """The final response's message and body stream (interim 1xx responses skipped)."""
        protocol.set_response_params(
            timer=timer,
            skip_payload=method == "HEAD",
            read_until_eof=True,  # a body without a length ends with the connection
            auto_decompress=False,
            read_timeout=self._config.read_timeout,
        )
        assert protocol.transport is not None
        protocol.transport.write(head)
        protocol.start_timeout()
        while True:
            message, payload = await protocol.read()
            if not 100 <= message.code < 200 or message.code == 101:
                return message, payload

    async def _connect(self, address: Address) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._config.connect_timeout):
                _, protocol = await loop.create_connection(lambda: _Connection(loop), *address)
        except OSError as exc:
            raise Unreachable(exc) from exc
        return protocol

    def _pooled(self, address: Address) -> _Connection | None:
        idle = self._idle.get(address)
        limit = asyncio.get_running_loop().time() - self._config.idle_timeout
        while idle:
            protocol, since = idle.pop()
            if since >= limit and protocol.is_connected():
                return protocol
            protocol.close()
        return None

    async def _acquire(self) -> None:
        while self._in_use >= self._config.max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken for a free connection, but leaving: pass it on
                raise
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
        self._in_use += 1

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
        exchange.timeout.close()

    def _sweep_timeouts(self) -> None:
        """End the requests past their total deadline, and the reads silent for the read
        timeout; come back in a tick while any request is in flight."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for exchange in list(self._exchanges):
            if now >= exchange.deadline:
                self._exchanges.discard(exchange)
                exchange.timeout()
            elif exchange.protocol is not None:
                exchange.protocol.check_read_timeout(now)
        self._ticker = (
            loop.call_later(self._tick, self._sweep_timeouts) if self._exchanges else None
        )

    def _release(self, address: Address, protocol: _Connection, *, reuse: bool) -> None:
        self._in_use -= 1
        self._wake()
        if reuse and not self._closed and protocol.is_connected():
            loop = asyncio.get_running_loop()
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
