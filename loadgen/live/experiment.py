"""Experiments run: every cell of workloads x policies x cache sizes, simulated, live, or both,
into one report.

Every cell of a workload replays the same trace. Live cells each get a fresh proxy (a
subprocess on loopback ports the kernel picks, which it names once it listens) in front of one
embedded origin; the proxy's own /stats are kept beside what the client saw, and any
disagreement between the two is flagged in the report. A proxy or origin that does not start
fails the run with what it wrote to its standard error.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen.live.experiment_file import Experiment, FlashSettings, Workload
from loadgen.live.nginx import nginx_binary
from loadgen.live.processes import (
    admin_stats,
    nginx_cell,
    onehit_cell,
    origin_process,
    redis_process,
)
from loadgen.live.replay import ReplayConfig, replay
from loadgen.reports import report
from loadgen.reports.provenance import provenance
from loadgen.sim.cluster import cluster_sweep
from loadgen.sim.flash import flash_sweep
from loadgen.sim.simulate import (
    Sample,
    SimResult,
    describe_cell,
    resolve_sizes,
    sample_trace,
    sample_warnings,
    sweep,
)
from loadgen.traces.trace import Trace
from proxy.core.stats import METRICS, combine
from proxy.core.store import ENTRY_OVERHEAD
from proxy.core.units import format_size

Say = Callable[[str], None]


def run(
    experiment: Experiment,
    output: Path,
    *,
    workers: int | None = None,
    say: Say = print,
    cluster: str | None = None,
) -> list[Path]:
    """Run every cell, write the report under ``output``; returns the files written. With
    ``cluster`` (a Dask scheduler's address) the simulated cells of unsampled workloads run
    there, a task per policy; the workers read a workload's trace file by its path, or
    generate its trace from its spec."""
    cells: list[report.Cell] = []
    flash: list[report.Cell] = []
    started, began = time.perf_counter(), time.time()
    meta = dict(experiment.meta)
    traces: dict[str, Path | None] = {}
    for workload in experiment.workloads:
        path = workload.trace_file()
        trace = workload.trace(path)
        # By workload: two workloads' files of one name are two traces.
        source = workload.given or f"generated: {workload.spec.describe()}"
        traces[f"{workload.name}: {source}"] = path
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
                if warnings := sample_warnings(source, sizes):
                    meta[f"sampling warning {workload.name}"] = "; ".join(warnings)
                    for warning in warnings:
                        say(f"{workload.name}: {warning}")
            pairs = [(p.admission, p.eviction) for p in simulable]

            def progress(done: int, total: int, r: SimResult) -> None:
                say(f"  [{done}/{total}] {describe_cell(r)}")

            # A cluster's workers read the whole file: a trace's prefix is run here.
            if cluster is not None and experiment.sample is None and workload.requests is None:
                named = path or workload.spec
                assert named is not None
                results = cluster_sweep(cluster, named, workload.columns, list(sizes), pairs,
                                        entry_overhead=ENTRY_OVERHEAD, report=progress)  # fmt: skip
            else:
                results = sweep(source, list(sizes), pairs, workers=workers, report=progress)
            cells += [report.sim_cell(r, workload.name, sizes[r.cache_bytes]) for r in results]
        if experiment.flash is not None:
            flash += _flash_cells(experiment.flash, workload.name, trace, workers, say)
        if experiment.run_live:
            live_sizes = sizes
            if experiment.live_cache_sizes is not None:
                live_sizes = resolve_sizes(experiment.live_cache_sizes, trace)
            cells += asyncio.run(_live_cells(experiment, workload, trace, live_sizes, say))
    meta["elapsed"] = f"{time.perf_counter() - started:.0f}s"
    results_doc = {"title": experiment.title, "meta": meta, "cells": cells,
                   "provenance": provenance(traces, began, configs=[
                       p for p in (experiment.source,) if p is not None])}  # fmt: skip
    if flash:
        results_doc["flash"] = flash
    written = report.write_report(output, results_doc)
    if finding := report.verdict(cells):
        say(finding)
    say(report.text_table(cells))
    if rows := report.headline(cells):
        say("\nheadline\n" + report.aligned(*report.headline_columns(rows), left=3))
    if rows := report.agreement(cells):
        say("\nlive against simulated\n" + report.aligned(report.AGREEMENT, rows, left=3))
    if rows := _disk_rows(cells):
        say("\nthe disk tier behind each live proxy\n" + report.aligned(DISK_COLUMNS, rows, left=3))
    return written


def _flash_cells(
    settings: FlashSettings, workload: str, trace: Trace, workers: int | None, say: Say
) -> list[report.Cell]:
    """The disk admission family behind one memory tier, at each disk size (``[flash]``)."""
    memory = next(iter(resolve_sizes([settings.memory], trace, "[flash] memory")))
    disks = list(resolve_sizes(settings.disk_sizes, trace, "[flash] disk size"))
    say(f"{workload}: the flash tier, {len(disks)} disk sizes behind {format_size(memory)}")
    cells = flash_sweep(trace, workload, memory, disks, entry_overhead=ENTRY_OVERHEAD,
                        memory_admission=settings.memory_admission, workers=workers)  # fmt: skip
    say(report.flash_table(cells))
    return cells


# What the live cells keep of their disk tiers' /stats, and the table of it.
DISK_SHOWN = ("bytes_written", "bytes_not_written", "hits", "admissions", "rejected")
# The disk's admission is its own: the memory policy of the cell does not choose it.
DISK_COLUMNS = ("workload", "memory policy", "cache", "disk admission", "disk written",
                "disk spared", "disk hits")  # fmt: skip


def _disk_rows(cells: list[report.Cell]) -> list[list[str]]:
    return [
        [c["workload"], c["policy"], c["cache"], c["disk"]["admission"],
         format_size(c["disk"]["bytes_written"]), format_size(c["disk"]["bytes_not_written"]),
         f"{c['disk']['hits']:,}"]
        for c in cells if "disk" in c
    ]  # fmt: skip


def _describe(workload: Workload, trace: Trace) -> str:
    source = f"trace {workload.given}" if workload.given else workload.spec.describe()
    if workload.requests is not None:
        source += f", its first {workload.requests:,} requests"
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
                    starter = nginx_cell(origin_url, size)
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
                    starter = onehit_cell(origin_url, size, spec, shared, live.disk_size)
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
                    every = [await admin_stats(a) for a in admins]  # one /stats each
                    stats = combine([e["metrics"] for e in every]) if every else None
                    disk = [e["disk"] for e in every] if live.disk_size else []
                    disk_admission = every[0]["config"]["disk_admission"] if disk else None
                    held = None if running.disk_cache is None else _tree_bytes(running.disk_cache)
                cell = _live_cell(workload.name, spec.label(), label, size, client, stats, held)
                if len(every) == 1 and every[0].get("whatif"):  # one proxy's ghosts
                    cell["whatif"] = every[0]["whatif"]
                if disk:
                    cell["disk"] = {k: sum(d[k] for d in disk) for k in DISK_SHOWN}
                    cell["disk"]["admission"] = disk_admission
                cells.append(cell)
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
