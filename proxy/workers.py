"""``onehit-proxy --workers N``: N processes serving one port, one admin listener for all.

Each worker is a whole onehit (its own cache, the admission backend from config, so
``backend = "redis"`` makes them agree on what was seen) bound to the proxy port with
SO_REUSEPORT; the kernel spreads connections across them. Workers run their own admin on an
ephemeral loopback port; the parent serves the configured admin address: ``/stats`` lists every
worker and their sum, ``/metrics`` is the sum, ``/purge`` and ``/filter/reset`` reach every
worker. SIGTERM/SIGINT to the parent drains every worker, then it exits 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from proxy.admin import admin_application, metrics_response, prometheus_text
from proxy.config import Config
from proxy.core.stats import combine
from proxy.service import until_signalled

log = logging.getLogger("onehit.workers")
READY = "onehit-worker-admin "


async def serve_workers(config: Config, argv: Sequence[str], count: int) -> int:
    """Run ``count`` workers with ``argv`` (the parent's own flags) until a signal; the exit
    status is 0 when every worker drained cleanly."""
    if config.server.listen[1] == 0:
        raise ValueError("--workers needs a fixed [server] listen port, not 0")
    if config.disk.path:
        # Each worker would claim the directory for its own disk tier: only one can.
        raise ValueError(
            f"--workers {count} with [disk] path: a disk directory serves one process, and "
            "workers share no disk tier yet; run one process, or one per [disk] path"
        )
    workers = []
    for _ in range(count):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", *argv, "--worker",
            "--set", "admin.listen=127.0.0.1:0", stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        workers.append(process)
    admins = []
    for process in workers:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        if not line.startswith(READY):
            for other in workers:
                other.kill()
            raise RuntimeError(f"a worker did not start (it said {line!r})")
        admins.append(line[len(READY) :].strip())
    runner = web.AppRunner(fleet_admin(config, admins), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, *config.admin.listen, reuse_address=True).start()
    log.info("%d workers on %s:%d", count, *config.server.listen)
    await until_signalled()
    for process in workers:
        process.send_signal(signal.SIGTERM)
    codes = await asyncio.gather(*(process.wait() for process in workers))
    await runner.cleanup()
    return 0 if all(code == 0 for code in codes) else 1


def fleet_admin(config: Config, admins: list[str]) -> web.Application:
    """The parent's admin app: every call is fanned out to the workers' own admin listeners."""
    headers = {"Authorization": f"Bearer {config.admin.token}"} if config.admin.token else {}

    async def each(method: str, path: str, body: Any = None) -> list[Any]:
        async with aiohttp.ClientSession(headers=headers) as session:

            async def one(admin: str) -> Any:
                json_body = body if body is not None or method != "POST" else {}
                async with session.request(method, f"{admin}{path}", json=json_body) as r:
                    r.raise_for_status()
                    return await (r.json() if r.content_type == "application/json" else r.text())

            return await asyncio.gather(*(one(a) for a in admins))

    async def stats(request: web.Request) -> web.Response:
        per_worker = await each("GET", "/stats")
        body = {
            "workers": per_worker,
            "sum": combine([w["metrics"] for w in per_worker]),
            "worker_count": len(per_worker),
        }
        return web.json_response(body, dumps=lambda o: json.dumps(o, indent=2))

    async def metrics(request: web.Request) -> web.Response:
        per_worker = await each("GET", "/stats")
        return metrics_response(prometheus_text(combine([w["metrics"] for w in per_worker])))

    async def healthz(request: web.Request) -> web.Response:
        try:
            await each("GET", "/healthz")
        except (aiohttp.ClientError, ValueError):
            return web.Response(status=503, text="a worker is not answering\n")
        return web.Response(text="ok\n")

    async def fan_out(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        query = f"?{request.query_string}" if request.query_string else ""
        answers = await each("POST", request.path + query, body)
        removed = sum(a.get("removed", 0) for a in answers)
        return web.json_response({"workers": answers, "removed": removed})

    return admin_application(
        config.admin,
        stats=stats,
        metrics=metrics,
        healthz=healthz,
        purge=fan_out,
        filter_reset=fan_out,
    )
