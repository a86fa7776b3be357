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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.core.admission import AdmissionConfig, parse_policy
from proxy.core.store import EVICTIONS
from proxy.units import parse_duration, parse_size

Parser = Callable[[Any], Any]


class ConfigError(ValueError):
    """A setting that cannot be used; the message is one line a person can act on."""


def _setting(default: Any, parse: Parser, doc: str) -> Any:
    return field(default=default, metadata={"parse": parse, "doc": doc})


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in (
        "true",
        "1",
        "yes",
        "on",
        "false",
        "0",
        "no",
        "off",
    ):
        return value.lower() in ("true", "1", "yes", "on")
    raise ValueError("expected true or false")


def _positive_int(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("expected a whole number >= 1")
    return value


def _probability(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number between 0 and 1, like 0.01") from None
    if not 0.0 < number < 1.0:
        raise ValueError("expected a number between 0 and 1 (exclusive), like 0.01")
    return number


def _positive_number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number above zero, like 2 or 0.5") from None
    if not number > 0 or number == float("inf"):
        raise ValueError("expected a number above zero, like 2 or 0.5")
    return number


def _size(value: Any) -> int:
    size = parse_size(value)
    if size < 1:
        raise ValueError("expected a size of at least 1 byte")
    return size


def _duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("expected a duration above zero, like 250ms, 10s or 10m")
    return seconds


def _window(value: Any) -> float | str:
    if value == "auto":
        return "auto"
    try:
        return _duration(value)
    except ValueError:
        raise ValueError("expected 'auto' or a duration like 10m") from None


# Fields that rewrite the target, the method or the host an origin believes it serves: on a
# cacheable GET/HEAD they could make the origin build an answer that is then stored for every
# client under a key that does not name them (cache poisoning), so they never pass.
DENIED_BY_DEFAULT = (
    "x-original-url", "x-rewrite-url", "x-override-url", "x-http-method-override",
    "x-http-method", "x-method-override", "x-forwarded-host", "x-forwarded-server",
    "x-forwarded-scheme", "x-forwarded-port", "x-forwarded-prefix", "x-host", "forwarded",
)  # fmt: skip


def _header_names(value: Any) -> tuple[str, ...]:
    """A TOML list of field names, or one comma-separated string (from the environment);
    never empty: a list that forwards or denies nothing by accident is an error."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError('expected a list of header names, like ["accept", "user-agent"]')
    cleaned = tuple(n.strip().lower() for n in names)
    if not cleaned or any(not n for n in cleaned):
        raise ValueError('expected a non-empty list of header names, like ["x-original-url"]')
    if any(not n.replace("-", "").isalnum() for n in cleaned):
        raise ValueError("expected header names made of letters, digits and '-'")
    return cleaned


def _forward_names(value: Any) -> tuple[str, ...]:
    """``["*"]`` (every end-to-end field but the denied ones) or an allow-list of names."""
    if value == "*" or value == ["*"] or value == ("*",):
        return ("*",)
    try:
        return _header_names(value)
    except ValueError:
        raise ValueError(
            'expected ["*"] (forward every field but deny_headers) or a non-empty list of '
            'header names, like ["accept", "user-agent"]'
        ) from None


# Analytics cookies: set by page scripts on every page, read by no origin.
IGNORED_COOKIES = ("_ga", "_ga_*", "_gid", "_gat*", "_gcl_*", "_fbp", "__utm*", "_hj*")


def _cookie_names(value: Any) -> tuple[str, ...]:
    """Cookie names or glob patterns, as a list or one comma-separated string; [] for none."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError('expected a list of cookie names, like ["_ga", "_gid*"]')
    cleaned = tuple(n.strip() for n in names)
    if isinstance(value, str) and value.strip() == "":
        return ()
    if any(not n or any(c in n for c in ";=, \t") for n in cleaned):
        raise ValueError('expected cookie names or globs without ";", "=" or spaces, like "_ga*"')
    return cleaned


def _optional_duration(value: Any) -> float:
    if value in (0, "0"):
        return 0.0
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError("expected a duration like 5s, or 0 for off")
    return seconds


def _backend(value: Any) -> str:
    if value not in ("memory", "redis"):
        raise ValueError("expected 'memory' or 'redis'")
    return value


def _redis_url(value: Any) -> str:
    text = _string(value)
    if urlsplit(text).scheme not in ("redis", "rediss", "unix"):
        raise ValueError("expected a Redis URL like redis://127.0.0.1:6379/0")
    return text


def _policy(value: Any) -> str:
    parse_policy(value)
    return value


def _eviction(value: Any) -> str:
    if value not in EVICTIONS:
        raise ValueError(f"expected one of {', '.join(EVICTIONS)}")
    return value


def _event_loop(value: Any) -> str:
    if value not in ("auto", "uvloop", "asyncio"):
        raise ValueError("expected 'auto' (uvloop where installed), 'uvloop' or 'asyncio'")
    return value


def _log_format(value: Any) -> str:
    if value not in ("combined", "json"):
        raise ValueError("expected 'combined' or 'json'")
    return value


def _address(value: Any) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6)."""
    text = _string(value)
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected host:port, like 127.0.0.1:8080")
    return host, int(port)


def _origin(value: Any) -> str:
    text = _string(value).rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an origin URL like http://127.0.0.1:9000")
    if parts.path or parts.query or parts.fragment:
        raise ValueError("expected an origin URL without a path, like http://127.0.0.1:9000")
    try:
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError:
        raise ValueError("expected an origin URL with a valid port") from None
    return text


def _optional_origin(value: Any) -> str:
    return "" if value == "" else _origin(value)


@dataclass(frozen=True)
class ServerSection:
    listen: tuple[str, int] = _setting(("127.0.0.1", 8080), _address, "address clients connect to")
    access_log: bool = _setting(True, _bool, "log one line per request")
    access_log_format: str = _setting("combined", _log_format, "combined or json")
    drain_timeout: float = _setting(10.0, _duration, "on SIGTERM, how long requests may finish")
    event_loop: str = _setting(
        "auto", _event_loop, "auto (uvloop where installed, else asyncio), uvloop or asyncio"
    )
    idle_timeout: float = _setting(15.0, _duration, "longest wait for a whole request head")
    send_timeout: float = _setting(
        60.0, _duration, "longest a client may take none of its answer's bytes (then closed)"
    )
    fast_hits: bool = _setting(
        True, _bool, "answer plain hits as parsed and plain misses outside aiohttp's handler loop"
    )
    max_url_length: int = _setting(8192, _positive_int, "longest request target (else 414)")
    max_header_size: int = _setting(32768, _positive_int, "most bytes of header fields (else 431)")
    forward_headers: tuple[str, ...] = _setting(
        ("*",), _forward_names, '"*" or an allow-list of fields a GET/HEAD passes to the origin'
    )
    deny_headers: tuple[str, ...] = _setting(
        DENIED_BY_DEFAULT, _header_names, "fields a cacheable GET/HEAD never passes to the origin"
    )
    body_buffer_size: int = _setting(
        64 << 10, _size, "request body bytes read before an origin connection is taken"
    )
    body_timeout: float = _setting(60.0, _duration, "longest wait for the next request body bytes")
    max_streamed_uploads: int = _setting(
        64, _positive_int, "bodies over body_buffer_size streaming to origins at once (else 503)"
    )


@dataclass(frozen=True)
class AdminSection:
    listen: tuple[str, int] = _setting(("127.0.0.1", 9901), _address, "admin address")
    token: str = _setting("", _string, "bearer token; required when listen is not loopback")


@dataclass(frozen=True)
class CacheSection:
    size: int = _setting(256 << 20, _size, "bytes of response bodies held")
    eviction: str = _setting(
        "lru", _eviction, "lru, s3fifo, sieve or wtinylfu: which entry makes room"
    )
    max_object_size: int = _setting(16 << 20, _size, "largest body stored; larger is streamed")
    store_set_cookie: bool = _setting(
        False, _bool, "store responses that carry Set-Cookie (never the Set-Cookie itself)"
    )
    hit_for_miss: float = _setting(
        5.0, _optional_duration, "how long an uncacheable URL goes straight to the origin"
    )
    max_variants: int = _setting(32, _positive_int, "variants stored per URL (Vary); more pass")
    ignore_cookies: tuple[str, ...] = _setting(
        IGNORED_COOKIES, _cookie_names, "cookie names (globs) that do not make a request private"
    )


@dataclass(frozen=True)
class AdmissionSection:
    policy: str = _setting(
        "second-hit",
        _policy,
        "always, second-hit, nth-hit:N, tinylfu, adaptive, probabilistic:P or size-below:BYTES",
    )
    window: float | str = _setting("auto", _window, "auto, or how long a first sighting counts")
    expected_urls: int = _setting(1_000_000, _positive_int, "distinct URLs per fixed window")
    fp_rate: float = _setting(0.01, _probability, "false-positive rate of the filter")
    generations: int = _setting(2, _positive_int, "filter generations (>= 2)")
    max_window: float = _setting(3600.0, _duration, "longest the auto window remembers")
    auto_scale: float = _setting(1.0, _positive_number, "multiple of the auto generation size")
    backend: str = _setting("memory", _backend, "memory (this process) or redis (the fleet)")
    redis_url: str = _setting("redis://127.0.0.1:6379/0", _redis_url, "Redis for backend=redis")
    redis_cluster: bool = _setting(False, _bool, "redis_url names one node of a Redis Cluster")
    redis_budget: float = _setting(0.005, _duration, "longest a miss waits for Redis")
    redis_prefix: str = _setting("onehit:bf", _string, "key prefix of the shared filter")


@dataclass(frozen=True)
class UpstreamSection:
    origin: str = _setting("", _optional_origin, "default origin for hosts no route names")
    connect_timeout: float = _setting(2.0, _duration, "time to connect to the origin")
    read_timeout: float = _setting(10.0, _duration, "longest wait for the next bytes")
    total_timeout: float = _setting(60.0, _duration, "longest a whole origin response may take")
    single_flight_wait: float = _setting(10.0, _duration, "longest a coalesced miss waits")
    max_connections: int = _setting(
        512, _positive_int, "origin connections in use at most, per origin client (pool, session)"
    )
    idle_timeout: float = _setting(4.0, _duration, "longest an unused origin connection is kept")
    read_buffer: int = _setting(
        128 << 10, _size, "origin body bytes held per response before reading pauses (at twice)"
    )


@dataclass(frozen=True)
class Route:
    host: str
    origin: str


@dataclass(frozen=True)
class Config:
    server: ServerSection = ServerSection()
    admin: AdminSection = AdminSection()
    cache: CacheSection = CacheSection()
    admission: AdmissionSection = AdmissionSection()
    upstream: UpstreamSection = UpstreamSection()
    routes: tuple[Route, ...] = ()

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
        return {**sections, "routes": [{"host": r.host, "origin": r.origin} for r in self.routes]}

    def summary(self) -> dict[str, object]:
        return {
            "listen": _join(self.server.listen),
            "admin": _join(self.admin.listen),
            "cache_size": self.cache.size,
            "max_object_size": self.cache.max_object_size,
            "admission": self.admission_config().label(),
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
    (``"section.key" -> value``, from command-line flags; ``"routes"`` -> list of routes)."""
    env = os.environ if env is None else env
    raw: dict[str, dict[str, tuple[Any, str]]] = {name: {} for name in SECTIONS}
    routes: list[tuple[dict[str, Any], str]] = []
    if path is not None:
        _read_toml(Path(path), raw, routes)
    _read_env(env, raw, routes)
    for dotted, value in (overrides or {}).items():
        if dotted == "routes":
            routes = [(r, "command line") for r in value]
            continue
        section, _, key = dotted.partition(".")
        _check_key(section, key, "command line")
        raw[section][key] = (value, "command line")
    config = Config(
        **{name: _build(cls, name, raw[name]) for name, cls in SECTIONS.items()},
        routes=tuple(_route(r, source) for r, source in routes),
    )
    _check_whole(config)
    return config


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at ``path``; ValueError says in one line why it cannot be read."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None


def _read_toml(path: Path, raw: dict, routes: list) -> None:
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


def _route(table: Any, source: str) -> Route:
    if not isinstance(table, dict) or set(table) != {"host", "origin"}:
        raise ConfigError(f"{source}: each route needs exactly host and origin, got {table!r}")
    host = table["host"]
    if not isinstance(host, str) or not host or "/" in host or ":" in host:
        raise ConfigError(
            f"{source}: route host {host!r}: expected a host name without port, like cdn.example"
        )
    try:
        origin = _origin(table["origin"])
    except ValueError as exc:
        raise ConfigError(f"{source}: route {host} origin {table['origin']!r}: {exc}") from None
    return Route(host.lower(), origin)


def _check_whole(config: Config) -> None:
    if config.admission.generations < 2:
        raise ConfigError(
            f"[admission] generations = {config.admission.generations}: expected 2 or more"
        )
    if config.cache.max_object_size > config.cache.size:
        raise ConfigError(
            f"[cache] max_object_size = {config.cache.max_object_size}: expected at most "
            f"[cache] size ({config.cache.size})"
        )
    if not config.routes and not config.upstream.origin:
        raise ConfigError(
            "no origin: set [upstream] origin (or --origin, or ONEHIT_UPSTREAM_ORIGIN), "
            "or add [[routes]]"
        )
    if config.admission.backend == "redis" and config.admission.policy != "second-hit":
        raise ConfigError(
            f"[admission] backend = 'redis' shares the second-hit filter: expected policy = "
            f"'second-hit', got {config.admission.policy!r}"
        )
    if not is_loopback(config.admin.listen[0]) and not config.admin.token:
        raise ConfigError(
            f"[admin] listen = {_join(config.admin.listen)} is not loopback: "
            "expected [admin] token to be set (ONEHIT_ADMIN_TOKEN)"
        )
