"""The caching reverse proxy: aiohttp in front of the configured origins, driving the cache engine.

What it guarantees:

* Only configured origins are ever contacted. CONNECT is refused (405); an absolute-form target
  must name a routed host, and a Host no route names is refused (421) unless a default origin
  is set.
* The cache key is ``http://`` + host (lower-cased, default port dropped) + path and query as
  received. Bodies pass byte for byte; hop-by-hop fields are stripped both ways; ``Via`` and
  ``X-Forwarded-For/-Proto/-Host`` replace whatever the client sent.
* A GET miss whose response may be stored and fits ``max_object_size`` is read whole, offered to
  the engine, then sent; anything else streams through without being held. A response cut short
  is never stored: if nothing was sent yet the client gets 502, else its connection is closed.
* Concurrent unconditional GET misses of one URL share one origin fetch (single flight).
* Every response carries ``Cache-Status`` (RFC 9211) and ``X-Cache``; cached ones carry ``Age``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.coalesce import SingleFlight
from proxy.config import Config
from proxy.core import rfc9111
from proxy.core.engine import (
    Bypass,
    CacheEngine,
    Hit,
    NotStored,
    RequestMeta,
    ResponseMeta,
    Stale,
    Store,
    response_meta,
)
from proxy.core.store import Entry
from proxy.shared import SharedSecondHit
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger("onehit.proxy")

CACHE = "onehit"
VIA = "1.1 onehit"
# Client fields that are replaced, never trusted (a client cannot pose as another hop).
_REPLACED = frozenset({"host", "via", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"})
_CONDITIONAL = frozenset({"if-none-match", "if-modified-since", "if-match", "if-unmodified-since"})
# Fields of a stored response the proxy writes itself when it answers from cache.
_RECOMPUTED = frozenset({"content-length", "age", "content-range"})
_NOT_MODIFIED_DROPS = frozenset({"content-length", "content-type", "content-encoding", "age"})
_BODY_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)


@dataclass(frozen=True, slots=True)
class Fetched:
    """A whole origin response, shareable with collapsed requests."""

    meta: ResponseMeta
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    request_headers: tuple[tuple[str, str], ...]


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
        self.flights: SingleFlight[Fetched] = SingleFlight(config.upstream.single_flight_wait)
        self.max_object = engine.store.max_object_bytes
        self.allow_set_cookie = config.cache.store_set_cookie
        self.max_url = config.server.max_url_length
        self.max_headers = config.server.max_header_size
        self.forwarded = frozenset(config.server.forward_headers)
        self._background: set[asyncio.Task[None]] = set()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request; a bug in here costs that request a 500, never the listener."""
        try:
            return await self._handle(request)
        except Exception:
            version = request.version
            log.exception(
                "unexpected error on %s %s HTTP/%d.%d from %s",
                request.method, request.raw_path, version.major, version.minor, request.remote,
            )  # fmt: skip
            return _plain(500, "internal error", f"{CACHE}; fwd=request; detail=error")

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if len(request.raw_path) > self.max_url:
            return _plain(414, f"request target longer than {self.max_url} bytes")
        if sum(len(k) + len(v) + 4 for k, v in request.raw_headers) > self.max_headers:
            return _plain(431, f"request header fields larger than {self.max_headers} bytes")
        if request.method == "CONNECT":
            return _plain(405, "CONNECT is refused: this is a reverse proxy, not an open proxy")
        route_host, key_host = _hosts(request.host)
        absolute = not request.raw_path.startswith("/")
        origin = self.routes.get(route_host)
        if origin is None and not absolute:
            origin = self.routes.get("")
        if origin is None:
            return _plain(421, f"no route for host {route_host!r}")
        path = request.rel_url.raw_path_qs if absolute else request.raw_path
        meta = RequestMeta(
            f"http://{key_host}{path}", request.method, tuple(request.headers.items())
        )
        now = self.clock()
        decision = self.engine.lookup(meta, now)
        if isinstance(decision, Hit):
            return self._from_cache(request, decision.entry, decision.age, "hit", "HIT")
        if isinstance(decision, Bypass):
            return await self._pass_through(request, meta, origin + path)
        if isinstance(decision, Stale):
            return await self._stale(request, meta, origin + path, decision)
        if rfc9111.only_if_cached(meta.headers):
            return _plain(504, "only-if-cached: not in cache", "onehit; fwd=uri-miss")
        return await self._miss(request, meta, origin + path)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # Misses

    async def _miss(
        self, request: web.BaseRequest, meta: RequestMeta, url: str
    ) -> web.StreamResponse:
        headers = meta.headers
        collapsible = meta.method == "GET" and not any(
            k.lower() in _CONDITIONAL or k.lower() == "range" for k, _ in headers
        )
        if not collapsible:
            return (await self._fetch(request, meta, url, "uri-miss"))[0]
        flight = self.flights.lead(meta.key)
        if flight is None:
            shared = await self.flights.follow(meta.key)
            if shared is not None and _same_variant(shared, headers):
                return await self._collapsed(request, meta, shared)
            return (await self._fetch(request, meta, url, "uri-miss"))[0]
        fetched: Fetched | None = None
        try:
            response, fetched = await self._fetch(request, meta, url, "uri-miss")
            return response
        finally:
            self.flights.end(meta.key, flight, fetched)

    async def _collapsed(
        self, request: web.BaseRequest, meta: RequestMeta, shared: Fetched
    ) -> web.Response:
        outcome = await self._offer(meta, shared.meta, len(shared.body), fetched=False)
        status = f"{CACHE}; fwd=uri-miss; collapsed" + _stored_detail(outcome)
        return self._answer(request, shared.status, shared.headers, shared.body, status, "MISS")

    async def _offer(
        self, meta: RequestMeta, response: ResponseMeta, size: int, *, fetched: bool = True
    ) -> Store | NotStored:
        """``engine.on_response``, asking the fleet's filter first when there is one: the one
        place the miss path awaits the admission backend."""
        admitted = None
        if self.shared is not None and self.engine.admission_pending(meta, response, size):
            admitted = await self.shared.admit(meta.key, size, self.clock())
        return self.engine.on_response(
            meta, response, size, self.clock(), fetched=fetched, admitted=admitted
        )

    async def _fetch(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        fwd: str,
    ) -> tuple[web.StreamResponse, Fetched | None]:
        """Fetch ``url`` for a request that did not hit; the whole response too when it was
        read whole (so collapsed requests can share it)."""
        request_time = self.clock()
        try:
            upstream = await self.upstream.request(
                meta.method, url, self._upstream_headers(request)
            )
        except UpstreamError as exc:
            log.warning("%s %s: %s", meta.method, url, exc.detail)
            error = _plain(exc.status, exc.detail, f"{CACHE}; fwd={fwd}; detail=origin-error")
            return error, None
        async with upstream:
            return await self._relay(request, meta, upstream, request_time, fwd)

    async def _relay(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        upstream: aiohttp.ClientResponse,
        request_time: float,
        fwd: str,
    ) -> tuple[web.StreamResponse, Fetched | None]:
        headers = rfc9111.end_to_end(list(upstream.headers.items()))
        rmeta = response_meta(
            meta,
            upstream.status,
            headers,
            request_time,
            self.clock(),
            allow_set_cookie=self.allow_set_cookie,
        )
        length = upstream.content_length
        body = b""
        if rmeta.cacheable and (length is None or length <= self.max_object):
            try:
                body = await _read_up_to(upstream, self.max_object)
            except _BODY_ERRORS as exc:
                log.warning("%s %s: origin body failed: %r", meta.method, meta.key, exc)
                status = f"{CACHE}; fwd={fwd}; detail=origin-error"
                if isinstance(exc, TimeoutError):
                    return _plain(504, "origin timed out mid-body", status), None
                return _plain(502, "origin response cut short", status), None
            if upstream.content.at_eof():
                stored = replace(rmeta, payload=(upstream.status, body))
                outcome = await self._offer(meta, stored, len(body))
                status = f"{CACHE}; fwd={fwd}" + _stored_detail(outcome)
                response = self._answer(request, upstream.status, headers, body, status, "MISS")
                fetched = Fetched(stored, upstream.status, tuple(headers), body, meta.headers)
                return response, fetched
        reason = "too-large" if rmeta.cacheable else rmeta.reason
        cache_status = f"{CACHE}; fwd={fwd}; detail={reason or 'uncacheable'}"
        out, total = await _stream(request, upstream, headers, cache_status, "MISS", body)
        if total is not None:
            self.engine.on_response(meta, rmeta, total, self.clock())
        return out, None

    # Stale entries

    async def _stale(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, stale: Stale
    ) -> web.StreamResponse:
        entry = stale.entry
        if meta.method == "HEAD":
            return (await self._fetch(request, meta, url, "stale"))[0]
        if stale.serve_stale:
            self.engine.served_stale(entry)
            self._revalidate_in_background(request, meta, url, entry)
            status = f"{CACHE}; hit; ttl={int(entry.lifetime - stale.age)}"
            return self._from_cache(request, entry, stale.age, status, "STALE")
        request_time = self.clock()
        conditions = tuple(rfc9111.conditional_headers(entry.headers))
        try:
            upstream = await self.upstream.request(
                "GET", url, self._upstream_headers(request, conditions)
            )
        except UpstreamError as exc:
            return self._origin_failed(request, meta, stale, exc.status, exc.detail)
        async with upstream:
            if upstream.status == 304:
                headers = rfc9111.end_to_end(list(upstream.headers.items()))
                self.engine.on_not_modified(entry, headers, request_time, self.clock())
                status = f"{CACHE}; fwd=stale; fwd-status=304"
                return self._from_cache(
                    request, entry, entry.age(self.clock()), status, "REVALIDATED"
                )
            if upstream.status >= 500 and self.engine.may_serve_on_error(stale, meta):
                return self._origin_failed(request, meta, stale, upstream.status, "origin error")
            return (await self._relay(request, meta, upstream, request_time, "stale"))[0]

    def _origin_failed(
        self, request: web.BaseRequest, meta: RequestMeta, stale: Stale, code: int, detail: str
    ) -> web.StreamResponse:
        if self.engine.may_serve_on_error(stale, meta):
            self.engine.served_stale(stale.entry)
            status = f"{CACHE}; hit; detail=stale-if-error"
            return self._from_cache(request, stale.entry, stale.age, status, "STALE")
        return _plain(code, detail, f"{CACHE}; fwd=stale; detail=origin-error")

    def _revalidate_in_background(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, entry: Entry
    ) -> None:
        flight = self.flights.lead(("refresh", meta.key))
        if flight is None:
            return
        headers = self._upstream_headers(request, tuple(rfc9111.conditional_headers(entry.headers)))

        async def refresh() -> None:
            try:
                request_time = self.clock()
                async with await self.upstream.request("GET", url, headers) as upstream:
                    if upstream.status == 304:
                        fresh = rfc9111.end_to_end(list(upstream.headers.items()))
                        self.engine.on_not_modified(
                            entry, fresh, request_time, self.clock(), served=False
                        )
                        return
                    hdrs = rfc9111.end_to_end(list(upstream.headers.items()))
                    rmeta = response_meta(
                        meta, upstream.status, hdrs, request_time, self.clock(),
                        allow_set_cookie=self.allow_set_cookie,
                    )  # fmt: skip
                    body = await _read_up_to(upstream, self.max_object)
                    if rmeta.cacheable and upstream.content.at_eof():
                        stored = replace(rmeta, payload=(upstream.status, body))
                        self.engine.on_response(meta, stored, len(body), self.clock(), served=False)
            except (UpstreamError, *_BODY_ERRORS) as exc:
                log.warning("background refresh of %s failed: %r", meta.key, exc)
            finally:
                self.flights.end(("refresh", meta.key), flight, None)

        task = asyncio.get_running_loop().create_task(refresh())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # Other methods

    async def _pass_through(
        self, request: web.BaseRequest, meta: RequestMeta, url: str
    ) -> web.StreamResponse:
        body = request.content if request.body_exists else None
        try:
            upstream = await self.upstream.request(
                meta.method, url, self._upstream_headers(request), body
            )
        except UpstreamError as exc:
            return _plain(exc.status, exc.detail, f"{CACHE}; fwd=method; detail=origin-error")
        async with upstream:
            self.engine.on_unsafe_response(meta, upstream.status)
            headers = rfc9111.end_to_end(list(upstream.headers.items()))
            out, _ = await _stream(request, upstream, headers, f"{CACHE}; fwd=method", "BYPASS")
            return out

    # Building answers

    def _upstream_headers(
        self, request: web.BaseRequest, extra: tuple[tuple[str, str], ...] = ()
    ) -> list[tuple[str, str]]:
        replaced = _REPLACED | {k.lower() for k, _ in extra}
        if extra:
            replaced |= _CONDITIONAL
        headers = [
            (k, v)
            for k, v in rfc9111.end_to_end(list(request.headers.items()))
            if k.lower() not in replaced
        ]
        if request.method in ("GET", "HEAD"):
            # Only fields the operator lets through reach the origin: what is not keyed must
            # not be able to change a stored answer (cache poisoning).
            headers = [(k, v) for k, v in headers if k.lower() in self.forwarded]
        headers.extend(extra)
        peer = request.remote or ""
        headers += [
            ("Via", VIA),
            ("X-Forwarded-For", peer),
            ("X-Forwarded-Proto", request.scheme),
            ("X-Forwarded-Host", request.host),
        ]
        return headers

    def _from_cache(
        self, request: web.BaseRequest, entry: Entry, age: float, cache_status: str, x_cache: str
    ) -> web.Response:
        status, body = entry.payload
        if cache_status == "hit":
            cache_status = f"{CACHE}; hit; ttl={int(entry.lifetime - age)}"
        response = self._answer(request, status, entry.headers, body, cache_status, x_cache)
        response.headers["Age"] = str(int(age))
        return response

    def _answer(
        self,
        request: web.BaseRequest,
        status: int,
        headers: tuple[tuple[str, str], ...] | list[tuple[str, str]],
        body: bytes,
        cache_status: str,
        x_cache: str,
    ) -> web.Response:
        """A whole response from stored or fetched parts, answering the client's conditionals
        (304) and single byte range (206/416)."""
        kept = [(k, v) for k, v in headers if k.lower() not in _RECOMPUTED]
        asked = request.headers
        conditional = "If-None-Match" in asked or "If-Modified-Since" in asked
        ranged = "Range" in asked and request.method == "GET"
        request_headers = list(asked.items()) if conditional or ranged else []
        if status == 200 and conditional and rfc9111.not_modified(request_headers, headers):
            status, body = 304, b""
            kept = [(k, v) for k, v in kept if k.lower() not in _NOT_MODIFIED_DROPS]
        elif status == 200 and ranged:
            wanted = rfc9111.byte_range(request_headers, headers, len(body))
            if wanted is False:
                kept.append(("Content-Range", f"bytes */{len(body)}"))
                status, body = 416, b""
            elif wanted is not None:
                first, last = wanted
                kept.append(("Content-Range", f"bytes {first}-{last}/{len(body)}"))
                status, body = 206, body[first : last + 1]
        response = web.Response(status=status, body=body)
        _copy_headers(response.headers, kept)
        response.headers["Cache-Status"] = cache_status
        response.headers["X-Cache"] = x_cache
        response.headers["Via"] = VIA
        if status != 304:
            response.headers["Accept-Ranges"] = "bytes"
        return response


