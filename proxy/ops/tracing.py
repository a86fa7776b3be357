"""``GET /trace?url=`` on the admin port (and ``onehit-proxy trace URL``): one real request
for a URL, sent to the proxy's own data port as a client's would be, and the decisions the
proxy took for it (``proxy.wire.trace``).

Rules this module keeps:

* The request is real: it is counted, sighted by admission, may go to the origin and be
  stored, as any client's. Only GET and HEAD are traced (nothing that changes the origin).
* It shows the trace token (the process's, or its machine's) and closes its connection,
  which keeps it off the compiled hit path; the proxy takes the same decisions there (its
  parity tests hold the two equal).
* It goes through the listener clients use: with TLS (the name from the URL, for SNI) and
  with a PROXY protocol header where the listener expects one. Its head is awaited
  ``TIMEOUT`` seconds; its body is read and counted, not kept, for ``TIMEOUT`` more, and the
  answer says when it was not whole by then (the steps, all in the head, are kept).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any
from urllib.parse import quote, urlsplit

from proxy.config import values
from proxy.config.settings import ServerSection
from proxy.handler.routing import Router
from proxy.wire import trace

TIMEOUT = 30.0
# What the CLI waits for the admin's answer: the head's wait, the body's, and some.
ASK_TIMEOUT = 2 * TIMEOUT + 10
METHODS = ("GET", "HEAD")
HEAD_LIMIT = 1 << 20  # bytes of one response head, at most
# What a request target keeps as it is (RFC 3986's reserved and unreserved characters, and
# ``%``): the rest is percent-encoded, as a client sends it.
SENT = "/?#[]@!$&'()*+,;=:%-._~"


class TraceError(ValueError):
    """The trace was not asked as it must be: the message says what to give."""


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
            values.loopback(address), host, target, token, method=query.get("method", "GET"),
            tls=bool(server.tls_cert), proxy_protocol=server.proxy_protocol,
        )  # fmt: skip
    except TraceError as exc:
        return 400, {"error": str(exc)}
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ValueError, IndexError) as exc:  # fmt: skip
        # Its name and its own words, never the request (which holds the token).
        said = f"{type(exc).__name__}: {str(exc)[:200]}".rstrip(": ")
        return 502, {"error": f"the data port at {address[0]}:{address[1]} did not answer the "
                              f"traced request as HTTP ({said})"}  # fmt: skip
    return 200, {"url": url, **answer}


def target_of(url: str, router: Router) -> tuple[str, str]:
    """The Host and the request target of an absolute ``url``, as the proxy would route it
    (``TraceError`` for one it would refuse, or that is not absolute)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an IPv6 address not closed, for one
        raise TraceError(f"{url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TraceError(f"{url!r}: give an absolute URL, http://host/path")
    if not parts.netloc.isascii():
        raise TraceError(f"{url!r}: give the host as the proxy is asked it (its IDNA form)")
    try:
        router.url_key(f"http://{parts.netloc}{parts.path or '/'}")
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    # As a client sends it: what is not ASCII percent-encoded (what is, is sent as given).
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), SENT)
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
        answer = await asyncio.wait_for(
            _head(reader, writer, method, host, target, token, proxy_protocol), TIMEOUT
        )
        length = 0
        try:
            async with asyncio.timeout(TIMEOUT):
                while chunk := await reader.read(1 << 16):
                    length += len(chunk)
        except TimeoutError:
            answer["body"] = f"not read whole within {TIMEOUT:g}s"
        answer["bytes_after_head"] = length
        answer["ms"] = round((time.perf_counter() - started) * 1000, 3)
        return answer
    finally:
        writer.close()


async def _head(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    host: str,
    target: str,
    token: str,
    proxy_protocol: bool,
) -> dict[str, Any]:
    """Send the request, and what its answer's head says (its status, fields and steps)."""
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
    return {
        "request": {"method": method, "host": host, "target": target},
        "status": status,
        "headers": fields,
        "steps": steps,
    }
