"""The servers a live run starts as child processes, each stopped by its PID on leaving: the
embedded origin, onehit (one, or a fleet behind an nginx balancer), nginx with
``proxy_cache_min_uses 2``, Redis and a Redis Cluster. onehit and the origin listen on a port
the kernel picks and say where; nginx and Redis get a port found free just before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import aiohttp

from loadgen.live.experiment_file import LiveSettings, PolicySpec
from loadgen.live.nginx import BALANCER_PROBE, nginx_balancer_config, nginx_binary, nginx_config
from loadgen.traces.trace import Trace, write_trace

# The ports ``free_port`` handed out lately: the kernel may give a port just released again at
# once, and two picked in a row (a proxy's and its admin's) must differ.
_HANDED: deque[int] = deque(maxlen=64)


def free_port() -> int:
    """A loopback port free now, and none of the last 64 this process was given, for servers
    that cannot say which port the kernel gave them (nginx, Redis). Another socket may take it
    before the server binds it: onehit and the embedded origin listen on port 0 and say where
    instead."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED:
            _HANDED.append(port)
            return port


async def _wait_healthy(
    url: str, process: asyncio.subprocess.Process, said: IO[bytes], timeout: float = 20
) -> None:
    """Return once ``url`` answers below 500; raise if ``process`` exits first, quoting the end
    of what it wrote to ``said``, or if ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise RuntimeError(
                    f"{url}: the process exited with {process.returncode}{_last_words(said)}"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url) as r:
                    if r.status < 500:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s{_last_words(said)}")


def _last_words(said: IO[bytes], limit: int = 2000) -> str:
    """The end of what a process wrote to ``said``, to quote in an error."""
    text = _written(said).decode(errors="replace").strip()[-limit:]
    return f"; it said:\n{text}" if text else "; it said nothing"


def _written(said: IO[bytes]) -> bytes:
    """What a child process has written to ``said`` so far. Read at an offset: the child writes
    at the file position it shares with ``said``, which a seek here would move under it."""
    fd = said.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0)


@contextlib.asynccontextmanager
async def _child(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, IO[bytes]]]:
    """``args`` run as a child process whose output and errors go to a file of their own, read
    by ``_announced`` and quoted by start-up errors: the process and that file. Stopped on
    leaving."""
    with tempfile.TemporaryFile() as said:
        process = await asyncio.create_subprocess_exec(*args, stdout=said, stderr=subprocess.STDOUT)
        try:
            yield process, said
        finally:
            await _stop(process)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


# What the embedded origin prints once it listens (``onehit-loadgen origin``); started on port
# 0, like the proxy below, it says there which port the kernel gave it.
SERVING = re.compile(rb"serving [\d,]+ objects at (http://\S+)/obj/KEY")


@contextlib.asynccontextmanager
async def origin_process(trace: Trace, live: LiveSettings) -> AsyncIterator[str]:
    """The embedded origin in its own process on a loopback port of the kernel's choosing,
    serving ``trace``: its base URL. If it does not start, the error quotes what it said."""
    with tempfile.TemporaryDirectory(prefix="onehit-origin-") as tmp:
        path = Path(tmp) / ("trace.csv" if trace.names is not None else "trace.bin")
        write_trace(
            replace(trace, times=trace.times.round()) if path.suffix == ".bin" else trace, path
        )
        async with _child(
            sys.executable, "-m", "loadgen", "origin", "--trace", str(path), "--port", "0",
            "--latency", f"{live.origin_latency}s",
            "--latency-sigma", str(live.origin_latency_sigma),
            "--max-age", str(live.max_age),
        ) as (process, said):  # fmt: skip
            yield (await _announced(process, said, SERVING, "the origin"))[1].decode()


@dataclass(frozen=True)
class Targets:
    """What one live cell replays against: base URLs, onehit admin URLs (none for nginx) and,
    for nginx, its cache directory (to measure what it actually held)."""

    urls: list[str]
    admins: list[str]
    disk_cache: Path | None = None


@dataclass(frozen=True)
class Running:
    """A onehit-proxy subprocess that answers: its URL, its admin URL, the process."""

    url: str
    admin_url: str
    process: asyncio.subprocess.Process


# What onehit-proxy logs once both its listeners are bound. Started on port 0, the proxy is
# given free ports by the kernel and this line says which: a port picked here and released
# could be taken by another socket before the proxy bound it.
LISTENING = re.compile(rb"onehit listening on (https?://\S+) \(admin (http://[^)\s]+)\)")


@contextlib.asynccontextmanager
async def onehit_process(origin: str, settings: dict[str, str]) -> AsyncIterator[Running]:
    """A fresh onehit-proxy subprocess on ports of the kernel's choosing on loopback, in front of
    ``origin``, with ``settings`` ("section.key" -> value) on top; stopped (SIGTERM) on leaving.
    If it does not start, the error quotes what it said."""
    every = {
        "upstream.origin": origin,
        "server.listen": "127.0.0.1:0",
        "admin.listen": "127.0.0.1:0",
        "server.access_log": "false",
        **settings,
    }
    args = [arg for k, v in every.items() for arg in ("--set", f"{k}={v}")]
    async with _child(sys.executable, "-m", "proxy", *args) as (process, said):
        found = await _announced(process, said, LISTENING, "onehit-proxy")
        yield Running(found[1].decode(), found[2].decode(), process)


async def _announced(
    process: asyncio.subprocess.Process,
    said: IO[bytes],
    pattern: re.Pattern[bytes],
    name: str,
    timeout: float = 20,
) -> re.Match[bytes]:
    """The first match of ``pattern`` in what a starting ``process`` writes to ``said``: a
    line it writes once it listens, so it answers from then on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pattern.search(_written(said))
        if found:
            return found
        if process.returncode is not None:
            raise RuntimeError(
                f"{name} exited with {process.returncode} at start{_last_words(said)}"
            )
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{name} did not say where it listens within {timeout}s{_last_words(said)}")


