"""A Bloom filter that forgets: ``g`` rotating generations over a time window.

Rules this module keeps (each is pinned by a test):

* The newest generation records; every generation answers. A key is reported seen if any
  generation holds it. Generation ``i`` spans ``window / (g - 1)`` seconds, so a key recorded at
  ``t`` is reported seen at every ``now <= t + window`` (no false negative inside the window) and
  forgotten by ``t + window * g / (g - 1)``.
* Each generation is sized for its share of the keys, ``capacity / (g - 1)`` at ``fp_rate / g``
  (less a 10% margin), so while at most ``capacity`` distinct keys arrive per window the union
  of the generations stays at or below ``fp_rate``. A generation that reaches its share before
  its time is up is rotated at once (a *forced* rotation, counted): a flood of unique keys makes
  the filter forget sooner, never saturate.
* With a ``sizer`` the share is not fixed: at every rotation the new generation is sized for, and
  will rotate after recording, ``sizer()`` keys. The time window then only bounds how long a
  key can be remembered when traffic is slow.
* Rotation is lazy: it happens inside a call whose ``now`` crosses a boundary. Nothing here reads
  a clock or runs in the background; a clock that steps back never rotates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from proxy.core.bloom import BloomFilter, key_hash, optimal_size

# Generations are sized at 90% of their fp_rate / g share: at the edge (every generation full)
# the union's expected rate is then 0.9 * fp_rate, so the bound holds as measured on a finite
# sample, not only in expectation. It costs 0.22 bits per key.
_FP_MARGIN = 0.9


def generation_sizing(capacity: int, fp_rate: float, generations: int) -> tuple[int, int, int]:
    """(keys per generation, bits, probes) of each generation of a windowed filter."""
    share = math.ceil(capacity / (generations - 1))
    bits, probes = optimal_size(share, fp_rate / generations * _FP_MARGIN)
    return share, bits, probes


@dataclass(frozen=True, slots=True)
class GenerationStats:
    keys: int
    capacity: int
    fill: float
    estimated_fp_rate: float


@dataclass(frozen=True, slots=True)
class FilterStats:
    """Health of a windowed filter at one instant."""

    generations: tuple[GenerationStats, ...]
    fill: float
    estimated_fp_rate: float
    rotations: int
    forced_rotations: int
    memory_bytes: int
    window: float
    generation_capacity: int


class WindowedBloomFilter:
    """Rotating Bloom filter generations: remembers keys for one window, then forgets them."""

    def __init__(
        self,
        capacity: int,
        fp_rate: float = 0.01,
        window: float = 600.0,
        generations: int = 2,
        *,
        sizer: Callable[[], int] | None = None,
    ) -> None:
        if not isinstance(generations, int) or generations < 2:
            raise ValueError(f"generations must be an integer >= 2, got {generations!r}")
        if not window > 0 or math.isinf(window):
            raise ValueError(f"window must be a positive number of seconds, got {window!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer of keys, got {capacity!r}")
        self.fp_rate = fp_rate
        self.window = window
        self.num_generations = generations
        self._span = window / (generations - 1)
        self._gen_fp = fp_rate / generations * _FP_MARGIN
        self._sizer = sizer
        share, _, _ = generation_sizing(capacity, fp_rate, generations)
        self._gens = [BloomFilter(share, self._gen_fp) for _ in range(generations)]
        self._written = [-math.inf] * generations
        self._started: float | None = None
        self.rotations = 0
        self.forced_rotations = 0

    @property
    def capacity(self) -> int:
        """Distinct keys per window the newest generation is sized for."""
        return self._gens[0].capacity * (self.num_generations - 1)

    @property
    def generation_share(self) -> int:
        """First sightings after which the newest generation rotates."""
        return self._gens[0].capacity

    def seen_before(self, key: str | bytes, now: float) -> bool:
        """Test ``key``, then record it in the newest generation; one call."""
        self._advance(now)
        h = key_hash(key)
        gens = self._gens
        newest = gens[0]
        self._written[0] = now
        if newest.add_hash(h):
            return True
        seen = False
        for i in range(1, len(gens)):
            if gens[i].contains_hash(h):
                seen = True
                break
        if len(newest) >= newest.capacity:
            self.forced_rotations += 1
            self._rotate(now)
        return seen

    def contains(self, key: str | bytes, now: float) -> bool:
        """Test ``key`` without recording it."""
        self._advance(now)
        h = key_hash(key)
        return any(gen.contains_hash(h) for gen in self._gens)

    def clear(self, now: float | None = None) -> None:
        """Forget everything; the next generation starts at ``now`` (or at the next call)."""
        for gen in self._gens:
            gen.clear()
        self._written = [-math.inf] * self.num_generations
        self._started = now

    def stats(self) -> FilterStats:
        gens = tuple(
            GenerationStats(len(g), g.capacity, g.fill_ratio(), g.estimated_fp_rate())
            for g in self._gens
        )
        miss_all = 1.0
        for g in gens:
            miss_all *= 1.0 - g.estimated_fp_rate
        return FilterStats(
            generations=gens,
            fill=max(g.fill for g in gens),
            estimated_fp_rate=1.0 - miss_all,
            rotations=self.rotations,
            forced_rotations=self.forced_rotations,
            memory_bytes=sum(g.memory_bytes for g in self._gens),
            window=self.window,
            generation_capacity=self._gens[0].capacity,
        )

    def _advance(self, now: float) -> None:
        started = self._started
        if started is None:
            self._started = now
            return
        if now - started < self._span:
            return
        elapsed = int((now - started) // self._span)
        due = min(elapsed, self.num_generations)
        # The oldest generation goes only once its last write is out of the window: in exact
        # arithmetic that always holds here, and it keeps the guarantee when floats round.
        while due and self._written[-1] + self.window < now:
            self._rotate(now)
            due -= 1
        if not due:
            self._started = started + elapsed * self._span

    def _rotate(self, now: float) -> None:
        """Drop the oldest generation and start an empty newest one at ``now``."""
        oldest = self._gens.pop()
        self._written.pop()
        self._written.insert(0, -math.inf)
        share = oldest.capacity if self._sizer is None else max(1, self._sizer())
        if share == oldest.capacity:
            oldest.clear()
        else:
            oldest = BloomFilter(share, self._gen_fp)
        self._gens.insert(0, oldest)
        self._started = now
        self.rotations += 1
