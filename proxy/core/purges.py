"""The purges made lately, so that a fetch already in flight cannot undo one: a response whose
fetch began before a purge that reaches it (its URL, a prefix of it, one of its tags) is not
stored after it, on any tier.

* A purge is recorded with the time it was made; a response carries the time its request went
  to the origin (``ResponseMeta.requested_at``). One made at or after that time reaches it.
* A purge is forgotten once it is older than ``horizon`` (the longest an origin exchange may
  last: no fetch begun before it is still in flight). A URL purged again is kept once, at its
  latest time.
* The record is bounded besides (``LIMIT`` purges, a URL kept as its hash). A response whose
  fetch began before the latest purge forgotten, for room or for age, is taken as reached,
  never stored on a guess: a clock that jumps forward past the horizon keeps out what was in
  flight.
* Times never run backwards here: a purge made at a time before the latest one is recorded at
  the latest. A wall clock stepped back between a fetch's start and a purge still hides that
  purge from that fetch (the times are the cache's, ``time.time``). But for a URL another
  process removed (``as_made``: another worker's removal, dated when that worker made it and
  heard of a little later): it keeps its own time, and reaches a fetch begun before it,
  never one begun after.
"""

from __future__ import annotations

from collections import OrderedDict

from proxy.core.keys import url_of

# Purges remembered at most (273 a second over a 60 s horizon): about 200 bytes each, whatever
# the URL's length (3.2 MiB in all, measured with tracemalloc).
LIMIT = 16384


class RecentPurges:
    """Purges by time made: of a URL (with all stored of it), of a prefix, of tags."""

    def __init__(self, horizon: float = float("inf"), limit: int = LIMIT) -> None:
        # (kind, what) -> when, oldest first: ("url", hash), ("prefix", text), ("tag", text).
        self._made: OrderedDict[tuple[str, object], float] = OrderedDict()
        self.horizon = horizon
        self._limit = limit
        self._latest = float("-inf")
        self._floor = float("-inf")  # when the latest purge dropped for room was made
        # The URLs recorded ``as_made`` after a later purge, at the time each was made:
        # ``_made`` holds them at the latest time then, in time order for ``reach``'s scan.
        self._earlier: dict[tuple[str, object], float] = {}

    def __len__(self) -> int:
        return len(self._made)

    def made(self, kind: str, value: str | list[str], now: float) -> None:
        """A purge as ``Removals.purge`` takes one (``kind``: "url", "prefix" or "tags"), made
        at ``now``."""
        if isinstance(value, str):
            (self.url if kind == "url" else self.prefix)(value, now)
        else:
            self.tags(value, now)

    def url(self, key: str, now: float, as_made: bool = False) -> None:
        """A purge of the URL of ``key`` (with its variants and slices) at ``now``; ``as_made``:
        another process made it then (see the module's rules)."""
        self._add(("url", hash(url_of(key))), now, as_made)

    def prefix(self, prefix: str, now: float) -> None:
        """A purge of every URL beginning with ``prefix`` at ``now``."""
        self._add(("prefix", prefix), now)

    def tags(self, tags: list[str] | tuple[str, ...], now: float) -> None:
        """A purge of everything carrying one of ``tags`` at ``now``."""
        for tag in tags:
            self._add(("tag", tag), now)

    def _add(self, what: tuple[str, object], now: float, as_made: bool = False) -> None:
        made, earlier = self._made, self._earlier
        before = made.pop(what, None)
        if before is not None:  # purged again: it reaches what began before either purge
            now = max(now, earlier.pop(what, before))
        at = self._latest = max(now, self._latest)
        made[what] = at
        if as_made and now < at:
            earlier[what] = now
        while made:
            oldest, when = next(iter(made.items()))
            if when >= at - self.horizon and len(made) <= self._limit:
                break
            del made[oldest]
            earlier.pop(oldest, None)
            # A fetch begun before it may still be in flight when it was dropped for room, or
            # when the clock jumped forward past the horizon: such a fetch is taken as reached.
            self._floor = max(self._floor, when)

    def reach(self, key: str, tags: tuple[str, ...], since: float) -> bool:
        """Whether a purge made at or after ``since`` reaches what is stored under ``key``
        carrying ``tags``; True, too, when one made then may have been forgotten."""
        if not self._made or since == float("-inf") or since > self._latest:
            return False
        if since <= self._floor:
            return True
        url = url_of(key)
        hashed = hash(url)
        for (kind, what), made in reversed(self._made.items()):
            if made < since:
                break
            if kind == "url":
                if what == hashed and self._earlier.get((kind, what), made) >= since:
                    return True
            elif kind == "prefix":
                if url.startswith(what):  # type: ignore[arg-type]
                    return True
            elif what in tags:
                return True
        return False
