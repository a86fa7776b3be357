"""The admin listener: /stats (JSON), /metrics (Prometheus), /healthz, /readyz, /cache (a look
inside, ``proxy.ops.inspection``), /trace (one request's decisions, ``proxy.ops.tracing``),
POST /purge, POST /filter/reset and POST /reload (the
configuration read again, ``proxy.ops.reload``).

/healthz (the process answers) and /readyz (its origins, Redis and disk can be used, each with
a reason) are always open. When a token is configured every other endpoint requires
``Authorization: Bearer TOKEN`` (the config refuses a non-loopback admin listener without one);
without one, the request's Host must name the listener. POSTs must be JSON.
"""

from __future__ import annotations

import gc
import hmac
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, NamedTuple, Protocol

from aiohttp import web

from proxy.config.settings import AdminSection
from proxy.core.disk import AutoPolicy
from proxy.core.stats import GAUGES, METRICS, TIER_HITS, TIER_HITS_HELP
from proxy.core.whatif import Samples
from proxy.handler.purging import apply_purge
from proxy.handler.routing import Router, cache_key
from proxy.handler.server import Proxy
from proxy.ops import inspection, readiness, tracing
from proxy.ops.answer_metrics import label, process_text, resident_bytes, servers_of, servers_text
from proxy.ops.answer_metrics import prometheus as answer_text
from proxy.ops.handoff import SECRET_FIELD
from proxy.ops.reload import NO_SOURCE, Reloaded

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# What a load balancer or an orchestrator probes, without a token: whether the process
# answers, and whether it can do its whole job (``proxy.ops.readiness``).
OPEN = frozenset({"/healthz", "/readyz"})

# Host names under which a loopback admin listener may be addressed without a token.
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


