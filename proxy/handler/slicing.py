"""GET misses answered from slices (``[cache] slice_size``): a large object fetched and stored
as byte ranges of one size, each admitted on its own, so a Range of part of it fetches and
stores only the slices that part spans (``proxy.core.slices`` holds the rules of a slice).

How a GET miss goes when slicing is on:

* The slice the request's Range starts in (else slice 0) comes first: from the store when a
  fresh one is there, else from the origin with ``Range: bytes=first-last``. Its
  ``Content-Range`` tells the object's length; its validator, the version every other slice
  must match.
* The origin's answer to that first request decides how the rest goes:
  - a 206 of the slice asked: the object is answered from slices;
  - a 206 of the whole object (it is no larger than a slice): it is judged and stored as the
    whole 200 it is, under its URL, and its hits are plain hits;
  - a 416 to the request for slice 0 (an empty object), or a 206 of another range: the
    object is fetched whole, as without slices;
  - anything else (a 200: the origin ignores Range; an error; a 416 to a client's Range past
    the end): relayed, and judged, as the answer to a whole fetch is.
* The client's conditionals and Range are answered from the first slice's fields and the
  object's length (``CacheEngine.answer``): 304, 416, the 206 of its range, or the whole 200,
  its body stitched in order from the slices it spans. Each is the stored one when fresh and
  of the same version, else fetched, read whole (a slice goes to the client only once it is
  known to be of the object's version), and admitted and stored on its own. Concurrent
  misses share each slice's fetch (single flight, keyed by the slice), each a sighting of it.
* A fetched slice of another version, length or range means the object changed under the
  answer: its stored slices are removed (the next request fetches them anew). Either that or
  an origin that fails on a slice (a 5xx, a timeout, a body cut short) cuts the client's
  connection, the honest signal once a length was promised.
* An object whose slices may not be stored (``no-store``, no strong entity tag: a weak one, or
  a Last-Modified, which deploys that keep files' times share between versions) goes
  straight to the origin for ``[cache] hit_for_miss`` seconds after, unsliced, as an
  uncacheable URL does; an answer to it that spans more than one slice is fetched whole,
  never stitched from slices that might be of two versions.
* A HEAD miss is answered from any fresh slice of its object in memory, or its first slice on
  the disk tier (its fields and length), else goes to the origin as without slices.
* Slices read from the origin or the disk take room (``SliceRoom``: twice their size, their
  body and what their client has not yet taken of it) until written, all requests together
  within ``[cache] slice_memory``, one client (its address) within an eighth of it: a client
  that stops reading holds one slice's room until ``[server] send_timeout`` closes it, and
  the others wait for room (as long as a collapsed miss waits), then fail (503 before the
  head, a cut connection after), rather than grow the process; one client's idle
  connections cannot take the room every other client needs. Slices answered from memory
  take none.
* With a disk tier, slices are written to it too (its own admission, slice by slice) and
  read back on a memory miss; a purge of the URL, or a change of version, reaches them there
  (``proxy.disk.anchors``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from itertools import islice
from typing import Literal

from aiohttp import web

from proxy.core import slices
from proxy.core.cache_status import ORIGIN_ERROR, SLICE_MEMORY, SLICES, forwarded, hit
from proxy.core.events import (
    FWD_PARTIAL,
    FWD_URI_MISS,
    Fetch,
    Hit,
    Keep,
    Outcome,
    RequestMeta,
    ResponseMeta,
)
from proxy.core.tiers import CHANGED
from proxy.disk.store import DiskStore
from proxy.handler.answers import abort, delivered, on_origin, plain
from proxy.handler.coalesce import Flight
from proxy.handler.fetch import GO_DIRECT, Fetcher, Shared, same_variant
from proxy.handler.streaming import send
from proxy.origin.body import BODY_ERRORS, body_of, fields_of, in_hand
from proxy.origin.upstream import UpstreamError, UpstreamResponse
from proxy.wire.seam import Relayed

log = logging.getLogger("onehit.proxy")

# Slices an answer's Cache-Status looks at, at most, to tell a partial hit from a miss.
LOOK_AHEAD = 64


@dataclass(frozen=True, slots=True)
class Piece:
    """One slice of an object in hand: its fields without ``Content-Range`` (``fields``),
    its bytes ``first``..``last`` of ``length``, its version and its age, and whether the
    disk tier gave it (an answer with such a slice is a hit from disk)."""

    fields: tuple[tuple[str, str], ...]
    body: bytes
    first: int
    last: int
    length: int
    version: str | None
    age: float
    from_disk: bool = False


def piece(
    headers: tuple[tuple[str, str], ...],
    body: bytes,
    n: int,
    size: int,
    like: Piece | None,
    age: float,
) -> Piece | None:
    """Slice ``n`` (of ``size``-byte slices) from a 206's ``headers`` and ``body``; None when
    it is not exactly that slice, whole, of the object ``like`` is of (when given)."""
    span = slices.content_range(headers)
    if span is None:
        return None
    first, last, length = span
    version = slices.validator(headers)
    if (first, last) != slices.bounds(n, size, length) or len(body) != last - first + 1:
        return None
    if like is not None and (length != like.length or version != like.version):
        return None
    fields = tuple((k, v) for k, v in headers if k.lower() != "content-range")
    return Piece(fields, body, first, last, length, version, age)


# The shares of ``[cache] slice_memory`` one client may hold at most.
CLIENT_SHARES = 8


class SliceRoom:
    """Bytes of slices held in flight (read from the origin or the disk, not yet taken by
    their clients), across every request: at most ``limit``, but for one slice alone; and for
    each client (its address) at most its share, ``limit // CLIENT_SHARES`` (one slice's at
    least). A client that stops reading holds its room until ``[server] send_timeout`` closes
    it: one client's idle connections hold no more than its share, and what waits for room
    waits, then fails, rather than grow the process."""

    def __init__(self, limit: int, slice_room: int = 0) -> None:
        self.limit = limit
        self.share = max(limit // CLIENT_SHARES, slice_room)
        self.held = 0
        self.peak = 0
        self.by_client: dict[str, int] = {}
        self._freed = asyncio.Event()

    async def take(self, size: int, wait: float, client: str = "") -> bool:
        """Hold ``size`` bytes for ``client``, waiting up to ``wait`` seconds for room, in
        all and within its share; whether it got it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while self._full(size, client):
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), deadline - loop.time())
            except TimeoutError:
                return False
        self.held += size
        self.by_client[client] = self.by_client.get(client, 0) + size
        self.peak = max(self.peak, self.held)
        return True

    def _full(self, size: int, client: str) -> bool:
        mine = self.by_client.get(client, 0)
        return bool(mine and mine + size > self.share) or bool(
            self.held and self.held + size > self.limit
        )

    def give(self, size: int, client: str = "") -> None:
        self.held -= size
        left = self.by_client[client] - size
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]
        self._freed.set()


