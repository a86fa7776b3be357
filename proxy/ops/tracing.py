"""``GET /trace?url=`` on the admin port (and ``onehit-proxy trace URL``): one real request
for a URL, sent to the proxy's own data port as a client's would be, and the decisions the
proxy took for it (``proxy.core.trace``).

Rules this module keeps:

* The request is real: it is counted, sighted by admission, may go to the origin and be
  stored, as any client's. Only GET and HEAD are traced (nothing that changes the origin).
* It shows the trace token (the process's, or its machine's) and closes its connection,
  which keeps it off the compiled hit path; the proxy takes the same decisions there (its
  parity tests hold the two equal).
* It goes through the listener clients use: with TLS (the name from the URL, for SNI) and
  with a PROXY protocol header where the listener expects one. Its body is read whole and
  counted, not kept, within ``TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from proxy.config.settings import ServerSection
from proxy.core import trace
from proxy.handler.routing import Router

TIMEOUT = 30.0
METHODS = ("GET", "HEAD")
HEAD_LIMIT = 1 << 20  # bytes of one response head, at most


class TraceError(ValueError):
    """The trace was not asked as it must be: the message says what to give."""


def loopback(listen: tuple[str, int]) -> tuple[str, int]:
    """A listener's address as a process of this machine reaches it: on loopback when it
    listens everywhere."""
    host, port = listen
    if host in ("", "0.0.0.0"):
        return "127.0.0.1", port
    if host == "::":
        return "::1", port
    return host, port


async def traced(
    query: Any, router: Router, server: ServerSection, address: tuple[str, int], token: str
) -> tuple[int, dict[str, Any]]:
    """``GET /trace``'s status and answer: ``?url=`` (and ``method=``, GET by default) traced
    through the data port at ``address`` as ``server`` listens (TLS, PROXY protocol)."""
    url = query.get("url")
    try:
        if not url:
            raise TraceError("give ?url=http://host/path (and method=HEAD for a HEAD)")
        host, target = target_of(url, router)
        answer = await trace_request(
            loopback(address), host, target, token, method=query.get("method", "GET"),
            tls=bool(server.tls_cert), proxy_protocol=server.proxy_protocol,
        )  # fmt: skip
    except TraceError as exc:
        return 400, {"error": str(exc)}
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ValueError, IndexError) as exc:  # fmt: skip
        return 502, {"error": f"the data port at {address[0]}:{address[1]} did not answer the "
                              f"traced request as HTTP: {exc!r}"}  # fmt: skip
    return 200, {"url": url, **answer}


def target_of(url: str, router: Router) -> tuple[str, str]:
    """The Host and the request target of an absolute ``url``, as the proxy would route it
    (``TraceError`` for one it would refuse, or that is not absolute)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TraceError(f"{url!r}: give an absolute URL, http://host/path")
    try:
        router.url_key(f"http://{parts.netloc}{parts.path or '/'}")
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in target or c in parts.netloc for c in " \r\n\t"):
        raise TraceError(f"{url!r}: a URL holds no space or line break")
    return parts.netloc, target


async def trace_request(
    address: tuple[str, int],
    host: str,
    target: str,
    token: str,
    *,
    method: str = "GET",
    tls: bool = False,
    proxy_protocol: bool = False,
) -> dict[str, Any]:
    """Send ``method target`` for ``host`` to the data port at ``address`` (a loopback
    address), traced with ``token``, and what came back: the status, the head's fields, the
    body's length, the time taken, and the proxy's ``steps`` (None when the request was
    answered before it was routed, a refusal, which is not traced)."""
    if method not in METHODS:
        raise TraceError(f"method {method!r}: a trace sends GET or HEAD")
    context = None
    if tls:  # the proxy's own listener: its certificate is the operator's to check
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    name = urlsplit(f"//{host}").hostname or None
    started = time.perf_counter()
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(*address, ssl=context, limit=HEAD_LIMIT,
                                server_hostname=name if context else None),
        TIMEOUT,
    )  # fmt: skip
    try:
        return await asyncio.wait_for(
            _exchange(reader, writer, method, host, target, token, proxy_protocol, started),
            TIMEOUT,
        )
    finally:
        writer.close()


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    host: str,
    target: str,
    token: str,
    proxy_protocol: bool,
    started: float,
) -> dict[str, Any]:
    head = b""
    if proxy_protocol:  # as a load balancer in front would say: this connection's own ends
        here, there = writer.get_extra_info("sockname"), writer.get_extra_info("peername")
        family = "TCP6" if ":" in here[0] else "TCP4"
        head = f"PROXY {family} {here[0]} {there[0]} {here[1]} {there[1]}\r\n".encode()
    head += (
        f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{trace.FIELD}: {token}\r\n"
        "User-Agent: onehit-trace\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    writer.write(head)
    await writer.drain()
    while True:  # past interim (1xx) heads
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        if status >= 200:
            break
    fields: list[list[str]] = []
    steps = None
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        if name.strip().lower() == trace.FIELD.lower():
            steps = trace.steps_of(value.strip())
        else:
            fields.append([name.strip(), value.strip()])
    length = 0
    while chunk := await reader.read(1 << 16):
        length += len(chunk)
    return {
        "request": {"method": method, "host": host, "target": target},
        "status": status,
        "headers": fields,
        "bytes_after_head": length,
        "ms": round((time.perf_counter() - started) * 1000, 3),
        "steps": steps,
    }
