"""``ChargedLRU``: a mapping whose values' charges sum to at most a limit, the least recently
used forgotten first, as cachetools' ``LRUCache(limit, getsizeof=charge)`` keeps one; but its
``in`` is the built-in dict's, so compiled code asks it with no Python frame (the disk tier's
hit path asks every hit whether its URL was uncacheable a moment ago)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ChargedLRU(OrderedDict[K, V]):
    """Setting a key makes it the most recently used, and forgets the least recently used
    keys while the charges are over ``limit``; ``get`` of a key it holds makes it the most
    recently used too. A value charged more than ``limit`` is refused (``ValueError``)."""

    def __init__(self, limit: int, charge: Callable[[V], int]) -> None:
        super().__init__()
        self.limit = limit
        self.charge = charge
        self.charged = 0  # the sum of the held values' charges

    def __setitem__(self, key: K, value: V) -> None:
        size = self.charge(value)
        if size > self.limit:
            raise ValueError(f"a value charged {size} is over the limit ({self.limit})")
        if key in self:
            del self[key]
        super().__setitem__(key, value)
        self.charged += size
        while self.charged > self.limit:
            del self[next(iter(self))]

    def __delitem__(self, key: K) -> None:
        self.charged -= self.charge(super().__getitem__(key))
        super().__delitem__(key)

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        if key not in self:
            return default
        self.move_to_end(key)
        return super().__getitem__(key)
