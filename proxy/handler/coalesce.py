"""Single-flight: concurrent misses for one key share one origin fetch.

The first caller of a key is the leader and runs the fetch; callers arriving while it runs are
followers and wait, each until its own deadline, for the leader's result. ``waiting`` tells the
leader whether anyone is waiting, so it keeps a copy of the body for them. A leader that fails
lands its flight with ``None``: the key is free again, and the first follower to wake leads the
next fetch while the others follow it (one new leader, not a stampede). What a result means
beyond that (shareable, or "go to the origin yourselves") is the caller's. Nothing is cached
here; the flight ends with its leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Flight(Generic[T]):
    __slots__ = ("_future", "waiting")

    def __init__(self) -> None:
        # Made for the first follower: most flights have none.
        self._future: asyncio.Future[T | None] | None = None
        self.waiting = 0

    def result(self) -> asyncio.Future[T | None]:
        """The flight's result to come (made for its first follower, before it waits: a leader
        landing meanwhile sets it)."""
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
        return self._future

    def land(self, result: T | None) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(result)


class SingleFlight(Generic[T]):
    def __init__(self, wait_limit: float) -> None:
        self.wait_limit = wait_limit
        self._flights: dict[Hashable, Flight[T]] = {}

    async def join(self, key: Hashable) -> tuple[Flight[T] | None, T | None]:
        r"""Take ``key``'s turn, by the one rule every flight follows: lead a new flight when
        none is under way (``(flight, None)``: the caller fetches and ``end``\ s it), else
        follow it for up to ``wait_limit`` seconds and get its result (``(None, result)``).
        A leader that failed frees the key: the first follower to wake leads the next try,
        the others follow it. ``(None, None)``: the wait passed; the caller goes alone."""
        deadline = asyncio.get_running_loop().time() + self.wait_limit
        while True:
            flight = self.lead(key)
            if flight is not None:
                return flight, None
            result = await self.follow(key, deadline)
            if result is not None or asyncio.get_running_loop().time() >= deadline:
                return None, result

    def lead(self, key: Hashable) -> Flight[T] | None:
        """A new flight for ``key`` if none is under way (the caller leads it and must ``end`` it),
        else None (the caller follows with ``follow``)."""
        if key in self._flights:
            return None
        flight: Flight[T] = Flight()
        self._flights[key] = flight
        return flight

    async def follow(self, key: Hashable, deadline: float) -> T | None:
        """The result of the flight under way for ``key``; None if it failed, if none is under
        way, or once the event loop's clock passes ``deadline``."""
        flight = self._flights.get(key)
        if flight is None:
            return None
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return None
        flight.waiting += 1
        try:
            # Shielded: a follower that gives up does not cancel the result for the others.
            return await asyncio.wait_for(asyncio.shield(flight.result()), remaining)
        except TimeoutError:
            return None
        finally:
            flight.waiting -= 1

    def end(self, key: Hashable, flight: Flight[T], result: T | None) -> None:
        """Land ``flight`` with ``result`` (None: it failed; a follower leads the next try)."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        flight.land(result)

    def waiting(self, key: Hashable) -> int:
        """How many requests follow the flight under way for ``key`` (0 when none is)."""
        flight = self._flights.get(key)
        return 0 if flight is None else flight.waiting

    def __len__(self) -> int:
        return len(self._flights)
