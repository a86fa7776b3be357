"""``onehit-loadgen``: generate traces and replay them offline through the cache core."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from loadgen.reports import report
from loadgen.reports.provenance import provenance
from loadgen.reports.report import render
from loadgen.sim.cluster import cluster_sweep
from loadgen.sim.simulate import (
    Sample,
    SimResult,
    describe_cell,
    policy_label,
    progress_line,
    resolve_sizes,
    sample_trace,
    sample_warnings,
    simulate,
    sweep,
)
from loadgen.sim.split import split_table
from loadgen.sim.tiers import DiskSpec, tier_cells
from loadgen.traces.real_traces import REAL, TRACES, TraceUnavailable, fetch
from loadgen.traces.trace import Trace, TraceError, read_trace, write_trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.config import values
from proxy.config.settings import Config, ConfigError, load
from proxy.core.admission import POLICIES, AdmissionConfig, parse_policy
from proxy.core.cachekey import KeyQuery
from proxy.core.evictions import EVICTIONS
from proxy.core.store import ENTRY_OVERHEAD
from proxy.core.ttl_rules import TtlRules
from proxy.core.tuning import TuneSettings, auto
from proxy.core.units import format_size, parse_duration, parse_size


class UsageError(Exception):
    """A flag value the user must fix; printed as one line, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (UsageError, TraceError, ValueError) as exc:  # ExperimentError is a ValueError
        print(f"onehit-loadgen {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"onehit-loadgen {args.command}: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onehit-loadgen",
        description="Generate CDN-like traffic and measure cache-on-second-hit admission.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("gen", help="generate a synthetic Zipf trace")
    _workload_flags(gen)
    gen.add_argument("-o", "--output", required=True, type=Path,
                     help=".csv, .txt (separated by spaces) or oracleGeneral file")  # fmt: skip
    gen.set_defaults(run=_cmd_gen)

    sim = sub.add_parser(
        "simulate",
        help="replay a trace through the cache core (a sweep when given several values)",
    )
    _trace_flags(sim)
    _cache_flags(sim)
    sim.add_argument(
        "--sample",
        help="spatial sampling (SHARDS): simulate only the keys whose hash falls under this "
        "rate (0.01 or 1%%), with the cache and the filter scaled to match",
    )
    sim.add_argument(
        "--tune-sample",
        default="auto",
        help="--eviction auto: the share of keys the tuner's ghosts are fed (default auto, "
        "as [tune] sample)",
    )
    sim.add_argument(
        "--tune-period",
        default="auto",
        help="--eviction auto: sampled requests between the tuner's judgements (default "
        "auto, as [tune] period)",
    )
    sim.add_argument(
        "--tune-config",
        type=Path,
        help="--eviction auto: every [tune] setting from this proxy configuration file, as "
        "the live proxy reads it (not with --tune-sample or --tune-period)",
    )
    sim.add_argument(
        "--disk-size",
        help="a disk tier of this many bytes (or a share of the trace's distinct bytes, as "
        "10%%) behind the memory tier (two tiers; not with --sample)",
    )
    sim.add_argument(
        "--disk-admission", default="second-hit", help="comma-separated, as --admission"
    )
    sim.add_argument("--region-size", default="16MiB", help="the disk tier's region size")
    sim.add_argument(
        "--disk-write-rate", default="0", help="the disk's write budget, bytes a second (0: none)"
    )
    sim.add_argument(
        "--key-query",
        default="all",
        help="which query parameters of the trace's URL keys make up the cache key, as the "
        "proxy's [cache] key_query: all, none, include:a,b or exclude:utm_source",
    )
    sim.add_argument(
        "--key-query-sort", action="store_true", help="keyed parameters sorted by name"
    )
    sim.add_argument(
        "--cluster",
        help="run the cells on the Dask scheduler at this address (tcp://host:8786), one task "
        "per policy; the workers read --trace by its path",
    )
    sim.add_argument(
        "--workers-split",
        type=int,
        help="N worker processes, requests spread at random over them: one cache against N "
        "with private and with shared admission windows, memory divided or N times",
    )
    sim.add_argument(
        "--ttl",
        help="how long every response stays fresh, as an origin's max-age (10m, 3600); "
        "none: responses never expire",
    )
    sim.add_argument(
        "--ttl-rules",
        type=Path,
        help="the operator's TTL rules ([[ttl]] in this proxy configuration file) applied to "
        "every response, as the proxy applies them: a default where --ttl gives none, a "
        "floor, a cap, by host, path and status",
    )
    sim.add_argument("--json", action="store_true", help="print results as JSON")
    sim.add_argument("--report-dir", type=Path, help="also write results.json and summary.md here")
    sim.set_defaults(run=_cmd_simulate)

    origin = sub.add_parser("origin", help="serve a trace's objects as an origin")
    _trace_flags(origin)
    origin.add_argument("--host", default="127.0.0.1")
    origin.add_argument("--port", type=int, default=9000)
    origin.add_argument("--latency", default="0", help="added to every response, e.g. 2ms")
    origin.add_argument("--latency-sigma", type=float, default=0.0, help="lognormal spread")
    origin.add_argument("--max-age", type=int, default=3600, help="Cache-Control max-age")
    origin.set_defaults(run=_cmd_origin)

    rep = sub.add_parser("replay", help="replay a trace over HTTP against any target")
    _trace_flags(rep)
    rep.add_argument("--target", required=True, help="base URL; requests go to TARGET/obj/KEY")
    how = rep.add_mutually_exclusive_group()
    how.add_argument("--concurrency", type=int, default=1, help="closed loop connections")
    how.add_argument("--rate", type=float, help="open loop at this many requests/s")
    how.add_argument("--trace-time", action="store_true", help="open loop at the trace's times")
    rep.add_argument("--speed", type=float, default=1.0, help="with --trace-time: faster by")
    rep.add_argument("--max-requests", type=int)
    rep.add_argument("--max-seconds", type=float)
    rep.add_argument("--output", type=Path, default=Path("reports/replay"))
    rep.set_defaults(run=_cmd_replay)

    exp = sub.add_parser("experiment", help="run config/experiments/NAME.toml into a report")
    exp.add_argument("file", type=Path)
    exp.add_argument("--output", type=Path, help="report folder (default reports/NAME)")
    exp.add_argument("--workers", type=int, default=None)
    exp.add_argument(
        "--cluster",
        help="run the simulated cells on the Dask scheduler at this address (tcp://host:8786)",
    )
    exp.set_defaults(run=_cmd_experiment)

    rend = sub.add_parser("report", help="re-render a report folder from its results.json")
    rend.add_argument("directory", type=Path)
    rend.set_defaults(run=_cmd_report)

    demo = sub.add_parser("demo", help="the main job on embedded defaults")
    demo.add_argument("--output", type=Path, default=Path("reports/demo"))
    demo.add_argument("--requests", type=int, default=60_000)
    demo.add_argument("--workers", type=int, default=None)
    demo.set_defaults(run=_cmd_demo)
    return parser


def _workload_flags(p: argparse.ArgumentParser) -> None:
    d = WorkloadSpec()
    p.add_argument("--objects", type=int, default=d.objects, help="popular catalogue size")
    p.add_argument("--requests", type=int, default=d.requests)
    p.add_argument("--alpha", type=float, default=d.alpha, help="Zipf exponent")
    p.add_argument(
        "--one-hit-share",
        type=float,
        default=d.one_hit_share,
        help="share of requests to URLs requested exactly once",
    )
    p.add_argument(
        "--sizes",
        default=d.sizes.describe(),
        help="fixed:SIZE or lognormal:median=SIZE,sigma=N,max=SIZE",
    )
    p.add_argument("--churn", type=float, default=d.churn, help="share of ranks renewed per period")
    p.add_argument("--churn-period", type=int, default=d.churn_period, help="requests per period")
    p.add_argument("--rate", type=float, default=d.rate, help="mean arrivals per second")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--crawler-share",
        type=float,
        default=d.crawler_share,
        help="share of requests from a crawler sweeping the catalogue's tail",
    )
    p.add_argument(
        "--crawler-tail",
        type=float,
        default=d.crawler_tail,
        help="the least popular share of the catalogue the crawler sweeps",
    )


