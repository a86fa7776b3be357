"""Fetching from the origin for the cache: misses, collapsed onto one fetch, relayed as they
arrive and stored when they end whole.

* A GET miss fetches the whole object without the client's conditionals and Range and answers
  them from it (304, 206, 416). A response that will not be stored and was fetched without
  fields the client sent is asked for again with them.
* Bodies stream: the first bytes go to the client as they arrive, and a copy is kept only of a
  body that will be stored (or that collapsed requests wait for), up to ``max_object_size``.
  It is stored when it ends whole; a body cut short is never stored, and the client's
  connection is closed so it cannot mistake it for a whole one.
* Concurrent GET misses of one URL share one origin fetch (single flight). When the leader's
  fetch fails, one follower leads the next try; a response that may not be shared (not
  cacheable, too large) sends the followers to the origin at once, and the URL goes straight
  there for ``[cache] hit_for_miss`` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiohttp import web

from proxy.config.settings import Config
from proxy.core import rfc9111
from proxy.core.cache_status import ORIGIN_ERROR, forwarded
from proxy.core.engine import CacheEngine
from proxy.core.events import (
    ASK_ADMISSION,
    CLIENT_ASKS,
    FETCH_WHOLE,
    FWD_URI_MISS,
    TOO_LARGE,
    Answer,
    AskAdmission,
    Fetch,
    Keep,
    Outcome,
    RequestMeta,
    ResponseMeta,
)
from proxy.core.responses import Decided, response_meta
from proxy.core.store import Entry
from proxy.fleet.shared import SharedSecondHit
from proxy.front.lane import LaneRequest, Written
from proxy.handler.answers import at_once, interim, mark, on_origin, plain, relay_head, whole
from proxy.handler.coalesce import Flight, SingleFlight
from proxy.handler.routing import Router
from proxy.handler.streaming import stream
from proxy.origin.body import fields_of, in_hand
from proxy.origin.pool import OriginResponse, Sent
from proxy.origin.upstream import Upstream, UpstreamError, UpstreamResponse
from proxy.wire.trace import seconds, step, traced_now

log = logging.getLogger("onehit.proxy")


@dataclass(frozen=True, slots=True)
class Shared:
    """A whole origin response, kept for the requests collapsed onto its fetch."""

    meta: ResponseMeta
    body: bytes
    request_headers: rfc9111.Headers


# A flight's result that sends its followers to the origin at once: the response may not be
# shared (not cacheable, or too large to keep).
GO_DIRECT = Shared(ResponseMeta(cacheable=False), b"", ())


class Fetcher:
    """The origin side of the cache: fetches, their single flights, and the engine's
    decisions on what comes back."""

    def __init__(
        self,
        config: Config,
        engine: CacheEngine,
        upstream: Upstream,
        router: Router,
        clock: Callable[[], float],
        shared: SharedSecondHit | None,
    ) -> None:
        self.engine = engine
        self.upstream = upstream
        self.router = router
        self.clock = clock
        self.shared = shared
        self.flights: SingleFlight[Shared] = SingleFlight(config.upstream.single_flight_wait)
        self.allow_set_cookie = config.cache.store_set_cookie
        # Misses a ``PendingMiss`` answered as their origin response arrived (also counted
        # among the engine's misses).
        self.fast_misses = 0

    @property
    def max_object(self) -> int:
        """The largest body the cache keeps, in any tier (``CacheEngine.max_object_bytes``)."""
        return self.engine.max_object_bytes

    async def collapsed_fetch(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, action: Fetch
    ) -> web.StreamResponse:
        """Lead the URL's flight, or follow it and answer from what its leader fetched
        (``SingleFlight.join``), unless a purge reached that since its fetch went out (then
        the followers join again)."""
        flight, shared = await self.flights.join(meta.key)
        if flight is not None:
            return await self.led_fetch(request, meta, url, action, flight)
        if shared is not None and self.engine.purged_since(meta.key, shared.meta):
            # A purge made since the shared fetch went out: what it brought is not the answer
            # to a request that may have come after the purge. Its followers join again: one
            # leads a fetch after the purge, the others follow it.
            return await self.collapsed_fetch(request, meta, url, action)
        if shared is not None and shared is not GO_DIRECT and same_variant(shared, meta):
            step("coalesced", answered_from="another request's fetch of this URL")
            return await self._collapsed(meta, shared)
        if shared is not None:
            step("coalesced", answered_from=None,
                 why="the fetch it waited on was not one to share: fetched on its own")  # fmt: skip
        return (await self.fetch(request, meta, url, replace(action, collapse=False)))[0]

    async def led_fetch(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        action: Fetch,
        flight: Flight[Shared],
        sent: Sent | None = None,
        request_time: float = 0.0,
    ) -> web.StreamResponse:
        """``fetch`` by the leader of ``flight``, which it lands with what it fetched."""
        result: Shared | None = None
        try:
            response, result = await self.fetch(request, meta, url, action, flight, sent,
                                                request_time)  # fmt: skip
            return response
        finally:
            self.flights.end(meta.key, flight, result)

    async def _collapsed(self, meta: RequestMeta, shared: Shared) -> web.StreamResponse:
        """Answer from the response another request fetched; it counts as this request's
        sighting of the URL too, so a burst of misses can store it."""
        outcome = await self.shared_sighting(meta, shared.meta, len(shared.body), shared.body)
        status = forwarded(FWD_URI_MISS, outcome=outcome, collapsed=True)
        age = shared.meta.initial_age
        return self.cached(meta, shared.meta.status, shared.meta.headers, shared.body, status,
                           "MISS", age)  # fmt: skip

    def cached(
        self,
        meta: RequestMeta,
        status: int,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        cache_status: str,
        x_cache: str,
        age: float,
    ) -> web.Response:
        """A body in hand answered whole, to the client's conditionals and Range too."""
        answer = self.engine.answer(meta, status, headers, len(body))
        return whole(answer, status, headers, body, cache_status, x_cache, age,
                     self.router.hidden)  # fmt: skip

    def from_cache(
        self, meta: RequestMeta, entry: Entry, age: float, cache_status: str, x_cache: str
    ) -> web.Response:
        """A stored response answered."""
        return self.cached(meta, entry.status, entry.headers, entry.payload, cache_status,
                           x_cache, age)  # fmt: skip

    async def fetch(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        action: Fetch,
        flight: Flight[Shared] | None = None,
        sent: Sent | None = None,
        request_time: float = 0.0,
    ) -> tuple[web.StreamResponse, Shared | None]:
        """Fetch ``url`` as ``action`` says (``sent``: the request ``start`` already wrote,
        at ``request_time``), and what collapsed requests may share of it."""
        headers = []
        if sent is None:
            request_time = self.clock()
            headers = self.router.upstream_headers(meta, whole=action.whole)
        try:
            with on_origin(request):
                upstream = await self.upstream.request(
                    meta.method, url, headers, sent=sent, interim=interim(request)
                )
        except UpstreamError as exc:
            status = forwarded(action.reason, detail=ORIGIN_ERROR)
            return plain(exc.status, exc.public, status), None
        async with upstream:
            return await self.receive(request, meta, url, upstream, request_time, action, flight)

    async def receive(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        upstream: UpstreamResponse,
        request_time: float,
        action: Fetch,
        flight: Flight[Shared] | None,
    ) -> tuple[web.StreamResponse, Shared | None]:
        """Relay an origin response, keeping a copy of its body when it will be stored or when
        collapsed requests wait for it, and answering the client's own conditionals and Range
        when it was fetched whole."""
        headers = fields_of(upstream)
        rmeta, length, fits = self._judge(meta, upstream, headers, request_time)
        decided = self.engine.on_response_head(
            meta, rmeta, length, self.clock(), whole=action.whole
        )
        if decided is ASK_ADMISSION:
            decided = await self.decide(meta, rmeta, length, whole=action.whole)
        else:
            trace_decision(decided)
        if action.whole and not (rmeta.cacheable and fits) and _asks(request):
            # Not stored, so the client's own conditionals and Range are the origin's to answer.
            upstream.close()
            again = replace(action, whole=False, collapse=False)
            return (await self.fetch(request, meta, url, again))[0], GO_DIRECT
        answer, cache_status, arrived, parts, out = self._relay(
            request, meta, upstream, action, flight, headers, decided, fits
        )
        if out is not None:
            return out, self._settled(meta, decided, len(arrived), parts, False, fits)
        out = relay_head(answer, upstream, headers, length, self.router.hidden)
        mark(out, cache_status, "MISS")
        total, parts, too_large, ended = await stream(
            request, meta, url, upstream, answer, out, arrived, parts, self.max_object
        )
        if not ended:
            self.engine.finish(meta, decided, total, self.clock(), complete=False)
            return out, None
        return out, self._settled(meta, decided, total, parts, too_large, fits)

    def receive_now(
        self,
        request: LaneRequest,
        meta: RequestMeta,
        upstream: OriginResponse,
        headers: rfc9111.Fields,
        request_time: float,
        flight: Flight[Shared],
    ) -> tuple[Written, Shared | None]:
        """``receive`` of a plain GET miss's whole response (``headers``: its end-to-end
        fields), to be written at once: ``PendingMiss`` asks only for such a response."""
        rmeta, length, fits = self._judge(meta, upstream, headers, request_time)
        decided = self.engine.on_response_head(meta, rmeta, length, self.clock())
        trace_decision(decided)
        assert type(decided) is Decided, "PendingMiss is not taken with a fleet's filter"
        _, _, arrived, parts, out = self._relay(
            request, meta, upstream, FETCH_WHOLE, flight, headers, decided, fits
        )
        assert out is not None, "PendingMiss offered an answer that cannot be written at once"
        return out, self._settled(meta, decided, len(arrived), parts, False, fits)

    def _judge(
        self,
        meta: RequestMeta,
        upstream: UpstreamResponse,
        headers: rfc9111.Fields,
        request_time: float,
    ) -> tuple[ResponseMeta, int | None, bool]:
        """The engine's view of an origin response, its length if known, and whether that
        length fits the store."""
        rmeta = self.response_meta(meta, upstream.status, headers, request_time)
        length = upstream.content_length
        return rmeta, length, length is None or length <= self.max_object

    def _relay(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        upstream: UpstreamResponse,
        action: Fetch,
        flight: Flight[Shared] | None,
        headers: rfc9111.Fields,
        decided: Decided,
        fits: bool,
    ) -> tuple[Answer, str, bytes, list[bytes] | None, Written | None]:
        """How the client is answered from a decided origin response: the answer, its
        Cache-Status, the body bytes that came with the head, the copy of the body to keep
        (None: none: neither memory nor a tier takes it, nor a collapsed request waits for
        it), and the answer itself when it was written at once (``at_once``)."""
        rmeta, decision = decided.response, decided.memory
        share = flight is not None and flight.waiting > 0 and rmeta.cacheable and fits
        keep = type(decision) is Keep or share or bool(decided.tiers)
        length = upstream.content_length
        answer = (
            self.engine.answer(meta, upstream.status, headers, length)
            if action.whole
            else Answer(upstream.status)
        )
        cache_status = forwarded(action.reason, outcome=decision)
        arrived = in_hand(upstream)
        parts: list[bytes] | None = [] if keep else None
        out = at_once(request, upstream, answer, headers, cache_status, arrived, length,
                      self.router.hidden)  # fmt: skip
        if out is not None and parts is not None:
            parts.append(arrived)
        return answer, cache_status, arrived, parts, out

    def _settled(
        self,
        meta: RequestMeta,
        decided: Decided,
        total: int,
        parts: list[bytes] | None,
        too_large: bool,
        fits: bool,
        *,
        served: bool = True,
    ) -> Shared | None:
        """Store a body that ended whole after ``total`` bytes (``parts``: the copy kept of
        it; ``served``: whether a client got it) as the engine decided, in memory and the
        tiers that took it (``CacheEngine.finish``), and what collapsed requests may share
        of it."""
        body = b"".join(parts) if parts is not None else None
        if body is None and type(decided.memory) is Keep and self.engine.fits(total):
            # No copy was kept of a body the store would take: never store it empty. (A
            # copy dropped past the largest object leaves a size the store refuses, and
            # counts, as too large.)
            decided = decided._replace(memory=TOO_LARGE)
        self.engine.finish(meta, decided, total, self.clock(), payload=body, served=served)
        rmeta = decided.response
        if too_large or not fits or (not rmeta.cacheable and rmeta.status < 500):
            return GO_DIRECT
        if body is None or rmeta.status >= 500:
            return None  # nothing to share: one follower fetches next
        return Shared(rmeta, body, meta.headers)

    async def settle_unserved(
        self,
        meta: RequestMeta,
        upstream: UpstreamResponse,
        fields: rfc9111.Fields,
        request_time: float,
    ) -> None:
        """Decide and store a response no client waits for (a background refresh) as a
        miss's is: its body read when memory or a tier takes it, and stored by the rules
        ``receive`` follows; counted as served to nobody."""
        rmeta, length, fits = self._judge(meta, upstream, fields, request_time)
        decided = await self.decide(meta, rmeta, length)
        parts: list[bytes] | None = None
        size = length or 0
        if fits and (type(decided.memory) is Keep or decided.tiers):
            body = await _read_up_to(upstream, self.max_object)
            parts, size = [body], len(body)
        self._settled(meta, decided, size, parts, size > self.max_object, fits, served=False)

    def settle_in_hand(self, meta: RequestMeta, decided: Decided, body: bytes) -> None:
        """``_settled`` for a whole body in hand, fetched whole, that no ``receive`` relayed
        (a slice, or an object one slice held): stored, or counted, in memory and in the
        tiers that take it."""
        self._settled(meta, decided, len(body), [body], False, True)

    def response_meta(
        self, meta: RequestMeta, status: int, fields: rfc9111.Fields, request_time: float
    ) -> ResponseMeta:
        """The engine's view of an origin response, under this proxy's cookie settings and
        TTL rules."""
        return response_meta(
            meta, status, fields, request_time, self.clock(),
            allow_set_cookie=self.allow_set_cookie, ignored_cookies=self.engine.ignore_cookies,
            rules=self.engine.ttl_rules,
        )  # fmt: skip

    async def decide(
        self, meta: RequestMeta, rmeta: ResponseMeta, length: int | None, *, whole: bool = True
    ) -> Decided:
        """``engine.on_response_head``, with the fleet's filter's answer when the engine asks
        for it (``ASK_ADMISSION``)."""
        decided = self.engine.on_response_head(meta, rmeta, length, self.clock(), whole=whole)
        if decided is ASK_ADMISSION:
            admitted = await self._ask_fleet(meta, length)
            decided = self.engine.on_response_head(meta, rmeta, length, self.clock(),
                                                   admitted=admitted, whole=whole)  # fmt: skip
        assert type(decided) is Decided
        trace_decision(decided)
        return decided

    async def shared_sighting(
        self, meta: RequestMeta, rmeta: ResponseMeta, size: int, payload: bytes
    ) -> Outcome:
        """``engine.on_shared`` for a request another's fetch answered, with the fleet's
        filter's answer when the engine asks for it (``ASK_ADMISSION``)."""
        outcome = self.engine.on_shared(meta, rmeta, size, self.clock(), payload=payload)
        if outcome is ASK_ADMISSION:
            admitted = await self._ask_fleet(meta, size)
            outcome = self.engine.on_shared(meta, rmeta, size, self.clock(), payload=payload,
                                            admitted=admitted)  # fmt: skip
        assert not isinstance(outcome, AskAdmission)
        return outcome

    async def _ask_fleet(self, meta: RequestMeta, length: int | None) -> bool:
        """The fleet's admission answer (the one place a response awaits the admission
        backend)."""
        assert self.shared is not None
        return await self.shared.admit(meta.key, length or 0, self.clock())


