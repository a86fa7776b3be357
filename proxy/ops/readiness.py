"""What ``/readyz`` checks, each time it is asked: whether this instance can do its whole job
now, each check with its reason. (``/healthz`` says only that the process answers.)

* ``origin <route>``: a TCP connection to the route's origin opens within the connect timeout
  (at most 2 s); the reason says refused, timed out or unresolved, not the origin's address
  (``/readyz`` needs no token).
* ``redis``, when the admission filter is shared: Redis answered the last calls within their
  budget. While it does not, misses are judged by this instance's own filter: served, but a
  URL's second request across the fleet may be missed.
* ``disk``, with a disk tier: a file can be created (and is removed again) in its directory.

Ready only when every check passes: a load balancer reading ``/readyz`` takes an instance
whose origins are all down out, hits and all; one that should keep serving hits through an
origin outage reads ``/healthz``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.handler.server import Proxy

MAX_CONNECT = 2.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    reason: str

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason}


async def checks(proxy: Proxy) -> list[Check]:
    """Every check of ``proxy``, run at once."""
    timeout = min(proxy.config.upstream.connect_timeout, MAX_CONNECT)
    routes = sorted(proxy.router.routes.items())
    found = list(await asyncio.gather(*(_origin(host, url, timeout) for host, url in routes)))
    shared = proxy.shared
    if shared is not None:
        reason = "answering within its budget"
        if not shared.healthy:
            reason = "not answering within its budget: misses are judged by its own filter"
        found.append(Check("redis", shared.healthy, reason))
    if proxy.disk is not None:
        found.append(_disk(proxy.config.disk.path))
    return found


async def _origin(host: str, url: str, timeout: float) -> Check:
    name = f"origin {host or 'default'}"
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout)
    except TimeoutError:
        return Check(name, False, f"no connection within {timeout:g}s")
    except OSError as exc:
        return Check(name, False, f"cannot connect: {exc.strerror or type(exc).__name__}")
    writer.close()
    return Check(name, True, "accepts connections")


def _disk(path: str) -> Check:
    try:
        fd, probe = tempfile.mkstemp(prefix=".onehit-ready-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return Check("disk", False, f"no file can be written in its directory: {exc.strerror}")
    return Check("disk", True, "writable")
