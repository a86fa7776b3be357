"""Purges across a fleet: with the Redis backend, every purge an instance's admin port takes
is published on the fleet's Redis, and every instance applies the others' as they arrive.

What it guarantees:

* A purge is applied where it was asked before it is published; each other instance that is
  subscribed applies it once, on arrival (a message carries its sender's id, and an instance
  skips its own).
* Redis keeps little for it: pub/sub holds no message; each instance that applies a purge
  pushes what it removed to the purge's reply list, which expires ``REPLY_TTL`` seconds
  after and holds at most ``MAX_REPLIES`` (one entry an instance, deleted once read).
* Purges have Redis connections of their own (``purge_client``: at most ``CONNECTIONS``, a
  publish waiting its turn up to ``REPLY_WAIT``), never the admission filter's: a purge waits
  up to ``REPLY_WAIT`` for replies, past the filter's budget of 1 s a call, and a storm of
  purges, or of other instances' messages, must not take the connections misses are judged
  with. At most ``MAX_PENDING_REPLIES`` replies are being sent at once; past that, one is
  skipped (its publisher counts it ``missing``). An instance cut off from Redis, or down,
  when a purge is published does not get it; it logs one line when its subscription breaks
  and resubscribes (0.5 s, then up to 5 s apart). The admin answer says how many instances
  the message reached and what each removed, waiting ``REPLY_WAIT`` at most for their
  replies, and how many did not reply (``fleet``), so the operator knows whether to purge
  again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from proxy.config.logs import OneLineEvery

FLEET_ERRORS = logging.getLogger("onehit.fleet")
FLEET_ERRORS.addFilter(OneLineEvery())

REPLY_WAIT = 1.0  # seconds the publisher waits for the instances' replies
REPLY_TTL = 30  # seconds a reply list lives in Redis, read or not
MAX_REPLIES = 1024  # entries a reply list holds at most
CONNECTIONS = 8  # the purges' own connections: the subscription, publishes and replies
MAX_PENDING_REPLIES = 32


def purge_client(url: str) -> aioredis.Redis:
    """A client for the fleet's purges alone: ``CONNECTIONS`` connections, a command waiting
    up to ``REPLY_WAIT`` for one, each call answered within ``REPLY_WAIT`` plus a second (the
    longest, a BLPOP, waits ``REPLY_WAIT`` itself)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=CONNECTIONS, timeout=REPLY_WAIT, socket_connect_timeout=1.0,
        socket_timeout=REPLY_WAIT + 1.0,
    )  # fmt: skip
    return aioredis.Redis(connection_pool=pool)


class FleetPurges:
    """The purge channel ``channel`` on ``client`` (a ``redis.asyncio`` client, as
    ``purge_client`` makes one: ``close`` closes it); ``apply`` carries out a purge another
    instance published (the admin's own purge, as a dict) and returns what it removed (the
    admin's answer), or None for a purge it would not take."""

    def __init__(
        self, client: Any, channel: str, apply: Callable[[dict[str, Any]], dict[str, Any] | None]
    ):
        self.client = client
        self.channel = channel
        self.apply = apply
        self.id = uuid.uuid4().hex
        self.received = 0
        self.subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._replies: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen())

    async def publish(self, purge: dict[str, Any]) -> dict[str, Any] | None:
        """Send ``purge`` to the fleet: how many other instances it reached (``reached``),
        what each that replied within ``REPLY_WAIT`` removed (``instances``) and how many did
        not (``missing``); None when Redis could not be asked (one log line)."""
        reply = f"{self.channel}:reply:{uuid.uuid4().hex}"
        try:
            reached = max(0, int(await self.client.publish(
                self.channel, json.dumps({**purge, "from": self.id, "reply": reply})
            )) - 1)  # fmt: skip
            instances = []
            deadline = asyncio.get_running_loop().time() + REPLY_WAIT
            while len(instances) < reached:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                got = await self.client.blpop([reply], timeout=max(left, 0.01))
                if got is None:
                    break
                with contextlib.suppress(ValueError, TypeError):
                    instances.append(json.loads(got[1]))
            await self.client.delete(reply)
        except Exception as exc:  # a purge is answered even when the fleet cannot be told
            FLEET_ERRORS.warning("publishing a purge to the fleet failed: %r", exc)
            return None
        return {"reached": reached, "instances": instances,
                "missing": max(0, reached - len(instances))}  # fmt: skip

    async def _listen(self) -> None:
        pause = 0.5
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                self.subscribed.set()
                pause = 0.5
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._received(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.subscribed.clear()
                FLEET_ERRORS.warning("the fleet's purge channel broke, resubscribing: %r", exc)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)

    def _received(self, data: bytes | str) -> None:
        """Apply one message of the channel. Whatever it holds, the listen loop goes on: a
        message that is not a purge is one log line (throttled), never a traceback."""
        try:
            purge = json.loads(data)
        except (ValueError, RecursionError):  # nested past the parser's depth
            FLEET_ERRORS.warning("a purge from the fleet that is not JSON: %r", data[:200])
            return
        if not isinstance(purge, dict) or purge.get("from") == self.id:
            return
        self.received += 1
        try:
            answer = self.apply(purge)
        except Exception as exc:
            FLEET_ERRORS.warning("applying a purge from the fleet failed: %r: %r",
                                 exc, str(purge)[:200])  # fmt: skip
            return
        reply = purge.get("reply")
        # Only a reply list of this channel's: a message cannot have instances write any key.
        if (
            answer is not None
            and isinstance(reply, str)
            and reply.startswith(f"{self.channel}:reply:")
            and len(reply) < 200
        ):
            if len(self._replies) >= MAX_PENDING_REPLIES:
                FLEET_ERRORS.warning("a fleet purge not replied to: %d replies being sent",
                                     len(self._replies))  # fmt: skip
                return
            task = asyncio.get_running_loop().create_task(self._reply(reply, answer))
            self._replies.add(task)
            task.add_done_callback(self._replies.discard)

    async def _reply(self, key: str, answer: dict[str, Any]) -> None:
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.rpush(key, json.dumps({"instance": self.id[:12], **answer}))
                pipe.ltrim(key, 0, MAX_REPLIES - 1)
                pipe.expire(key, REPLY_TTL)
                await pipe.execute()
        except Exception as exc:
            FLEET_ERRORS.warning("replying to a fleet purge failed: %r", exc)

    async def close(self) -> None:
        for task in list(self._replies):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.client.aclose()
