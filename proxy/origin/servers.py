"""A route's several origin servers (``[[routes]] servers``), as nginx's ``upstream`` block
keeps them: which one a request goes to, and which are down.

Rules this module keeps:

* A request goes to a server picked by smooth weighted round robin (nginx's) among the
  primary servers that are up; when none is, among the backups that are up; when none of
  those either, among all of them (a guess beats refusing every request).
* A server is down for ``fail_timeout`` seconds once ``max_fails`` of its requests failed
  (no connection, a timeout, a reset or a malformed answer before any byte of a response)
  within ``fail_timeout`` of each other; an answer, whatever its status, is the server
  up. ``max_fails = 0`` never marks one down.
* With a probe (``[[routes]] probe``), a server whose probe is not answered as expected is
  down until one is, whatever its requests do; a probe answered as expected lifts only that:
  a server its requests marked down stays down for its ``fail_timeout``.
* Nothing here does I/O: ``Upstream`` tells it each outcome and each probe's, and the clock
  is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.config.settings import Probe, Server


@dataclass
class _State:
    server: Server
    current: int = 0  # smooth weighted round robin's running weight
    fails: int = 0
    first_fail: float = 0.0
    down_until: float = 0.0  # marked down by its requests until then
    probe_down: bool = False  # its last probe was not answered as expected
    requests: int = 0
    failures: int = 0


class ServerGroup:
    """``servers`` of one route, judged by ``max_fails`` within ``fail_timeout`` seconds of
    ``clock`` (see the module's rules)."""

    def __init__(
        self,
        servers: Sequence[Server],
        max_fails: int = 1,
        fail_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        probe: Probe | None = None,
    ) -> None:
        if not servers:
            raise ValueError("a server group needs a server")
        self.max_fails = max_fails
        self.fail_timeout = fail_timeout
        self.probe = probe
        self._clock = clock
        self._states = [_State(server) for server in servers]
        self._by_url = {state.server.url: state for state in self._states}

    @property
    def servers(self) -> tuple[Server, ...]:
        return tuple(state.server for state in self._states)

    def up(self, url: str) -> bool:
        """Whether ``url``'s server is up: not marked down, or its time down is over."""
        return _up(self._by_url[url], self._clock())

    def pick(self, tried: frozenset[str] | set[str] = frozenset()) -> str | None:
        """The URL of the server the next request goes to, but one of ``tried``; None when
        every server was tried."""
        now = self._clock()
        left = [s for s in self._states if s.server.url not in tried]
        for choice in (
            [s for s in left if not s.server.backup and _up(s, now)],
            [s for s in left if s.server.backup and _up(s, now)],
            left,
        ):
            if choice:
                return _smooth_weighted(choice).server.url
        return None

    def succeeded(self, url: str) -> None:
        """``url``'s server answered."""
        state = self._by_url[url]
        state.requests += 1
        state.fails = 0
        state.down_until = 0.0

    def failed(self, url: str) -> None:
        """``url``'s server failed a request before any byte of a response."""
        state = self._by_url[url]
        now = self._clock()
        state.requests += 1
        state.failures += 1
        if state.fails == 0 or now - state.first_fail > self.fail_timeout:
            state.fails, state.first_fail = 0, now
        state.fails += 1
        if self.max_fails and state.fails >= self.max_fails:
            state.down_until = now + self.fail_timeout
            state.fails = 0

    def probed(self, url: str, answered: bool) -> None:
        """``url``'s server answered its probe as expected (``answered``), or not."""
        self._by_url[url].probe_down = not answered

    def states(self) -> list[dict[str, object]]:
        """Each server, in order: its URL, weight, whether a backup, up, its requests and
        failures (``/stats``, ``/metrics``)."""
        now = self._clock()
        return [
            {
                "url": s.server.url,
                "weight": s.server.weight,
                "backup": s.server.backup,
                "up": _up(s, now),
                "requests": s.requests,
                "failures": s.failures,
            }
            for s in self._states
        ]


def _up(state: _State, now: float) -> bool:
    return state.down_until <= now and not state.probe_down


def _smooth_weighted(states: list[_State]) -> _State:
    """nginx's smooth weighted round robin: each turn every server's running weight grows by
    its weight, the largest is picked and falls by the total; over ``sum(weights)`` turns each
    is picked ``weight`` times, spread out."""
    total = 0
    best = states[0]
    for state in states:
        state.current += state.server.weight
        total += state.server.weight
        if state.current > best.current:
            best = state
    best.current -= total
    return best
