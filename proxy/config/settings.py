"""The proxy's settings: defaults < TOML file < ``ONEHIT_*`` environment < command-line flags.

Every key lives in one section dataclass below; its metadata holds the parser that checks it.
Any bad value stops start-up with a ``ConfigError`` of one line that names the key, where the
value came from, the bad value and what is expected, with the closest known key for a typo.
Every key ``[section] key`` also reads from the environment as ``ONEHIT_SECTION_KEY``; routes
read from ``ONEHIT_ROUTES`` as ``host=origin,host=origin``.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.config import values
from proxy.core.admission import AdmissionConfig, parse_policy
from proxy.core.disk import DISK_POLICIES, RECORD_HEADER
from proxy.core.store import ENTRY_OVERHEAD
from proxy.core.ttl_rules import DEFAULT_STATUSES, NEVER_RULED, OVERRIDABLE, TtlRule
from proxy.core.tuning import TuneSettings, Tuning, auto
from proxy.core.units import parse_duration
from proxy.core.whatif import (
    DISK_ALTERNATIVES,
    MEMORY_ALTERNATIVES,
    DiskGhosts,
    DiskShape,
    MemoryShape,
    WhatIf,
)

# The largest ``[disk] region_size``: the disk index keeps a record's offset in 32 bits.
MAX_REGION = (1 << 32) - 1
# The smallest ``[cache] slice_size``: every slice costs an origin request.
MIN_SLICE = 64 << 10


class ConfigError(ValueError):
    """A setting that cannot be used; the message is one line a person can act on."""


@dataclass(frozen=True)
class ServerSection:
    listen: tuple[str, int] = values.setting(
        ("127.0.0.1", 8080), values.address, "address clients connect to"
    )
    access_log: bool = values.setting(True, values.boolean, "log one line per request")
    access_log_format: str = values.setting(
        "combined",
        values.log_format,
        "combined (Apache's combined format) or json (one object a line)",
    )
    access_log_file: str = values.setting(
        "", values.string, "file the access log is appended to (reopened on SIGUSR1); empty: stderr"
    )
    access_log_buffer: int = values.setting(
        64 << 10,
        values.log_buffer,
        "access log bytes held before they are written (at most 64 MiB); 0: each line at once",
    )
    access_log_flush: float = values.setting(
        1.0, values.duration, "the access log's held lines are written at least this often"
    )
    workers: int = values.setting(
        1, values.workers, "processes serving the port as one cache, or auto: one per core"
    )
    tls_cert: str = values.setting(
        "", values.string, "PEM certificate chain: the listener speaks TLS (with tls_key)"
    )
    tls_key: str = values.setting("", values.string, "PEM private key of tls_cert")
    proxy_protocol: bool = values.setting(
        False, values.boolean, "each connection begins with a PROXY protocol header (v1 or v2)"
    )
    handover: str = values.setting(
        "", values.string,
        "a Unix socket path where this process offers its listeners to a new one started "
        "with --take-over (an upgrade without a refused connection); empty: none",
    )  # fmt: skip
    purge_from: tuple[str, ...] = values.setting(
        (), values.networks, "addresses a PURGE on the data port is taken from (empty: none)"
    )
    drain_timeout: float = values.setting(
        10.0, values.duration, "on SIGTERM, how long requests may finish"
    )
    event_loop: str = values.setting(
        "auto", values.event_loop, "auto (uvloop where installed, else asyncio), uvloop or asyncio"
    )
    idle_timeout: float = values.setting(
        15.0, values.duration, "longest wait for a whole request head"
    )
    send_timeout: float = values.setting(
        60.0, values.duration, "longest a client may take none of its answer's bytes (then closed)"
    )
    fast_hits: bool = values.setting(
        True,
        values.boolean,
        "answer plain hits as parsed and plain misses outside aiohttp's handler loop",
    )
    max_url_length: int = values.setting(
        8192, values.positive_int, "longest request target (else 414)"
    )
    max_header_size: int = values.setting(
        32768, values.positive_int, "most bytes of header fields (else 431)"
    )
    forward_headers: tuple[str, ...] = values.setting(
        ("*",),
        values.forward_names,
        '"*" or an allow-list of fields a GET/HEAD passes to the origin',
    )
    deny_headers: tuple[str, ...] = values.setting(
        values.DENIED_BY_DEFAULT,
        values.header_names,
        "fields a cacheable GET/HEAD never passes to the origin",
    )
    body_buffer_size: int = values.setting(
        64 << 10, values.size, "request body bytes read before an origin connection is taken"
    )
    body_timeout: float = values.setting(
        60.0, values.duration, "longest wait for the next request body bytes"
    )
    max_streamed_uploads: int = values.setting(
        64,
        values.positive_int,
        "bodies over body_buffer_size streaming to origins at once (else 503)",
    )


@dataclass(frozen=True)
class AdminSection:
    listen: tuple[str, int] = values.setting(("127.0.0.1", 9901), values.address, "admin address")
    token: str = values.setting(
        "", values.string, "bearer token; required when listen is not loopback"
    )


@dataclass(frozen=True)
class CacheSection:
    size: int = values.setting(256 << 20, values.size, "bytes of response bodies held")
    eviction: str = values.setting(
        "lru",
        values.eviction,
        "lru, s3fifo, sieve, wtinylfu or twoq (knobs after colons: s3fifo:small=0.05:move=1), "
        "or auto, the tuner's choice ([tune]): which entry makes room",
    )
    max_object_size: int = values.setting(
        16 << 20, values.size, "largest body stored; larger is streamed (default: 16MiB or size)"
    )
    store_set_cookie: bool = values.setting(
        False, values.boolean, "store responses that carry Set-Cookie (never the Set-Cookie itself)"
    )
    grace: float = values.setting(
        0.0,
        values.optional_duration,
        "how long past its allowance a stale response answers while the "
        "origin fails (as Varnish's grace; 0: only as the response allows)",
    )
    hit_for_miss: float = values.setting(
        5.0, values.optional_duration, "how long an uncacheable URL goes straight to the origin"
    )
    client_revalidation: str = values.setting(
        "honour",
        values.client_revalidation,
        "a client's no-cache, max-age or min-fresh (and Pragma: no-cache): 'honour', at most "
        "one revalidation a second per URL, or 'ignore', as nginx does",
    )
    max_variants: int = values.setting(
        32, values.positive_int, "variants stored per URL (Vary); more pass"
    )
    ignore_cookies: tuple[str, ...] = values.setting(
        values.IGNORED_COOKIES,
        values.cookie_names,
        "cookie names (globs) that do not make a request private",
    )
    key_query: tuple[str, tuple[str, ...]] = values.setting(
        ("all", ()),
        values.key_query,
        'query parameters in the cache key: "all", "none", {include = [...]}, {exclude = [...]}',
    )
    key_query_sort: bool = values.setting(
        False, values.boolean, "sort the keyed query parameters by name (?b&a keys as ?a&b)"
    )
    strip_surrogate_keys: bool = values.setting(
        True, values.boolean, "leave Surrogate-Key and Cache-Tag (purge tags) out of answers"
    )
    slice_size: int = values.setting(
        0,
        values.optional_size,
        "fetch and store GET misses as byte ranges of this size, each on its own (0: off)",
    )
    slice_memory: int = values.setting(
        256 << 20,
        values.size,
        "bytes of slices read from the origin or the disk and not yet written to their "
        "clients, across all requests; past it, a slice waits for room",
    )


@dataclass(frozen=True)
class AdmissionSection:
    policy: str = values.setting(
        "second-hit",
        values.memory_policy,
        "always, second-hit, nth-hit:N, tinylfu, adaptive, probabilistic:P or size-below:BYTES",
    )
    window: float | str = values.setting(
        "auto", values.window, "auto, or how long a first sighting counts"
    )
    expected_urls: int = values.setting(
        1_000_000, values.positive_int, "distinct URLs per fixed window"
    )
    fp_rate: float = values.setting(0.01, values.probability, "false-positive rate of the filter")
    generations: int = values.setting(2, values.positive_int, "filter generations (>= 2)")
    max_window: float = values.setting(3600.0, values.duration, "longest the auto window remembers")
    auto_scale: float = values.setting(
        1.0, values.positive_number, "multiple of the auto generation size"
    )
    backend: str = values.setting(
        "memory", values.backend, "memory (this process) or redis (the fleet)"
    )
    redis_url: str = values.setting(
        "redis://127.0.0.1:6379/0", values.redis_url, "Redis for backend=redis"
    )
    redis_cluster: bool = values.setting(
        False, values.boolean, "redis_url names one node of a Redis Cluster"
    )
    redis_budget: float = values.setting(
        0.005, values.duration, "shortest wait for Redis a miss is given (the budget's floor)"
    )
    redis_budget_max: float = values.setting(
        0.05, values.duration, "longest a miss waits for Redis (never below redis_budget)"
    )
    redis_prefix: str = values.setting(
        "onehit:bf", values.string, "key prefix of the shared filter"
    )


@dataclass(frozen=True)
class UpstreamSection:
    origin: str = values.setting(
        "", values.optional_origin, "default origin for hosts no route names"
    )
    connect_timeout: float = values.setting(2.0, values.duration, "time to connect to the origin")
    read_timeout: float = values.setting(10.0, values.duration, "longest wait for the next bytes")
    total_timeout: float = values.setting(
        60.0, values.duration, "longest a whole origin response may take"
    )
    single_flight_wait: float = values.setting(
        10.0, values.duration, "longest a coalesced miss waits"
    )
    max_connections: int = values.setting(
        512,
        values.positive_int,
        "origin connections in use at most, per origin client (pool, session)",
    )
    idle_timeout: float = values.setting(
        4.0, values.duration, "longest an unused origin connection is kept"
    )
    read_buffer: int = values.setting(
        128 << 10,
        values.size,
        "origin body bytes held per response before reading pauses (at twice)",
    )


@dataclass(frozen=True)
class DiskSection:
    path: str = values.setting(
        "", values.string, "directory of the disk tier's region files; empty: no disk tier"
    )
    size: int = values.setting(1 << 30, values.size, "bytes of region files the disk tier keeps")
    region_size: int = values.setting(
        16 << 20, values.size, "bytes of one region, written sequentially, evicted whole"
    )
    policy: str = values.setting(
        "second-hit",
        values.policy,
        "what the disk takes: always, second-hit, nth-hit:N..., or auto (the best of them)",
    )
    window: float | str = values.setting(
        "auto", values.window, "auto, or how long a first sighting counts for the disk"
    )
    max_write_rate: int = values.setting(
        0, values.optional_size, "bytes a second the disk may be written at most (0: no budget)"
    )
    checkpoint_interval: float = values.setting(
        60.0, values.duration, "how often the disk index is saved (and on a clean stop)"
    )


@dataclass(frozen=True)
class WhatIfSection:
    sample: float = values.setting(
        0.01,
        values.sample_rate,
        "share of keys the what-if's ghost caches are fed (0: no what-if)",
    )
    policies: tuple[str, ...] = values.setting(
        MEMORY_ALTERNATIVES,
        values.policies,
        "memory admissions the what-if compares with the configured one",
    )
    disk_policies: tuple[str, ...] = values.setting(
        DISK_ALTERNATIVES,
        values.disk_policies,
        "disk admissions the what-if compares with [disk] policy",
    )


_TUNE = TuneSettings()


@dataclass(frozen=True)
class TuneSection:
    evictions: tuple[str, ...] = values.setting(
        _TUNE.evictions, values.evictions,
        "with [cache] eviction = auto: the evictions the tuner chooses among (knobs after "
        "colons: s3fifo:small=0.05:move=1); it starts with the first",
    )  # fmt: skip
    admissions: tuple[str, ...] = values.setting(
        (), values.tune_policies,
        "the memory admissions it chooses among (empty: [admission] policy, second-hit, always)",
    )  # fmt: skip
    sample: float | str = values.setting(
        "auto", values.tune_sample,
        "share of keys each candidate's ghost is fed; auto: ghosts of about 2,000 objects of "
        "the mean size of the first 2,000 requests (every key for a cache of fewer)",
    )  # fmt: skip
    period: int | str = values.setting(
        "auto", values.tune_period,
        "sampled requests between two judgements; auto: what a ghost holds, 500 at least",
    )  # fmt: skip
    warmup: int = values.setting(
        _TUNE.warmup, values.positive_int, "judgements before the first choice (ghosts filling)"
    )
    patience: int = values.setting(
        _TUNE.patience, values.positive_int,
        "judgements in a row a candidate must lead by the margin to be chosen",
    )  # fmt: skip
    margin: float = values.setting(
        _TUNE.margin, values.share,
        "the lead, as a share of the recent sampled requests, a candidate needs over the choice",
    )  # fmt: skip


@dataclass(frozen=True)
class Server:
    """One origin server of a route (``[[routes]] servers``): its URL (scheme, host, port),
    its weight, and whether it is a backup, asked only when no primary is up."""

    url: str
    weight: int = 1
    backup: bool = False


@dataclass(frozen=True)
class Probe:
    """A route's active health check (``[[routes]] probe``): ``GET path`` of each server every
    ``interval`` seconds, its answer ``expect`` or the server is down until one is."""

    path: str = "/"
    interval: float = 5.0
    expect: int = 200


@dataclass(frozen=True)
class Route:
    host: str
    # Where its requests go: its one origin, or, with ``servers``, the route's own name for
    # its group (``servers_origin``), which its URLs are built with and which no other
    # route's requests can reach.
    origin: str
    # The route's own [cache] key_query and key_query_sort; None: the [cache] ones.
    key_query: tuple[str, tuple[str, ...]] | None = None
    key_query_sort: bool | None = None
    # Several servers (``proxy.origin.servers``), judged down after ``max_fails`` failures
    # within ``fail_timeout`` seconds; none: ``origin`` alone.
    servers: tuple[Server, ...] = ()
    max_fails: int = 1
    fail_timeout: float = 10.0
    probe: Probe | None = None  # asked of each server, or none: judged by requests alone


@dataclass(frozen=True)
class Config:
    server: ServerSection = ServerSection()
    admin: AdminSection = AdminSection()
    cache: CacheSection = CacheSection()
    admission: AdmissionSection = AdmissionSection()
    upstream: UpstreamSection = UpstreamSection()
    disk: DiskSection = DiskSection()
    whatif: WhatIfSection = WhatIfSection()
    tune: TuneSection = TuneSection()
    routes: tuple[Route, ...] = ()
    ttl: tuple[TtlRule, ...] = ()  # the operator's TTL rules, in order ([[ttl]])

    def admission_config(self) -> AdmissionConfig:
        a = self.admission
        return AdmissionConfig(
            policy=a.policy,
            window=a.window,
            capacity=a.expected_urls,
            fp_rate=a.fp_rate,
            generations=a.generations,
            max_window=a.max_window,
            auto_scale=a.auto_scale,
        )

    def what_if(self, *, machine: bool = False, tuning: Tuning | None = None) -> WhatIf | None:
        """The recorder of sampled requests: the ghost caches ``[whatif]`` asks for, of this
        memory tier and its disk tier (``proxy.core.whatif``), and the tuner's (``tuning``,
        when it goes on from an older recorder, else this configuration's own); None when
        there is neither. A worker of a ``machine`` models its memory tier alone: the disk
        every worker shares is the parent's to model (``disk_what_if``), fed by each."""
        if self.cache.slice_size:  # ghosts would count slices where the cache counts requests
            return None
        tuning = tuning or self.tuning()
        w = self.whatif
        if not w.sample:
            if tuning is None:
                return None
            # The tuner's alone: no ghost of the what-if's, nothing it reports.
            return WhatIf(self._memory_shape(), rate=tuning.rate, scales=(), tuning=tuning)
        return WhatIf(self._memory_shape(), rate=w.sample,
                      disk=None if machine else self._disk_shape(), alternatives=w.policies,
                      disk_alternatives=w.disk_policies, tuning=tuning)  # fmt: skip

    def tune_settings(self) -> TuneSettings:
        """``[tune]`` as the tuner takes it. Where the admission is shared, a fleet's filter
        (``[admission] backend = "redis"``) or a machine's window (``--workers``), the tuner
        chooses the eviction alone: one process admitting otherwise would starve the others'
        window of its sightings (``check_config`` refuses admissions it cannot trade)."""
        t, a = self.tune, self.admission
        admissions = t.admissions or ((a.policy,) if self.admission_shared() else ())
        return TuneSettings(t.evictions, tuple(dict.fromkeys(admissions)), auto(t.sample),
                            auto(t.period), t.warmup, t.patience, t.margin)  # fmt: skip

    def admission_shared(self) -> bool:
        """Whether the memory tier's admission is shared with other processes: a fleet's
        (Redis) or a machine's (``--workers``)."""
        return self.admission.backend == "redis" or self.server.workers > 1

    def tuning(self) -> Tuning | None:
        """The tuner ``[cache] eviction = "auto"`` asks for (``proxy.core.tuning``), at its
        first choice; None for an eviction of the operator's."""
        c = self.cache
        if c.eviction != "auto":
            return None
        return Tuning(c.size, self.admission_config(), self.tune_settings(), c.max_object_size,
                      ENTRY_OVERHEAD)  # fmt: skip

    def disk_what_if(self) -> DiskGhosts | None:
        """The ghosts of the disk tier and its alternatives a machine's parent keeps, each
        behind a ghost of every worker's memory tier (this configuration being a worker's),
        or None when there is no what-if or no disk."""
        disk = self._disk_shape()
        if not self._ghosted() or disk is None:
            return None
        return DiskGhosts(disk, self._memory_shape(), rate=self.whatif.sample,
                          alternatives=self.whatif.disk_policies)  # fmt: skip

    def what_if_key(self) -> tuple[object, ...]:
        """What the what-if's ghosts are built of: a reload that changes any starts them
        afresh (ghosts of the old caches would compare wrong)."""
        return (self.whatif, self._ghosted(), self._memory_shape(), self._disk_shape())

    def tuning_key(self) -> tuple[object, ...]:
        """What the tuner is built of: a reload that changes any starts it afresh, at its
        first choice; one that changes only the what-if's keeps it."""
        c = self.cache
        return (self.tune_settings(), c.eviction, c.slice_size, c.size, c.max_object_size,
                self.admission_config())  # fmt: skip

    def _ghosted(self) -> bool:
        """Whether the what-if has ghosts: a sample, and requests not fetched in slices (the
        ghosts would count slices where the cache counts requests)."""
        return bool(self.whatif.sample) and not self.cache.slice_size

    def behind_largest(self) -> int:
        """The largest body a disk tier of this configuration (a process's, or the tier a
        machine's workers share: ``worker_view``) keeps, up to ``[cache] max_object_size``:
        what a record holds, its region less the most a record's key and meta take (the
        longest URL and header block the proxy accepts, the head and the fields stored
        twice)."""
        c, server = self.cache, self.server
        allowance = RECORD_HEADER + server.max_url_length + 2 * server.max_header_size
        return min(c.max_object_size, self.disk.region_size - allowance)

    def first_eviction(self) -> str:
        """The memory tier's eviction at its start: the configured one, or the tuner's first
        choice."""
        c = self.cache
        if c.eviction != "auto":
            return c.eviction
        return self.tune_settings().choices(self.admission.policy)[0].eviction

    def _memory_shape(self) -> MemoryShape:
        c = self.cache
        return MemoryShape(c.size, self.admission_config(), self.first_eviction(),
                           ENTRY_OVERHEAD, c.max_object_size)  # fmt: skip

    def _disk_shape(self) -> DiskShape | None:
        if not self.disk.path:
            return None
        admission = AdmissionConfig(policy=self.disk.policy, window=self.disk.window)
        return DiskShape(self.disk.size, self.disk.region_size, admission,
                         float(self.disk.max_write_rate))  # fmt: skip

    def route_table(self) -> dict[str, str]:
        """Host (lower-case, no port) -> origin; ``""`` maps to the default origin if any."""
        table = {route.host: route.origin for route in self.routes}
        if self.upstream.origin:
            table[""] = self.upstream.origin
        return table

    def effective(self) -> dict[str, object]:
        """Every setting in force, by section and key, in the units the file takes (bytes,
        seconds, host:port); secrets (the admin token, a Redis password) are redacted."""
        sections: dict[str, dict[str, object]] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            values: dict[str, object] = {}
            for f in fields(section):
                value = getattr(section, f.name)
                values[f.name] = (
                    _join(value) if f.name == "listen"
                    else _key_query_setting(value) if f.name == "key_query"
                    else list(value) if isinstance(value, tuple)
                    else value
                )  # fmt: skip
            sections[name] = values
        if self.admin.token:
            sections["admin"]["token"] = _REDACTED
        redis_url = urlsplit(self.admission.redis_url)
        if redis_url.password:
            netloc = redis_url.netloc.replace(f":{redis_url.password}@", f":{_REDACTED}@", 1)
            sections["admission"]["redis_url"] = redis_url._replace(netloc=netloc).geturl()
        routes = []
        for r in self.routes:
            route: dict[str, object] = {"host": r.host, "origin": r.origin}
            if r.key_query is not None:
                route["key_query"] = _key_query_setting(r.key_query)
            if r.key_query_sort is not None:
                route["key_query_sort"] = r.key_query_sort
            if r.servers:
                route["servers"] = [asdict(s) for s in r.servers]
                route["max_fails"], route["fail_timeout"] = r.max_fails, r.fail_timeout
                if r.probe is not None:
                    route["probe"] = asdict(r.probe)
            routes.append(route)
        ttl = [_ttl_setting(rule) for rule in self.ttl]
        return {**sections, "routes": routes, "ttl": ttl}

    def summary(self) -> dict[str, object]:
        return {
            "listen": _join(self.server.listen),
            "admin": _join(self.admin.listen),
            "cache_size": self.cache.size,
            "max_object_size": self.cache.max_object_size,
            "admission": self.admission_config().label(),
            "disk_admission": self.disk.policy if self.disk.path else None,
            "fp_rate": self.admission.fp_rate,
            "generations": self.admission.generations,
            "routes": {r.host: r.origin for r in self.routes},
            "default_origin": self.upstream.origin or None,
        }


