"""The answers the proxy writes to clients: its own short ones, the head of a relayed origin
response, a stored or shared body answered whole, and the marks every answer carries.

* Every answer carries ``Cache-Status`` (RFC 9211), ``X-Cache`` and ``Via``; cached ones carry
  ``Age``. The proxy names itself in ``Via``, never in ``Server``.
* A body in hand (stored in any tier, shared by a collapsed fetch, or stitched from slices) is
  answered with the one deliver step's head (``delivered``), on every path, and the part of
  the body that head says: a memoryview of it, never a copy.
* An origin's interim (1xx) responses reach an HTTP/1.1 client before its answer (RFC 9110
  section 15.2), except a 100 Continue, which the proxy answers itself.
* The time an answer waited on the origin is counted on its request (``waited_on_origin``),
  for its log line; a request answered without asking the origin (a hit, one that followed
  another's fetch) waited none.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator
from time import perf_counter

from aiohttp import HttpVersion11, web

from proxy.core import rfc9110, rfc9111
from proxy.core._native import field_lines
from proxy.core.cache_status import forwarded
from proxy.core.cached import (
    MARKS,
    NOT_MODIFIED_DROPS,
    VIA,
    CachedHead,
    cached_head,
    per_answer,
)
from proxy.core.events import FWD_REQUEST, Answer
from proxy.core.rfc9110 import BODILESS_STATUSES
from proxy.front.lane import LaneRequest, Written
from proxy.origin.pool import Fields, Interim
from proxy.origin.upstream import UpstreamResponse
from proxy.wire.dates import http_date
from proxy.wire.seam import Relayed, RelayedWhole

# The origin's length field, left out where the proxy frames the body it writes itself.
LENGTH = frozenset({"content-length"})


def mark(response: web.StreamResponse, cache_status: str, x_cache: str) -> None:
    """Put the fields the proxy adds to every answer in their places."""
    response.headers["Cache-Status"] = cache_status
    response.headers["X-Cache"] = x_cache
    response.headers["Via"] = VIA


def plain(
    status: int, text: str, cache_status: str | None = None, *, close: bool = False
) -> web.Response:
    """A short plain-text answer the proxy makes itself, without a ``Server`` (the proxy names
    itself in ``Via``); ``close``: end the connection after it (what is left of the request
    cannot be trusted)."""
    response = RelayedWhole(
        status=status,
        headers={"Content-Type": "text/plain; charset=utf-8"},
        body=(text + "\n").encode("utf-8", "surrogateescape"),
    )
    if close:
        response.force_close()
    mark(response, cache_status or forwarded(FWD_REQUEST), "ERROR" if status >= 500 else "REFUSED")
    return response


def refuse_version(request: web.BaseRequest) -> web.Response:
    """505 for a request line in a version other than HTTP/1.0 or 1.1, written as an HTTP/1.1
    message (aiohttp would answer in the request's own version, which this proxy does not
    speak), then the connection closes."""
    text = b"HTTP versions 1.0 and 1.1 only\n"
    if request.transport is not None:
        request.transport.write(
            b"HTTP/1.1 505 HTTP Version Not Supported\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(text), text)
        )
        request.transport.close()
    return web.Response(status=505)


def abort(request: web.BaseRequest) -> None:
    """Cut the client's connection: the honest signal once a head is out and its body failed.
    Reset, not closed: a body whose end is the connection's (HTTP/1.0, no length) would read
    as whole after a plain close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # A linger of 0 makes the close a reset (RST) on every loop: asyncio's abort alone
        # sends a FIN.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    transport.abort()


_RESET = struct.pack("ii", 1, 0)


def close(request: web.BaseRequest) -> None:
    """Close the client's connection once what was written to it has gone (an answer that
    may be whole, after which nothing more may be written on it)."""
    if request.transport is not None:
        request.transport.close()


def whole(
    answer: Answer,
    status: int,
    headers: tuple[tuple[str, str], ...],
    body: bytes,
    cache_status: str,
    x_cache: str,
    age: float,
    hidden: frozenset[str] = frozenset(),
) -> web.Response:
    """A response whose body is in hand (stored, or shared by a collapsed fetch), as
    ``answer`` (the engine's, to the client's conditionals and single byte range: 304, 206,
    416) says: ``delivered``'s head, and the part of the body it carries."""
    head, fields = delivered(status, headers, answer, len(body), cache_status, x_cache, age,
                             hidden)  # fmt: skip
    return RelayedWhole(status=answer.status, headers=fields, body=span(body, head))


def delivered(
    stored_status: int,
    headers: tuple[tuple[str, str], ...],
    answer: Answer,
    size: int,
    cache_status: str,
    x_cache: str,
    age: float,
    hidden: frozenset[str] = frozenset(),
) -> tuple[CachedHead, tuple[tuple[str, str], ...]]:
    """The deliver step's head, one for every answer given from a response in hand, from
    any tier: the ``answer`` (the engine's: the stored status, or a 304, 206 or 416) from a
    ``stored_status`` response with ``headers`` and a body of ``size`` bytes; its
    ``CachedHead`` (the body it carries: ``span``) and every field it writes, the
    per-answer ones last (``per_answer``: ``Cache-Status``, ``Age``, and a ``Date`` where the
    stored response has none). Written whole (``whole``), stitched from slices
    (``proxy.handler.slicing``), or as bytes by the hits answered as parsed
    (``proxy.handler.hits``), whose plain ones write the same head rendered once per entry
    (``hit_head``) with the per-answer fields added per hit, as the compiled hit does."""
    head = cached_head(stored_status, headers, answer.status, answer.first, answer.last, size,
                       x_cache=x_cache, via=VIA, hidden=hidden)  # fmt: skip
    date = None if head.dated else http_date()
    return head, (*head.fields, *per_answer(cache_status, age, date))


