"""The origin client of requests to plain-HTTP origins whose body, if any, is in hand: aiohttp's
strict C response parser and body streams, driven by a small connection protocol of its own
over a keep-alive pool of its own. The ``ClientSession`` machinery around them cost a miss more
than everything else the proxy does for one, and aiohttp's ``ResponseHandler`` (a message
queue, a loop timer per read, a timer context per request) another tenth; its header writer
also drops field bytes that are not UTF-8. Requests whose body is still arriving (past
``[server] body_buffer_size``), and HTTPS origins, stay on the session.

Rules it keeps:

* A response is parsed exactly as the session's client parses one: the same parser, limits and
  errors (``aiohttp.ClientPayloadError`` for a body cut short, ``ServerDisconnectedError``,
  ``HttpProcessingError`` for a malformed head). Interim 1xx responses are handed to the
  request's ``interim``, if it has one, and the final response awaited.
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
* A connection carries the next request only when nothing but the answer arrived on it: bytes
  after the answer (in the same read or a later one), or while it is idle, close it, so a
  response nobody asked for, whole or begun, is never taken for the next one's. The parser
  reads a head alone, then a Content-Length body only up to its length: what comes past it
  is never parsed, so the answer itself is served and may be stored, whatever follows it
  (after a chunked body, the parser is asked whether it began another message). What comes
  in one read is still judged whole: a head followed by a malformed body is a malformed
  response.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import ClientOSError, ClientPayloadError, ServerDisconnectedError, SocketTimeoutError
from aiohttp.base_protocol import BaseProtocol
from aiohttp.helpers import EMPTY_BODY_STATUS_CODES, set_exception
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpResponseParser, RawResponseMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader

from proxy._origin import parse_response
from proxy.config import UpstreamSection
from proxy.core._native import field_lines
from proxy.core.rfc9110 import digits

log = logging.getLogger("onehit.upstream")

Address = tuple[str, int]
Fields = Iterable[tuple[str, str]]
# What is given an interim (1xx) response: its status, reason and fields.
Interim = Callable[[int, str, "Fields"], None]
# A response's status, reason, fields, body stream, and its whole body when it came whole with
# the head (then the stream is empty).
Head = tuple[int, str, Fields, StreamReader, "bytes | None"]


# ``_Connection._left`` while a head is arriving.
_HEAD = -1
# The end of a head: its first empty line (the response parser takes a bare LF for CRLF).
_BLANK_LINE = re.compile(rb"\n\r?\n")


class Unreachable(Exception):
    """The origin could not be connected to; ``os_error`` says why."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class _Connection(BaseProtocol):
    """A keep-alive connection to an origin, one request at a time. A request gets aiohttp's
    C response parser in its start state: a fresh one, or (a GET after a GET) the one that
    parsed the previous response to its end, where it stands ready for the next message with
    nothing left unparsed (a connection goes back to the pool only then). The final head goes
    to the request awaiting ``response()``, the body into the parser's stream. Bytes arriving
    while no request is in flight close the connection: an origin answering what was not
    asked cannot be trusted with the next request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_buffer: int) -> None:
        super().__init__(loop)
        self._read_buffer = read_buffer
        self._skip_payload = False
        self._first = False  # whether nothing of the answer to the request in flight came yet
        self._heads: deque[Head] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._payload: StreamReader | None = None  # the body being parsed, if any
        self._should_close = False
        # Body bytes left of the answer in flight (``_framed``): _HEAD while its head is
        # arriving, None when its body ends otherwise (chunked, or with the connection).
        self._left: int | None = _HEAD
        self._head_tail = b""  # the last bytes of a head still arriving, for its blank line
        self._read_timeout = 0.0
        self.reading_since: float | None = None  # when the read timeout started, if it runs
        # The parser of the last response read to its end, for the next GET (making one costs
        # about 2% of a miss).
        self._spare: HttpResponseParser | None = None
        # A request sent at once (``OriginPool.send_now``) with nothing awaiting ``response()``:
        # a whole plain answer is offered to ``on_whole`` (True: taken), and anything else a
        # waiter would be woken for calls ``on_other``, which then awaits ``response()``.
        self.on_whole: Callable[[int, str, Fields, bytes], bool] | None = None
        self.on_other: Callable[[], None] | None = None

    @property
    def should_close(self) -> bool:
        """Whether the connection cannot carry another request (a failed one never can)."""
        payload = self._payload
        return (
            self._should_close
            or self._error is not None
            or self._upgraded
            or bool(self._heads)
            or (payload is not None and not payload.is_eof())
        )

    def is_connected(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.close()
        self.reading_since = None

    def send(self, head: bytes, *, skip_payload: bool, read_timeout: float) -> None:
        """Write a request whose response is parsed as the session's client parses one."""
        spare, self._spare = self._spare, None
        self._parser = (
            spare
            if spare is not None and not skip_payload
            else response_parser(
                self, self._loop, with_body=not skip_payload, read_buffer=self._read_buffer
            )
        )
        self._skip_payload = skip_payload
        self._first = not skip_payload
        self._left = _HEAD
        self._head_tail = b""
        self._read_timeout = read_timeout
        assert self.transport is not None
        self.transport.write(head)
        self.reading_since = self._loop.time() if read_timeout else None

    def rest(self) -> None:
        """The response was read to its end: nothing more is expected until the next send."""
        if not self._skip_payload:
            self._spare = self._parser
        self._parser = None
        self._payload = None
        self.reading_since = None

    async def response(self) -> Head:
        """The next response's head, and its body: its stream (empty for HEAD, 1xx, 204 and
        304), and the whole of it when it came whole with the head."""
        while not self._heads:
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._heads.popleft()

    def fail(self, exc: BaseException, body_exc: BaseException | None = None) -> None:
        """End the request in flight: its wait for a head with ``exc``, or its body with
        ``body_exc`` (``exc`` if None). The connection carries nothing more."""
        self.reading_since = None
        self._set_error(exc)
        payload = self._payload
        if payload is None or payload.is_eof():
            return
        if body_exc is None:
            set_exception(payload, exc)
        else:
            set_exception(payload, body_exc, exc)

    def check_read_timeout(self, now: float) -> None:
        """Fail the response being read when no byte came for the read timeout."""
        since = self.reading_since
        if since is not None and now - since >= self._read_timeout:
            self.fail(SocketTimeoutError("Timeout on reading data from socket"))

    def pause_reading(self) -> None:
        super().pause_reading()
        self.reading_since = None  # the read timeout measures the origin, not this pause

    def resume_reading(self, resume_parser: bool = True) -> None:
        if not self._reading_paused:
            return  # a body's stream calls this on every read, paused or not
        super().resume_reading(resume_parser)
        if not self._reading_paused and self._read_timeout and self._parser is not None:
            self.reading_since = self._loop.time()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            if data:
                self.close()
            return
        if self._first:
            self._first = False
            # Most answers arrive whole in one read: parsed at once, and aiohttp's parser,
            # still in its start state, is kept for the next.
            plain = parse_response(data)
            if plain is not None:
                status, reason, fields, head = plain
                self.reading_since = None  # nothing more to read
                self._payload = EMPTY_PAYLOAD
                taker = self.on_whole
                if taker is not None:
                    # Unhooked first: the taker may send the connection's next request.
                    other, self.on_whole, self.on_other = self.on_other, None, None
                    if taker(status, reason, fields, data[head:]):
                        return
                    self.on_other = other
                self._heads.append((status, reason, fields, EMPTY_PAYLOAD, data[head:]))
                self._wake()
                return
        if data and self.reading_since is not None:
            self.reading_since = self._loop.time()
        woken = False
        queued = len(self._heads)
        while True:
            # b"" too: a parser paused at its buffer's limit reads what it held back.
            piece, data, stray = self._framed(data)
            try:
                messages, upgraded, _ = parser.feed_data(piece)
            except BaseException as exc:
                # What came in one read is judged whole, as when the parser read it at once:
                # a head followed by a malformed body fails as a malformed response (502).
                while len(self._heads) > queued:
                    self._heads.pop()
                self.close()
                if not isinstance(exc, Exception):
                    raise
                self._malformed(exc)
                return
            self._upgraded = upgraded
            for message, payload in messages:
                self._headed(message, payload)
            woken = woken or bool(messages)
            if stray or not data:
                break
        # A chunked answer that ended in this read (its body's end released the connection,
        # then the parser is the spare, or nothing has read it yet) may have had bytes after
        # it, which the parser read on: a Content-Length answer's never reach it (``stray``).
        ended = self._payload
        if stray or (
            self._left is None
            and (self._parser is None or (ended is not None and ended.is_eof()))
            and _begun(parser)
        ):
            # Bytes came after the answer's end: a response nobody asked for has begun. The
            # answer stands; the connection, and those bytes with its parser, go.
            self._should_close = True
            self._spare = None
            self.close()
        if woken:
            self._wake()

    def _framed(self, data: bytes) -> tuple[bytes, bytes, bool]:
        """What of ``data`` the parser is to read now, what after, and whether the rest is
        past the answer's end (bytes nobody asked for, never read): a head alone, up to its
        blank line (the body's framing is known only once it is read), or as much of a
        Content-Length body as is left of it."""
        left = self._left
        if left is None:
            return data, b"", False
        if left == _HEAD:
            seen = self._head_tail + data
            blank = _BLANK_LINE.search(seen)
            if blank is None:
                self._head_tail = seen[-2:]
                return data, b"", False
            end = blank.end() - len(self._head_tail)
            self._head_tail = b""
            return data[:end], data[end:], False
        if len(data) > left:
            self._left = 0
            return data[:left], b"", True
        self._left = left - len(data)
        return data, b"", False

    def _headed(self, message: RawResponseMessage, payload: StreamReader) -> None:
        """A response's head was parsed: queue it, and know how its body is framed (an
        interim response is followed by another head)."""
        code = message.code
        if message.should_close:
            self._should_close = True
        self._payload = payload
        if self._skip_payload or code in EMPTY_BODY_STATUS_CODES:
            payload = EMPTY_PAYLOAD
            self._left = _HEAD if 100 <= code < 200 and code != 101 else 0
        elif message.chunked:
            self._left = None
        else:
            length = message.headers.get("Content-Length")
            self._left = None if length is None else digits(length)
        # The names as sent, as the plain parse keeps them: aiohttp spells those it knows
        # its own way.
        fields = [(_text(k), _text(v)) for k, v in message.raw_headers]
        self._heads.append((code, message.reason, fields, payload, None))

    def _malformed(self, exc: Exception) -> None:
        """The origin sent what the parser refuses: a head still awaited fails with
        ``HttpProcessingError``, a body being read with ``ClientPayloadError``, as a body cut
        short does (its head may already have been relayed)."""
        error = (
            HttpProcessingError(code=exc.code, message=exc.message, headers=exc.headers)
            if isinstance(exc, HttpProcessingError)
            else HttpProcessingError()
        )
        error.__cause__ = exc
        self.fail(error, ClientPayloadError(f"Malformed response body: {exc!r}"))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.reading_since = None
        parser, self._parser = self._parser, None
        uncompleted = None
        if parser is not None:
            try:
                uncompleted = parser.feed_eof()
            except Exception as underlying:
                payload = self._payload
                if payload is not None:
                    detail = f"Response payload is not completed: {underlying!r}"
                    if exc is not None:
                        detail += f". {exc!r}"
                    set_exception(payload, ClientPayloadError(detail), underlying)
        if isinstance(exc, OSError):
            self._set_error(ClientOSError(*exc.args))
        else:
            self._set_error(exc if exc is not None else ServerDisconnectedError(uncompleted))
        super().connection_lost(exc)

    def _set_error(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        """A head or a failure is in for the request in flight: wake its wait, or hand it to
        the request's ``on_other`` when nothing waits yet."""
        waiter = self._waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
            return
        other = self.on_other
        if other is not None:
            self.on_whole = self.on_other = None
            other()


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
        self.protocol: _Connection | None = None
        self.waiter: asyncio.Future[None] | None = None


def response_parser(
    protocol: BaseProtocol,
    loop: asyncio.AbstractEventLoop,
    *,
    with_body: bool,
    read_buffer: int,
) -> HttpResponseParser:
    """aiohttp's response parser in its start state, as the session's client makes one (with
    ``[upstream] read_buffer``: a body's stream pauses reading past twice it)."""
    return HttpResponseParser(
        protocol, loop, read_buffer,
        payload_exception=ClientPayloadError, response_with_body=with_body,
        read_until_eof=True,  # a body without a length ends with the connection
        auto_decompress=False, max_line_size=8190, max_field_size=8190, max_headers=128,
    )  # fmt: skip


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
            self._content = StreamReader(BaseProtocol(self._pool._loop), len(whole),
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
        # The loop of the first request: the pool's connections belong to it. Looked up once,
        # as each lookup asks the kernel for the process's id.
        self._loop: asyncio.AbstractEventLoop | None = None

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
        written_on: _Connection | None = None,
        interim: Interim | None = None,
    ) -> OriginResponse:
        """The response to ``head``, sent on a pooled connection or a new one (``written_on``:
        the pooled one it was already written on)."""
        protocol = written_on if written_on is not None else self._pooled(address)
        pooled = protocol is not None
        while True:
            try:
                if protocol is None:
                    protocol = await self._connect(address, exchange.deadline)
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

    async def _connect(self, address: Address, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        limit = min(self._config.connect_timeout, deadline - loop.time())
        read_buffer = self._config.read_buffer
        try:
            async with asyncio.timeout(limit):
                _, protocol = await loop.create_connection(
                    lambda: _Connection(loop, read_buffer), *address
                )
        except OSError as exc:
            raise Unreachable(exc) from exc
        return protocol

    def _pooled(self, address: Address) -> _Connection | None:
        idle = self._idle.get(address)
        assert self._loop is not None
        limit = self._loop.time() - self._config.idle_timeout
        while idle:
            protocol, since = idle.pop()
            if since >= limit and protocol.is_connected():
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

    def _release(self, address: Address, protocol: _Connection, *, reuse: bool) -> None:
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


def _begun(parser: HttpResponseParser) -> bool:
    """Whether ``parser``, past the end of a message, has begun another: its end-of-stream
    check hands back the head it holds (or fails on it), and does nothing at a message's
    start."""
    try:
        return parser.feed_eof() is not None
    except Exception:
        return True


def _text(raw: bytes) -> str:
    """A field's name or value as aiohttp's parser decodes it."""
    return raw.decode("utf-8", "surrogateescape")


def _origin(netloc: str) -> tuple[Address, str]:
    """The address to connect to and the Host field of an origin's ``host[:port]``."""
    parts = urlsplit("http://" + netloc)
    return (parts.hostname or "", parts.port or 80), netloc.rpartition("@")[2].removesuffix(":80")
