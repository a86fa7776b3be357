"""Real servers on 127.0.0.1 for the proxy tests: a scriptable aiohttp origin and onehit itself."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from loadgen.live.processes import free_port
from loadgen.traces.trace import Trace
from proxy.config.settings import load
from proxy.ops.service import Service

try:
    import uvloop
except ImportError:  # not on Windows: the proxy runs on asyncio's loop there
    uvloop = None  # type: ignore[assignment]

# The modules that pin how the proxy meets its transports (hostile and slow clients, the lane
# and plain hits, the origin pool and its faults): run on asyncio's loop too, the proxy's loop
# where uvloop does not install.
ON_BOTH_LOOPS = frozenset(
    {
        "test_fastpath", "test_hostile_clients", "test_miss_path", "test_origin_faults",
        "test_plain_hits", "test_pool", "test_proxy",
    }
)  # fmt: skip


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Async tests run on the loop the proxy runs on by default (``[server] event_loop =
    "auto"``): uvloop where it installs, else asyncio's; some on both."""
    if uvloop is None:
        return {"asyncio": asyncio.new_event_loop}
    if item.path.stem in ON_BOTH_LOOPS:
        return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
    return {"uvloop": uvloop.new_event_loop}


@dataclass
class Behaviour:
    """What the origin does for one path."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Cache-Control": "max-age=60"})
    body: bytes = b"hello from the origin"
    delay: float = 0.0
    cut_after: int | None = None  # send this many body bytes of a longer Content-Length, then reset
    chunked: bool = False
    not_modified_etag: str | None = None  # answer 304 to If-None-Match with this tag
    headers_304: dict[str, str] = field(default_factory=dict)


class Origin:
    """An aiohttp origin whose behaviour is set per path; it counts and records requests."""

    def __init__(self) -> None:
        self.paths: dict[str, Behaviour] = {}
        self.hits: Counter[str] = Counter()
        self.seen_headers: dict[str, dict[str, str]] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""
        # Replaces the per-path behaviours when set: a test's own handler.
        self.responder: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
        self._arrived = asyncio.Condition()

    async def arrived(self, path: str, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until ``count`` requests for ``path`` (with its query) reached the origin: a
        miss is at the origin now, whatever its delay. Orders a test by the event, not by a
        sleep long enough on this machine."""
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: self.hits[path] >= count), timeout
            )

    def set(self, path: str, **kwargs: object) -> Behaviour:
        self.paths[path] = Behaviour(**kwargs)  # type: ignore[arg-type]
        return self.paths[path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        self.hits[path] += 1
        self.seen_headers[path] = dict(request.headers)
        async with self._arrived:
            self._arrived.notify_all()
        if self.responder is not None:
            return await self.responder(request)
        b = self.paths.get(request.path) or self.paths.get(path) or Behaviour()
        if b.delay:
            await asyncio.sleep(b.delay)
        if b.not_modified_etag and request.headers.get("If-None-Match") == b.not_modified_etag:
            return web.Response(status=304, headers=b.headers_304)
        headers = dict(b.headers)
        headers.setdefault("X-Origin-Count", str(self.hits[path]))
        if b.cut_after is not None:
            response = web.StreamResponse(status=b.status, headers=headers)
            response.content_length = len(b.body)
            await response.prepare(request)
            await response.write(b.body[: b.cut_after])
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            return response
        if b.chunked:
            response = web.StreamResponse(status=b.status, headers=headers)
            response.enable_chunked_encoding()
            await response.prepare(request)
            for i in range(0, len(b.body), 4096):
                await response.write(b.body[i : i + 4096])
            await response.write_eof()
            return response
        return web.Response(status=b.status, body=b.body, headers=headers)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    o = Origin()
    await o.start()
    yield o
    await o.stop()


StartProxy = Callable[..., Awaitable[Service]]


@pytest.fixture
async def start_proxy(origin: Origin) -> AsyncIterator[StartProxy]:
    """Start onehit in front of ``origin``; keyword arguments are ``section.key`` overrides
    written with ``__`` for the dot (``cache__size="1MiB"``), and ``clock`` the cache's time."""
    services: list[Service] = []

    async def start(clock: Callable[[], float] = time.time, **overrides: object) -> Service:
        service = await proxy_in_front(origin.url, clock, **overrides)
        services.append(service)
        return service

    yield start
    for service in services:
        await service.stop()


async def proxy_in_front(
    origin_url: str, clock: Callable[[], float] = time.time, **overrides: object
) -> Service:
    """onehit started in front of ``origin_url`` (``start_proxy``'s, for a test that runs its
    own event loop); the caller stops it."""
    settings = {
        "upstream.origin": origin_url,
        "server.listen": "127.0.0.1:0",
        "admin.listen": "127.0.0.1:0",
        "server.access_log": False,
        # A test that logs reads its lines at once: they are written every 20 ms, not every
        # second (tests/test_access_log.py holds lines an hour, to see them written at a stop).
        "server.access_log_flush": "20ms",
        "upstream.connect_timeout": "2s",
        "upstream.read_timeout": "2s",
    }
    settings.update({k.replace("__", "."): v for k, v in overrides.items()})
    return await Service.start(load(env={}, overrides=settings), clock=clock)


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        auto_decompress=False, timeout=aiohttp.ClientTimeout(total=10)
    ) as session:
        yield session


