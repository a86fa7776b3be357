"""Experiment files: what an experiment is (workloads x policies x cache sizes, simulated,
live or both), read from TOML with every key checked.

An experiment file (``config/experiments/*.toml``)::

    title = "..."
    mode = "both"                      # "simulate", "live" or "both"
    cache_sizes = ["0.5%", "2%"]       # bytes, or a share of each trace's distinct bytes
    [[workloads]]                      # keys of loadgen.traces.workload.WorkloadSpec, plus `name`
    name = "zipf-0.8"                  # (or `trace = "file.csv"` to replay a recorded trace, or
                                       # "real:twitter52"; csv_columns = ["ts", "id", "bytes"];
                                       # requests = 1000000: its first requests only)
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
    disk_size = "32MiB"                # a disk tier behind each live onehit (default: none)
    [flash]                            # simulated: the disk admission family (loadgen.sim.flash)
    memory = "0.1%"                    # one memory tier (a share of distinct bytes, or bytes)
    disk_sizes = ["2.5%", "10%", "25%"]  # behind it, a disk tier of each of these sizes
    memory_admission = "always"        # the memory tier's admission
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from loadgen.live.nginx import BALANCING
from loadgen.sim.simulate import policy_label
from loadgen.traces.real_traces import REAL, TRACES, TraceUnavailable, fetch
from loadgen.traces.trace import Trace, read_trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.config.settings import read_toml, shared_filter_refused
from proxy.config.values import eviction as values_eviction
from proxy.core.admission import AdmissionConfig, parse_policy
from proxy.core.names import unknown_name
from proxy.core.units import parse_duration, parse_size

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
    # A disk tier of this many bytes behind each live onehit, in a directory of its own made
    # for the cell (0: none), admitting by second hit.
    disk_size: int = 0


@dataclass(frozen=True)
class FlashSettings:
    """The flash question for each workload (``loadgen.sim.flash``): the disk admission family
    behind one memory tier, at each disk size (sizes as ``cache_sizes`` takes them)."""

    memory: str = "0.1%"
    disk_sizes: tuple[str, ...] = ("2.5%", "10%", "25%")
    memory_admission: str = "always"


@dataclass(frozen=True)
class Workload:
    name: str
    spec: WorkloadSpec | None = None
    trace_path: Path | None = None
    # The trace as the file names it (``real:NAME``, or a file's name), and a CSV's columns.
    given: str = ""
    columns: tuple[str, ...] | None = None
    # A trace's first requests only (``requests = 1_000_000``); None: all of them.
    requests: int | None = None

    def trace_file(self) -> Path | None:
        """The file its requests are read from (a real trace's, fetched on first use); None
        for a generated workload."""
        if self.given.startswith(REAL):
            try:
                return fetch(self.given.removeprefix(REAL))
            except TraceUnavailable as exc:
                raise ExperimentError(f"workload {self.name!r}: {exc}") from None
        return self.trace_path

    def trace(self, path: Path | None = None) -> Trace:
        """Its requests: from ``path`` (its ``trace_file``, found already) or read."""
        path = path or self.trace_file()
        if path is not None:
            trace = read_trace(path, self.columns)
            return trace if self.requests is None else trace.head(self.requests)
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
        if parse_policy(self.admission.policy)[0] != "second-hit":
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
    flash: FlashSettings | None = None  # the disk admission family, simulated (``[flash]``)
    # The file it was read from (its digest goes in the report): not what the experiment is.
    source: Path | None = field(default=None, compare=False)

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
        "sample", "flash",
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
        meta={"experiment": path.name},  # its name: a report holds no path of the machine
        source=path,
        sample=None if sample is None else float(sample),
        flash=_flash(data["flash"], f"{where} [flash]") if "flash" in data else None,
    )


def _only(table: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ExperimentError(unknown_name(f"key in {where}:", key, allowed))


def _workload(table: dict[str, Any], where: str, base: Path) -> Workload:
    allowed = {f.name for f in fields(WorkloadSpec)} | {"name", "trace", "csv_columns"}
    _only(table, allowed, where)
    name = str(table.get("name", "workload"))
    columns = table.get("csv_columns")
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",")]
    if columns is not None and (
        not isinstance(columns, list) or len(columns) != 3 or not all(isinstance(c, str)
                                                                       for c in columns)
    ):  # fmt: skip
        raise ExperimentError(
            f"{where}: csv_columns is three names or positions, time, key and size: "
            f"['ts', 'id', 'bytes'] or '1,2,4', not {columns!r}"
        )
    if "trace" in table:
        named = None if columns is None else tuple(columns)
        given = str(table["trace"])
        first = table.get("requests")
        if first is not None and (type(first) is not int or first < 1):
            raise ExperimentError(
                f"{where}: requests is how many of the trace's first requests are replayed, "
                f"a whole number: not {first!r}"
            )
        if given.startswith(REAL):
            if given.removeprefix(REAL) not in TRACES:
                raise ExperimentError(f"{where}: trace {given!r}: the real traces are "
                                      f"{', '.join(REAL + n for n in sorted(TRACES))}")  # fmt: skip
            return Workload(name, given=given, columns=named, requests=first)
        return Workload(name, trace_path=(base / given).resolve(), given=Path(given).name,
                        columns=named, requests=first)  # fmt: skip
    if columns is not None:
        raise ExperimentError(f'{where}: csv_columns goes with a trace = "file.csv"')
    values = {k: v for k, v in table.items() if k not in ("name", "trace", "csv_columns")}
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
    try:
        eviction = values_eviction(eviction)
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    if eviction == "auto":
        raise ExperimentError(
            f"{where}: eviction = 'auto': an experiment's simulated cells have no tuner yet; "
            "name an eviction, or run onehit-loadgen simulate --eviction auto"
        )
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
    if said := shared_filter_refused(backend, values.get("policy", "second-hit")):
        raise ExperimentError(f"{where}: {said}")
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


def _flash(table: object, where: str) -> FlashSettings:
    if not isinstance(table, dict):
        raise ExperimentError(f"{where}: expected a table ([flash]), got {table!r}")
    _only(table, {f.name for f in fields(FlashSettings)}, where)
    values = dict(table)
    sizes = values.get("disk_sizes", FlashSettings.disk_sizes)
    if not isinstance(sizes, list | tuple) or not sizes:
        raise ExperimentError(f"{where}: disk_sizes = {sizes!r}: expected a list like "
                              '["2.5%", "10%", "25%"]')  # fmt: skip
    values["disk_sizes"] = tuple(str(size) for size in sizes)
    admission = values.get("memory_admission", FlashSettings.memory_admission)
    try:
        if parse_policy(admission)[0] == "auto":
            raise ValueError("memory_admission = 'auto': auto is a disk tier's (use 'adaptive')")
        values["memory"] = str(values.get("memory", FlashSettings.memory))
        for size in (values["memory"], *values["disk_sizes"]):
            _positive_size_or_share(size)
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    return FlashSettings(**values)


def _positive_size_or_share(text: str) -> None:
    """ValueError unless ``text`` is a size of a byte or more, or a share above 0%."""
    text = text.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            raise ValueError(f"{text!r} is not a share like 10%") from None
        if not 0 < share < float("inf"):
            raise ValueError(f"{text!r}: a share above 0%, like 10%")
    elif parse_size(text) < 1:
        raise ValueError(f"{text!r}: a size of at least one byte")


def _live(table: dict[str, Any], where: str) -> LiveSettings:
    _only(table, {f.name for f in fields(LiveSettings)}, where)
    values = dict(table)
    try:
        for key in ("origin_latency", "max_seconds"):
            if key in values:
                values[key] = parse_duration(values[key])
        if "disk_size" in values:
            values["disk_size"] = parse_size(values["disk_size"])
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    return LiveSettings(**values)


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
        live=LiveSettings(concurrency=4, origin_latency=0.002, disk_size=32 << 20),
        meta={"embedded defaults": "onehit-loadgen demo"},
    )
