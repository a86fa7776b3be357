"""What the proxy reads of an origin response: its end-to-end fields, the body bytes that came
with its head, and the rest of the body as it arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp

from proxy.core import rfc9110
from proxy.origin.pool import OriginResponse
from proxy.origin.upstream import UpstreamResponse

# What reading an origin body may raise: the origin failed, timed out or went away.
BODY_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)


def fields_of(upstream: UpstreamResponse) -> rfc9110.Fields:
    """An origin response's end-to-end fields (hop-by-hop ones stripped), indexed."""
    fields = upstream.fields if type(upstream) is OriginResponse else upstream.headers.items()
    return rfc9110.end_to_end_fields(fields)


def in_hand(upstream: UpstreamResponse) -> bytes:
    """The body bytes that arrived with the head, b"" if none; a body that already failed
    gives b"", and its failure is met when the rest is read."""
    try:
        if type(upstream) is OriginResponse:
            return upstream.in_hand()
        return upstream.content.read_nowait()
    except BODY_ERRORS:
        return b""


async def body_of(first: bytes, content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """``first``, then the rest of a body as it arrives."""
    if first:
        yield first
    async for chunk in content.iter_any():
        yield chunk