def _trace_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace", required=True, type=Path,
        help=".csv, .txt (separated by spaces, as LRB's) or oracleGeneral file, each may be .zst; "
        "or real:NAME, a real trace fetched"
        f" on first use ({', '.join(TRACES)})",
    )  # fmt: skip
    p.add_argument(
        "--csv-columns",
        help="a CSV trace's time,key,size columns: header names (ts,obj,bytes) or 1-based "
        "positions (1,2,4); default: the header time,key,size. For a .txt trace (fields "
        "separated by spaces, as LRB's), positions only; default: 1,2,3",
    )


def _read_trace(args: argparse.Namespace) -> Trace:
    """The trace ``--trace`` names; a real one (``real:NAME``) is fetched first, and
    ``args.trace`` becomes its file."""
    if str(args.trace).startswith(REAL):
        try:
            args.trace = fetch(str(args.trace).removeprefix(REAL))
        except TraceUnavailable as exc:
            raise UsageError(f"--trace: {exc}") from None
    return read_trace(args.trace, _columns(args))


def _columns(args: argparse.Namespace) -> list[str] | None:
    return _split(args.csv_columns) if args.csv_columns else None


def _cache_flags(p: argparse.ArgumentParser) -> None:
    d = AdmissionConfig()
    p.add_argument(
        "--cache-size",
        required=True,
        help="comma-separated sizes: 64MiB, or a percentage of the trace's distinct bytes (1%%)",
    )
    p.add_argument(
        "--admission",
        default="always,second-hit",
        help="comma-separated: " + ", ".join(form for _, _, form in POLICIES.values()),
    )
    p.add_argument(
        "--eviction",
        default="lru",
        help=f"comma-separated: {', '.join(EVICTIONS)}, knobs after colons "
        "(s3fifo:small=0.05:move=1), or auto (the tuner chooses, as [cache] eviction = auto)",
    )
    p.add_argument("--window", default="auto", help="second-hit windows: auto or durations (10m)")
    p.add_argument(
        "--auto-scale",
        default="1",
        help="multiples of the auto generation size to sweep, e.g. 0.25,0.5,1,2,4,8",
    )
    p.add_argument("--capacity", type=int, default=d.capacity, help="keys per fixed window")
    p.add_argument("--fp-rate", type=float, default=d.fp_rate)
    p.add_argument("--generations", type=int, default=d.generations)
    p.add_argument("--max-window", default="1h", help="time ceiling of the auto window")
    p.add_argument("--max-object-size", help="largest object stored (default: the cache size)")
    p.add_argument(
        "--entry-overhead",
        type=int,
        default=ENTRY_OVERHEAD,
        help=f"bytes charged per entry besides its body, as the proxy does (default "
        f"{ENTRY_OVERHEAD}; 0 counts body bytes only, as most cache simulators do)",
    )
    p.add_argument("--workers", type=int, default=None, help="parallel runs (default: CPUs)")


