"""Experiments: workloads x policies x cache sizes, simulated, live, or both, into one report.

An experiment file (``config/experiments/*.toml``)::

    title = "..."
    mode = "both"                      # "simulate", "live" or "both"
    cache_sizes = ["0.5%", "2%"]       # bytes, or a share of each trace's distinct bytes
    [[workloads]]                      # keys of loadgen.workload.WorkloadSpec, plus `name`
    name = "zipf-0.8"                  # (or `trace = "file.csv"` to replay a recorded trace)
    alpha = 0.8
    [[policies]]                       # keys of proxy.core.admission.AdmissionConfig, plus
    policy = "always"                  # instances = 3 and backend = "memory" | "redis" (live:
                                       # a fleet, requests round-robin; redis: one shared filter)
                                       # balancer = "round-robin" | "url-hash": a real nginx in
                                       # front of the fleet (else the client spreads requests)
                                       # cache_scale = 3: each instance's cache is 3x the cell's
                                       # policy = "nginx" runs nginx proxy_cache_min_uses 2 (live)
    [live]
    concurrency = 8                    # or rate = 2000 (open loop); origin_latency = "2ms"

Every cell of a workload replays the same trace. Live cells each get a fresh proxy (a
subprocess on loopback ports the kernel picks, which it names once it listens) in front of one
embedded origin; the proxy's own /stats are kept beside what the client saw, and any
disagreement between the two is flagged in the report. A proxy or origin that does not start
fails the run with what it wrote to its standard error.
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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Any

import aiohttp

from loadgen import report
from loadgen.nginx import (
    BALANCER_PROBE,
    BALANCING,
    nginx_balancer_config,
    nginx_binary,
    nginx_config,
)
from loadgen.replay import ReplayConfig, replay
from loadgen.simulate import (
    Sample,
    describe_cell,
    policy_label,
    resolve_sizes,
    sample_trace,
    sweep,
)
from loadgen.trace import Trace, read_trace, write_trace
from loadgen.workload import SizeSpec, WorkloadSpec, generate
from proxy.config import read_toml
from proxy.core.admission import AdmissionConfig, parse_policy
from proxy.core.names import unknown_name
from proxy.core.stats import METRICS, combine
from proxy.core.store import EVICTIONS
from proxy.units import format_size, parse_duration

NGINX = "nginx"
MODES = ("simulate", "live", "both")


class ExperimentError(ValueError):
    """An experiment file that cannot run; the message names the key."""


@dataclass(frozen=True)
class LiveSettings:
    concurrency: int = 8
    rate: float | None = None
    origin_latency: float = 0.002
    origin_latency_sigma: float = 0.0
    max_requests: int | None = None
    max_seconds: float | None = None
    max_age: int = 3600


@dataclass(frozen=True)
class Workload:
    name: str
    spec: WorkloadSpec | None = None
    trace_path: Path | None = None

    def trace(self) -> Trace:
        if self.trace_path is not None:
            return read_trace(self.trace_path)
        assert self.spec is not None
        return generate(self.spec)


@dataclass(frozen=True)
class PolicySpec:
    """One policy of an experiment: an admission config, run by one proxy or by a fleet."""

    admission: AdmissionConfig
    instances: int = 1
    backend: str = "memory"
    balancer: str = "client"
    cache_scale: int = 1  # each instance's cache is the cell's size times this
    eviction: str = "lru"
    nginx: bool = False  # the peer: nginx proxy_cache_min_uses 2, not onehit

    @property
    def simulable(self) -> bool:
        """The simulator models one onehit cache of the cell's size (with either backend:
        they decide alike)."""
        return not self.nginx and self.instances == 1 and self.cache_scale == 1

    def label(self) -> str:
        if self.nginx:
            return "nginx (min_uses 2)"
        if self.instances == 1:
            scaled = f" ({self.cache_scale}x cache)" if self.cache_scale != 1 else ""
            return policy_label(self.admission, self.eviction) + scaled
        if self.admission.policy != "second-hit":
            return f"{self.admission.label()} x{self.instances}"
        shared = "shared filter" if self.backend == "redis" else "local filters"
        behind = "" if self.balancer == "client" else f" behind nginx {self.balancer}"
        return f"{self.admission.label()} x{self.instances} {shared}{behind}"


@dataclass(frozen=True)
class Experiment:
    title: str
    mode: str
    cache_sizes: tuple[str, ...]
    workloads: tuple[Workload, ...]
    policies: tuple[PolicySpec, ...]
    live: LiveSettings = LiveSettings()
    live_cache_sizes: tuple[str, ...] | None = None  # None: every size in cache_sizes
    meta: dict[str, str] = field(default_factory=dict)
    sample: float | None = None  # simulate a spatial sample of the keys (SHARDS) at this rate

    @property
    def simulated(self) -> bool:
        return self.mode in ("simulate", "both")

    @property
    def run_live(self) -> bool:
        return self.mode in ("live", "both")


def load_experiment(path: str | Path) -> Experiment:
    path = Path(path)
    try:
        data = read_toml(path)
    except ValueError as exc:
        raise ExperimentError(str(exc)) from None
    where = str(path)
    allowed = {
        "title", "mode", "cache_sizes", "live_cache_sizes", "workloads", "policies", "live",
        "sample",
    }  # fmt: skip
    _only(data, allowed, where)
    sample = data.get("sample")
    if sample is not None and (
        not isinstance(sample, int | float) or isinstance(sample, bool) or not 0 < sample <= 1
    ):
        raise ExperimentError(
            f"{where}: sample = {sample!r}: expected a rate above 0 and at most 1, like 0.01"
        )
    mode = data.get("mode", "simulate")
    if mode not in MODES:
        raise ExperimentError(f"{where}: mode = {mode!r}: expected one of {', '.join(MODES)}")
    sizes = data.get("cache_sizes")
    if not isinstance(sizes, list) or not sizes:
        raise ExperimentError(f'{where}: cache_sizes must be a list like ["0.5%", "64MiB"]')
    workloads = tuple(
        _workload(w, f"{where} [[workloads]] #{i + 1}", path.parent)
        for i, w in enumerate(data.get("workloads", [{}]))
    )
    policies = tuple(
        _policy(p, f"{where} [[policies]] #{i + 1}") for i, p in enumerate(data.get("policies", []))
    )
    if not policies:
        raise ExperimentError(f"{where}: at least one [[policies]] table is needed")
    return Experiment(
        title=str(data.get("title", path.stem)),
        mode=mode,
        cache_sizes=tuple(str(s) for s in sizes),
        workloads=workloads,
        policies=policies,
        live=_live(data.get("live", {}), f"{where} [live]"),
        live_cache_sizes=tuple(str(s) for s in data["live_cache_sizes"])
        if "live_cache_sizes" in data
        else None,
        meta={"experiment": str(path)},
        sample=None if sample is None else float(sample),
    )


def _only(table: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ExperimentError(unknown_name(f"key in {where}:", key, allowed))


def _workload(table: dict[str, Any], where: str, base: Path) -> Workload:
    allowed = {f.name for f in fields(WorkloadSpec)} | {"name", "trace"}
    _only(table, allowed, where)
    name = str(table.get("name", "workload"))
    if "trace" in table:
        return Workload(name, trace_path=(base / table["trace"]).resolve())
    values = {k: v for k, v in table.items() if k not in ("name", "trace")}
    try:
        if "sizes" in values:
            values["sizes"] = SizeSpec.parse(str(values["sizes"]))
        return Workload(name, spec=WorkloadSpec(**values))
    except (TypeError, ValueError) as exc:
        raise ExperimentError(f"{where}: {exc}") from None


def _policy(table: dict[str, Any], where: str) -> PolicySpec:
    fleet_keys = {"instances", "backend", "balancer", "cache_scale", "eviction"}
    _only(table, {f.name for f in fields(AdmissionConfig)} | fleet_keys, where)
    name = table.get("policy", "second-hit")
    if name != NGINX:
        try:
            parse_policy(name)
        except ValueError as exc:
            raise ExperimentError(f"{where}: {exc} (or {NGINX!r})") from None
    values = dict(table)
    instances = values.pop("instances", 1)
    backend = values.pop("backend", "memory")
    balancer = values.pop("balancer", "client")
    cache_scale = values.pop("cache_scale", 1)
    eviction = values.pop("eviction", "lru")
    if eviction not in EVICTIONS:
        raise ExperimentError(f"{where}: " + unknown_name("eviction", str(eviction), EVICTIONS))
    if not isinstance(cache_scale, int) or cache_scale < 1:
        raise ExperimentError(
            f"{where}: cache_scale = {cache_scale!r}: expected a whole number >= 1"
        )
    if balancer not in ("client", *BALANCING):
        raise ExperimentError(
            f"{where}: balancer = {balancer!r}: expected 'client', 'round-robin' or 'url-hash'"
        )
    if not isinstance(instances, int) or instances < 1:
        raise ExperimentError(f"{where}: instances = {instances!r}: expected a whole number >= 1")
    if backend not in ("memory", "redis"):
        raise ExperimentError(f"{where}: backend = {backend!r}: expected 'memory' or 'redis'")
    try:
        for key in ("window", "max_window"):
            if key in values and values[key] != "auto":
                values[key] = parse_duration(values[key])
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    nginx = values.get("policy") == NGINX
    if nginx:
        values["policy"] = "second-hit"  # what nginx's min_uses 2 is compared with
    try:
        admission = AdmissionConfig(**values)
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    return PolicySpec(admission, instances, backend, balancer, cache_scale, eviction, nginx)


def _live(table: dict[str, Any], where: str) -> LiveSettings:
    _only(table, {f.name for f in fields(LiveSettings)}, where)
    values = dict(table)
    try:
        for key in ("origin_latency", "max_seconds"):
            if key in values:
                values[key] = parse_duration(values[key])
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    return LiveSettings(**values)


Say = Callable[[str], None]


def run(
    experiment: Experiment, output: Path, *, workers: int | None = None, say: Say = print
) -> list[Path]:
    """Run every cell, write the report under ``output``; returns the files written."""
    cells: list[report.Cell] = []
    started = time.perf_counter()
    meta = dict(experiment.meta)
    for workload in experiment.workloads:
        trace = workload.trace()
        sizes = resolve_sizes(experiment.cache_sizes, trace)
        meta[f"workload {workload.name}"] = _describe(workload, trace)
        simulable = [p for p in experiment.policies if p.simulable]
        if experiment.simulated and simulable:
            say(f"{workload.name}: simulating {len(sizes) * len(simulable)} cells")
            source: Trace | Sample = trace
            if experiment.sample is not None:
                source = sample_trace(trace, experiment.sample)
                meta[f"sampling {workload.name}"] = (
                    f"simulated cells: spatial (SHARDS) at {experiment.sample:g}, "
                    f"{len(source.trace):,} of {len(trace):,} requests; hit ratios corrected "
                    "(SHARDS_adj), counts estimated"
                )
            results = sweep(
                source,
                list(sizes),
                [(p.admission, p.eviction) for p in simulable],
                workers=workers,
                report=lambda done, total, r: say(f"  [{done}/{total}] {describe_cell(r)}"),
            )
            cells += [report.sim_cell(r, workload.name, sizes[r.cache_bytes]) for r in results]
        if experiment.run_live:
            live_sizes = sizes
            if experiment.live_cache_sizes is not None:
                live_sizes = resolve_sizes(experiment.live_cache_sizes, trace)
            cells += asyncio.run(_live_cells(experiment, workload, trace, live_sizes, say))
    meta["elapsed"] = f"{time.perf_counter() - started:.0f}s"
    results_doc = {"title": experiment.title, "meta": meta, "cells": cells}
    written = report.write_report(output, results_doc)
    if finding := report.verdict(cells):
        say(finding)
    say(report.text_table(cells))
    if rows := report.headline(cells):
        say("\nheadline\n" + report.aligned(report.HEADLINE, rows, left=3))
    if rows := report.agreement(cells):
        say("\nlive against simulated\n" + report.aligned(report.AGREEMENT, rows, left=3))
    return written


def _describe(workload: Workload, trace: Trace) -> str:
    source = f"trace {workload.trace_path}" if workload.trace_path else workload.spec.describe()
    return (
        f"{source}: {len(trace):,} requests, {trace.distinct_objects():,} objects, "
        f"{format_size(trace.distinct_bytes())} distinct"
    )


async def _live_cells(
    experiment: Experiment, workload: Workload, trace: Trace, sizes: dict[int, str], say: Say
) -> list[report.Cell]:
    live = experiment.live
    cells = []
    wants_redis = any(p.backend == "redis" for p in experiment.policies)
    redis = redis_process() if wants_redis else contextlib.nullcontext(None)
    async with origin_process(trace, live) as origin_url, redis as redis_url:
        for size, label in sizes.items():
            for n, spec in enumerate(experiment.policies):
                if spec.balancer != "client" and nginx_binary() is None:
                    say(f"{workload.name}: nginx is not installed: {spec.label()} is skipped "
                        "(apt-get install nginx to include it)")  # fmt: skip
                    continue
                if spec.nginx and nginx_binary() is None:
                    say(f"{workload.name}: nginx is not installed: its cells are skipped "
                        "(apt-get install nginx to include them)")  # fmt: skip
                    continue
                if spec.backend == "redis" and redis_url is None:
                    say(f"{workload.name}: redis-server is not installed: {spec.label()} is "
                        "skipped (apt-get install redis-server to include it)")  # fmt: skip
                    continue
                say(f"{workload.name}: live {spec.label()} @ {label}")
                if spec.nginx:
                    starter = _nginx(origin_url, size)
                else:
                    shared = {}
                    if spec.backend == "redis":
                        shared = {
                            "admission.backend": "redis",
                            "admission.redis_url": str(redis_url),
                            "admission.redis_prefix": f"onehit:experiment:{size}:{n}",
                            # Several proxies, the origin and the client share this machine:
                            # a roomy budget measures sharing, not the fallback.
                            "admission.redis_budget": "100ms",
                        }
                    starter = _onehit(origin_url, size, spec, shared)
                async with starter as running:
                    targets = running.urls
                    client = await replay(
                        trace,
                        ReplayConfig(
                            target=targets[0],
                            fanout=tuple(targets[1:]),
                            # A fleet sits behind one name: its cache keys (and shared filter
                            # keys) are the same on every instance only if the Host is.
                            host="fleet.onehit" if len(targets) > 1 else None,
                            concurrency=live.concurrency,
                            rate=live.rate,
                            max_requests=live.max_requests,
                            max_seconds=live.max_seconds,
                            progress=sys.stderr.isatty(),
                        ),
                    )
                    admins = running.admins
                    stats = combine([await admin_metrics(a) for a in admins]) if admins else None
                    held = None if running.disk_cache is None else _tree_bytes(running.disk_cache)
                cells.append(
                    _live_cell(workload.name, spec.label(), label, size, client, stats, held)
                )
    return cells


def _live_cell(
    workload: str,
    policy: str,
    label: str,
    size: int,
    client: Any,
    proxy_stats: dict[str, Any] | None,
    held: int | None = None,
) -> report.Cell:
    """A live cell; ``proxy_stats`` are the metrics the proxies counted (None for nginx);
    ``held`` the bytes an nginx cache held on disk at the end, noted when over its size."""
    seen = client.to_dict()
    if proxy_stats is None:
        # Only what the client saw is known of a target without /stats (nginx).
        stats: dict[str, Any] = dict.fromkeys(METRICS)
        stats.update(
            requests=client.completed,
            hits=client.hits,
            hit_ratio=client.hit_ratio,
            byte_hit_ratio=seen["byte_hit_ratio"],
        )
        disagreements: list[str] = []
    else:
        stats = proxy_stats
        disagreements = _disagreements(f"{workload} {policy} @ {label}", client, stats)
    cell = {
        "workload": workload,
        "mode": "live",
        "policy": policy,
        "cache": label,
        "cache_bytes": size,
        "stats": stats,
        "client": seen,
        "timeline": seen["timeline"],
        "disagreements": disagreements,
    }
    if held is not None and held > size:
        cell["held_bytes"] = held
        cell["notes"] = [
            f"{workload} {policy} @ {label}: its cache held {format_size(held)} on disk at the "
            f"end of the run, {held / size:.1f}x the size it was given (nginx enforces max_size "
            "from its cache manager, which can sleep through a short run); the plots place it "
            "at the bytes it held, so compare it with the curves there"
        ]
    return cell


def _tree_bytes(directory: Path) -> int:
    """Bytes of the files under ``directory``."""
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _disagreements(cell: str, client: Any, stats: dict[str, Any]) -> list[str]:
    out = []
    served_from_cache = stats["hits"] + stats["stale_served"]
    if client.completed != stats["requests"]:
        out.append(
            f"{cell}: client completed {client.completed} requests, proxy counted "
            f"{stats['requests']}"
        )
    if client.hits != served_from_cache:
        out.append(f"{cell}: client saw {client.hits} hits, proxy counted {served_from_cache}")
    return out


def free_port() -> int:
    """A loopback port free now, for servers that cannot say which port the kernel gave them
    (nginx, Redis). Another socket may take it before the server binds it: onehit and the
    embedded origin listen on port 0 and say where instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
