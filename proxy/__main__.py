"""``onehit-proxy``: the caching reverse proxy (``python -m proxy`` works the same)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from proxy.config import Config, ConfigError, load
from proxy.service import Service

log = logging.getLogger("onehit")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides: dict[str, object] = {}
    for flag, key in (
        ("origin", "upstream.origin"),
        ("listen", "server.listen"),
        ("admin_listen", "admin.listen"),
        ("cache_size", "cache.size"),
        ("admission", "admission.policy"),
        ("window", "admission.window"),
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
    try:
        config = load(args.config, os.environ, overrides)
    except ConfigError as exc:
        print(f"onehit-proxy: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        _run(_serve(config))
    except OSError as exc:
        print(f"onehit-proxy: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="onehit-proxy",
        description="A caching reverse proxy that stores a URL on its second request.",
    )
    p.add_argument("--config", help="TOML file (see config/proxy.toml for every key)")
    p.add_argument("--origin", help="default origin, e.g. http://127.0.0.1:9000")
    p.add_argument("--listen", help="host:port for clients (default 127.0.0.1:8080)")
    p.add_argument("--admin-listen", help="host:port for /stats, /metrics (default :9901)")
    p.add_argument("--cache-size", help="e.g. 512MiB")
    p.add_argument("--admission", help="second-hit or always")
    p.add_argument("--window", help="auto or a duration such as 10m")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="any config key"
    )
    return p


def _run(coroutine: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop  # optional: a faster event loop when installed
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


async def _serve(config: Config) -> None:
    service = await Service.start(config)
    host, port = service.proxy_address
    admin_host, admin_port = service.admin_address
    log.info(
        "onehit listening on http://%s:%d (admin http://%s:%d), admission %s, cache %d bytes",
        host, port, admin_host, admin_port, config.admission_config().label(), config.cache.size,
    )  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: draining requests in flight (up to %gs)", config.server.drain_timeout)
    await service.stop()
    log.info("stopped")


if __name__ == "__main__":
    sys.exit(main())