def _tune(args: argparse.Namespace) -> TuneSettings:
    if args.tune_config is not None:
        if args.tune_sample != "auto" or args.tune_period != "auto":
            raise UsageError("--tune-config gives every [tune] setting: not with --tune-sample "
                             "or --tune-period")  # fmt: skip
        return _proxy_config(args.tune_config, "--tune-config").tune_settings()
    try:
        return TuneSettings(sample=auto(values.tune_sample(args.tune_sample)),
                            period=auto(values.tune_period(args.tune_period)))  # fmt: skip
    except ValueError as exc:
        raise UsageError(f"--tune-sample/--tune-period: {exc}") from None


def _proxy_config(path: Path, flag: str) -> Config:
    """The proxy configuration at ``path``, as the proxy reads it (its origin is the
    simulator's to play: the file need not name one); UsageError naming ``flag``."""
    try:
        return load(path, {}, {"upstream.origin": "http://simulated.invalid"})
    except ConfigError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def admissions(args: argparse.Namespace) -> list[AdmissionConfig]:
    """One AdmissionConfig per policy x window x auto scale the flags name."""
    try:
        base = AdmissionConfig(
            capacity=args.capacity,
            fp_rate=args.fp_rate,
            generations=args.generations,
            max_window=parse_duration(args.max_window),
        )
        windows: list[float | str] = [
            w if w == "auto" else parse_duration(w) for w in _split(args.window)
        ]
        scales = [float(s) for s in _split(args.auto_scale)]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out: list[AdmissionConfig] = []
    try:
        for policy in _split(args.admission):
            if parse_policy(policy)[0] != "second-hit":
                out.append(replace(base, policy=policy))
                continue
            for window in windows:
                for scale in scales if window == "auto" else [1.0]:
                    out.append(replace(base, policy=policy, window=window, auto_scale=scale))
    except ValueError as exc:
        raise UsageError(f"--admission: {exc}") from None
    return out


