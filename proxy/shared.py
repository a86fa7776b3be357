"""The admission window shared by a fleet through Redis.

What it guarantees:

* The same decisions as the in-process ``WindowedBloomFilter`` on the same keys and clock: the
  same mmh3 hashing and probe positions, the same generation sizing, the same rotation rules (a
  generation spans ``window / (g - 1)`` seconds, or ends early when it has recorded its share of
  first sightings). Test-then-record is one Lua script, atomic, so instances never see half a
  rotation; the decisions of the misses of one event-loop turn go in one call (one round trip
  for the batch).
* Bounded memory: the generations are a ring of ``g`` fixed bitmaps, ``{PREFIX}:g:0`` ..
  ``{PREFIX}:g:<g-1>``, beside one small hash ``{PREFIX}:state`` (generation number, its start,
  its count of first sightings, rotation counts). Rotating clears, in the same atomic step, the
  bitmap of the generation that leaves the window, and creates the new one at its full size at
  once (so Redis allocates it exactly, not by doubling). Redis holds ``g`` bitmaps of
  ``size_bits / 8`` bytes and the hash, whatever the traffic; they also expire after a window
  without writes, so an abandoned prefix cleans itself up.
* One clock: rotation by time follows Redis's own ``TIME``, so instances whose clocks disagree
  still rotate together (``redis_time=False`` takes the caller's ``now`` instead: tests).
* Every key the script touches is passed in ``KEYS`` and carries the hash tag ``{PREFIX}``: the
  script runs unchanged on Redis Cluster, Valkey and managed Redis services.
* In Redis the bitmaps keep the size of ``expected_urls``; the auto share (``auto_share``: the
  instance's own filter's current share, which its turnover sizer sets at each rotation) can
  lower, never raise, the count at which a generation rotates.
* A miss never waits for Redis more than ``budget`` seconds of Redis's time: a timer that fires
  late because the event loop was busy gives the reply, which may be unread in the socket, one
  more budget. Past that, or on any Redis error, the decision comes from the instance's own
  in-process filter (which records every sighting, so it is warm), the fallback is counted, a
  line is logged when the state changes, and Redis is tried again after ``retry_after`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError

from proxy.core.admission import CompiledPolicy
from proxy.core.bloom import key_hash, probe_positions
from proxy.core.window import generation_sizing

log = logging.getLogger("onehit.shared")
T = TypeVar("T")

# KEYS: the state hash, then the g bitmaps of the ring. ARGV: now (negative: Redis's TIME),
# span, share, ttl ms, size in bits, probes per key, then the probe positions of each key.
_SEEN_BEFORE = """
local state = KEYS[1]
local g = #KEYS - 1
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local span, share, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local last, k = tonumber(ARGV[5]) - 1, tonumber(ARGV[6])
local function slot(n) return KEYS[2 + (n % g)] end
local function fresh(key)
  redis.call('DEL', key)
  redis.call('SETBIT', key, last, 0)
end
local gen = tonumber(redis.call('HGET', state, 'gen') or '0')
local started = tonumber(redis.call('HGET', state, 'started') or 'nan')
local count = tonumber(redis.call('HGET', state, 'count') or '0')
local rotations, forced = 0, 0
if started ~= started then
  for j = 0, g - 1 do redis.call('DEL', KEYS[2 + j]) end
  fresh(slot(gen))
  started = now
elseif now - started >= span then
  local n = math.floor((now - started) / span)
  for j = 1, math.min(n, g) do fresh(slot(gen + j)) end
  gen = gen + n
  started = started + n * span
  count = 0
  rotations = rotations + math.min(n, g)
