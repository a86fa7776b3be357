"""Cache hits over TLS: onehit's listener with ``[server] tls_cert`` beside nginx's
``proxy_cache`` on an ``ssl`` listener, in one run, and each over plain HTTP too, so the ratio
shows what TLS costs each of them.

Each server a process on 127.0.0.1 pinned to the second core, the load (``wrk``, keep-alive:
one handshake per connection, as a CDN's clients mostly are) to the first; the same test
certificate (``trustme``), the same origin and bodies as ``bench_proxy.py``; one URL of each
size, warmed until stored (nginx stores on its second request, as onehit). Each cell is the
median of ``--runs`` runs; the origin counts its requests, and a cell that reached it is
flagged. Needs nginx and wrk.

    .venv/bin/python benchmarks/bench_tls.py [--seconds 5] [--connections 64] [--runs 3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import trustme
from bench_proxy import (
    LOAD_CORE,
    SERVER_CORE,
    SIZES,
    measure,
    median,
    origin_count,
    spawn,
    wait_ready,
)

from loadgen.live.nginx import nginx_binary, nginx_config
from loadgen.live.processes import free_port


def _nginx_tls(root: Path, port: int, origin: str, cert: Path, key: Path) -> Path:
    """bench_proxy's nginx configuration, its listener on TLS (HTTP/1.1, as onehit's)."""
    path = nginx_config(root, port, origin, 1 << 30)
    text = path.read_text().replace(
        f"listen 127.0.0.1:{port};",
        f"listen 127.0.0.1:{port} ssl;\n        ssl_certificate {cert};\n"
        f"        ssl_certificate_key {key};\n        ssl_protocols TLSv1.2 TLSv1.3;",
    )
    path.write_text(text)
    return path


def _warm(url: str, context: object) -> None:
    for _ in range(3):
        with urllib.request.urlopen(url, context=context, timeout=10) as r:
            r.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    nginx = nginx_binary()
    if nginx is None or shutil.which("wrk") is None:
        sys.exit("bench_tls needs nginx and wrk (apt-get install nginx-light wrk)")
    import ssl

    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="onehit-tls-"))
    cert, key = work / "cert.pem", work / "key.pem"
    cert.write_bytes(b"".join(p.bytes() for p in issued.cert_chain_pems))
    key.write_bytes(issued.private_key_pem.bytes())
    context = ssl.create_default_context()
    authority.configure_trust(context)
    py = sys.executable
    bench = str(Path(__file__).with_name("bench_proxy.py"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        ports = {n: free_port() for n in ("origin", "onehit", "onehit-tls", "nginx",
                                          "nginx-tls", "a1", "a2")}  # fmt: skip
        origin = f"http://127.0.0.1:{ports['origin']}"
        spawn(stack, *SERVER_CORE, py, bench, "--role", "origin", str(ports["origin"]))
        wait_ready(origin + "/__count")
        for name, admin, tls in (("onehit", "a1", False), ("onehit-tls", "a2", True)):
            extra = ["--set", f"server.tls_cert={cert}", "--set", f"server.tls_key={key}"]
            spawn(stack, *SERVER_CORE, py, "-m", "proxy", "--origin", origin,
                  "--listen", f"127.0.0.1:{ports[name]}",
                  "--admin-listen", f"127.0.0.1:{ports[admin]}", "--admission", "always",
                  "--set", "server.access_log=false", "--set", "cache.size=1GiB",
                  *(extra if tls else []))  # fmt: skip
            wait_ready(f"http://127.0.0.1:{ports[admin]}/healthz")
        for name, tls in (("nginx", False), ("nginx-tls", True)):
            root = Path(tempfile.mkdtemp(prefix="onehit-nginx-", dir=work))
            config = (_nginx_tls(root, ports[name], origin, cert, key) if tls
                      else nginx_config(root, ports[name], origin, 1 << 30))  # fmt: skip
            spawn(stack, *SERVER_CORE, nginx, "-c", str(config), "-p", str(root))
        time.sleep(1.0)
        servers = {
            "onehit": f"http://127.0.0.1:{ports['onehit']}",
            "onehit, TLS": f"https://127.0.0.1:{ports['onehit-tls']}",
            "nginx proxy_cache": f"http://127.0.0.1:{ports['nginx']}",
            "nginx proxy_cache, TLS": f"https://127.0.0.1:{ports['nginx-tls']}",
        }
        pinned = "" if LOAD_CORE else " (no taskset)"
        print(f"hits/s over {args.connections} keep-alive connections, median of {args.runs} "
              f"runs of {args.seconds:g} s; load on core 0{pinned}")  # fmt: skip
        for size in SIZES:
            print(f"\n{size}")
            results = {}
            for name, base in servers.items():
                _warm(f"{base}/{size}", context)
                before = origin_count(origin)
                runs = [measure(f"{base}/{size}", args.seconds, args.connections)
                        for _ in range(args.runs)]  # fmt: skip
                flagged = origin_count(origin) != before
                results[name] = median(runs)
                rps, p50, p99 = results[name]
                print(f"  {name:26} {rps:10,.0f}/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms"
                      + ("  (reached the origin!)" if flagged else ""))  # fmt: skip
            tls, plain = results["onehit, TLS"][0], results["onehit"][0]
            ngx_tls, ngx_plain = (
                results["nginx proxy_cache, TLS"][0],
                results["nginx proxy_cache"][0],
            )
            print(f"  onehit TLS / nginx TLS: x{tls / ngx_tls:.2f};  TLS / plain: onehit "
                  f"x{tls / plain:.2f}, nginx x{ngx_tls / ngx_plain:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
