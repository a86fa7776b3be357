"""Purges across a fleet: with the Redis backend, every purge an instance's admin port takes
is published on the fleet's Redis, and every instance applies the others' as they arrive.

What it guarantees:

* A purge is applied where it was asked before it is published; each other instance that is
  subscribed applies it once, on arrival (a message carries its sender's id, and an instance
  skips its own).
* Redis keeps nothing for it: pub/sub holds no message, so it costs Redis no memory. An
  instance cut off from Redis, or down, when a purge is published does not get it; it logs
  one line when its subscription breaks and resubscribes (0.5 s, then up to 5 s apart). The
  admin answer says how many instances the message reached (``fleet``), so the operator knows
  whether to purge again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from proxy.config.logs import OneLineEvery

FLEET_ERRORS = logging.getLogger("onehit.fleet")
FLEET_ERRORS.addFilter(OneLineEvery())


class FleetPurges:
    """The purge channel ``channel`` on ``client`` (a ``redis.asyncio`` client); ``apply``
    carries out a purge another instance published (the admin's own purge, as a dict)."""

    def __init__(self, client: Any, channel: str, apply: Callable[[dict[str, Any]], object]):
        self.client = client
        self.channel = channel
        self.apply = apply
        self.id = uuid.uuid4().hex
        self.received = 0
        self.subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen())

    async def publish(self, purge: dict[str, Any]) -> int | None:
        """Send ``purge`` to the fleet; how many other instances it reached, or None when
        Redis could not be asked (one log line)."""
        try:
            reached = await self.client.publish(
                self.channel, json.dumps({**purge, "from": self.id})
            )
        except Exception as exc:  # a purge is answered even when the fleet cannot be told
            FLEET_ERRORS.warning("publishing a purge to the fleet failed: %r", exc)
            return None
        return max(0, int(reached) - 1)  # this instance listens too

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
            self.apply(purge)
        except Exception as exc:
            FLEET_ERRORS.warning("applying a purge from the fleet failed: %r: %r",
                                 exc, str(purge)[:200])  # fmt: skip

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
