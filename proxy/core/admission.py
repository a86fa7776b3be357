"""Admission policies: which cacheable responses for missed keys get stored.

Rules this module keeps:

* A policy is asked once per cacheable response of a missed key (``admit``); hits never reach it.
* ``always`` admits everything: plain LRU, the baseline every report compares against.
* ``second-hit`` admits a key only if it was already seen within the window: the first miss
  records it and says no. Concurrent misses of one key are separate sightings.
* Policies are chosen by name from ``POLICIES``; an unknown name is an error that lists the known
  ones and the closest match.
* ``window="auto"`` sizes each filter generation for the number of objects the cache holds when
  full (read from the store at every rotation, smoothed, clamped to ``[min_keys, max_keys]``, times
  ``auto_scale``), so what is remembered follows the cache's turnover. ``max_window`` seconds still
  bound how long anything is remembered.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.core.names import unknown_name
from proxy.core.store import CacheStore
from proxy.core.window import FilterStats, WindowedBloomFilter


class AdmissionPolicy(Protocol):
    name: str

    def admit(self, key: str, size: int, now: float) -> bool:
        """True if a cacheable response of ``size`` bytes for missed ``key`` should be stored."""
        ...

    def filter_stats(self) -> FilterStats | None:
        """Health of the policy's filter, if it has one."""
        ...

    def reset(self, now: float) -> None:
        """Forget what the policy has learnt."""
        ...


class AlwaysAdmit:
    """CacheStore every cacheable response: plain LRU."""

    name = "always"

    def admit(self, key: str, size: int, now: float) -> bool:
        return True

    def filter_stats(self) -> None:
        return None

    def reset(self, now: float) -> None:
        return None


class SecondHit:
    """CacheStore a response only when its key was already seen inside the window."""

    name = "second-hit"

    def __init__(self, window: WindowedBloomFilter) -> None:
        self.window = window

    def admit(self, key: str, size: int, now: float) -> bool:
        return self.window.seen_before(key, now)

    def filter_stats(self) -> FilterStats:
        return self.window.stats()

    def reset(self, now: float) -> None:
        self.window.clear(now)


class TurnoverSizer:
    """Keys per generation for ``window="auto"``: the objects the cache holds, smoothed and clamped.

    ``objects`` is read at each rotation; an exponentially weighted mean (weight ``smoothing`` on
    the new reading) keeps one odd reading from swinging the window.
    """

    def __init__(
        self,
        objects: Callable[[], int],
        scale: float = 1.0,
        min_keys: int = 1024,
        max_keys: int = 50_000_000,
        smoothing: float = 0.5,
    ) -> None:
        if not scale > 0:
            raise ValueError(f"auto_scale must be positive, got {scale!r}")
        if not 1 <= min_keys <= max_keys:
            raise ValueError(f"need 1 <= min_keys <= max_keys, got {min_keys!r}, {max_keys!r}")
        self._objects = objects
        self.scale = scale
        self.min_keys = min_keys
        self.max_keys = max_keys
        self._smoothing = smoothing
        self._mean: float | None = None

    def initial(self) -> int:
        return self.min_keys

    def __call__(self) -> int:
        reading = self._objects()
        if reading > 0:
            if self._mean is None:
                self._mean = float(reading)
            else:
                self._mean += self._smoothing * (reading - self._mean)
        if self._mean is None:
            return self.min_keys
        return min(self.max_keys, max(self.min_keys, round(self.scale * self._mean)))


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Parameters of the admission policy; ``window`` is seconds or ``"auto"``."""

    policy: str = "second-hit"
    window: float | str = "auto"
    capacity: int = 1_000_000
    fp_rate: float = 0.01
    generations: int = 2
    max_window: float = 3600.0
    auto_scale: float = 1.0
    min_keys: int = 1024
    max_keys: int = 50_000_000

    def label(self) -> str:
        """A short name for reports: ``always``, ``second-hit(auto)``, ``second-hit(auto x2)``..."""
        if self.policy != "second-hit":
            return self.policy
        if self.window != "auto":
            return f"{self.policy}({_seconds_label(float(self.window))})"
        if self.auto_scale == 1.0:
            return f"{self.policy}(auto)"
        return f"{self.policy}(auto x{self.auto_scale:g})"


def _seconds_label(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _always(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    return AlwaysAdmit()


def _second_hit(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    g = config.generations
    if config.window == "auto":
        sizer = TurnoverSizer(
            store.estimated_capacity_objects,
            scale=config.auto_scale,
            min_keys=config.min_keys,
            max_keys=config.max_keys,
        )
        window = WindowedBloomFilter(
            sizer.initial() * (g - 1), config.fp_rate, config.max_window, g, sizer=sizer
        )
    else:
        seconds = float(config.window)
        if not seconds > 0 or math.isinf(seconds):
            raise ValueError(f"window must be 'auto' or a positive duration, got {config.window!r}")
        window = WindowedBloomFilter(config.capacity, config.fp_rate, seconds, g)
    return SecondHit(window)


POLICIES: dict[str, Callable[[AdmissionConfig, CacheStore], AdmissionPolicy]] = {
    "always": _always,
    "second-hit": _second_hit,
}


def make_policy(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    """The policy ``config.policy`` names, wired to ``store``; ValueError names the known ones."""
    try:
        factory = POLICIES[config.policy]
    except KeyError:
        raise ValueError(unknown_name("admission policy", config.policy, POLICIES)) from None
    return factory(config, store)