def _cmd_gen(args: argparse.Namespace) -> int:
    spec = _workload(args)
    trace = generate(spec)
    write_trace(trace, args.output)
    print(
        f"wrote {len(trace):,} requests for {trace.distinct_objects():,} objects "
        f"({format_size(trace.distinct_bytes())} distinct) to {args.output}"
    )
    return 0


def _workload(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        objects=args.objects,
        requests=args.requests,
        alpha=args.alpha,
        one_hit_share=args.one_hit_share,
        sizes=SizeSpec.parse(args.sizes),
        churn=args.churn,
        churn_period=args.churn_period,
        rate=args.rate,
        seed=args.seed,
        crawler_share=args.crawler_share,
        crawler_tail=args.crawler_tail,
    )


def _cmd_simulate(args: argparse.Namespace) -> int:
    started, given = time.time(), str(args.trace)
    if args.disk_size and args.sample:
        raise UsageError("--disk-size: two tiers are simulated whole, not with --sample")
    if args.cluster and (args.sample or args.disk_size):
        raise UsageError("--cluster runs whole one-tier sweeps: not with --sample or --disk-size")
    try:
        mode, names = values.key_query(args.key_query)
    except ValueError as exc:
        raise UsageError(f"--key-query: {exc}") from None
    key_query = KeyQuery(mode, frozenset(names), args.key_query_sort)
    if args.cluster and not key_query.identity:
        raise UsageError("--cluster: the workers read the trace as it is: not with --key-query")
    trace = _read_trace(args).keyed(key_query)
    if not len(trace):
        raise UsageError(f"{args.trace} holds no requests")
    try:
        sizes = resolve_sizes(_split(args.cache_size), trace)
    except ValueError as exc:
        raise UsageError(f"--cache-size: {exc}") from None
    configs = admissions(args)
    max_object = parse_size(args.max_object_size) if args.max_object_size else None
    ttl, rules = _freshness(args)
    meta = {"trace": given if given.startswith(REAL) else Path(given).name}
    traces = {given: Path(args.trace)}
    if ttl != math.inf or rules:
        meta["freshness"] = _freshness_said(ttl, rules, args.ttl_rules)
    if rules and (unmatched := _unmatched_rules(trace, rules)):
        meta["ttl_rules_unmatched"] = unmatched
        print(f"onehit-loadgen simulate: --ttl-rules: {unmatched}", file=sys.stderr)
    # Refused before any sampling work, which a refusal would waste.
    evictions = _split(args.eviction)
    try:
        evictions = [values.eviction(e) for e in evictions]
    except ValueError as exc:
        raise UsageError(f"--eviction: {exc}") from None
    policies = [(config, eviction) for eviction in evictions for config in configs]
    tune = _tune(args) if "auto" in evictions else None
    if tune is None and (args.tune_sample != "auto" or args.tune_period != "auto"
                         or args.tune_config is not None):  # fmt: skip
        raise UsageError("--tune-sample, --tune-period and --tune-config are the tuner's: "
                         "give --eviction auto")  # fmt: skip
    if tune is not None and (args.sample or args.disk_size or args.cluster or args.workers_split):
        raise UsageError("--eviction auto: the tuner samples the trace itself and tunes one "
                         "memory tier: not with --sample, --disk-size, --cluster or "
                         "--workers-split")  # fmt: skip
    source: Trace | Sample = trace
    if args.sample:
        source = sample_trace(trace, _rate(args.sample))
        if not len(source.trace):
            raise UsageError(f"--sample {args.sample}: no key of this trace falls in the "
                             "sample: sample more, or simulate whole")  # fmt: skip
        meta["sampling"] = (
            f"spatial (SHARDS) at {source.rate:.4g}: {len(source.trace):,} of {len(trace):,} "
            "requests simulated; counts are estimates for the whole trace, hit ratios are "
            "corrected for the sample's share of requests (SHARDS_adj)"
        )
        if not args.json:
            print(f"sampling: {meta['sampling']}", file=sys.stderr)
        if warnings := sample_warnings(source, sizes):
            meta["sampling warning"] = "; ".join(warnings)
            for warning in warnings:
                print(f"onehit-loadgen simulate: --sample: {warning}", file=sys.stderr)
    if args.workers_split is not None:
        if args.report_dir:
            raise UsageError("--workers-split prints its table: not with --report-dir")
        if ttl != math.inf or rules:
            raise UsageError("--workers-split: responses never expire there: not with --ttl "
                             "or --ttl-rules")  # fmt: skip
        return _simulate_split(args, trace, sizes, configs)
    if args.disk_size:
        return _simulate_tiers(args, trace, sizes, policies, max_object, ttl, rules,
                               _Described(meta, traces, started))  # fmt: skip
    if args.cluster:
        if ttl != math.inf or rules:
            raise UsageError("--cluster: responses never expire there: not with --ttl or "
                             "--ttl-rules")  # fmt: skip
        try:
            results = cluster_sweep(
                args.cluster, args.trace, _columns(args), list(sizes), policies,
                max_object_bytes=max_object, entry_overhead=args.entry_overhead,
                report=None if args.json else _report_cell,
            )  # fmt: skip
        except ConnectionError as exc:
            raise UsageError(f"--cluster: {exc}") from None
    elif len(sizes) * len(policies) == 1:
        (size,) = sizes
        ((config, eviction),) = policies
        progress = None if args.json else progress_line(policy_label(config, eviction))
        results = [
            simulate(
                source,
                size,
                config,
                max_object_bytes=max_object,
                entry_overhead=args.entry_overhead,
                progress=progress,
                eviction=eviction,
                ttl=ttl,
                ttl_rules=rules,
                tune=tune,
            )
        ]
    else:
        results = sweep(
            source,
            list(sizes),
            policies,
            max_object_bytes=max_object,
            entry_overhead=args.entry_overhead,
            workers=args.workers,
            report=None if args.json else _report_cell,
            ttl=ttl,
            ttl_rules=rules,
            tune=tune,
        )
    if not args.json:
        for r in results:
            if r.tuning is not None:
                print(f"tuner at {format_size(r.cache_bytes)}: {r.tuning['said']} "
                      f"({r.tuning['switches']} switches)", file=sys.stderr)  # fmt: skip
    name = args.trace.name
    cells = [report.sim_cell(r, name, sizes[r.cache_bytes]) for r in results]
    report.add_space_saved(cells)
    doc = _Described(meta, traces, started).document(args, f"onehit: {name}", cells)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        if finding := report.verdict(cells):
            print(finding)
        print(report.text_table(cells))
    if args.report_dir:
        for path in report.write_report(args.report_dir, doc):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _freshness(args: argparse.Namespace) -> tuple[float, TtlRules | None]:
    """``--ttl`` (infinite when not given) and the rules of ``--ttl-rules``' file, or None."""
    ttl = math.inf
    if args.ttl:
        try:
            ttl = values.duration(args.ttl)
        except ValueError as exc:
            raise UsageError(f"--ttl: {exc}") from None
        if ttl <= 0:
            raise UsageError(f"--ttl {args.ttl}: a response must stay fresh a while (> 0)")
    if args.ttl_rules is None:
        return ttl, None
    config = _proxy_config(args.ttl_rules, "--ttl-rules")
    if not config.ttl:
        raise UsageError(f"--ttl-rules {args.ttl_rules}: it holds no [[ttl]] rule")
    return ttl, TtlRules(config.ttl)


