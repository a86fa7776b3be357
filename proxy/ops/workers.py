"""``onehit-proxy --workers N``: N processes serving one port, one admin listener for all.

Each worker is a whole onehit serving the proxy port on a SO_REUSEPORT socket of its place,
which the parent binds and holds (``place_listeners``); the kernel spreads connections across
them, and a connection queued on a socket as its worker drains waits for the worker that takes
its place. They share one admission window: second hit's generations are in
memory the parent creates (``proxy.ops.machine``) and every worker maps, so a URL seen once through
each of two workers is a second sighting (Redis, ``backend = "redis"``, is what joins machines).
They share one cache (``proxy.ops.shared_tier``): the disk tier, or a tier in shared memory in
its place, whose index every worker maps, so what one stored is a hit through every other; each
keeps a small private memory tier of hot entries in front of it. A removal a worker decides
(an unsafe method, a response turned private) reaches the shared tier at once and the other
workers' memory tiers through the parent (``/forget``). Workers run their own admin on an
ephemeral loopback port; the parent serves the configured admin address: ``/stats`` lists every
worker and their sum (the shared tier's own counts once), ``/metrics`` is the sum, ``/purge``
and ``/filter/reset`` reach every worker. A worker that exits is replaced at once, in its place,
sharing the same window and tier. SIGTERM/SIGINT to the parent drains every worker, then it
writes the shared tier's checkpoint and exits 0. With ``[server] handover`` the parent offers
every socket, the admin's too, to a new onehit (``proxy.ops.handover``), then stops as on
SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config import values
from proxy.config.settings import Config, ConfigError
from proxy.core.admission import shared_window_size
from proxy.core.whatif import Sample, Samples
from proxy.ops import handover, machine
from proxy.ops.admin import admin_application
from proxy.ops.handoff import HandedConfig, machine_headers
from proxy.ops.machine_admin import TO_PARENT_WAIT, MachineAdmin
from proxy.ops.reload import (
    KEYED,
    LIVE,
    NO_SOURCE,
    ROLLING,
    SIZES,
    Reloaded,
    judge,
    key_rules,
    keys_built_otherwise,
)
from proxy.ops.service import LISTEN_BACKLOG, checkpoint_every, listener, until_signalled
from proxy.ops.shared_tier import SharedTier, check_workers, open_shared_tier, worker_view

log = logging.getLogger("onehit.workers")
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Keys a worker sends the parent in one POST /forget at most, in bytes: within the admin's body
# limit (1 MiB) with room for JSON's escapes.
BATCH_BYTES = 256 << 10
# What-if batches a worker holds for the parent at most (each ``proxy.core.whatif.BATCH``
# sampled requests, about 60 KB as JSON): past it, the parent is not keeping up.
SAMPLE_BATCHES = 16
READY = "onehit-worker-admin "


async def serve_workers(
    config: Config,
    count: int,
    read_config: Callable[[], Config] | None = None,
    taken: handover.Taken | None = None,
) -> int:
    """Run ``count`` workers of ``config`` until a signal, replacing any that dies; the exit
    status is 0 when every worker drained cleanly. Each is handed the configuration the
    machine runs (``proxy.ops.handoff``). A reload (SIGHUP, ``POST /reload``) reads the
    configuration again (``read_config``) and, when every worker may take it, hands it to
    them and has each one reload. ``taken``: the listeners a running onehit handed over."""
    if config.server.listen[1] == 0:
        raise ValueError("--workers needs a fixed [server] listen port, not 0")
    # The tier first: a disk directory it refuses stops the start before a worker runs.
    tier = open_shared_tier(config, count, "" if taken is None else taken.memory)
    try:
        places = place_listeners(config.server.listen, count, () if taken is None else taken.proxy)
    except OSError:
        tier.close()
        raise
    sockets = distinct(places)
    held = len(sockets)
    if config.server.handover and held > handover.MAX_PROXY_SOCKETS:
        for sock in sockets:
            sock.close()
        tier.close()
        raise ValueError(
            f"[server] handover with workers = {count}: {held} listening sockets, more than "
            f"one handover passes ({handover.MAX_PROXY_SOCKETS}); set workers to at most "
            f'{handover.MAX_PROXY_SOCKETS * count // held}, or handover = ""'
        )
    size = shared_window_size(config.admission_config())
    # Held open while the parent runs: a worker started to replace one that died maps it too.
    window = machine.create(size) if size else None
    handed = HandedConfig.create()
    workers = Workers(reachable(config.admin.listen), window, tier, handed, places)
    workers.publish(config)
    reloads = Reloads(config, read_config, workers)
    runner = web.AppRunner(admin_application(config.admin, MachineAdmin(config, workers, reloads)),
                           access_log=None)  # fmt: skip
    supervising: asyncio.Future[None] | None = None
    checkpoints: asyncio.Future[None] | None = None
    offering: asyncio.Future[None] | None = None
    codes: list[int] = []
    try:
        await workers.start(count)
        await runner.setup()
        admins = [listener(runner, config.admin.listen, sock=sock)
                  for sock in (taken.admin if taken is not None else [None])]  # fmt: skip
        for admin in admins:
            await admin.start()
        log.info("%d workers on %s:%d", count, *config.server.listen)
        supervising = asyncio.ensure_future(workers.supervise())
        if tier.scratch is None:
            checkpoints = asyncio.ensure_future(
                checkpoint_every(tier.store, config.disk.checkpoint_interval)
            )
        if config.server.handover:  # every socket, and the memory tier, to the next onehit

            def given_over() -> None:
                tier.left = True
                os.kill(os.getpid(), signal.SIGTERM)

            offering = asyncio.ensure_future(handover.offer(
                config.server.handover,
                lambda: (workers.listening(), [s for a in admins for s in a.sockets]),
                config.server.drain_timeout, given_over, str(tier.scratch or ""),
            ))  # fmt: skip
        await until_signalled(workers.reopen_logs, reloads.on_signal)
    finally:
        # However the parent leaves (a signal, an admin address it cannot bind), its workers
        # drain first; one being started as it leaves is killed by its start.
        for task in (supervising, checkpoints, offering):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        codes = await workers.stop()
        await runner.cleanup()
        for sock in workers.listening():
            sock.close()
        if window is not None:
            os.close(window)
        handed.close()
        tier.close()
    return 0 if all(code == 0 for code in codes) else 1


class Reloads:
    """A --workers parent's reloads: the configuration read again and judged here (a change
    only a restart can make, sizes included, since the parent divides them among the
    workers, is refused for all); then each worker reloads."""

    def __init__(self, config: Config, read: Callable[[], Config] | None, workers: Workers) -> None:
        self.config = config
        self.read = read
        self.workers = workers

    def judge(self) -> Reloaded:
        if self.read is None:
            return Reloaded(refused=NO_SOURCE)
        rolling = ROLLING | (SIZES if self.workers.tier.scratch is None else frozenset())
        new, done = judge(self.config, self.read, (LIVE - SIZES) | rolling)
        if new is None:
            return done
        if rolling & set(done.changed):  # the workers are replaced, each taking it all
            keyed = sorted(KEYED & set(done.changed))
            if keyed:  # the old workers would fetch and store by the old rules meanwhile
                why = (
                    f"{', '.join(keyed)} and {', '.join(sorted(rolling & set(done.changed)))} "
                    "changed at once: a reload under --workers takes what makes a key "
                    "live and the rest by replacing workers; reload them one after the other"
                )
                log.error("reload refused, the running configuration stays: %s", why)
                return Reloaded(refused=why)
            try:  # as each new worker will run it: one that could not start is never begun
                check_workers(new, len(self.workers.processes))
            except ConfigError as exc:
                log.error("reload refused, the running configuration stays: %s", exc)
                return Reloaded(refused=str(exc))
            if "cache.size" in done.changed:
                count = len(self.workers.processes)
                self.workers.tier.overrides["cache.size"] = new.cache.size // count
            done = replace(done, replacing=len(self.workers.processes))
        purged = keys_built_otherwise(self.config, new)  # as each worker purges them
        self.config = new
        self.workers.publish(new)
        if purged and self.workers.tier.scratch is None:
            # Banned on the device before the tier takes the new rules: a restart after the
            # parent died, before every worker purged, still finds nothing of the old ones.
            store = self.workers.tier.store
            for prefix in purged:
                store.ban(prefix, by_tag=False)
            store.durable()
            store.key_rules(key_rules(new), purge=False)
        return replace(done, purged=purged)

    def on_signal(self) -> None:
        done = self.judge()
        if done.refused:
            return
        if done.replacing:
            self.workers.roll_soon()
        else:
            self.workers.signal(signal.SIGHUP)


class Workers:
    """The worker processes and where each one's admin listens (``admins``, kept in step: the
    parent's admin reads it at each call). A worker that exits while the parent serves is
    replaced at once, in its place, sharing what the others share."""

    def __init__(
        self,
        parent_admin: str,
        window: int | None,
        tier: SharedTier,
        handed: HandedConfig,
        places: Sequence[Sequence[socket.socket]],
    ) -> None:
        self.argv = ["--worker", "--parent", str(os.getpid()), "--parent-admin", parent_admin,
                     *tier.argv, "--config-fd", str(handed.fd)]  # fmt: skip
        # The tier's claim too: held while any worker lives, so a parent started after a crash
        # is refused while the last one's workers still drain and write into the tier.
        claim = tier.store.keeping.claim
        self.fds: tuple[int, ...] = (
            *tier.fds, *(() if claim is None else (claim,)), handed.fd
        )  # fmt: skip
        self.tier = tier
        self.handed = handed
        self.generation = 0  # of the configuration handed last
        self.window = window
        if window is not None:
            self.argv += ["--shared-window-fd", str(window)]
            self.fds += (window,)
        # Each place's listening sockets, held while the parent runs; a list of its own each.
        self.places = [list(place) for place in places]
        self._draining: set[int] = set()  # places a roll drains: their sockets wait for them
        self.processes: list[asyncio.subprocess.Process] = []
        self.admins: list[str | None] = []  # None: the worker is being replaced
        self.replaced = 0
        self._rolling: asyncio.Task[None] | None = None
        self._roll_again = False

    def publish(self, config: Config) -> None:
        """Hand ``config`` (the parent's) to the workers as each runs it: with its share of
        the tier (``SharedTier.overrides``) and its admin on a loopback port of its own."""
        overrides = {**self.tier.overrides, "admin.listen": ("127.0.0.1", 0)}
        self.generation = self.handed.publish(worker_view(config, overrides))

    async def start(self, count: int) -> None:
        """Start ``count`` workers and wait until each listens; RuntimeError (every one
        stopped) when one cannot start."""
        started = await asyncio.gather(
            *(self._spawn(place) for place in range(count)), return_exceptions=True
        )
        for outcome in started:
            if isinstance(outcome, tuple):
                process, admin = outcome
                self.processes.append(process)
                self.admins.append(admin)
        failed = [o for o in started if isinstance(o, BaseException)]
        if failed:
            for process in self.processes:
                with contextlib.suppress(ProcessLookupError):  # it exited on its own
                    process.kill()
                await process.wait()
            raise failed[0]

    def listening(self) -> list[socket.socket]:
        """Every socket the workers listen on, each once, in their places' order."""
        return distinct(self.places)

    async def _spawn(self, place: int) -> tuple[asyncio.subprocess.Process, str]:
        listens = [s.fileno() for s in self.places[place]]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", *self.argv, "--worker-place", str(place),
            "--listen-fds", ",".join(map(str, listens)),
            stdout=asyncio.subprocess.PIPE, pass_fds=(*self.fds, *listens),
        )  # fmt: skip
        assert process.stdout is not None
        line = ""
        try:
            line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        except TimeoutError:
            pass
        finally:
            if not line.startswith(READY):  # silent, or the parent is leaving: none left behind
                with contextlib.suppress(ProcessLookupError):  # it exited on its own
                    process.kill()
                await process.wait()
        if not line.startswith(READY):
            said = f"it said {line.strip()!r}" if line else "its own line above says why"
            raise RuntimeError(f"a worker did not start ({said})")
        admin, _, generation = line[len(READY) :].strip().partition(" ")
        if generation != str(self.generation):
            # A reload was handed over while it started, before it heard of reloads.
            process.send_signal(signal.SIGHUP)
        return process, admin

    async def supervise(self) -> None:
        """Replace each worker that exits, until cancelled."""
        while True:
            waits = {asyncio.ensure_future(p.wait()): i for i, p in enumerate(self.processes)}
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            for ended in done:
                i = waits[ended]
                old = self.processes[i]
                log.warning("worker %d (pid %d) exited with %s: starting another", i, old.pid,
                            old.returncode)  # fmt: skip
                self.admins[i] = None  # being replaced: the admin asks the others meanwhile
                if i not in self._draining:
                    self._unlisten(i)
                while True:
                    try:
                        self.processes[i], self.admins[i] = await self._spawn(i)
                        break
                    except RuntimeError as exc:
                        log.error("replacing worker %d failed (%s): trying again", i, exc)
                        await asyncio.sleep(1)
                self.replaced += 1

    def _unlisten(self, place: int) -> None:
        """A worker that died unasked: its place's own sockets are closed (what they queued
        is reset, as when a worker bound its own) and bound again without listening, so the
        kernel sends the others every new connection until the next worker listens (held
        listening, its share waited for it, seconds when it could not start). A socket the
        places share (a single process's, taken over) stays: the others accept from it."""
        shared = {id(s) for p, socks in enumerate(self.places) if p != place for s in socks}
        for k, sock in enumerate(self.places[place]):
            if id(sock) in shared or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
                continue
            try:
                fresh = _bound(sock.family, sock.type, sock.proto, sock.getsockname())
            except OSError as exc:
                log.error("worker %d's socket could not be bound again (%s): it is kept", place,
                          exc)  # fmt: skip
                continue
            sock.close()
            self.places[place][k] = fresh

    def roll_soon(self) -> None:
        """``roll`` in a task of its own; one asked while one runs runs again after it (each
        worker then takes the configuration published last), never beside it: two at once
        drained two workers at once."""
        if self._rolling is not None and not self._rolling.done():
            self._roll_again = True
            return
        self._rolling = asyncio.get_running_loop().create_task(self._rolls())

    async def _rolls(self) -> None:
        while True:
            self._roll_again = False
            await self.roll()
            if not self._roll_again:
                return

    async def roll(self, within: float = 60.0) -> None:
        """Replace the workers one at a time, each drained (SIGTERM) and started again by
        ``supervise`` on the configuration published last, the next one only once the last
        one's replacement listens: the others serve meanwhile."""
        for place in range(len(self.processes)):
            deadline = asyncio.get_running_loop().time() + within
            while None in self.admins:  # one being replaced (it died): the others serve
                if asyncio.get_running_loop().time() > deadline:
                    log.error("a worker was not replaced within %gs", within)
                    return
                await asyncio.sleep(0.05)
            process = self.processes[place]
            self._draining.add(place)
            try:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                while self.processes[place] is process or self.admins[place] is None:
                    if asyncio.get_running_loop().time() > deadline:
                        log.error("worker %d was not replaced within %gs", place, within)
                        return
                    await asyncio.sleep(0.05)
            finally:
                self._draining.discard(place)
            log.info("worker %d replaced, on the configuration published last", place)

    def reopen_logs(self) -> None:
        """Have every worker open its logs' files again (SIGUSR1, passed on)."""
        self.signal(signal.SIGUSR1)

    def signal(self, number: int) -> None:
        """Send every live worker the signal ``number``."""
        for process in self.processes:
            if process.returncode is None:
                process.send_signal(number)

    async def stop(self) -> list[int]:
        """Drain every worker (SIGTERM) and their exit statuses."""
        for process in self.processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        return list(await asyncio.gather(*(p.wait() for p in self.processes)))


