"""A keep-alive connection to a plain-HTTP origin, one request at a time, read by aiohttp's
strict C response parser (or, for a whole plain answer, ``proxy/origin/_origin.c``).

Rules it keeps:

* A response is parsed exactly as the session's client parses one: the same parser, limits and
  errors (``aiohttp.ClientPayloadError`` for a body cut short, ``ServerDisconnectedError``,
  ``HttpProcessingError`` for a malformed head). Interim 1xx responses are handed to the
  request's ``interim``, if it has one, and the final response awaited.
* A connection carries the next request only when nothing but the answer arrived on it: bytes
  after the answer (in the same read or a later one), or while it is idle, close it, and so do
  bytes the event loop has not read yet when the connection is taken again (``has_unread``,
  checked by the pool before reuse), so a response nobody asked for, whole or begun, is never
  taken for the next one's, unless it arrives after that request went out. The parser
  reads a head alone, then a Content-Length body only up to its length: what comes past it
  is never parsed, so the answer itself is served and may be stored, whatever follows it
  (after a chunked body, the parser is asked whether it began another message). What comes
  in one read is still judged whole: a head followed by a malformed body is a malformed
  response.
"""

from __future__ import annotations

import asyncio
import re
import select
from collections import deque
from collections.abc import Callable, Iterable

from aiohttp import (
    EMPTY_PAYLOAD,
    ClientOSError,
    ClientPayloadError,
    ServerDisconnectedError,
    SocketTimeoutError,
    StreamReader,
)
from aiohttp.http import HttpProcessingError, HttpResponseParser, RawResponseMessage

from proxy.core.rfc9110 import BODILESS_STATUSES, digits
from proxy.origin._origin import parse_response
from proxy.wire.seam import FlowControl

Address = tuple[str, int]
Fields = Iterable[tuple[str, str]]
# What is given an interim (1xx) response: its status, reason and fields.
Interim = Callable[[int, str, "Fields"], None]
# A response's status, reason, fields, body stream, and its whole body when it came whole with
# the head (then the stream is empty).
Head = tuple[int, str, Fields, StreamReader, "bytes | None"]


# ``OriginConnection._left`` while a head is arriving.
_HEAD = -1
# The end of a head: its first empty line (the response parser takes a bare LF for CRLF).
_BLANK_LINE = re.compile(rb"\n\r?\n")


class OriginConnection(FlowControl):
    """A keep-alive connection to an origin, one request at a time. A request gets aiohttp's
    C response parser in its start state: a fresh one, or (a GET after a GET) the one that
    parsed the previous response to its end, where it stands ready for the next message with
    nothing left unparsed (a connection goes back to the pool only then). The final head goes
    to the request awaiting ``response()``, the body into the parser's stream. Bytes arriving
    while no request is in flight close the connection: an origin answering what was not
    asked cannot be trusted with the next request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_buffer: int) -> None:
        super().__init__(loop)
        self._parser: HttpResponseParser | None = None  # the response in flight's
        self._upgraded = False
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

    def has_unread(self) -> bool:
        """Whether bytes, or the origin's close, wait in the socket unread by the event loop:
        an idle connection about to carry a request must have none, or they would be read as
        its answer. (What the origin sends after the request went out cannot be told from the
        answer: HTTP/1.1 has no request ids.)"""
        sock = None if self.transport is None else self.transport.get_extra_info("socket")
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))

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
            payload.set_exception(exc)
        else:
            payload.set_exception(body_exc, exc)

    def check_read_timeout(self, now: float) -> None:
        """Fail the response being read when no byte came for the read timeout."""
        since = self.reading_since
        if since is not None and now - since >= self._read_timeout:
            self.fail(SocketTimeoutError("Timeout on reading data from socket"))

    def pause_reading(self) -> None:
        if self._parser is not None and not self._upgraded:
            self._parser.pause_reading()
        super().pause_reading()
        self.reading_since = None  # the read timeout measures the origin, not this pause

    def parse_held(self) -> None:
        if not self._upgraded:
            self.data_received(b"")

    def resume_reading(self, resume_parser: bool = True) -> None:
        if not self.reading_paused:
            return  # a body's stream calls this on every read, paused or not
        super().resume_reading(resume_parser)
        if not self.reading_paused and self._read_timeout and self._parser is not None:
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
        if self._skip_payload or code in BODILESS_STATUSES:
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
                    payload.set_exception(ClientPayloadError(detail), underlying)
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


def response_parser(
    protocol: FlowControl,
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
