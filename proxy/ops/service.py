"""One running onehit: the proxy listener, the admin listener, their engine and upstream.

``Service.start`` binds both listeners (port 0 picks a free port; ``addresses`` says which) and
``Service.stop`` stops accepting, lets requests in flight finish for up to ``drain_timeout``
seconds, then closes the origin connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import signal
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from redis.asyncio.cluster import RedisCluster

from proxy.config.logs import HTTP_ERRORS
from proxy.config.settings import Config, ConfigError
from proxy.core.admission import AdmissionConfig, AdmissionPolicy, CompiledPolicy, make_policy
from proxy.core.disk import AutoPolicy
from proxy.core.engine import CacheEngine
from proxy.core.store import ENTRY_OVERHEAD, CacheStore
from proxy.core.ttl_rules import TtlRules
from proxy.disk.sharing import Sharing
from proxy.disk.store import DiskStore
from proxy.fleet.purges import FleetPurges, purge_client
from proxy.fleet.shared import RedisWindow, SharedSecondHit
from proxy.front.fastpath import HitServer, require_strict_parser
from proxy.handler.purging import OtherWorkers
from proxy.handler.routing import hidden_fields
from proxy.handler.server import Proxy, SampleSink
from proxy.ops.access_log import AccessLog, AccessLogFile
from proxy.ops.admin import admin_app, apply_fleet_purge
from proxy.ops.answer_metrics import AnswerMetrics, Recorder
from proxy.ops.handoff import sample_key
from proxy.ops.reload import NO_SOURCE, STOPPING, Reloaded, key_rules, reload
from proxy.ops.tls import server_context
from proxy.origin.upstream import Upstream
from proxy.wire.seam import Listener, ProxyServer
from proxy.wire.trace import trace_token


def shared_admission(config: Config, engine: CacheEngine) -> SharedSecondHit | None:
    """The fleet's admission window when ``[admission] backend = "redis"``, else None."""
    a = config.admission
    if a.backend != "redis":
        return None
    assert isinstance(engine.admission, CompiledPolicy) and engine.admission.window is not None
    timeouts = {"socket_connect_timeout": 1.0, "socket_timeout": 1.0}
    if a.redis_cluster:  # the node named discovers the others, as RedisCluster.from_url does
        client = RedisCluster.from_url(a.redis_url, **timeouts)
    else:
        client = aioredis.from_url(a.redis_url, **timeouts)
    local = engine.admission.window
    # In auto mode the fleet rotates after the share this instance's own sizer last chose:
    # one sizer, smoothed per rotation as in memory.
    auto_share = (lambda: local.generation_share) if a.window == "auto" else None
    window = a.max_window if a.window == "auto" else float(a.window)
    remote = RedisWindow(client, a.expected_urls, a.fp_rate, window, a.generations,
                         prefix=a.redis_prefix, auto_share=auto_share)  # fmt: skip
    return SharedSecondHit(engine.admission, remote, a.redis_budget, max_budget=a.redis_budget_max)


def build_engine(
    config: Config, shared_window: mmap.mmap | None = None, disk: DiskStore | None = None
) -> CacheEngine:
    """The cache engine ``config`` describes; ``shared_window``: the memory of an admission
    window this process shares with the other workers of the machine, sized (``window =
    "auto"``) by the objects the machine's cache holds: the shared tier's, where it stands for
    the memory tier, else every worker's memory tier's (``disk``: the shared tier)."""
    store = CacheStore(
        config.cache.size, config.cache.max_object_size, ENTRY_OVERHEAD, config.first_eviction()
    )
    objects = None
    sharing = None if disk is None else disk.sharing
    if disk is not None and sharing is not None:
        workers = sharing.workers
        objects = (disk.tier.estimated_capacity_objects if disk.follows_memory
                   else lambda: workers * store.estimated_capacity_objects())  # fmt: skip
    c = config.cache

    def make(admission: AdmissionConfig) -> AdmissionPolicy:
        return make_policy(admission, store, shared=shared_window, objects=objects)

    whatif = config.what_if(machine=sharing is not None)
    tuning = None if whatif is None else whatif.tuning
    admission = config.admission_config()
    if tuning is not None:  # the tuner's first choice, and its way of making the next
        admission, tuning.make = admission.as_policy(tuning.choice.admission), make
    engine = CacheEngine(
        store,
        make(admission),
        hit_for_miss=c.hit_for_miss,
        ttl_rules=TtlRules(config.ttl),
        # A disk (a process's, or the one a machine's workers share) keeps bodies past what
        # memory does (a worker's share, S3-FIFO's small queue), up to what its records hold.
        behind_largest=0 if disk is None else config.behind_largest(),
        max_variants=c.max_variants,
        ignore_cookies=c.ignore_cookies,
        grace=c.grace,
        client_revalidation=c.client_revalidation,
    )
    engine.whatif = whatif
    # No origin exchange outlasts its total timeout: a purge older than that reaches none.
    engine.recent_purges.horizon = config.upstream.total_timeout + 1.0
    return engine