def _stored_detail(outcome: Store | NotStored) -> str:
    if isinstance(outcome, Store):
        return "; stored"
    return f"; detail={outcome.reason}"


def _same_variant(shared: Fetched, headers: tuple[tuple[str, str], ...]) -> bool:
    names = shared.meta.vary
    return not names or rfc9111.vary_key(names, headers) == rfc9111.vary_key(
        names, shared.request_headers
    )


async def _stream(
    request: web.BaseRequest,
    upstream: aiohttp.ClientResponse,
    headers: list[tuple[str, str]],
    cache_status: str,
    x_cache: str,
    head: bytes = b"",
) -> tuple[web.StreamResponse, int | None]:
    """Send ``upstream`` to the client as it arrives (after ``head``, bytes already read); the
    body's size, or None when the origin cut it short and the client was cut off too."""
    out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    _copy_headers(out.headers, headers)
    out.headers["Cache-Status"] = cache_status
    out.headers["X-Cache"] = x_cache
    out.headers["Via"] = VIA
    await out.prepare(request)
    total = len(head)
    try:
        if head:
            await out.write(head)
        async for chunk in upstream.content.iter_chunked(1 << 16):
            total += len(chunk)
            await out.write(chunk)
    except _BODY_ERRORS as exc:
        # Headers are gone: the only honest signal left is to cut the client off.
        log.warning("%s %s: body failed mid-stream: %r", request.method, request.path, exc)
        _abort(request)
        return out, None
    await out.write_eof()
    return out, total


async def _read_up_to(upstream: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or its first bytes past ``limit`` (then the stream is not at EOF)."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await upstream.content.readany()
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def cache_key(url: str) -> str:
    """The cache key of an absolute ``http://host[:port]/path?query`` URL, as the proxy forms it."""
    _, _, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"http://{_hosts(host)[1]}{slash}{path}"


def _hosts(host: str) -> tuple[str, str]:
    """(route host, key host) of a Host value: lower-cased; the key keeps a non-default port."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host.partition("]")
        name += "]"
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = host.partition(":")
    key = name if port in ("", "80") else f"{name}:{port}"
    return name.strip("[]"), key


def _copy_headers(target: CIMultiDict[str], headers: list[tuple[str, str]] | tuple) -> None:
    for k, v in headers:
        target.add(k, v)


def _plain(status: int, text: str, cache_status: str | None = None) -> web.Response:
    response = web.Response(status=status, text=text + "\n")
    response.headers["Cache-Status"] = cache_status or f"{CACHE}; fwd=request"
    response.headers["X-Cache"] = "ERROR" if status >= 500 else "REFUSED"
    response.headers["Via"] = VIA
    return response


def _abort(request: web.BaseRequest) -> None:
    if request.transport is not None:
        request.transport.close()