def _unmatched_rules(trace: Trace, rules: TtlRules) -> str:
    """What a trace whose keys are not URLs (``scheme://host/path``) makes of rules naming a
    host or a path: they match none of its keys (each is read as host "" and path "/")."""
    first = trace.key_strings(0, 1)
    if first and "://" in first[0]:
        return ""
    named = [i for i, rule in enumerate(rules.rules, 1) if rule.host or rule.path != "/"]
    if not named:
        return ""
    which = ", ".join(map(str, named))
    return (f"rule {which} names a host or a path, and this trace's keys are not URLs "
            f"({first[0] if first else 'none'!r}): it matches none of them")  # fmt: skip


def _freshness_said(ttl: float, rules: TtlRules | None, path: Path | None) -> str:
    """How long the simulated responses live, as a report says it."""
    said = "every response has no freshness of its own" if ttl == math.inf else (
        f"every response has max-age={ttl:g}")  # fmt: skip
    if rules:
        said += f"; the {len(rules.rules)} TTL rules of {path.name if path else 'the proxy'}"
    return said


class _Described(NamedTuple):
    """What a simulation's report says of its run besides its cells."""

    meta: dict[str, Any]
    traces: dict[str, Path | None]
    started: float

    def document(self, args: argparse.Namespace, title: str, cells: list[Any]) -> dict[str, Any]:
        """The report's results.json: ``cells`` with the meta and the run's provenance."""
        configs = [] if args.ttl_rules is None else [args.ttl_rules]
        return {"title": title, "meta": self.meta, "cells": cells,
                "provenance": provenance(self.traces, self.started, configs=configs)}  # fmt: skip