def base(service: Service) -> str:
    host, port = service.proxy_address
    return f"http://{host}:{port}"


def admin(service: Service) -> str:
    host, port = service.admin_address
    return f"http://{host}:{port}"


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def raw_origin() -> AsyncIterator[Callable[[RawHandler], Awaitable[str]]]:
    """An origin that speaks bytes on a socket as the test scripts them: for faults no HTTP
    server library would commit. Returns its base URL."""
    servers: list[asyncio.Server] = []

    async def start(handler: RawHandler) -> str:
        async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass  # the proxy hung up, mid-read or mid-write
            finally:
                writer.close()

        server = await asyncio.start_server(guarded, "127.0.0.1", 0)
        servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The request head a raw origin received (up to the blank line)."""
    return await reader.readuntil(b"\r\n\r\n")


def cold_reads(log: Any) -> None:
    """Have ``log`` (a disk tier's ``RegionLog``) find no record in the page cache from now
    on: every read the handler makes goes off the event loop, as on a busy device, whatever
    the kernel has read ahead."""
    read = log.read

    def cold(slot: Any, key: bytes, *, warm_only: bool = False) -> Any:
        if warm_only:
            raise BlockingIOError
        return read(slot, key)

    log.read = cold


async def until(holds: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait until ``holds()`` is true (checked every loop turn, then every few ms): a test
    ordered by the state it waits for, not by a sleep long enough on this machine."""
    deadline = asyncio.get_running_loop().time() + timeout
    turns = 0
    while not holds():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not so within {timeout}s")
        turns += 1
        await asyncio.sleep(0 if turns < 100 else 0.005)


async def wait_healthy(client: aiohttp.ClientSession, url: str, timeout: float = 10.0) -> None:
    """Poll ``url`` (a /healthz) until it answers 200: a subprocess under test is up."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            async with client.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout}s")


async def raw(service: Service, request: bytes) -> bytes:
    """Send ``request`` as bytes to the proxy (no client library to normalise it); the first
    bytes of the answer."""
    host, port = service.proxy_address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    return data


# Each way a hit is answered: the compiled reader of its bytes, the fast path's Python (a
# field the rules read), and aiohttp's handler (a connection that closes after it).
HIT_WAYS = {"compiled": b"", "fast": b"Pragma: x\r\n", "handler": b"Connection: close\r\n"}


async def answers_on_every_way(proxy, path: bytes, extra: bytes = b"") -> dict[str, bytes]:
    """The answer's head on each of ``HIT_WAYS`` to a GET of ``path`` with ``extra`` fields."""
    heads = {}
    for way, line in HIT_WAYS.items():
        answer = await raw(proxy, b"GET %s HTTP/1.1\r\nHost: a.example\r\n%s%s\r\n" % (
            path, line, extra))  # fmt: skip
        heads[way] = answer.partition(b"\r\n\r\n")[0]
    return heads


REDIS = shutil.which("redis-server")


class RedisServer:
    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="onehit-redis-")
        self.process: subprocess.Popen | None = None

    async def start(self) -> None:
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        client = aioredis.from_url(self.url)
        for _ in range(100):
            try:
                await client.ping()
                break
            except (OSError, RedisError):
                await asyncio.sleep(0.05)
        await client.aclose()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


