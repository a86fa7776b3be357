"""Plain requests answered by the connection's protocol, before aiohttp's request handler.

A cache hit is the request a cache exists for, and aiohttp's request and response objects cost
more than the rest of a hit together. ``HitServer`` makes aiohttp's own connection protocol
(``RequestHandler``) try each request as a hit first, and run the other plain requests (a miss,
mostly) in a task of its own, its *lane*, instead of its handler's loop. What it guarantees:

* One parser judges. aiohttp's request parser (llhttp, strict) splits the bytes into
  requests, as it does for every other request; what it refuses is refused as before (400),
  never answered. Only while that parser stands at a request's start, holding no bytes, and
  no access log reads its messages, may a request be read from its bytes instead
  (``PlainHits.answer_bytes``): one whole plain request (GET or HEAD, origin-form,
  HTTP/1.1, plain fields, one Host, nothing that frames a body or ends the connection), a
  strict subset of what that parser takes, read as it reads it. A hit so read is answered at
  once; any other such request is fed to the parser, exactly its bytes, and goes on as
  parsed. From the first bytes that are not one whole plain request, the parser reads the
  connection's bytes for the rest of its life.
* Only a plain fresh hit is answered as parsed; the answerers say which (``Proxy.answer_hit``,
  and its compiled common case ``Proxy.plain_hits``): GET or HEAD, HTTP/1.1 keep-alive, no
  body, no precondition (a matching validator gets its 304 and a byte range its 206 or 416
  here too).
* Another plain request (GET or HEAD, HTTP/1.1 keep-alive, no body, an origin-form target and
  a Host) goes to the lane: the same request handler (``Proxy.handle``) answers it, over a
  request object that carries only what the handler and aiohttp's responses read
  (``LaneRequest``), without the handler loop's task and request object per request. What
  starts it (``Proxy.start``) may instead leave it ``Pending`` outside any task (a miss sent
  to the origin at once, answered in the callback that brings the answer): it then ends as
  a lane's request ends, or goes on as the lane's task.
* Anything else goes to aiohttp's handler. Requests keep their order: while the lane answers
  one, the requests after it are held, parsed, and go on (answered as parsed, to the lane, or
  to the handler) when it ends; once one is queued for the handler, every later request on
  the connection waits its turn behind it.
* The same answer: the same status, fields, body and counters as the handler would give, and
  the same access log line.
* Back-pressure holds. While the client is not reading (the transport asked to pause
  writing), requests queue for aiohttp's handler, which waits for the client, and the queue's
  limit stops reading the connection. A hit's body past ``PIECE`` bytes is handed to the
  transport a piece at a time as it drains, never copied, and the requests after it are held
  until its last piece is written. The lane writes through aiohttp's writer (as
  ``FieldWriter`` extends it), which waits for the client too, and the requests it holds
  meet the same limit; an answer whose whole body is in hand (a small miss, mostly) it may
  write at once, as a hit is written (``LaneRequest.write_at_once``): the bytes that writer
  would write.
* Every answer pushes back the connection's idle timeout, as one from the handler does; a
  connection is not idle while the lane answers on it.
* A graceful shutdown waits for the lane's request as for the handler's.
* A bug in answering a hit here is logged, and the lane or the handler answers the request.

It drives a few of ``RequestHandler``'s private fields (its parser, its queue of requests, its
idle timer, its request-in-progress flag), which is why ``pyproject.toml`` holds aiohttp to
one minor version and ``tests/test_fastpath.py`` pins every one of these rules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from multidict import CIMultiDict

from proxy.logs import HTTP_ERRORS
from proxy.writer import PIECE, ClientProtocol, FieldWriter, ProxyServer

# A body below this is joined to its head in one bytes object (copying it costs less than a
# second send); a larger one goes beside it in one ``writelines``: one system call on uvloop
# (writev, where two writes made two) and on asyncio's loop from Python 3.12 (sendmsg), while
# 3.11's asyncio joins the two itself (measured no slower than two writes).
JOIN_BELOW = 64 << 10

# A plain fresh hit's whole answer (bytes to write, then a body to write apart or b"", and the
# status); None when the next answerer, and after the last the lane or aiohttp's handler, is
# to answer; False when no answerer could answer it as a hit (nothing is stored for it).
AnswerHit = Callable[[RawRequestMessage, str, str], "tuple[bytes, bytes, int] | bool | None"]


class Pending:
    """A lane's request under way outside a task: it ends with ``LaneRequest.answered``, or
    goes on as a task with ``LaneRequest.go_on``. A plain class, not an ABC: the lane asks
    ``isinstance`` of it per request."""

    __slots__ = ()

    def cancel(self) -> None:
        """Drop the request: the connection shuts down before it ended."""
        raise NotImplementedError


# The answer to the request at ``data[start:]`` as its bytes came (``PlainHits.answer_bytes``):
# (end, answer bytes, body or b"", status) for a hit; (end, False) for a whole plain request
# with nothing stored, (end, None) for one the other answerers are to judge; None when the
# bytes are not one whole plain request.
AnswerBytes = Callable[[bytes, int], "tuple[Any, ...] | None"]

# What starts a lane's request: the work answering it, or a ``Pending`` one. It never raises:
# a failure is the work's, answered as the handler answers one (``Proxy.start``).
StartLane = Callable[["LaneRequest"], "Awaitable[web.StreamResponse] | Pending"]


class HitServer(ProxyServer):
    """``ProxyServer`` whose connections try ``answers``, in order, and run the other plain
    requests in their lane (started by ``start``: by default the work of ``handler``), before
    aiohttp's request handler."""

    def __init__(
        self,
        handler: Any,
        answers: Sequence[AnswerHit],
        start: StartLane | None = None,
        answer_bytes: AnswerBytes | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.answers = tuple(answers)
        self.start: StartLane = start if start is not None else handler
        self.answer_bytes = answer_bytes

    def __call__(self) -> RequestHandler:
        return HitHandler(self, loop=self._loop, **self._kwargs)


class HitHandler(ClientProtocol):
    """aiohttp's connection protocol, answering plain fresh hits as they are parsed and other
    plain requests in its lane."""

    __slots__ = (
        "_answer_bytes", "_answers", "_at_start", "_full", "_held", "_lane", "_remote",
        "_scheme", "_start",
    )  # fmt: skip

    def __init__(self, manager: HitServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._answers = manager.answers
        self._start = manager.start
        self._answer_bytes = manager.answer_bytes
        # Whether aiohttp's parser stands at a request's start, holding no bytes, so that the
        # next request may be read from its bytes (``_answer_whole``).
        self._at_start = self._answer_bytes is not None
        self._remote = ""
        self._scheme = "http"
        self._lane: asyncio.Task[None] | Pending | None = None
        self._held: list[tuple[Any, Any]] = []
        self._full = False  # whether the parser may hold bytes back at its queue limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        # As ``BaseRequest.remote``: the address of a TCP peer, else the peer as given.
        self._remote = peer[0] if isinstance(peer, (list, tuple)) else str(peer or "")
        if transport.get_extra_info("sslcontext") is not None:
            self._scheme = "https"

    def data_received(self, data: bytes) -> None:
        if self._lane is not None and not (self._force_close or self._close):
            self._hold(data)
            return
        if (
            self._force_close
            or self._close
            or self._payload_parser is not None
            or self._upgraded
            or not self._idle()
        ):
            if data:
                self._at_start = False
            super().data_received(data)
            return
        if self._at_start and data:
            data = self._answer_whole(data)
            if data:
                self._at_start = False
                self.data_received(data)
            return
        while True:
            messages, upgraded, tail = self._parse(data)
            taken = self._answer(messages)
            if upgraded or taken < len(messages) or not self._full or self._lane is not None:
                break
            # Every request was answered, and the parser may have stopped at its queue limit
            # and held the rest of the bytes back, so ask it for more.
            data = b""
        self._upgraded = upgraded
        if upgraded and tail:
            self._message_tail = tail
        self._pass_on(messages[taken:])

    def _answer_whole(self, data: bytes) -> bytes:
        """Answer the leading whole plain requests of ``data`` from their bytes: a hit
        (``PlainHits.answer_bytes``) at once, as ``_answer`` writes one; any other, once
        aiohttp's parser has read exactly its bytes, as ``_answer`` answers it. What is left
        from the first request that is not a whole plain one, or from where answering must
        wait (a lane's request, a client not reading), is the parser's to read."""
        answer = self._answer_bytes
        assert answer is not None
        transport = self.transport
        start, size = 0, len(data)
        while start < size and not self._paused and transport is not None:
            started = self._loop.time()
            try:
                found = answer(data, start)
            except Exception:
                # A bug here costs speed, never the answer: aiohttp's parser reads the rest.
                HTTP_ERRORS.exception("answering a request as its bytes came failed")
                found = None
            if found is None:
                break
            end = found[0]
            if len(found) == 4:
                # As ``_answer`` writes a hit, inline: a method shared by the two cost 4-7% of
                # the hits per second read from their bytes (1 KiB, measured).
                self._request_count += 1
                self._manager.requests_count += 1  # type: ignore[union-attr]
                body = found[2]
                if not body:
                    transport.write(found[1])
                elif len(body) <= PIECE:
                    transport.writelines((found[1], body))
                else:
                    self._send_large(found[1], body)
                self._next_keepalive_close_time = started + self._keepalive_timeout
                if self._logging_enabled and self.access_logger is not None:
                    self.access_logger.log(
                        _ReadRequest(data[start:end], self._remote),  # type: ignore[arg-type]
                        _LoggedResponse(*found[1:]),  # type: ignore[arg-type]
                        self._loop.time() - started,
                    )
                start = end
                continue
            # Exactly one whole request: the parser stands at a request's start again after.
            messages, _, _ = self._parse(data[start:end])
            self._at_start = True
            start = end
            taken = self._answer(messages, nothing_stored=found[1] is False)
            if taken < len(messages):
                self._pass_on(messages[taken:])
                break
            if self._lane is not None:
                break
        return data[start:]

    def _parse(self, data: bytes) -> tuple[list[tuple[Any, Any]], bool, bytes]:
        """The requests in ``data``, as aiohttp's handler parses them: a request the parser
        refuses becomes its 400."""
        parser = self._parser
        assert parser is not None
        if data:
            self._at_start = False
        try:
            messages, upgraded, tail = parser.feed_data(data)
        except HttpProcessingError as exc:
            error = _ErrInfo(status=400, exc=exc, message=exc.message)
            return [(error, EMPTY_PAYLOAD)], False, b""
        # The parser stops once as many requests as its queue holds are parsed and not yet
        # taken (those held here among them), and keeps the bytes after them until fed again.
        self._full = len(messages) + len(self._held) >= self._max_msg_queue_size - 1
        return messages, upgraded, tail

    def _pass_on(self, rest: list[tuple[Any, Any]]) -> None:
        """Hold ``rest`` behind the lane's request, or hand it to aiohttp's handler."""
        if self._lane is not None:
            self._held.extend(rest)
            self._hold_limit()
            return
        self._queue(rest)
        if rest and not self._upgraded:
            # The parser stops at its queue limit and holds back the bytes after it; what it
            # held goes to the handler's queue now, behind ``rest``, as the handler's own
            # reading would have sent it.
            super().data_received(b"")

    def _hold(self, data: bytes) -> None:
        """Parse and hold what arrives while the lane answers a request."""
        if self._upgraded:
            self._message_tail += data
        else:
            messages, upgraded, tail = self._parse(data)
            self._held.extend(messages)
            self._upgraded = upgraded
            if upgraded and tail:
                self._message_tail = tail
        self._hold_limit()

    def _hold_limit(self) -> None:
        """Stop reading at the limits of aiohttp's own queue and tail."""
        if not self._buffer_paused and (
            len(self._held) >= self._max_msg_queue_size
            or len(self._message_tail) >= self._read_bufsize
        ):
            self._pause_reading_for_buffer()

    def _idle(self) -> bool:
        """Nothing is queued for or being handled by aiohttp's handler: an answer written now
        is in order."""
        if self._messages or self._request_in_progress:
            return False
        waiter = self._waiter
        # Parked for the next request, or not yet started (no request seen).
        return (waiter is not None and not waiter.done()) or self._request_count == 0

    def _answer(self, messages: list[tuple[Any, Any]], *, nothing_stored: bool = False) -> int:
        """Answer the leading plain hits of ``messages``, and start the lane on the plain
        request after them, if one is; how many requests were taken. ``nothing_stored``:
        the first request's URL has nothing stored (no answerer need be asked)."""
        transport = self.transport
        done = 0
        for message, payload in messages:
            if (
                self._paused
                or transport is None
                or payload is not EMPTY_PAYLOAD
                or type(message) is _ErrInfo
            ):
                break
            started = self._loop.time()
            answered = None
            try:
                for answer in () if nothing_stored else self._answers:
                    answered = answer(message, self._remote, self._scheme)
                    if answered is not None:
                        break
            except Exception:
                # A bug here costs speed, never the answer: the lane or the handler answers.
                HTTP_ERRORS.exception(
                    "answering %s %s as parsed failed", message.method, message.path
                )
                answered = None
            if not answered:
                if _lane_may_answer(message):
                    self._run_lane(message)
                    done += 1
                break
            self._request_count += 1
            self._parser.message_consumed()  # type: ignore[union-attr]
            self._manager.requests_count += 1  # type: ignore[union-attr]
            body = answered[1]
            if not body:
                transport.write(answered[0])
            elif len(body) <= PIECE:
                transport.writelines((answered[0], body))
            else:
                self._send_large(answered[0], body)
            self._next_keepalive_close_time = started + self._keepalive_timeout
            if self._logging_enabled and self.access_logger is not None:
                self.access_logger.log(
                    _LoggedRequest(message, self._remote),  # type: ignore[arg-type]
                    _LoggedResponse(*answered),  # type: ignore[arg-type]
                    self._loop.time() - started,
                )
            done += 1
        return done

    def _send_large(self, head: bytes, body: bytes | memoryview) -> None:
        """Write ``head``, then ``body`` a ``PIECE`` at a time while the transport takes
        writes; what is left is written as it drains (``resume_writing``), and the requests
        after it wait in the lane's place."""
        view = memoryview(body)
        assert self.transport is not None
        self.transport.writelines((head, view[:PIECE]))
        rest = self._write_while_taken(view[PIECE:])
        if rest is not None:
            self._lane = _Unsent(rest)
            self._request_in_progress = True  # a graceful shutdown waits for it

    def _write_while_taken(self, rest: memoryview) -> memoryview | None:
        """Write pieces of ``rest`` until writing pauses; what is left of it, if anything."""
        transport = self.transport
        while rest:
            if transport is None or transport.is_closing():
                return None
            if self._paused:
                return rest
            transport.write(rest[:PIECE])
            rest = rest[PIECE:]
        return None

    def resume_writing(self) -> None:
        super().resume_writing()
        unsent = self._lane
        if type(unsent) is not _Unsent:
            return
        # Nothing else writes on the connection while the body's rest is unsent: the
        # requests after it are held in the lane's place.
        rest = self._write_while_taken(unsent.rest)
        if rest is not None:
            unsent.rest = rest
            return
        self._lane_free()
        self._go_on()

    def _run_lane(self, message: RawRequestMessage) -> None:
        """Answer ``message`` in the lane, counted as aiohttp's handler counts a request."""
        self._request_count += 1
        self._parser.message_consumed()  # type: ignore[union-attr]
        self._manager.requests_count += 1  # type: ignore[union-attr]
        self._request_in_progress = True  # a graceful shutdown waits for it
        request = LaneRequest(message, self._remote, self._scheme, self)
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

    def _lane_free(self) -> None:
        """The lane's request is no longer in progress."""
        self._lane = None
        self._request_in_progress = False
        waiter = self._handler_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _lane_done(
        self, request: LaneRequest, response: web.StreamResponse | None, written: bool
    ) -> None:
        """After the lane's answer (``written``: whole): its log line, then the requests
        held behind it, or the connection's end."""
        if response is not None and self._logging_enabled and self.access_logger is not None:
            self.access_logger.log(request, response, self._loop.time() - request.started)  # type: ignore[arg-type]
        if not written or not response.keep_alive:  # type: ignore[union-attr]
            self.force_close()
            return
        self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout
        self._go_on()

    def _go_on(self) -> None:
        """After the lane's answer: the held requests go on in order."""
        held, self._held = self._held, []
        if self._force_close or self._close or self.transport is None:
            return
        if held:
            taken = self._answer(held)
            self._pass_on(held[taken:])
        if self._lane is None and not self._messages:
            if self._buffer_paused:
                self._resume_reading_if_drained()
            elif self._full:
                self.data_received(b"")

    def _process_keepalive(self) -> None:
        if self._lane is not None:
            # Not idle: look again an idle timeout after now.
            self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout
        super()._process_keepalive()

    async def shutdown(self, timeout: float | None = 15.0) -> None:
        # aiohttp's shutdown waits for the lane's request (it is in progress) up to
        # ``timeout``; one still running then is cancelled, as the handler's would be.
        await super().shutdown(timeout)
        lane = self._lane
        if lane is not None:
            lane.cancel()
            if isinstance(lane, Pending):
                self._lane_free()

    def _queue(self, messages: list[tuple[Any, Any]]) -> None:
        """Hand ``messages`` to aiohttp's handler, as ``RequestHandler.data_received`` does."""
        if not messages:
            return
        self._request_count += len(messages)
        self._messages.extend(messages)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if not self._buffer_paused and len(self._messages) >= self._max_msg_queue_size:
            self._pause_reading_for_buffer()


class _Unsent(Pending):
    """The rest of a large body answered on the fast path, written as the transport drains."""

    __slots__ = ("rest",)

    def __init__(self, rest: memoryview) -> None:
        self.rest = rest

    def cancel(self) -> None:
        self.rest = memoryview(b"")


def _lane_may_answer(message: RawRequestMessage) -> bool:
    """Whether the lane may answer ``message``: GET or HEAD, HTTP/1.1 keep-alive, no body or
    upgrade, an origin-form target and a Host field."""
    return (
        (message.method == "GET" or message.method == "HEAD")
        and message.version == HttpVersion11
        and not message.should_close
        and not message.upgrade
        and not message.chunked
        and message.path.startswith("/")
        and "Host" in message.headers
    )


class _LoggedRequest:
    """What the access loggers read of a request answered here."""

    # Plain attributes, not properties over the message: a miss in the lane reads them a
    # dozen times.
    __slots__ = ("_message", "headers", "method", "raw_path", "remote", "version")

    def __init__(self, message: RawRequestMessage, remote: str) -> None:
        self._message = message
        self.remote = remote
        self.method = message.method
        self.raw_path = message.path
        self.version = message.version
        self.headers = message.headers

    path_qs = property(lambda self: str(self._message.url))
    host = property(lambda self: self.headers.get("Host"))


class _ReadRequest:
    """What the access loggers read of a request answered from its bytes (``head``: one
    whole plain request, ``PlainHits.answer_bytes`` says), read from them as a log asks."""

    __slots__ = ("_head", "remote")

    version = HttpVersion11

    def __init__(self, head: bytes, remote: str) -> None:
        self._head = head
        self.remote = remote

    method = property(lambda self: self._head.partition(b" ")[0].decode("ascii"))
    raw_path = property(lambda self: self._head.split(b" ", 2)[1].decode("ascii"))
    path_qs = raw_path
    host = property(lambda self: self.headers.get("Host"))

    @property
    def headers(self) -> CIMultiDict[str]:
        lines = self._head.decode("ascii").split("\r\n")[1:]
        fields = (line.partition(":") for line in lines if line)
        return CIMultiDict((name, value.strip(" \t")) for name, _, value in fields)


class _LoggedResponse:
    """What the access loggers read of an answer written here."""

    __slots__ = ("_body", "_head", "status")

    def __init__(self, head: bytes, body: bytes, status: int) -> None:
        self._head = head
        self._body = body
        self.status = status

    # As aiohttp counts it: every byte written, head included.
    body_length = property(lambda self: len(self._head) + len(self._body))

    @property
    def headers(self) -> CIMultiDict[str]:
        head = self._head[: self._head.index(b"\r\n\r\n")].decode("utf-8", "surrogateescape")
        fields = (line.partition(": ") for line in head.split("\r\n")[1:])
        return CIMultiDict((name, value) for name, _, value in fields)


class Written(_LoggedResponse):
    """An answer the handler wrote whole through ``LaneRequest.write_at_once``: nothing of it
    is left to prepare or write, and it keeps the connection open."""

    __slots__ = ()

    keep_alive = True


class LaneRequest(_LoggedRequest):
    """A request the lane answers: what the proxy's handler and aiohttp's responses read of a
    ``web.BaseRequest``, for a plain request (no body, keep-alive, origin-form)."""

    __slots__ = ("_protocol", "_writer", "raw_headers", "scheme", "started", "transport")

    body_exists = False
    can_read_body = False
    content = EMPTY_PAYLOAD
    keep_alive = True

    def __init__(
        self,
        message: RawRequestMessage,
        remote: str,
        scheme: str,
        protocol: HitHandler,
    ) -> None:
        super().__init__(message, remote)
        self.scheme = scheme
        self._protocol = protocol
        self.transport = protocol.transport
        self._writer: FieldWriter | None = None
        self.raw_headers = message.raw_headers
        self.started = protocol._loop.time()

    @property
    def _payload_writer(self) -> FieldWriter:
        """The writer of a response to this request, made when one is first written
        through it (an answer written at once needs none)."""
        if self._writer is None:
            self._writer = FieldWriter(self._protocol, self._protocol._loop)
        return self._writer

    writer = property(lambda self: self._payload_writer)

    def write_at_once(self, head: bytes, body: bytes, status: int) -> Written | None:
        """Write a whole answer (its head, ending in a blank line, and body) now, as aiohttp's
        writer would write it; None, writing nothing, when the client has gone. No wait for the
        client to read is needed: the lane starts only while the transport takes writes, and
        nothing else writes on the connection while it answers."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return None
        if len(body) < JOIN_BELOW:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        return Written(head, body, status)

    def answered(self, response: Written) -> None:
        """A ``Pending`` request was answered, whole, by ``write_at_once``."""
        protocol = self._protocol
        protocol._lane_free()
        protocol._lane_done(self, response, True)

    def go_on(self, work: Awaitable[web.StreamResponse]) -> None:
        """A ``Pending`` request goes on as the lane's task, answered by ``work``."""
        protocol = self._protocol
        protocol._lane = protocol._loop.create_task(protocol._lane_request(self, work))

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        """As ``web.BaseRequest``'s: no application signals to send."""
