"""PURGE on the data port, as Varnish users send it: ``curl -X PURGE http://host/path``
removes what a GET of that URL would be answered from, every variant, in every tier (and on
every instance of the fleet, with Redis), keyed exactly as that GET is keyed (its Host as sent,
its query as ``key_query`` keeps it); the answer names the key. Off unless ``[server]
purge_from`` lists the client's address; then a PURGE from any other address is refused
(405) and never reaches the origin. While it is off, PURGE is a method like any other, passed
to the origin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from proxy.core.engine import CacheEngine
from proxy.core.events import RequestMeta
from proxy.fleet.purges import FleetPurges


class OtherWorkers(Protocol):
    """The other workers of the machine, told of what this one removed from the tier they
    share (``proxy.ops.workers.MachineForgets``)."""

    def __call__(self, key: str) -> None:
        """Tell them of ``key``, soon."""

    async def reach(self, key: str) -> int:
        """Tell them of ``key`` and wait until they were told: how many it did not reach."""
        ...


class Purges:
    """PURGE requests from the addresses ``allowed`` (networks as text)."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = tuple(ipaddress.ip_network(n) for n in allowed)

    def takes(self, method: str) -> bool:
        """Whether a request of ``method`` is a purge for this proxy to answer."""
        return method == "PURGE" and bool(self.allowed)

    def allows(self, remote: str | None) -> bool:
        try:
            address = ipaddress.ip_address(remote or "")
        except ValueError:
            return False
        return any(address in network for network in self.allowed)

    async def answer(
        self,
        request: web.BaseRequest,
        meta: RequestMeta,
        engine: CacheEngine,
        now: Callable[[], float],
        fleet: FleetPurges | None,
        others: OtherWorkers | None,
    ) -> web.Response:
        """The answer to a PURGE, once every tier and worker has it: ``others`` tells the other
        workers of the machine (the answer says how many it did not reach: ``missing``, as
        the admin's ``/purge`` does), ``fleet`` the fleet's instances."""
        if not self.allows(request.remote):
            return web.json_response(
                {"error": "PURGE is not allowed from this address ([server] purge_from)"},
                status=405, headers={"Allow": "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH"},
            )  # fmt: skip
        answer = {**apply_purge(engine, "url", meta.key, now(), soft=False), "key": meta.key}
        if others is not None:  # an admin purge reaches every worker; this one, one
            answer["missing"] = await others.reach(meta.key)
        if fleet is not None:
            answer["fleet"] = await fleet.publish({"kind": "url", "value": meta.key, "soft": False})
        return web.json_response(answer)


def apply_purge(
    engine: CacheEngine, kind: str, value: Any, now: float, *, soft: bool
) -> dict[str, object]:
    """Purge what ``kind`` ("url": a cache key, "prefix", "tags") and ``value`` name, from
    every tier, marking it stale (``soft``) where that is kept; the answer a purge gets,
    whichever port it came on."""
    purged = engine.removals.purge(kind, value, now, soft=soft)
    answer: dict[str, object] = {"stale" if soft else "removed": purged.count}
    if not purged.durable:
        answer["durable"] = False
        answer["detail"] = ("the disk could not keep the purge on the device: it dropped every "
                            "region the purge could reach instead")  # fmt: skip
    return answer
