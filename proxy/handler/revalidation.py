"""Stored responses the origin is asked about: revalidation before use, stale-if-error, and
the background refresh of stale-while-revalidate.

* A 304 refreshes the stored response (RFC 9111 section 4.3.4) and the client gets it; any
  other answer is decided and relayed as a miss's is.
* With ``stale-if-error``, an origin that fails or answers 5xx leaves the stale response
  served (section 4.2.4 and RFC 5861).
* A background refresh runs once per URL at a time, with no client waiting; what comes back is
  decided as any response is.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from proxy.core import rfc9111
from proxy.core.cache_status import ORIGIN_ERROR, forwarded, hit
from proxy.core.events import FWD_STALE, Fetch, RequestMeta, Revalidate
from proxy.core.responses import client_fields
from proxy.core.store import Entry
from proxy.handler.answers import interim, on_origin, plain
from proxy.handler.fetch import Fetcher
from proxy.origin.body import BODY_ERRORS, fields_of
from proxy.origin.upstream import UpstreamError
from proxy.wire.trace import seconds, step, traced_now

log = logging.getLogger("onehit.proxy")


class Revalidation:
    """Revalidations, in the foreground and in the background, through one fetcher."""

    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher
        self.background: set[asyncio.Task[None]] = set()

    async def revalidate(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, action: Revalidate
    ) -> web.StreamResponse:
        """Ask the origin whether ``action.entry`` may still be used, and answer."""
        fetcher = self.fetcher
        entry = action.entry
        request_time = fetcher.clock()
        headers = fetcher.router.upstream_headers(meta, whole=True, extra=action.conditions,
                                                  keep=_vary_of(entry))  # fmt: skip
        try:
            with on_origin(request):
                upstream = await fetcher.upstream.request("GET", url, headers,
                                                          interim=interim(request))  # fmt: skip
        except UpstreamError as exc:
            return self._origin_failed(meta, action, exc.status, exc.public)
        async with upstream:
            if upstream.status == 304:
                fields = fields_of(upstream)
                if not rfc9111.validates(entry.headers, fields):
                    # It names another response than the one stored: nothing to refresh, and
                    # nothing to answer with; fetched whole.
                    fetch = Fetch(FWD_STALE, whole=True, collapse=False)
                    return (await fetcher.fetch(request, meta, url, fetch))[0]
                fetcher.engine.on_not_modified(entry, fields, request_time, fetcher.clock())
                status = forwarded(FWD_STALE, fwd_status=304)
                age = entry.age(fetcher.clock())
                if traced_now():
                    step("refreshed", lifetime=seconds(entry.lifetime), age=round(age, 3))
                # The cookies the 304 set are this client's: in its answer, never stored.
                cookies = client_fields(fields)
                return fetcher.cached(meta, entry.status, entry.headers + cookies,
                                      entry.payload, status, "REVALIDATED", age)  # fmt: skip
            if upstream.status >= 500 and action.on_error:
                return self._origin_failed(meta, action, upstream.status, "origin error")
            fetch = Fetch(FWD_STALE, whole=True, collapse=False)
            received = await fetcher.receive(request, meta, url, upstream, request_time, fetch,
                                             None)  # fmt: skip
            return received[0]

    def _origin_failed(
        self, meta: RequestMeta, action: Revalidate, code: int, detail: str
    ) -> web.StreamResponse:
        if action.on_error:
            self.fetcher.engine.served_stale(action.entry, on_error=action.on_error)
            status = hit(detail=action.on_error)
            return self.fetcher.from_cache(meta, action.entry, action.age, status, "STALE")
        return plain(code, detail, forwarded(FWD_STALE, detail=ORIGIN_ERROR))

    def refresh_in_background(self, meta: RequestMeta, url: str, entry: Entry) -> None:
        """Revalidate ``entry`` with no client waiting (stale-while-revalidate)."""
        flights = self.fetcher.flights
        flight = flights.lead(("refresh", meta.key))
        if flight is None:
            return
        conditions = tuple(rfc9111.conditional_headers(entry.headers))
        headers = self.fetcher.router.upstream_headers(meta, whole=True, extra=conditions,
                                                       keep=_vary_of(entry))  # fmt: skip

        async def refresh() -> None:
            try:
                await self._refresh(meta, url, entry, headers)
            except (UpstreamError, *BODY_ERRORS) as exc:
                log.warning("background refresh of %s failed: %r", meta.key, exc)
            finally:
                flights.end(("refresh", meta.key), flight, None)

        task = asyncio.get_running_loop().create_task(refresh())
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _refresh(
        self, meta: RequestMeta, url: str, entry: Entry, headers: list[tuple[str, str]]
    ) -> None:
        fetcher = self.fetcher
        engine = fetcher.engine
        request_time = fetcher.clock()
        async with await fetcher.upstream.request("GET", url, headers) as upstream:
            fields = fields_of(upstream)
            if upstream.status == 304:
                if rfc9111.validates(entry.headers, fields):
                    engine.on_not_modified(entry, fields, request_time, fetcher.clock(),
                                           served=False)  # fmt: skip
                return
            await fetcher.settle_unserved(meta, upstream, fields, request_time)

    async def close(self) -> None:
        """Cancel the refreshes still running."""
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)


def _vary_of(entry: Entry) -> frozenset[str]:
    return frozenset(rfc9111.vary_names(entry.headers))