SECTIONS: dict[str, type] = {
    "server": ServerSection,
    "admin": AdminSection,
    "cache": CacheSection,
    "admission": AdmissionSection,
    "upstream": UpstreamSection,
    "disk": DiskSection,
    "whatif": WhatIfSection,
    "tune": TuneSection,
}


_REDACTED = "<redacted>"


def _join(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the config: defaults, then the TOML file, then ``env``, then ``overrides``
    (``"section.key" -> value``, from command-line flags; ``"routes"`` -> list of routes,
    ``"ttl"`` -> list of TTL rules)."""
    env = os.environ if env is None else env
    raw: dict[str, dict[str, tuple[Any, str]]] = {name: {} for name in SECTIONS}
    routes: list[tuple[dict[str, Any], str]] = []
    ttl: list[tuple[dict[str, Any], str]] = []
    if path is not None:
        _read_toml(Path(path), raw, routes, ttl)
    _read_env(env, raw, routes)
    for dotted, value in (overrides or {}).items():
        if dotted == "routes":
            routes = [(r, "command line") for r in value]
            continue
        if dotted == "ttl":
            ttl = [(t, "command line") for t in value]
            continue
        section, _, key = dotted.partition(".")
        _check_key(section, key, "command line")
        raw[section][key] = (value, "command line")
    config = Config(
        **{name: _build(cls, name, raw[name]) for name, cls in SECTIONS.items()},
        routes=tuple(_route(r, source) for r, source in routes),
        ttl=tuple(_ttl_rule(t, source) for t, source in ttl),
    )
    if "max_object_size" not in raw["cache"] and config.cache.max_object_size > config.cache.size:
        # The default (16 MiB) is a ceiling for large caches, not a demand on small ones.
        config = replace(config, cache=replace(config.cache, max_object_size=config.cache.size))
    check_config(config)
    return config


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at ``path``; ValueError says in one line why it cannot be read."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None


def _read_toml(path: Path, raw: dict, routes: list, ttl: list) -> None:
    try:
        data = read_toml(path)
    except ValueError as exc:
        raise ConfigError(f"config {exc}") from None
    source = str(path)
    for name, table in data.items():
        if name == "routes":
            if not isinstance(table, list):
                raise ConfigError(
                    f"{source}: routes must be [[routes]] tables with host and origin"
                )
            routes.extend((r, source) for r in table)
            continue
        if name == "ttl":
            if not isinstance(table, list):
                raise ConfigError(f"{source}: ttl rules must be [[ttl]] tables")
            ttl.extend((t, source) for t in table)
            continue
        _check_key(name, None, source)
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{name}] must be a table of keys")
        for key, value in table.items():
            _check_key(name, key, source)
            raw[name][key] = (value, source)


def _read_env(env: Mapping[str, str], raw: dict, routes: list) -> None:
    known = {
        f"ONEHIT_{section.upper()}_{f.name.upper()}": (section, f.name)
        for section, cls in SECTIONS.items()
        for f in fields(cls)
    }
    for name, value in env.items():
        if not name.startswith("ONEHIT_"):
            continue
        if name == "ONEHIT_ROUTES":
            routes[:] = [(r, name) for r in _env_routes(value)]
            continue
        if name not in known:
            close = difflib.get_close_matches(name, [*known, "ONEHIT_ROUTES"], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"environment: unknown setting {name}{hint}")
        section, key = known[name]
        raw[section][key] = (value, name)


def _env_routes(value: str) -> list[dict[str, str]]:
    out = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        host, eq, origin = item.partition("=")
        if not eq:
            raise ConfigError(
                f"ONEHIT_ROUTES: {item!r} is not host=origin, like cdn.example=http://10.0.0.5:80"
            )
        out.append({"host": host.strip(), "origin": origin.strip()})
    return out


def _check_key(section: str, key: str | None, source: str) -> None:
    if section not in SECTIONS:
        close = difflib.get_close_matches(section, [*SECTIONS, "routes"], n=1)
        hint = f" (did you mean [{close[0]}]?)" if close else ""
        raise ConfigError(
            f"{source}: unknown section [{section}]{hint}; sections are "
            f"{', '.join(f'[{s}]' for s in SECTIONS)}, [[routes]]"
        )
    if key is None:
        return
    names = [f.name for f in fields(SECTIONS[section])]
    if key not in names:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{source}: unknown key {key!r} in [{section}]{hint}; keys are {', '.join(names)}"
        )


def _build(cls: type, section: str, values: dict[str, tuple[Any, str]]) -> Any:
    parsed = {}
    for f in fields(cls):
        if f.name not in values:
            continue
        value, source = values[f.name]
        try:
            parsed[f.name] = f.metadata["parse"](value)
        except ValueError as exc:
            raise ConfigError(f"{source}: [{section}] {f.name} = {value!r}: {exc}") from None
    return replace(cls(), **parsed)


_ROUTE_KEYS = {"host", "origin", "servers", "max_fails", "fail_timeout", "probe", "key_query",
               "key_query_sort"}  # fmt: skip


def _ttl_setting(rule: TtlRule) -> dict[str, object]:
    """A TTL rule as the file takes it (seconds for durations)."""
    setting: dict[str, object] = {
        "host": rule.host,
        "path": rule.path,
        "status": "any" if rule.statuses is None else sorted(rule.statuses),
    }
    for name in ("default", "min", "max"):
        if getattr(rule, name) is not None:
            setting[name] = getattr(rule, name)
    if rule.override:
        setting["override"] = sorted(rule.override)
    return setting


def _key_query_setting(value: tuple[str, tuple[str, ...]]) -> object:
    """A key_query as a file writes it: "all", "none", or {include = [...]}."""
    mode, names = value
    return {mode: list(names)} if names else mode


def _route(table: Any, source: str) -> Route:
    if (
        not isinstance(table, dict)
        or "host" not in table
        or ("origin" in table) == ("servers" in table)
        or not set(table) <= _ROUTE_KEYS
    ):
        raise ConfigError(
            f"{source}: each route needs host and either origin or servers (and may set "
            f"max_fails, fail_timeout, key_query, key_query_sort), got {table!r}"
        )
    host = table["host"]
    if not isinstance(host, str) or not host or "/" in host or ":" in host:
        raise ConfigError(
            f"{source}: route host {host!r}: expected a host name without port, like cdn.example"
        )
    servers = _servers(table, host, source)
    try:
        origin = servers_origin(host.lower()) if servers else values.origin(table["origin"])
    except ValueError as exc:
        raise ConfigError(f"{source}: route {host} origin {table['origin']!r}: {exc}") from None
    if not servers and {"max_fails", "fail_timeout", "probe"} & set(table):
        raise ConfigError(
            f"{source}: route {host}: max_fails, fail_timeout and probe judge a route's "
            "servers: give it servers = [...], or leave them out"
        )
    probe = _probe(table["probe"], host, source) if "probe" in table else None
    try:
        max_fails = values.count(table.get("max_fails", 1))
    except ValueError as exc:
        raise ConfigError(f"{source}: route {host} max_fails: {exc}") from None
    try:
        fail_timeout = values.duration(table.get("fail_timeout", "10s"))
    except ValueError as exc:
        raise ConfigError(f"{source}: route {host} fail_timeout: {exc}") from None
    try:
        key_query = values.key_query(table["key_query"]) if "key_query" in table else None
        key_sort = values.boolean(table["key_query_sort"]) if "key_query_sort" in table else None
    except ValueError as exc:
        raise ConfigError(f"{source}: route {host}: key_query: {exc}") from None
    return Route(host.lower(), origin, key_query, key_sort, servers, max_fails, fail_timeout,
                 probe)  # fmt: skip


def _probe(table: Any, host: str, source: str) -> Probe:
    """A route's ``probe = {path, interval, expect}``."""
    where = f"{source}: route {host} probe"
    if not isinstance(table, dict) or not set(table) <= {"path", "interval", "expect"}:
        raise ConfigError(f'{where}: expected {{path = "/healthz", interval = "5s", '
                          f"expect = 200}}, got {table!r}")  # fmt: skip
    path = table.get("path", "/")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"{where} path {path!r}: expected a path, like /healthz")
    try:
        interval = values.duration(table.get("interval", "5s"))
    except ValueError as exc:
        raise ConfigError(f"{where} interval: {exc}") from None
    if interval < MIN_PROBE_INTERVAL:  # each worker probes each server: a flood otherwise
        raise ConfigError(f"{where} interval {table['interval']!r}: expected at least "
                          f"{MIN_PROBE_INTERVAL:g}s, like 5s")  # fmt: skip
    expect = table.get("expect", 200)
    if isinstance(expect, bool) or not isinstance(expect, int) or not 100 <= expect <= 599:
        raise ConfigError(f"{where} expect {expect!r}: expected a status, like 200")
    return Probe(path, interval, expect)