def place_listeners(
    listen: tuple[str, int], count: int, taken: Sequence[socket.socket] = ()
) -> list[list[socket.socket]]:
    """The proxy port's listening sockets each of ``count`` workers' places serves: the
    parent holds them all, so a worker's drain closes only its own copies (closing the last
    copy of a SO_REUSEPORT socket resets the connections queued on it). Per address ``listen``
    resolves to, the sockets ``taken`` over from a running onehit, every one served (past
    ``count`` a place serves several), then more bound with SO_REUSEPORT until each place has
    its own; a single process's, not bound to share its port, is shared by the places."""
    by_address: dict[tuple[Any, ...], list[socket.socket]] = {}
    for sock in taken:
        by_address.setdefault(sock.getsockname()[:2], []).append(sock)
    if not by_address:
        host, port = listen
        for family, kind, proto, _, address in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            if address[:2] not in by_address:
                by_address[address[:2]] = [_listening(family, kind, proto, address)]
    places: list[list[socket.socket]] = [[] for _ in range(count)]
    try:
        for socks in by_address.values():
            first = socks[0]
            while len(socks) < count and first.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
                socks.append(_listening(first.family, first.type, first.proto,
                                        first.getsockname()))  # fmt: skip
            for i in range(max(len(socks), count)):
                places[i % count].append(socks[i % len(socks)])
    except OSError:
        for socks in by_address.values():
            for sock in socks:
                sock.close()
        raise
    return places