def _simulate_tiers(
    args: argparse.Namespace,
    trace: Trace,
    sizes: dict[int, str],
    policies: list[tuple[AdmissionConfig, str]],
    max_object: int | None,
    ttl: float,
    rules: TtlRules | None,
    about: _Described,
) -> int:
    """``simulate --disk-size``: every memory size x policy x disk admission, one by one;
    with ``--report-dir`` a report of them (``about``: what it says of the run)."""
    try:
        # A share of the trace's distinct bytes, as the memory tier's sizes may be.
        (disk_size,) = resolve_sizes([args.disk_size], trace, "disk size")
        region = parse_size(args.region_size)
        rate = parse_size(args.disk_write_rate)
        disks = [DiskSpec(disk_size, region, AdmissionConfig(policy=p), max_write_rate=rate)
                 for p in _split(args.disk_admission)]  # fmt: skip
    except ValueError as exc:
        raise UsageError(f"--disk-size: {exc}") from None
    say = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    results = tier_cells(trace, sizes, policies, disks, max_object, args.entry_overhead, say,
                         ttl, rules)  # fmt: skip
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print(report.tier_table(results, sizes))
        for r in results:
            if r.disk_auto is not None:
                print(f"disk auto behind {sizes[r.cache_bytes]}: {r.disk_auto['choice']} "
                      f"decides ({r.disk_auto['switches']} switches)", file=sys.stderr)  # fmt: skip
    if args.report_dir:
        name = args.trace.name
        cells = [report.sim_cell(r, name, sizes[r.cache_bytes]) for r in results]
        doc = about.document(args, f"onehit: {name}, two tiers", cells)
        for path in report.write_report(args.report_dir, doc):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _simulate_split(
    args: argparse.Namespace, trace: Trace, sizes: dict[int, str], configs: list[AdmissionConfig]
) -> int:
    """``simulate --workers-split N``: for each size and admission, one cache against N."""
    if args.workers_split < 2 or args.sample or args.disk_size or args.cluster:
        raise UsageError("--workers-split: 2 or more workers, one tier, not sampled")
    for size, label in sizes.items():
        for config in configs:
            print(f"{label}, {config.label()}, {args.workers_split} workers:")
            print(split_table(trace, size, config, args.workers_split))
    return 0


