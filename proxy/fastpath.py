"""Fresh hits answered by the connection's protocol, before aiohttp builds a request object.

A cache hit is the request a cache exists for, and aiohttp's request and response objects cost
more than the rest of a hit together. ``HitServer`` makes aiohttp's own connection protocol
(``RequestHandler``) try each request as a hit first. What it guarantees:

* One parser. aiohttp's request parser (llhttp, strict) splits the bytes into requests, as it
  does for every other request; what it refuses is refused as before (400), never answered.
* Only a plain fresh hit is answered here; the answerers say which (``Proxy.answer_hit``,
  and its compiled common case ``Proxy.plain_hits``): GET or HEAD, HTTP/1.1 keep-alive, no
  body, no precondition (a matching validator gets its 304 and a byte range its 206 or 416
  here too). Anything else goes to aiohttp's handler, and requests keep their order: once one
  is queued there, every later request on the connection waits its turn behind it.
* The same answer: the same status, fields, body and counters as the handler would give, and
  the same access log line.
* Back-pressure holds. While the client is not reading (the transport asked to pause
  writing), requests queue for aiohttp's handler, which waits for the client, and the queue's
  limit stops reading the connection.
* Every answer pushes back the connection's idle timeout, as one from the handler does.
* A bug in answering a hit here is logged and the handler answers the request.

It drives a few of ``RequestHandler``'s private fields (its parser, its queue of requests, its
idle timer), which is why ``pyproject.toml`` holds aiohttp to one minor version and
``tests/test_fastpath.py`` pins every one of these rules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from multidict import CIMultiDict

log = logging.getLogger("onehit.proxy")

# A plain fresh hit's whole answer (bytes to write, then a body to write apart or b"", and the
# status), or None when the next answerer, and after the last aiohttp's handler, is to answer.
AnswerHit = Callable[[RawRequestMessage, str, str], "tuple[bytes, bytes, int] | None"]


class HitServer(web.Server):
    """``web.Server`` whose connections try ``answers``, in order, before the request
    handler."""

    def __init__(self, handler: Any, answers: Sequence[AnswerHit], **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.answers = tuple(answers)

    def __call__(self) -> RequestHandler:
        return HitHandler(self, loop=self._loop, **self._kwargs)


class HitHandler(RequestHandler):
    """aiohttp's connection protocol, answering plain fresh hits as they are parsed."""

    __slots__ = ("_answers", "_remote", "_scheme")

    def __init__(self, manager: HitServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._answers = manager.answers
        self._remote = ""
        self._scheme = "http"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        # As ``BaseRequest.remote``: the address of a TCP peer, else the peer as given.
        self._remote = peer[0] if isinstance(peer, (list, tuple)) else str(peer or "")
        if transport.get_extra_info("sslcontext") is not None:
            self._scheme = "https"

    def data_received(self, data: bytes) -> None:
        if (
            self._force_close
            or self._close
            or self._payload_parser is not None
            or self._upgraded
            or not self._idle()
        ):
            super().data_received(data)
            return
        parser = self._parser
        assert parser is not None
        while True:
            try:
                messages, upgraded, tail = parser.feed_data(data)
            except HttpProcessingError as exc:
                error = _ErrInfo(status=400, exc=exc, message=exc.message)
                messages, upgraded, tail = [(error, EMPTY_PAYLOAD)], False, b""
            answered = self._answer(messages)
            if upgraded or answered < len(messages) or not messages:
                break
            # Every request was answered; the parser may have held the rest of the bytes back
            # (its queue limit), so ask it for more.
            data = b""
        rest = messages[answered:]
        self._queue(rest)
        self._upgraded = upgraded
        if upgraded and tail:
            self._message_tail = tail
        elif rest:
            # The parser stops at its queue limit and holds back the bytes after it; what it
            # held goes to the handler's queue now, behind ``rest``, as the handler's own
            # reading would have sent it.
            super().data_received(b"")

    def _idle(self) -> bool:
        """Nothing is queued for or being handled by aiohttp's handler: an answer written now
        is in order."""
        if self._messages or self._request_in_progress:
            return False
        waiter = self._waiter
        # Parked for the next request, or not yet started (no request seen).
        return (waiter is not None and not waiter.done()) or self._request_count == 0

    def _answer(self, messages: list[tuple[Any, Any]]) -> int:
        """Answer the leading plain hits of ``messages``; how many were."""
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
                for answer in self._answers:
                    answered = answer(message, self._remote, self._scheme)
                    if answered is not None:
                        break
            except Exception:
                # A bug here costs speed, never the answer: the handler answers instead.
                log.exception("answering %s %s as parsed failed", message.method, message.path)
                answered = None
            if answered is None:
                break
            self._request_count += 1
            self._parser.message_consumed()  # type: ignore[union-attr]
            self._manager.requests_count += 1  # type: ignore[union-attr]
            transport.write(answered[0])
            if answered[1]:
                transport.write(answered[1])
            self._next_keepalive_close_time = started + self._keepalive_timeout
            if self._logging_enabled and self.access_logger is not None:
                self.access_logger.log(
                    _LoggedRequest(message, self._remote),  # type: ignore[arg-type]
                    _LoggedResponse(*answered),  # type: ignore[arg-type]
                    self._loop.time() - started,
                )
            done += 1
        return done

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


class _LoggedRequest:
    """What the access loggers read of a request answered here."""

    __slots__ = ("_message", "remote")

    def __init__(self, message: RawRequestMessage, remote: str) -> None:
        self._message = message
        self.remote = remote

    method = property(lambda self: self._message.method)
    raw_path = property(lambda self: self._message.path)
    path_qs = property(lambda self: str(self._message.url))
    version = property(lambda self: self._message.version)
    headers = property(lambda self: self._message.headers)
    host = property(lambda self: self._message.headers.get("Host"))


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
