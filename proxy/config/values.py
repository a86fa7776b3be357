"""The values a setting may take, each read by one parser: a parser returns the value or raises
ValueError saying what it expected, which ``proxy.config.settings`` turns into a one-line error
naming the key and where the value came from.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import field
from typing import Any
from urllib.parse import urlsplit

from proxy.core.admission import parse_policy
from proxy.core.disk import DISK_POLICIES
from proxy.core.evictions import eviction as parse_eviction
from proxy.core.units import parse_duration, parse_size

Parser = Callable[[Any], Any]


def setting(default: Any, parse: Parser, doc: str) -> Any:
    return field(default=default, metadata={"parse": parse, "doc": doc})


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def boolean(value: Any) -> bool:
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


def positive_int(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("expected a whole number >= 1")
    return value


def count(value: Any) -> int:
    """A whole number of 0 or more."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("expected a whole number of 0 or more")
    try:
        number = int(value)
    except ValueError:
        raise ValueError("expected a whole number of 0 or more") from None
    if number < 0:
        raise ValueError("expected a whole number of 0 or more")
    return number


def workers(value: Any) -> int:
    """A positive count of worker processes, or ``auto``: one per core the process may run on
    (its CPU affinity, as nginx's ``worker_processes auto``)."""
    if value == "auto":
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        return len(cores) if cores else os.cpu_count() or 1
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("expected a positive count or auto")
    return value


def _number(value: Any, within: Callable[[float], bool], said: str) -> float:
    """``value`` as a number ``within`` allows (NaN never is); ValueError ``said`` else."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(said) from None
    if not within(number):
        raise ValueError(said)
    return number


def probability(value: Any) -> float:
    return _number(value, lambda n: 0.0 < n < 1.0,
                   "expected a number between 0 and 1 (exclusive), like 0.01")  # fmt: skip


def sample_rate(value: Any) -> float:
    return _number(value, lambda n: 0.0 <= n <= 1.0,
                   "expected a sampling rate from 0 (off) to 1, like 0.01")  # fmt: skip


def policies(value: Any) -> tuple[str, ...]:
    """Memory admission policies, as a list (or commas)."""
    return tuple(memory_policy(name) for name in _names(value))


def disk_policies(value: Any) -> tuple[str, ...]:
    """Disk admission policies but ``auto`` (which is made of them), as a list (or commas)."""
    names = _names(value)
    for name in names:
        if parse_policy(name)[0] not in DISK_POLICIES[:-1]:
            raise ValueError(
                f"{name!r} is not one of {', '.join(DISK_POLICIES[:-1])} (auto is made of them)"
            )
    return names


def _listed(value: Any, said: str) -> tuple[str, ...]:
    """A TOML list, or a string of comma-separated items (an environment's, a flag's), each
    stripped; ValueError ``said`` for anything else."""
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        raise ValueError(said)
    return tuple(str(item).strip() for item in value)


def _names(value: Any) -> tuple[str, ...]:
    names = _listed(value, 'expected a list of admission policies, like ["always", "tinylfu"]')
    for name in names:
        # Names are labels of /metrics too: letters, digits and :._- only.
        if not name or not all(ch.isalnum() or ch in ":._-" for ch in name):
            raise ValueError(f"{name!r} is not a policy name like 'nth-hit:3'")
    return tuple(policy(name) for name in names)


def positive_number(value: Any) -> float:
    return _number(value, lambda n: 0 < n < float("inf"),
                   "expected a number above zero, like 2 or 0.5")  # fmt: skip


def size(value: Any) -> int:
    size = parse_size(value)
    if size < 1:
        raise ValueError("expected a size of at least 1 byte")
    return size


def optional_size(value: Any) -> int:
    size = parse_size(value)
    if size < 0:
        raise ValueError("expected a size, or 0 for none")
    return size


def log_buffer(value: Any) -> int:
    size = parse_size(value)
    if not 0 <= size <= 64 << 20:
        raise ValueError("expected a size of at most 64 MiB, like 64KiB, or 0 to write each line")
    return size


def duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("expected a duration above zero, like 250ms, 10s or 10m")
    return seconds


def window(value: Any) -> float | str:
    if value == "auto":
        return "auto"
    try:
        return duration(value)
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


def header_names(value: Any) -> tuple[str, ...]:
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


def networks(value: Any) -> tuple[str, ...]:
    """A TOML list of addresses or networks (``127.0.0.1``, ``10.0.0.0/8``, ``::1``), or one
    comma-separated string; empty: none. Each kept as its network's text."""
    items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
        raise ValueError('expected a list of addresses or networks, like ["127.0.0.1", "::1"]')
    try:
        return tuple(str(ipaddress.ip_network(v.strip(), strict=False)) for v in items)
    except ValueError as exc:
        raise ValueError(f"expected addresses or networks: {exc}") from None


def forward_names(value: Any) -> tuple[str, ...]:
    """``["*"]`` (every end-to-end field but the denied ones) or an allow-list of names."""
    if value == "*" or value == ["*"] or value == ("*",):
        return ("*",)
    try:
        return header_names(value)
    except ValueError:
        raise ValueError(
            'expected ["*"] (forward every field but deny_headers) or a non-empty list of '
            'header names, like ["accept", "user-agent"]'
        ) from None


# Analytics cookies: set by page scripts on every page, read by no origin.
IGNORED_COOKIES = ("_ga", "_ga_*", "_gid", "_gat*", "_gcl_*", "_fbp", "__utm*", "_hj*")