def servers_origin(host: str) -> str:
    """The origin a route of several servers builds its URLs with: a name under ``.invalid``
    (RFC 2606), never a real origin, so that only the route's own requests reach its group
    (``Upstream.groups``), which sends them to its servers."""
    return f"http://{host}.servers.invalid"


def _servers(table: dict[str, Any], host: str, source: str) -> tuple[Server, ...]:
    """A route's ``servers``: each a URL, or a table of ``url``, ``weight`` and ``backup``,
    in the order given (``/readyz`` names them by their place in it)."""
    given = table.get("servers")
    if given is None:
        return ()
    where = f"{source}: route {host} servers"
    if not isinstance(given, list) or not given:
        raise ConfigError(f"{where}: expected a list, like [\"http://10.0.0.1:80\", "
                          "{url = \"http://10.0.0.2:80\", backup = true}]")  # fmt: skip
    servers = []
    for item in given:
        entry = {"url": item} if isinstance(item, str) else item
        if (
            not isinstance(entry, dict)
            or "url" not in entry
            or not set(entry) <= {"url", "weight", "backup"}
        ):
            raise ConfigError(f"{where}: {item!r}: expected a URL, or {{url, weight, backup}}")
        try:
            url = values.origin(entry["url"])
            weight = values.positive_int(entry.get("weight", 1))
            backup = values.boolean(entry.get("backup", False))
        except ValueError as exc:
            raise ConfigError(f"{where}: {item!r}: {exc}") from None
        servers.append(Server(url, weight, backup))
    if len({s.url for s in servers}) < len(servers):
        raise ConfigError(f"{where}: a server is named twice")
    if all(s.backup for s in servers):
        raise ConfigError(f"{where}: every server is a backup: make one a primary")
    return tuple(servers)


