"""Each origin's recent answers as the proxy's own requests met them (passive health): of the
last ``RECENT`` requests to an origin within ``WINDOW`` seconds, how many failed (no
connection, a timeout, a reset, a malformed answer) or were answered as a server that is down
answers (``DOWN``). ``/readyz`` reads it.

A client cannot fill it without the origin:

* an answer the proxy makes itself (a 504 for ``only-if-cached``, a 400) never reached the
  origin, and is not counted;
* only GET and HEAD count (what a cache fetches): an application may answer another method
  501 or an endpoint 503 by design;
* a 500 is one URL's failure, which a client may ask for on purpose (``/err1``, ``/err2``...),
  not the origin's: only 502, 503 and 504 say the origin, or what stands behind it, is down;
* a request with a body the client streams (an upload) fails when the client stops sending:
  not counted;
* outcomes older than ``WINDOW`` are forgotten, so an origin that recovered is judged by what
  it did lately, even while hits alone reach the proxy.

Bounded: one short queue per origin address, and origins are the configuration's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

RECENT = 100
WINDOW = 60.0
DOWN = frozenset({502, 503, 504})
JUDGED_METHODS = frozenset({"GET", "HEAD"})

Address = tuple[str, int]


def origin_of(url: str) -> Address:
    """The address ``url``'s origin is kept under."""
    parts = urlsplit(url)
    return (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))


class OriginHealth:
    """The last ``RECENT`` outcomes of each origin's requests, each kept ``WINDOW`` seconds of
    ``clock``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._recent: dict[Address, deque[tuple[float, bool]]] = {}

    def answered(self, origin: Address, method: str, status: int) -> None:
        """The origin answered a ``method`` request with ``status``."""
        if method in JUDGED_METHODS:
            self._record(origin, status in DOWN)

    def failed(self, origin: Address, method: str, *, streamed_body: bool = False) -> None:
        """A ``method`` request got no answer from the origin (``streamed_body``: the client
        was streaming its body, and may have stopped)."""
        if method in JUDGED_METHODS and not streamed_body:
            self._record(origin, True)

    def _record(self, origin: Address, failed: bool) -> None:
        recent = self._recent.get(origin)
        if recent is None:
            recent = self._recent[origin] = deque(maxlen=RECENT)
        recent.append((self._clock(), failed))

    def failing(self, origin: Address) -> tuple[int, int]:
        """Of ``origin``'s requests within the window, how many failed or were answered as a
        server that is down answers, and of how many."""
        recent = self._recent.get(origin)
        if not recent:
            return 0, 0
        since = self._clock() - WINDOW
        while recent and recent[0][0] < since:
            recent.popleft()
        return sum(failed for _, failed in recent), len(recent)
