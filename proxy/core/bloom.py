"""A classic Bloom filter: m bits, k probes, no false negatives.

Rules this module keeps:

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

import math
import struct

import mmh3

_LN2 = math.log(2)
_HEADER = struct.Struct("<4sBxxxQdQIQ")
_MAGIC = b"OHBF"
_VERSION = 1

KeyHash = tuple[int, int]


def key_hash(key: str | bytes) -> KeyHash:
    """The (h1, h2) pair every filter of this module probes with."""
    return mmh3.hash64(key, signed=False)


def optimal_size(capacity: int, fp_rate: float) -> tuple[int, int]:
    """(bits, probes) of a filter holding ``capacity`` keys at false-positive rate ``fp_rate``."""
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer of keys, got {capacity!r}")
    if not 0.0 < fp_rate < 1.0:
        raise ValueError(f"fp_rate must be between 0 and 1 (exclusive), got {fp_rate!r}")
    bits = math.ceil(-capacity * math.log(fp_rate) / (_LN2 * _LN2))
    probes = max(1, round(bits / capacity * _LN2))
    return bits, probes


def probe_positions(h: KeyHash, size_bits: int, num_hashes: int) -> list[int]:
    """The bit positions a key with hash ``h`` probes in a filter of that sizing: the same
    sequence ``add_hash`` and ``contains_hash`` walk (they inline it: it is their hot loop)."""
    pos, step = h[0] % size_bits, h[1] % size_bits
    out = []
    for _ in range(num_hashes):
        out.append(pos)
        pos += step
        if pos >= size_bits:
            pos -= size_bits
    return out


class BloomFilter:
    """A bit array over a bytearray with k mmh3 double-hashing probes."""

    __slots__ = ("_bits", "_count", "capacity", "fp_rate", "num_hashes", "size_bits")

    def __init__(self, capacity: int, fp_rate: float = 0.01) -> None:
        self.size_bits, self.num_hashes = optimal_size(capacity, fp_rate)
        self.capacity = capacity
        self.fp_rate = fp_rate
        self._bits = bytearray((self.size_bits + 7) // 8)
        self._count = 0

    def add(self, key: str | bytes) -> bool:
        """Record ``key``; True if it was (probably) present before."""
        return self.add_hash(key_hash(key))

    def __contains__(self, key: str | bytes) -> bool:
        return self.contains_hash(key_hash(key))

    def add_hash(self, h: KeyHash) -> bool:
        """``add`` for a key already hashed with ``key_hash``."""
        bits = self._bits
        m = self.size_bits
        pos, step = h[0] % m, h[1] % m
        present = True
        for _ in range(self.num_hashes):
            byte, mask = pos >> 3, 1 << (pos & 7)
            if not bits[byte] & mask:
                bits[byte] |= mask
                present = False
            pos += step
            if pos >= m:
                pos -= m
        if not present:
            self._count += 1
        return present

    def contains_hash(self, h: KeyHash) -> bool:
        """``in`` for a key already hashed with ``key_hash``."""
        bits = self._bits
        m = self.size_bits
        pos, step = h[0] % m, h[1] % m
        for _ in range(self.num_hashes):
            if not bits[pos >> 3] & (1 << (pos & 7)):
                return False
            pos += step
            if pos >= m:
                pos -= m
        return True

    def __len__(self) -> int:
        return self._count

    def fill_ratio(self) -> float:
        """Share of the bits that are set."""
        ones = int.from_bytes(self._bits, "little").bit_count()
        return ones / self.size_bits

    def estimated_fp_rate(self) -> float:
        """The false-positive rate a random absent key sees now: fill ratio to the power k."""
        return self.fill_ratio() ** self.num_hashes

    @property
    def memory_bytes(self) -> int:
        return len(self._bits)

    def clear(self) -> None:
        self._bits = bytearray(len(self._bits))
        self._count = 0

    def to_bytes(self) -> bytes:
        header = _HEADER.pack(
            _MAGIC,
            _VERSION,
            self.capacity,
            self.fp_rate,
            self.size_bits,
            self.num_hashes,
            self._count,
        )
        return header + bytes(self._bits)

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        """Rebuild a filter written by ``to_bytes``; ValueError on anything else."""
        if len(data) < _HEADER.size:
            raise ValueError(f"not a BloomFilter: {len(data)} bytes is shorter than its header")
        magic, version, capacity, fp_rate, size_bits, num_hashes, count = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not a BloomFilter (magic {magic!r}, version {version})")
        bf = cls(capacity, fp_rate)
        body = data[_HEADER.size :]
        if (bf.size_bits, bf.num_hashes) != (size_bits, num_hashes) or len(body) != len(bf._bits):
            raise ValueError("BloomFilter bytes do not match their header's sizing")
        bf._bits[:] = body
        bf._count = count
        return bf
