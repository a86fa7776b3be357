"""``ChargedLRU``: a mapping whose values' charges sum to at most a limit, the least recently
used forgotten first, as cachetools' ``LRUCache(limit, getsizeof=charge)`` keeps one (but
reading ``lru[key]`` does not make it recently used: ``get`` does); its ``in`` is the
built-in dict's, so compiled code asks it with no Python frame (the disk tier's hit path
asks every hit whether its URL was uncacheable a moment ago)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_ABSENT: Any = object()


class ChargedLRU(OrderedDict[K, V]):
    """Setting a key makes it the most recently used, and forgets the least recently used
    keys while the charges are over ``limit``; ``get`` of a key it holds makes it the most
    recently used too. A value charged below 0 or above ``limit`` is refused
    (``ValueError``).
    Every way out (``del``, ``pop``, ``popitem``, ``clear``) keeps ``charged`` the sum of
    the held values' charges: ``OrderedDict``'s own do not call ``__delitem__``."""

    def __init__(self, limit: int, charge: Callable[[V], int]) -> None:
        super().__init__()
        self.limit = limit
        self.charge = charge
        self.charged = 0

    def __reduce__(self) -> Any:
        # Copied and pickled with its limit and charge (OrderedDict's calls ``cls()``).
        return (type(self), (self.limit, self.charge), None, None, iter(self.items()))

    def __setitem__(self, key: K, value: V) -> None:
        size = self.charge(value)
        if not 0 <= size <= self.limit:
            raise ValueError(f"a value charged {size}: expected 0 to the limit ({self.limit})")
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

    def peek(self, key: K) -> V | None:
        """The value of ``key``, or None; its place in the order is unchanged."""
        return super().get(key)

    def pop(self, key: K, default: Any = _ABSENT) -> Any:
        if key not in self:
            if default is _ABSENT:
                raise KeyError(key)
            return default
        value = super().__getitem__(key)
        del self[key]
        return value

    def popitem(self, last: bool = True) -> tuple[K, V]:
        if not self:
            raise KeyError("popitem(): the mapping is empty")
        key = next(reversed(self)) if last else next(iter(self))
        return key, self.pop(key)

    def clear(self) -> None:
        super().clear()
        self.charged = 0

    def copy(self) -> ChargedLRU[K, V]:
        copied: ChargedLRU[K, V] = ChargedLRU(self.limit, self.charge)
        for key, value in self.items():
            copied[key] = value
        return copied
