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
* A miss waits for Redis at most its budget, which follows Redis's measured round trips within
  configured bounds (``redis_budget`` .. ``redis_budget_max``); a timer that fires late because
  the event loop was busy gives the reply, which may be unread in the socket, one more budget.
  Past that, or on a Redis error, that decision comes from the instance's own in-process filter
  (which records every sighting, so it is warm) and the fallback is counted. Only a refused
  connection, or ``trip_after`` unanswered waits in a row, opens the breaker: then every
  decision is local for ``retry_after`` seconds, a line is logged when the state changes, and
  Redis is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from proxy.core.admission import CompiledPolicy
from proxy.core.bloom import key_hash, probe_positions
from proxy.core.window import generation_sizing

log = logging.getLogger("onehit.shared")
T = TypeVar("T")

# The budget is this many times the recent p99 of Redis's round trips (within its bounds),
# recomputed every BUDGET_EVERY round trips over the last ROUND_TRIPS_KEPT.
LATENCY_FACTOR = 2.0
BUDGET_EVERY = 32
ROUND_TRIPS_KEPT = 512
# A call to Redis is given up after this long (or four times the largest budget) whoever waits.
GIVE_UP_AFTER = 1.0

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


@dataclass(eq=False, slots=True)
class _Batch:
    """The decisions of one event-loop turn's misses, asked of Redis in one call."""

    keys: list[str] = field(default_factory=list)
    answers: list[asyncio.Future[bool]] = field(default_factory=list)
    now: float = 0.0
    sent: float = math.inf  # the loop's time when the call went out
    overdue: bool = False  # its call took longer than the largest budget, or failed