LISTENING = re.compile(rb"onehit listening on (http://\S+) \(admin (http://[^)\s]+)\)")


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
async def _onehit(
    origin: str, size: int, spec: PolicySpec, extra: dict[str, str]
) -> AsyncIterator[Targets]:
    """Fresh onehit-proxies for one cell, ``spec.instances`` of them."""
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
        fleet = [
            await stack.enter_async_context(onehit_process(origin, settings))
            for _ in range(spec.instances)
        ]
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
async def _nginx(origin: str, size: int) -> AsyncIterator[Targets]:
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


async def admin_metrics(admin_url: str) -> dict[str, Any]:
    """The ``metrics`` of a onehit admin listener's ``/stats``."""
    async with aiohttp.ClientSession() as session, session.get(admin_url + "/stats") as r:
        return (await r.json())["metrics"]


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


def demo_experiment(requests: int = 60_000) -> Experiment:
    """The main job on embedded defaults: LRU against second hit, live and simulated."""
    return Experiment(
        title="onehit demo: plain LRU against cache-on-second-hit",
        mode="both",
        cache_sizes=("0.5%", "1%", "2%", "5%", "10%", "20%"),
        live_cache_sizes=("5%",),
        workloads=(
            Workload(
                "zipf-0.8",
                WorkloadSpec(
                    objects=10_000, requests=requests, alpha=0.8, one_hit_share=0.25, rate=2000.0
                ),
            ),
        ),
        policies=(
            PolicySpec(AdmissionConfig(policy="always")),
            PolicySpec(AdmissionConfig(policy="second-hit")),
        ),
        live=LiveSettings(concurrency=4, origin_latency=0.002),
        meta={"embedded defaults": "onehit-loadgen demo"},
    )
