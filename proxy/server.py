"""The caching reverse proxy: aiohttp in front of the configured origins, driving the cache engine.

What it guarantees:

* Only configured origins are ever contacted. CONNECT is refused (405); an absolute-form target
  must name a routed host, and a Host no route names is refused (421) unless a default origin
  is set.
* The cache key is ``http://`` + host (lower-cased, default port dropped) + path and query as
  received.
* Transparent: every end-to-end request field reaches the origin, except, on a GET or HEAD,
  the fields of ``[server] deny_headers`` (those that rewrite the target, method or host: cache
  poisoning), or only ``[server] forward_headers`` when that is an allow-list. Hop-by-hop fields
  are stripped both ways; ``Via`` and ``X-Forwarded-For/-Proto/-Host`` replace what the client
  sent. Every end-to-end response field reaches the client (the origin's ``Age`` and
  ``Content-Range`` included), and bodies pass byte for byte.
* What to do with a request is the engine's decision (``CacheEngine.plan``); this module carries
  it out. A GET miss fetches the whole object without the client's conditionals and Range and
  answers them from it (304, 206, 416). A response that will not be stored and was fetched
  without fields the client sent is asked for again with them.
* Bodies stream: the first bytes go to the client as they arrive, and a copy is kept only of a
  body that will be stored (or that collapsed requests wait for), up to ``max_object_size``.
  It is stored when it ends whole; a body cut short is never stored, and the client's
  connection is closed so it cannot mistake it for a whole one.
* Concurrent GET misses of one URL share one origin fetch (single flight). When the leader's
  fetch fails, one follower leads the next try; a response that may not be shared (not
  cacheable, too large) sends the followers to the origin at once, and the URL goes straight
  there for ``[cache] hit_for_miss`` seconds.
* Every response carries ``Cache-Status`` (RFC 9211) and ``X-Cache``; cached ones carry ``Age``.
* A plain fresh hit may be answered by ``answer_hit`` as soon as it is parsed (see
  ``proxy.fastpath``): the same status, fields, body and counters as ``handle`` would give it.
  Its commonest case is compiled (``plain_hits``, ``proxy/_hits.c``): the same bytes and
  counts again, and whatever it declines ``answer_hit`` decides.
* A plain GET miss of a connection's lane is sent to the origin as soon as it is parsed, on
  an idle pooled connection, and answered in the callback that brings the origin's whole
  response (``start``, ``PendingMiss``): the answer, counters, store and single flight of
  ``handle``, without a task or a coroutine per layer. Whatever does not arrive whole and
  plain goes on in the lane's task exactly as ``handle`` would have gone on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from itertools import chain
from typing import assert_never
from urllib.parse import urlsplit

import aiohttp
from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.helpers import EMPTY_BODY_STATUS_CODES, rfc822_formatted_time
from aiohttp.http_parser import RawRequestMessage
from multidict import CIMultiDictProxy

from proxy._hits import PlainHits
from proxy.coalesce import Flight, SingleFlight
from proxy.config import Config
from proxy.core import rfc9111
from proxy.core._native import field_lines, hash64
from proxy.core.cached import MARKS, NOT_MODIFIED_DROPS, CachedHead, cached_head, per_answer, render
from proxy.core.engine import (
    ANSWERED_FIELDS,
    CLIENT_ASKS,
    FETCH_WHOLE,
    NOT_FAST,
    RULE_FIELDS,
    Action,
    Answer,
    CacheEngine,
    Fetch,
    FromCache,
    Keep,
    NotStored,
    Refuse,
    RequestMeta,
    ResponseMeta,
    Revalidate,
    fast_path_may_take,
    response_meta,
)
from proxy.core.store import Entry
from proxy.fastpath import JOIN_BELOW, LaneRequest, Pending, Written
from proxy.logs import HTTP_ERRORS
from proxy.pool import Fields, Interim, OriginResponse, Sent
from proxy.shared import SharedSecondHit
from proxy.upstream import Upstream, UpstreamError, UpstreamResponse
from proxy.writer import Relayed, RelayedWhole

log = logging.getLogger("onehit.proxy")

CACHE = "onehit"
VIA = "1.1 onehit"
# Fields the proxy writes itself; what a client sends of them is replaced, never trusted (a
# client cannot pose as another hop).
_FORWARDING = frozenset({"via", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"})
_CLIENT_DROPS = rfc9111.HOP_BY_HOP | _FORWARDING
# Client fields never passed on: the origin's Host is its own (from its URL), and a body the
# proxy has in hand needs no 100 Continue from the origin.
_NEVER_SENT = frozenset({"host", "expect"})
_VERSIONS = frozenset({HttpVersion10, HttpVersion11})
# What a whole-object fetch (or a revalidation) never sends of the client's fields.
_NOT_SENT_WHOLE = _NEVER_SENT | CLIENT_ASKS
# The origin's length field, left out where the proxy frames the body it writes itself.
_LENGTH = frozenset({"content-length"})
# Stored statuses whose answer is not their fields and body as stored: no body (204, 304), or
# a part whose range ``handle`` writes (206).
_NOT_PLAIN = frozenset({204, 206, 304})
# The fields ``answer_hit`` writes per hit (its ttl and Age): ``per_answer``'s, as bytes.
_HIT_STATUS = f"Cache-Status: {CACHE}; hit; ttl=".encode()
_PER_HIT = _HIT_STATUS + b"%d\r\nAge: %d\r\n"
# Valid routed Host values the compiled plain hit knows (``Proxy.plain_hits``); any other Host
# goes through ``_hosts``, which is cached as widely.
_ROUTED_HOSTS_MAX = 1024
_BODY_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)


@dataclass(frozen=True, slots=True)
class Shared:
    """A whole origin response, kept for the requests collapsed onto its fetch."""

    meta: ResponseMeta
    body: bytes
    request_headers: rfc9111.Headers


# A flight's result that sends its followers to the origin at once: the response may not be
# shared (not cacheable, or too large to keep).
GO_DIRECT = Shared(ResponseMeta(cacheable=False), b"", ())


class Proxy:
    """The request handler: one instance per listener, sharing one engine and one upstream."""

    def __init__(
        self,
        config: Config,
        engine: CacheEngine,
        upstream: Upstream,
        clock: Callable[[], float] = time.time,
        shared: SharedSecondHit | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.upstream = upstream
        self.clock = clock
        self.shared = shared
        self.routes = config.route_table()
        self.flights: SingleFlight[Shared] = SingleFlight(config.upstream.single_flight_wait)
        self.max_object = engine.store.max_object_bytes
        self.allow_set_cookie = config.cache.store_set_cookie
        self.max_url = config.server.max_url_length
        self.max_headers = config.server.max_header_size
        forward = config.server.forward_headers
        self.allowed = None if forward == ("*",) else frozenset(forward)
        self.denied = frozenset(config.server.deny_headers)
        # What ``_upstream_headers`` leaves out of a GET or HEAD when every field may pass
        # but the denied ones and no stored response's Vary names a field: names alone, by
        # whether the fetch is whole.
        denied = self.denied - _FORWARDING
        self._left_out = {
            True: rfc9111.HOP_BY_HOP | _NOT_SENT_WHOLE | denied,
            False: rfc9111.HOP_BY_HOP | _NEVER_SENT | denied,
        }
        self.body_buffer_size = config.server.body_buffer_size
        self.body_timeout = config.server.body_timeout
        self.max_streamed_uploads = config.server.max_streamed_uploads
        self.streamed_uploads = 0
        self._fast_hits = 0  # hits ``answer_hit`` answered (also counted among the engine's)
        # Misses a ``PendingMiss`` answered as their origin response arrived (also counted
        # among the engine's misses).
        self.fast_misses = 0
        self._routed_hosts: dict[bytes, str] = {}
        state = engine.hit_state()
        # ``answer_hit``'s commonest case, compiled: the same answer, counted the same.
        self.plain_hits = PlainHits(
            entries=state.entries,
            vary=state.vary,
            index=state.index,
            counters=state.counters,
            observe=state.observe,
            hash=hash64,
            clock=clock,
            date=rfc822_formatted_time,
            hosts=self._routed_hosts,
            declined=tuple(sorted(name.encode() for name in NOT_FAST | RULE_FIELDS)),
            per_hit=_HIT_STATUS,
            max_url=self.max_url,
            max_headers=self.max_headers,
            join_below=JOIN_BELOW,
        )
        self._background: set[asyncio.Task[None]] = set()

    @property
    def fast_hits(self) -> int:
        """Hits answered as soon as they were parsed (also counted among the engine's hits)."""
        return self._fast_hits + self.plain_hits.answered

    async def handle(
        self, request: web.BaseRequest, work: Awaitable[web.StreamResponse] | None = None
    ) -> web.StreamResponse:
        """Answer one request (``work``: what ``start`` left of answering it); a bug in here
        costs that request a 500, never the listener."""
        try:
            return await (self._handle(request) if work is None else work)
        except ConnectionResetError:
            # The client closed its connection before its answer's head went out: nothing to
            # write to, and no fault of the proxy's (nginx logs these as 499).
            log.info("%s %s: the client left before its answer", request.method, request.raw_path)
            return _plain(499, "client closed request", f"{CACHE}; detail=client-left")
        except Exception:
            version = request.version
            HTTP_ERRORS.exception(
                "unexpected error on %s %s HTTP/%d.%d from %s",
                request.method, request.raw_path, version.major, version.minor, request.remote,
            )  # fmt: skip
            return _plain(500, "internal error", f"{CACHE}; fwd=request; detail=error")

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        routed = self._route(request)
        if type(routed) is not tuple:
            return routed
        meta, url = routed
        if request.body_exists and request.method in ("GET", "HEAD"):
            # Content in a GET has no defined meaning (RFC 9110 section 9.3.1) and the cache
            # keys on none: the request goes to the origin whole, past the cache. Sent without
            # its body, its length would have the origin read the next request as the body.
            self.engine.pass_by()
            return await self._pass_through(request, meta, url, "bypass")
        return await self._act(request, meta, url, self.engine.plan(meta, self.clock()))

    def start(self, request: LaneRequest) -> Awaitable[web.StreamResponse] | PendingMiss:
        """Begin a request of a connection's lane (``proxy.fastpath``). A plain GET miss
        (no client conditional or Range, no fleet filter to ask) is sent at once on an idle
        pooled origin connection, and answered in the callback that brings its whole
        response (``PendingMiss``): no task, and no wait for the loop's next turn. Any other
        request gets the work that answers it as ``handle`` does, the engine's plan made."""
        if self.shared is not None:
            return self.handle(request)
        try:
            return self._start(request)
        except Exception as exc:
            return self.handle(request, _raising(exc))  # logged and answered as ``handle`` does

    def _start(self, request: LaneRequest) -> Awaitable[web.StreamResponse] | PendingMiss:
        routed = self._route(request)
        if type(routed) is not tuple:
            return self.handle(request, _given(routed))
        meta, url = routed
        action = self.engine.plan(meta, self.clock())
        if action is not FETCH_WHOLE or not CLIENT_ASKS.isdisjoint(meta.headers.by_name):
            return self.handle(request, self._act(request, meta, url, action))
        flight = self.flights.lead(meta.key)
        if flight is None:  # another request fetches it: follow
            return self.handle(request, self._act(request, meta, url, action))
        request_time = self.clock()
        try:
            sent = self.upstream.send_now(
                meta.method, url, self._upstream_headers(meta, whole=True)
            )
        except BaseException:
            self.flights.end(meta.key, flight, None)
            raise
        if sent is None:
            return self.handle(request, self._led_fetch(request, meta, url, action, flight))
        return PendingMiss(self, request, meta, url, flight, sent, request_time)

    def _route(self, request: web.BaseRequest) -> tuple[RequestMeta, str] | web.StreamResponse:
        """The request as the engine sees it and the origin URL it goes to; or the answer
        refusing it."""
        if request.version not in _VERSIONS:
            return _refuse_version(request)
        if len(request.raw_path) > self.max_url:
            return _plain(414, f"request target longer than {self.max_url} bytes")
        if _fields_size(request.raw_headers) > self.max_headers:
            return _plain(431, f"request header fields larger than {self.max_headers} bytes")
        if request.method in ("CONNECT", "TRACE"):
            return _plain(405, f"{request.method} is refused: this is a reverse proxy")
        coding = request.headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            return _plain(501, "only the chunked transfer coding is implemented", close=True)
        absolute = not request.raw_path.startswith("/")
        target = urlsplit(request.raw_path) if absolute else None
        hosts = _hosts(target.netloc if target is not None else request.host)
        if hosts is None:
            return _plain(400, "invalid Host")
        route_host, key_host = hosts
        origin = self.routes.get(route_host)
        if origin is None and not absolute:
            origin = self.routes.get("")
        if origin is None:
            return _plain(421, f"no route for host {route_host!r}")
        path = request.rel_url.raw_path_qs if absolute else request.raw_path
        meta = self._meta(request.method, key_host, path, request.headers, request.remote or "",
                          request.scheme)  # fmt: skip
        return meta, origin + path

    async def _act(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, action: Action
    ) -> web.StreamResponse:
        """Carry out the engine's ``action`` for ``request``."""
        match action:
            case FromCache():
                if action.refresh:
                    self._refresh_in_background(meta, url, action.entry)
                x_cache = "HIT" if action.fresh else "STALE"
                ttl = int(action.entry.lifetime - action.age)
                status = f"{CACHE}; hit; ttl={ttl}"
                return self._from_cache(request, meta, action.entry, action.age, status, x_cache)
            case Revalidate():
                return await self._revalidate(request, meta, url, action)
            case Fetch(reason="method"):
                return await self._pass_through(request, meta, url)
            case Fetch(collapse=True):
                return await self._collapsed_fetch(request, meta, url, action)
            case Fetch():
                return (await self._fetch(request, meta, url, action))[0]
            case Refuse():
                return _plain(action.status, action.text, f"{CACHE}; fwd={action.reason}")
            case _:
                assert_never(action)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _meta(
        self,
        method: str,
        key_host: str,
        path: str,
        fields: CIMultiDictProxy[str],
        remote: str,
        scheme: str,
    ) -> RequestMeta:
        # What the origin receives of Via and X-Forwarded-*, in place of anything the client
        # sent: Vary selects variants on these values too.
        forwarding = (
            ("Via", VIA),
            ("X-Forwarded-For", remote),
            ("X-Forwarded-Proto", scheme),
            ("X-Forwarded-Host", key_host),
        )
        # Indexed once: the cache's rules read these fields about a dozen times per miss. The
        # client's hop-by-hop fields go first, so its Connection can name only its own fields
        # away, never the ones the proxy adds.
        fields_sent = rfc9111.end_to_end_fields(fields.items(), _CLIENT_DROPS, forwarding)
        return RequestMeta(f"http://{key_host}{path}", method, fields_sent)

    def answer_hit(
        self, message: RawRequestMessage, remote: str, scheme: str
    ) -> tuple[bytes, bytes, int] | None:
        """The whole answer to a plain fresh hit (bytes to write, then a large body to write
        apart or b"", and the status), counted as ``handle`` counts one; None, with nothing
        counted, for any other request (``handle`` answers it). Plain: GET or HEAD, HTTP/1.1
        keep-alive, an origin-form target and fields within the limits, a routed Host, no
        body, no precondition (a validator or a Range is answered from the stored response:
        304, 206, 416), and a stored response whose status has a body."""
        fields = message.headers
        names = set(map(str.lower, fields))
        kept_alive = message.version == HttpVersion11 and not message.should_close
        if (
            message.upgrade
            or message.chunked
            or not fast_path_may_take(message.method, kept_alive, names)
        ):
            return None
        method = message.method
        path = message.path
        raw = message.raw_headers
        if (
            not path.startswith("/")
            or len(path) > self.max_url
            or _fields_size(raw) > self.max_headers
        ):
            return None
        host = fields.get("Host")
        hosts = None if host is None else _hosts(host)
        if hosts is None or (hosts[0] not in self.routes and "" not in self.routes):
            return None
        if len(self._routed_hosts) < _ROUTED_HOSTS_MAX:
            self._routed_hosts[host.encode("utf-8", "surrogateescape")] = f"http://{hosts[1]}"
        now = self.clock()
        meta = None
        key = f"http://{hosts[1]}{path}"
        if names.isdisjoint(RULE_FIELDS) and not self.engine.varies(key):
            hit = self.engine.fresh_plain(key, now)
        else:
            meta = self._meta(method, hosts[1], path, fields, remote, scheme)
            hit = self.engine.fresh(meta, now)
        if hit is None:
            return None
        entry = hit.entry
        rendered = entry.rendered
        if rendered is None:
            rendered = entry.rendered = _render(entry)
        if rendered is False:
            return None
        self.engine.served(key, hit, now)
        self._fast_hits += 1
        age = int(hit.age)
        ttl = int(entry.lifetime - hit.age)
        head, dated = rendered
        per_hit = _PER_HIT % (ttl, age)
        if not dated:
            per_hit += b"Date: %s\r\n" % rfc822_formatted_time().encode()
        body = entry.payload
        status = entry.status
        if meta is not None and not names.isdisjoint(ANSWERED_FIELDS):
            answer = self.engine.answer(meta, entry.status, entry.headers, len(entry.payload))
            if answer.status != entry.status:
                head, body = _render_part(entry, answer)
                status = answer.status
        if method == "HEAD":
            return b"".join((head, per_hit, b"\r\n")), b"", status
        if len(body) < JOIN_BELOW:
            return b"".join((head, per_hit, b"\r\n", body)), b"", status
        return b"".join((head, per_hit, b"\r\n")), body, status

    # Fetches

    async def _collapsed_fetch(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, action: Fetch
    ) -> web.StreamResponse:
        deadline: float | None = None  # set when first following (few requests do)
        while True:
            flight = self.flights.lead(meta.key)
            if flight is not None:
                return await self._led_fetch(request, meta, url, action, flight)
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.flights.wait_limit
            shared = await self.flights.follow(meta.key, deadline)
            if shared is not None and shared is not GO_DIRECT and _same_variant(shared, meta):
                return await self._collapsed(request, meta, shared)
            if shared is not None or asyncio.get_running_loop().time() >= deadline:
                return (await self._fetch(request, meta, url, replace(action, collapse=False)))[0]
            # The leader failed: the key is free, and the first follower awake leads next.

    async def _led_fetch(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        action: Fetch,
        flight: Flight[Shared],
        sent: Sent | None = None,
        request_time: float = 0.0,
    ) -> web.StreamResponse:
        """``_fetch`` by the leader of ``flight``, which it lands with what it fetched."""
        result: Shared | None = None
        try:
            response, result = await self._fetch(request, meta, url, action, flight, sent,
                                                 request_time)  # fmt: skip
            return response
        finally:
            self.flights.end(meta.key, flight, result)

    async def _collapsed(
        self, request: web.BaseRequest, meta: RequestMeta, shared: Shared
    ) -> web.StreamResponse:
        """Answer from the response another request fetched; it counts as this request's
        sighting of the URL too, so a burst of misses can store it."""
        size = len(shared.body)
        admitted = await self._ask_fleet(meta, shared.meta, size)
        outcome = self.engine.on_shared(meta, shared.meta, size, self.clock(),
                                        payload=shared.body, admitted=admitted)  # fmt: skip
        status = f"{CACHE}; fwd=uri-miss; collapsed" + _detail(outcome)
        age = shared.meta.initial_age
        return self._whole(request, meta, shared.meta.status, shared.meta.headers, shared.body,
                           status, "MISS", age)  # fmt: skip

    async def _fetch(
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
            headers = self._upstream_headers(meta, whole=action.whole)
        try:
            upstream = await self.upstream.request(
                meta.method, url, headers, sent=sent, interim=_interim(request)
            )
        except UpstreamError as exc:
            status = f"{CACHE}; fwd={action.reason}; detail=origin-error"
            return _plain(exc.status, exc.public, status), None
        async with upstream:
            return await self._receive(request, meta, url, upstream, request_time, action, flight)

    async def _receive(
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
        headers = _fields(upstream)
        rmeta, length, fits = self._judge(meta, upstream, headers, request_time)
        decision = (
            self.engine.on_response_head(meta, rmeta, length, self.clock())
            if self.shared is None
            else await self._decide(meta, rmeta, length)
        )
        if action.whole and not (rmeta.cacheable and fits) and _asks(request):
            # Not stored, so the client's own conditionals and Range are the origin's to answer.
            upstream.close()
            again = replace(action, whole=False, collapse=False)
            return (await self._fetch(request, meta, url, again))[0], GO_DIRECT
        answer, cache_status, arrived, parts, out = self._relay(
            request, meta, upstream, action, flight, headers, rmeta, decision, fits
        )
        if out is not None:
            return out, self._settled(meta, rmeta, decision, len(arrived), parts, False, fits)
        out = _head(answer, upstream, headers, length)
        _mark(out, cache_status, "MISS")
        total, parts, too_large, whole = await self._stream(
            request, meta, url, upstream, answer, out, arrived, parts
        )
        if not whole:
            self.engine.finish(meta, decision, total, self.clock(), complete=False)
            return out, None
        return out, self._settled(meta, rmeta, decision, total, parts, too_large, fits)

    def receive_now(
        self,
        request: LaneRequest,
        meta: RequestMeta,
        upstream: OriginResponse,
        headers: rfc9111.Fields,
        request_time: float,
        flight: Flight[Shared],
    ) -> tuple[Written, Shared | None]:
        """``_receive`` of a plain GET miss's whole response (``headers``: its end-to-end
        fields), to be written at once: ``PendingMiss`` asks only for such a response."""
        rmeta, length, fits = self._judge(meta, upstream, headers, request_time)
        decision = self.engine.on_response_head(meta, rmeta, length, self.clock())
        _, _, arrived, parts, out = self._relay(
            request, meta, upstream, FETCH_WHOLE, flight, headers, rmeta, decision, fits
        )
        assert out is not None, "PendingMiss offered an answer that cannot be written at once"
        return out, self._settled(meta, rmeta, decision, len(arrived), parts, False, fits)

    def _judge(
        self,
        meta: RequestMeta,
        upstream: UpstreamResponse,
        headers: rfc9111.Fields,
        request_time: float,
    ) -> tuple[ResponseMeta, int | None, bool]:
        """The engine's view of an origin response, its length if known, and whether that
        length fits the store."""
        rmeta = self._response_meta(meta, upstream.status, headers, request_time)
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
        rmeta: ResponseMeta,
        decision: Keep | NotStored,
        fits: bool,
    ) -> tuple[Answer, str, bytes, list[bytes] | None, Written | None]:
        """How the client is answered from a decided origin response: the answer, its
        Cache-Status, the body bytes that came with the head, the copy of the body to keep
        (None: none), and the answer itself when it was written at once (``_at_once``)."""
        share = flight is not None and flight.waiting > 0 and rmeta.cacheable and fits
        keep = type(decision) is Keep or share
        length = upstream.content_length
        answer = (
            self.engine.answer(meta, upstream.status, headers, length)
            if action.whole
            else Answer(upstream.status)
        )
        detail = "; stored" if type(decision) is Keep else f"; detail={decision.reason}"
        cache_status = f"{CACHE}; fwd={action.reason}{detail}"
        arrived = _in_hand(upstream)
        parts: list[bytes] | None = [] if keep else None
        out = _at_once(request, upstream, answer, headers, cache_status, arrived, length)
        if out is not None and parts is not None:
            parts.append(arrived)
        return answer, cache_status, arrived, parts, out

    def _settled(
        self,
        meta: RequestMeta,
        rmeta: ResponseMeta,
        decision: Keep | NotStored,
        total: int,
        parts: list[bytes] | None,
        too_large: bool,
        fits: bool,
    ) -> Shared | None:
        """Store or count a body that ended whole after ``total`` bytes (``parts``: the copy
        kept of it), and what collapsed requests may share of it."""
        body = b"".join(parts) if parts is not None else b""
        # A copy dropped past the max object size leaves a size the store refuses: too large.
        self.engine.finish(meta, decision, total, self.clock(), payload=body)
        if too_large or not fits or (not rmeta.cacheable and rmeta.status < 500):
            return GO_DIRECT
        if parts is None or rmeta.status >= 500:
            return None  # nothing to share: one follower fetches next
        return Shared(rmeta, body, meta.headers)

    async def _stream(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        upstream: UpstreamResponse,
        answer: Answer,
        out: web.StreamResponse,
        arrived: bytes,
        parts: list[bytes] | None,
    ) -> tuple[int, list[bytes] | None, bool, bool]:
        """Write ``out``'s head and the part of the origin's body ``answer`` asks for as it
        arrives, keeping a copy in ``parts`` (when given) up to the max object size. Returns
        the bytes read of the body, the copy (None once dropped), whether it was dropped for
        its size, and whether the body ended whole (when it failed, the client's connection
        is cut once its head is out)."""
        length = upstream.content_length
        sending = _wanted_bytes(answer, upstream.status, length)
        if arrived and sending is not None and sending[0] < len(arrived):
            # The head goes out with the body bytes already in hand, in one write: never
            # later than it would alone, since the first of those bytes is written at once.
            out._send_headers_immediately = False
        await out.prepare(request)
        total = 0
        too_large = abandoned = False
        chunks = _body(arrived, upstream.content)
        try:
            if sending is None:
                await _send(out, b"", eof=True)
            if sending is not None or parts is not None:
                async for chunk in chunks:
                    start = total
                    total += len(chunk)
                    if parts is not None:
                        parts.append(chunk)
                        if total > self.max_object:
                            parts, too_large = None, True  # stream the rest, keep nothing
                    if sending is not None:
                        first, last = sending
                        # start <= last here: the chunk that passes ``last`` ends the answer.
                        piece = chunk[max(0, first - start) : last + 1 - start]
                        done = total > last
                        if not await _send(out, piece, eof=done) or done:
                            sending = None  # answered, or the client left
                    if sending is None and parts is None:
                        abandoned = True  # the client has its answer and nothing is kept
                        break
            if sending is not None:
                await _send(out, b"", eof=True)
        except _BODY_ERRORS as exc:
            log.warning(
                "%s %s: origin body failed after %d bytes: %r", meta.method, url, total, exc
            )
            if sending is not None:
                _abort(request)  # the headers are gone: a cut connection is the honest signal
            return total, parts, too_large, False
        finally:
            await chunks.aclose()
        if abandoned and length is not None:
            total = length
        return total, parts, too_large, True

    def _response_meta(
        self, meta: RequestMeta, status: int, fields: rfc9111.Fields, request_time: float
    ) -> ResponseMeta:
        """The engine's view of an origin response, under this proxy's cookie settings."""
        return response_meta(
            meta, status, fields, request_time, self.clock(),
            allow_set_cookie=self.allow_set_cookie, ignored_cookies=self.engine.ignore_cookies,
        )  # fmt: skip

    async def _decide(
        self, meta: RequestMeta, rmeta: ResponseMeta, length: int | None
    ) -> Keep | NotStored:
        """``engine.on_response_head``, asking the fleet's filter first when there is one."""
        admitted = await self._ask_fleet(meta, rmeta, length)
        return self.engine.on_response_head(meta, rmeta, length, self.clock(), admitted=admitted)

    async def _ask_fleet(
        self, meta: RequestMeta, rmeta: ResponseMeta, length: int | None
    ) -> bool | None:
        """The fleet's admission answer when the engine would consult its policy (the one
        place a response awaits the admission backend); None without a fleet."""
        if self.shared is not None and self.engine.admission_pending(meta, rmeta, length):
            return await self.shared.admit(meta.key, length or 0, self.clock())
        return None

    # Stored responses the origin is asked about

    async def _revalidate(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, action: Revalidate
    ) -> web.StreamResponse:
        entry = action.entry
        request_time = self.clock()
        headers = self._upstream_headers(meta, whole=True, extra=action.conditions,
                                         keep=_vary_of(entry))  # fmt: skip
        try:
            upstream = await self.upstream.request("GET", url, headers, interim=_interim(request))
        except UpstreamError as exc:
            return self._origin_failed(request, meta, action, exc.status, exc.public)
        async with upstream:
            if upstream.status == 304:
                self.engine.on_not_modified(entry, _fields(upstream), request_time, self.clock())
                status = f"{CACHE}; fwd=stale; fwd-status=304"
                age = entry.age(self.clock())
                return self._from_cache(request, meta, entry, age, status, "REVALIDATED")
            if upstream.status >= 500 and action.stale_if_error:
                return self._origin_failed(request, meta, action, upstream.status, "origin error")
            fetch = Fetch("stale", whole=True, collapse=False)
            return (await self._receive(request, meta, url, upstream, request_time, fetch, None))[0]

    def _origin_failed(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        action: Revalidate,
        code: int,
        detail: str,
    ) -> web.StreamResponse:
        if action.stale_if_error:
            self.engine.served_stale(action.entry)
            status = f"{CACHE}; hit; detail=stale-if-error"
            return self._from_cache(request, meta, action.entry, action.age, status, "STALE")
        return _plain(code, detail, f"{CACHE}; fwd=stale; detail=origin-error")

    def _refresh_in_background(self, meta: RequestMeta, url: str, entry: Entry) -> None:
        """Revalidate ``entry`` with no client waiting (stale-while-revalidate); what comes back
        is decided as any response is."""
        flight = self.flights.lead(("refresh", meta.key))
        if flight is None:
            return
        conditions = tuple(rfc9111.conditional_headers(entry.headers))
        headers = self._upstream_headers(meta, whole=True, extra=conditions, keep=_vary_of(entry))

        async def refresh() -> None:
            try:
                request_time = self.clock()
                async with await self.upstream.request("GET", url, headers) as upstream:
                    fields = _fields(upstream)
                    if upstream.status == 304:
                        self.engine.on_not_modified(
                            entry, fields, request_time, self.clock(), served=False
                        )
                        return
                    rmeta = self._response_meta(meta, upstream.status, fields, request_time)
                    length = upstream.content_length
                    decision = await self._decide(meta, rmeta, length)
                    body = b""
                    if type(decision) is Keep:
                        body = await _read_up_to(upstream, self.max_object)
                    self.engine.finish(meta, decision, len(body) or length or 0, self.clock(),
                                       payload=body, served=False)  # fmt: skip
            except (UpstreamError, *_BODY_ERRORS) as exc:
                log.warning("background refresh of %s failed: %r", meta.key, exc)
            finally:
                self.flights.end(("refresh", meta.key), flight, None)

        task = asyncio.get_running_loop().create_task(refresh())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # Other methods

    async def _pass_through(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, reason: str = "method"
    ) -> web.StreamResponse:
        """Send the request with its body to the origin past the cache, and relay the answer
        (``reason``: the Cache-Status ``fwd`` that says why)."""
        try:
            body = await self._request_body(request)
        except TimeoutError:
            log.info("%s %s: no request body bytes for %gs", meta.method, url, self.body_timeout)
            return _plain(408, "request body timed out", close=True)
        streamed = body is not None and not isinstance(body, bytes)
        if streamed:
            if self.streamed_uploads >= self.max_streamed_uploads:
                refused = _plain(503, "too many large uploads in progress", close=True)
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
            upstream = await self.upstream.request(
                meta.method, url, self._upstream_headers(meta, whole=False), body,
                interim=_interim(request),
            )  # fmt: skip
        except UpstreamError as exc:
            return _plain(exc.status, exc.public, f"{CACHE}; fwd={reason}; detail=origin-error")
        async with upstream:
            self.engine.on_unsafe_response(meta, upstream.status)
            fields = _fields(upstream)
            arrived = _in_hand(upstream)
            if upstream.content_length == len(arrived):
                # The whole body came with the head (most API answers): written with it, in
                # one write, instead of streamed.
                kept = [(k, v) for k, v in fields if k.lower() not in _LENGTH]
                whole = RelayedWhole(
                    status=upstream.status, reason=upstream.reason, headers=kept, body=arrived
                )
                _mark(whole, f"{CACHE}; fwd={reason}", "BYPASS")
                return whole
            out = Relayed(status=upstream.status, reason=upstream.reason, headers=fields)
            _mark(out, f"{CACHE}; fwd={reason}", "BYPASS")
            await out.prepare(request)
            try:
                async for chunk in _body(arrived, upstream.content):
                    await out.write(chunk)
            except _BODY_ERRORS as exc:
                log.warning("%s %s: origin body failed mid-stream: %r", meta.method, url, exc)
                _abort(request)
                return out
            await out.write_eof()
            return out

    async def _request_body(self, request: web.BaseRequest) -> bytes | AsyncIterator[bytes] | None:
        """The request body as the origin will get it, read before any origin connection is
        taken: whole when it fits ``[server] body_buffer_size`` (then a failed connection can
        send it again), else its first bytes and then the rest as it arrives. Every wait for
        more bytes is bounded by ``[server] body_timeout`` (TimeoutError past it), so a client
        that stalls mid-upload holds no origin connection. ``Expect: 100-continue`` is answered
        here, as nginx does: the origin gets the body without being asked."""
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

    # Building requests and answers

    def _upstream_headers(
        self,
        meta: RequestMeta,
        *,
        whole: bool,
        extra: tuple[tuple[str, str], ...] = (),
        keep: frozenset[str] = frozenset(),
    ) -> list[tuple[str, str]]:
        """The fields sent to the origin: the client's end-to-end ones (for a GET/HEAD, less
        the denied ones, or only the allowed ones), without what a whole-object fetch answers
        itself, plus ``extra``, and the forwarding fields ``meta`` carries. ``keep``: fields
        that pass whatever the lists say (those a stored response's Vary names)."""
        filtered = meta.method in ("GET", "HEAD")
        if filtered and not extra and not keep and self.allowed is None:
            # The rules below only leave names out then: all of them in the hop-by-hop pass.
            return rfc9111.end_to_end(meta.headers, self._left_out[whole])
        drop = _NOT_SENT_WHOLE if whole or extra else _NEVER_SENT
        if extra:
            drop = drop | {k.lower() for k, _ in extra}
        denied, allowed = self.denied, self.allowed
        headers = []
        for k, v in rfc9111.end_to_end(meta.headers):
            low = k.lower()
            if low in drop:
                continue
            if (
                filtered
                and low not in keep
                and low not in _FORWARDING
                and (low in denied or (allowed is not None and low not in allowed))
            ):
                continue
            headers.append((k, v))
        headers.extend(extra)
        return headers

    def _from_cache(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        entry: Entry,
        age: float,
        cache_status: str,
        x_cache: str,
    ) -> web.Response:
        return self._whole(request, meta, entry.status, entry.headers, entry.payload,
                           cache_status, x_cache, age)  # fmt: skip

    def _whole(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        status: int,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        cache_status: str,
        x_cache: str,
        age: float,
    ) -> web.Response:
        """A response whose body is in hand (stored, or shared by a collapsed fetch),
        answering the client's conditionals (304) and single byte range (206/416): the head
        ``cached_head`` renders, as every path writes it."""
        answer = self.engine.answer(meta, status, headers, len(body))
        head = cached_head(status, headers, answer.status, answer.first, answer.last, len(body),
                           x_cache=x_cache, via=VIA)  # fmt: skip
        date = None if head.dated else rfc822_formatted_time()
        fields = (*head.fields, *per_answer(cache_status, age, date))
        return RelayedWhole(status=answer.status, headers=fields, body=_span(body, head))


class PendingMiss(Pending):
    """A plain GET miss ``Proxy.start`` sent to the origin at once. Its answer is written in
    the callback that brings the origin's response, when that came whole, plain (see
    ``proxy/_origin.c``) and without a field the proxy marks, to a client still connected:
    what ``_receive`` writes at once, with the same counters, the same store and the same
    flight landed. Anything else (a response in pieces, an interim one, a failure, a retry
    on a new connection) goes on in the lane's task, as ``handle`` would have gone on."""

    __slots__ = ("_flight", "_meta", "_proxy", "_request", "_request_time", "_sent", "_url")

    def __init__(
        self,
        proxy: Proxy,
        request: LaneRequest,
        meta: RequestMeta,
        url: str,
        flight: Flight[Shared],
        sent: Sent,
        request_time: float,
    ) -> None:
        self._proxy = proxy
        self._request = request
        self._meta = meta
        self._url = url
        self._flight = flight
        self._sent = sent
        self._request_time = request_time
        sent.offer(self._arrived, self._go_on)

    def _arrived(self, status: int, reason: str, fields: Fields, body: bytes) -> bool:
        """Answer from the whole response the origin sent; False, having done nothing, when
        the lane is to answer from it instead."""
        request = self._request
        transport = request.transport
        headers = rfc9111.end_to_end_fields(fields)
        if (
            transport is None
            or transport.is_closing()
            or not headers.by_name.keys().isdisjoint(MARKS)
        ):
            return False
        proxy = self._proxy
        upstream = self._sent.whole(status, reason, fields, body)
        result: Shared | None = None
        try:
            out, result = proxy.receive_now(request, self._meta, upstream, headers,
                                            self._request_time, self._flight)  # fmt: skip
        except Exception as exc:
            request.go_on(proxy.handle(request, _raising(exc)))  # its 500, as from ``handle``
            return True
        finally:
            proxy.flights.end(self._meta.key, self._flight, result)
        proxy.fast_misses += 1
        request.answered(out)
        return True

    def _go_on(self) -> None:
        """The response is not to be answered here: the lane's task takes it from the pool."""
        proxy, request = self._proxy, self._request
        work = proxy._led_fetch(request, self._meta, self._url, FETCH_WHOLE, self._flight,
                                self._sent, self._request_time)  # fmt: skip
        request.go_on(proxy.handle(request, work))

    def cancel(self) -> None:
        self._sent.abandon()
        self._proxy.flights.end(self._meta.key, self._flight, None)


async def _given(response: web.StreamResponse) -> web.StreamResponse:
    return response


async def _raising(exc: Exception) -> web.StreamResponse:
    raise exc


def _interim(request: web.BaseRequest) -> Interim | None:
    """What forwards an origin's interim (1xx) responses to the client (RFC 9110 section
    15.2: a proxy forwards those it did not ask for itself), as they arrive, before the final
    answer's head: 103 Early Hints, mostly. Not to an HTTP/1.0 client, which cannot read
    them; never a 100 Continue, which the proxy answers itself (it never sends Expect on)."""
    if request.version != HttpVersion11:
        return None

    def forward(status: int, reason: str, fields: Fields) -> None:
        transport = request.transport
        lines = field_lines(rfc9111.end_to_end(fields))
        if status == 100 or transport is None or transport.is_closing() or lines is None:
            return
        head = f"HTTP/1.1 {status} {reason}\r\n{lines}\r\n"
        transport.write(head.encode("utf-8", "surrogateescape"))

    return forward


def _fields(upstream: UpstreamResponse) -> rfc9111.Fields:
    """An origin response's end-to-end fields (hop-by-hop ones stripped), indexed."""
    fields = upstream.fields if type(upstream) is OriginResponse else upstream.headers.items()
    return rfc9111.end_to_end_fields(fields)


def _head(
    answer: Answer,
    upstream: UpstreamResponse,
    headers: rfc9111.Fields,
    length: int | None,
) -> web.StreamResponse:
    """The head of the answer to a client from an origin response that is still arriving."""
    if answer.status == upstream.status:
        return Relayed(status=upstream.status, reason=upstream.reason, headers=headers)
    drops = NOT_MODIFIED_DROPS if answer.status == 304 else _LENGTH
    kept = [(k, v) for k, v in headers if k.lower() not in drops]
    out = Relayed(status=answer.status, headers=kept)
    if answer.status == 206:
        out.headers["Content-Range"] = f"bytes {answer.first}-{answer.last}/{length}"
        out.content_length = answer.last - answer.first + 1
    elif answer.status == 416:
        out.headers["Content-Range"] = f"bytes */{length}"
        out.content_length = 0
    return out


def _at_once(
    request: web.BaseRequest,
    upstream: UpstreamResponse,
    answer: Answer,
    headers: rfc9111.Fields,
    cache_status: str,
    arrived: bytes,
    length: int | None,
) -> Written | None:
    """The answer to a lane's GET written whole, head and body in one write, when it is the
    origin's response as it is and its whole body arrived with its head (most small objects):
    the bytes the request's writer would write for ``_head`` marked by ``_mark``. None,
    writing nothing, for any other answer (streamed through that writer), or when the
    origin's fields name one the proxy marks (``_mark`` puts those in their places)."""
    if (
        type(request) is not LaneRequest
        or request.method != "GET"
        or answer.status != upstream.status
        or length != len(arrived)
        or upstream.status in EMPTY_BODY_STATUS_CODES
    ):
        return None
    names = headers.by_name
    if not names.keys().isdisjoint(MARKS):
        return None
    fields = field_lines(headers)
    if fields is None:
        return None  # a line break in a field: the origin's parser never passes one
    # A Date where the origin sent none, as a relayed response adds it.
    dated = "" if "date" in names else f"Date: {rfc822_formatted_time()}\r\n"
    head = (
        f"HTTP/1.1 {upstream.status} {upstream.reason}\r\n{fields}Cache-Status: {cache_status}"
        f"\r\nX-Cache: MISS\r\nVia: {VIA}\r\n{dated}\r\n"
    )
    return request.write_at_once(head.encode("utf-8", "surrogateescape"), arrived, upstream.status)


def _in_hand(upstream: UpstreamResponse) -> bytes:
    """The body bytes that arrived with the head, b"" if none; a body that already failed
    gives b"", and its failure is met when the rest is read."""
    try:
        if type(upstream) is OriginResponse:
            return upstream.in_hand()
        return upstream.content.read_nowait()
    except _BODY_ERRORS:
        return b""


async def _body(first: bytes, content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """``first``, then the rest of a body as it arrives."""
    if first:
        yield first
    async for chunk in content.iter_any():
        yield chunk


async def _send(out: web.StreamResponse, data: bytes, *, eof: bool = False) -> bool:
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


def _asks(request: web.BaseRequest) -> bool:
    """Whether the client sent fields a whole-object fetch left out."""
    return any(k.lower() in CLIENT_ASKS for k in request.headers)


def _vary_of(entry: Entry) -> frozenset[str]:
    return frozenset(rfc9111.vary_names(entry.headers))


def _detail(outcome: object) -> str:
    if isinstance(outcome, NotStored):
        return f"; detail={outcome.reason}"
    return "; stored"


def _same_variant(shared: Shared, meta: RequestMeta) -> bool:
    names = shared.meta.vary
    return not names or rfc9111.vary_key(names, meta.headers) == rfc9111.vary_key(
        names, shared.request_headers
    )


async def _read_up_to(upstream: UpstreamResponse, limit: int) -> bytes:
    """The body, or its first bytes past ``limit`` (then the stream is not at EOF)."""
    first = _in_hand(upstream)
    parts = [first]
    size = len(first)
    while size <= limit:
        chunk = await upstream.content.readany()
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def cache_key(url: str) -> str:
    """The cache key of an absolute ``http://host[:port]/path?query`` URL, as the proxy forms it
    (ValueError for a host the proxy would refuse)."""
    _, _, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    hosts = _hosts(host)
    if hosts is None:
        raise ValueError(f"not a valid host: {host!r}")
    return f"http://{hosts[1]}{slash}{path}"


_HOST = re.compile(
    r"(?P<name>\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+)"
    r"(?::(?P<port>[0-9]{0,5}))?",
    re.ASCII,
)


# A DNS name (253 characters at most) and a port: anything longer is no host.
_HOST_MAX = 253 + len(":65535")


def _hosts(host: str) -> tuple[str, str] | None:
    """(route host, key host) of a Host value (RFC 3986 3.2.2: a reg-name or an IP literal,
    ASCII only), lower-cased by ASCII rules; the key keeps a non-default port. None when it is
    not a valid host: ``/`` or ``@`` in it, a non-ASCII letter that would fold onto another
    host's name (the Kelvin sign onto ``k``), an unbracketed IPv6 address, too long a name."""
    return None if len(host) > _HOST_MAX else _parsed_host(host)


@functools.lru_cache(maxsize=1024)  # few distinct Hosts, each on every request; short ones only
def _parsed_host(host: str) -> tuple[str, str] | None:
    match = _HOST.fullmatch(host.strip())
    if match is None:
        return None
    name = match["name"].lower()
    port = match["port"] or ""
    key = name if port in ("", "80") else f"{name}:{port}"
    return name.strip("[]"), key


def _fields_size(raw: tuple[tuple[bytes, bytes], ...]) -> int:
    """Bytes of a request's header fields as sent: names, values, ": " and CRLF."""
    return sum(map(len, chain.from_iterable(raw))) + 4 * len(raw)


def _mark(response: web.StreamResponse, cache_status: str, x_cache: str) -> None:
    response.headers["Cache-Status"] = cache_status
    response.headers["X-Cache"] = x_cache
    response.headers["Via"] = VIA


def _plain(
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
    _mark(
        response, cache_status or f"{CACHE}; fwd=request", "ERROR" if status >= 500 else "REFUSED"
    )
    return response


def _refuse_version(request: web.BaseRequest) -> web.Response:
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


def _abort(request: web.BaseRequest) -> None:
    if request.transport is not None:
        request.transport.close()


def _render(entry: Entry) -> tuple[bytes, bool] | bool:
    """What every hit on ``entry`` writes the same, built once per stored response: the head
    of its answer without the per-answer fields (``cached_head``), and whether it holds a
    Date. False for a status ``answer_hit`` leaves to ``handle``."""
    if entry.status in _NOT_PLAIN or entry.status < 200 or not isinstance(entry.payload, bytes):
        return False
    size = len(entry.payload)
    head = cached_head(entry.status, entry.headers, entry.status, 0, size - 1, size,
                       x_cache="HIT", via=VIA)  # fmt: skip
    return render(head), head.dated


def _render_part(entry: Entry, answer: Answer) -> tuple[bytes, bytes | memoryview]:
    """The head (without its per-answer fields) and body of a 304, 206 or 416 from
    ``entry``: a part of the stored body, never a copy."""
    size = len(entry.payload)
    head = cached_head(entry.status, entry.headers, answer.status, answer.first, answer.last,
                       size, x_cache="HIT", via=VIA)  # fmt: skip
    return render(head), _span(entry.payload, head)


def _span(body: bytes, head: CachedHead) -> bytes | memoryview:
    """The bytes of ``body`` that ``head``'s answer carries: all of it, none, or a part (a
    memoryview of it, never a copy)."""
    if head.last < head.first:
        return b""
    if head.first == 0 and head.last == len(body) - 1:
        return body
    return memoryview(body)[head.first : head.last + 1]
