"""The proxy's own connection protocol (``Front``): plain requests answered before aiohttp sees
them, and the connection handed to aiohttp's request handler at the first one it cannot take.

* One parser judges: a request is read from its bytes (``PlainHits.answer_bytes``) only when
  they hold one whole plain request, a strict subset of what aiohttp's request parser (llhttp,
  strict) takes, read as it reads it; any other head is parsed by that parser, with aiohttp's
  limits, exactly its bytes.
* A plain fresh hit is answered at once by the answerers (``Proxy.plain_hits``, then
  ``Proxy.answer_hit``); another plain request goes to the connection's lane (``proxy.front.lane``),
  answered by ``Proxy.handle`` or left ``Pending`` by ``Proxy.start``.
* Anything else (a body, HTTP/1.0, ``Connection: close``, an upgrade, what the parser refuses,
  a client that stops reading) hands the connection over, from that request's first byte, to
  aiohttp's protocol (``web.Server``'s, through the transport's ``set_protocol``), which
  serves it to its end. The front answers one request at a time and hands over only between
  answers, so requests keep their order; each gets the handler's answer, counters and log line.
* Where the connection is (reading, answering, its answer begun, a body's rest sending,
  handed over, closed) is ``proxy.front.life``'s table, told every event here.
* The read loop (``data_received``, ``_go_on``) is compiled (``proxy/front/_loop.c``): a hit
  read from its bytes, or answered as parsed, is written, counted and logged there, in one
  place; every other branch is one of ``Front``'s methods.
* While the lane answers, the bytes after its request are held up to ``HOLD_LIMIT``, then
  reading stops. A hit's body past ``PIECE`` bytes goes to the transport a piece at a time as
  it drains. A connection with nothing to answer closes after ``[server] idle_timeout``; a
  graceful shutdown waits for the lane's request. A bug answering a hit here is logged, and
  the lane answers the request.

It takes from aiohttp its exported request parser and ``web.Server`` as the factory of a
handed-over connection's protocol; its flow control is the proxy's own (``FlowControl``), in
the shape aiohttp's writer drives: none of aiohttp's request handler's fields.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Awaitable, Sequence
from time import perf_counter
from typing import Any, NamedTuple

from aiohttp import EMPTY_PAYLOAD, web
from aiohttp.http import HttpProcessingError, HttpRequestParser, RawRequestMessage

from proxy.config.logs import HTTP_ERRORS
from proxy.front import _loop, proxy_protocol
from proxy.front.lane import (
    AnswerBytes,
    AnswerHit,
    LaneRequest,
    LoggedRequest,
    LoggedResponse,
    Pending,
    StartLane,
    Written,
    lane_may_answer,
)
from proxy.front.life import BUSY, SENDING_STATES, Event, Life, State
from proxy.wire.seam import PIECE, FlowControl, ProxyServer, SendWatch


def require_strict_parser() -> None:
    """RuntimeError unless aiohttp reads requests with llhttp, its compiled strict parser: the
    front's reader is a strict subset of it, and its pure-Python parser (a build without C
    extensions, or ``AIOHTTP_NO_EXTENSIONS``) reads otherwise (it takes a lower-case ``get``
    as ``GET``, which llhttp refuses), so requests would mean one thing to the front and
    another to the handler."""
    if HttpRequestParser.__module__ != "aiohttp._http_parser":
        raise RuntimeError(
            "aiohttp reads requests with its pure-Python parser here (AIOHTTP_NO_EXTENSIONS "
            "is set, or its compiled extension is missing): onehit needs its strict compiled "
            "parser; unset AIOHTTP_NO_EXTENSIONS or reinstall aiohttp from a wheel"
        )


# The moves every request makes, their members read off their enums once: reading one off
# its class costs as much as the move itself.
_CLOSED = State.CLOSED
_TO_LANE, _HEAD_OUT, _ANSWERED, _CLOSE = (
    Event.TO_LANE, Event.HEAD_OUT, Event.ANSWERED, Event.CLOSE
)  # fmt: skip

# Request bytes a front holds while it answers (aiohttp's handler holds 32 requests and 64 KiB
# of a request in part): past it, reading stops until the lane's request ends.
HOLD_LIMIT = 256 << 10

_loop.rules(State.READING, State.PROXY_HEADER, State.HANDED_OVER, BUSY, HOLD_LIMIT, PIECE)


class HitServer(ProxyServer):
    """``ProxyServer`` whose connections begin with a ``Front`` that tries ``answers``, in
    order, and runs the other plain requests in its lane (started by ``start``: by default
    the work of ``handler``), before aiohttp's request handler. ``hit_log`` (an
    ``AccessLog``) logs the answers of ``answers``, those read as they came by its compiled
    ``lines`` (None: they are not logged); the access logger, those of the lane. With
    ``answer_bytes``, the first of ``answers`` is its form for a parsed request: a request
    ``answer_bytes`` read whole and declined is not asked of it again."""

    def __init__(
        self,
        handler: Any,
        answers: Sequence[AnswerHit],
        start: StartLane | None = None,
        answer_bytes: AnswerBytes | None = None,
        *,
        keepalive_timeout: float = 3630,
        max_line_size: int = 8190,
        max_field_size: int = 8190,
        max_headers: int = 128,
        access_log: Any = None,
        access_log_class: type = web.AccessLogger,
        access_log_format: str = web.AccessLogger.LOG_FORMAT,
        hit_log: Any = None,
        proxy_protocol: bool = False,
        lane: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            handler, keepalive_timeout=keepalive_timeout, max_line_size=max_line_size,
            max_field_size=max_field_size, max_headers=max_headers, access_log=access_log,
            access_log_class=access_log_class, access_log_format=access_log_format, **kwargs,
        )  # fmt: skip
        self.answers = tuple(answers)
        self.start: StartLane = start if start is not None else handler
        self.answer_bytes = answer_bytes
        self.keepalive_timeout = keepalive_timeout
        self.limits = (max_line_size, max_field_size, max_headers)
        # The head a front waits for: past this without its end, the parser judges it.
        self.head_limit = max_line_size + max_field_size + 4
        self.access_logger = access_log_class(access_log, access_log_format) if access_log else None
        # What logs the hits answered as they are read, when they are logged (they are
        # counted apart: ``fast_hits``); the access logger logs the lane's answers.
        self.hit_log = hit_log
        self.proxy_protocol = proxy_protocol  # each connection begins with a PROXY header
        self.lane = lane  # False: the front reads the PROXY header, aiohttp the requests
        self.answered: Counter[int] = Counter()  # the hits answered as read, by status
        self.fronts: set[Front] = set()
        self.draining = False

    @property
    def answers_after_bytes(self) -> tuple[AnswerHit, ...]:
        """What a request ``answer_bytes`` read whole and declined is asked of: the answerers
        but its own form for a parsed request."""
        return self.answers[1:] if self.answer_bytes is not None else self.answers

    def __call__(self) -> Front:  # type: ignore[override]
        return Front(self)

    def handler(self) -> asyncio.Protocol:
        """aiohttp's protocol, for a connection a front hands over."""
        return super().__call__()

    @property
    def connections(self) -> list[Any]:
        return [*self.fronts, *super().connections]

    def pre_shutdown(self) -> None:
        self.draining = True
        for front in list(self.fronts):
            front.drain()
        super().pre_shutdown()

    async def shutdown(self, timeout: float | None = None) -> None:
        fronts = [front.shutdown(timeout) for front in list(self.fronts)]
        await asyncio.gather(*fronts, super().shutdown(timeout))


