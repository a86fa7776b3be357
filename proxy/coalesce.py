"""Single-flight: concurrent misses for one key share one origin fetch.

The first caller of a key is the leader and runs the fetch; callers arriving while it runs are
followers and wait (at most ``wait_limit`` seconds) for the leader's result. A leader that fails,
or a result that cannot be shared (a streamed body), releases the followers with ``None``: each
then fetches on its own. Nothing is cached here; the flight ends with its leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Flight(Generic[T]):
    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()

    async def wait(self) -> T | None:
        """The flight's result; a waiter that gives up does not cancel it for the others."""
        return await asyncio.shield(self._future)

    def land(self, result: T | None) -> None:
        if not self._future.done():
            self._future.set_result(result)


class SingleFlight(Generic[T]):
    def __init__(self, wait_limit: float) -> None:
        self.wait_limit = wait_limit
        self._flights: dict[Hashable, Flight[T]] = {}

    def lead(self, key: Hashable) -> Flight[T] | None:
        """A new flight for ``key`` if none is under way (the caller leads it and must ``end`` it),
        else None (the caller follows with ``follow``)."""
        if key in self._flights:
            return None
        flight: Flight[T] = Flight()
        self._flights[key] = flight
        return flight

    async def follow(self, key: Hashable) -> T | None:
        """The result of the flight under way for ``key``; None if it fails, cannot be shared,
        ends without a flight, or takes longer than ``wait_limit``."""
        flight = self._flights.get(key)
        if flight is None:
            return None
        try:
            return await asyncio.wait_for(flight.wait(), self.wait_limit)
        except TimeoutError:
            return None

    def end(self, key: Hashable, flight: Flight[T], result: T | None) -> None:
        """Land ``flight`` with ``result`` (None: followers fetch for themselves)."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        flight.land(result)

    def __len__(self) -> int:
        return len(self._flights)
