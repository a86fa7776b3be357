"""The admission window shared by a fleet through Redis.

What it guarantees:

* The same decisions as the in-process ``WindowedBloomFilter`` on the same keys and clock: the
  same mmh3 hashing and probe positions, the same generation sizing, the same rotation rules (a
  generation spans ``window / (g - 1)`` seconds, or ends early when it has recorded its share of
  first sightings). The test-then-record of every generation is one Lua script: one round trip
  per miss, atomic, so instances never see half a rotation.
* Generations are Redis bitmaps ``PREFIX:g:N`` that expire ``window * g / (g - 1)`` after their
  last write; the generation number, its start and its count of first sightings live in one hash,
  shared by every instance: in ``auto`` mode the fleet's first sightings fill one count, so every
  instance rotates together. In Redis the bitmaps keep the size of ``expected_urls``; the auto
  share (``auto_share``: the instance's own filter's current share, which its turnover sizer
  sets at each rotation) can lower, never raise, the count at which a generation rotates.
* A miss never waits more than ``budget`` seconds for Redis. Past that, or on any Redis error, the
  decision comes from the instance's own in-process filter (which records every sighting, so it
  is warm), the fallback is counted, a line is logged when the state changes, and Redis is tried
  again after ``retry_after`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from proxy.core.admission import SecondHit
from proxy.core.bloom import key_hash, probe_positions
from proxy.core.window import generation_sizing

log = logging.getLogger("onehit.shared")

# KEYS: state hash, bitmap key prefix. ARGV: now, span, generations, share, ttl ms, positions...
_SEEN_BEFORE = """
local state, prefix = KEYS[1], KEYS[2]
local now, span = tonumber(ARGV[1]), tonumber(ARGV[2])
local g, share, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local gen = tonumber(redis.call('HGET', state, 'gen') or '0')
local started = tonumber(redis.call('HGET', state, 'started') or 'nan')
if started ~= started then
  started = now
  redis.call('HSET', state, 'gen', gen, 'started', string.format('%.17g', now), 'count', 0)
elseif now - started >= span then
  local n = math.floor((now - started) / span)
  gen = gen + n
  started = started + n * span
  redis.call('HSET', state, 'gen', gen, 'started', string.format('%.17g', started), 'count', 0)
  redis.call('HINCRBY', state, 'rotations', math.min(n, g))
end
local newest = prefix .. gen
local present = 1
for i = 6, #ARGV do
  if redis.call('SETBIT', newest, ARGV[i], 1) == 0 then present = 0 end
end
redis.call('PEXPIRE', newest, ttl)
if present == 1 then return 1 end
local seen = 0
for j = 1, g - 1 do
  local key = prefix .. (gen - j)
  local all = 1
  for i = 6, #ARGV do
    if redis.call('GETBIT', key, ARGV[i]) == 0 then all = 0 break end
  end
  if all == 1 then seen = 1 break end
end
if redis.call('HINCRBY', state, 'count', 1) >= share then
  redis.call('HSET', state, 'gen', gen + 1, 'started', string.format('%.17g', now), 'count', 0)
  redis.call('HINCRBY', state, 'forced', 1)
  redis.call('HINCRBY', state, 'rotations', 1)
end
return seen
"""


class RedisWindow:
    """``WindowedBloomFilter.seen_before`` with its generations in Redis."""

    def __init__(
        self,
        client: aioredis.Redis,
        capacity: int,
        fp_rate: float = 0.01,
        window: float = 600.0,
        generations: int = 2,
        *,
        prefix: str = "onehit:bf",
        auto_share: Callable[[], int] | None = None,
    ) -> None:
        self.client = client
        self.share, self.size_bits, self.num_hashes = generation_sizing(
            capacity, fp_rate, generations
        )
        self.window = window
        self.generations = generations
        self._span = window / (generations - 1)
        self._ttl_ms = math.ceil(window * generations / (generations - 1) * 1000)
        self._keys = [f"{prefix}:state", f"{prefix}:g:"]
        self._auto_share = auto_share
        self._script = client.register_script(_SEEN_BEFORE)

    async def prepare(self) -> None:
        """Connect and load the script, so the first miss does not pay for either."""
        await self.client.script_load(_SEEN_BEFORE)

    async def seen_before(self, key: str | bytes, now: float) -> bool:
        share = self.share
        if self._auto_share is not None:
            share = max(1, min(share, self._auto_share()))
        positions = probe_positions(key_hash(key), self.size_bits, self.num_hashes)
        args = [repr(now), repr(self._span), self.generations, share, self._ttl_ms, *positions]
        return bool(await self._script(keys=self._keys, args=args))

    async def state(self) -> dict[str, str]:
        raw = await self.client.hgetall(self._keys[0])
        return {k.decode(): v.decode() for k, v in raw.items()}


class SharedSecondHit:
    """Second-hit admission decided by the fleet's Redis window, with a local fallback."""

    def __init__(
        self,
        local: SecondHit,
        remote: RedisWindow,
        budget: float = 0.005,
        retry_after: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.local = local
        self.remote = remote
        self.budget = budget
        self.retry_after = retry_after
        self.clock = clock
        self.fallbacks = 0
        self.remote_decisions = 0
        self.healthy = True
        self._retry_at = 0.0

    async def connect(self, timeout: float = 2.0) -> None:
        """Warm the connection at start-up; a Redis that does not answer yet is not an error
        (misses fall back until it does)."""
        try:
            await asyncio.wait_for(self.remote.prepare(), timeout)
        except (TimeoutError, RedisError, OSError) as exc:
            self.healthy = False
            self._retry_at = self.clock() + self.retry_after
            log.warning("shared admission filter unavailable at start (%r): using the local one",
                        exc)  # fmt: skip

    async def admit(self, key: str, size: int, now: float) -> bool:
        """The fleet's answer when Redis gives one within the budget, else this instance's."""
        local = self.local.admit(key, size, now)
        if not self.healthy and self.clock() < self._retry_at:
            self.fallbacks += 1
            return local
        try:
            shared = await asyncio.wait_for(self.remote.seen_before(key, now), self.budget)
        except (TimeoutError, RedisError, OSError) as exc:
            self.fallbacks += 1
            self._retry_at = self.clock() + self.retry_after
            if self.healthy:
                self.healthy = False
                log.warning("shared admission filter unavailable (%r): using the local one", exc)
            return local
        if not self.healthy:
            self.healthy = True
            log.warning("shared admission filter answers again: using it")
        self.remote_decisions += 1
        return shared

    def stats(self) -> dict[str, object]:
        return {
            "backend": "redis",
            "healthy": self.healthy,
            "remote_decisions": self.remote_decisions,
            "fallbacks": self.fallbacks,
            "budget_ms": self.budget * 1000,
        }
