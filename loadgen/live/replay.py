"""HTTP replay of a trace against any target (onehit, nginx, Varnish, an origin).

Two ways to send:

* closed loop: ``concurrency`` connections, each sending its next request when the last one
  answered (at concurrency 1 the trace's order is kept exactly);
* open loop: requests leave at the trace's own times (``speed`` times faster) or at a fixed
  ``rate``, whatever the target does; latency is measured from the *intended* send time, so a
  target that falls behind shows its queueing instead of hiding it (coordinated omission).

Each response is recorded: status, body bytes, what the cache said (``X-Cache`` or
``Cache-Status``), and latency in an HDR histogram. A run is bounded by request count and time;
Ctrl-C stops it cleanly and the partial result is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from hdrh.histogram import HdrHistogram

from loadgen.live.origin import PREFIX
from loadgen.traces.trace import Trace

MAX_LATENCY_US = 120_000_000
OPEN_LOOP_IN_FLIGHT = 10_000


@dataclass(frozen=True)
class ReplayConfig:
    target: str
    fanout: tuple[str, ...] = ()  # more targets: request i goes to target i mod n (round robin)
    host: str | None = None  # one Host for every target, as a load balancer in front would send
    concurrency: int = 1
    rate: float | None = None  # open loop at a fixed rate (requests/s)
    trace_time: bool = False  # open loop at the trace's times
    speed: float = 1.0  # trace-time open loop: this many times faster
    max_requests: int | None = None
    max_seconds: float | None = None
    timeout: float = 30.0
    path_prefix: str = PREFIX
    progress: bool = False

    @property
    def open_loop(self) -> bool:
        return self.rate is not None or self.trace_time


@dataclass
class ReplayResult:
    """What the client saw. Latencies are in microseconds."""

    target: str
    mode: str
    requests: int = 0
    completed: int = 0
    hits: int = 0
    bytes: int = 0
    hit_bytes: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    histogram: HdrHistogram = field(default_factory=lambda: HdrHistogram(1, MAX_LATENCY_US, 3))
    timeline: list[dict[str, float]] = field(default_factory=list)
    elapsed: float = 0.0
    interrupted: bool = False

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.completed if self.completed else 0.0

    def latency_ms(self, percentile: float) -> float:
        return self.histogram.get_value_at_percentile(percentile) / 1000.0

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "mode": self.mode,
            "requests": self.requests,
            "completed": self.completed,
            "hits": self.hits,
            "hit_ratio": self.hit_ratio,
            "bytes": self.bytes,
            "byte_hit_ratio": self.hit_bytes / self.bytes if self.bytes else 0.0,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "outcomes": dict(self.outcomes),
            "errors": dict(self.errors),
            "latency_ms": {f"p{p:g}": self.latency_ms(p) for p in (50, 90, 99, 99.9)}
            | {
                "max": self.histogram.get_max_value() / 1000.0,
                "mean": self.histogram.get_mean_value() / 1000.0,
            },
            "latency_hdr": self.histogram.encode().decode(),
            "elapsed_s": round(self.elapsed, 3),
            "requests_per_second": self.completed / self.elapsed if self.elapsed else 0.0,
            "interrupted": self.interrupted,
            "timeline": self.timeline,
        }


def cache_outcome(headers: aiohttp.typedefs.LooseHeaders) -> str:
    """HIT, STALE, MISS, ... from ``X-Cache`` (onehit, nginx's $upstream_cache_status, Varnish
    and most CDNs) or else RFC 9211 ``Cache-Status``; ``-`` when the target says nothing."""
    x_cache = headers.get("X-Cache")  # type: ignore[union-attr]
    if x_cache:
        return x_cache.split(",")[0].split()[0].upper()
    status = headers.get("Cache-Status")  # type: ignore[union-attr]
    if status:
        params = {p.strip().split("=")[0] for p in status.split(",")[0].split(";")[1:]}
        return "HIT" if "hit" in params else "MISS"
    return "-"


class _Run:
    """One replay in progress."""

    def __init__(self, trace: Trace, config: ReplayConfig) -> None:
        self.config = config
        n = len(trace)
        if config.max_requests is not None:
            n = min(n, config.max_requests)
        self.total = n
        bases = [t.rstrip("/") + config.path_prefix for t in (config.target, *config.fanout)]
        self.urls = [bases[i % len(bases)] + k for i, k in enumerate(trace.key_strings(0, n))]
        self.times = trace.times[:n].tolist()
        mode = (
            "closed"
            if not config.open_loop
            else ("open-trace" if config.trace_time else "open-rate")
        )
        self.result = ReplayResult(config.target, mode)
        self.stop = asyncio.Event()
        self.started = 0.0
        self._next = 0
        self._last_tick = (0.0, 0, 0, 0)

    def intended(self, i: int) -> float:
        c = self.config
        if c.rate is not None:
            return self.started + i / c.rate
        return self.started + (self.times[i] - self.times[0]) / c.speed

    async def one(self, session: aiohttp.ClientSession, i: int, intended: float) -> None:
        r = self.result
        r.requests += 1
        try:
            async with session.get(self.urls[i]) as response:
                size = 0
                async for chunk in response.content.iter_any():
                    size += len(chunk)
                outcome = cache_outcome(response.headers)
                status = response.status
        except (TimeoutError, aiohttp.ServerTimeoutError):
            r.errors["timeout"] += 1
            return
        except aiohttp.ClientConnectorError:
            r.errors["connect"] += 1
            return
        except (aiohttp.ClientError, ConnectionError) as exc:
            r.errors[type(exc).__name__] += 1
            return
        latency = time.perf_counter() - intended
        r.histogram.record_value(max(1, min(MAX_LATENCY_US, int(latency * 1e6))))
        r.completed += 1
        r.statuses[status] += 1
        r.outcomes[outcome] += 1
        r.bytes += size
        if status >= 500:
            r.errors[f"status-{status}"] += 1
        if outcome in ("HIT", "STALE"):
            r.hits += 1
            r.hit_bytes += size

    async def closed_worker(self, session: aiohttp.ClientSession) -> None:
        while not self.stop.is_set() and self._next < self.total:
            i = self._next
            self._next += 1
            await self.one(session, i, time.perf_counter())

    async def open_dispatch(self, session: aiohttp.ClientSession) -> None:
        room = asyncio.Semaphore(OPEN_LOOP_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()

        async def send(i: int, at: float) -> None:
            try:
                await self.one(session, i, at)
            finally:
                room.release()

        for i in range(self.total):
            if self.stop.is_set():
                break
            at = self.intended(i)
            delay = at - time.perf_counter()
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), delay)
                    break
                except TimeoutError:
                    pass
            await room.acquire()
            task = asyncio.ensure_future(send(i, at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def ticker(self, progress: Callable[[str], None] | None) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 1.0)
            if not self.stop.is_set():
                self.tick(progress)

    def tick(self, progress: Callable[[str], None] | None) -> None:
        r = self.result
        now = time.perf_counter() - self.started
        t0, done0, hits0, _ = self._last_tick
        span = max(1e-9, now - t0)
        done, errors = r.completed, sum(r.errors.values())
        r.timeline.append(
            {
                "t": round(now, 3),
                "completed": done,
                "rate": (done - done0) / span,
                "hit_ratio": (r.hits - hits0) / (done - done0) if done > done0 else 0.0,
                "cumulative_hit_ratio": r.hit_ratio,
                "errors": errors,
            }
        )
        self._last_tick = (now, done, r.hits, errors)
        if progress is not None:
            progress(
                f"\r{done:,}/{self.total:,} requests, {(done - done0) / span:,.0f}/s, "
                f"hit ratio {r.hit_ratio:.3f}, errors {errors:,}   "
            )


async def replay(trace: Trace, config: ReplayConfig) -> ReplayResult:
    """Send ``trace`` to ``config.target``; returns what the client saw (partial if stopped)."""
    run = _Run(trace, config)
    loop = asyncio.get_running_loop()
    handled = []

    def interrupt() -> None:
        # Decided here, not from the sender afterwards: stopping may let the sender finish in
        # the same loop turn, and the run would pass for complete.
        if not run.stop.is_set():
            run.result.interrupted = True
        run.stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, interrupt)
            handled.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    progress = _stderr if config.progress else None
    connector = aiohttp.TCPConnector(limit=0 if config.open_loop else config.concurrency)
    timeout = aiohttp.ClientTimeout(total=config.timeout)
    run.started = time.perf_counter()
    ticker = asyncio.ensure_future(run.ticker(progress))
    try:
        headers = {"Host": config.host} if config.host else None
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, headers=headers
        ) as session:
            if config.open_loop:
                sender: asyncio.Future[object] = asyncio.ensure_future(run.open_dispatch(session))
            else:
                workers = (run.closed_worker(session) for _ in range(config.concurrency))
                sender = asyncio.gather(*workers)
            waiters = [sender, asyncio.ensure_future(run.stop.wait())]
            await asyncio.wait(
                waiters, timeout=config.max_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            run.stop.set()
            await sender
            waiters[1].cancel()
    finally:
        run.stop.set()
        await ticker
        for sig in handled:
            loop.remove_signal_handler(sig)
    run.result.elapsed = time.perf_counter() - run.started
    run.tick(None)
    r = run.result
    if progress is not None:
        progress(
            f"\r{r.completed:,}/{run.total:,} requests in {r.elapsed:.1f}s "
            f"({r.completed / max(r.elapsed, 1e-9):,.0f}/s), hit ratio {r.hit_ratio:.3f}, "
            f"errors {sum(r.errors.values()):,}\n"
        )
    return r


def _stderr(line: str) -> None:
    print(line, end="", file=sys.stderr, flush=True)