def trace_decision(decided: Decided | object) -> None:
    """The decision at a response's head, as a traced request's step (``proxy.wire.trace``)."""
    if not traced_now() or type(decided) is not Decided:
        return
    rmeta = decided.response
    step("response", status=rmeta.status, storable=rmeta.cacheable, why_not=rmeta.reason or None,
         lifetime=seconds(rmeta.lifetime), by_ttl_rule=rmeta.by_rule,
         memory="keeps" if type(decided.memory) is Keep else decided.memory.reason,
         tiers_behind_write=len(decided.tiers))  # fmt: skip


def _asks(request: web.BaseRequest) -> bool:
    """Whether the client sent fields a whole-object fetch left out."""
    return any(k.lower() in CLIENT_ASKS for k in request.headers)


def same_variant(shared: Shared, meta: RequestMeta) -> bool:
    """Whether ``meta`` selects the variant ``shared`` is (any, when it does not vary)."""
    names = shared.meta.vary
    return not names or rfc9111.vary_key(names, meta.headers) == rfc9111.vary_key(
        names, shared.request_headers
    )


async def _read_up_to(upstream: UpstreamResponse, limit: int) -> bytes:
    """The body, or its first bytes past ``limit`` (then the stream is not at EOF)."""
    first = in_hand(upstream)
    parts = [first]
    size = len(first)
    while size <= limit:
        chunk = await upstream.content.readany()
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)
