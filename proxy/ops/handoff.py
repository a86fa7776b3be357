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
* It is pickled: the parent and its workers run the same code, and a worker started from
  other code (an upgrade installed under a running machine) that cannot read it does not
  start, rather than run something else.
"""

from __future__ import annotations

import os
import pickle
import struct
import time

from proxy.config.settings import Config
from proxy.ops import machine

# The sequence number (odd while a write is under way) and the length of what follows.
HEADER = struct.Struct("<QQ")
# The most a configuration takes pickled: thousands of routes fit.
SIZE = 4 << 20
# A reader that keeps meeting writes gives up after this many tries (each a millisecond apart).
TRIES = 1000


class HandedConfig:
    """The memory file a parent publishes its configuration in and its workers read."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls) -> HandedConfig:
        return cls(machine.create(HEADER.size + SIZE, "onehit-config"))

    def publish(self, config: Config) -> int:
        """Make ``config`` the one workers read; its generation."""
        data = pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > SIZE:
            raise ValueError(f"the configuration takes {len(data)} bytes pickled, over {SIZE}")
        sequence, length = HEADER.unpack(os.pread(self.fd, HEADER.size, 0))
        os.pwrite(self.fd, HEADER.pack(sequence + 1, length), 0)
        os.pwrite(self.fd, data, HEADER.size)
        os.pwrite(self.fd, HEADER.pack(sequence + 2, len(data)), 0)
        return (sequence + 2) // 2

    def read(self) -> tuple[int, Config]:
        """The configuration published last and its generation; RuntimeError when none was,
        or when it cannot be read (another version of onehit)."""
        for _ in range(TRIES):
            sequence, length = HEADER.unpack(os.pread(self.fd, HEADER.size, 0))
            if sequence == 0:
                raise RuntimeError("the parent has published no configuration")
            if sequence % 2 == 0 and length <= SIZE:
                data = os.pread(self.fd, length, HEADER.size)
                if HEADER.unpack(os.pread(self.fd, HEADER.size, 0))[0] == sequence:
                    try:
                        config = pickle.loads(data)
                    except Exception as exc:
                        raise RuntimeError(
                            f"the machine's configuration cannot be read by this onehit "
                            f"({exc!r}): is it another version than the parent's?"
                        ) from None
                    if not isinstance(config, Config):
                        raise RuntimeError("the parent published no configuration of onehit's")
                    return sequence // 2, config
            time.sleep(0.001)
        raise RuntimeError("the machine's configuration kept changing while it was read")

    def close(self) -> None:
        os.close(self.fd)
