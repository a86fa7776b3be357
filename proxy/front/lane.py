"""A connection's lane: the requests a proxy's connection protocol answers through the proxy's
handler without aiohttp's request handler, and the objects they are answered with.

* ``LaneRequest`` carries what the handler and aiohttp's responses read of a
  ``web.BaseRequest``, for a plain request (GET or HEAD, HTTP/1.1 keep-alive, no body,
  origin-form, a Host: ``lane_may_answer``); its writer is aiohttp's, made transparent
  (``FieldWriter``), over the connection's flow control.
* An answer whose body is in hand may be written at once, head and body in one write, as
  aiohttp's writer would write it (``LaneRequest.write_at_once``, giving a ``Written``).
* A request may be ``Pending`` outside any task: it ends with ``LaneRequest.answered`` or goes
  on as the lane's task with ``LaneRequest.go_on``; the connection (a ``Lane``) does either.
* The answerers' signatures: of a hit from a parsed request (``AnswerHit``) or from its
  bytes (``AnswerBytes``), and of what starts a lane's request (``StartLane``).
* What an access logger reads of a request or an answer written here (``LoggedRequest``,
  ``LoggedResponse``) is what it reads of aiohttp's, so the log line is the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any, Protocol

from aiohttp import EMPTY_PAYLOAD, web
from aiohttp.http import HttpVersion11, RawRequestMessage
from multidict import CIMultiDict

from proxy.wire.seam import AnsweredRequest, FieldWriter

# A body below this is joined to its head in one bytes object (copying it costs less than a
# second send); a larger one goes beside it in one ``writelines``: one system call on uvloop
# (writev, where two writes made two) and on asyncio's loop from Python 3.12 (sendmsg), while
# 3.11's asyncio joins the two itself (measured no slower than two writes).
JOIN_BELOW = 64 << 10


# A plain fresh hit's whole answer (a tuple: bytes to write, then a body to write apart or
# b"", and the status); None when the next answerer, and after the last the lane or aiohttp's
# handler, is to answer; False when no answerer could answer it as a hit (nothing is stored
# for it); any other object is what the answerer learned of a request it did not answer (the
# proxy's: its plan, or where a record the page cache does not hold lies), which the lane's
# request carries to the handler (``carried``), and no answerer after it is asked.
AnswerHit = Callable[[RawRequestMessage, str, str], Any]


# The answer to the request at ``data[start:]`` as its bytes came (``PlainHits.answer_bytes``):
# (end, answer bytes, body or b"", status) for a hit; (end, False) for a whole plain request
# with nothing stored, (end, what it learned) for one the lane is to answer with that (a
# record the page cache does not hold), (end, None) for one the other answerers are to
# judge; None when the bytes are not one whole plain request.
AnswerBytes = Callable[[bytes, int], "tuple[Any, ...] | None"]

# What starts a lane's request: the work answering it, or a ``Pending`` one. It never raises:
# a failure is the work's, answered as the handler answers one (``Proxy.start``).
StartLane = Callable[["LaneRequest"], "Awaitable[web.StreamResponse] | Pending"]


class Pending:
    """A lane's request under way outside a task: it ends with ``LaneRequest.answered``, or
    goes on as a task with ``LaneRequest.go_on``, never before ``StartLane`` returned it (the
    front's read loop moves past the request's bytes only when that returns: an answer
    within it would have the loop read the same request again). A plain class, not an ABC:
    the lane asks ``isinstance`` of it per request."""

    __slots__ = ()

    def cancel(self) -> None:
        """Drop the request: the connection shuts down before it ended."""
        raise NotImplementedError


class Lane(Protocol):
    """The connection a lane's request came on: its flow control (``FlowControl``) for its
    writer, what is told when the request's answer begins (``lane_begun``), and what ends or
    goes on with a ``Pending`` request."""

    transport: asyncio.Transport | None

    def lane_begun(self) -> None: ...

    def lane_answered(self, request: LaneRequest, response: Written) -> None: ...

    def lane_go_on(self, request: LaneRequest, work: Awaitable[web.StreamResponse]) -> None: ...


def lane_may_answer(message: RawRequestMessage) -> bool:
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


class LoggedRequest:
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


class LoggedResponse:
    """What the access loggers read of an answer written here."""

    __slots__ = ("_body", "_head", "status")

    def __init__(self, head: bytes, body: bytes, status: int) -> None:
        self._head = head
        self._body = body
        self.status = status

    # As aiohttp counts it: every byte written, head included.
    body_length = property(lambda self: len(self._head) + len(self._body))
    head_bytes = property(lambda self: self._head)

    @property
    def headers(self) -> CIMultiDict[str]:
        head = self._head[: self._head.index(b"\r\n\r\n")].decode("utf-8", "surrogateescape")
        fields = (line.partition(": ") for line in head.split("\r\n")[1:])
        return CIMultiDict((name, value) for name, _, value in fields)


class Written(LoggedResponse):
    """An answer the handler wrote whole through ``LaneRequest.write_at_once``: nothing of it
    is left to prepare or write, and it keeps the connection open."""

    __slots__ = ()

    keep_alive = True


class LaneRequest(AnsweredRequest, LoggedRequest):
    """A request the lane answers: what the proxy's handler and aiohttp's responses read of a
    ``web.BaseRequest``, for a plain request (no body, keep-alive, origin-form)."""

    __slots__ = ("_lane", "_loop", "_writer", "answer", "carried", "origin_wait", "raw_headers",
                 "scheme", "started", "transport")  # fmt: skip

    body_exists = False
    can_read_body = False
    content = EMPTY_PAYLOAD
    keep_alive = True

    def __init__(
        self,
        message: RawRequestMessage,
        remote: str,
        scheme: str,
        lane: Lane,
        loop: asyncio.AbstractEventLoop,
        carried: Any = None,
    ) -> None:
        super().__init__(message, remote)
        # What an answerer that did not answer it made of it (``AnswerHit``), or None.
        self.carried = carried
        self.scheme = scheme
        self._lane = lane
        self._loop = loop
        self.transport = lane.transport
        self._writer: FieldWriter | None = None
        self.raw_headers = message.raw_headers
        self.started = perf_counter()  # for its log line's duration, in microseconds
        self.origin_wait: float | None = None  # seconds waited on the origin, if it was asked
        # The answer whose head went out (written at once, or handed to the writer): once
        # there is one, nothing else may be written as this request's answer.
        self.answer: LoggedResponse | web.StreamResponse | None = None

    @property
    def writer(self) -> FieldWriter:  # type: ignore[override]
        """The writer of a response to this request, made when one is first written
        through it (an answer written at once needs none)."""
        if self._writer is None:
            self._writer = FieldWriter(self._lane, self._loop)  # type: ignore[arg-type]
        return self._writer

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
        written = self.answer = Written(head, body, status)
        self._lane.lane_begun()
        return written

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        self.answer = response
        self._lane.lane_begun()

    def answered(self, response: Written) -> None:
        """A ``Pending`` request was answered, whole, by ``write_at_once``."""
        self._lane.lane_answered(self, response)

    def go_on(self, work: Awaitable[web.StreamResponse]) -> None:
        """A ``Pending`` request goes on as the lane's task, answered by ``work``."""
        self._lane.lane_go_on(self, work)
