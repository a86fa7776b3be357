"""What the cache removes, and from where: every removal the engine decides, and every one an
operator or another worker asks for, goes to the memory store and, through the one contract of
``proxy.core.tiers``, to every tier behind it (``behind``).

* ``invalidate`` removes a URL with its variants and slices (an unsafe method's success, a
  response that may not be stored, one that starts to vary); ``forget`` one stored key;
  ``remove_slices`` an object's slices when its version changed under them.
* ``purge`` is an operator's: a URL, a prefix or tags, removed or (``soft``) marked stale,
  remembered (``RecentPurges``) so that a response fetched since before it is not stored
  after it, and answered once every tier made it durable.
* ``forgotten_elsewhere``: another process that shares the tiers (a worker of the same
  machine) removed a key from them; this one's memory lets it go too.
* ``resize`` and every eviction leave the variant, tag and slice indexes as they leave the
  store (``left_memory``).
"""

from __future__ import annotations

from proxy.core import slices
from proxy.core.events import Purged
from proxy.core.keys import url_of, whole_url
from proxy.core.purges import RecentPurges
from proxy.core.slices import SliceIndex
from proxy.core.stats import Counters
from proxy.core.store import CacheStore, Entry
from proxy.core.tags import TagIndex
from proxy.core.tiers import CHANGED, PURGE, UNSAFE, Tier, forgotten_keys
from proxy.core.variants import Variants


