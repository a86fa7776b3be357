"""``onehit-loadgen``: generate traces and replay them offline through the cache core."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from loadgen import report
from loadgen.simulate import describe_cell, progress_line, simulate, sweep
from loadgen.trace import Trace, TraceError, read_trace, write_trace
from loadgen.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import POLICIES, AdmissionConfig, unknown_name
from proxy.units import format_size, parse_duration, parse_size


class UsageError(Exception):
    """A flag value the user must fix; printed as one line, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (UsageError, TraceError, ValueError) as exc:
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
    gen.add_argument("-o", "--output", required=True, type=Path, help=".csv or oracleGeneral file")
    gen.set_defaults(run=_cmd_gen)

    sim = sub.add_parser(
        "simulate",
        help="replay a trace through the cache core (a sweep when given several values)",
    )
    sim.add_argument("--trace", required=True, type=Path)
    _cache_flags(sim)
    sim.add_argument("--json", action="store_true", help="print results as JSON")
    sim.add_argument("--report-dir", type=Path, help="also write results.json and summary.md here")
    sim.set_defaults(run=_cmd_simulate)

    demo = sub.add_parser("demo", help="the main job on embedded defaults")
    demo.add_argument("--output", type=Path, default=Path("reports/demo"))
    demo.add_argument("--requests", type=int, default=2_000_000)
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


def _cache_flags(p: argparse.ArgumentParser) -> None:
    d = AdmissionConfig()
    p.add_argument(
        "--cache-size",
        required=True,
        help="comma-separated sizes: 64MiB, or a percentage of the trace's distinct bytes (1%%)",
    )
    p.add_argument(
        "--admission", default="always,second-hit", help=f"comma-separated: {', '.join(POLICIES)}"
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
    p.add_argument("--workers", type=int, default=None, help="parallel runs (default: CPUs)")


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cache_sizes(text: str, trace: Trace) -> dict[int, str]:
    """Bytes of each size in ``text`` (a percentage means of the trace's distinct bytes)."""
    sizes: dict[int, str] = {}
    footprint: int | None = None
    for part in _split(text):
        if part.endswith("%"):
            try:
                share = float(part[:-1]) / 100
            except ValueError:
                raise UsageError(f"--cache-size {part!r} is not a percentage like 1%") from None
            if footprint is None:
                footprint = trace.distinct_bytes()
            size = round(footprint * share)
        else:
            try:
                size = parse_size(part)
            except ValueError as exc:
                raise UsageError(f"--cache-size: {exc}") from None
        if size < 1:
            raise UsageError(f"--cache-size {part!r} is under one byte")
        sizes[size] = part if part.endswith("%") else format_size(size)
    if not sizes:
        raise UsageError("--cache-size needs at least one size")
    return sizes


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
    for policy in _split(args.admission):
        if policy not in POLICIES:
            raise UsageError(unknown_name("--admission policy", policy, POLICIES))
        if policy != "second-hit":
            out.append(replace(base, policy=policy))
            continue
        for window in windows:
            for scale in scales if window == "auto" else [1.0]:
                out.append(replace(base, policy=policy, window=window, auto_scale=scale))
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
    )


def _cmd_simulate(args: argparse.Namespace) -> int:
    trace = read_trace(args.trace)
    if not len(trace):
        raise UsageError(f"{args.trace} holds no requests")
    sizes = cache_sizes(args.cache_size, trace)
    configs = admissions(args)
    max_object = parse_size(args.max_object_size) if args.max_object_size else None
    if len(sizes) * len(configs) == 1:
        (size,) = sizes
        results = [
            simulate(
                trace,
                size,
                configs[0],
                max_object_bytes=max_object,
                progress=None if args.json else progress_line(configs[0].label()),
            )
        ]
    else:
        results = sweep(
            trace,
            list(sizes),
            configs,
            max_object_bytes=max_object,
            workers=args.workers,
            report=None if args.json else _report_cell,
        )
    table = report.rows(results, sizes)
    meta = {"trace": str(args.trace), "requests": len(trace)}
    if args.json:
        print(json.dumps(report.to_json(table, meta), indent=2))
    else:
        print(report.text_table(table))
    if args.report_dir:
        for path in report.write_reports(args.report_dir, table, meta, f"onehit: {args.trace}"):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _report_cell(done: int, total: int, result: object) -> None:
    print(f"[{done}/{total}] {describe_cell(result)}", file=sys.stderr, flush=True)  # type: ignore[arg-type]


DEMO_SIZES = "0.1%,0.2%,0.5%,1%,2%,5%,10%"


def _cmd_demo(args: argparse.Namespace) -> int:
    spec = WorkloadSpec(objects=200_000, requests=args.requests, alpha=0.8, one_hit_share=0.25)
    print(
        f"onehit demo: {spec.requests:,} requests, Zipf alpha {spec.alpha} over "
        f"{spec.objects:,} objects, {spec.one_hit_share:.0%} of requests to one-hit wonders, "
        f"sizes {spec.sizes.describe()}",
        file=sys.stderr,
    )
    trace = generate(spec)
    sizes = cache_sizes(DEMO_SIZES, trace)
    configs = [AdmissionConfig(policy="always"), AdmissionConfig(policy="second-hit")]
    results = sweep(trace, list(sizes), configs, workers=args.workers, report=_report_cell)
    table = report.rows(results, sizes)
    print(report.text_table(table))
    meta = {
        "workload": (
            f"objects={spec.objects}, requests={spec.requests}, alpha={spec.alpha}, "
            f"one_hit_share={spec.one_hit_share}, sizes={spec.sizes.describe()}, seed={spec.seed}"
        ),
        "distinct_bytes": trace.distinct_bytes(),
        "cache sizes": "percent of the trace's distinct bytes",
        "baseline": "always (plain LRU)",
    }
    written = report.write_reports(args.output, table, meta, "onehit demo: LRU vs second hit")
    print("\nreport: " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