def span(body: bytes, head: CachedHead) -> bytes | memoryview:
    """The bytes of ``body`` that ``head``'s answer carries: all of it, none, or a part (a
    memoryview of it, never a copy)."""
    if head.last < head.first:
        return b""
    if head.first == 0 and head.last == len(body) - 1:
        return body
    return memoryview(body)[head.first : head.last + 1]


def relay_head(
    answer: Answer,
    upstream: UpstreamResponse,
    headers: rfc9111.Fields,
    length: int | None,
    hidden: frozenset[str] = frozenset(),
) -> web.StreamResponse:
    """The head of the answer to a client from an origin response that is still arriving
    (``hidden``: its fields clients are not given)."""
    if answer.status == upstream.status:
        if hidden.isdisjoint(headers.by_name):
            return Relayed(status=upstream.status, reason=upstream.reason, headers=headers)
        kept = [(k, v) for k, v in headers if k.lower() not in hidden]
        return Relayed(status=upstream.status, reason=upstream.reason, headers=kept)
    drops = (NOT_MODIFIED_DROPS if answer.status == 304 else LENGTH) | hidden
    kept = [(k, v) for k, v in headers if k.lower() not in drops]
    out = Relayed(status=answer.status, headers=kept)
    if answer.status == 206:
        out.headers["Content-Range"] = f"bytes {answer.first}-{answer.last}/{length}"
        out.content_length = answer.last - answer.first + 1
    elif answer.status == 416:
        out.headers["Content-Range"] = f"bytes */{length}"
        out.content_length = 0
    return out


def at_once(
    request: web.BaseRequest,
    upstream: UpstreamResponse,
    answer: Answer,
    headers: rfc9111.Fields,
    cache_status: str,
    arrived: bytes,
    length: int | None,
    hidden: frozenset[str] = frozenset(),
) -> Written | None:
    """The answer to a lane's GET written whole, head and body in one write, when it is the
    origin's response as it is and its whole body arrived with its head (most small objects):
    the bytes the request's writer would write for ``relay_head`` marked by ``mark``. None,
    writing nothing, for any other answer (streamed through that writer), or when the
    origin's fields name one the proxy marks (``mark`` puts those in their places) or one
    of ``hidden`` (``relay_head`` leaves those out)."""
    if (
        type(request) is not LaneRequest
        or request.method != "GET"
        or answer.status != upstream.status
        or length != len(arrived)
        or upstream.status in BODILESS_STATUSES
    ):
        return None
    names = headers.by_name
    if not names.keys().isdisjoint(MARKS) or not hidden.isdisjoint(names):
        return None
    fields = field_lines(headers)
    if fields is None:
        return None  # a line break in a field: the origin's parser never passes one
    # A Date where the origin sent none, as a relayed response adds it.
    dated = "" if "date" in names else f"Date: {http_date()}\r\n"
    head = (
        f"HTTP/1.1 {upstream.status} {upstream.reason}\r\n{fields}Cache-Status: {cache_status}"
        f"\r\nX-Cache: MISS\r\nVia: {VIA}\r\n{dated}\r\n"
    )
    return request.write_at_once(head.encode("utf-8", "surrogateescape"), arrived, upstream.status)


@contextlib.contextmanager
def on_origin(request: web.BaseRequest, counted: bool = True) -> Iterator[None]:
    """Count the time the block takes (an origin exchange, to its response's head or its
    failure) on ``request`` (``waited_on_origin``), however it ends; ``counted=False`` for
    an exchange whose time is the client's as much as the origin's (a body it streams)."""
    began = perf_counter()
    try:
        yield
    finally:
        if counted:
            waited_on_origin(request, began)


def waited_on_origin(request: web.BaseRequest, began: float) -> None:
    """Count the time since ``began`` (``perf_counter``), an origin exchange's from its
    request to its response's head (or failure), on ``request``'s ``origin_wait``: its access
    log line's ``origin_us``, summed over every exchange made for it (a slice each, a
    revalidation)."""
    request.origin_wait = (request.origin_wait or 0.0) + (perf_counter() - began)  # type: ignore[attr-defined]


def interim(request: web.BaseRequest) -> Interim | None:
    """What forwards an origin's interim (1xx) responses to the client (RFC 9110 section
    15.2: a proxy forwards those it did not ask for itself), as they arrive, before the final
    answer's head: 103 Early Hints, mostly. Not to an HTTP/1.0 client, which cannot read
    them; never a 100 Continue, which the proxy answers itself (it never sends Expect on)."""
    if request.version != HttpVersion11:
        return None

    def forward(status: int, reason: str, fields: Fields) -> None:
        transport = request.transport
        lines = field_lines(rfc9110.end_to_end(fields))
        if status == 100 or transport is None or transport.is_closing() or lines is None:
            return
        head = f"HTTP/1.1 {status} {reason}\r\n{lines}\r\n"
        transport.write(head.encode("utf-8", "surrogateescape"))

    return forward