def cookie_names(value: Any) -> tuple[str, ...]:
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


def key_query(value: Any) -> tuple[str, tuple[str, ...]]:
    """``"all"``, ``"none"``, ``{include = [...]}`` or ``{exclude = [...]}`` (as a string:
    ``include:a,b`` or ``exclude:utm_source,utm_medium``): (mode, names)."""
    expected = ValueError(
        'expected "all", "none", {include = ["id"]} or {exclude = ["utm_source"]} '
        '(as a string: "include:id" or "exclude:utm_source,utm_medium")'
    )
    if isinstance(value, str):
        mode, colon, rest = value.strip().partition(":")
        if mode in ("all", "none") and not colon:
            return mode, ()
        if mode not in ("include", "exclude") or not colon:
            raise expected
        value = {mode: [n.strip() for n in rest.split(",") if n.strip()]}
    if not isinstance(value, dict) or len(value) != 1:
        raise expected
    ((mode, names),) = value.items()
    if mode not in ("include", "exclude") or not isinstance(names, list | tuple):
        raise expected
    if not names or not all(isinstance(n, str) and n and "&" not in n for n in names):
        raise ValueError(f'key_query {mode}: expected parameter names, like ["id", "page"]')
    return mode, tuple(names)


def optional_duration(value: Any) -> float:
    if value in (0, "0"):
        return 0.0
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError("expected a duration like 5s, or 0 for off")
    return seconds


def backend(value: Any) -> str:
    if value not in ("memory", "redis"):
        raise ValueError("expected 'memory' or 'redis'")
    return value


def redis_url(value: Any) -> str:
    text = string(value)
    if urlsplit(text).scheme not in ("redis", "rediss", "unix"):
        raise ValueError("expected a Redis URL like redis://127.0.0.1:6379/0")
    return text


def policy(value: Any) -> str:
    parse_policy(value)
    return value


def memory_policy(value: Any) -> str:
    """A memory tier's admission: any but ``auto``, a disk tier's."""
    if parse_policy(value)[0] == "auto":
        raise ValueError(
            "auto is a disk tier's ([disk] policy); the memory tier's own is 'adaptive' (the "
            "best of always, second-hit and tinylfu)"
        )
    return value


def eviction(value: Any) -> str:
    """An eviction's one name (``proxy.core.evictions``), or ``auto``: the tuner chooses."""
    if value == "auto":
        return value
    try:
        return parse_eviction(value).name
    except ValueError as exc:
        raise ValueError(f"{exc}; or 'auto', for the tuner to choose ([tune])") from None


def evictions(value: Any) -> tuple[str, ...]:
    """Evictions by name (``proxy.core.evictions``), as a list (or commas), each once."""
    listed = _listed(value, 'expected a list of evictions, like ["s3fifo", "s3fifo:small=0.05"]')
    if not listed:
        raise ValueError('expected a list of evictions, like ["s3fifo", "s3fifo:small=0.05"]')
    return tuple(dict.fromkeys(parse_eviction(name).name for name in listed))


def tune_policies(value: Any) -> tuple[str, ...]:
    """The memory admissions the tuner chooses among; an empty list: the configured
    ``[admission] policy``, second-hit and always."""
    if value in ([], ()):
        return ()
    return policies(value)


def tune_sample(value: Any) -> float | str:
    if value == "auto":
        return value
    if isinstance(value, bool):
        raise ValueError("expected 'auto', or a sampling rate like 0.05, not a boolean")
    number = sample_rate(value)
    if number < 0.0001:
        raise ValueError(
            "expected 'auto', or a sampling rate above 0, like 0.05 (the tuner needs one)"
        )
    return number


def tune_period(value: Any) -> int | str:
    """``auto``, or a whole count of sampled requests: fewer than 100 judge on noise, more
    than 100 million never judge."""
    said = "expected 'auto', or from 100 to 100,000,000 sampled requests"
    if value == "auto":
        return value
    try:
        number = count(value)
    except ValueError:
        raise ValueError(said) from None
    if not 100 <= number <= 100_000_000:
        raise ValueError(said)
    return number


def share(value: Any) -> float:
    return _number(value, lambda n: 0.0 <= n < 1.0,
                   "expected a fraction from 0 to 1 (exclusive), like 0.005")  # fmt: skip


def event_loop(value: Any) -> str:
    if value not in ("auto", "uvloop", "asyncio"):
        raise ValueError("expected 'auto' (uvloop where installed), 'uvloop' or 'asyncio'")
    return value


def client_revalidation(value: Any) -> str:
    if value not in ("honour", "ignore"):
        raise ValueError("expected 'honour' (at most one a second per URL) or 'ignore'")
    return value


def log_format(value: Any) -> str:
    if value not in ("combined", "json"):
        raise ValueError("expected 'combined' or 'json'")
    return value


def address(value: Any) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6)."""
    text = string(value)
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected host:port, like 127.0.0.1:8080")
    return host, int(port)


def loopback(listen: tuple[str, int]) -> tuple[str, int]:
    """A listener's address as a process of this machine reaches it: on loopback when it
    listens everywhere."""
    host, port = listen
    if host in ("", "0.0.0.0"):
        return "127.0.0.1", port
    if host == "::":
        return "::1", port
    return host, port


def origin(value: Any) -> str:
    text = string(value).rstrip("/")
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


def optional_origin(value: Any) -> str:
    return "" if value == "" else origin(value)
