"""The machine's admin API, answered by the parent of ``--workers``: every call fanned out to
the workers' own admin listeners (``proxy.ops.admin.ProcessAdmin``), their answers combined.

* A worker being replaced, or not answering, is left out and said so (``missing``): its
  memory is empty or gone, so a purge has nothing to remove there, and the bans the others
  took reach it through the shared tier. When no worker takes a purge, it is refused (503,
  try again). A worker's refusal (a 4xx, the same from every worker) is the answer.
* The shared disk tier's what-if is the parent's own (``MachineGhosts``), fed by every
  worker's samples (``POST /whatif``); a removal one worker made in the shared tier reaches
  the others' memory through the parent (``POST /forget``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from proxy.config.settings import Config
from proxy.core.stats import combine
from proxy.core.whatif import DiskGhosts, Samples, merged_curves
from proxy.disk.sharing import LOADED, combine_stats
from proxy.handler.routing import Router
from proxy.ops import tracing
from proxy.ops.admin import (
    PROXY_METRICS,
    Handler,
    disk_prometheus_text,
    forgotten_keys_of,
    metrics_response,
    prometheus_text,
    tune_prometheus_text,
    whatif_prometheus_text,
    whatif_samples_of,
)
from proxy.ops.answer_metrics import combined, process_text, servers_text
from proxy.ops.answer_metrics import prometheus as answer_text
from proxy.ops.handoff import HandedConfig, machine_headers
from proxy.ops.reload import Reloaded
from proxy.ops.shared_tier import SharedTier, worker_view
from proxy.wire.trace import trace_token

# Seconds a worker waits for its parent's answer to what it sends (``ToParent``); the parent's
# admin for a worker's answer to a call it fans out, and to a removal another worker sent,
# within that worker's own wait.
TO_PARENT_WAIT = 5.0
FAN_OUT_WAIT = 30.0
FORGET_WAIT = TO_PARENT_WAIT - 2.0


class Machine(Protocol):
    """What the parent's admin reads of its workers (``proxy.ops.workers.Workers``)."""

    admins: list[str | None]  # each place's admin listener; None while it is replaced
    replaced: int
    handed: HandedConfig
    window: object | None  # the admission window the workers map, if they share one
    tier: SharedTier


class Reloading(Protocol):
    """The parent's reloads (``proxy.ops.workers.Reloads``): the configuration it runs, and
    its judgement of the file as it is now."""

    config: Config

    def judge(self) -> Reloaded: ...


