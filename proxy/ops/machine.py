"""What the processes of one machine share: memory the parent creates and every worker maps.

What it guarantees:

* ``create`` gives an anonymous memory file (``memfd``) of the asked size, zeroed; it lives
  while a process holds it open or mapped, and goes with the last of them: nothing is left in
  the file system after a crash, and no other onehit on the machine can reach it.
* ``attach`` maps one, shared and writable, in the process that inherited its descriptor
  (``--workers`` hands it to each worker it starts, and to the one that replaces a worker
  that died).
"""

from __future__ import annotations

import mmap
import os


def create(size: int, name: str = "onehit-window") -> int:
    """A descriptor of a new zeroed memory file of ``size`` bytes, inherited by children."""
    fd = os.memfd_create(name, 0)  # inheritable: a worker is given it by its pass_fds
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def attach(fd: int) -> mmap.mmap:
    """The memory file ``fd``, mapped shared and writable; ``fd`` is closed (the mapping keeps
    the memory, and a process this one starts inherits neither)."""
    try:
        return mmap.mmap(
            fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
    finally:
        os.close(fd)
