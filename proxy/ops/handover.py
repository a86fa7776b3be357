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
* Only the running process's own user reaches the socket (mode 0600), and one process of
  its own (not ``--workers``, whose workers each listen on the port) offers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

GREETING = b"onehit-handover 1 "  # then the offering process's drain timeout, and a newline
TAKEN = b"taken\n"
MAX_SOCKETS = 4
# Beyond the offering process's drain: its stop's own steps (checkpoints, closing files).
STOP_MARGIN = 30.0


class HandoverError(RuntimeError):
    """No listening sockets could be taken over: the message says why and what to do."""


async def offer(
    path: str, sockets: Callable[[], Sequence[Any]], drain: float, taken: Callable[[], None]
) -> None:
    """Hand the listening sockets (``sockets()``, as they are when asked: a reload may have
    moved one) to the first process that connects to ``path`` and says it took them, telling
    it this process's ``drain`` timeout; then call ``taken`` (this process's stop). The Unix
    socket's end stays open until this process exits, which tells the new one it is gone.
    Runs until cancelled."""
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
                hello = GREETING + f"{drain}\n".encode()
                socket.send_fds(connection, [hello], [s.fileno() for s in sockets()])
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


def take(
    path: str,
    expected: Sequence[tuple[str, int]] = (),
    check: Callable[[int], None] | None = None,
) -> list[socket.socket]:
    """The listening sockets of the onehit offering them at ``path``, once it has let them go
    and exited (within the drain timeout it said, and ``STOP_MARGIN``). ``HandoverError``
    when none offers them, or they do not listen where ``expected`` says (host, port; port 0:
    any), in order, or ``check`` (given the offering process's id) refuses: then it goes on,
    untold. ``HandoverError`` too when it does not end in time."""
    link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    link.settimeout(10)
    try:
        link.connect(path)
        greeting, fds, _, _ = socket.recv_fds(link, 64, MAX_SOCKETS)
        pid = struct.unpack("3i", link.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  struct.calcsize("3i")))[0]  # fmt: skip
    except OSError as exc:
        link.close()
        raise HandoverError(
            f"no onehit offers its listeners at {path} ({exc.strerror or exc}): start the "
            "running one with [server] handover set to this path"
        ) from None
    try:
        wait = float(greeting[len(GREETING) :]) + STOP_MARGIN
    except ValueError:
        wait = -1.0
    if not greeting.startswith(GREETING) or not fds or wait < 0:
        for fd in fds:
            os.close(fd)
        link.close()
        raise HandoverError(f"{path} did not offer listening sockets as onehit does")
    sockets = [socket.socket(fileno=fd) for fd in fds]
    for sock, (host, port) in zip(sockets, expected, strict=False):
        bound = sock.getsockname()[:2]
        if (port and bound[1] != port) or bound[0] not in _addresses(host):
            for s in sockets:
                s.close()
            link.close()
            raise HandoverError(
                f"the running onehit listens on {bound[0]}:{bound[1]}, the configuration on "
                f"{host}:{port}: a handover keeps the addresses; move a listener with a "
                "reload, or a restart"
            )
    if check is not None:
        try:
            check(pid)
        except Exception:
            for s in sockets:
                s.close()
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
    return sockets


def _addresses(host: str) -> set[str]:
    """The addresses ``host`` (a name or an address) listens on."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return {host}
