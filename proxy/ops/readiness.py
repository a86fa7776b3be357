"""What ``/readyz`` checks, each time it is asked: whether this instance can do its whole job
now, each check with its reason. (``/healthz`` says only that the process answers.)

* ``origin <route>``: a TCP connection to the route's origin opens within the connect timeout
  (at most 2 s); the reason names the error (``ECONNREFUSED``), not the origin's address
  (``/readyz`` needs no token); and, once the proxy has sent it ``FAILING_AFTER`` GETs and
  HEADs within the last minute, no more than half of the last 100 of them failed or were
  answered 502, 503 or 504 (passive health, ``proxy.origin.health``: an origin that accepts
  connections and answers that it is down; what the proxy answers itself, a 500 of one URL,
  another method, an upload the client dropped never count). A route of several servers is
  ready while one of them is, its reason naming each server down by its place in the list.
* ``redis``, when the admission filter is shared: Redis answered the last calls within their
  budget. While it does not, misses are judged by this instance's own filter: served, but a
  URL's second request across the fleet may be missed.
* ``disk``, with a disk tier: a file can be created (and is removed again) in its directory.

Ready only when every check passes: a load balancer reading ``/readyz`` takes an instance
out when any one of its routes' origins is down (every instance sees the same origin down:
the whole fleet, hits and all); one that should keep serving hits through an origin outage
reads ``/healthz``.
"""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.disk.directory import take_a_file
from proxy.handler.server import Proxy
from proxy.origin.health import OriginHealth, origin_of
from proxy.origin.servers import ServerGroup

MAX_CONNECT = 2.0
# Requests an origin must have had before its share of failures judges it.
FAILING_AFTER = 20


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    reason: str

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason}


class Readiness:
    """``checks`` of one proxy, run at most once a second: the requests of a probe that
    comes more often, or of many at once, share one run (``/readyz`` needs no token, and each
    run opens a connection to every origin)."""

    def __init__(self, proxy: Proxy, every: float = 1.0) -> None:
        self.proxy = proxy
        self.every = every
        self._last: tuple[float, asyncio.Future[list[Check]]] | None = None

    def checks(self) -> asyncio.Future[list[Check]]:
        loop = asyncio.get_running_loop()
        last = self._last
        if last is None or loop.time() - last[0] >= self.every:
            run = asyncio.ensure_future(checks(self.proxy))
            last = self._last = (loop.time(), run)
        return last[1]


async def checks(proxy: Proxy) -> list[Check]:
    """Every check of ``proxy``, run at once."""
    timeout = min(proxy.config.upstream.connect_timeout, MAX_CONNECT)
    health, groups = proxy.upstream.health, proxy.upstream.groups
    found = list(await asyncio.gather(*(
        _origin(host, url, timeout, health) if url not in groups
        else _servers(host, groups[url], timeout, health)
        for host, url in sorted(proxy.router.routes.items())
    )))  # fmt: skip
    shared = proxy.shared
    if shared is not None:
        reason = "answering within its budget"
        if not shared.healthy:
            reason = "not answering within its budget: misses are judged by its own filter"
        found.append(Check("redis", shared.healthy, reason))
    if proxy.disk is not None:
        found.append(_disk(proxy.config.disk.path))
    return found


async def _origin(host: str, url: str, timeout: float, health: OriginHealth) -> Check:
    return _recent(await _connects(f"origin {host or 'default'}", url, timeout), health, url)


async def _servers(host: str, group: ServerGroup, timeout: float, health: OriginHealth) -> Check:
    """A route of several servers: ready while one of them is (it fails over to it), each
    server named by its place in the route's list, as ``/readyz`` names no address."""
    each = await asyncio.gather(*(
        _origin(host, server.url, timeout, health) for server in group.servers
    ))  # fmt: skip
    down = [
        f"server {i + 1}: {c.reason if not c.ok else 'marked down by its requests or probe'}"
        for i, (c, server) in enumerate(zip(each, group.servers, strict=True))
        if not c.ok or not group.up(server.url)
    ]
    reason = f"{len(each) - len(down)} of {len(each)} servers ready"
    return Check(f"origin {host}", len(down) < len(each),
                 reason + (f" ({'; '.join(down)})" if down else ""))  # fmt: skip


async def _connects(name: str, url: str, timeout: float) -> Check:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout)
    except TimeoutError:
        return Check(name, False, f"no connection within {timeout:g}s")
    except OSError as exc:
        # The error's name alone: asyncio's own message names the address.
        why = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        return Check(name, False, f"cannot connect ({why})")
    writer.close()
    return Check(name, True, "accepts connections")


def _recent(check: Check, health: OriginHealth, url: str) -> Check:
    """``check`` of an origin, failed too when most of the proxy's recent requests to it
    failed or were answered as a server that is down answers (passive health: an origin that
    accepts connections and answers 503)."""
    failed, of = health.failing(origin_of(url))
    if not check.ok or of < FAILING_AFTER or failed * 2 <= of:
        return check
    why = f"{failed} of its last {of} requests within a minute failed or got 502-504"
    return Check(check.name, False, why)


def _disk(path: str) -> Check:
    try:
        take_a_file(path)
    except OSError as exc:
        return Check("disk", False, f"no file can be written in its directory: {exc.strerror}")
    return Check("disk", True, "writable")