class Removals:
    """The removals from ``store`` (and its indexes: ``variants``, ``tags``, ``slices``) and
    from the tiers ``behind`` it; ``recent_purges`` remembers the purges, ``counters`` counts
    the soft ones."""

    def __init__(
        self,
        store: CacheStore,
        variants: Variants,
        tags: TagIndex,
        slice_index: SliceIndex,
        counters: Counters,
        recent_purges: RecentPurges,
    ) -> None:
        self.store = store
        self.variants = variants
        self.tags = tags
        self.slices = slice_index
        self.counters = counters
        self.recent_purges = recent_purges
        self.behind: tuple[Tier, ...] = ()

    def invalidate(self, url: str, why: str = UNSAFE) -> int:
        """Remove ``url`` and every stored variant and slice of it, from the store and from
        every tier behind it (``proxy.core.tiers``); how many entries went (a tier's record
        of the URL counted as one)."""
        removed = self._drop_url_from_memory(url)
        for tier in self.behind:
            removed += tier.forget(url, why)
        return removed

    def forgotten_elsewhere(self, key: str, now: float) -> int:
        """Another process that shares the tiers behind the store (a worker of the same
        machine) forgot ``key`` (as ``forget`` or ``invalidate`` name one) in them: remove it
        from this store alone (at ``now``: what this process is fetching of it since before is
        not stored after); how many entries went."""
        self.recent_purges.url(key, now, as_made=True)
        own = forgotten_keys(key)[0]
        return (
            self._drop_url_from_memory(own) if whole_url(key) else int(self.drop_from_memory(own))
        )

    def _drop_url_from_memory(self, url: str) -> int:
        """Remove ``url`` and its variants and slices from the store alone; how many went."""
        return sum(
            self.drop_from_memory(key)
            for key in (url, *self.variants.pop(url), *self.slices.pop(url))
        )

    def forget(self, key: str, why: str) -> bool:
        """Remove the entry stored under ``key`` (a URL's own, a variant's or a slice's) from
        the store and from every tier behind it; whether the store held one."""
        gone = self.drop_from_memory(key)
        for tier in self.behind:
            tier.forget(key, why)
        return gone

    def left_memory(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """``entries`` left the store: they leave the variant, tag and slice indexes too."""
        self.variants.forget(entries)
        self.tags.forget(entries)
        self.slices.forget(entries)

    def resize(self, capacity_bytes: int, max_object_bytes: int | None = None) -> int:
        """The memory tier takes a new size (``CacheStore.resize``): what it evicts leaves
        the indexes as every eviction does; how many entries it evicted."""
        gone = self.store.resize(capacity_bytes, max_object_bytes)
        self.left_memory(gone)
        return len(gone)

    def drop_from_memory(self, key: str) -> bool:
        """Remove the entry stored under ``key`` from the store (and it from the indexes),
        and from no other tier; whether one was."""
        gone = self.store.delete(key)
        if gone is None:
            return False
        self.left_memory((gone,))
        return True

    def remove_slices(self, url: str) -> int:
        """Remove the stored slices of ``url`` (its version changed under them), from every
        tier; how many the store held."""
        removed = sum(self.drop_from_memory(key) for key in self.slices.pop(url))
        for tier in self.behind:
            tier.forget(slices.anchor_key(url), CHANGED)
        return removed

    def _purge_tags(self, tags: list[str]) -> int:
        """Remove every stored entry (each variant on its own) carrying any of ``tags``, from
        every tier; how many the store held."""
        removed = sum(self.drop_from_memory(key) for key in self.tags.tagged(tags))
        self._purge_behind("tags", tags)
        return removed

    def _purge_prefix(self, prefix: str) -> int:
        """Remove every stored URL starting with ``prefix`` (with its variants and slices),
        from every tier; how many entries the store held."""
        urls = {url_of(key) for key in self._stored_keys(prefix=prefix)}
        removed = sum(self._drop_url_from_memory(url) for url in urls)
        self._purge_behind("prefix", prefix)
        return removed

    def purge(self, kind: str, value: str | list[str], now: float, *, soft: bool = False) -> Purged:
        """An operator's purge of what ``kind`` ("url": a cache key, "prefix" or "tags") and
        ``value`` name, from every tier: removed, or (``soft``) marked stale where a tier can
        mark it (``_soft_purge``); a tier that cannot removes it. Answers
        once every tier made it durable (``Tier.durable``). A response fetched since before
        it is not stored after it (``RecentPurges``)."""
        count = self._purge(kind, value, now, soft)
        return Purged(count, soft, self._durable())

    def purge_urls(self, urls: list[str], now: float) -> Purged:
        """``purge`` of each of ``urls`` (cache keys), made durable once for them all (a batch
        another worker purged)."""
        count = sum(self._purge("url", url, now, False) for url in urls)
        return Purged(count, False, self._durable())

    def _purge(self, kind: str, value: str | list[str], now: float, soft: bool) -> int:
        """``purge`` but for its durability: how many entries the store held."""
        self.recent_purges.made(kind, value, now)
        if soft:
            count = self._soft_purge(self._stored_keys(**{kind: value}), now)
            self._purge_behind(kind, value)
            return count
        if kind == "url":
            return self.invalidate(value, PURGE)  # type: ignore[arg-type]
        if kind == "prefix":
            return self._purge_prefix(value)  # type: ignore[arg-type]
        return self._purge_tags(value)  # type: ignore[arg-type]

    def _durable(self) -> bool:
        """Whether every tier behind the store put what it was told on its device."""
        return all([tier.durable() for tier in self.behind])

    def _purge_behind(self, kind: str, value: str | list[str]) -> None:
        """Hand a purge (see ``purge``) to every tier behind the store: a URL is forgotten,
        a prefix or each tag banned."""
        for tier in self.behind:
            if kind == "url":
                tier.forget(value, PURGE)  # type: ignore[arg-type]
            elif kind == "prefix":
                tier.ban(value, by_tag=False)  # type: ignore[arg-type]
            else:
                for tag in value:
                    tier.ban(tag, by_tag=True)

    def _stored_keys(
        self,
        *,
        url: str | None = None,
        prefix: str | None = None,
        tags: list[str] | None = None,
    ) -> set[str]:
        """The store keys of what a purge of ``url`` (with its variants and slices), of
        ``prefix`` or of ``tags`` would remove."""
        if url is not None:
            known = self.variants.urls.get(url)
            return {url, *(known[1] if known is not None else ()), *self.slices.keys(url)}
        if prefix is not None:
            return {key for key in self.store if key.startswith(prefix)}
        return self.tags.tagged(tags or ())

    def _soft_purge(self, keys: set[str], now: float) -> int:
        """Mark the fresh entries of ``keys`` stale at ``now`` (soft purge): the next request
        revalidates one, or is answered with it stale where the response's own
        ``stale-while-revalidate`` or ``stale-if-error`` allow (never for what a client
        asks: ``client_leeway``); how many were marked."""
        marked = 0
        for key in keys:
            entry = self.store.peek(key)
            if entry is None:
                continue
            # One stale already is marked too: no client's leeway serves it either.
            entry.soft_purged = True
            if entry.age(now) < entry.lifetime:
                entry.lifetime = entry.age(now)
                marked += 1
        self.counters.soft_purged += marked
        return marked