def _rate(text: str) -> float:
    """A sampling rate written as 0.01 or 1%."""
    try:
        rate = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"--sample: {text!r} is not a rate like 0.01 or 1%") from None
    if not 0.0 < rate <= 1.0:
        raise UsageError(f"--sample: a rate is above 0 and at most 1 (100%), got {text!r}")
    return rate


def _report_cell(done: int, total: int, result: SimResult) -> None:
    print(f"[{done}/{total}] {describe_cell(result)}", file=sys.stderr, flush=True)


# The live commands import aiohttp when they run: simulate's start-up, a measurable share of a
# short run, stays free of it.


def _cmd_origin(args: argparse.Namespace) -> int:
    from loadgen.live.origin import OriginConfig, start_origin

    trace = _read_trace(args)
    config = OriginConfig(
        max_age=args.max_age,
        latency=parse_duration(args.latency),
        latency_sigma=args.latency_sigma,
    )

    async def serve() -> None:
        runner, origin, url = await start_origin(trace, config, args.host, args.port)
        print(f"serving {len(origin.sizes):,} objects at {url}/obj/KEY", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from loadgen.live.replay import ReplayConfig, replay

    trace = _read_trace(args)
    config = ReplayConfig(
        target=args.target,
        concurrency=args.concurrency,
        rate=args.rate,
        trace_time=args.trace_time,
        speed=args.speed,
        max_requests=args.max_requests,
        max_seconds=args.max_seconds,
        progress=True,
    )
    if config.concurrency < 1 or (config.rate is not None and config.rate <= 0):
        raise UsageError("--concurrency and --rate must be above zero")
    result = asyncio.run(replay(trace, config))
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / "replay.json"
    path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    latency = result.to_dict()["latency_ms"]
    print(
        f"{result.completed:,} responses ({result.requests:,} sent) in {result.elapsed:.1f}s; "
        f"hit ratio {result.hit_ratio:.4f}; errors {dict(result.errors) or 0}; "
        f"latency p50 {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms"
        + ("; interrupted: partial results" if result.interrupted else "")
    )
    print(f"wrote {path}")
    return 130 if result.interrupted else 0


def _cmd_experiment(args: argparse.Namespace) -> int:
    from loadgen.live.experiment import run as run_experiment
    from loadgen.live.experiment_file import load_experiment

    experiment = load_experiment(args.file)
    output = args.output or Path("reports") / args.file.stem
    try:
        written = run_experiment(experiment, output, workers=args.workers, say=_say,
                                 cluster=args.cluster)  # fmt: skip
    except ConnectionError as exc:
        raise UsageError(f"--cluster: {exc}") from None
    print(f"\nreport: {output / 'index.html'} ({len(written)} files)")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    if not (args.directory / "results.json").exists():
        raise UsageError(f"{args.directory}/results.json does not exist")
    for path in render(args.directory):
        print(f"wrote {path}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from loadgen.live.experiment import run as run_experiment
    from loadgen.live.experiment_file import demo_experiment

    experiment = demo_experiment(args.requests)
    written = run_experiment(experiment, args.output, workers=args.workers, say=_say)
    print(f"\nreport: {args.output / 'index.html'} ({len(written)} files)")
    return 0


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
