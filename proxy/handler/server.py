"""The request handler: each request routed, the engine's plan for it made and carried out by
the part that holds that concern.

The parts, each in its own module, and the way a request goes through them:

* ``routing``: the origin a request goes to, the limits it must keep, the fields the origin
  gets, and the cache key.
* ``hits``: plain fresh hits answered as soon as they are parsed, before this handler (see
  ``proxy.front.fastpath``), compiled in their commonest case.
* ``fetch``: misses fetched, collapsed onto one fetch, relayed as they arrive, stored when they
  end whole; ``slicing``: GET misses fetched and stored as slices of one size, when
  ``[cache] slice_size`` is set; ``pending``: a plain GET miss answered in the callback that
  brings its origin response, outside any task.
* ``revalidation``: stored responses the origin is asked about, in the foreground and in the
  background.
* ``uploads``: requests that pass the cache by, with their bodies.
* ``answers``: what every path writes to the client.

What to do with a request is the engine's decision (``CacheEngine.plan``); this module
carries it out, and a bug in here costs the request a 500, never the listener; once the
request's answer has begun (its head handed to the connection), its connection instead: a
second status line would be read as the answer to the client's next request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from hmac import compare_digest
from typing import Any, Protocol, assert_never

from aiohttp import web

from proxy.config.logs import HTTP_ERRORS
from proxy.config.settings import Config
from proxy.core import events
from proxy.core.admission import key_sample, make_policy
from proxy.core.cache_status import CLIENT_LEFT, DISK, ERROR, forwarded, refused, ttl_of
from proxy.core.cache_status import hit as hit_status
from proxy.core.engine import CacheEngine
from proxy.core.events import (
    CLIENT_ASKS,
    FETCH_WHOLE,
    FWD_REQUEST,
    Action,
    Behind,
    Fetch,
    FromCache,
    Refuse,
    RequestMeta,
    Revalidate,
)
from proxy.core.keys import shown_key
from proxy.core.ttl_rules import TtlRules
from proxy.core.tuning import Choice, take
from proxy.core.whatif import Sample
from proxy.disk.reads import ColdRecord
from proxy.disk.store import DiskStore
from proxy.fleet.purges import FleetPurges
from proxy.fleet.shared import SharedSecondHit
from proxy.front.lane import LaneRequest
from proxy.handler.answers import close, plain
from proxy.handler.fetch import Fetcher
from proxy.handler.hits import HitAnswers, Planned
from proxy.handler.pending import PendingMiss, raising
from proxy.handler.purging import OtherWorkers, Purges
from proxy.handler.revalidation import Revalidation
from proxy.handler.routing import Router, server_groups
from proxy.handler.slicing import Slicer
from proxy.handler.uploads import Uploads
from proxy.origin.upstream import Upstream
from proxy.wire.seam import ProxyRequest
from proxy.wire.trace import (
    FIELD,
    STEPS,
    action_view,
    shown_origin,
    step,
    trace_token,
    traced_now,
    tracing,
)

log = logging.getLogger("onehit.proxy")


class SampleSink(Protocol):
    """Where a worker's what-if samples go (``proxy.ops.workers.MachineSamples``): each batch
    with the requests it was sampled from and its rate; the batches it dropped; ``sent``
    returns once those handed over are sent, or after ``within`` seconds."""

    dropped: int

    def __call__(self, sample: Sample, requests: int, rate: float) -> None: ...

    async def sent(self, within: float | None = None) -> None: ...


class Proxy:
    """The request handler: one instance per listener, sharing one engine and one upstream."""

    def __init__(
        self,
        config: Config,
        engine: CacheEngine,
        upstream: Upstream,
        clock: Callable[[], float] = time.time,
        shared: SharedSecondHit | None = None,
        disk: DiskStore | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.upstream = upstream
        self.clock = clock
        self.shared = shared
        self.disk = disk
        self.fleet: FleetPurges | None = None  # purges shared with the fleet, with Redis
        # Under --workers, the other workers, told of what this one removes from the tier.
        self.others: OtherWorkers | None = None
        # Under --workers, where the what-if's samples go: the parent's ghosts of the disk.
        self.samples: SampleSink | None = None
        self.router = Router(config)
        upstream.use_groups(server_groups(config))
        self.hits = HitAnswers(engine, self.router, clock, disk)
        # ``answer_hit`` answers plain fresh hits as parsed; ``plain_hits`` is its compiled
        # common case: the same answer, counted the same.
        self.answer_hit = self.hits.answer
        self.plain_hits = self.hits.plain_hits
        self.fetcher = Fetcher(config, engine, upstream, self.router, clock, shared)
        self.flights = self.fetcher.flights
        self.revalidation = Revalidation(self.fetcher)
        size = config.cache.slice_size
        self.slicer = Slicer(size, self.fetcher, config.cache.slice_memory, disk) if size else None
        self.uploads = Uploads(config, engine, upstream, self.router, clock)
        self.purges = Purges(config.server.purge_from)
        # Requests that failed after their answer's head went out: their connections closed.
        self.answers_cut = 0
        if disk is not None:
            engine.behind = (disk,)
        engine.admission_elsewhere = shared is not None
        # What the memory tier runs under the tuner (``[cache] eviction = "auto"``): its
        # choice as taken (a choice is taken on the loop's next turn: ``_retune``).
        whatif = engine.whatif
        self.running = None if whatif is None or whatif.tuning is None else whatif.tuning.choice
        self._follow_tuner()
        self.sample_key = 0
        self.key_sample(secrets.randbits(64))
        # What a request shows to be traced (``proxy.wire.trace``): the process's own, or
        # the machine's (``Service.start`` sets it), which its admin knows.
        self.trace_token = trace_token(secrets.token_hex(16))

    def key_sample(self, key: int) -> None:
        """Key every sample of keys the proxy takes with ``key``: the what-if's
        (``proxy.core.whatif``) and its admissions' (``key_sample``: ``adaptive`` in memory,
        ``auto`` on disk). A secret of the process's own, or the machine's, which every
        worker shares so that their samples are of the same URLs."""
        key |= 1  # never 0, which leaves a sample unkeyed
        self.sample_key = key
        engine = self.engine
        if engine.whatif is not None:
            engine.whatif.sample_key = key
        key_sample(engine.admission, key)
        if self.disk is not None:
            key_sample(self.disk.tier.admission, key)
        self.hits.follow_engine()

    def reconfigure(self, config: Config) -> None:
        """Take ``config`` for the requests from now on: what ``proxy.ops.reload.LIVE`` (and
        ``LIVE_ADMISSION``) name, the memory tier shrunk by evicting. The caller has checked
        that nothing else changed, and purges what the new rules key otherwise."""
        engine, c, old = self.engine, config.cache, self.config.cache
        if (c.size, c.max_object_size) != (old.size, old.max_object_size):
            # One process's: a worker's sizes are its machine's, and take a restart.
            engine.removals.resize(c.size, c.max_object_size)
            if self.disk is not None:
                engine.behind_largest = config.behind_largest()
        engine.hit_for_miss = c.hit_for_miss
        engine.grace = c.grace
        engine.ttl_rules = TtlRules(config.ttl)
        engine.client_revalidation = c.client_revalidation
        engine.variants.max_per_url = c.max_variants
        if self.disk is not None:
            self.disk.anchors.max_variants = c.max_variants
        engine.ignore_cookies = c.ignore_cookies
        self.router.take(config)
        if config.routes != self.config.routes:  # servers judged afresh, as nginx's reload
            self.upstream.use_groups(server_groups(config))
        self.purges = Purges(config.server.purge_from)
        plain = self.plain_hits
        plain.query_as_sent = self.router.queries_as_sent
        self.hits.routed_hosts.clear()  # hosts routed before: each is looked up again
        old = None if engine.whatif is None else engine.whatif.tuning
        kept = old if config.tuning_key() == self.config.tuning_key() else None
        if config.what_if_key() != self.config.what_if_key() or (old is not kept):
            engine.whatif = config.what_if(machine=self.machine, tuning=kept)
            if engine.whatif is not None:
                engine.whatif.start(engine.counters.hits)
            self.follow_whatif()
        new = None if engine.whatif is None else engine.whatif.tuning
        if new is not None and new is not old:  # a new tuner: the tier takes its first choice
            new.make = old.make if old is not None else None
            # Only what changed: a fleet's shared window (Redis) stays the one it shares.
            was = (
                self.running
                if config.admission_config() == self.config.admission_config()
                else None
            )
            take(engine, new.choice, config.admission_config(), new.make, was)
            self.running = new.choice
        elif config.admission_config() != self.config.admission_config():
            engine.use_admission(make_policy(config.admission_config(), engine.store))
        self.key_sample(self.sample_key)  # new ghosts or admission: keyed as the old
        self.config = config

    @property
    def machine(self) -> bool:
        """Whether this is a worker of a machine (``--workers``): its tier is shared."""
        return self.disk is not None and self.disk.sharing is not None

    def follow_whatif(self) -> None:
        """Have the what-if hand each batch it samples to ``samples`` (the machine's parent),
        with the count of requests it was sampled from: those since the batch before; and
        its tuner's choices reach the memory tier (``_follow_tuner``)."""
        self._follow_tuner()
        whatif, samples, counters = self.engine.whatif, self.samples, self.engine.counters
        if whatif is None or samples is None:
            return
        counted = 0

        def forward(sample: Sample) -> None:
            nonlocal counted
            requests = whatif.requests(counters.hits)
            samples(sample, requests - counted, whatif.rate)
            counted = requests

        whatif.forward = forward

    def _follow_tuner(self) -> None:
        """The tuner's choices reach the memory tier (``_retune``), and its chosen sample the
        compiled path, which then records what it samples."""
        whatif = self.engine.whatif
        if whatif is not None and whatif.tuning is not None:
            whatif.tuning.apply = self._retune
            whatif.resampled = lambda: asyncio.get_running_loop().call_soon(self.hits.follow_engine)

    def _retune(self, was: Choice, choice: Choice) -> None:
        """The tuner chose ``choice`` over ``was``: the memory tier evicts and admits by it
        from the event loop's next turn. Not at once: the tuner is fed from inside a hit's
        answer (the compiled one's too), which holds the admission and the what-if it would
        replace."""
        tuning = self.engine.whatif.tuning if self.engine.whatif is not None else None
        if tuning is None:
            return
        said = tuning.tuner.said

        def now() -> None:
            if self.engine.whatif is None or self.engine.whatif.tuning is not tuning:
                return  # a reload began a new tuner: its choice stands
            take(self.engine, choice, self.config.admission_config(), tuning.make, was)
            self.running = choice
            self.key_sample(self.sample_key)  # the new admission keyed, the hit path told
            log.info("tuner: the memory tier now %s (was %s): %s", choice.name, was.name, said)

        asyncio.get_running_loop().call_soon(now)

    @property
    def fast_hits(self) -> int:
        """Hits answered as soon as they were parsed (also counted among the engine's hits)."""
        return self.hits.fast_hits

    @property
    def fast_misses(self) -> int:
        """Misses answered in the callback that brought their origin response (also counted
        among the engine's misses)."""
        return self.fetcher.fast_misses

    async def handle(
        self, request: web.BaseRequest, work: Awaitable[web.StreamResponse] | None = None
    ) -> web.StreamResponse:
        """Answer one request (``work``: what ``start`` left of answering it); a bug in here
        costs that request a 500 (or, once its answer's head went out, its connection:
        ``_cut``), never the listener."""
        try:
            return await (self._handle(request) if work is None else work)
        except Exception as exc:
            begun = request.answer  # type: ignore[attr-defined]
            if isinstance(exc, ConnectionResetError):
                # The client closed its connection before its answer was whole: nothing to
                # write to, and no fault of the proxy's (nginx logs these as 499).
                log.info("%s %s: the client left before its answer", request.method,
                         request.raw_path)  # fmt: skip
                if begun is not None:
                    close(request)
                    return begun
                return plain(499, "client closed request", refused(CLIENT_LEFT))
            if begun is not None:
                return self._cut(request, begun)
            version = request.version
            HTTP_ERRORS.exception(
                "unexpected error on %s %s HTTP/%d.%d from %s",
                request.method, request.raw_path, version.major, version.minor, request.remote,
            )  # fmt: skip
            return plain(500, "internal error", forwarded(FWD_REQUEST, detail=ERROR))

    def _cut(self, request: web.BaseRequest, begun: Any) -> Any:
        """The answer to a request that failed after its answer's head went out (``begun``):
        a second status line would be read as the answer to the client's next request, so
        the connection is closed once what was written has gone, and the failure logged and
        counted (``answers_cut``). ``begun`` is what the connection logs, as sent."""
        self.answers_cut += 1
        version = request.version
        HTTP_ERRORS.exception(
            "unexpected error on %s %s HTTP/%d.%d from %s after its answer began; its "
            "connection is closed",
            request.method, request.raw_path, version.major, version.minor, request.remote,
        )  # fmt: skip
        close(request)
        return begun

    async def _handle(
        self, request: web.BaseRequest, cold: ColdRecord | None = None
    ) -> web.StreamResponse:
        routed = self.router.route(request)
        if type(routed) is not tuple:
            return routed
        meta, url = routed
        if self.purges.takes(request.method):
            return await self.purges.answer(
                request, meta, self.engine, self.clock, self.fleet, self.others
            )
        # Only aiohttp's handler traces: the admin's traced request closes its connection,
        # which keeps it off the lane and the compiled hit path.
        shown = request.headers.get(FIELD) if type(request) is ProxyRequest else None
        if shown is not None and compare_digest(shown.encode(), self.trace_token.encode()):
            return await self._traced(request, meta, url, cold)
        action = self.engine.plan(meta, self.clock(), content=request.body_exists)
        return await self._act(request, meta, url, action, cold)

    async def _traced(
        self, request: ProxyRequest, meta: RequestMeta, url: str, cold: ColdRecord | None
    ) -> web.StreamResponse:
        """``_handle``'s plan and step for a request that showed the trace token, each step
        recorded (``proxy.wire.trace``) for its answer's head to carry."""
        steps: list[dict[str, Any]] = []
        request.trace = steps
        shown = tracing(steps)
        try:
            step("route", route=self.router.route_label(request.host), origin=shown_origin(url),
                 key=shown_key(meta.key), pid=os.getpid())  # fmt: skip
            action = self.engine.plan(meta, self.clock(), content=request.body_exists)
            step("plan", **action_view(action))
            return await self._act(request, meta, url, action, cold)
        finally:
            STEPS.reset(shown)

    def start(self, request: LaneRequest) -> Awaitable[web.StreamResponse] | PendingMiss:
        """Begin a request of a connection's lane (``proxy.front.fastpath``), from what the
        answerers learned of it (``request.carried``): the plan they made (``Planned``), which
        is not made again, or where the compiled reader found its disk record
        (``ColdRecord``), which is read from there. A plain GET miss (no client conditional or
        Range, no fleet filter to ask) is sent at once on an idle pooled origin connection,
        and answered in the callback that brings its whole response (``PendingMiss``): no
        task, and no wait for the loop's next turn. Any other request gets the work that
        answers it as ``handle`` does, the engine's plan made."""
        carried: Planned | ColdRecord | None = request.carried
        if self.shared is not None or self.disk is not None or self.slicer is not None:
            match carried:
                case Planned(meta=meta, url=url, action=action, cold=cold):
                    return self.handle(request, self._act(request, meta, url, action, cold))
                case ColdRecord() | None:
                    return self.handle(request, self._handle(request, carried))
        try:
            return self._start(request, carried if type(carried) is Planned else None)
        except Exception as exc:
            return self.handle(request, raising(exc))  # logged and answered as ``handle`` does

    def _start(
        self, request: LaneRequest, planned: Planned | None
    ) -> Awaitable[web.StreamResponse] | PendingMiss:
        if planned is not None:
            meta, url, action = planned.meta, planned.url, planned.action
        else:
            routed = self.router.route(request)
            if type(routed) is not tuple:
                return self.handle(request, _given(routed))
            meta, url = routed
            action = self.engine.plan(meta, self.clock())
        if action is not FETCH_WHOLE or not CLIENT_ASKS.isdisjoint(meta.headers.by_name):
            return self.handle(request, self._act(request, meta, url, action))
        fetcher = self.fetcher
        flight = fetcher.flights.lead(meta.key)
        if flight is None:  # another request fetches it: follow
            return self.handle(request, self._act(request, meta, url, action))
        request_time = self.clock()
        try:
            sent = self.upstream.send_now(
                meta.method, url, self.router.upstream_headers(meta, whole=True)
            )
        except BaseException:
            fetcher.flights.end(meta.key, flight, None)
            raise
        if sent is None:
            work = fetcher.led_fetch(request, meta, url, action, flight)
            return self.handle(request, work)
        return PendingMiss(fetcher, self.handle, request, meta, url, flight, sent, request_time)

    async def _act(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        url: str,
        action: Action,
        cold: ColdRecord | None = None,
    ) -> web.StreamResponse:
        """Carry out the engine's ``action`` for ``request``: a ``Behind`` is asked of the tier
        behind memory first (``cold``: where the compiled reader found the URL's record, not
        in the page cache), and what it found decides the one step taken."""
        if type(action) is Behind:
            # The tier behind memory: a large record is read off the event loop.
            assert self.disk is not None
            # The compiled reader keys a URL as the router does, or declines it; a reload
            # since it read the request may key it otherwise.
            own = cold.slot if cold is not None and cold.key == meta.key else None
            found = await self.disk.anchors.lookup_request(meta, self.engine.entry_type, own)
            action = self.engine.found_behind(self.disk, meta, found, self.clock(), action.then)
            if traced_now():  # a cold disk hit's: only when traced
                step("disk", found=found is not None, **action_view(action))
        match action:
            case FromCache():
                if action.refresh:
                    self.revalidation.refresh_in_background(meta, url, action.entry)
                x_cache = "HIT" if action.fresh else "STALE"
                ttl = ttl_of(action.entry.lifetime, action.age)
                status = hit_status(ttl, DISK if action.behind else None)
                return self.fetcher.from_cache(meta, action.entry, action.age, status, x_cache)
            case Revalidate():
                return await self.revalidation.revalidate(request, meta, url, action)
            case Fetch(reason=events.FWD_METHOD):
                return await self.uploads.pass_through(request, meta, url)
            case Fetch(content=True):
                # Sent without its body, its length would have the origin read the next
                # request as the body.
                return await self.uploads.pass_through(request, meta, url, action.reason)
            case Fetch(reason=events.FWD_URI_MISS, whole=True) if self.slicer is not None:
                return await self.slicer.answer(request, meta, url, action)
            case Fetch(reason=events.FWD_URI_MISS) if (
                self.slicer is not None
                and meta.method == "HEAD"
                and (head := await self.slicer.head(request, meta, url)) is not None
            ):
                return head
            case Fetch(collapse=True):
                return await self.fetcher.collapsed_fetch(request, meta, url, action)
            case Fetch():
                return (await self.fetcher.fetch(request, meta, url, action))[0]
            case Refuse():
                return plain(action.status, action.text, forwarded(action.reason))
            case _:
                assert_never(action)

    async def close(self) -> None:
        """Cancel the background work still running."""
        await self.revalidation.close()


async def _given(response: web.StreamResponse) -> web.StreamResponse:
    return response
