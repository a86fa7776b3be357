"""What a dashboard needs of the answers themselves, beside the cache's counters: how long they
took (hits and misses apart), their status classes, by route, and what the process is.

* ``onehit_response_seconds{cache="hit"|"miss"}``: a histogram of the time from a request's
  arrival to its answer's last byte handed to the socket. A hit is an answer from a stored
  response (``Cache-Status: onehit; hit``), fresh or stale; everything else is a miss. Hits
  the fast path answers as their bytes are read (``onehit_fast_hits_total``, all ``200``) are
  counted in the first bucket without a timer of their own: they are written in the callback
  that read them, and timing each would cost more than answering it.
* ``onehit_responses_total{class="2xx"}``: every answer by status class, the fast path's too;
  ``onehit_route_responses_total{route, class}``: the answers through the handler by route
  (the route's host, ``default`` for the default origin), the fast path's hits left out.
* ``onehit_build_info{version, python, aiohttp}``, ``process_start_time_seconds`` and
  ``process_resident_memory_bytes``, named as Prometheus's own clients name them.

Under ``--workers`` the parent sums the workers' (``combined``) and adds one series per worker
with a ``worker`` label (``onehit_worker_up``, ``onehit_worker_requests_total``).
"""

from __future__ import annotations

import os
import platform
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from importlib import metadata
from time import perf_counter
from typing import Any

from aiohttp.abc import AbstractAccessLogger

from proxy.core.cache_status import HIT
from proxy.handler.routing import Router
from proxy.ops.access_log import AccessLog
from proxy.wire.seam import ProxyRequest

# Seconds; the histogram's upper bounds (+Inf last).
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_HIT = f"\r\nCache-Status: {HIT}".encode()
LABELS_KEPT = 1024
_ROUTES = object()


