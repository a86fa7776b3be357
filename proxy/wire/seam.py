"""Every use the proxy makes of aiohttp past its public API, in one module: an aiohttp
upgrade that moves one of them fails ``tests/test_aiohttp_seam.py``, which names each, before
it fails a request. Nothing else in the proxy imports a private name of aiohttp or reads or
sets a private attribute of its objects.

What it relies on, by name:

* aiohttp's writer (``aiohttp.http.StreamWriter``) and body streams (``StreamReader``) drive
  the protocol they are given through ``transport``, ``connected``, ``_paused`` and
  ``_drain_helper`` (the writer waits while writing is paused), and ``_reading_paused``,
  ``pause_reading`` and ``resume_reading(resume_parser=)`` (a stream past its limit pauses
  reading). ``FlowControl`` is our own protocol base in that shape; the front and the origin
  connections stand on it.
* ``FieldWriter`` sets the writer's held head (``_headers_buf``, ``_headers_written``).
* ``ProxyServer`` overrides ``web.Server._make_request`` and reads its ``_kwargs`` and
  ``_loop``; ``ClientProtocol`` reads ``web.RequestHandler``'s ``_paused`` and ``_loop``
  (``SendWatch``).
* ``Relayed`` overrides ``web.StreamResponse._prepare_headers``; ``RelayedWhole`` sets
  ``web.Response._body``; ``head_with_body`` clears ``_send_headers_immediately``.
* ``ClientProtocol`` overrides ``web.RequestHandler.handle_error``; ``ProxyServer``,
  ``web.Server.__call__``.
* ``Listener`` overrides ``web.TCPSite.start`` (to give the loop a TLS handshake timeout),
  reading ``web.BaseSite``'s ``_runner``, ``_ssl_context`` and ``_backlog`` and setting its
  ``_server``, and ``web.TCPSite``'s ``_host``, ``_port``, ``_reuse_address``,
  ``_reuse_port`` and ``_bound_port``.
* A request answered outside aiohttp's handler gives its responses ``_payload_writer`` and
  ``_prepare_hook`` (``AnsweredRequest``); aiohttp's own requests are ``ProxyRequest``s,
  which override ``_prepare_hook`` and extend ``ATTRS``. Either keeps the answer whose head
  went to its writer (``answer``): once one has, a failure must not write another.

How the proxy's answers carry what they relay. aiohttp's parsers decode a field value's bytes
with ``surrogateescape``, so a byte that is not UTF-8 comes through as a lone surrogate;
aiohttp's header serializer drops lone surrogates, and refuses (an error, so a 500) any control
character but HTAB. An origin's ``X-Name: caf\\xe9`` would reach the client as ``caf``, and
``a\\x01b`` not at all. A proxy passes what it relays as it came, so ``FieldWriter`` writes a
head's fields back as the bytes that were parsed. It still refuses a CR or LF in the status
line or a field: those would split the head (RFC 9110 section 5.5; a NUL never gets past
aiohttp's parsers).

aiohttp, as an origin server, also gives a body sent without a Content-Type one of
``application/octet-stream`` (RFC 9110 section 8.3 lets a recipient assume that type). A
proxy that did so would decide for the client: without the field a client may look at the
body to tell its type, as a browser does to render a page the origin sent untyped, and with a
made-up octet-stream it would download it instead. It adds its own ``Server`` too, which
names the origin's software (RFC 9110 section 10.2.4; the proxy says what it is in ``Via``).
``Relayed`` and ``RelayedWhole`` answer with the fields they were given and those the proxy
sets (``Date`` where missing, section 6.6.1), neither of those two.

A client that does not read must not cost the proxy a copy of what it was sent. A stored body
is written as it is stored (never joined to its head past ``PIECE`` bytes), and at most
``PIECE`` bytes of it are handed to the transport at a time, the next once the last has
drained (asyncio's transport copies what the socket does not take; uvloop holds what it is
given). A connection whose client takes no byte for ``[server] send_timeout`` while the
transport holds bytes for it is closed, dropping what it held (``SendWatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from time import perf_counter
from typing import Any

from aiohttp import ClientConnectionResetError, hdrs, web
from aiohttp.http import StreamWriter
from multidict import CIMultiDict

from proxy.core._native import field_lines
from proxy.wire import trace

log = logging.getLogger("onehit.proxy")

# The most of a body handed to a transport in one write: a 256 KiB body still goes out beside
# its head in one write, and a client that reads nothing pins at most this much of a copy.
PIECE = 256 << 10


class FlowControl(asyncio.Protocol):
    """A connection's flow control, in the shape aiohttp's writer and streams drive: writing
    pauses while the transport's buffer is over its high-water mark
    (``until_writable``); reading pauses for a body's stream (``pause_reading``) or for a
    buffer the protocol holds itself (``hold_reading``), and the transport reads again only
    once neither holds it. ``_paused`` is ``writing_paused``: the front's compiled loop
    (``proxy/front/_loop.c``) reads the slot, as aiohttp's writer does.
    Subclasses declare ``__slots__`` of their own or none (then they have a ``__dict__``)."""

    __slots__ = ("_buffer_paused", "_drain_waiter", "_loop", "_paused", "_reading_paused",
                 "transport")  # fmt: skip

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._buffer_paused = False
        self.transport: asyncio.Transport | None = None

    @property
    def connected(self) -> bool:
        return self.transport is not None

    @property
    def writing_paused(self) -> bool:
        return self._paused

    @property
    def reading_paused(self) -> bool:
        """Whether the transport is kept from reading, for a stream or a held buffer."""
        return self._reading_paused or self._buffer_paused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # closed already: the transport will say so
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is None or waiter.done():
            return
        if exc is None:
            waiter.set_result(None)
        else:
            lost = ConnectionError("Connection lost")
            lost.__cause__ = exc
            waiter.set_exception(lost)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def until_writable(self) -> None:
        """Return once the transport takes writes. A connection gone before the call raises
        ``ClientConnectionResetError`` (a ``ConnectionResetError``); one lost while waiting
        raises ``ConnectionError("Connection lost")`` when it was reset, and returns when it
        was closed: as aiohttp's own protocols do."""
        if self.transport is None:
            raise ClientConnectionResetError("Connection lost")
        if not self._paused:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = self._loop.create_future()
        await waiter

    _drain_helper = until_writable  # the name aiohttp's writer waits on

    def pause_reading(self) -> None:
        self._reading_paused = True
        self._pause_transport()

    def resume_reading(self, resume_parser: bool = True) -> None:
        self._reading_paused = False
        if resume_parser:
            self.parse_held()
        if not self._reading_paused and not self._buffer_paused:
            self._resume_transport()

    def parse_held(self) -> None:
        """Go on parsing what a paused parser held back (none here)."""

    def hold_reading(self) -> None:
        """Stop reading for a buffer of the protocol's own, until ``release_reading``."""
        self._buffer_paused = True
        self._pause_transport()

    def release_reading(self) -> None:
        self._buffer_paused = False
        if not self._reading_paused:
            self._resume_transport()

    # try/except, not contextlib.suppress: a body's stream pauses and resumes per read, and
    # suppress costs several times as much.
    def _pause_transport(self) -> None:
        if self.transport is not None:
            try:  # noqa: SIM105
                self.transport.pause_reading()
            except (AttributeError, NotImplementedError, RuntimeError):
                pass  # a transport without flow control, or closing

    def _resume_transport(self) -> None:
        if self.transport is not None:
            try:  # noqa: SIM105
                self.transport.resume_reading()
            except (AttributeError, NotImplementedError, RuntimeError):
                pass


