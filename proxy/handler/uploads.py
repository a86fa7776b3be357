"""Requests that pass the cache by: unsafe methods and requests with content, sent to the
origin with their body, and their answers relayed.

* A body that fits ``[server] body_buffer_size`` is read whole before any origin connection is
  taken (then a failed connection can send it again); a larger one is streamed, at most
  ``[server] max_streamed_uploads`` at a time (503 with ``Retry-After`` past that).
* Every wait for more body bytes is bounded by ``[server] body_timeout`` (408 past it), so a
  client that stalls mid-upload holds no origin connection.
* ``Expect: 100-continue`` is answered here, as nginx does: the origin gets the body without
  being asked.
* A successful unsafe method invalidates the stored responses of its URL (RFC 9111 section 4.4).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import HttpVersion11, web

from proxy.config.settings import Config
from proxy.core.cache_status import ORIGIN_ERROR, forwarded
from proxy.core.engine import CacheEngine
from proxy.core.events import FWD_METHOD, RequestMeta
from proxy.handler.answers import LENGTH, abort, interim, mark, on_origin, plain
from proxy.handler.routing import Router
from proxy.origin.body import BODY_ERRORS, body_of, fields_of, in_hand
from proxy.origin.upstream import Upstream, UpstreamError
from proxy.wire.seam import Relayed, RelayedWhole

log = logging.getLogger("onehit.proxy")


class Uploads:
    """Requests sent through to the origin with their bodies, past the cache."""

    def __init__(
        self,
        config: Config,
        engine: CacheEngine,
        upstream: Upstream,
        router: Router,
        clock: Callable[[], float],
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.upstream = upstream
        self.router = router
        self.body_buffer_size = config.server.body_buffer_size
        self.body_timeout = config.server.body_timeout
        self.max_streamed_uploads = config.server.max_streamed_uploads
        self.streamed_uploads = 0

    async def pass_through(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, reason: str = FWD_METHOD
    ) -> web.StreamResponse:
        """Send the request with its body to the origin past the cache, and relay the answer
        (``reason``: the Cache-Status ``fwd`` that says why)."""
        try:
            body = await self._request_body(request)
        except TimeoutError:
            log.info("%s %s: no request body bytes for %gs", meta.method, url, self.body_timeout)
            return plain(408, "request body timed out", close=True)
        streamed = body is not None and not isinstance(body, bytes)
        if streamed:
            if self.streamed_uploads >= self.max_streamed_uploads:
                refused = plain(503, "too many large uploads in progress", close=True)
                refused.headers["Retry-After"] = "1"
                return refused
            self.streamed_uploads += 1
        try:
            return await self._send_through(request, meta, url, body, reason)
        finally:
            if streamed:
                self.streamed_uploads -= 1

    async def _send_through(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        body: bytes | AsyncIterator[bytes] | None,
        reason: str,
    ) -> web.StreamResponse:
        try:
            # A body the client streams makes the wait its own as much as the origin's.
            with on_origin(request, counted=body is None or isinstance(body, bytes)):
                upstream = await self.upstream.request(
                    meta.method, url, self.router.upstream_headers(meta, whole=False), body,
                    interim=interim(request),
                )  # fmt: skip
        except UpstreamError as exc:
            return plain(exc.status, exc.public, forwarded(reason, detail=ORIGIN_ERROR))
        async with upstream:
            self.engine.on_unsafe_response(meta, upstream.status, self.clock())
            fields = fields_of(upstream)
            arrived = in_hand(upstream)
            if upstream.content_length == len(arrived):
                # The whole body came with the head (most API answers): written with it, in
                # one write, instead of streamed.
                kept = [(k, v) for k, v in fields if k.lower() not in LENGTH]
                whole = RelayedWhole(
                    status=upstream.status, reason=upstream.reason, headers=kept, body=arrived
                )
                mark(whole, forwarded(reason), "BYPASS")
                return whole
            out = Relayed(status=upstream.status, reason=upstream.reason, headers=fields)
            mark(out, forwarded(reason), "BYPASS")
            await out.prepare(request)
            try:
                async for chunk in body_of(arrived, upstream.content):
                    await out.write(chunk)
            except BODY_ERRORS as exc:
                log.warning("%s %s: origin body failed mid-stream: %r", meta.method, url, exc)
                abort(request)
                return out
            await out.write_eof()
            return out

    async def _request_body(self, request: web.BaseRequest) -> bytes | AsyncIterator[bytes] | None:
        """The request body as the origin will get it: whole when it fits the buffer, else its
        first bytes and then the rest as it arrives; TimeoutError past ``body_timeout``."""
        if not request.body_exists:
            return None
        expect = request.headers.get("Expect", "")
        if expect.lower() == "100-continue" and request.version == HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        reader, timeout, limit = request.content, self.body_timeout, self.body_buffer_size
        parts: list[bytes] = []
        size = 0
        while size <= limit:
            # Bytes already in hand are taken without a wait: on Python 3.11, each wait_for
            # makes a task and a timer, and a small upload has all arrived with its head.
            chunk = reader.read_nowait()
            if not chunk and not reader.at_eof():
                chunk = await asyncio.wait_for(reader.readany(), timeout)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)

        async def rest() -> AsyncIterator[bytes]:
            yield b"".join(parts)
            while chunk := await asyncio.wait_for(reader.readany(), timeout):
                yield chunk

        return rest()