class MachineAdmin:
    """The admin API of the machine ``workers`` (``proxy.ops.admin.Admin``), under the
    configuration ``config`` and its ``reloads``."""

    def __init__(self, config: Config, workers: Machine, reloads: Reloading) -> None:
        self.workers = workers
        self.reloads = reloads
        self.machine_secret = workers.handed.secret
        self.trace_token = trace_token(workers.handed.secret)
        self.headers = machine_headers(config.admin.token, workers.handed.secret)
        self.shared = workers.window is not None  # the workers map one admission window
        self.started = time.time()
        self.ghosts = MachineGhosts(lambda: reloads.config, workers.tier.overrides)

    def machines_own(self) -> dict[str, Handler]:
        """Keys a worker removed from the shared tier, for the others' memory; a worker's
        what-if samples, for the shared tier's ghosts."""
        return {"/forget": self.forget, "/whatif": self.whatif}

    async def purge(self, request: web.Request) -> web.Response:
        return await self._fan_out(request)

    async def trace(self, request: web.Request) -> web.Response:
        """One request traced through the machine's port: whichever worker the kernel gives
        it to answers (its process id is in the first step)."""
        config = self.reloads.config
        status, answer = await tracing.traced(request.query, Router(config), config.server,
                                              config.server.listen, self.trace_token)  # fmt: skip
        return web.json_response(answer, status=status)

    async def cache(self, request: web.Request) -> web.Response:
        """Each worker's look at its own memory and at the tier they share, by place."""
        try:  # the target passed on as sent: decoded once, by each worker
            answers, missing = await self._each("GET", request.rel_url.raw_path_qs)
        except Refused as refused:
            return web.json_response(refused.answer, status=refused.status)
        return web.json_response({"workers": answers, "missing": missing})

    async def filter_reset(self, request: web.Request) -> web.Response:
        return await self._fan_out(request)

    async def _each(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        but: int | None = None,
        within: float = FAN_OUT_WAIT,
    ) -> tuple[list[Any], int]:
        """The answers of the workers (``but`` the one in that place) that gave one within
        ``within`` seconds, and how many did not; ``Refused`` when one refused the call (a
        4xx: the same from every worker)."""
        timeout = aiohttp.ClientTimeout(total=within)
        async with aiohttp.ClientSession(headers=self.headers, timeout=timeout) as session:

            async def one(admin: str) -> Any:
                json_body = body if body is not None or method != "POST" else {}
                async with session.request(method, f"{admin}{path}", json=json_body) as r:
                    answer = await (r.json() if r.content_type == "application/json"
                                    else r.text())  # fmt: skip
                    if 400 <= r.status < 500:
                        raise Refused(r.status, answer)
                    r.raise_for_status()
                    return answer

            admins = [a for i, a in enumerate(self.workers.admins) if a is not None and i != but]
            answers = await asyncio.gather(*(one(a) for a in admins), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, Refused):
                raise answer
        given = [a for a in answers if not isinstance(a, BaseException)]
        return given, len(self.workers.admins) - (but is not None) - len(given)

    async def stats(self, request: web.Request) -> web.Response:
        per_worker, missing = await self._each("GET", "/stats")
        body = {
            "workers": per_worker,
            "sum": combine([w["metrics"] for w in per_worker], shared_filter=self.shared),
            "disk": self._machine_disk(per_worker),
            "whatif": self._machine_whatif(per_worker),
            "worker_count": len(self.workers.admins),
            "missing": missing,
            "workers_replaced": self.workers.replaced,
            "shared_tier": {
                "path": self.workers.tier.store.log.directory.as_posix(),
                "in_memory": self.workers.tier.scratch is not None,
            },
        }
        return web.json_response(body, dumps=lambda o: json.dumps(o, indent=2))

    async def metrics(self, request: web.Request) -> web.Response:
        per_worker, _ = await self._each("GET", "/stats")
        text = process_text(self.started)
        summed = combine([w["metrics"] for w in per_worker], shared_filter=self.shared)
        text += prometheus_text(summed)
        text += answer_text(combined([w["answers"] for w in per_worker if w.get("answers")]))
        own = {name: sum(w.get(name, 0) for w in per_worker) for name in PROXY_METRICS}
        text += prometheus_text(own, PROXY_METRICS)
        disk = self._machine_disk(per_worker)
        if disk:
            text += disk_prometheus_text(disk)
        text += servers_text([s for w in per_worker for s in w.get("servers") or ()])
        whatif = self._machine_whatif(per_worker)
        if whatif is not None:
            text += whatif_prometheus_text(whatif)
        if tunes := [w["tune"] for w in per_worker if w.get("tune")]:
            text += tune_prometheus_text(tunes)  # each worker tunes its own memory tier
        return metrics_response(text + _per_worker(per_worker, self.workers.admins))

    def _machine_whatif(self, per_worker: list[Any]) -> dict[str, Any] | None:
        """The machine's what-if: the workers' memory curves as one (``merged_curves``:
        their private memory tiers together), the curves of the shared disk's ghosts, which
        every worker feeds, and the batches of samples they never took."""
        found = [w["whatif"] for w in per_worker if w.get("whatif")]
        if not found:
            return None
        curves = merged_curves([w["curves"] for w in found])
        disk = self.ghosts.current()
        dropped = sum(w.get("batches_dropped", 0) for w in found) + self.ghosts.left_out
        return {"sample": found[0]["sample"],
                "curves": curves + ([] if disk is None else disk.curves()),
                "batches_dropped": dropped}  # fmt: skip

    async def whatif(self, request: web.Request) -> web.Response:
        batch = await whatif_samples_of(request, len(self.workers.admins))
        if batch is None:
            return web.json_response({"error": "give a worker's samples (Samples.as_json)"},
                                     status=400)  # fmt: skip
        return web.json_response({"fed": self.ghosts.feed(batch)})

    def _machine_disk(self, per_worker: list[Any]) -> dict[str, int | float | None]:
        """The shared tier's stats: the workers' own counts summed, what it holds once, and
        what its loading found, which only the parent knows."""
        disks = [w["disk"] for w in per_worker if w.get("disk")]
        if not disks:
            return {}
        loaded = self.workers.tier.store.stats()
        return {**combine_stats(disks), **{key: loaded[key] for key in LOADED}}

    async def healthz(self, request: web.Request) -> web.Response:
        _, missing = await self._each("GET", "/healthz")
        if missing:
            return web.Response(status=503, text=f"{missing} worker(s) not answering\n")
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready when every worker is: each one's checks, a worker not answering as one."""
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(place: int, admin: str | None) -> dict[str, Any]:
                if admin is not None:
                    try:
                        async with session.get(f"{admin}/readyz") as r:
                            return {"worker": place, **(await r.json())}
                    except (aiohttp.ClientError, TimeoutError, ValueError):
                        pass
                silent = {"name": "worker", "ok": False, "reason": "not answering"}
                return {"worker": place, "ready": False, "checks": [silent]}

            answers = await asyncio.gather(*(one(i, a) for i, a in enumerate(self.workers.admins)))
        ready = all(a["ready"] for a in answers)
        return web.json_response({"ready": ready, "workers": answers}, status=200 if ready else 503)

    async def _fan_out(self, request: web.Request) -> web.Response:
        body = None
        if request.can_read_body:
            try:
                body = await request.json()
            except (ValueError, TypeError, RecursionError):
                return web.json_response({"error": "body must be JSON"}, status=400)
        try:  # the target passed on as sent: decoded once, by each worker
            answers, missing = await self._each("POST", request.rel_url.raw_path_qs, body)
        except Refused as refused:
            return web.json_response(refused.answer, status=refused.status)
        if not answers:
            # Every worker is being replaced: none took it, and a ban kept by none would not
            # reach the shared tier. Asked again in a second, they will.
            return web.json_response(
                {"error": "no worker is running to take it (each is being replaced): try "
                          "again", "missing": missing},
                status=503, headers={"Retry-After": "1"},
            )  # fmt: skip
        removed = sum(a.get("removed", 0) for a in answers)
        return web.json_response({"workers": answers, "removed": removed, "missing": missing})

    async def reload(self, request: web.Request) -> web.Response:
        done = self.reloads.judge()
        if done.refused:
            return web.json_response(done.as_json(), status=409)
        if done.replacing:  # each worker takes it all as it starts again
            self.workers.roll_soon()
            return web.json_response(done.as_json())
        try:
            answers, missing = await self._each("POST", "/reload", {})
        except Refused as refused:  # a worker refused what the parent took
            return web.json_response(refused.answer, status=refused.status)
        return web.json_response({**done.as_json(), "workers": answers, "missing": missing})

    async def forget(self, request: web.Request) -> web.Response:
        named = await forgotten_keys_of(request)
        if named is None:
            return web.json_response({"error": 'give {"keys": ["cache key", ...]}'}, status=400)
        body = {"keys": named.keys, "purge": named.purge, "at": named.at}
        # Within the worker's own wait for this answer: a stalled sibling is counted missing.
        answers, missing = await self._each("POST", "/forget", body, but=named.sender,
                                      within=FORGET_WAIT)  # fmt: skip
        return web.json_response(
            {"removed": sum(a.get("removed", 0) for a in answers), "missing": missing}
        )


