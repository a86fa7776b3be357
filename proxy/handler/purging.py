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

from aiohttp import web

from proxy.core.engine import CacheEngine
from proxy.core.events import RequestMeta
from proxy.fleet.purges import FleetPurges


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
    ) -> web.Response:
        if not self.allows(request.remote):
            return web.json_response(
                {"error": "PURGE is not allowed from this address ([server] purge_from)"},
                status=405, headers={"Allow": "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH"},
            )  # fmt: skip
        purged = engine.purge("url", meta.key, now())
        answer: dict[str, object] = {"removed": purged.count, "key": meta.key}
        if not purged.durable:
            answer["durable"] = False
        if fleet is not None:
            answer["fleet"] = await fleet.publish({"kind": "url", "value": meta.key, "soft": False})
        return web.json_response(answer)
