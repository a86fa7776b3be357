"""A classic Bloom filter: m bits, k probes, no false negatives.

Rules this module keeps:

* The bits, the probing and the sizing are compiled (``proxy.core._native``); this module
  gives them their Python face and their file format.
* Sizing is the textbook optimum for ``capacity`` keys at ``fp_rate``:
  ``m = ceil(-n ln p / (ln 2)^2)`` bits and ``k = round(m / n * ln 2)`` probes.
* A key is hashed once with MurmurHash3 x64/128 (mmh3); the two 64-bit halves drive
  Kirsch-Mitzenmacher double hashing, probe ``i`` being ``(h1 + i * h2) mod m``.
  Callers that test the same key against several filters hash it once (see ``key_hash``).
* Bits only ever go from 0 to 1 until ``clear()``: a key added is reported present for ever after.
* ``len()`` counts adds that set at least one new bit, an estimate of distinct keys recorded
  (an add whose every bit was already set is indistinguishable from a repeat).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from proxy.core import _native

_HEADER = struct.Struct("<4sBxxxQdQIQ")
_MAGIC = b"OHBF"
_VERSION = 1

KeyHash = tuple[int, int]

key_hash: Callable[[str | bytes], KeyHash] = _native.hash64
"""The (h1, h2) pair every filter of this module probes with: mmh3.hash64(key, signed=False)."""

optimal_size: Callable[[int, float], tuple[int, int]] = _native.optimal_size
"""(bits, probes) of a filter holding ``capacity`` keys at false-positive rate ``fp_rate``;
ValueError names a bad argument."""


def probe_positions(h: KeyHash, size_bits: int, num_hashes: int) -> list[int]:
    """The bit positions a key with hash ``h`` probes in a filter of that sizing: the sequence
    the compiled filter walks, for stores that keep the bits elsewhere (Redis)."""
    pos, step = h[0] % size_bits, h[1] % size_bits
    out = []
    for _ in range(num_hashes):
        out.append(pos)
        pos += step
        if pos >= size_bits:
            pos -= size_bits
    return out


class BloomFilter(_native.Bloom):
    """A bit array with k mmh3 double-hashing probes (compiled): ``add``, ``in``, ``len``,
    ``add_hash``/``contains_hash`` for pre-hashed keys, ``fill_ratio``, ``clear``."""

    __slots__ = ()

    def estimated_fp_rate(self) -> float:
        """The false-positive rate a random absent key sees now: fill ratio to the power k."""
        return self.fill_ratio() ** self.num_hashes

    def to_bytes(self) -> bytes:
        header = _HEADER.pack(
            _MAGIC,
            _VERSION,
            self.capacity,
            self.fp_rate,
            self.size_bits,
            self.num_hashes,
            len(self),
        )
        return header + self.raw_bits()

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        """Rebuild a filter written by ``to_bytes``; ValueError on anything else."""
        if len(data) < _HEADER.size:
            raise ValueError(f"not a BloomFilter: {len(data)} bytes is shorter than its header")
        magic, version, capacity, fp_rate, size_bits, num_hashes, count = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not a BloomFilter (magic {magic!r}, version {version})")
        bf = cls(capacity, fp_rate)
        if (bf.size_bits, bf.num_hashes) != (size_bits, num_hashes):
            raise ValueError("BloomFilter bytes do not match their header's sizing")
        bf.load_raw_bits(data[_HEADER.size :], count)
        return bf