def guard_middleware(
    token: str, listen_host: str
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """What every admin request but /healthz and /readyz must show:

    * with a token, ``Authorization: Bearer TOKEN``;
    * without one, a ``Host`` naming the admin listener (its address, or a loopback name): a
      page whose own domain resolves to 127.0.0.1 cannot reach the API (DNS rebinding);
    * on POST, ``Content-Type: application/json``, which a cross-site form cannot send.
    """
    bracketed = f"[{listen_host}]" if ":" in listen_host else listen_host
    allowed_hosts = _LOOPBACK_NAMES | {bracketed.lower()}

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN:
            return await handler(request)
        if token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(
                given.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode()
            ):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        elif _host_name(request.headers.get("Host", "")) not in allowed_hosts:
            return web.json_response(
                {"error": "Host must name the admin listener (or set [admin] token)"}, status=403
            )
        if request.method == "POST" and request.content_type != "application/json":
            return web.json_response(
                {"error": "POST bodies must be Content-Type: application/json"}, status=415
            )
        return await handler(request)

    return guard


def _host_name(host: str) -> str:
    """The name part of a Host value, lower-cased (an IPv6 literal keeps its brackets)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.partition(":")[0]


class ProcessAdmin:
    """The admin API of one process (``admin_application``); ``reloader`` reads the
    configuration again (``POST /reload``; without one, a reload is refused); ``answers``,
    the data port's answers (``proxy.ops.answer_metrics``) as ``/metrics`` gives them;
    ``machine_secret``, what the other processes of its machine show (a worker's)."""

    def __init__(
        self,
        proxy: Proxy,
        started: float | None = None,
        reloader: Callable[[], Awaitable[Reloaded]] | None = None,
        answers: Callable[[], dict[str, Any]] | None = None,
        machine_secret: str = "",
        data_port: Callable[[], tuple[str, int]] | None = None,
    ) -> None:
        self.proxy = proxy
        self.started = time.time() if started is None else started
        self.reloader = reloader
        self.answers = answers
        self.machine_secret = machine_secret
        self.data_port = data_port
        self.readiness_checks = readiness.Readiness(proxy)

    def machines_own(self) -> dict[str, Handler]:
        """``POST /forget``, where workers share a tier: keys another worker forgot there,
        which this one forgets in memory."""
        disk = self.proxy.disk
        return {} if disk is None or disk.sharing is None else {"/forget": self.forget}

    async def reload(self, request: web.Request) -> web.Response:
        done = await self.reloader() if self.reloader is not None else Reloaded(refused=NO_SOURCE)
        return web.json_response(done.as_json(), status=409 if done.refused else 200)

    async def stats(self, request: web.Request) -> web.Response:
        engine = self.proxy.engine
        body = {
            "metrics": engine.stats(),
            "filter": _filter_health(self.proxy),
            "store": {
                "entries": len(engine.store),
                "bytes_used": engine.store.bytes_used,
                "capacity_bytes": engine.store.capacity_bytes,
                "max_object_bytes": engine.store.max_object_bytes,
            },
            "shared_filter": None if self.proxy.shared is None else self.proxy.shared.stats(),
            "fleet_purges": None
            if self.proxy.fleet is None
            else {
                "instance": self.proxy.fleet.id[:12],
                "received": self.proxy.fleet.received,
            },
            "disk": None if self.proxy.disk is None else self.proxy.disk.stats(),
            "disk_auto": disk_auto_stats(self.proxy),
            "servers": servers_of(self.proxy.router.routes, self.proxy.upstream.groups),
            "whatif": whatif_stats(self.proxy),
            "tune": tune_stats(self.proxy),
            "in_flight_fetches": len(self.proxy.flights),
            **proxy_counters(self.proxy),
            "uptime_s": round(time.time() - self.started, 3),
            "answers": None if self.answers is None else self.answers(),
            "resident_bytes": resident_bytes(),
            "pid": os.getpid(),
            "worker": _place(self.proxy),
            "collector": {
                "threshold": gc.get_threshold(),
                "frozen_objects": gc.get_freeze_count(),
                "generations": gc.get_stats(),
            },
            "config": self.proxy.config.summary(),
        }
        # A worker's what-if samples reach the parent before its stats do: the machine's
        # disk ghosts, which the parent answers with, have what this worker's curves had.
        # Not waited for long: a stalled parent must not stall the worker's own admin.
        if self.proxy.samples is not None:
            await self.proxy.samples.sent(within=SAMPLES_WAIT)
        return web.json_response(body, dumps=lambda o: json.dumps(o, indent=2))

    async def metrics(self, request: web.Request) -> web.Response:
        text = process_text(self.started) + prometheus_text(self.proxy.engine.stats())
        if self.answers is not None:
            text += answer_text(self.answers())
        text += prometheus_text(proxy_counters(self.proxy), PROXY_METRICS)
        if self.proxy.disk is not None:
            text += disk_prometheus_text(self.proxy.disk.stats())
        if (auto := disk_auto_stats(self.proxy)) is not None:
            text += disk_auto_prometheus_text(auto)
        text += servers_text(servers_of(self.proxy.router.routes, self.proxy.upstream.groups))
        if (whatif := whatif_stats(self.proxy)) is not None:
            text += whatif_prometheus_text(whatif)
        if (tune := tune_stats(self.proxy)) is not None:
            text += tune_prometheus_text([tune])
        if self.proxy.shared is not None:
            shared = self.proxy.shared
            text += prometheus_text(
                {"filter_fallbacks": shared.fallbacks,
                 "filter_remote_decisions": shared.remote_decisions,
                 "filter_late_replies": shared.late_replies,
                 "filter_breaker_trips": shared.trips,
                 "filter_redis_budget_seconds": shared.budget},
                SHARED_METRICS, SHARED_GAUGES,
            )  # fmt: skip
        return metrics_response(text)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        found = await self.readiness_checks.checks()
        ready = all(check.ok for check in found)
        return web.json_response(
            {"ready": ready, "checks": [check.as_json() for check in found]},
            status=200 if ready else 503,
        )

    async def purge(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        if request.can_read_body:
            try:
                params.update(await request.json())
            except (ValueError, TypeError, RecursionError):
                return web.json_response({"error": "body must be JSON"}, status=400)
        try:
            selector = _purged(params, self.proxy.router)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if selector is None:
            return web.json_response(
                {
                    "error": 'give {"url": "http://host/path"}, {"prefix": "http://host/dir/"} '
                    'or {"tags": ["product-42"]}, and "soft": true to mark them stale'
                },
                status=400,
            )
        kind, value = selector
        soft = params.get("soft") in (True, "true", "1")
        proxy = self.proxy
        answer: dict[str, object] = apply_purge(proxy.engine, kind, value, proxy.clock(), soft=soft)
        if kind != "tags":  # the key it used, as the cache keys it (Host as clients send it)
            answer[kind if kind == "prefix" else "key"] = value
        if self.proxy.fleet is not None:
            purge = {"kind": kind, "value": value, "soft": soft}
            answer["fleet"] = await self.proxy.fleet.publish(purge)
        return web.json_response(answer)

    async def cache(self, request: web.Request) -> web.Response:
        found = await look_inside(self.proxy, request.query)
        return web.json_response(found, status=400 if "error" in found else 200)

    async def trace(self, request: web.Request) -> web.Response:
        proxy = self.proxy
        address = self.data_port() if self.data_port is not None else proxy.config.server.listen
        status, answer = await tracing.traced(
            request.query, proxy.router, proxy.config.server, address, proxy.trace_token
        )
        return web.json_response(answer, status=status)

    async def filter_reset(self, request: web.Request) -> web.Response:
        engine, now = self.proxy.engine, time.time()
        engine.admission.reset(now)
        if engine.promotion is not None:  # the sightings of disk hits, memory's too
            engine.promotion.reset(now)
        return web.json_response({"reset": True})

    async def forget(self, request: web.Request) -> web.Response:
        named = await forgotten_keys_of(request)
        if named is None:
            return web.json_response({"error": 'give {"keys": ["cache key", ...]}'}, status=400)
        now, engine = self.proxy.clock(), self.proxy.engine
        if named.purge:  # as its own purge, put on the device once for the batch
            removed = engine.removals.purge_urls(named.keys, now).count
        else:
            # At when the sender removed each: a fetch of this one's sent since then brings a
            # response newer than what was removed, and is stored (at the time it arrived,
            # the second sighting of a URL on another worker was never stored).
            at = named.at or [now] * len(named.keys)
            # Never after now, nor before a removal could still be on its way.
            removed = sum(engine.removals.forgotten_elsewhere(
                key, min(max(when, now - FORGET_LAG), now))
                for key, when in zip(named.keys, at, strict=True))  # fmt: skip
        return web.json_response({"removed": removed})


def admin_app(
    proxy: Proxy,
    started: float | None = None,
    reloader: Callable[[], Awaitable[Reloaded]] | None = None,
    answers: Callable[[], dict[str, Any]] | None = None,
    machine_secret: str = "",
    data_port: Callable[[], tuple[str, int]] | None = None,
) -> web.Application:
    """The admin application of one process (``ProcessAdmin``); ``data_port``, where its data
    port listens (``/trace`` sends a request there)."""
    admin = ProcessAdmin(proxy, started, reloader, answers, machine_secret, data_port)
    return admin_application(proxy.config.admin, admin)


class Forgotten(NamedTuple):
    """What a ``POST /forget`` carries (``{"keys": [...], "from": place, "purge": bool}``):
    the keys a worker removed from the tier the workers share, the place of that worker, if
    it says, and whether they were purged (then each worker purges them as its own: recorded
    against its fetches in flight, and from the shared tier too, where one of those may have
    written since)."""

    keys: list[str]
    sender: int | None
    purge: bool
    at: list[float] | None = None  # when the sender removed each (seconds since the epoch)


async def forgotten_keys_of(request: web.Request) -> Forgotten | None:
    """What a ``POST /forget`` carries; None when it names no keys."""
    try:
        body = await request.json()
    except (ValueError, TypeError, RecursionError):
        return None
    keys = body.get("keys") if isinstance(body, dict) else None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return None
    sender = body.get("from")
    place = sender if isinstance(sender, int) and not isinstance(sender, bool) else None
    at = body.get("at")
    times = at if isinstance(at, list) and len(at) == len(keys) else None
    if times is not None and not all(type(t) is float and math.isfinite(t) for t in times):
        times = None
    return Forgotten(keys, place, body.get("purge") is True, times)


# Seconds a removal another worker made may take to reach this one at most (its batches are
# tried again for about 1.3 s): an older time given is taken as this much ago.
FORGET_LAG = 10.0

# How long a worker's /stats waits for its what-if samples to reach the parent, in seconds.
SAMPLES_WAIT = 2.0


async def whatif_samples_of(request: web.Request, places: int) -> Samples | None:
    """The ``Samples`` a ``POST /whatif`` carries from one of ``places`` workers, or None for
    anything else (``Samples.from_json``)."""
    try:
        body = await request.json()
    except (ValueError, TypeError, RecursionError):
        return None
    return Samples.from_json(body, places)


def apply_fleet_purge(proxy: Proxy, purge: dict[str, Any]) -> dict[str, object] | None:
    """A purge another instance published (``apply_purge``'s arguments), if well formed:
    what it removed here; None for one that is not."""
    kind, value = purge.get("kind"), purge.get("value")
    valid = (kind in ("url", "prefix") and isinstance(value, str)) or (
        kind == "tags" and isinstance(value, list) and all(isinstance(t, str) for t in value)
    )
    if not valid:
        return None
    return apply_purge(proxy.engine, kind, value, proxy.clock(), soft=purge.get("soft") is True)


async def look_inside(proxy: Proxy, query: Any) -> dict[str, Any]:
    """``GET /cache``: ``?url=`` what is stored for a URL (``proxy.ops.inspection.describe``), or
    ``?prefix=&limit=`` the keys memory holds under a prefix (``listing``); ``error`` when the
    query names neither, or a URL the proxy would refuse."""
    try:
        if "url" in query:
            return await inspection.describe(proxy, query["url"])
        if "prefix" in query:
            given = query.get("limit", "100")
            limit = int(given) if given.isascii() and given.isdigit() else 0
            if not 1 <= limit <= inspection.MAX_LIMIT:
                raise ValueError(f"limit {given!r}: expected a whole number from 1 to "
                                 f"{inspection.MAX_LIMIT}")  # fmt: skip
            return await inspection.listing(proxy, cache_key(query["prefix"]), limit)
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": "give ?url=http://host/path, or ?prefix=http://host/dir/&limit=100"}


def _purged(params: dict[str, Any], router: Router) -> tuple[str, Any] | None:
    """What a purge names: ("url", its cache key), ("prefix", a key prefix) or ("tags", the
    tags, each once); None when it names none; ValueError for a host the proxy would refuse,
    or text that is not Unicode a key can hold (a lone surrogate)."""
    tags = params.get("tags")
    for value in (
        params.get("url"),
        params.get("prefix"),
        *(tags if isinstance(tags, list) else ()),
    ):
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ValueError(f"{value!r} is not text a cache key can hold") from None
    if isinstance(params.get("url"), str):
        return "url", router.url_key(params["url"])
    if isinstance(tags, list) and tags and all(isinstance(t, str) and t.strip() for t in tags):
        return "tags", list(dict.fromkeys(t.strip() for t in tags))
    if isinstance(params.get("prefix"), str):
        return "prefix", cache_key(params["prefix"])
    return None


class Admin(Protocol):
    """What answers the admin API: one process (``ProcessAdmin``) or the machine's workers,
    through their parent (``proxy.ops.machine_admin.MachineAdmin``)."""

    machine_secret: str

    async def stats(self, request: web.Request) -> web.Response: ...
    async def metrics(self, request: web.Request) -> web.Response: ...
    async def healthz(self, request: web.Request) -> web.Response: ...
    async def readyz(self, request: web.Request) -> web.Response: ...
    async def purge(self, request: web.Request) -> web.Response: ...
    async def filter_reset(self, request: web.Request) -> web.Response: ...
    async def reload(self, request: web.Request) -> web.Response: ...
    async def cache(self, request: web.Request) -> web.Response: ...
    async def trace(self, request: web.Request) -> web.Response: ...

    def machines_own(self) -> dict[str, Handler]:
        """The routes only the processes of the machine call (``POST /forget``, ``POST
        /whatif``), by path."""
        ...


def admin_application(config: AdminSection, admin: Admin) -> web.Application:
    """The admin API's one route table, behind ``guard_middleware``: a single proxy and a fleet
    of workers answer the same endpoints. The machine's own routes (``Admin.machines_own``)
    are taken only with its secret (``machine_secret``, ``proxy.ops.handoff``), 403
    without."""
    app = web.Application(middlewares=[guard_middleware(config.token, config.listen[0])])
    app.on_response_prepare.append(_name_the_server)
    app.router.add_get("/stats", admin.stats)
    app.router.add_get("/metrics", admin.metrics)
    app.router.add_get("/healthz", admin.healthz)
    app.router.add_get("/readyz", admin.readyz)
    app.router.add_post("/purge", admin.purge)
    app.router.add_post("/filter/reset", admin.filter_reset)
    app.router.add_post("/reload", admin.reload)
    app.router.add_get("/cache", admin.cache)
    app.router.add_get("/trace", admin.trace)
    for path, handler in admin.machines_own().items():
        app.router.add_post(path, _machines_own(handler, admin.machine_secret))
    return app


def _machines_own(handler: Handler, secret: str) -> Handler:
    """``handler``, answering only a request that shows the machine's ``secret``."""
    expected = secret.encode()

    async def guarded(request: web.Request) -> web.StreamResponse:
        given = request.headers.get(SECRET_FIELD, "").encode("utf-8", "surrogateescape")
        if not secret or not hmac.compare_digest(given, expected):
            return web.json_response(
                {"error": "only the processes of this machine may call this"}, status=403
            )
        return await handler(request)

    return guarded


async def _name_the_server(request: web.Request, response: web.StreamResponse) -> None:
    """``Server: onehit``, in place of aiohttp's, which names the Python and library versions
    to whoever asks (errors and unknown paths included)."""
    response.headers["Server"] = "onehit"


def metrics_response(text: str) -> web.Response:
    """A Prometheus text exposition as an HTTP answer."""
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


def _place(proxy: Proxy) -> int | None:
    """This worker's place under ``--workers`` (None for a process of its own)."""
    sharing = None if proxy.disk is None else proxy.disk.sharing
    return None if sharing is None else sharing.worker


def _filter_health(proxy: Proxy) -> dict[str, object] | None:
    health = proxy.engine.admission.filter_stats()
    return None if health is None else asdict(health)


def proxy_counters(proxy: Proxy) -> dict[str, int]:
    """The process's own counts beside the engine's (``PROXY_METRICS``), for /stats and
    /metrics alike."""
    return {
        "fast_hits": proxy.fast_hits,
        "fast_misses": proxy.fast_misses,
        "answers_cut": proxy.answers_cut,
        "origin_unasked": proxy.upstream.unasked,
    }


PROXY_METRICS = {
    "fast_hits": "hits answered as soon as they were parsed, before aiohttp's request objects",
    "fast_misses": "misses answered in the callback that brought the origin's whole response",
    "answers_cut": "requests that failed after their answer's head went out: connection closed",
    "origin_unasked": "new origin connections closed unused: the origin spoke before it was asked",
}
DISK_METRICS = {
    "disk_hits": "memory misses the disk tier answered",
    "disk_misses": "memory misses the disk tier did not answer",
    "disk_admissions": "responses the disk tier took (records written)",
    "disk_rejected": "responses the disk tier's admission turned away",
    "disk_throttled": "responses the disk's admission took that its write budget turned away",
    "disk_bytes_written": "bytes of records appended to the disk tier",
    "disk_bytes_not_written": "bytes of records the disk tier's admission spared the device",
    "disk_evicted_objects": "records gone with the regions evicted whole",
    "disk_dropped": "records found torn, damaged or unwritable, or invalidated, forgotten",
    "disk_purged": "records a purge by prefix or tag reached (when next looked up), forgotten",
    "disk_bans": "purges by prefix or tag outstanding on the disk tier",
    "disk_objects": "records the disk tier holds",
    "disk_index_bytes": "bytes of RAM of the disk tier's index",
    "disk_pushed_out": "records a shared tier's index gave up for a newer one (a full bucket)",
}
PROCESS_WRITES = "bytes the process caused to be written to storage (/proc/self/io write_bytes)"
DISK_GAUGES = frozenset({"disk_objects", "disk_index_bytes", "disk_bans"})
SHARED_METRICS = {
    "filter_fallbacks": "admission decisions taken locally because Redis failed or was slow",
    "filter_remote_decisions": "admission decisions the shared Redis filter gave",
    "filter_late_replies": "admission decisions whose wait for Redis ran out (among fallbacks)",
    "filter_breaker_trips": "times Redis was given up on for a while (refused, or unanswered)",
    "filter_redis_budget_seconds": "how long a miss now waits for Redis (follows its latency)",
}
SHARED_GAUGES = frozenset({"filter_redis_budget_seconds"})


def whatif_stats(proxy: Proxy) -> dict[str, Any] | None:
    """The what-if's ghosts (``proxy.core.whatif``): its sample, and each ghost's estimated
    miss ratio and bytes written for the traffic so far; under ``--workers``, the batches of
    samples the parent was too slow to take. None without a what-if."""
    engine = proxy.engine
    whatif = engine.whatif
    if whatif is None or not (whatif.ghosts or whatif.disk):  # none, or the tuner's alone
        return None
    out = {"sample": whatif.rate, "curves": whatif.curves(engine.counters.hits)}
    return out if proxy.samples is None else {**out, "batches_dropped": proxy.samples.dropped}


def disk_auto_stats(proxy: Proxy) -> dict[str, Any] | None:
    """The disk admission ``auto``'s choice and why (``AutoPolicy.state``); None when the
    disk tier admits by a fixed rule, or there is none."""
    admission = None if proxy.disk is None else proxy.disk.tier.admission
    return admission.state() if isinstance(admission, AutoPolicy) else None


def disk_auto_prometheus_text(auto: dict[str, Any]) -> str:
    """The disk admission ``auto``'s choice (1 for the candidate deciding, 0 for the others),
    switches, and each candidate's recent ghost hit ratio and share of the most written,
    labelled by the candidate's key (a size class's stays ``size-below:p50`` as its limit
    moves)."""
    candidates = auto["candidates"]

    def each(field: str) -> list[str]:
        return [f'{{admission="{label(c["key"])}"}} {c[field]!r}'
                for c in candidates if c[field] is not None]  # fmt: skip

    return series_text("onehit_disk_auto_", {
        "choice": ("gauge", "1 for the rule the disk tier's auto admission follows, else 0",
                   [f'{{admission="{label(c["key"])}"}} {int(c["key"] == auto["choice_key"])}'
                    for c in candidates]),
        "switches": ("counter", "times the disk tier's auto admission changed its rule",
                     [f" {auto['switches']}"]),
        "recent_hit_ratio": ("gauge", "a candidate's recent hit ratio in its ghost tier",
                             each("recent_hit_ratio")),
        "recent_write_share": ("gauge", "a candidate's recent ghost writes, of the most written",
                               each("recent_write_share")),
    })  # fmt: skip


def series_text(prefix: str, series: dict[str, tuple[str, str, list[str]]]) -> str:
    """Prometheus text of ``series``: for each field its kind, help and samples (labels and
    value), named ``prefix`` + field, with ``_total`` for a counter."""
    lines = []
    for field, (kind, help_text, samples) in series.items():
        name = prefix + field + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                  *(name + sample for sample in samples)]  # fmt: skip
    return "\n".join(lines) + "\n"


def tune_stats(proxy: Proxy) -> dict[str, Any] | None:
    """The tuner's state (``proxy.core.tuning``: its choice and why, its decisions, each
    candidate's recent miss ratio in its sample), with what the memory tier runs now
    (``running``: a choice is taken on the event loop's next turn); None without a tuner."""
    whatif = proxy.engine.whatif
    if whatif is None or whatif.tuning is None:
        return None
    whatif.flush()
    running = None if proxy.running is None else proxy.running.as_json()
    return {**whatif.tuning.state(), "running": running, "worker": _place(proxy)}


def tune_prometheus_text(tunes: list[dict[str, Any]]) -> str:
    """The tuner's choice, switches, judgements and candidates' recent miss ratios, of one
    process or of each worker of a machine (labelled by its place)."""
    series: dict[str, tuple[str, str, list[str]]] = {
        "choice": ("gauge", "1 for the eviction and admission the memory tier runs", []),
        "switches": ("counter", "choices the tuner changed", []),
        "judgements": ("counter", "judgements the tuner made", []),
        "recent_miss_ratio": ("gauge", "a candidate's recent miss ratio in the tuner's sample",
                              []),
    }  # fmt: skip
    for t in tunes:
        place = () if t.get("worker") is None else (f'worker="{t["worker"]}"',)
        series["choice"][2].append(f"{_labels(place, t['running'] or t['choice'])} 1")
        series["switches"][2].append(f"{_labels(place)} {t['switches']}")
        series["judgements"][2].append(f"{_labels(place)} {t['judgements']}")
        series["recent_miss_ratio"][2].extend(
            f"{_labels(place, c)} {c['recent_miss_ratio']!r}"
            for c in t["candidates"] if c["recent_miss_ratio"] is not None
        )  # fmt: skip
    return series_text("onehit_tune_", series)


def _labels(place: tuple[str, ...], choice: dict[str, Any] | None = None) -> str:
    """A series' labels: the worker's place, and a choice's eviction and admission."""
    pairs = [*place]
    if choice is not None:
        pairs += [f'eviction="{label(choice["eviction"])}"',
                  f'admission="{label(choice["admission"])}"']  # fmt: skip
    return "{" + ",".join(pairs) + "}" if pairs else ""


def whatif_prometheus_text(whatif: dict[str, Any]) -> str:
    """Each ghost's miss ratio and bytes written, labelled by tier, policy and scale."""

    def each(field: str) -> list[str]:
        return [
            f'{{tier="{c["tier"]}",policy="{label(c["policy"])}",scale="{c["scale"]:g}"}} '
            f"{float(c[field])!r}"
            for c in whatif["curves"]
            if c[field] is not None
        ]

    series = {
        "miss_ratio": ("gauge", "estimated miss ratio of a ghost cache fed a sample of the "
                       "traffic", each("miss_ratio")),
        "bytes_written": ("gauge", "estimated bytes a ghost cache would have written (memory, "
                          "or its disk tier)", each("bytes_written")),
    }  # fmt: skip
    if "batches_dropped" in whatif:  # under --workers: samples the ghosts never saw
        dropped = "batches of what-if samples dropped before the parent's ghosts"
        series["batches_dropped"] = ("counter", dropped, [f" {whatif['batches_dropped']}"])
    return series_text("onehit_whatif_", series)


def disk_prometheus_text(stats: dict[str, int | float | None]) -> str:
    """The disk tier's metrics (``DiskStore.stats``, or the workers' ``combine_stats``)."""
    disk = {f"disk_{name}": value for name, value in stats.items()}
    metrics = DISK_METRICS
    if disk.get("disk_process_write_bytes") is not None:
        metrics = {**DISK_METRICS, "disk_process_write_bytes": PROCESS_WRITES}
    return prometheus_text(disk, metrics, DISK_GAUGES)  # type: ignore[arg-type]


def prometheus_text(
    stats: dict[str, int | float],
    metrics: dict[str, str] = METRICS,
    gauges: frozenset[str] = GAUGES,
) -> str:
    """The Prometheus text exposition (format 0.0.4) of ``metrics``, prefixed ``onehit_``;
    counters get the ``_total`` suffix. Hits by the tier that answered them are one counter
    with a ``tier`` label, ``onehit_tier_hits_total``, summing to ``onehit_hits_total``."""
    lines = []
    by_tier = {tier: name for tier, name in TIER_HITS.items() if name in metrics}
    for name, help_text in metrics.items():
        if name in by_tier.values():
            continue
        kind = "gauge" if name in gauges else "counter"
        metric = f"onehit_{name}" if kind == "gauge" else f"onehit_{name}_total"
        lines.append(f"# HELP {metric} {help_text}")
        lines.append(f"# TYPE {metric} {kind}")
        lines.append(f"{metric} {float(stats[name])!r}")
    if by_tier:
        metric = "onehit_tier_hits_total"
        lines.append(f"# HELP {metric} {TIER_HITS_HELP}")
        lines.append(f"# TYPE {metric} counter")
        lines += [f'{metric}{{tier="{tier}"}} {float(stats[name])!r}'
                  for tier, name in by_tier.items()]  # fmt: skip
    return "\n".join(lines) + "\n"
