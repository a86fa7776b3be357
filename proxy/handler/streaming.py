"""An origin body relayed to the client as it arrives: the part the client's answer asks for
written, a copy kept up to the largest object stored, and a body cut short told apart.

* The head goes out with the body bytes already in hand, in one write.
* A client that leaves does not stop the read when the body is being kept (it may still be
  stored); one that has its answer and leaves nothing to keep ends the read.
* A body that fails after its head went out cuts the client's connection: the honest signal
  that what it got is not whole.
"""

from __future__ import annotations

import logging

from aiohttp import web

from proxy.core.events import Answer, RequestMeta
from proxy.handler.answers import abort
from proxy.origin.body import BODY_ERRORS, body_of
from proxy.origin.upstream import UpstreamResponse
from proxy.wire.seam import head_with_body

log = logging.getLogger("onehit.proxy")


async def stream(
    request: web.BaseRequest,
    meta: RequestMeta,
    url: str,
    upstream: UpstreamResponse,
    answer: Answer,
    out: web.StreamResponse,
    arrived: bytes,
    parts: list[bytes] | None,
    max_object: int,
) -> tuple[int, list[bytes] | None, bool, bool]:
    """Write ``out``'s head and the part of the origin's body ``answer`` asks for as it
    arrives, keeping a copy in ``parts`` (when given) up to ``max_object`` bytes. Returns
    the bytes read of the body, the copy (None once dropped), whether it was dropped for
    its size, and whether the body ended whole (when it failed, the client's connection
    is cut once its head is out)."""
    length = upstream.content_length
    sending = _wanted_bytes(answer, upstream.status, length)
    if arrived and sending is not None and sending[0] < len(arrived):
        # The head goes out with the body bytes already in hand, in one write: never
        # later than it would alone, since the first of those bytes is written at once.
        head_with_body(out)
    await out.prepare(request)
    total = 0
    too_large = abandoned = False
    chunks = body_of(arrived, upstream.content)
    try:
        if sending is None:
            await send(out, b"", eof=True)
        if sending is not None or parts is not None:
            async for chunk in chunks:
                start = total
                total += len(chunk)
                if parts is not None:
                    parts.append(chunk)
                    if total > max_object:
                        parts, too_large = None, True  # stream the rest, keep nothing
                if sending is not None:
                    first, last = sending
                    # start <= last here: the chunk that passes ``last`` ends the answer.
                    piece = chunk[max(0, first - start) : last + 1 - start]
                    done = total > last
                    if not await send(out, piece, eof=done) or done:
                        sending = None  # answered, or the client left
                if sending is None and parts is None:
                    abandoned = True  # the client has its answer and nothing is kept
                    break
        if sending is not None:
            await send(out, b"", eof=True)
    except BODY_ERRORS as exc:
        log.warning("%s %s: origin body failed after %d bytes: %r", meta.method, url, total, exc)
        if sending is not None:
            abort(request)  # the headers are gone: a cut connection is the honest signal
        return total, parts, too_large, False
    finally:
        await chunks.aclose()
    if abandoned and length is not None:
        total = length
    return total, parts, too_large, True


async def send(out: web.StreamResponse, data: bytes, *, eof: bool = False) -> bool:
    """Write to the client; False when it has gone (the origin's body may still be worth
    reading to the end, to be stored)."""
    try:
        if eof:
            await out.write_eof(data)
        elif data:
            await out.write(data)
    except ConnectionError:
        return False
    return True


def _wanted_bytes(answer: Answer, status: int, length: int | None) -> tuple[int, int] | None:
    """The bytes (first, last) of the origin's ``status`` body that the client gets; None for
    none."""
    if answer.status == status:
        return 0, (length - 1 if length is not None else 1 << 62)
    if answer.status == 206:
        return answer.first, answer.last
    return None