class SharedSecondHit:
    """Second-hit admission decided by the fleet's Redis window, with a local fallback.

    The budget a miss waits for Redis follows Redis's measured round trips (``LATENCY_FACTOR``
    times their recent p99, as the event loop sees them) between ``budget`` and
    ``max_budget``; a reply that comes after its waiters gave up is measured all the same. A
    wait that runs out costs that decision alone. The breaker opens, and every decision is the
    local filter's for ``retry_after`` seconds, when Redis refuses the connection or
    ``trip_after`` calls in a row took longer than ``max_budget`` or failed: not on late
    replies of a busy event loop."""

    def __init__(
        self,
        local: CompiledPolicy,
        remote: RedisWindow,
        budget: float = 0.005,
        retry_after: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_budget: float = 0.05,
        trip_after: int = 3,
    ) -> None:
        self.local = local
        self.remote = remote
        self.min_budget = budget
        self.max_budget = max(budget, max_budget)
        self.budget = budget
        self.retry_after = retry_after
        self.trip_after = trip_after
        self.clock = clock
        self.fallbacks = 0
        self.remote_decisions = 0
        self.batches = 0
        self.late_replies = 0  # decisions whose wait ran out before Redis's reply came
        self.trips = 0  # times the breaker opened
        self.healthy = True
        self._overdue_in_row = 0
        self._retry_at = 0.0
        self._round_trips: deque[float] = deque(maxlen=ROUND_TRIPS_KEPT)
        self._measured_count = 0  # round trips taken in, all told
        self._filling: _Batch | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def connect(self, timeout: float = 2.0) -> None:
        """Warm the connection at start-up; a Redis that does not answer yet is not an error
        (misses fall back until it does)."""
        try:
            # In this task, not one of wait_for's: a start cancelled meanwhile leaves no task
            # behind to end later with an exception nobody reads.
            async with asyncio.timeout(timeout):
                await self.remote.prepare()
        except (TimeoutError, RedisError, OSError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # redis-py may turn the cancellation of a read into its own TimeoutError.
                raise asyncio.CancelledError from exc
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
        batch = self._filling
        if batch is None:
            batch = self._filling = _Batch()
            loop.call_soon(self._flush)  # the misses of this loop turn go as one batch
        answer: asyncio.Future[bool] = loop.create_future()
        batch.keys.append(key)
        batch.answers.append(answer)
        batch.now = now
        budget = self.budget
        try:
            shared = await within_budget(answer, budget)
        except TimeoutError as exc:
            answer.cancel()  # nobody waits for it now: its call sets nothing on it
            self.late_replies += 1
            if budget >= self.max_budget:  # no answer in the longest wait there is
                self._overdue(batch, exc)
            self.fallbacks += 1
            return local
        except (RedisError, OSError):
            self.fallbacks += 1  # the call's failure was judged where it failed
            return local
        self.remote_decisions += 1
        return shared

    def _overdue(self, batch: _Batch, exc: BaseException, *, refused: bool = False) -> None:
        """Count ``batch``'s call as one Redis did not answer in time (once), and open the
        breaker when Redis refused it or ``trip_after`` calls in a row went so."""
        if not batch.overdue:
            batch.overdue = True
            self._overdue_in_row += 1
        if refused or self._overdue_in_row >= self.trip_after:
            self._retry_at = self.clock() + self.retry_after
            if self.healthy:
                self.healthy = False
                self.trips += 1
                log.warning("shared admission filter unavailable (%r): using the local one", exc)

    def _flush(self) -> None:
        batch, self._filling = self._filling, None
        assert batch is not None
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: _Batch) -> None:
        self.batches += 1
        loop = asyncio.get_running_loop()
        batch.sent = loop.time()
        try:
            # Past its waiters' budget the call goes on, so that its round trip is measured,
            # up to a bound: a Redis that never answers holds no task for long.
            seen = await asyncio.wait_for(
                self.remote.seen_before_many(batch.keys, batch.now),
                max(GIVE_UP_AFTER, 4 * self.max_budget),
            )
        except (TimeoutError, RedisError, OSError) as exc:
            self._overdue(batch, exc, refused=_refused(exc))
            for answer in batch.answers:
                if not answer.done():
                    answer.set_exception(exc)
            return
        round_trip = loop.time() - batch.sent
        self._measured(round_trip)
        if round_trip < self.max_budget:
            self._overdue_in_row = 0
            if not self.healthy:
                self.healthy = True
                log.warning("shared admission filter answers again: using it")
        else:
            self._overdue(batch, TimeoutError(f"a reply after {round_trip * 1000:.0f} ms"))
        for answer, value in zip(batch.answers, seen, strict=True):
            if not answer.done():
                answer.set_result(value)

    def _measured(self, round_trip: float) -> None:
        """Take in one round trip; at the first ``BUDGET_EVERY`` of them, and every
        ``BUDGET_EVERY`` after, the budget follows their recent p99."""
        self._round_trips.append(round_trip)
        self._measured_count += 1
        if self._measured_count <= BUDGET_EVERY or self._measured_count % BUDGET_EVERY == 0:
            p99 = self.round_trip_p99()
            assert p99 is not None
            self.budget = min(self.max_budget, max(self.min_budget, LATENCY_FACTOR * p99))

    def round_trip_p99(self) -> float | None:
        """The p99 of the round trips measured lately, in seconds; None before the first."""
        if not self._round_trips:
            return None
        ordered = sorted(self._round_trips)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    async def close(self) -> None:
        await asyncio.gather(*self._sending, return_exceptions=True)

    def stats(self) -> dict[str, object]:
        p99 = self.round_trip_p99()
        return {
            "backend": "redis",
            "healthy": self.healthy,
            "remote_decisions": self.remote_decisions,
            "fallbacks": self.fallbacks,
            "late_replies": self.late_replies,
            "breaker_trips": self.trips,
            "batches": self.batches,
            "budget_ms": self.budget * 1000,
            "budget_bounds_ms": [self.min_budget * 1000, self.max_budget * 1000],
            "round_trip_p99_ms": None if p99 is None else p99 * 1000,
        }


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is not there at all (no connection), rather than slow."""
    return isinstance(exc, (RedisConnectionError, ConnectionError))


async def within_budget(answer: asyncio.Future[T], budget: float) -> T:
    """``answer``'s result, or TimeoutError once it has had ``budget`` seconds; ``answer``
    itself is left to complete. A timer that fires late (by half the budget or more) says the
    event loop was busy, not the other side: the reply may be waiting unread, so the wait gets
    one more budget, once."""
    loop = asyncio.get_running_loop()
    for _ in range(2):
        due = loop.time() + budget
        done, _ = await asyncio.wait({answer}, timeout=budget)
        if done:
            return answer.result()
        if loop.time() - due < budget / 2:
            break
    raise TimeoutError(f"no answer within {budget * 1000:g} ms")
