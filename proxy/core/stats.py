"""The counters: one definition for the proxy, the simulator and reports.

``Counters`` is what the engine increments; ``snapshot`` adds what the store and the filter know
and derives the ratios. A ratio over nothing is 0.0, never a division error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from proxy.core.store import CacheStore
from proxy.core.window import FilterStats

METRICS: dict[str, str] = {
    "requests": "GET/HEAD requests that consulted the cache",
    "hits": "requests answered from a fresh stored response, in memory or on disk",
    "hits_from_memory": "hits the memory tier answered (among hits)",
    "hits_from_disk": "hits the disk tier answered, memory holding nothing (among hits)",
    "misses": "requests that went to the origin (absent or stale)",
    "stale_served": "requests answered with a stale stored response",
    "served_in_grace": "stale answers past what the response allowed, every origin failing "
    "([cache] grace; among stale_served)",
    "revalidated": "stale responses the origin confirmed with 304",
    "stale_from_disk": "stale records of the disk tier served stale, as the rules allow",
    "revalidated_from_disk": "stale records of the disk tier revalidated with their validators",
    "bypass": "requests that did not consult the cache",
    "hit_ratio": "hits / requests",
    "byte_hit_ratio": "body bytes served from cache / body bytes served",
    "bytes_served": "body bytes served to clients",
    "hit_bytes": "body bytes served from cache",
    "admissions": "responses stored in memory (fetched, or promoted from disk)",
    "bytes_written": "body bytes stored in memory",
    "promoted": "disk hits kept in memory too (among admissions)",
    "rejected_first_sighting": "cacheable responses the admission filter kept out",
    "bytes_not_written": "body bytes the admission filter kept out",
    "too_large": "responses over the max object size (served, never stored)",
    "beyond_memory": "responses past this memory tier's largest body, kept by the tier behind "
    "it alone (a worker's share under --workers)",
    "uncacheable": "responses the HTTP rules forbid storing",
    "evictions": "entries evicted to make room",
    "evicted_bytes": "body bytes evicted to make room",
    "dead_writes": "entries evicted, or still resident, without a single hit",
    "dead_bytes": "body bytes of dead writes",
    "writes_saved": "bytes_not_written / (bytes_written + bytes_not_written)",
    "collapsed": "misses answered from another request's origin fetch",
    "hit_for_miss": "misses sent straight to the origin: the URL was recently uncacheable",
    "not_modified_answers": "client conditionals the cache answered with 304",
    "range_answers": "client Range requests the cache answered with 206 or 416",
    "cut_short": "origin bodies that ended early (never stored)",
    "too_many_variants": "responses not stored: their URL had max_variants variants already",
    "soft_purged": "fresh entries a soft purge marked stale (the next request revalidates)",
    "purged_in_flight": "responses not stored: their fetch began before a purge reaching them",
    "slice_hits": "slices of large objects answered from the store ([cache] slice_size)",
    "slice_fetches": "slices of large objects not stored: fetched, or shared with a fetch",
    "slice_mismatches": "objects whose slices disagreed on their validator (all refetched)",
    "origin_fetches": "requests sent to the origin",
    "origin_bytes": "body bytes received from the origin",
    "entries": "entries resident in the store",
    "bytes_used": "bytes charged to the store: bodies plus per-entry overhead",
    "filter_fill": "share of bits set in the fullest filter generation",
    "filter_fp_estimate": "estimated false-positive rate of the whole filter",
    "rotations": "filter generation rotations",
    "forced_rotations": "rotations because a generation reached its key share early",
    "filter_bytes": "memory of the filter's bit arrays",
    "sketch_bytes": "memory of the admission policy's count sketch and doorkeeper",
    "sketch_halvings": "times the count sketch aged (halved its counts, or was re-sized)",
    "policy_admitted": "misses the admission policy admitted",
    "policy_rejected": "misses the admission policy kept out",
    "adaptive_choice": "adaptive: the candidate deciding now (0 always, 1 second-hit, 2 tinylfu)",
    "adaptive_switches": "adaptive: times the deciding candidate changed",
}


# The hits of each tier (among ``hits``): one Prometheus counter labelled by tier.
TIER_HITS = {"memory": "hits_from_memory", "disk": "hits_from_disk"}
TIER_HITS_HELP = "hits by the tier that answered them"

# Metrics that go up and down (everything else only ever grows).
GAUGES = frozenset(
    {
        "hit_ratio",
        "byte_hit_ratio",
        "writes_saved",
        "entries",
        "bytes_used",
        "filter_fill",
        "filter_fp_estimate",
        "filter_bytes",
        "sketch_bytes",
        "adaptive_choice",
        "dead_writes",
        "dead_bytes",
    }
)


@dataclass(slots=True)
class Counters:
    requests: int = 0
    hits: int = 0
    hits_from_disk: int = 0
    misses: int = 0
    stale_served: int = 0
    served_in_grace: int = 0
    revalidated: int = 0
    stale_from_disk: int = 0
    revalidated_from_disk: int = 0
    bypass: int = 0
    bytes_served: int = 0
    hit_bytes: int = 0
    admissions: int = 0
    bytes_written: int = 0
    promoted: int = 0
    rejected_first_sighting: int = 0
    bytes_not_written: int = 0
    too_large: int = 0
    beyond_memory: int = 0
    uncacheable: int = 0
    collapsed: int = 0
    hit_for_miss: int = 0
    not_modified_answers: int = 0
    range_answers: int = 0
    cut_short: int = 0
    too_many_variants: int = 0
    soft_purged: int = 0
    purged_in_flight: int = 0
    slice_hits: int = 0
    slice_fetches: int = 0
    slice_mismatches: int = 0
    origin_fetches: int = 0
    origin_bytes: int = 0


def ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def snapshot(
    counters: Counters,
    store: CacheStore,
    filter_stats: FilterStats | None,
    policy_stats: dict[str, int] | None = None,
) -> dict[str, int | float]:
    """Every metric of ``METRICS`` at this instant, by name."""
    out: dict[str, int | float] = asdict(counters)
    policy_metrics = ("sketch_bytes", "sketch_halvings", "policy_admitted", "policy_rejected",
                      "adaptive_choice", "adaptive_switches")  # fmt: skip
    out.update(dict.fromkeys(policy_metrics, 0))
    out.update(policy_stats or {})
    out["hit_ratio"] = ratio(counters.hits, counters.requests)
    out["hits_from_memory"] = counters.hits - counters.hits_from_disk
    out["byte_hit_ratio"] = ratio(counters.hit_bytes, counters.bytes_served)
    out["writes_saved"] = ratio(
        counters.bytes_not_written, counters.bytes_written + counters.bytes_not_written
    )
    out["evictions"] = store.evictions
    out["evicted_bytes"] = store.evicted_bytes
    out["dead_writes"] = store.evicted_unread + store.resident_unread
    out["dead_bytes"] = store.evicted_unread_bytes + store.resident_unread_bytes
    out["entries"] = len(store)
    out["bytes_used"] = store.bytes_used
    if filter_stats is None:
        out.update(filter_fill=0.0, filter_fp_estimate=0.0, rotations=0, forced_rotations=0)
        out["filter_bytes"] = 0
    else:
        out["filter_fill"] = filter_stats.fill
        out["filter_fp_estimate"] = filter_stats.estimated_fp_rate
        out["rotations"] = filter_stats.rotations
        out["forced_rotations"] = filter_stats.forced_rotations
        out["filter_bytes"] = filter_stats.memory_bytes
    return {name: out[name] for name in METRICS}


# What a filter the caches share reports alike in each of them: counted once.
SHARED_FILTER = frozenset({"rotations", "forced_rotations", "filter_bytes"})


def combine(
    snapshots: list[dict[str, int | float]], *, shared_filter: bool = False
) -> dict[str, int | float]:
    """One snapshot for several caches (the workers of one proxy): counters and sizes add up,
    ratios are recomputed from the sums, filter fill and false-positive rate are the worst;
    with ``shared_filter`` (one admission window for all) its rotations and bytes count once."""
    out: dict[str, int | float] = {}
    once = SHARED_FILTER if shared_filter else frozenset()
    for name in METRICS:
        values = [s[name] for s in snapshots]
        worst = name in ("filter_fill", "filter_fp_estimate") or name in once
        out[name] = max(values, default=0) if worst else sum(values)
    out["hit_ratio"] = ratio(out["hits"], out["requests"])
    out["byte_hit_ratio"] = ratio(out["hit_bytes"], out["bytes_served"])
    out["writes_saved"] = ratio(
        out["bytes_not_written"], out["bytes_written"] + out["bytes_not_written"]
    )
    return out