end
local out = {}
for item = 0, (#ARGV - 6) / k - 1 do
  local first = 7 + item * k
  local newest = slot(gen)
  local present = 1
  for i = first, first + k - 1 do
    if redis.call('SETBIT', newest, ARGV[i], 1) == 0 then present = 0 end
  end
  local seen = present
  if present == 0 then
    for j = 1, g - 1 do
      local older = slot(gen - j)
      local all = 1
      for i = first, first + k - 1 do
        if redis.call('GETBIT', older, ARGV[i]) == 0 then all = 0 break end
      end
      if all == 1 then seen = 1 break end
    end
    count = count + 1
    if count >= share then
      gen = gen + 1
      fresh(slot(gen))
      started = now
      count = 0
      forced = forced + 1
      rotations = rotations + 1
    end
  end
  out[#out + 1] = seen
end
redis.call('HSET', state, 'gen', gen, 'started', string.format('%.17g', started), 'count', count)
if rotations > 0 then redis.call('HINCRBY', state, 'rotations', rotations) end
if forced > 0 then redis.call('HINCRBY', state, 'forced', forced) end
redis.call('PEXPIRE', state, ttl)
redis.call('PEXPIRE', slot(gen), ttl)
return out
"""


class RedisWindow:
    """``WindowedBloomFilter.seen_before`` with its generations in Redis (a ``redis.asyncio``
    client, single node or cluster)."""

    def __init__(
        self,
        client: Any,
        capacity: int,
        fp_rate: float = 0.01,
        window: float = 600.0,
        generations: int = 2,
        *,
        prefix: str = "onehit:bf",
        auto_share: Callable[[], int] | None = None,
        redis_time: bool = True,
    ) -> None:
        self.client = client
        self.share, self.size_bits, self.num_hashes = generation_sizing(
            capacity, fp_rate, generations
        )
        self.window = window
        self.generations = generations
        self.redis_time = redis_time
        self._span = window / (generations - 1)
        self._ttl_ms = math.ceil(window * generations / (generations - 1) * 1000)
        tag = "{" + prefix + "}"
        self.keys = [f"{tag}:state", *(f"{tag}:g:{i}" for i in range(generations))]
        self._auto_share = auto_share
        self._script = client.register_script(_SEEN_BEFORE)

    def memory_bytes(self) -> int:
        """What the ring's bitmaps take in Redis (before the allocator rounds them up)."""
        return self.generations * math.ceil(self.size_bits / 8)

    async def prepare(self) -> None:
        """Connect and load the script, so the first miss does not pay for either."""
        await self.client.script_load(_SEEN_BEFORE)

    async def seen_before_many(self, keys: Sequence[str | bytes], now: float) -> list[bool]:
        """``seen_before`` for each of ``keys`` in order, in one round trip."""
        share = self.share
        if self._auto_share is not None:
            share = max(1, min(share, self._auto_share()))
        args: list[object] = [
            repr(now) if not self.redis_time else "-1",
            repr(self._span), share, self._ttl_ms, self.size_bits, self.num_hashes,
        ]  # fmt: skip
        for key in keys:
            args.extend(probe_positions(key_hash(key), self.size_bits, self.num_hashes))
        return [bool(seen) for seen in await self._script(keys=self.keys, args=args)]

    async def seen_before(self, key: str | bytes, now: float) -> bool:
        return (await self.seen_before_many([key], now))[0]

    async def state(self) -> dict[str, str]:
        raw = await self.client.hgetall(self.keys[0])
        return {k.decode(): v.decode() for k, v in raw.items()}


class SharedSecondHit:
    """Second-hit admission decided by the fleet's Redis window, with a local fallback."""

    def __init__(
        self,
        local: CompiledPolicy,
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
        self.batches = 0
        self.healthy = True
        self._retry_at = 0.0
        self._pending: list[tuple[str, float, asyncio.Future[bool]]] = []
        self._sending: set[asyncio.Task[None]] = set()

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
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)  # the misses of this loop turn go as one batch
        self._pending.append((key, now, answer))
        try:
            shared = await answer
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

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[str, float, asyncio.Future[bool]]]) -> None:
        self.batches += 1
        try:
            keys = [key for key, _, _ in batch]
            seen = await within_budget(self.remote.seen_before_many(keys, batch[-1][1]),
                                       self.budget)  # fmt: skip
        except (TimeoutError, RedisError, OSError) as exc:
            for _, _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            return
        for (_, _, answer), value in zip(batch, seen, strict=True):
            if not answer.done():
                answer.set_result(value)

    async def close(self) -> None:
        await asyncio.gather(*self._sending, return_exceptions=True)

    def stats(self) -> dict[str, object]:
        return {
            "backend": "redis",
            "healthy": self.healthy,
            "remote_decisions": self.remote_decisions,
            "fallbacks": self.fallbacks,
            "batches": self.batches,
            "budget_ms": self.budget * 1000,
        }


async def within_budget(call: Awaitable[T], budget: float) -> T:
    """``call``'s result, or TimeoutError once it has had ``budget`` seconds. A timer that fires
    late (by half the budget or more) says the event loop was busy, not the other side: the
    reply may be waiting unread, so the call gets one more budget, once."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call)
    for _ in range(2):
        due = loop.time() + budget
        done, _ = await asyncio.wait({task}, timeout=budget)
        if done:
            return task.result()
        if loop.time() - due < budget / 2:
            break
    task.cancel()
    raise TimeoutError(f"no answer within {budget * 1000:g} ms")
