"""A look inside the cache for its operator (``GET /cache`` on the admin port, ``onehit-proxy
inspect URL``): what is stored for a URL, in which tier, how fresh, how often hit, and what
admission and hit-for-miss think of it; or the keys memory holds under a prefix.

Rules this module keeps:

* Looking changes nothing: no entry is touched, counted or moved in an eviction order, no
  sighting is recorded in an admission's filter, and a disk record is read without being
  answered from (its body read off the event loop when it is long, as a hit's would be).
* A listing is bounded (at most ``MAX_LIMIT`` keys) and yields to the event loop every
  ``CHUNK`` entries it scans, so a million stored entries never hold the hit path up. It
  lists memory only: the disk tier's index holds hashes, not keys.
* A URL is keyed as a request for it is (``Router.url_key``): a host the proxy refuses is a
  ``ValueError``, which the endpoint answers 400.
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from typing import Any

from proxy.core.cache_status import ttl_of
from proxy.core.engine import fresh
from proxy.core.keys import shown_key
from proxy.core.rfc9110 import get_first
from proxy.core.store import Entry
from proxy.handler.server import Proxy

CHUNK = 4096
MAX_LIMIT = 1000


def _when(seconds: float) -> str:
    """``seconds`` since the epoch as RFC 3339 in UTC."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _ttl(entry: Entry, age: float) -> int | None:
    """A hit's ttl at ``age`` (``ttl_of``); None for an entry that never expires."""
    return ttl_of(entry.lifetime, age) if math.isfinite(entry.lifetime) else None


def entry_view(entry: Entry, now: float, hits: int | None) -> dict[str, Any]:
    """What an operator asks of a stored response: its key, status, size, when stored, age,
    lifetime and ttl (null: it never expires), freshness, validators, Vary, tags, cache
    directives, and the answers served from it (``hits``; null where the tier counts none)."""
    age = entry.age(now)
    return {
        "key": shown_key(entry.key),
        "status": entry.status,
        "size": entry.size,
        "stored_at": _when(entry.stored_at),
        "age": round(age, 3),
        "lifetime": entry.lifetime if math.isfinite(entry.lifetime) else None,
        "ttl": _ttl(entry, age),
        # As the engine judges a request without directives: a no-cache entry is not.
        "fresh": fresh(entry, age, {}) and not entry.soft_purged,
        "soft_purged": entry.soft_purged,
        "validators": {
            "etag": get_first(entry.headers, "etag"),
            "last_modified": get_first(entry.headers, "last-modified"),
        },
        "vary": get_first(entry.headers, "vary"),
        "tags": list(entry.tags),
        "directives": dict(entry.directives),
        "hits": hits,
    }


async def describe(proxy: Proxy, url: str) -> dict[str, Any]:
    """Everything the cache holds and thinks of ``url`` (see the module's rules)."""
    key = proxy.router.url_key(url)
    engine, now = proxy.engine, proxy.clock()
    store = engine.store

    def in_memory(stored_key: str) -> dict[str, Any] | None:
        entry = store.peek(stored_key)
        return None if entry is None else entry_view(entry, now, store.index.hits(entry.key_hash))

    names, variant_keys = engine.variants.urls.get(key, ((), set()))
    disk = proxy.disk
    on_disk: dict[str, Any] | None = None
    if disk is not None:
        record = await disk.reads.lookup_off_loop(key, Entry)
        on_disk = None if record is None else entry_view(record, now, None)
    window = getattr(engine.admission, "window", None)
    until = engine.uncacheable_until(key)
    return {
        "url": url,
        "key": shown_key(key),
        "memory": in_memory(key),
        "variants": {
            "vary": list(names),
            "memory": [v for v in map(in_memory, sorted(variant_keys)) if v is not None],
        },
        "disk": on_disk if disk is not None else "no disk tier",
        "admission": {
            "policy": engine.admission.name,
            # Second hit's question, asked without recording a sighting: would the next
            # response for it be admitted as a second sighting?
            "seen_in_window": None if window is None else window.contains(key, now),
        },
        "hit_for_miss": None if until is None or until <= now else round(until - now, 3),
    }


async def listing(proxy: Proxy, prefix: str, limit: int) -> dict[str, Any]:
    """The keys memory holds that begin with ``prefix`` (a cache key, as a purge's prefix),
    at most ``limit`` of them, each with its size, status and ttl."""
    store, now = proxy.engine.store, proxy.clock()
    found: list[dict[str, Any]] = []
    scanned = 0
    keys = list(store)  # a snapshot: the store may change while this yields
    for start in range(0, len(keys), CHUNK):
        for key in keys[start : start + CHUNK]:
            scanned += 1
            if not key.startswith(prefix):
                continue
            entry = store.peek(key)
            if entry is None:  # gone since the snapshot
                continue
            found.append({"key": shown_key(key), "size": entry.size, "status": entry.status,
                          "ttl": _ttl(entry, entry.age(now))})  # fmt: skip
            if len(found) >= limit:
                return {"prefix": prefix, "keys": found, "truncated": True, "scanned": scanned}
        await asyncio.sleep(0)
    return {"prefix": prefix, "keys": found, "truncated": False, "scanned": scanned}