MIN_PROBE_INTERVAL = 0.1

_TTL_KEYS = {"host", "path", "status", "default", "min", "max", "override"}


def _ttl_rule(table: Any, source: str) -> TtlRule:
    """One ``[[ttl]]`` table as a rule (``proxy.core.ttl_rules``); ConfigError naming the key
    and the fix."""
    if not isinstance(table, dict) or not set(table) <= _TTL_KEYS or not table:
        unknown = sorted(set(table) - _TTL_KEYS) if isinstance(table, dict) else []
        raise ConfigError(
            f"{source}: a [[ttl]] rule takes {', '.join(sorted(_TTL_KEYS))}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else f", got {table!r}")
        )
    where = f"{source}: [[ttl]] {table.get('host', '') or '*'}{table.get('path', '/')}"
    host, path = table.get("host", ""), table.get("path", "/")
    if not isinstance(host, str) or "/" in host or ":" in host:
        raise ConfigError(f"{where}: host {host!r}: expected a host name without port, or none")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"{where}: path {path!r}: expected a path prefix, like /static/")
    statuses = table.get("status", sorted(DEFAULT_STATUSES))
    if statuses == "any":
        codes = None
    elif isinstance(statuses, list) and statuses and all(
        isinstance(c, int) and not isinstance(c, bool) and 200 <= c <= 599
        and c not in NEVER_RULED for c in statuses
    ):  # fmt: skip
        codes = frozenset(statuses)
    else:
        raise ConfigError(
            f'{where}: status {statuses!r}: expected "any" or a list of statuses from 200 '
            f"to 599 but {', '.join(map(str, sorted(NEVER_RULED)))} (each answers its own "
            "request), like [200, 301, 404]"
        )
    times: dict[str, float | None] = {}
    for name in ("default", "min", "max"):
        value = table.get(name)
        try:
            times[name] = None if value is None else parse_duration(value)
        except ValueError:
            times[name] = -1.0
        if times[name] is not None and times[name] < 0:  # type: ignore[operator]
            raise ConfigError(
                f"{where}: {name} {value!r}: expected a duration of 0 or more, like 10m or 1h"
            )
    low, high = times["min"], times["max"]
    if low is not None and high is not None and low > high:
        raise ConfigError(f"{where}: min {table['min']!r} is above max {table['max']!r}")
    override = table.get("override", [])
    if (
        not isinstance(override, list)
        or not all(isinstance(name, str) for name in override)
        or not set(override) <= set(OVERRIDABLE)
    ):
        raise ConfigError(
            f"{where}: override {override!r}: expected a list of {', '.join(OVERRIDABLE)} "
            "(private only where the response is the same for every user)"
        )
    if times["default"] is None and low is None and high is None and not override:
        raise ConfigError(f"{where}: sets nothing: give default, min, max or override")
    return TtlRule(host.lower(), path, codes, times["default"], low, high, frozenset(override))