class MachineGhosts:
    """The ghosts of the disk tier the workers share, and of its alternatives, kept by the
    parent (``Config.disk_what_if`` of the configuration a worker runs: the parent's,
    ``config()``, with its tier's ``overrides``; none where the shared tier stands for
    memory), fed by every worker's samples (``MachineSamples``); built afresh when a reload
    changes what they are built of, as a worker's own ghosts are. A batch sampled at another
    rate than theirs (a worker that has not reloaded yet) is left out with its count
    (``left_out``); a worker replaced in its place (another process) has its memory ghosts
    begin afresh, as its memory tier does."""

    def __init__(self, config: Callable[[], Config], overrides: dict[str, object]) -> None:
        self.config = config
        self.overrides = overrides
        self.seen: Config | None = None  # the parent's configuration the ghosts follow
        self.key: tuple[object, ...] | None = None
        self.ghosts: DiskGhosts | None = None
        self.pids: dict[int, int] = {}  # the process that last fed each place
        self.left_out = 0

    def current(self) -> DiskGhosts | None:
        config = self.config()
        if config is self.seen:  # no reload since: nothing to derive again
            return self.ghosts
        self.seen = config
        view = worker_view(config, self.overrides) if config.disk.path else None
        key = None if view is None else view.what_if_key()
        if key != self.key:
            self.key = key
            self.ghosts = None if view is None else view.disk_what_if()
            self.pids.clear()
        return self.ghosts

    def feed(self, batch: Samples) -> int:
        """Feed ``batch`` to the ghosts; the requests it replayed (0: none taken)."""
        ghosts = self.current()
        if ghosts is None:
            return 0
        if batch.rate != ghosts.rate:
            self.left_out += 1
            return 0
        if self.pids.setdefault(batch.place, batch.pid) != batch.pid:
            ghosts.restart(batch.place)
            self.pids[batch.place] = batch.pid
        ghosts.feed(batch.place, batch.sample, batch.requests)
        return len(batch.sample.times)


class Refused(Exception):
    """A worker's admin refused a call (``status``, a 4xx, with its ``answer``)."""

    def __init__(self, status: int, answer: Any) -> None:
        super().__init__(status)
        self.status = status
        self.answer = answer


def _per_worker(per_worker: list[Any], admins: list[str | None]) -> str:
    """One series per worker place: whether it answered, and its own counts."""
    ordered = sorted(per_worker, key=lambda w: w.get("worker") or 0)
    up = [f'onehit_worker_up{{worker="{i}"}} {int(a is not None)}' for i, a in enumerate(admins)]
    requests = [f'onehit_worker_requests_total{{worker="{w.get("worker")}"}} '
                f'{w["metrics"]["requests"]}' for w in ordered]  # fmt: skip
    memory = [f'onehit_worker_resident_memory_bytes{{worker="{w.get("worker")}"}} '
              f'{w.get("resident_bytes", 0)}' for w in ordered]  # fmt: skip
    return "\n".join([
        "# HELP onehit_worker_up Whether the worker in this place answered the scrape",
        "# TYPE onehit_worker_up gauge", *up,
        "# HELP onehit_worker_requests_total GET/HEAD requests each worker took",
        "# TYPE onehit_worker_requests_total counter", *requests,
        "# HELP onehit_worker_resident_memory_bytes Each worker's resident memory",
        "# TYPE onehit_worker_resident_memory_bytes gauge", *memory,
    ]) + "\n"  # fmt: skip