class FieldWriter(StreamWriter):
    """aiohttp's writer, whose heads carry their field values byte for byte, and which hands
    the transport a large chunk a ``PIECE`` at a time, waiting for each to drain."""

    async def write(self, chunk: Any, *, drain: bool = True, LIMIT: int = 0x10000) -> None:
        if len(chunk) <= PIECE:
            await super().write(chunk, drain=drain, LIMIT=LIMIT)
            return
        view = memoryview(chunk)
        for at in range(0, len(view), PIECE):
            await super().write(view[at : at + PIECE], drain=drain, LIMIT=LIMIT)

    async def write_eof(self, chunk: bytes = b"") -> None:
        if len(chunk) > PIECE:
            await self.write(chunk)
            chunk = b""
        await super().write_eof(chunk)

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        lines = field_lines(headers.items())
        if lines is None or "\r" in status_line or "\n" in status_line:
            raise ValueError(f"a line break in the head of {status_line!r}")
        # Held until the first body bytes or the end, as aiohttp's writer holds its head.
        self._headers_buf = f"{status_line}\r\n{lines}\r\n".encode("utf-8", "surrogateescape")
        self._headers_written = False


class SendWatch:
    """Closes a client that takes no byte of what is written to it for ``send_timeout``
    seconds (as nginx's ``send_timeout``): checked while writing is paused, and a client that
    takes some bytes in that time goes on. A mixin before ``FlowControl`` or aiohttp's
    ``web.RequestHandler`` (whose flow control it watches); the class declares the slots
    ``_drained``, ``_send_timeout``, ``_sending`` and ``_unsent``."""

    __slots__ = ()

    _loop: asyncio.AbstractEventLoop
    _paused: bool
    transport: asyncio.Transport | None
    _send_timeout: float
    _sending: asyncio.TimerHandle | None
    _unsent: int  # the transport's buffered bytes when last looked at
    _drained: bool  # whether the transport drained since then

    def _init_watch(self, send_timeout: float) -> None:
        self._send_timeout = send_timeout
        self._sending = None
        self._unsent = 0
        self._drained = False

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._sending is None and self.transport is not None:
            self._watch_sending(self.transport.get_write_buffer_size())

    def resume_writing(self) -> None:
        self._drained = True
        super().resume_writing()  # type: ignore[misc]

    def _watch_sending(self, unsent: int) -> None:
        self._unsent = unsent
        self._drained = False
        self._sending = self._loop.call_later(self._send_timeout, self._check_sending)

    def _check_sending(self) -> None:
        self._sending = None
        transport = self.transport
        if not self._paused or transport is None:
            return
        unsent = transport.get_write_buffer_size()
        if self._drained or unsent < self._unsent:  # it took some: another send_timeout
            self._watch_sending(unsent)
            return
        log.info("closing a client that took no bytes for %gs", self._send_timeout)
        transport.abort()

    def stop_watching(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
            self._sending = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.stop_watching()
        super().connection_lost(exc)  # type: ignore[misc]


class ClientProtocol(SendWatch, web.RequestHandler):
    """aiohttp's connection protocol, watched for clients that take no bytes (``SendWatch``),
    and answering what it cannot parse or handle without a ``Server`` field."""

    __slots__ = ("_drained", "_send_timeout", "_sending", "_unsent", "client")

    def __init__(self, manager: ProxyServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._init_watch(manager.send_timeout)
        # The client's address where the connection's peer is not the client (a PROXY
        # protocol header named it): its requests' ``remote``.
        self.client: str | None = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse or handle, without its ``Server``
        (which names the proxy's software to whoever sends garbage)."""
        made = super().handle_error(request, status, exc, message)
        assert isinstance(made, web.Response)
        answer = RelayedWhole(status=made.status, headers=made.headers, body=made.body or b"")
        answer.force_close()
        return answer


class ProxyServer(web.Server):
    """``web.Server`` whose connections are ``ClientProtocol``s and whose requests answer
    through a ``FieldWriter``."""

    def __init__(self, handler: Any, *, send_timeout: float = 60.0, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.send_timeout = send_timeout

    def __call__(self) -> web.RequestHandler:
        return ClientProtocol(self, loop=self._loop, **self._kwargs)

    def _make_request(
        self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any
    ) -> web.BaseRequest:
        writer = FieldWriter(protocol, self._loop)  # in place of the plain one aiohttp made
        request = ProxyRequest(message, payload, protocol, writer, task, self._loop)
        client = getattr(protocol, "client", None)
        made = request if client is None else request.clone(remote=client)
        made.started = perf_counter()
        return made


class Listener(web.TCPSite):
    """``web.TCPSite`` whose TLS handshakes must end within ``handshake_timeout`` seconds (the
    proxy's idle timeout): asyncio's own 60 s held a connection that never began its
    handshake four times as long as a plain one that never sent a request."""

    __slots__ = ("given", "handshake_timeout")

    def __init__(
        self, *args: Any, handshake_timeout: float = 60.0, sock: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.handshake_timeout = handshake_timeout
        self.given = sock  # a listening socket taken over (``proxy.ops.handover``), or None

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        tls = self._ssl_context
        where: dict[str, Any] = (
            {"sock": self.given} if self.given is not None
            else {"host": self._host, "port": self._port, "reuse_address": self._reuse_address,
                  "reuse_port": self._reuse_port}
        )  # fmt: skip
        self._server = await asyncio.get_running_loop().create_server(
            server, ssl=tls, backlog=self._backlog,
            ssl_handshake_timeout=self.handshake_timeout if tls is not None else None, **where,
        )  # fmt: skip
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    @property
    def sockets(self) -> list[Any]:
        """The sockets it listens on (none before it started)."""
        return list(self._server.sockets) if self._server is not None else []


class Relayed(web.StreamResponse):
    """A response relaying another's head: aiohttp adds no Content-Type or Server to it."""

    async def _prepare_headers(self) -> None:
        headers = self.headers
        made_up = [name for name in (hdrs.CONTENT_TYPE, hdrs.SERVER) if name not in headers]
        await super()._prepare_headers()
        for name in made_up:
            headers.popall(name, None)


class RelayedWhole(Relayed, web.Response):
    """``Relayed`` with its body in hand, as ``web.Response``: bytes, or a memoryview of a
    part of a stored body, written as given (never copied, nor typed as a payload)."""

    def __init__(self, *, body: bytes | memoryview = b"", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._body = body


class ProxyRequest(web.BaseRequest):
    """aiohttp's request, keeping the answer whose head was handed to its writer
    (``answer``; None before one was): a request knows whether its answer has begun. And
    when it was read (``started``, by ``perf_counter``): aiohttp times its access log by the
    loop's clock, which uvloop keeps in whole milliseconds."""

    ATTRS = web.BaseRequest.ATTRS | frozenset({"answer", "started", "origin_wait", "trace"})

    answer: web.StreamResponse | None = None
    started = 0.0
    origin_wait: float | None = None  # seconds its answer waited on the origin, if it asked
    # Its decisions, when it showed the trace token (``proxy.wire.trace``): its answer's
    # head carries them.
    trace: list[dict[str, Any]] | None = None

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        self.answer = response
        if self.trace is not None:
            value = trace.field_value(self.trace, response.status, self.origin_wait)
            response.headers[trace.FIELD] = value
        await super()._prepare_hook(response)


class AnsweredRequest:
    """What aiohttp's responses read of a request past its public API, for a request the
    proxy answers outside aiohttp's handler: its writer (the subclass's ``writer``) and the
    hook ``prepare`` awaits (no application signals to send), which keeps the answer whose
    head was handed to the writer (``answer``, a slot of the subclass's), as
    ``ProxyRequest`` does."""

    __slots__ = ()

    writer: FieldWriter
    answer: object | None

    @property
    def _payload_writer(self) -> FieldWriter:
        return self.writer

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        self.answer = response


def head_with_body(response: web.StreamResponse) -> None:
    """Have ``response`` (not yet prepared) hold its head until its first body bytes, so
    both go out in one write, as aiohttp does for a response with no streamed body."""
    response._send_headers_immediately = False
