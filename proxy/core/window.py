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
* The generations and their rotation are compiled (``proxy.core._native``): the proxy and the
  simulator's compiled loop drive the same code.
* Rotation is lazy: it happens inside a call whose ``now`` crosses a boundary. Nothing here reads
  a clock or runs in the background; a clock that steps back never rotates.
* ``shared``: the generations live in memory that processes share (``shared_window_bytes`` of
  it, zeroed when first given), so every process records and tests the same keys: a key seen
  once by each of two processes is seen before. The first process lays the memory out; one
  whose settings differ is refused. Nothing locks: bits are set with an atomic OR, and a
  rotation is claimed with a compare-and-swap, so a process killed at any instant blocks no
  other (the rules are in ``proxy/core/native/shared_window.c``). One promise is weaker than
  a process's own window: a key recorded while another process rotates may be forgotten up
  to one span early (it then needs one sighting more). Timed rotations fall on a
  grid from the first call of any process; a forced one does not move it. Each generation
  holds ``capacity / (g - 1)`` keys' bits; with a ``sizer`` its share is the sizer's answer at
  each rotation, never above that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.core import _native
from proxy.core.bloom import optimal_size

if TYPE_CHECKING:
    from mmap import mmap

    # Memory a window may share with other processes: any writable buffer.
    SharedMemory = mmap | memoryview | bytearray

# Generations are sized at 90% of their fp_rate / g share: at the edge (every generation full)
# the union's expected rate is then 0.9 * fp_rate, so the bound holds as measured on a finite
# sample, not only in expectation. It costs 0.22 bits per key.
_FP_MARGIN = 0.9


def shared_window_bytes(capacity: int, fp_rate: float, generations: int) -> int:
    """The bytes of shared memory a window of these settings lays out (``shared``)."""
    share, _, _ = generation_sizing(capacity, fp_rate, generations)
    return int(_native.shared_window_bytes(share, fp_rate / generations * _FP_MARGIN, generations))


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


class WindowedBloomFilter(_native.Window):
    """Rotating Bloom filter generations: remembers keys for one window, then forgets them.

    ``seen_before(key, now)``, ``contains(key, now)`` and ``clear([now])`` are compiled;
    ``generations()`` gives the generations, newest first."""

    def __init__(
        self,
        capacity: int,
        fp_rate: float = 0.01,
        window: float = 600.0,
        generations: int = 2,
        *,
        sizer: Callable[[], int] | None = None,
        shared: SharedMemory | None = None,
    ) -> None:
        if not isinstance(generations, int) or generations < 2:
            raise ValueError(f"generations must be an integer >= 2, got {generations!r}")
        if not window > 0 or math.isinf(window):
            raise ValueError(f"window must be a positive number of seconds, got {window!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer of keys, got {capacity!r}")
        share, _, _ = generation_sizing(capacity, fp_rate, generations)
        gen_fp = fp_rate / generations * _FP_MARGIN
        super().__init__(share, gen_fp, window, generations, sizer, shared)
        self.fp_rate = fp_rate

    @property
    def capacity(self) -> int:
        """Distinct keys per window the newest generation is sized for."""
        return self.generation_share * (self.num_generations - 1)

    @property
    def generation_share(self) -> int:
        """First sightings after which the newest generation rotates."""
        return self.share

    def stats(self) -> FilterStats:
        bits = self.generations()
        gens = tuple(
            GenerationStats(len(g), g.capacity, fill, fill**g.num_hashes)
            for g, fill in ((g, g.fill_ratio()) for g in bits)
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
            memory_bytes=sum(g.memory_bytes for g in bits),
            window=self.window,
            generation_capacity=bits[0].capacity,
        )