@dataclass
class Service:
    config: Config
    proxy: Proxy
    proxy_runner: web.BaseRunner
    admin_runner: web.BaseRunner
    checkpoints: asyncio.Task[None] | None = None
    flushes: asyncio.Task[None] | None = None
    auto_choices: asyncio.Task[None] | None = None
    access_file: AccessLogFile | None = None
    # The listener's TLS context, and the one each handshake is given (``_tls_for``): a
    # reload builds a new one from the certificate and key, whole, and the next handshakes
    # take it; the connections open keep theirs. (Loading a pair into the live context
    # would keep an old certificate of another key type, and leave a certificate without
    # its key when the key fails to load.)
    tls: ssl.SSLContext | None = None
    tls_now: ssl.SSLContext | None = None
    read_config: Callable[[], Config] | None = None
    shares_admission: bool = False
    moves_listeners: bool = True  # False for a worker: the port is the machine's
    stopping: bool = False
    # One reload at a time: each reads the listeners the last one left (a second one let in
    # while the first opened a listener closed it, and the first's was never closed again).
    reloading: asyncio.Lock = field(default_factory=asyncio.Lock)
    _pending: set[asyncio.Task[Reloaded]] = field(default_factory=set)

    @classmethod
    async def start(
        cls,
        config: Config,
        *,
        reuse_port: bool = False,
        clock: Callable[[], float] = time.time,
        shared_window: mmap.mmap | None = None,
        sharing: Sharing | None = None,
        forgotten: OtherWorkers | None = None,
        samples: SampleSink | None = None,
        read_config: Callable[[], Config] | None = None,
        machine_secret: str = "",
        listeners: Sequence[Any] = (),
        admin_sockets: Sequence[Any] = (),
    ) -> Service:
        """Start both listeners; ``reuse_port`` lets several workers share the proxy port,
        ``shared_window`` their admission window (``proxy.ops.machine``) and ``sharing`` their
        cache tier (``proxy.ops.shared_tier``), each removal this worker makes from it told
        to ``forgotten`` (``DiskStore.forgotten``) and the what-if's samples to ``samples``
        (``Proxy.follow_whatif``), for the ghosts of that tier. ``clock``: the
        cache's time (seconds since the epoch), read wherever the proxy asks the time of a
        request or response (a trace's, to replay it as the simulator does). ``read_config``
        reads the configuration again for a reload (SIGHUP, ``POST /reload``);
        ``machine_secret``, what the other processes of a worker's machine show its admin
        (``proxy.ops.handoff``). ``listeners``: sockets that listen on the proxy's port already
        (taken over, or a worker's from its parent), served in place of one bound here;
        ``admin_sockets``, the admin's."""
        require_strict_parser()
        # Whatever a failed or cancelled start opened is closed again, the disk's directory
        # given up: the caller may start again in the same process.
        async with contextlib.AsyncExitStack() as undo:
            # The disk first: a directory it refuses stops the start before anything is opened.
            disk = None
            if config.disk.path:
                disk = DiskStore(config.disk, hidden_fields(config), sharing)
                disk.forgotten = forgotten
                disk.anchors.max_variants = config.cache.max_variants
                if sharing is None:  # a machine's tier is its parent's to judge
                    disk.key_rules(key_rules(config), purge=True)
            if disk is not None:
                undo.callback(disk.close)
            upstream = Upstream(config.upstream)
            undo.push_async_callback(upstream.close)
            await upstream.start()
            engine = build_engine(config, shared_window, disk)
            shared = shared_admission(config, engine)
            if shared is not None:
                undo.push_async_callback(shared.remote.client.aclose)
                undo.push_async_callback(shared.close)
                await shared.connect()
            proxy = Proxy(config, engine, upstream, clock=clock, shared=shared, disk=disk)
            proxy.others = forgotten
            if machine_secret:
                # A worker: its samples are of the URLs the others sample, and its parent's
                # admin, which knows the secret, traces its requests.
                proxy.key_sample(sample_key(machine_secret))
                proxy.trace_token = trace_token(machine_secret)
            proxy.samples = samples
            proxy.follow_whatif()
            undo.push_async_callback(proxy.close)
            if shared is not None and not config.admission.redis_cluster:
                # A Redis Cluster client has no pub/sub here: its fleet purges stay local.
                channel = f"{config.admission.redis_prefix}purge"
                proxy.fleet = FleetPurges(
                    purge_client(config.admission.redis_url), channel,
                    lambda purge: apply_fleet_purge(proxy, purge),
                )  # fmt: skip
                undo.push_async_callback(proxy.fleet.close)
                proxy.fleet.start()
            access = None
            if config.server.access_log:
                logs = config.server
                access = AccessLogFile(logs.access_log_file, logs.access_log_format,
                                       logs.access_log_buffer, logs.access_log_flush)  # fmt: skip
                undo.callback(access.close)
                access.start()
            answers = AnswerMetrics()
            server = _proxy_server(config, proxy, access, answers)
            proxy_runner = web.ServerRunner(server, shutdown_timeout=config.server.drain_timeout)
            fast: dict[int, int] = getattr(server, "answered", {})
            holder: list[Service] = []  # the admin's reloads reach the service once it exists
            admin_runner = web.AppRunner(
                admin_app(
                    proxy,
                    time.time(),
                    lambda: holder[0].reload(),
                    lambda: answers.snapshot(fast),
                    machine_secret,
                    lambda: holder[0].proxy_address,
                ),
                access_log=None,
            )
            undo.push_async_callback(proxy_runner.cleanup)
            await proxy_runner.setup()
            undo.push_async_callback(admin_runner.cleanup)
            await admin_runner.setup()
            service = cls(config, proxy, proxy_runner, admin_runner)
            holder.append(service)
            service.read_config = read_config
            service.shares_admission = shared_window is not None
            service.moves_listeners = not reuse_port
            service.access_file = access
            service.tls = service.tls_now = server_context(config.server)
            if service.tls is not None:
                service.tls.sni_callback = service._tls_for
            if disk is not None:
                service.checkpoints = asyncio.get_running_loop().create_task(
                    checkpoint_every(disk, config.disk.checkpoint_interval)
                )
                undo.callback(service.checkpoints.cancel)
                if isinstance(auto := disk.tier.admission, AutoPolicy):
                    service.auto_choices = asyncio.get_running_loop().create_task(
                        say_auto_choices(auto)
                    )
                    undo.callback(service.auto_choices.cancel)
            if samples is not None:
                service.flushes = asyncio.get_running_loop().create_task(flush_every(proxy))
                undo.callback(service.flushes.cancel)
            for sock in listeners or [None]:
                await listener(
                    proxy_runner, config.server.listen, service.tls, reuse_port,
                    handshake_timeout=config.server.idle_timeout, sock=sock,
                ).start()  # fmt: skip
            for sock in admin_sockets or [None]:
                await listener(admin_runner, config.admin.listen, sock=sock).start()
            undo.pop_all()  # started: ``stop`` closes it all
        return service

    @property
    def proxy_address(self) -> tuple[str, int]:
        return self.proxy_runner.addresses[0][:2]

    @property
    def admin_address(self) -> tuple[str, int]:
        return self.admin_runner.addresses[0][:2]

    async def stop(self, grace: float = 0.0) -> None:
        """Stop accepting, answer what is in progress (within ``drain_timeout``), and close
        it all. ``grace``: seconds (at most, while any connection is open) the connections
        accepted just before the listeners closed have to send their requests, read and
        answered before idle ones are closed
        (``ACCEPTED_GRACE``, a process's stop: closed at once, one in 5,000 of the
        connections opened across an upgrade under load was dropped with its request on its
        way)."""
        self.stopping = True
        for task in (self.checkpoints, self.flushes, self.auto_choices):
            if task is not None:
                task.cancel()
        if grace > 0:
            for site in list(self.proxy_runner.sites):
                await site.stop()
            server = self.proxy_runner.server
            until = time.monotonic() + grace
            while server is not None and server.connections and time.monotonic() < until:
                await asyncio.sleep(0.01)
        await self.proxy_runner.cleanup()
        await self.admin_runner.cleanup()
        await self.proxy.close()
        await self.proxy.upstream.close()
        if self.proxy.disk is not None:
            self.proxy.disk.close()
        if self.proxy.fleet is not None:
            await self.proxy.fleet.close()
        if self.proxy.shared is not None:
            await self.proxy.shared.close()
            await self.proxy.shared.remote.client.aclose()
        if self.access_file is not None:
            self.access_file.close()

    async def reload(self) -> Reloaded:
        """Read the configuration again and take what changed (``proxy.ops.reload``)."""
        if self.read_config is None:
            return Reloaded(refused=NO_SOURCE)
        async with self.reloading:
            if self.stopping:
                return Reloaded(refused=STOPPING)
            done = await reload(
                self.proxy, self.read_config, shares_admission=self.shares_admission,
                rebind=self._rebind if self.moves_listeners else None,
            )  # fmt: skip
            if not done.refused:
                self.config = self.proxy.config
                server = self.config.server
                if self.tls is not None:  # checked loadable by the reload (preflight)
                    said = logging.getLogger("onehit")
                    try:
                        self.tls_now = server_context(server)
                    except ConfigError as exc:  # changed since it was checked: the old stays
                        said.error("%s; the certificate in use stays", exc)
                    else:
                        said.info("reloaded: the TLS certificate %s, for the next handshakes",
                                  server.tls_cert)  # fmt: skip
            return done

    def _tls_for(self, connection: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        """Every handshake's context, chosen as the client's hello arrives (OpenSSL asks with
        or without a server name): the one the last reload built."""
        if self.tls_now is not None and connection.context is not self.tls_now:
            connection.context = self.tls_now

    def listening_sockets(self) -> tuple[list[Any], list[Any]]:
        """The proxy's listening sockets and the admin's: what a handover passes on."""
        proxy, admin = (
            [s for site in runner.sites if isinstance(site, Listener) for s in site.sockets]
            for runner in (self.proxy_runner, self.admin_runner)
        )
        return proxy, admin

    def reload_soon(self) -> None:
        """``reload`` in a task of its own (SIGHUP's), kept until it is done; what it raises
        is logged, not lost."""
        task = asyncio.get_running_loop().create_task(self.reload())
        self._pending.add(task)
        task.add_done_callback(self._reloaded)

    def _reloaded(self, task: asyncio.Task[Reloaded]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logging.getLogger("onehit").error("the reload failed: %r", task.exception())

    async def _rebind(self, new: Config) -> None:
        """Listen where ``new`` says, where it differs: each new listener opened first (an
        address that cannot be had raises OSError and closes those opened, and the one that
        failed), then the ones it replaces closed; connections already accepted go on."""
        moves = [
            (runner, address, context)
            for runner, old, address, context in (
                (self.proxy_runner, self.config.server.listen, new.server.listen, self.tls),
                (self.admin_runner, self.config.admin.listen, new.admin.listen, None),
            )
            if old != address
        ]  # fmt: skip
        replaced = {runner: list(runner.sites) for runner, _, _ in moves}
        opened: list[web.TCPSite] = []
        try:
            for runner, address, context in moves:
                site = listener(runner, address, context,
                             handshake_timeout=new.server.idle_timeout)  # fmt: skip
                opened.append(site)  # registered with its runner as it starts, bound or not
                await site.start()
        except OSError:
            for site in opened:
                await site.stop()
            raise
        for sites in replaced.values():
            for old in sites:
                await old.stop()

    def reopen_logs(self) -> None:
        """Open the access log's file again, where logrotate left a new one (SIGUSR1)."""
        if self.access_file is not None:
            self.access_file.reopen()


# Connections a listener queues while none is accepted (a worker being replaced, a handover's
# gap, a burst): the kernel caps it at net.core.somaxconn. aiohttp's own is 128.
LISTEN_BACKLOG = 4096

# Seconds a stopping proxy, its listeners closed, reads the requests of the connections it
# accepted last before it closes the idle ones: a client sends its request as it connects.
ACCEPTED_GRACE = 0.2


def listener(
    runner: web.BaseRunner,
    address: tuple[str, int],
    context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    handshake_timeout: float = 60.0,
    sock: Any = None,
) -> Listener:
    """A listener of ``runner`` at ``address``, as the start, a reload and a --workers
    parent's admin open one; a TLS one ends a handshake not done within
    ``handshake_timeout``."""
    return Listener(runner, *address, reuse_address=True, reuse_port=reuse_port,
                    ssl_context=context, handshake_timeout=handshake_timeout,
                    sock=sock, backlog=LISTEN_BACKLOG)  # fmt: skip


def _proxy_server(
    config: Config, proxy: Proxy, access: AccessLogFile | None, answers: AnswerMetrics
) -> web.Server:
    """The data port's server: aiohttp's limits and access log as configured, every answer
    recorded in ``answers``, and the compiled hit path in front of the handler unless
    ``[server] fast_hits`` is off."""
    server_kwargs: dict[str, object] = {
        # aiohttp's parser refuses (400) past these ceilings; below them the proxy applies the
        # configured limits itself, with the statuses RFC 9110 names (414, 431).
        "max_line_size": 4 * config.server.max_url_length + 64,
        "max_field_size": 4 * config.server.max_header_size,
        # aiohttp closes a connection whose request head is not complete this long after it
        # opened or after its last response: idle keep-alives and slow-header clients.
        "keepalive_timeout": config.server.idle_timeout,
        "logger": HTTP_ERRORS,
        "send_timeout": config.server.send_timeout,
    }
    log = None if access is None else AccessLog(access.lines)
    # Every answer the handler and the lane write is recorded, then logged when logging is on.
    # aiohttp makes its access logger (the recorder) only when given a logger: the recorder
    # writes to none of it (its lines go to ``log``).
    server_kwargs["access_log"] = logging.getLogger("onehit.access")
    server_kwargs["access_log_class"] = Recorder.for_service(answers, proxy.router, log)
    proxied = config.server.proxy_protocol
    if config.server.fast_hits:
        hit_answers = (proxy.plain_hits.answer, proxy.answer_hit)
        return HitServer(
            proxy.handle, hit_answers, proxy.start, proxy.plain_hits.answer_bytes, hit_log=log,
            proxy_protocol=proxied, **server_kwargs,
        )  # fmt: skip
    if proxied:  # the front reads the PROXY header, then hands every request to aiohttp
        return HitServer(proxy.handle, (), proxy_protocol=True, lane=False, **server_kwargs)
    return ProxyServer(proxy.handle, **server_kwargs)


async def checkpoint_every(disk: DiskStore, interval: float) -> None:
    """Checkpoint the disk tier's index every ``interval`` seconds."""
    while True:
        await asyncio.sleep(interval)
        disk.checkpoint()


async def say_auto_choices(auto: AutoPolicy, interval: float = 1.0) -> None:
    """Log the disk admission ``auto``'s choice and why (``AutoPolicy.said``) after each
    ``interval`` in which it changed (the compiled core makes it): one line, however many
    switches the interval held, which it counts."""
    switches = auto.native.switches
    while True:
        await asyncio.sleep(interval)
        if (now := auto.native.switches) != switches:
            logging.getLogger("onehit").info(
                "disk admission auto: %s (%d since the last line)", auto.said(), now - switches
            )
            switches = now


async def flush_every(proxy: Proxy, interval: float = 1.0) -> None:
    """Hand the what-if's samples on every ``interval`` seconds, however few: the parent
    replays each worker's batches as they arrive, and batches spanning minutes of several
    workers would reach the shared disk's ghosts out of their order in time."""
    while True:
        await asyncio.sleep(interval)
        if proxy.engine.whatif is not None:
            proxy.engine.whatif.flush()


# The signals a process holds while it starts (``hold_signals``), handled from
# ``until_signalled`` on; those that came meanwhile.
HELD_SIGNALS = (signal.SIGHUP, signal.SIGUSR1)
_held: list[int] = []


def hold_signals() -> None:
    """Until ``until_signalled`` handles them, hold SIGHUP (reload) and SIGUSR1 (reopen the
    logs): one that comes while the process starts (a worker told to reload as it came up) is
    handled then, not lost, and does not end the process, as its default would. A handler of
    the whole process, not a blocked mask: a thread a library started (numpy's OpenBLAS) would
    take a process's signal with its default action."""
    for sig in HELD_SIGNALS:
        signal.signal(sig, _hold)


def _hold(signum: int, frame: object) -> None:
    _held.append(signum)


async def until_signalled(
    reopen: Callable[[], object] | None = None, reread: Callable[[], object] | None = None
) -> None:
    """Return once SIGTERM or SIGINT arrives (the handlers stay: a second signal is ignored
    while the caller drains); until then SIGUSR1 calls ``reopen`` (the logs' files opened
    again) and SIGHUP ``reread`` (the configuration read again), those held while the process
    started (``hold_signals``) included. Without ``reopen`` or ``reread``, the signal is
    ignored."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    handlers = {signal.SIGUSR1: reopen or _nothing, signal.SIGHUP: reread or _nothing}
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler)
    # Those held while the process started are handled now, once each.
    held = dict.fromkeys(_held)
    _held.clear()
    for sig in held:
        handlers[sig]()
    await stop.wait()
    if reread is not None:  # a reload while draining would open listeners nobody drains
        loop.add_signal_handler(signal.SIGHUP, _ignored_while_stopping)


def _nothing() -> None:
    """A signal the process has no use for, taken so that its default does not end it."""


def _ignored_while_stopping() -> None:
    logging.getLogger("onehit").info("SIGHUP ignored: the proxy is stopping")