@contextlib.asynccontextmanager
async def onehit_cell(
    origin: str, size: int, spec: PolicySpec, extra: dict[str, str], disk_size: int = 0
) -> AsyncIterator[Targets]:
    """Fresh onehit-proxies for one cell, ``spec.instances`` of them; with ``disk_size``,
    each with a disk tier of that many bytes in a temporary directory of its own."""
    admission = spec.admission
    size *= spec.cache_scale
    settings = {
        "cache.size": str(size),
        "cache.max_object_size": str(min(size, 16 << 20)),
        "cache.eviction": spec.eviction,
        "admission.policy": admission.policy,
        "admission.window": str(admission.window),
        "admission.expected_urls": str(admission.capacity),
        "admission.fp_rate": str(admission.fp_rate),
        "admission.generations": str(admission.generations),
        "admission.max_window": str(admission.max_window),
        "admission.auto_scale": str(admission.auto_scale),
        **extra,
    }
    async with contextlib.AsyncExitStack() as stack:
        fleet = []
        for _ in range(spec.instances):
            own = dict(settings)
            if disk_size:
                directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="onehit-disk-"))
                own.update({"disk.path": directory, "disk.size": str(disk_size),
                            "disk.region_size": str(max(1 << 20, disk_size // 8))})  # fmt: skip
            fleet.append(await stack.enter_async_context(onehit_process(origin, own)))
        urls, admins = [r.url for r in fleet], [r.admin_url for r in fleet]
        if spec.balancer != "client":
            urls = [await stack.enter_async_context(_balancer(urls, spec.balancer))]
        yield Targets(urls, admins)


@contextlib.asynccontextmanager
async def _balancer(backends: list[str], balancing: str) -> AsyncIterator[str]:
    """nginx in front of ``backends``, balancing by ``balancing``: its base URL."""
    async with _nginx_process(
        lambda root, port: nginx_balancer_config(root, port, backends, balancing), BALANCER_PROBE
    ) as (url, _):
        yield url


@contextlib.asynccontextmanager
async def nginx_cell(origin: str, size: int) -> AsyncIterator[Targets]:
    """nginx with proxy_cache_min_uses 2 and a cache of ``size`` bytes, configured here."""
    async with _nginx_process(lambda root, port: nginx_config(root, port, origin, size), "/") as (
        url,
        root,
    ):
        yield Targets([url], [], root / "cache")


@contextlib.asynccontextmanager
async def _nginx_process(
    configure: Callable[[Path, int], Path], probe: str
) -> AsyncIterator[tuple[str, Path]]:
    """An nginx of our own on a free loopback port, configured by ``configure(root, port)``
    in a fresh directory, answering ``probe``: (its base URL, that directory). Stopped on
    leaving. Callers skip their cells when nginx is not installed."""
    binary = nginx_binary()
    assert binary is not None, "callers skip nginx cells when nginx is not installed"
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="onehit-nginx-") as directory:
        root = Path(directory)
        config = configure(root, port)
        async with _child(binary, "-c", str(config), "-p", directory) as (process, said):
            url = f"http://127.0.0.1:{port}"
            await _wait_healthy(url + probe, process, said)
            yield url, root


async def admin_stats(admin_url: str) -> dict[str, Any]:
    """A onehit admin listener's ``/stats``."""
    async with aiohttp.ClientSession() as session, session.get(admin_url + "/stats") as r:
        return await r.json()


async def admin_metrics(admin_url: str) -> dict[str, Any]:
    """The ``metrics`` of a onehit admin listener's ``/stats``."""
    return (await admin_stats(admin_url))["metrics"]


@contextlib.asynccontextmanager
async def redis_process(*options: str, port: int | None = None) -> AsyncIterator[str | None]:
    """A redis-server of the caller's own on a free loopback port (or ``port``), with extra
    command-line ``options``, answering: its URL; None when redis-server is not installed.
    Stopped on leaving."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="onehit-redis-") as data:
        process = await asyncio.create_subprocess_exec(
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", data,
            *options, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"redis://127.0.0.1:{port}/0"
            for _ in range(100):
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.05)
            yield url
        finally:
            await _stop(process)


@contextlib.asynccontextmanager
async def redis_cluster_process(nodes: int = 3, replicas: int = 0) -> AsyncIterator[str | None]:
    """A Redis Cluster of the caller's own on loopback, ``nodes`` servers of which each master
    has ``replicas`` replicas, joined by ``redis-cli --cluster create`` and answering: one
    node's URL (clients discover the rest); None when redis-server or redis-cli is not
    installed. Stopped on leaving."""
    cli = shutil.which("redis-cli")
    if cli is None or shutil.which("redis-server") is None:
        yield None
        return
    async with contextlib.AsyncExitStack() as stack:
        cluster_options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        urls = [
            await stack.enter_async_context(redis_process(*cluster_options, port=_port_with_bus()))
            for _ in range(nodes)
        ]
        addresses = [url.removeprefix("redis://").removesuffix("/0") for url in urls]
        create = await asyncio.create_subprocess_exec(
            cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas),
            "--cluster-yes",
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(create.communicate(), 30)
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {err.decode().strip()}")
        host, port = addresses[0].split(":")
        for _ in range(300):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"CLUSTER INFO\r\n")
            info = await reader.read(4096)
            writer.close()
            if b"cluster_state:ok" in info:
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("the Redis Cluster did not reach cluster_state:ok within 30 s")
        yield urls[0]


def _port_with_bus(offset: int = 10_000) -> int:
    """A free port whose cluster bus port (``port + offset``) is free and valid too."""
    for _ in range(100):
        port = free_port()
        if port + offset <= 65_535:
            with socket.socket() as probe, contextlib.suppress(OSError):
                probe.bind(("127.0.0.1", port + offset))
                return port
    raise RuntimeError("no free port with a free cluster bus port")
