"""A local nginx, found on this machine and configured by us, in two roles.

As a comparison target, nginx's own answer to one-hit wonders: ``proxy_cache`` with
``proxy_cache_min_uses 2``, a cache of a given size, keep-alive to the origin, and the cache
outcome in ``X-Cache`` (from ``$upstream_cache_status``) so replays can count hits.

As the load balancer in front of a fleet of onehit instances: round robin, or consistent
hashing on the request URI (every request for a URL reaches one instance), passing the Host
through so every instance forms the same cache keys.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def nginx_binary() -> str | None:
    """The nginx executable on PATH or in its usual places, or None."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/nginx/sbin/nginx") if os.access(p, os.X_OK)),
        None,
    )


def nginx_config(root: Path, port: int, origin: str, max_size: int) -> Path:
    """Write ``root/nginx.conf`` for a foreground nginx on 127.0.0.1:``port``; returns its path."""
    path = root / "nginx.conf"
    path.write_text(f"""{main_context(root)}
http {{
    access_log off;
    upstream origin {{ server {origin.removeprefix("http://")}; keepalive 64; }}
    proxy_cache_path {root}/cache levels=1:2 keys_zone=onehit:32m max_size={max_size};
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_cache onehit;
            proxy_cache_min_uses 2;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            add_header X-Cache $upstream_cache_status;
        }}
    }}
}}
""")
    return path


BALANCING = {"round-robin": "", "url-hash": "hash $request_uri consistent;"}
# Answered by the balancer itself: a readiness probe that sends nothing to the fleet.
BALANCER_PROBE = "/__balancer"


def nginx_balancer_config(root: Path, port: int, backends: list[str], balancing: str) -> Path:
    """Write ``root/nginx.conf`` for a foreground nginx on 127.0.0.1:``port`` spreading
    requests over ``backends`` (base URLs) by ``balancing`` (a key of ``BALANCING``)."""
    servers = "\n".join(f"        server {b.removeprefix('http://')};" for b in backends)
    path = root / "nginx.conf"
    path.write_text(f"""{main_context(root)}
http {{
    access_log off;
    upstream fleet {{
        {BALANCING[balancing]}
{servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location = {BALANCER_PROBE} {{ return 204; }}
        location / {{
            proxy_pass http://fleet;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }}
    }}
}}
""")
    return path


def main_context(root: Path, workers: int = 1) -> str:
    """What every nginx of ours starts with: ``workers`` worker processes in the foreground,
    files under ``root``."""
    # As root, nginx's workers drop to `nobody` and could not write the cache under `root`.
    user = "user root;" if os.geteuid() == 0 else ""
    return f"""{user}
worker_processes {workers};
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 4096; }}"""