def shared_filter_refused(backend: str, policy: str) -> str | None:
    """Why an admission ``policy`` cannot run on ``backend`` (a proxy's ``[admission]``, an
    experiment's fleet); None when it can. A fleet's Redis shares the second-hit filter alone,
    at its configured window."""
    if backend == "redis" and policy != "second-hit":
        return (
            f"backend = 'redis' shares the second-hit filter: expected policy = "
            f"'second-hit', got {policy!r}"
        )
    return None


def check_config(config: Config) -> None:
    """``ConfigError`` naming the key and the fix for the first rule across sections
    ``config`` breaks (each key's own value was judged as it was read)."""
    if config.cache.size <= ENTRY_OVERHEAD:
        raise ConfigError(
            f"[cache] size = {config.cache.size}: too small to hold an entry (each is charged "
            f"{ENTRY_OVERHEAD} bytes besides its body): give a few MiB or more"
        )
    if config.server.proxy_protocol and config.server.tls_cert:
        raise ConfigError(
            "[server] proxy_protocol with tls_cert: the PROXY header comes before TLS, which "
            "the terminator in front ends; set one of them"
        )
    if bool(config.server.tls_cert) != bool(config.server.tls_key):
        raise ConfigError(
            "[server] tls_cert and tls_key go together: set both (TLS on the listener), or neither"
        )
    disk = config.disk
    if disk.path and disk.size < 2 * disk.region_size:
        raise ConfigError(
            f"[disk] size = {disk.size}: too small for [disk] region_size = "
            f"{disk.region_size} (the tier writes whole regions, and needs two): set [disk] "
            f"size to {2 * disk.region_size} bytes or more, or a smaller region_size"
        )
    if disk.region_size > MAX_REGION:
        raise ConfigError(
            f"[disk] region_size = {disk.region_size}: at most {MAX_REGION} bytes (a record's "
            "place in its region is 32 bits); 16MiB, the default, suits most devices"
        )
    if disk.path and parse_policy(disk.policy)[0] not in DISK_POLICIES:
        raise ConfigError(
            f"[disk] policy = {disk.policy!r}: expected one of {', '.join(DISK_POLICIES)} "
            "(a ring of regions has no victim by key to compare with)"
        )
    if disk.path and parse_policy(disk.policy)[0] == "auto" and config.server.workers > 1:
        raise ConfigError(
            f"[disk] policy = 'auto' with [server] workers = {config.server.workers}: auto keeps "
            "its ghosts in one process, and the workers share one disk tier; give the disk one "
            f"of {', '.join(DISK_POLICIES[:-1])}"
        )
    try:
        tune = config.tune_settings()
    except ValueError as exc:
        raise ConfigError(f"[tune]: {exc}") from None
    policy = config.admission.policy
    if (
        config.cache.eviction == "auto"
        and config.admission_shared()
        and ({c.admission for c in tune.choices(policy)} != {policy})
    ):
        raise ConfigError(
            f"[tune] admissions = {list(tune.admissions)} with a shared admission ([admission] "
            "backend = 'redis', or --workers): the processes share its filter, which one of "
            "them cannot trade away; leave [tune] admissions empty (the tuner then chooses "
            "the eviction alone)"
        )
    if config.cache.eviction == "auto" and config.cache.slice_size:
        raise ConfigError(
            "[cache] eviction = 'auto' with slice_size: the tuner's ghosts would count slices "
            "where the cache counts requests; choose an eviction, or set slice_size = 0"
        )
    if config.admission.generations < 2:
        raise ConfigError(
            f"[admission] generations = {config.admission.generations}: expected 2 or more"
        )
    if config.cache.max_object_size > config.cache.size:
        raise ConfigError(
            f"[cache] max_object_size = {config.cache.max_object_size}: expected at most "
            f"[cache] size ({config.cache.size}); lower it, or leave it out (it then defaults "
            f"to the smaller of 16MiB and size)"
        )
    slice_size = config.cache.slice_size
    if slice_size and not MIN_SLICE <= slice_size <= config.cache.max_object_size:
        raise ConfigError(
            f"[cache] slice_size = {slice_size}: expected 0 (off), or from {MIN_SLICE} up to "
            f"[cache] max_object_size "
            f"({config.cache.max_object_size}), so that a slice can be stored; 1MiB is usual"
        )
    if slice_size and config.cache.slice_memory < 2 * slice_size:
        raise ConfigError(
            f"[cache] slice_memory = {config.cache.slice_memory}: expected at least two slices "
            f"({2 * slice_size} bytes), the room one slice in flight takes"
        )
    if not config.routes and not config.upstream.origin:
        raise ConfigError(
            "no origin: set [upstream] origin (or --origin, or ONEHIT_UPSTREAM_ORIGIN), "
            "or add [[routes]]"
        )
    if said := shared_filter_refused(config.admission.backend, config.admission.policy):
        raise ConfigError(f"[admission] {said}")
    if not is_loopback(config.admin.listen[0]) and not config.admin.token:
        raise ConfigError(
            f"[admin] listen = {_join(config.admin.listen)} is not loopback: "
            "expected [admin] token to be set (ONEHIT_ADMIN_TOKEN)"
        )
