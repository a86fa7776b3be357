"""An embedded origin serving the objects of a trace, for live load tests.

``GET /obj/KEY`` answers the object KEY of the trace: a deterministic body of its size (the same
bytes for the same key, every time, in every process), a strong ``ETag``, a fixed
``Last-Modified`` and ``Cache-Control: max-age``. A key the trace does not hold is a 404. An
optional added latency (fixed, or lognormal around a median) makes visible what a cache saves.
It honours ``If-None-Match`` with 304, so revalidation works against it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import mmh3
import numpy as np
from aiohttp import web

from loadgen.traces.trace import Trace

PREFIX = "/obj/"
LAST_MODIFIED = "Mon, 01 Jan 2024 00:00:00 GMT"
_PATTERN = 1 << 16


@dataclass(frozen=True, slots=True)
class OriginConfig:
    max_age: int = 3600
    latency: float = 0.0  # seconds added to every response (median when sigma > 0)
    latency_sigma: float = 0.0  # lognormal spread of the added latency; 0 = fixed
    seed: int = 1


class TraceOrigin:
    """The request handler; one instance serves one trace's objects."""

    def __init__(self, trace: Trace, config: OriginConfig = OriginConfig()) -> None:
        self.config = config
        keys = trace.key_strings()
        sizes = trace.sizes.tolist()
        self.sizes: dict[str, int] = {}
        for key, size in zip(keys, sizes, strict=True):
            if size > self.sizes.get(key, -1):
                self.sizes[key] = size
        largest = max(self.sizes.values(), default=0)
        rng = np.random.default_rng(config.seed)
        self._bytes = memoryview(rng.integers(0, 256, largest + _PATTERN, dtype=np.uint8).tobytes())
        self._jitter = random.Random(config.seed)
        self.requests = 0

    def body(self, key: str) -> memoryview:
        """The object's bytes: a window of a fixed random buffer chosen by the key's hash."""
        offset = mmh3.hash(key, signed=False) % _PATTERN
        return self._bytes[offset : offset + self.sizes[key]]

    def etag(self, key: str) -> str:
        return f'"{mmh3.hash(f"{key}:{self.sizes[key]}", signed=False):08x}"'

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.requests += 1
        path = request.path
        key = path[len(PREFIX) :] if path.startswith(PREFIX) else None
        if key is None or key not in self.sizes:
            return web.Response(status=404, text="no such object\n")
        delay = self._delay()
        if delay:
            await asyncio.sleep(delay)
        etag = self.etag(key)
        headers = {
            "ETag": etag,
            "Last-Modified": LAST_MODIFIED,
            "Cache-Control": f"max-age={self.config.max_age}",
            "Content-Type": "application/octet-stream",
        }
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=self.body(key), headers=headers)

    def _delay(self) -> float:
        c = self.config
        if c.latency_sigma <= 0:
            return c.latency
        return self._jitter.lognormvariate(0.0, c.latency_sigma) * c.latency


async def start_origin(
    trace: Trace, config: OriginConfig = OriginConfig(), host: str = "127.0.0.1", port: int = 0
) -> tuple[web.ServerRunner, TraceOrigin, str]:
    """Serve ``trace`` on ``host:port`` (0: a free port); returns the runner, the handler and
    the base URL."""
    origin = TraceOrigin(trace, config)
    runner = web.ServerRunner(web.Server(origin.handle, access_log=None))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, origin, f"http://{bound_host}:{bound_port}"