class AnswerMetrics:
    """The counts ``record`` takes, as plain data (``snapshot``) that sums across workers.
    ``record`` runs for every answer the handler writes: plain lists and dicts, no object
    made per answer but a key."""

    def __init__(self) -> None:
        self.classes = [0] * 6  # by status // 100 (0: anything out of range)
        self.routes: dict[tuple[str, int], int] = {}
        self.buckets = {True: [0] * (len(BUCKETS) + 1), False: [0] * (len(BUCKETS) + 1)}
        self.sums = {True: 0.0, False: 0.0}

    def record(self, status: int, seconds: float, hit: bool, route: str) -> None:
        kind = status // 100
        if not 0 < kind < 6:
            kind = 0
        self.classes[kind] += 1
        key = (route, kind)
        routes = self.routes
        routes[key] = routes.get(key, 0) + 1
        self.buckets[hit][bisect_left(BUCKETS, seconds)] += 1
        self.sums[hit] += seconds

    def snapshot(self, fast: Mapping[int, int]) -> dict[str, Any]:
        """The counts, with the hits answered as read (``fast``: by status; in the first
        bucket) folded in."""
        classes = list(self.classes)
        for status, n in fast.items():
            classes[status // 100 if 0 < status // 100 < 6 else 0] += n
        hits = list(self.buckets[True])
        hits[0] += sum(fast.values())
        return {
            "classes": {_CLASS[k]: n for k, n in enumerate(classes) if n},
            "routes": [[route, _CLASS[k], n] for (route, k), n in sorted(self.routes.items())],
            "buckets": {"hit": hits, "miss": list(self.buckets[False])},
            "sums": {"hit": self.sums[True], "miss": self.sums[False]},
        }


_CLASS = ("other", "1xx", "2xx", "3xx", "4xx", "5xx")


def combined(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """The sum of several processes' snapshots."""
    total = AnswerMetrics().snapshot({})
    routes: Counter[tuple[str, str]] = Counter()
    for snap in snapshots:
        for cls, n in snap["classes"].items():
            total["classes"][cls] = total["classes"].get(cls, 0) + n
        for route, cls, n in snap["routes"]:
            routes[(route, cls)] += n
        for kind in ("hit", "miss"):
            pairs = zip(total["buckets"][kind], snap["buckets"][kind], strict=True)
            total["buckets"][kind] = [a + b for a, b in pairs]
            total["sums"][kind] += snap["sums"][kind]
    total["routes"] = [[route, cls, n] for (route, cls), n in sorted(routes.items())]
    return total


def prometheus(snap: dict[str, Any]) -> str:
    """The Prometheus text of a snapshot."""
    lines = [
        "# HELP onehit_response_seconds Time from a request's arrival to its answer's last byte",
        "# TYPE onehit_response_seconds histogram",
    ]
    for kind in ("hit", "miss"):
        running = 0
        for bound, n in zip((*BUCKETS, float("inf")), snap["buckets"][kind], strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'onehit_response_seconds_bucket{{cache="{kind}",le="{le}"}} {running}')
        lines.append(f'onehit_response_seconds_sum{{cache="{kind}"}} {snap["sums"][kind]!r}')
        lines.append(f'onehit_response_seconds_count{{cache="{kind}"}} {running}')
    lines += ["# HELP onehit_responses_total Answers by status class",
              "# TYPE onehit_responses_total counter"]  # fmt: skip
    lines += [f'onehit_responses_total{{class="{cls}"}} {n}'
              for cls, n in sorted(snap["classes"].items())]  # fmt: skip
    lines += ["# HELP onehit_route_responses_total Answers through the handler by route and "
              "status class (the fast path's hits left out)",
              "# TYPE onehit_route_responses_total counter"]  # fmt: skip
    lines += [f'onehit_route_responses_total{{route="{label(route)}",class="{cls}"}} {n}'
              for route, cls, n in snap["routes"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def process_text(started: float) -> str:
    """``onehit_build_info``, ``process_start_time_seconds`` and
    ``process_resident_memory_bytes`` of this process."""
    versions = {
        "version": _version("onehit"),
        "python": platform.python_version(),
        "aiohttp": _version("aiohttp"),
    }
    labels = ",".join(f'{k}="{label(v)}"' for k, v in versions.items())
    return (
        "# HELP onehit_build_info What runs: onehit's, Python's and aiohttp's versions\n"
        "# TYPE onehit_build_info gauge\n"
        f"onehit_build_info{{{labels}}} 1\n"
        "# HELP process_start_time_seconds Start time of the process since the epoch\n"
        "# TYPE process_start_time_seconds gauge\n"
        f"process_start_time_seconds {started!r}\n"
        "# HELP process_resident_memory_bytes Resident memory size in bytes\n"
        "# TYPE process_resident_memory_bytes gauge\n"
        f"process_resident_memory_bytes {resident_bytes()}\n"
    )


def resident_bytes() -> int:
    """This process's resident set (Linux's /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def label(value: str) -> str:
    """``value`` as a Prometheus label value writes it (backslash, quote, newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Recorder(AbstractAccessLogger):
    """The data port's access logger as aiohttp's handler and the front's lane call it for
    every answer they write: each is recorded (``metrics``), then logged when the access log
    is on (``log_to``). ``for_service`` makes the class a server is given."""

    __slots__ = ()

    metrics: AnswerMetrics
    router: Router
    log_to: AccessLog | None
    # A Host's route label, for the Hosts seen first; under _ROUTES, the table they follow.
    labels: dict[Any, Any]

    @classmethod
    def for_service(
        cls, metrics: AnswerMetrics, router: Router, log_to: AccessLog | None
    ) -> type[Recorder]:
        return type("ServiceRecorder", (cls,), {"__slots__": (), "metrics": metrics,
                                                "router": router, "log_to": log_to,
                                                "labels": {}})  # fmt: skip

    @property
    def enabled(self) -> bool:
        return True

    def log(self, request: Any, response: Any, time_taken: float) -> None:
        if type(request) is ProxyRequest:  # aiohttp's time, in the loop's whole milliseconds
            time_taken = perf_counter() - request.started
        head = getattr(response, "head_bytes", None)  # an answer the lane wrote whole
        if head is not None:
            hit = _HIT in head
        else:
            hit = (response.headers.get("Cache-Status") or "").startswith(HIT)
        host = request.host
        labels = self.labels
        if labels.get(_ROUTES) is not self.router.routes:  # a reload changed them
            labels.clear()
            labels[_ROUTES] = self.router.routes
        route = labels.get(host)
        if route is None:
            route = self.router.route_label(host)
            if len(labels) < LABELS_KEPT:  # bounded: a client picks the Hosts it sends
                labels[host] = route
        self.metrics.record(response.status, time_taken, hit, route)
        if self.log_to is not None:
            self.log_to.log(request, response, time_taken)


def servers_of(routes: Mapping[str, str], groups: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each server of the routes of several servers: its route's host, and its state
    (``ServerGroup.states``), for ``/stats``."""
    return [
        {"route": host or "default", **state}
        for host, origin in sorted(routes.items())
        if origin in groups
        for state in groups[origin].states()
    ]


def servers_text(servers: list[dict[str, Any]]) -> str:
    """``servers_of``'s as Prometheus text: whether each is up (a machine's: on every worker),
    its requests and failures (the workers' summed)."""
    if not servers:
        return ""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for s in servers:
        seen = merged.setdefault(
            (s["route"], s["url"]),
            {"up": True, "requests": 0, "failures": 0, "backup": s["backup"]},
        )
        seen["up"] = seen["up"] and s["up"]
        seen["requests"] += s["requests"]
        seen["failures"] += s["failures"]
    out = []
    for name, kind, what, value in (
        ("up", "gauge", "whether a route's server is up, not marked down after max_fails",
         lambda s: int(s["up"])),
        ("requests_total", "counter", "requests sent to a route's server", lambda s: s["requests"]),
        ("failures_total", "counter", "requests a route's server failed before answering",
         lambda s: s["failures"]),
    ):  # fmt: skip
        out += [f"# HELP onehit_origin_server_{name} {what}",
                f"# TYPE onehit_origin_server_{name} {kind}"]  # fmt: skip
        for (route, url), seen in sorted(merged.items()):
            labels = (f'route="{label(route)}",server="{label(url)}",'
                      f'backup="{str(seen["backup"]).lower()}"')  # fmt: skip
            out.append(f"onehit_origin_server_{name}{{{labels}}} {value(seen)}")
    return "\n".join(out) + "\n"