def distinct(places: Sequence[Sequence[socket.socket]]) -> list[socket.socket]:
    """The sockets of ``places``, each once (places may share one), in their order."""
    return list({id(s): s for place in places for s in place}.values())


def _listening(family: int, kind: int, proto: int, address: Any) -> socket.socket:
    """A socket listening at ``address`` beside others of this user (SO_REUSEPORT)."""
    sock = _bound(family, kind, proto, address)
    try:
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _bound(family: int, kind: int, proto: int, address: Any) -> socket.socket:
    """A socket bound at ``address`` beside others of this user (SO_REUSEPORT), not yet
    listening: the kernel sends it no connection until its worker listens."""
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:  # as asyncio binds: each family its own socket
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        said = (exc.strerror or str(exc)).lower()
        raise OSError(exc.errno, f"cannot listen on {address[0]}:{address[1]} ([server] "
                                 f"listen): {said}") from None  # fmt: skip
    return sock


def reachable(listen: tuple[str, int]) -> str:
    """An admin listener as a process of this machine reaches it (a parent's, by its
    workers; any, by ``--reload``): on loopback when it listens everywhere (``loopback``)."""
    host, port = values.loopback(listen)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ToParent:
    """Bodies a worker POSTs to its parent's admin (at ``path``), in order, as soon as the loop
    is free; a parent that does not answer is logged, once a minute. A subclass keeps what
    is pending and says what the next body is (``_next``)."""

    what = "messages"
    # Seconds before each try again of a body the parent did not answer, or failed to take
    # (a 5xx): none.
    again: tuple[float, ...] = ()

    def __init__(self, parent_admin: str, path: str, place: int, token: str, secret: str) -> None:
        self.url = f"{parent_admin}{path}"
        self.place = place
        self.headers = machine_headers(token, secret)
        self.sending: asyncio.Task[None] | None = None
        self.session: aiohttp.ClientSession | None = None
        self._warned = 0.0

    def _next(self) -> tuple[dict[str, Any], int] | None:
        """The next body to send and how many things it carries; None when none is pending."""
        raise NotImplementedError

    def _lost(self, count: int) -> None:
        """``count`` things the parent did not take (it refused them, or did not answer), on
        every try."""

    def _taken(self, answer: Any) -> None:
        """The parent took the last body sent, answering ``answer`` (its JSON)."""

    def _send_soon(self) -> None:
        if self.sending is None or self.sending.done():
            self.sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while (next_body := self._next()) is not None:
            body, count = next_body
            if self.session is None:
                self.session = aiohttp.ClientSession(
                    headers=self.headers, timeout=aiohttp.ClientTimeout(total=TO_PARENT_WAIT)
                )
            for wait in (*self.again, None):
                try:
                    async with self.session.post(self.url, json=body) as r:
                        r.raise_for_status()
                        answer = await r.json() if r.content_type == "application/json" else None
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    refused = isinstance(exc, aiohttp.ClientResponseError) and exc.status < 500
                    if wait is not None and not refused:  # a refusal is the same next time
                        await asyncio.sleep(wait)
                        continue
                    self._lost(count)
                    now = asyncio.get_running_loop().time()
                    if now - self._warned > 60:
                        self._warned = now
                        log.warning("telling the parent of %d %s failed: %r", count, self.what,
                                    exc)  # fmt: skip
                else:
                    self._taken(answer)
                    break

    async def sent(self, within: float | None = None) -> None:
        """Return once everything handed over so far has been sent (or failed), or after
        ``within`` seconds if given. Waiting never cancels the sending."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        while self.sending is not None and not self.sending.done():
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return
            await asyncio.wait({self.sending}, timeout=left)

    async def close(self) -> None:
        if self.sending is not None:
            await asyncio.gather(self.sending, return_exceptions=True)
        if self.session is not None:
            await self.session.close()


class MachineForgets(ToParent):
    """A worker's removals from the tier the workers share (``DiskStore.forgotten``), sent to
    the parent in batches (``POST /forget``), which hands them to the other workers: their
    memory tiers may hold what this one removed. Sent as soon as the loop is free, so another
    worker serves its copy a few milliseconds at most. A purge answers once they are
    ``sent``: when the other workers have forgotten it."""

    what = "removals"
    # A removal that does not reach the others leaves them serving what it removed: tried
    # again, for a parent that is busy or a sibling being replaced.
    again = (0.05, 0.25, 1.0)

    def __init__(
        self, parent_admin: str, place: int, token: str, secret: str, workers: int
    ) -> None:
        super().__init__(parent_admin, "/forget", place, token, secret)
        # Keys waiting to be sent, each once however often it was removed meanwhile (a flood
        # of unsafe requests to one URL is one key), in order, with when it was removed last;
        # purged ones (``reach``) first.
        self.pending: dict[str, float] = {}
        self.purged: dict[str, float] = {}
        self.others = workers - 1
        # For each ``reach`` under way, how many workers each batch sent since missed.
        self._heard: list[list[int]] = []

    def __call__(self, key: str) -> None:
        self.pending[key] = time.time()
        self._send_soon()

    async def reach(self, key: str) -> int:
        """Tell the others of ``key`` and wait until it was sent: how many of them it did not
        reach (the parent's count of those that did not answer; all of them when the parent
        never took it, or nothing was heard of it)."""
        heard: list[int] = []
        self._heard.append(heard)
        try:
            self.purged[key] = time.time()
            self._send_soon()
            await self.sent()
        finally:
            self._heard.remove(heard)
        return max(heard, default=self.others)

    def _taken(self, answer: Any) -> None:
        missing = answer.get("missing", 0) if isinstance(answer, dict) else 0
        self._hear(missing if isinstance(missing, int) else self.others)

    def _lost(self, count: int) -> None:
        self._hear(self.others)

    def _hear(self, missing: int) -> None:
        for heard in self._heard:
            heard.append(missing)

    def _next(self) -> tuple[dict[str, Any], int] | None:
        """The oldest purged keys, else the oldest removed, up to ``BATCH_BYTES`` of them (the
        admin's bodies are bounded, and one refused would lose every key in it)."""
        purge = bool(self.purged)
        pending = self.purged if purge else self.pending
        if not pending:
            return None
        size, batch = 0, []
        for key in pending:
            size += len(key) + 4
            if size > BATCH_BYTES and batch:
                break
            batch.append(key)
        # When each was removed here: the others' fetches sent since are newer, and stored.
        at = [pending.pop(key) for key in batch]
        return {"keys": batch, "at": at, "from": self.place, "purge": purge}, len(batch)


class MachineSamples(ToParent):
    """A worker's what-if samples (``WhatIf.forward``), each batch with the count of requests
    it was sampled from, sent to the parent (``POST /whatif``, ``Samples``), whose ghosts of
    the shared disk every worker feeds (``DiskGhosts``). At most ``SAMPLE_BATCHES`` wait:
    past that a batch is dropped with its count and counted (``dropped``)."""

    what = "what-if batches"

    def __init__(self, parent_admin: str, place: int, token: str, secret: str) -> None:
        super().__init__(parent_admin, "/whatif", place, token, secret)
        self.pending: list[Samples] = []
        self.dropped = 0

    def __call__(self, sample: Sample, requests: int, rate: float) -> None:
        if len(self.pending) >= SAMPLE_BATCHES:
            self.dropped += 1
            return
        self.pending.append(Samples(self.place, os.getpid(), rate, sample, requests))
        self._send_soon()

    def _next(self) -> tuple[dict[str, Any], int] | None:
        return (self.pending.pop(0).as_json(), 1) if self.pending else None

    def _lost(self, count: int) -> None:
        self.dropped += count


def die_with_parent(parent: int) -> None:
    """Have the kernel send this worker SIGTERM (a drain) when the parent ``parent`` dies,
    however it dies: a worker left behind would hold the port and serve on its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
