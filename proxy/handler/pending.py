"""A plain GET miss sent to the origin as soon as it was parsed, answered in the callback that
brings the origin's whole response.

Its answer is written there when the response came whole, plain (see ``proxy/origin/_origin.c``) and
without a field the proxy marks, to a client still connected: what ``Fetcher.receive`` writes
at once, with the same counters, the same store and the same flight landed. Anything else (a
response in pieces, an interim one, a failure, a retry on a new connection) goes on in the
lane's task, as the request handler would have gone on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import perf_counter

from aiohttp import web

from proxy.core import rfc9110
from proxy.core.cached import MARKS
from proxy.core.events import FETCH_WHOLE, RequestMeta
from proxy.front.lane import LaneRequest, Pending
from proxy.handler.answers import waited_on_origin
from proxy.handler.coalesce import Flight
from proxy.handler.fetch import Fetcher, Shared
from proxy.origin.pool import Fields, Sent

# The request handler: it answers a request from the work given (what a failure leaves is
# its 500, logged).
Handle = Callable[[web.BaseRequest, Awaitable[web.StreamResponse]], Awaitable[web.StreamResponse]]


class PendingMiss(Pending):
    """A plain GET miss in flight to the origin, outside any task."""

    __slots__ = ("_began", "_fetcher", "_flight", "_handle", "_meta", "_request",
                 "_request_time", "_sent", "_url")  # fmt: skip

    def __init__(
        self,
        fetcher: Fetcher,
        handle: Handle,
        request: LaneRequest,
        meta: RequestMeta,
        url: str,
        flight: Flight[Shared],
        sent: Sent,
        request_time: float,
    ) -> None:
        self._fetcher = fetcher
        self._handle = handle
        self._request = request
        self._meta = meta
        self._url = url
        self._flight = flight
        self._sent = sent
        self._request_time = request_time
        self._began = perf_counter()  # the request went to the origin just now
        sent.offer(self._arrived, self._go_on)

    def _arrived(self, status: int, reason: str, fields: Fields, body: bytes) -> bool:
        """Answer from the whole response the origin sent; False, having done nothing, when
        the lane is to answer from it instead."""
        request = self._request
        transport = request.transport
        headers = rfc9110.end_to_end_fields(fields)
        fetcher = self._fetcher
        if (
            transport is None
            or transport.is_closing()
            or not headers.by_name.keys().isdisjoint(MARKS)
            or not fetcher.router.hidden.isdisjoint(headers.by_name)
        ):
            return False
        waited_on_origin(request, self._began)
        upstream = self._sent.whole(status, reason, fields, body)
        result: Shared | None = None
        try:
            out, result = fetcher.receive_now(request, self._meta, upstream, headers,
                                              self._request_time, self._flight)  # fmt: skip
        except Exception as exc:
            request.go_on(self._handle(request, raising(exc)))  # its 500, as from the handler
            return True
        finally:
            fetcher.flights.end(self._meta.key, self._flight, result)
        fetcher.fast_misses += 1
        request.answered(out)
        return True

    def _go_on(self) -> None:
        """The response is not to be answered here: the lane's task takes it from the pool."""
        request = self._request
        waited_on_origin(request, self._began)  # the lane's fetch counts what is left
        work = self._fetcher.led_fetch(request, self._meta, self._url, FETCH_WHOLE,
                                       self._flight, self._sent, self._request_time)  # fmt: skip
        request.go_on(self._handle(request, work))

    def cancel(self) -> None:
        self._sent.abandon()
        self._fetcher.flights.end(self._meta.key, self._flight, None)


async def raising(exc: Exception) -> web.StreamResponse:
    """Work that fails with ``exc``: the handler answers it as any failure."""
    raise exc
