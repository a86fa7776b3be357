"""The purges made lately, so that a fetch already in flight cannot undo one: a response whose
fetch began before a purge that reaches it (its URL, a prefix of it, one of its tags) is not
stored after it, on any tier.

* A purge is recorded with the time it was made; a response carries the time its request went
  to the origin (``ResponseMeta.requested_at``). One made at or after that time reaches it.
* The record is bounded (``LIMIT`` purges, a URL kept as its hash): a response whose fetch
  began before the oldest purge still recorded was dropped is taken as reached, never stored
  on a guess.
"""

from __future__ import annotations

from collections import deque

# Purges remembered: about 100 bytes each, whatever the URL's length.
LIMIT = 4096

_URL, _PREFIX, _TAGS = 0, 1, 2


def url_of(key: str) -> str:
    """The URL a store key is of (a variant's or a slice's key begins with its URL)."""
    return key.partition("\0")[0]


class RecentPurges:
    """Purges by time made: of a URL (with all stored of it), of a prefix, of tags."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._made: deque[tuple[float, int, object]] = deque()
        self._limit = limit
        self._floor = float("-inf")  # when the latest purge no longer recorded was made

    def __len__(self) -> int:
        return len(self._made)

    def url(self, key: str, now: float) -> None:
        """A purge of the URL of ``key`` (with its variants and slices) at ``now``."""
        self._add(now, _URL, hash(url_of(key)))

    def prefix(self, prefix: str, now: float) -> None:
        self._add(now, _PREFIX, prefix)

    def tags(self, tags: list[str] | tuple[str, ...], now: float) -> None:
        self._add(now, _TAGS, frozenset(tags))

    def _add(self, now: float, kind: int, value: object) -> None:
        made = self._made
        made.append((now, kind, value))
        if len(made) > self._limit:
            self._floor = max(self._floor, made.popleft()[0])

    def reach(self, key: str, tags: tuple[str, ...], since: float) -> bool:
        """Whether a purge made at or after ``since`` reaches what is stored under ``key``
        carrying ``tags``; True, too, when one made then may have been dropped."""
        if not self._made or since == float("-inf"):
            return False
        if since <= self._floor:
            return True
        url = url_of(key)
        hashed = None
        for made, kind, value in reversed(self._made):
            if made < since:
                break
            if kind == _URL:
                if hashed is None:
                    hashed = hash(url)
                if value == hashed:
                    return True
            elif kind == _PREFIX:
                if url.startswith(value):  # type: ignore[arg-type]
                    return True
            elif not value.isdisjoint(tags):  # type: ignore[attr-defined]
                return True
        return False
