"""An upgrade without a refused connection (``[server] handover``, ``--take-over``): a running
onehit hands its listening sockets to a new one over a Unix socket, as HAProxy's ``-x`` and
nginx's binary upgrade do, and drains.

What it guarantees:

* The listening sockets are never closed: the new process holds them (passed with
  ``SCM_RIGHTS``) before the old one stops accepting, so a connection that arrives in between
  waits in the kernel's backlog, never refused.
* The old process, told the sockets were taken, stops as on SIGTERM: it answers what it has
  in progress, within ``[server] drain_timeout``, and releases the disk tier's directory.
  The new one serves once the old one is gone (its end of the Unix socket closes), then
  opens the disk tier: what it holds survives; memory does not.
* Only the running process's own user reaches the socket (mode 0600).
* Under ``--workers`` the parent offers them: it holds every socket its workers listen on
  (one per worker's place, ``SO_REUSEPORT``), and the admin's. A connection the kernel put
  in a socket's queue as its worker drained is accepted by the new worker given that socket.
  Its shared memory tier (``proxy.ops.shared_tier``) is left for the new one, which serves
  what it holds when it runs workers without a disk tier too, and removes it otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Then, each after a space: the offering process's drain timeout, how many of the sockets
# passed with it are the proxy port's (one, or one per worker's place and address; the admin's
# follow), the shared memory tier it leaves (a directory; none: empty); and a newline.
GREETING = b"onehit-handover 2 "
TAKEN = b"taken\n"
MAX_SOCKETS = 253  # the kernel's most in one message (SCM_MAX_FD), the admin's among them
MAX_PROXY_SOCKETS = MAX_SOCKETS - 2  # the admin's one or two (two addresses) left out
# Beyond the offering process's drain: its stop's own steps (checkpoints, closing files).
STOP_MARGIN = 30.0
MAX_WAIT = 86400.0  # a drain said to last longer is no onehit's


class HandoverError(RuntimeError):
    """No listening sockets could be taken over: the message says why and what to do."""


async def offer(
    path: str,
    sockets: Callable[[], tuple[Sequence[Any], Sequence[Any]]],
    drain: float,
    taken: Callable[[], None],
    leaves: str = "",
) -> None:
    """Hand the listening sockets (``sockets()``: the proxy port's and the admin's, as they
    are when asked: a reload may have moved one) to the first process that connects to
    ``path`` and says it took them, telling
    it this process's ``drain`` timeout and the shared memory tier it ``leaves`` (a
    directory, or none); then call ``taken`` (this process's stop). The Unix socket's end
    stays open until this process exits, which tells the new one it is gone. Runs until
    cancelled."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(1)
    server.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        while True:
            connection, _ = await loop.sock_accept(server)
            try:
                proxy, admin = sockets()
                hello = GREETING + f"{drain} {len(proxy)} {leaves}\n".encode()
                socket.send_fds(connection, [hello], [s.fileno() for s in (*proxy, *admin)])
                answer = await asyncio.wait_for(loop.sock_recv(connection, 64), 30)
            except (OSError, TimeoutError) as exc:
                log.warning("a take-over of the listeners at %s failed: %s", path, exc)
                connection.close()
                continue
            if answer != TAKEN:
                connection.close()
                continue
            # Kept open, and inherited by nothing: its end closes as this process exits.
            connection.set_inheritable(False)
            _held.append(connection)
            taken()
            return
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


_held: list[socket.socket] = []
log = logging.getLogger("onehit")


@dataclass(frozen=True)
class Taken:
    """The listening sockets taken over: the proxy port's (every one its old process or
    workers listened on) and the admin's."""

    proxy: list[socket.socket]
    admin: list[socket.socket]
    memory: str = ""  # the shared memory tier the old one left: the taker's to serve or remove


def take(
    path: str,
    proxy_at: tuple[str, int],
    admin_at: tuple[str, int],
    check: Callable[[int], None] | None = None,
) -> Taken:
    """The listening sockets of the onehit offering them at ``path``, once it has let them go
    and exited (within the drain timeout it said, and ``STOP_MARGIN``). ``HandoverError``
    when none offers them, or they do not listen where ``proxy_at`` and ``admin_at`` say
    (host, port; port 0: any), or ``check`` (given the offering process's id) refuses: then
    it goes on, untold. ``HandoverError`` too when it does not end in time."""
    link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    link.settimeout(10)
    try:
        link.connect(path)
        greeting, fds, _, _ = socket.recv_fds(link, 4160, MAX_SOCKETS)  # a path, and more
        pid = struct.unpack("3i", link.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  struct.calcsize("3i")))[0]  # fmt: skip
    except OSError as exc:
        link.close()
        raise HandoverError(
            f"no onehit offers its listeners at {path} ({exc.strerror or exc}): start the "
            "running one with [server] handover set to this path"
        ) from None
    drain, _, rest = greeting[len(GREETING) :].rstrip(b"\n").partition(b" ")
    count, _, memory = rest.partition(b" ")
    try:
        wait, proxies = float(drain) + STOP_MARGIN, int(count)
    except (ValueError, OverflowError):
        wait, proxies = -1.0, 0
    if (not greeting.startswith(GREETING) or not 0 < proxies < len(fds)
            or not 0 <= wait <= MAX_WAIT):  # fmt: skip
        for fd in fds:
            os.close(fd)
        link.close()
        raise HandoverError(f"{path} did not offer listening sockets as onehit does")
    sockets = [socket.socket(fileno=fd) for fd in fds]
    try:  # whatever refuses them, the sockets and the link are given back, the old one untold
        _judge(sockets, proxies, proxy_at, admin_at)
        if check is not None:
            check(pid)
    except BaseException:
        for sock in sockets:
            sock.close()
        link.close()
        raise
    link.sendall(TAKEN)
    link.settimeout(wait)
    try:
        while link.recv(64):  # the old process's end closes as it exits
            pass
    except TimeoutError:
        raise HandoverError(
            f"the onehit that handed over its listeners did not end within {wait:g}s"
        ) from None
    finally:
        link.close()
    return Taken(sockets[:proxies], sockets[proxies:], os.fsdecode(memory))


def _judge(
    sockets: Sequence[socket.socket],
    proxies: int,
    proxy_at: tuple[str, int],
    admin_at: tuple[str, int],
) -> None:
    """Make ``sockets`` this process's own (a worker is given its own, no other) and
    ``HandoverError`` unless the first ``proxies`` listen where ``proxy_at`` says, the rest
    where ``admin_at`` does."""
    expected = [proxy_at] * proxies + [admin_at] * (len(sockets) - proxies)
    for sock, (host, port) in zip(sockets, expected, strict=True):
        sock.set_inheritable(False)
        bound = sock.getsockname()[:2]
        if (port and bound[1] != port) or bound[0] not in _addresses(host):
            raise HandoverError(
                f"the running onehit listens on {bound[0]}:{bound[1]}, the configuration on "
                f"{host}:{port}: a handover keeps the addresses; move a listener with a "
                "reload, or a restart"
            )


def _addresses(host: str) -> set[str]:
    """The addresses ``host`` (a name or an address) listens on."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return {host}