class Slicer:
    """The answerer of GET misses from slices of ``size`` bytes, through ``fetcher``'s
    engine, origin and router."""

    def __init__(
        self, size: int, fetcher: Fetcher, memory: int, disk: DiskStore | None = None
    ) -> None:
        self.size = size
        # Each slice in flight takes its body and what its client has not yet taken of it.
        self.room = SliceRoom(memory, 2 * size)
        self.fetcher = fetcher
        self.engine = fetcher.engine
        self.router = fetcher.router
        self.clock = fetcher.clock
        self.flights = fetcher.flights
        self.disk = disk

    async def answer(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, action: Fetch
    ) -> web.StreamResponse:
        """Answer the GET miss ``meta`` (the engine's ``action``) from slices (see the
        module's rules)."""
        n = slices.first_wanted(meta.headers, self.size)
        first = self._in_memory(meta, n, None)
        if first is not None:
            return await self._stitch(request, meta, url, n, first, 0)
        room, client = 2 * self.size, request.remote or ""
        if not await self.room.take(room, self.flights.wait_limit, client):
            return plain(503, "too many slices in flight: try again",
                         forwarded(FWD_URI_MISS, detail=SLICE_MEMORY))  # fmt: skip
        try:
            return await self._answer_held(request, meta, url, action, n)
        finally:
            self.room.give(room, client)

    async def _answer_held(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, action: Fetch, n: int
    ) -> web.StreamResponse:
        """``answer``, once room for its first slice, not in memory, is held."""
        first = await self._on_disk(meta, n, None)
        if first is not None:
            return await self._stitch(request, meta, url, n, first, 0)
        key = slices.slice_key(meta.key, n)
        flight, shared = await self._join(meta, key)
        if flight is None:
            first = None if shared is None else self._shared(shared, n, None)
            if first is not None:
                assert shared is not None
                whole = await self._settle(meta, n, first, shared.meta, led=False)
                if whole is not None:
                    return self._whole(meta, first, whole)
                return await self._stitch(request, meta, url, n, first, 1)
        result = None
        try:
            try:
                upstream, request_time = await self._request(request, meta, url, n)
            except UpstreamError as exc:
                status = forwarded(FWD_URI_MISS, detail=ORIGIN_ERROR)
                return plain(exc.status, exc.public, status)
            got = None
            async with upstream:
                if upstream.status != 206 and (upstream.status != 416 or n):
                    fetcher = self.fetcher
                    return (await fetcher.receive(request, meta, url, upstream, request_time,
                                                  action, None))[0]  # fmt: skip
                if upstream.status == 206:
                    got = await self._read(meta, n, upstream, request_time)
            if got is not None:
                headers, body, rmeta = got
                first = piece(headers, body, n, self.size, None, rmeta.initial_age)
            if first is None:
                again = replace(action, collapse=False)
                return (await self.fetcher.fetch(request, meta, url, again))[0]
            whole = await self._settle(meta, n, first, rmeta, led=True)
            result = self._sharable(rmeta, body, meta)
        finally:
            if flight is not None:
                self.flights.end(key, flight, result)
        if whole is not None:
            return self._whole(meta, first, whole)
        return await self._stitch(request, meta, url, n, first, 1)

    async def head(
        self, request: web.BaseRequest, meta: RequestMeta, url: str
    ) -> web.StreamResponse | None:
        """The answer to a HEAD miss from a slice of its object in memory, or the first one
        on the disk tier (the fields and the length are all a HEAD needs); None when none is
        stored fresh."""
        numbers = self.engine.slices.numbers(meta.key)
        for n in sorted(numbers) if numbers else (0,):
            first = await self._stored(meta, n, None)
            if first is not None:
                return await self._stitch(request, meta, url, n, first, 0)
        return None

    async def _stitch(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        n: int,
        first: Piece,
        fetched: int,
    ) -> web.StreamResponse:
        """The answer from ``first`` (slice ``n``) and the other slices it spans; with no
        strong validator to tell its version by, an answer of more than one slice is fetched
        whole instead (slices of two versions would be stitched unseen)."""
        engine = self.engine
        length = first.length
        answer = engine.answer(meta, 200, first.fields, length)
        status = answer.status
        low, high = (answer.first, answer.last) if status == 206 else (0, length - 1)
        bodied = status in (200, 206) and length and meta.method == "GET"
        wanted = slices.covering(low, high, self.size) if bodied else range(0)
        if first.version is None and len(wanted) > 1:
            unsliced = Fetch(FWD_URI_MISS, whole=True, collapse=False)
            return (await self.fetcher.fetch(request, meta, url, unsliced))[0]
        # Both looks stop early: an object may span millions of slices, and nothing may hold
        # up the loop for each of them before the head goes out.
        others = (i for i in wanted if i != n)
        if not fetched and all(self._fresh(meta, i) for i in others):
            cache_status, x_cache = hit(detail=SLICES), "HIT"
        else:
            some = not fetched or any(self._fresh(meta, i) for i in islice(wanted, LOOK_AHEAD))
            fwd = FWD_PARTIAL if some else FWD_URI_MISS
            cache_status, x_cache = forwarded(fwd, detail=SLICES), "MISS"
        _, fields = delivered(200, first.fields, answer, length, cache_status, x_cache,
                              first.age, self.router.hidden)  # fmt: skip
        out = Relayed(status=status, headers=fields)
        await out.prepare(request)
        from_disk = first.from_disk
        client = request.remote or ""
        for i in wanted:
            held = 0
            try:
                part = first if i == n else self._in_memory(meta, i, first)
                if part is None:
                    # Held once taken: a wait for room cut short (the request cancelled) gives
                    # back nothing.
                    if await self.room.take(2 * self.size, self.flights.wait_limit, client):
                        held = 2 * self.size
                        part = await self._on_disk(meta, i, first)
                        if part is None:
                            part = await self._fetched(request, meta, url, i, first)
                            fetched += 1
                    else:
                        part = "failed"
                if not isinstance(part, Piece):
                    if part == "changed":
                        self.engine.removals.remove_slices(meta.key)
                    engine.sliced(fetched, mismatched=part == "changed")
                    abort(request)
                    return out
                from_disk |= part.from_disk
                body = memoryview(part.body)[max(low, part.first) - part.first :
                                             min(high, part.last) - part.first + 1]  # fmt: skip
                if not await send(out, body):
                    break  # the client left: nothing more to fetch for it
            finally:
                if held:
                    self.room.give(held, client)
        else:
            await send(out, b"", eof=True)
        engine.sliced(fetched, mismatched=False, from_disk=from_disk)
        return out

    def _slice_meta(self, meta: RequestMeta, n: int) -> RequestMeta:
        return meta._replace(key=slices.slice_key(meta.key, n))

    def _fresh(self, meta: RequestMeta, n: int) -> bool:
        """Whether a fresh slice ``n`` is in memory, or a slice ``n`` on disk (peeked:
        nothing counted, moved or read)."""
        smeta = self._slice_meta(meta, n)
        if self.engine.fresh(smeta, self.clock()) is not None:
            return True
        return self.disk is not None and self.disk.anchors.anchored(meta.key, smeta.key)

    async def _stored(self, meta: RequestMeta, n: int, like: Piece | None) -> Piece | None:
        """Slice ``n`` from memory, else from the disk tier, when a fresh one of ``like``'s
        object is there (one of another version is removed)."""
        found = self._in_memory(meta, n, like)
        return found if found is not None else await self._on_disk(meta, n, like)

    def _in_memory(self, meta: RequestMeta, n: int, like: Piece | None) -> Piece | None:
        """``_stored`` from memory alone: nothing read or copied."""
        smeta = self._slice_meta(meta, n)
        return self._piece(smeta, n, like, self.engine.slice_hit(smeta, self.clock()))

    async def _on_disk(self, meta: RequestMeta, n: int, like: Piece | None) -> Piece | None:
        """``_stored`` from the disk tier alone (read whole: it takes room)."""
        engine, disk = self.engine, self.disk
        smeta = self._slice_meta(meta, n)
        if disk is None or not disk.anchors.anchored(meta.key, smeta.key):
            return None
        behind = await disk.reads.lookup_off_loop(smeta.key, engine.entry_type)
        found = self._piece(smeta, n, like, engine.slice_hit(smeta, self.clock(), behind, disk))
        return None if found is None else replace(found, from_disk=True)

    def _piece(
        self, smeta: RequestMeta, n: int, like: Piece | None, hit: Hit | None
    ) -> Piece | None:
        """The slice a hit on ``smeta`` holds, when of ``like``'s object; one that is not is
        removed from every tier."""
        if hit is None:
            return None
        entry = hit.entry
        found = piece(entry.headers, entry.payload, n, self.size, like, hit.age)
        if found is None:
            self.engine.removals.forget(smeta.key, CHANGED)
        return found

    async def _request(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, n: int
    ) -> tuple[UpstreamResponse, float]:
        """Ask the origin for slice ``n`` for ``request``; the response and when it was
        asked."""
        first = n * self.size
        asked = (("Range", f"bytes={first}-{first + self.size - 1}"),)
        headers = self.router.upstream_headers(meta, whole=True, extra=asked)
        request_time = self.clock()
        with on_origin(request):
            upstream = await self.fetcher.upstream.request("GET", url, headers)
        return upstream, request_time

    async def _read(
        self, meta: RequestMeta, n: int, upstream: UpstreamResponse, request_time: float
    ) -> tuple[tuple[tuple[str, str], ...], bytes, ResponseMeta] | None:
        """The fields and body of the origin's 206 ``upstream`` to the request for slice
        ``n``, read whole, and the engine's view of it as a 200; None when its body failed,
        or ran past a slice's size (not the range asked)."""
        headers = tuple(fields_of(upstream))
        parts = []
        total = 0
        try:
            async for chunk in body_of(in_hand(upstream), upstream.content):
                parts.append(chunk)
                total += len(chunk)
                if total > self.size:
                    log.warning("GET %s: slice %d ran past %d bytes", meta.key, n, self.size)
                    return None
        except BODY_ERRORS as exc:
            log.warning("GET %s: slice %d failed: %r", meta.key, n, exc)
            return None
        rmeta = self.fetcher.response_meta(meta, 200, headers, request_time)
        return headers, b"".join(parts), rmeta

    async def _fetched(
        self, request: web.BaseRequest, meta: RequestMeta, url: str, n: int, like: Piece
    ) -> Piece | Literal["failed", "changed"]:
        """Slice ``n`` of ``like``'s object from the origin (or as a concurrent request's
        fetch of it brings it), kept when admitted; "failed" when the origin failed,
        "changed" when it answered with anything but that slice of that object."""
        key = slices.slice_key(meta.key, n)
        flight, shared = await self._join(meta, key)
        if flight is None and shared is not None:
            part = self._shared(shared, n, like)
            if part is None:
                return "changed"
            await self._settle(meta, n, part, shared.meta, led=False)
            return part
        result = None
        try:
            try:
                upstream, request_time = await self._request(request, meta, url, n)
            except UpstreamError:
                return "failed"
            async with upstream:
                if upstream.status != 206:
                    log.warning("GET %s: slice %d answered %d", meta.key, n, upstream.status)
                    return "failed" if upstream.status >= 500 else "changed"
                got = await self._read(meta, n, upstream, request_time)
            if got is None:
                return "failed"
            headers, body, rmeta = got
            part = piece(headers, body, n, self.size, like, rmeta.initial_age)
            if part is None:
                log.warning("GET %s: slice %d is of another version or length", meta.key, n)
                return "changed"
            await self._settle(meta, n, part, rmeta, led=True)
            result = self._sharable(rmeta, body, meta)
            return part
        finally:
            if flight is not None:
                self.flights.end(key, flight, result)

    async def _join(
        self, meta: RequestMeta, key: str
    ) -> tuple[Flight[Shared] | None, Shared | None]:
        """The turn of slice ``key`` (``SingleFlight.join``): a flight this request leads, or
        what another request's fetch brought when it is the variant ``meta`` selects; (None,
        None) when the wait passed, or it is another variant or may not be shared (then this
        request fetches it alone)."""
        flight, shared = await self.flights.join(key)
        if shared is None or shared is GO_DIRECT or not same_variant(shared, meta):
            return flight, None
        return None, shared

    def _sharable(self, rmeta: ResponseMeta, body: bytes, meta: RequestMeta) -> Shared:
        """What the requests following a slice's fetch get of it: the slice, unless the
        response may not be shared (``private``, an ``Authorization`` not made public, any
        response the rules forbid storing): then they go to the origin themselves, as
        followers of a whole fetch do."""
        return Shared(rmeta, body, meta.headers) if rmeta.cacheable else GO_DIRECT

    def _shared(self, shared: Shared, n: int, like: Piece | None) -> Piece | None:
        """Slice ``n`` as another request fetched it, when of ``like``'s object."""
        rmeta = shared.meta
        return piece(rmeta.headers, shared.body, n, self.size, like, rmeta.initial_age)

    async def _settle(
        self, meta: RequestMeta, n: int, part: Piece, rmeta: ResponseMeta, *, led: bool
    ) -> str | None:
        """Judge ``part``, slice ``n`` (``rmeta``: the engine's view of it as a 200), as a
        response of its own, fetched by this request (``led``) or by another (a sighting of
        it): stored when the rules and the admission policy let it. A slice that holds the
        whole object is judged as the 200 it is, under its URL, and its Cache-Status detail
        returned (None for any other slice)."""
        whole = part.first == 0 and part.last == part.length - 1
        if whole:
            target = meta
            stored = tuple((k, v) for k, v in rmeta.headers if k.lower() != "content-range")
            rmeta = rmeta._replace(headers=stored)
        else:
            target = self._slice_meta(meta, n)
            if part.version is None:
                rmeta = rmeta._replace(cacheable=False, reason="slice-unvalidated")
            elif rmeta.vary:
                rmeta = rmeta._replace(cacheable=False, reason="slice-varies")
            rmeta = rmeta._replace(status=206)
        fetcher = self.fetcher
        size = len(part.body)
        if led:
            decided = await fetcher.decide(target, rmeta, size)
            fetcher.settle_in_hand(target, decided, part.body)
            outcome: Outcome | Keep = decided.memory
            if not whole and not rmeta.cacheable:
                # No slice of it will be stored: its next requests need not be sliced.
                self.engine.part_refused(meta, rmeta, self.clock())
        else:
            outcome = await fetcher.shared_sighting(target, rmeta, size, part.body)
        if not whole:
            return None
        return forwarded(FWD_URI_MISS, outcome=outcome, collapsed=not led)

    def _whole(self, meta: RequestMeta, whole: Piece, status: str) -> web.Response:
        """The answer from a slice that holds the whole object (``status``: its
        Cache-Status)."""
        return self.fetcher.cached(meta, 200, whole.fields, whole.body, status, "MISS", whole.age)
