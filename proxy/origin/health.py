"""Each origin's recent answers as the proxy's own requests met them (passive health): of the
last ``RECENT`` requests to an origin, how many failed (no connection, a timeout, a reset, a
malformed answer) or were answered 5xx. ``/readyz`` reads it. A client cannot fill it
without the origin: an answer the proxy makes itself (a 504 for ``only-if-cached``, a 400)
never reached the origin, and is not counted. Bounded: one short queue per origin address,
and origins are the configuration's.
"""

from __future__ import annotations

from collections import deque
from urllib.parse import urlsplit

RECENT = 100

Address = tuple[str, int]


def origin_of(url: str) -> Address:
    """The address ``url``'s origin is kept under."""
    parts = urlsplit(url)
    return (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))


class OriginHealth:
    """The last ``RECENT`` outcomes of each origin's requests."""

    def __init__(self) -> None:
        self._recent: dict[Address, deque[bool]] = {}

    def record(self, origin: Address, failed: bool) -> None:
        recent = self._recent.get(origin)
        if recent is None:
            recent = self._recent[origin] = deque(maxlen=RECENT)
        recent.append(failed)

    def failing(self, origin: Address) -> tuple[int, int]:
        """Of ``origin``'s last requests, how many failed or were answered 5xx, and of how
        many."""
        recent = self._recent.get(origin, ())
        return sum(recent), len(recent)
