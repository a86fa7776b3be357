"""Synthetic CDN traffic: Zipf popularity, one-hit wonders, object sizes, churn and arrivals.

The generator guarantees:

* Same spec (seed included), same trace, byte for byte: everything is drawn from one numpy
  ``Generator`` seeded with ``spec.seed``, in a fixed order.
* ``one_hit_share`` of the requests go to objects requested exactly once in the whole trace; they
  are spread uniformly through it. The rest follow Zipf(``alpha``) over ``objects`` ranks.
* ``churn`` is the share of ranks handed to brand-new objects every ``churn_period`` requests:
  popularity drifts, the way new content displaces old on a real CDN.
* ``crawler_share`` of the requests come from a crawler sweeping the catalogue's tail (the
  least popular ``crawler_tail`` of the ``objects`` ranks) in rank order, each URL once per
  sweep, starting again at the sweep's end: what search and AI crawlers do to a CDN. Its
  requests are spread uniformly through the trace, and ask for the object each rank holds
  then (after churn). A spec without a crawler draws what it drew before crawlers existed.
* An object keeps one size for the whole trace; arrivals are Poisson at ``rate`` per second.
* Keys are the decimal object id; popular ids are shuffled so an id says nothing of its rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loadgen.traces.trace import Trace
from proxy.core.units import format_size, parse_size


@dataclass(frozen=True, slots=True)
class SizeSpec:
    """Object sizes: ``fixed`` bytes each, or ``lognormal`` around ``median`` up to ``max``."""

    kind: str = "lognormal"
    median: int = 16 * 1024
    sigma: float = 1.0
    max: int = 16 * 1024 * 1024
    fixed: int = 16 * 1024

    @classmethod
    def parse(cls, text: str) -> SizeSpec:
        """``fixed:4KiB`` or ``lognormal:median=16KiB,sigma=1.2,max=8MiB`` (any field optional)."""
        kind, _, rest = text.partition(":")
        if kind == "fixed":
            if not rest:
                raise ValueError("size 'fixed' needs a size, like fixed:4KiB")
            return cls(kind="fixed", fixed=_positive_size("fixed", rest))
        if kind != "lognormal":
            raise ValueError(f"size distribution {kind!r} is unknown; use fixed:SIZE or lognormal")
        fields: dict[str, object] = {}
        for item in filter(None, rest.split(",")):
            name, eq, value = item.partition("=")
            if not eq or name not in ("median", "sigma", "max"):
                raise ValueError(
                    f"lognormal field {item!r} is not median=SIZE, sigma=NUMBER or max=SIZE"
                )
            if name == "sigma":
                try:
                    fields[name] = float(value)
                except ValueError:
                    raise ValueError(f"lognormal sigma {value!r} is not a number") from None
            else:
                fields[name] = _positive_size(name, value)
        return cls(kind="lognormal", **fields)  # type: ignore[arg-type]

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.fixed}"
        return f"lognormal:median={self.median},sigma={self.sigma:g},max={self.max}"


def _positive_size(name: str, text: str) -> int:
    size = parse_size(text)
    if size < 1:
        raise ValueError(f"{name} size must be at least 1 byte, got {text!r}")
    return size


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    objects: int = 100_000
    requests: int = 1_000_000
    alpha: float = 0.8
    one_hit_share: float = 0.25
    sizes: SizeSpec = SizeSpec()
    churn: float = 0.0
    churn_period: int = 100_000
    rate: float = 1000.0
    seed: int = 1
    crawler_share: float = 0.0
    crawler_tail: float = 0.9

    def describe(self) -> str:
        """The workload in words and numbers, for reports."""
        sizes = (
            f"every object {format_size(self.sizes.fixed)}"
            if self.sizes.kind == "fixed"
            else f"lognormal sizes (median {format_size(self.sizes.median)}, sigma "
            f"{self.sizes.sigma:g}, at most {format_size(self.sizes.max)})"
        )
        churn = (
            f", {self.churn:.0%} of popularity ranks handed to new objects every "
            f"{self.churn_period:,} requests"
            if self.churn
            else ""
        )
        crawler = (
            f", {self.crawler_share:.0%} of requests from a crawler sweeping the least popular "
            f"{self.crawler_tail:.0%} of the catalogue in order"
            if self.crawler_share
            else ""
        )
        return (
            f"{self.requests:,} requests, Zipf alpha {self.alpha:g} over {self.objects:,} "
            f"popular objects, {self.one_hit_share:.0%} of requests for one-hit wonders, "
            f"{sizes}{churn}{crawler}, {self.rate:,.0f} requests/s, seed {self.seed}"
        )

    def __post_init__(self) -> None:
        for name in ("objects", "requests", "churn_period", "seed"):
            if type(getattr(self, name)) is not int:  # a TOML true or 2.5 is refused here
                raise ValueError(f"workload: {name} is a whole number, not "
                                 f"{getattr(self, name)!r}")  # fmt: skip
        checks = [
            (self.objects >= 1, "objects must be >= 1"),
            (self.requests >= 1, "requests must be >= 1"),
            (self.alpha >= 0, "alpha must be >= 0"),
            (0 <= self.one_hit_share < 1, "one_hit_share must be in [0, 1)"),
            (0 <= self.crawler_share < 1, "crawler_share must be in [0, 1)"),
            (
                self.one_hit_share + self.crawler_share < 1,
                "one_hit_share + crawler_share must be below 1 (some requests are popular)",
            ),
            (0 < self.crawler_tail <= 1, "crawler_tail must be in (0, 1]"),
            (0 <= self.churn <= 1, "churn must be in [0, 1]"),
            (self.churn_period >= 1, "churn_period must be >= 1"),
            (self.rate > 0 and math.isfinite(self.rate), "rate must be a positive number"),
            (self.sizes.sigma >= 0, "sigma must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"workload: {message}")


def generate(spec: WorkloadSpec) -> Trace:
    """The trace ``spec`` describes."""
    rng = np.random.default_rng(spec.seed)
    n = spec.requests
    n_once = round(n * spec.one_hit_share)
    n_crawl = round(n * spec.crawler_share)
    n_popular = n - n_once - n_crawl

    weights = np.arange(1, spec.objects + 1, dtype=np.float64) ** -spec.alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n_popular), side="right")
    ranks = np.minimum(ranks, spec.objects - 1)

    rank_to_id = rng.permutation(spec.objects).astype(np.int64)
    crawler = _Crawler(spec, n, n_once, n_crawl, rng) if n_crawl else None
    next_id = spec.objects
    popular_ids = np.empty(n_popular, dtype=np.int64)
    replaced = round(spec.churn * spec.objects)
    for period, start in enumerate(range(0, max(1, n_popular), spec.churn_period)):
        if start and replaced:
            moved = rng.choice(spec.objects, size=replaced, replace=False)
            rank_to_id[moved] = np.arange(next_id, next_id + replaced)
            next_id += replaced
        stop = start + spec.churn_period
        popular_ids[start:stop] = rank_to_id[ranks[start:stop]]
        if crawler is not None:
            crawler.take(period, rank_to_id)

    ids = np.empty(n, dtype=np.int64)
    once = np.zeros(n, dtype=bool)
    once[crawler.once if crawler else rng.choice(n, size=n_once, replace=False)] = True
    ids[once] = np.arange(next_id, next_id + n_once)
    popular = ~once
    if crawler is not None:
        ids[crawler.positions] = crawler.ids
        popular[crawler.positions] = False
    ids[popular] = popular_ids
    total_objects = next_id + n_once
    object_sizes = _object_sizes(spec.sizes, total_objects, rng)
    times = np.cumsum(rng.exponential(1.0 / spec.rate, size=n))
    times -= times[0]
    return Trace(times, ids, object_sizes[ids], None)


class _Crawler:
    """Where a trace's crawler requests go (``positions``, among those not for one-hit
    wonders, ``once``) and what they ask for: the tail's ranks in order, each mapped to the
    object it holds in the churn period of the popular requests around it (``take``)."""

    def __init__(
        self, spec: WorkloadSpec, n: int, n_once: int, n_crawl: int, rng: np.random.Generator
    ) -> None:
        self.once = rng.choice(n, size=n_once, replace=False)
        others = np.setdiff1d(np.arange(n), self.once, assume_unique=True)
        self.positions = np.sort(rng.choice(others, size=n_crawl, replace=False))
        first = spec.objects - max(1, round(spec.objects * spec.crawler_tail))
        self.ranks = first + np.arange(n_crawl) % (spec.objects - first)
        # Popular requests before each crawler request: its churn period is theirs.
        before = self.positions - np.searchsorted(np.sort(self.once), self.positions)
        self.period = (before - np.arange(n_crawl)) // spec.churn_period
        self.ids = np.empty(n_crawl, dtype=np.int64)

    def take(self, period: int, rank_to_id: np.ndarray) -> None:
        """The ranks' objects in churn ``period`` (the last takes every later request)."""
        mine = self.period >= period
        self.ids[mine] = rank_to_id[self.ranks[mine]]


def _object_sizes(sizes: SizeSpec, count: int, rng: np.random.Generator) -> np.ndarray:
    if sizes.kind == "fixed":
        return np.full(count, sizes.fixed, dtype=np.int64)
    drawn = sizes.median * np.exp(sizes.sigma * rng.standard_normal(count))
    return np.clip(np.rint(drawn), 1, sizes.max).astype(np.int64)
