"""A local nginx as a comparison target: found on this machine, configured by us.

The configuration is nginx's own answer to one-hit wonders: ``proxy_cache`` with
``proxy_cache_min_uses 2``, a cache of a given size, keep-alive to the origin, and the cache
outcome in ``X-Cache`` (from ``$upstream_cache_status``) so replays can count hits.
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
    # As root, nginx's workers drop to `nobody` and could not write the cache under `root`.
    user = "user root;" if os.geteuid() == 0 else ""
    path = root / "nginx.conf"
    path.write_text(f"""{user}
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 4096; }}
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