@pytest.fixture
async def redis_server():
    server = RedisServer()
    await server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


async def admin_purge(service: Service, body: dict) -> dict:
    """``POST /purge`` with ``body`` on ``service``'s admin port; its JSON answer (a 200)."""
    host, port = service.admin_address
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{host}:{port}/purge", json=body) as r,
    ):
        assert r.status == 200
        return await r.json()


class Clock:
    """The cache's time for a test that steps it (``start_proxy(clock=...)``)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def fetch_as_client(
    service: Service, path: str, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """A GET of ``path`` through ``service`` for the Host ``example.test`` (one key across
    restarts), with ``headers``: status, fields and body."""
    url = base(service) + path
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Host": "example.test", **headers}) as r,
    ):
        return r.status, dict(r.headers), await r.read()


# Fixtures that start a server: a test using one is live.
LIVE_FIXTURES = {"origin", "start_proxy", "client", "raw_origin", "redis_server"}
# What a test module does that makes its tests live: servers, sockets, processes.
LIVE_SOURCE = ("aiohttp", "asyncio.start_server", "socket", "subprocess", "os.fork")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test ``live`` (it starts servers or processes on 127.0.0.1) or ``unit``, and
    ``redis`` where it needs redis-server: ``pytest -m unit`` runs the rules alone."""
    live_modules: dict[str, bool] = {}
    for item in items:
        path = str(item.path)
        if path not in live_modules:
            source = item.path.read_text()
            live_modules[path] = any(word in source for word in LIVE_SOURCE)
        names = set(getattr(item, "fixturenames", ()))
        if "redis_server" in names or "redis_cluster" in names:
            item.add_marker(pytest.mark.redis)
        live = bool(names & LIVE_FIXTURES) or live_modules[path]
        item.add_marker(pytest.mark.live if live else pytest.mark.unit)


# A test that takes longer than this (setting up, running and tearing down) should be marked
# ``slow``: ``make check`` leaves those out.
SLOW_SECONDS = 3.0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the tests that took longer than ``SLOW_SECONDS``, fixtures included, without a
    ``slow`` or ``perf`` mark, so the inner loop (``make check``) stays quick as tests are
    added."""
    took: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport) and not {"slow", "perf"} & set(
                report.keywords
            ):
                took[report.nodeid] = took.get(report.nodeid, 0.0) + report.duration
    unmarked = sorted((d, nodeid) for nodeid, d in took.items() if d > SLOW_SECONDS)
    if unmarked:
        terminalreporter.section(f"tests over {SLOW_SECONDS:g} s without a slow mark")
        for duration, nodeid in reversed(unmarked):
            terminalreporter.line(f"{duration:5.1f}s {nodeid}")


@asynccontextmanager
async def served(
    *args: str, port: int | None = None, token: str = "", within: float = 10.0
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, str]]:
    """``onehit-proxy`` run with ``args`` on ports picked here, as ``--workers`` needs (a single
    process is started on port 0 by ``onehit_process``): the process, its proxy URL and its
    admin URL, once healthy (``port``: the proxy's, for a restart that keeps its cache keys,
    which hold the Host; ``within``: seconds it has to become healthy). Killed at the end
    unless it has exited."""
    port, admin_port = port or free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args,
        "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    admin = f"http://127.0.0.1:{admin_port}"
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        async with aiohttp.ClientSession(headers=headers) as client:
            await wait_healthy(client, admin + "/healthz", within)
        yield process, f"http://127.0.0.1:{port}", admin
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def serve_trace(origin, trace: Trace, max_age: float = 3600) -> None:
    """Have ``origin`` answer every ``/obj/KEY`` with a body of the trace's size for KEY."""
    size_of = dict(zip(trace.key_strings(), trace.sizes.tolist(), strict=True))
    size_of["sample"] = 1

    async def serve(request: web.Request) -> web.Response:
        body = b"b" * size_of[request.match_info["tail"].removeprefix("obj/")]
        return web.Response(body=body, headers={"Cache-Control": f"max-age={max_age:g}"})

    origin.responder = serve