class Front(SendWatch, FlowControl):
    """A connection's first protocol: plain fresh hits answered as they are read, other plain
    requests in its lane, and the rest handed to aiohttp's handler."""

    __slots__ = (
        "_access_logger", "_answer_bytes", "_answers", "_answers_after", "_buffer", "_drained",
        "_ended", "_hit_lines",
        "_hit_log", "_idle", "_lane", "_last", "_life", "_parser", "_remote",
        "_scheme", "_send_timeout", "_sending", "_server", "_start", "_unsent",
    )  # fmt: skip

    def __init__(self, server: HitServer) -> None:
        super().__init__(asyncio.get_running_loop())
        self._init_watch(server.send_timeout)
        self._server = server
        self._answers = server.answers
        self._answers_after = server.answers_after_bytes
        self._start = server.start
        self._answer_bytes = server.answer_bytes
        # As aiohttp's handler: whether to log is decided per connection, when it opens.
        logger = server.access_logger
        self._access_logger = logger if logger is not None and logger.enabled else None
        self._hit_log = server.hit_log
        # The compiled lines a hit read as it came is logged by (``LogLines.hit``).
        self._hit_lines = None if self._hit_log is None else self._hit_log.lines
        self._parser: HttpRequestParser | None = None
        self._buffer = b""  # bytes received and not yet answered or handed over
        # Where the connection is (``proxy.front.life``), and the work of the request in
        # progress, when there is one.
        self._life = Life(State.PROXY_HEADER if server.proxy_protocol else State.READING)
        self._lane: asyncio.Task[None] | Pending | None = None
        self._remote = ""
        self._scheme = "http"
        self._last = 0.0  # when the connection last answered, or opened
        self._idle: asyncio.TimerHandle | None = None
        self._ended: asyncio.Future[None] | None = None  # a graceful shutdown's wait

    @property
    def held(self) -> bytes:
        """The request bytes held behind the lane's request."""
        return self._buffer

    @property
    def state(self) -> State:
        """Where the connection is (``proxy.front.life``)."""
        return self._life.state

    @property
    def lane_idle(self) -> bool:
        """Whether no request of this connection is in progress: the next is read at once."""
        return not self._life.busy

    @property
    def handed_over(self) -> bool:
        """Whether aiohttp's protocol serves the connection now."""
        return self._life.state is State.HANDED_OVER

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        peer = transport.get_extra_info("peername")
        # As ``BaseRequest.remote``: the address of a TCP peer, else the peer as given.
        self._remote = peer[0] if isinstance(peer, (list, tuple)) else str(peer or "")
        if transport.get_extra_info("sslcontext") is not None:
            self._scheme = "https"
        self._server.fronts.add(self)
        self._last = self._loop.time()
        self._watch_idle()
        if self._server.draining:
            self.drain()

    # The read loop is compiled (``proxy/front/_loop.c``), so that a plain fresh hit runs no
    # Python frame (the frames were a tenth of a small hit's cost). It calls these methods by
    # name, for every branch but that hit's: ``_read_proxy_header``, ``_answer_at``,
    # ``_hand_over``, ``_send_large``, ``_log_parsed``, ``_failed``; and reads the slots
    # ``_buffer``, ``_life``, ``transport``, ``_paused``, ``_answer_bytes``, ``_hit_lines``,
    # ``_server``, ``_remote``, ``_last`` and ``_loop``.
    data_received = _loop.data_received
    _go_on = _loop.go_on

    def _read_proxy_header(self) -> bool:
        """Take the PROXY protocol header the buffer begins with: whether it was whole (the
        client's address taken); a connection without a valid one is closed."""
        try:
            read = proxy_protocol.parse(self._buffer)
        except ValueError as exc:
            HTTP_ERRORS.info("closing a connection without a PROXY protocol header: %s", exc)
            if self.transport is not None:
                self.transport.abort()
            self._buffer = b""
            return False
        if read is None:
            return False
        end, client = read
        if client is not None:
            self._remote = client
        self._buffer = self._buffer[end:]
        self._life.on(Event.HEADER)
        if not self._server.lane and self.transport is not None:  # all to aiohttp's handler
            self._hand_over(self._buffer)
            return False
        return True

    def eof_received(self) -> bool | None:
        return None  # the transport closes, as under aiohttp's handler

    def connection_lost(self, exc: BaseException | None) -> None:
        self._server.fronts.discard(self)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        # The lane's request goes on (its fetch may still be stored); its writes find the
        # transport closed. A large hit's rest is not sent: it ends here, and is logged.
        unsent = self._lane
        if type(unsent) is _Unsent:
            self._unsent_ended(unsent)
            self._lane_free()
        self._life.on(Event.LOST)
        super().connection_lost(exc)

    def _answer_at(
        self, data: bytes, start: int, found: Any
    ) -> tuple[int, tuple[bytes, Any, int] | None, RawRequestMessage | None]:
        """The request at ``data[start:]``, which the compiled answerer read whole and
        declined or did not read (``found``: what it said), as parsed: where the next request
        begins, and its hit's answer (head, body, status) with the message, for ``_go_on`` to
        write; no answer when it went to the lane. (-1, None, None) when more bytes must come
        first, or the connection was handed over."""
        if found is None:
            end = data.find(b"\r\n\r\n", start) + 4
            if end < 4:
                rest = data[start:]
                if len(rest) > self._server.head_limit or b"\n" in rest.replace(b"\r\n", b""):
                    self._hand_over(rest)  # too long, or a bare LF: the parser refuses it
                return -1, None, None
        else:
            end = found[0]
        message = self._parse(data[start:end])
        if message is None or not lane_may_answer(message):
            self._hand_over(data[start:])
            return -1, None, None
        answered = None
        # None: read whole and declined by the compiled answerer, which is not asked again;
        # False: nothing stored for its URL that may answer on the loop, which ends the
        # search; anything else: what it learned (a record to read off the loop), which
        # ends it too and goes to the lane with the request.
        if found is not None and found[1] is not None:
            answered = found[1]
        else:
            answers = self._answers if found is None else self._answers_after
            try:
                for answer in answers:
                    answered = answer(message, self._remote, self._scheme)
                    if answered is not None:
                        break
            except Exception:
                HTTP_ERRORS.exception(
                    "answering %s %s as parsed failed", message.method, message.path
                )
                answered = None
        if type(answered) is tuple:
            return end, answered, message
        self._last = self._loop.time()
        self._run_lane(message, None if answered is None or answered is False else answered)
        return end, None, None

    def _parse(self, head: bytes) -> RawRequestMessage | None:
        """``head``, one request's head, as aiohttp's handler would parse it; None when the
        parser refuses it, reads a body or more than one request into it."""
        parser = self._parser
        if parser is None:
            line, field, headers = self._server.limits
            parser = self._parser = HttpRequestParser(
                self, self._loop, 2**16, max_line_size=line, max_field_size=field,
                max_headers=headers,
            )  # fmt: skip
        try:
            messages, upgraded, _ = parser.feed_data(head)
        except HttpProcessingError:
            self._parser = None
            return None
        if upgraded or len(messages) != 1 or messages[0][1] is not EMPTY_PAYLOAD:
            self._parser = None  # it may stand inside a body: a new one reads the next head
            return None
        parser.message_consumed()
        return messages[0][0]

    def _log_parsed(
        self, message: RawRequestMessage, head: bytes, body: Any, status: int, began: float
    ) -> None:
        """The log line of a hit ``_answer_at`` answered as parsed (``began``: when its
        request was read, by ``perf_counter``)."""
        self._log(self._hit_log, LoggedRequest(message, self._remote),
                  LoggedResponse(head, body, status), began)  # fmt: skip

    def _failed(self, what: str, exc: BaseException) -> None:
        """Log ``exc``, raised in the compiled loop doing ``what``: the request or its answer
        goes on without what failed."""
        HTTP_ERRORS.error(what, exc_info=exc)

    def _log(self, logger: Any, request: Any, response: Any, began: float) -> None:
        """The access log line of an answer written here, as aiohttp's handler logs one
        (``began``: when its request was read, by ``perf_counter``)."""
        logger.log(request, response, perf_counter() - began)

    def _send_large(
        self,
        head: bytes,
        body: bytes | memoryview,
        status: int,
        began: float,
        message: RawRequestMessage | None,
        data: bytes,
        start: int,
        end: int,
    ) -> None:
        """Write ``head``, then ``body`` a ``PIECE`` at a time while the transport takes
        writes; what is left is written as it drains (``resume_writing``), and the requests
        after it wait in the lane's place. The answer's log line is written when its last
        byte is handed over, or when the connection ends before, with the bytes written
        then (``message``: its request as parsed, None: read from ``data[start:end]``;
        ``began``: when it was read, by ``perf_counter``)."""
        view = memoryview(body)
        assert self.transport is not None
        self.transport.writelines((head, view[:PIECE]))
        rest = self._write_while_taken(view[PIECE:])
        line = None
        if self._hit_lines is not None:
            line = _LargeHit(head, view, status, began, message, data, start, end)
        if rest is not None:
            self._lane = _Unsent(rest, line)
            self._life.on(Event.HIT_IN_PART)
        elif line is not None:
            self._log_large(line, len(view))

    def _unsent_ended(self, unsent: _Unsent) -> None:
        """Log the large hit whose rest ``unsent`` held, as far as it was handed over."""
        line, unsent.line = unsent.line, None
        if line is not None:
            self._log_large(line, len(line.body) - len(unsent.rest))

    def _log_large(self, hit: _LargeHit, sent: int) -> None:
        """The log line of a large hit ``_send_large`` began, ``sent`` bytes of its body
        handed over: as ``deliver`` in ``_loop.c`` logs every other hit, from the request's
        bytes (``LogLines.hit``) or as parsed (``_log_parsed``)."""
        body = hit.body[:sent]
        try:
            if hit.message is None:
                self._hit_lines.hit(hit.data, hit.start, hit.end, self._remote, hit.head, body,
                                    hit.status, hit.began)  # fmt: skip
            else:
                self._log_parsed(hit.message, hit.head, body, hit.status, hit.began)
        except Exception as exc:
            self._failed("an access log line failed", exc)

    def _write_while_taken(self, rest: memoryview) -> memoryview | None:
        """Write pieces of ``rest`` until writing pauses or the connection closes; what is
        left of it, if anything."""
        transport = self.transport
        while rest:
            if transport is None or transport.is_closing() or self.writing_paused:
                return rest
            transport.write(rest[:PIECE])
            rest = rest[PIECE:]
        return None

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._life.state not in SENDING_STATES:
            return
        unsent = self._lane
        assert type(unsent) is _Unsent
        # Nothing else writes on the connection while the body's rest is unsent: the
        # requests after it are held in the lane's place.
        rest = self._write_while_taken(unsent.rest)
        if rest is not None:
            unsent.rest = rest
            return  # more as it drains; a connection closing ends it (connection_lost)
        unsent.rest = memoryview(b"")
        self._unsent_ended(unsent)
        self._lane_free()
        # The answer ended now: the idle timeout counts from here, as after a lane's answer.
        self._last = self._loop.time()
        if self._life.on(Event.SENT) is _CLOSED:
            if self.transport is not None:
                self.transport.close()
            return
        self._go_on()

    def _run_lane(self, message: RawRequestMessage, carried: Any = None) -> None:
        """Answer ``message`` in the lane, with what an answerer made of it (``carried``)."""
        self._server.requests_count += 1
        self._life.on(_TO_LANE)
        request = LaneRequest(message, self._remote, self._scheme, self, self._loop, carried)
        work = self._start(request)
        if isinstance(work, Pending):
            self._lane = work
        else:
            self._lane = self._loop.create_task(self._lane_request(request, work))

    async def _lane_request(
        self, request: LaneRequest, work: Awaitable[web.StreamResponse]
    ) -> None:
        response = None
        written = False
        try:
            response = await work
            if type(response) is not Written:
                await response.prepare(request)  # type: ignore[arg-type]
                await response.write_eof()
            written = True
        except ConnectionError:
            pass  # the client left: its connection closes below
        except Exception:
            HTTP_ERRORS.exception(
                "answering %s %s in the lane failed", request.method, request.raw_path
            )
        finally:
            self._lane_free()
        self._lane_done(request, response, written)

    def lane_begun(self) -> None:
        """The lane's answer's head went out: from now on the answer ends whole, or the
        connection closes."""
        self._life.on(_HEAD_OUT)

    def lane_answered(self, request: LaneRequest, response: Written) -> None:
        self._lane_free()
        self._lane_done(request, response, True)

    def lane_go_on(self, request: LaneRequest, work: Awaitable[web.StreamResponse]) -> None:
        self._lane = self._loop.create_task(self._lane_request(request, work))

    def _lane_free(self) -> None:
        """The lane's request is no longer in progress."""
        self._lane = None
        if self.reading_paused:
            self.release_reading()
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_result(None)

    def _lane_done(
        self, request: LaneRequest, response: web.StreamResponse | None, written: bool
    ) -> None:
        """After the lane's answer (``written``: whole): its log line, then the requests
        held behind it, or the connection's end."""
        self._last = self._loop.time()
        if response is not None and self._access_logger is not None:
            self._log(self._access_logger, request, response, request.started)
        # Not kept: not whole, not kept alive, or cut by the handler (``Proxy._cut``).
        transport = self.transport
        kept = (
            written
            and response.keep_alive  # type: ignore[union-attr]
            and transport is not None
            and not transport.is_closing()
        )
        if self._life.on(_ANSWERED if kept else _CLOSE) is _CLOSED:
            if self.transport is not None:
                self.transport.close()
            return
        self._go_on()

    def _hand_over(self, data: bytes) -> None:
        """Give the connection to aiohttp's handler, which reads ``data`` first."""
        transport = self.transport
        assert transport is not None
        self._life.on(Event.HAND_OVER)
        self._server.fronts.discard(self)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.stop_watching()
        if self.reading_paused:
            self.release_reading()
        self._buffer = b""
        handler = self._server.handler()
        if self._server.proxy_protocol:
            handler.client = self._remote
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self.writing_paused:
            handler.pause_writing()
        handler.data_received(data)

    def _watch_idle(self) -> None:
        timeout = self._server.keepalive_timeout
        if timeout > 0:
            self._idle = self._loop.call_at(self._last + timeout, self._check_idle)

    def _check_idle(self) -> None:
        """Close a connection that answered nothing for the idle timeout and has nothing in
        progress (a request in part counts as nothing, as under aiohttp's handler)."""
        self._idle = None
        if self.transport is None:
            return
        now = self._loop.time()
        if now >= self._last + self._server.keepalive_timeout:
            if self._life.on(Event.IDLE) is _CLOSED:
                self.transport.close()
                return
            self._last = now  # a request in progress: look again an idle timeout from now
        self._watch_idle()

    def drain(self) -> None:
        """Answer no request after the one in progress (a graceful shutdown)."""
        if self._life.on(Event.DRAIN) is _CLOSED and self.transport is not None:
            self.transport.close()

    async def shutdown(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` for the lane's request, then close; one still running is
        cancelled, as the handler's would be."""
        self.drain()
        if self._life.busy:
            self._ended = self._loop.create_future()
            try:
                await asyncio.wait_for(self._ended, timeout)
            except TimeoutError:
                lane = self._lane
                if type(lane) is _Unsent:
                    self._unsent_ended(lane)
                if lane is not None:
                    lane.cancel()
                    if not isinstance(lane, asyncio.Task):
                        self._lane_free()
                self._life.on(_CLOSE)
        if self.transport is not None:
            self.transport.close()


class _LargeHit(NamedTuple):
    """What a large hit's log line is made of, once its body has gone (``Front._log_large``):
    its request as parsed (``message``), or None and its bytes, ``data[start:end]``."""

    head: bytes
    body: memoryview
    status: int
    began: float  # when its request was read, by ``perf_counter``
    message: RawRequestMessage | None
    data: bytes
    start: int
    end: int


class _Unsent(Pending):
    """The rest of a large body answered as read, written as the transport drains, and what
    its log line is made of (None: not logged)."""

    __slots__ = ("line", "rest")

    def __init__(self, rest: memoryview, line: _LargeHit | None) -> None:
        self.rest = rest
        self.line = line

    def cancel(self) -> None:
        self.rest = memoryview(b"")
