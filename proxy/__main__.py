"""``onehit-proxy``: the caching reverse proxy (``python -m proxy`` works the same)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import logging
import mmap
import os
import signal
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from proxy.config import values
from proxy.config.logs import ErrorLog, OneLine
from proxy.config.settings import Config, ConfigError, load
from proxy.disk.directory import holder
from proxy.disk.sharing import Sharing
from proxy.ops import handover, inspection, preflight, tracing
from proxy.ops.handoff import HandedConfig
from proxy.ops.machine import attach
from proxy.ops.service import ACCEPTED_GRACE, Service, hold_signals, until_signalled
from proxy.ops.shared_tier import check_workers, discard_scratch, worker_sharing
from proxy.ops.workers import (
    READY,
    MachineForgets,
    MachineSamples,
    die_with_parent,
    reachable,
    serve_workers,
)

T = TypeVar("T")

log = logging.getLogger("onehit")


def _standard_descriptors() -> None:
    """Descriptors 0, 1 and 2 open, as a daemon keeps them: one started with stderr closed
    (``2>&-``) would otherwise have the next file it opens (a disk region, the access log)
    take descriptor 2, and log lines meant for stderr written into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: fd itself


def main(argv: Sequence[str] | None = None) -> int:
    # Until the service has started, SIGUSR1 (reopen the logs) and SIGHUP (reload) are held:
    # one sent while it starts (a worker told of a reload taken meanwhile) is handled then.
    hold_signals()
    given = list(sys.argv[1:] if argv is None else argv)
    for i, token in enumerate(given):  # the subcommands' spelling of their flags, anywhere
        if token in ("inspect", "trace") and (i == 0 or not given[i - 1].startswith("-")):
            given[i] = f"--{token}"
            break
    args = _parser().parse_args(given)
    overrides: dict[str, object] = {}
    for flag, key in (
        ("origin", "upstream.origin"),
        ("listen", "server.listen"),
        ("admin_listen", "admin.listen"),
        ("cache_size", "cache.size"),
        ("admission", "admission.policy"),
        ("window", "admission.window"),
        ("workers", "server.workers"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or "." not in key:
            print(f"onehit-proxy: --set {item!r}: expected section.key=value", file=sys.stderr)
            return 2
        overrides[key.strip()] = value
    handed = None if args.config_fd is None else HandedConfig(args.config_fd)
    generation, secret = 0, ""
    try:
        if handed is not None:  # a worker runs the machine's configuration, not the file's
            generation, config, secret = handed.read()
        else:
            config = load(args.config, os.environ, overrides)
        asking = args.reload or args.inspect is not None or args.trace is not None
        if not asking:  # the running proxy checks its own files
            preflight.check(config)
            if config.server.workers > 1 and not args.worker:  # as each worker will run it
                check_workers(config, config.server.workers)
    except (ConfigError, RuntimeError) as exc:
        print(f"onehit-proxy: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(json.dumps(config.effective(), indent=2))
        print("onehit-proxy: configuration ok", file=sys.stderr)
        return 0
    if args.reload:
        return ask_reload(config)
    if args.inspect is not None:
        return ask_inspect(config, args.inspect)
    if args.trace is not None:
        query = urllib.parse.urlencode({"url": args.trace, "method": args.trace_method})
        answer = _ask_admin(config, "GET", "/trace?" + query, tracing.ASK_TIMEOUT)
        return 2 if answer is None else 1 if "error" in answer else 0
    _standard_descriptors()
    if not logging.getLogger().handlers:  # as basicConfig, which then takes no handler
        errors = ErrorLog()
        errors.setFormatter(OneLine())
        logging.basicConfig(level=logging.INFO, handlers=[errors])

    def read() -> Config:
        """The configuration from the same file, environment and flags, read again; a
        worker's, the one its parent hands it."""
        if handed is not None:
            return handed.read().config
        return load(args.config, os.environ, overrides)

    try:
        taken = None
        if args.take_over:  # before the loop: the old one drains, then this one serves
            if not config.server.handover:
                raise ValueError("--take-over needs [server] handover: the running one's path")
            log.info("taking over the listeners offered at %s", config.server.handover)
            follows = functools.partial(_disk_follows, config)
            taken = handover.take(config.server.handover, config.server.listen,
                                  config.admin.listen, follows)  # fmt: skip
            if config.server.workers == 1:  # a memory tier the old workers left is not its
                discard_scratch(taken.memory)
        if config.server.workers > 1 and not args.worker:
            return _run(
                serve_workers(config, config.server.workers, read, taken),
                config.server.event_loop,
            )
        if args.parent is not None:
            die_with_parent(args.parent)
        shared = None if args.shared_window_fd is None else attach(args.shared_window_fd)
        sharing = None
        if args.shared_tier is not None:
            sharing = worker_sharing(args.shared_tier, args.worker_place)
        forgets = samples = None
        if sharing is not None and args.parent_admin:
            forgets = MachineForgets(args.parent_admin, args.worker_place, config.admin.token,
                                     secret, sharing.workers)  # fmt: skip
            samples = MachineSamples(args.parent_admin, args.worker_place, config.admin.token,
                                     secret)  # fmt: skip
        listeners = [] if taken is None else taken.proxy
        if args.listen_fds:  # a worker's, its parent's: the queue outlives a worker's drain
            listeners = [socket.socket(fileno=int(fd)) for fd in args.listen_fds.split(",")]
        _run(
            _serve(config, worker=args.worker, shared_window=shared, sharing=sharing,
                   forgets=forgets, samples=samples, read_config=read, generation=generation,
                   secret=secret, listeners=listeners,
                   admin_sockets=() if taken is None else taken.admin),
            config.server.event_loop,
        )  # fmt: skip
    except (OSError, ValueError, RuntimeError) as exc:  # a HandoverError too
        print(f"onehit-proxy: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def _disk_follows(config: Config, offering: int) -> None:
    """Refuse a take-over (before the running onehit is told) whose disk tier another process
    than the one offering its listeners holds: this one could not start once that one had
    gone, and nothing would listen."""
    path = config.disk.path
    held = holder(Path(path)) if path else None
    if held is not None and held != offering:
        raise handover.HandoverError(
            f"[disk] path {path!r} is held by another onehit (pid {held}) than the one "
            f"offering its listeners (pid {offering}): give this one that one's directory"
        )


def ask_reload(config: Config) -> int:
    """``--reload``: ``POST /reload`` to the admin listener ``config`` names (with its token);
    0 when the proxy reloaded, 1 when it refused (its reason printed), 2 when no onehit
    answered. The file read is the one the proxy will read: an admin listener or token moved
    in it is not the running one's yet (SIGHUP reaches the proxy wherever its admin is)."""
    answer = _ask_admin(config, "POST", "/reload")
    return 2 if answer is None else 0 if answer.get("reloaded") else 1


def ask_inspect(config: Config, url: str) -> int:
    """``inspect URL`` (``--inspect``): ``GET /cache`` of the admin listener ``config`` names,
    for ``url``, or the keys memory holds under it when it ends with ``*``; 0 when answered,
    1 when the proxy refused the URL, 2 when no onehit answered."""
    limit = str(inspection.MAX_LIMIT)
    query = {"prefix": url[:-1], "limit": limit} if url.endswith("*") else {"url": url}
    answer = _ask_admin(config, "GET", "/cache?" + urllib.parse.urlencode(query))
    return 2 if answer is None else 1 if "error" in answer else 0


def _ask_admin(config: Config, method: str, path: str, timeout: float = 30) -> dict | None:
    """The running proxy's JSON answer to ``method path`` on the admin listener ``config``
    names (with its token), printed; None, said on stderr, when no onehit answered."""
    url = f"{reachable(config.admin.listen)}{path}"
    headers = {"Content-Type": "application/json"}
    if config.admin.token:
        headers["Authorization"] = f"Bearer {config.admin.token}"
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    status = 200
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            text = r.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    except OSError as exc:
        print(f"onehit-proxy: no proxy answered at {url}: {exc}", file=sys.stderr)
        return None
    try:
        answer = json.loads(text or b"{}")
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        why = f"{url} answered {status}, not as onehit's admin does"
        print(f"onehit-proxy: {why} (is admin.listen the running proxy's?): {text[:200]!r}",
              file=sys.stderr)  # fmt: skip
        return None
    print(json.dumps(answer, indent=2))
    return answer


def worker_count(value: str) -> int:
    """``--workers``: as ``[server] workers``."""
    try:
        return values.workers(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, not {value!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="onehit-proxy",
        description="A caching reverse proxy that stores a URL on its second request.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    p.add_argument("--config", help="TOML file (see config/proxy.toml for every key)")
    p.add_argument("--origin", help="default origin, e.g. http://127.0.0.1:9000")
    p.add_argument("--listen", help="host:port for clients (default 127.0.0.1:8080)")
    p.add_argument(
        "--admin-listen",
        help="host:port for /stats, /metrics, /healthz, /readyz, /purge, /reload "
        "(default 127.0.0.1:9901)",
    )
    p.add_argument("--cache-size", help="e.g. 512MiB")
    p.add_argument(
        "--admission",
        help="second-hit (default), always, nth-hit:N, probabilistic:P, size-below:BYTES, "
        "tinylfu or adaptive",
    )
    p.add_argument("--window", help="auto or a duration such as 10m")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="any config key"
    )
    p.add_argument(
        "--workers",
        type=worker_count,
        help="([server] workers) processes serving the port as one cache (one admission "
        "window, one shared tier), or auto: one per core this may use",
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="check the settings (file, environment, flags), print those in force, and exit",
    )
    p.add_argument(
        "--take-over",
        action="store_true",
        help="take the listening sockets the running onehit offers at [server] handover, let "
        "it drain, then serve: an upgrade or restart without a refused connection",
    )
    p.add_argument(
        "--reload",
        action="store_true",
        help="have the running proxy these settings name (its admin listener) read its "
        "configuration again, as SIGHUP does; print what changed, or why nothing did",
    )
    p.add_argument(
        "--inspect",
        metavar="URL",
        help="print what the running proxy these settings name holds and thinks of URL "
        "(its tiers, age, ttl, validators, hits, admission), or the keys it holds under URL "
        "when it ends with *; also 'onehit-proxy inspect URL'",
    )
    p.add_argument(
        "--trace",
        metavar="URL",
        help="send the running proxy these settings name one real request for URL, traced, "
        "and print the decisions it took (route, key, plan, tiers, origin, storing) and its "
        "answer's head; also 'onehit-proxy trace URL'",
    )
    p.add_argument("--trace-method", default="GET", choices=["GET", "HEAD"],
                   help="the traced request's method (default GET)")  # fmt: skip
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shared-window-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    p.add_argument("--shared-tier", help=argparse.SUPPRESS)
    p.add_argument("--worker-place", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--listen-fds", help=argparse.SUPPRESS)
    p.add_argument("--parent-admin", help=argparse.SUPPRESS)
    p.add_argument("--config-fd", type=int, help=argparse.SUPPRESS)
    return p


def _version() -> str:
    """The installed package's version (the checkout's, for an editable install)."""
    try:
        return metadata.version("onehit")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _run(coroutine: Coroutine[Any, Any, T], event_loop: str = "auto") -> T:
    """Run ``coroutine`` on uvloop (``uvloop``; ``auto``: where it installs, a dependency on
    Linux and macOS), or on asyncio's own loop (``asyncio``, and ``auto`` without uvloop)."""
    uvloop = None
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise SystemExit(
                    "[server] event_loop = 'uvloop', but uvloop is not installed"
                ) from None
    # Run outside the except clause: a traceback logged while serving must not carry the
    # ImportError as its context.
    if uvloop is None:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


# Young objects are collected every this many allocations instead of CPython's 700 (see
# ``collect_for_serving``).
YOUNG_COLLECTION_THRESHOLD = 10_000


def collect_for_serving() -> None:
    """Tune the cyclic garbage collector for a server: the objects alive once it has started
    (modules, configuration, engine) leave the collector's view for good, and young objects are
    collected every ``YOUNG_COLLECTION_THRESHOLD`` allocations. Each collection traverses
    every request in flight: at 700 the collector ran about every 32 misses and took about 11%
    of the process's time under misses, a quarter of it in full collections over the start-up
    objects. What the proxy frees never waits on the collector: its requests leave no
    reference cycles behind (``tests/test_memory_bounds.py`` counts them)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


async def _serve(
    config: Config,
    worker: bool = False,
    shared_window: mmap.mmap | None = None,
    sharing: Sharing | None = None,
    forgets: MachineForgets | None = None,
    samples: MachineSamples | None = None,
    read_config: Callable[[], Config] | None = None,
    generation: int = 0,
    secret: str = "",
    listeners: Sequence[socket.socket] = (),
    admin_sockets: Sequence[socket.socket] = (),
) -> None:
    service = await Service.start(
        config, reuse_port=worker, shared_window=shared_window, sharing=sharing,
        forgotten=forgets, samples=samples, read_config=read_config, machine_secret=secret,
        listeners=listeners, admin_sockets=admin_sockets,
    )  # fmt: skip
    collect_for_serving()
    host, port = service.proxy_address
    admin_host, admin_port = service.admin_address
    # loadgen's experiments start the proxy on port 0 and read where it listens from this line.
    log.info(
        "onehit listening on %s://%s:%d (admin http://%s:%d), admission %s, cache %d bytes",
        "https" if config.server.tls_cert else "http", host, port, admin_host, admin_port,
        config.admission_config().label(), config.cache.size,
    )  # fmt: skip
    if worker:  # the parent waits for this line to learn where this worker's admin listens
        # With the generation of the configuration it runs: one handed over since is taken.
        print(f"{READY}http://{admin_host}:{admin_port} {generation}", flush=True)
    offering = None
    if config.server.handover and not worker:  # its listeners, to the next onehit
        stop = functools.partial(os.kill, os.getpid(), signal.SIGTERM)
        offering = asyncio.get_running_loop().create_task(handover.offer(
            config.server.handover, service.listening_sockets, config.server.drain_timeout,
            stop,
        ))  # fmt: skip
    await until_signalled(service.reopen_logs, service.reload_soon)
    if offering is not None:
        offering.cancel()
    log.info("stopping: draining requests in flight (up to %gs)", config.server.drain_timeout)
    await service.stop(ACCEPTED_GRACE)
    for sender in (forgets, samples):
        if sender is not None:
            await sender.close()
    log.info("stopped")


if __name__ == "__main__":
    sys.exit(main())
