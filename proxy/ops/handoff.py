"""The configuration a ``--workers`` parent hands its workers: the one the machine runs, never
a file read again by each.

What it guarantees:

* The parent publishes it (``HandedConfig.publish``: its own configuration as a worker runs
  it, ``shared_tier.worker_view``) in a memory file every worker inherits (``machine.create``),
  when it starts and at each reload it takes. A worker reads it as it starts and at each
  reload (``read``). A worker started after a refused reload, whose edited file the parent
  did not take, runs what the others run: their cache keys, admin token and sizes.
* Each publication has a generation; a worker names the one it runs when it is ready, and one
  that started on an older one (a reload taken while it started) is told to reload.
* A reader never takes a half-written configuration: it is written under a sequence number,
  odd while the write is under way, and a reader that meets an odd one, or sees the number
  move while it reads, reads again.
* With it goes the machine's secret (``secret``): the workers show it on what they send the
  parent's admin and each other's (``POST /forget``, ``POST /whatif``), which take nothing
  without it, whatever ``[admin] token`` says (another user of the machine reaches a
  loopback admin listener too).
* It is pickled: the parent and its workers run the same code, and a worker started from
  other code (an upgrade installed under a running machine) that cannot read it does not
  start, rather than run something else.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import secrets
import struct
import time
from typing import NamedTuple

from proxy.config.settings import Config
from proxy.ops import machine

# The sequence number (odd while a write is under way) and the length of what follows.
HEADER = struct.Struct("<QQ")
# The most a configuration takes pickled: thousands of routes fit.
SIZE = 4 << 20
# A reader that keeps meeting writes gives up after this many tries (each a millisecond apart).
TRIES = 1000


class Handed(NamedTuple):
    """What a worker reads: the configuration's generation, the configuration, and the
    machine's secret."""

    generation: int
    config: Config
    secret: str


# The header a worker shows the machine's secret in.
SECRET_FIELD = "X-Onehit-Machine"


def sample_key(secret: str) -> int:
    """The key of the what-if's sample every worker of a machine shares (its samples are of
    the same URLs, which the parent's ghosts of the shared tier need), from its secret."""
    digest = hashlib.sha256(b"what-if sample\0" + secret.encode()).digest()
    return int.from_bytes(digest[:8], "little")


class HandedConfig:
    """The memory file a parent publishes its configuration in and its workers read."""

    def __init__(self, fd: int, secret: str = "") -> None:
        self.fd = fd
        self.secret = secret

    @classmethod
    def create(cls) -> HandedConfig:
        """A parent's: with a new secret for its machine."""
        fd = machine.create(HEADER.size + SIZE, "onehit-config")
        return cls(fd, secrets.token_urlsafe(32))

    def publish(self, config: Config) -> int:
        """Make ``config`` the one workers read; its generation."""
        data = pickle.dumps((config, self.secret), protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > SIZE:
            raise ValueError(f"the configuration takes {len(data)} bytes pickled, over {SIZE}")
        sequence, length = HEADER.unpack(os.pread(self.fd, HEADER.size, 0))
        os.pwrite(self.fd, HEADER.pack(sequence + 1, length), 0)
        os.pwrite(self.fd, data, HEADER.size)
        os.pwrite(self.fd, HEADER.pack(sequence + 2, len(data)), 0)
        return (sequence + 2) // 2

    def read(self) -> Handed:
        """The configuration published last; RuntimeError when none was, or when it cannot
        be read (another version of onehit)."""
        for _ in range(TRIES):
            sequence, length = HEADER.unpack(os.pread(self.fd, HEADER.size, 0))
            if sequence == 0:
                raise RuntimeError("the parent has published no configuration")
            if sequence % 2 == 0 and length <= SIZE:
                data = os.pread(self.fd, length, HEADER.size)
                if HEADER.unpack(os.pread(self.fd, HEADER.size, 0))[0] == sequence:
                    try:
                        config, secret = pickle.loads(data)
                    except Exception as exc:
                        raise RuntimeError(
                            f"the machine's configuration cannot be read by this onehit "
                            f"({exc!r}): is it another version than the parent's?"
                        ) from None
                    if not isinstance(config, Config) or not isinstance(secret, str):
                        raise RuntimeError("the parent published no configuration of onehit's")
                    return Handed(sequence // 2, config, secret)
            time.sleep(0.001)
        raise RuntimeError("the machine's configuration kept changing while it was read")

    def close(self) -> None:
        os.close(self.fd)


def machine_headers(token: str, secret: str) -> dict[str, str]:
    """What a process of the machine shows another's admin: the admin token, when there is
    one, and the machine's secret (``proxy.ops.handoff``)."""
    headers = {SECRET_FIELD: secret}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers
