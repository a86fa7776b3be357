"""The disk tier's directory: claimed by one process, trusted only when no other user can write
to it, and every file in it opened without following a link.

What it guarantees:

* ``claim`` takes an exclusive lock (``flock`` on ``lock`` in the directory) for the process's
  life: a second onehit on the same ``[disk] path`` is refused with one line naming the key
  and the holder's pid, before it reads or writes anything. Two processes appending to one
  region file by their own counters would each index the other's records and bring back
  each other's purged versions; the workers of one ``--workers`` parent share the directory
  through the index their parent holds (``proxy.ops.shared_tier``), and only the parent
  claims it, handing the lock's descriptor to each worker. The lock goes with the last process
  holding it, however it ends (the kernel drops it at kill -9 too): a parent killed leaves it
  to its workers until they have drained.
* A directory another user may write to (o+w, sticky or not: a sticky directory still lets
  them create the next region file first; g+w for a group other than the process's own; or
  owned by a user that is neither this process's nor root) is refused: a record planted
  there would be served to every client, and a link planted as the next region file would
  have the proxy append to any file it can write. A directory the proxy creates is 0700,
  and every file 0600.
* Files are opened with ``O_NOFOLLOW``: a link in place of one of the tier's files is an error
  (logged, the record a miss), never a way out of the directory.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from pathlib import Path

LOCK = "lock"
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class DiskDirectoryError(ValueError):
    """The directory of ``[disk] path`` cannot be used; the message names the key and the fix."""


def claim(directory: Path) -> int:
    """Create ``directory`` (0700) if needed, check that no other user can write to it, and
    lock it for this process; the lock's descriptor (closed by ``release``)."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(directory)
    except OSError as exc:
        raise DiskDirectoryError(f"[disk] path {str(directory)!r}: {exc.strerror}") from exc
    _trusted(directory, info)
    try:
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    except OSError as exc:
        raise DiskDirectoryError(
            f"[disk] path {str(directory)!r}: its lock file cannot be opened: {exc.strerror}"
        ) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{LOCK} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DiskDirectoryError(
            f"[disk] path {str(directory)!r} is in use by another onehit process (pid "
            f"{holder}, or the workers it started): give this one a directory of its own, or "
            "stop that one (the workers of one --workers parent share its directory)"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise DiskDirectoryError(
            f"[disk] path {str(directory)!r}: its lock file cannot be locked: {exc}"
        ) from exc
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise DiskDirectoryError(
            f"[disk] path {str(directory)!r}: its lock file cannot be written: {exc.strerror}"
        ) from exc
    return fd


def usable(directory: Path) -> None:
    """Check that ``claim`` could take ``directory``, leaving nothing behind: an existing one
    is a trusted directory this process can create a file in; for a missing one, its nearest
    existing ancestor is a directory this process can create a directory in (each tried,
    and removed again: permission bits do not tell, for root or on a read-only or virtual
    file system). ``DiskDirectoryError`` naming the key otherwise."""
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        parent = directory.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".onehit-probe-", dir=parent))
        except OSError as exc:
            raise DiskDirectoryError(
                f"[disk] path {str(directory)!r} does not exist and cannot be created in "
                f"{str(parent)!r} ({exc.strerror}): create it for the proxy's user, or give "
                "another"
            ) from None
        return
    except OSError as exc:
        raise DiskDirectoryError(f"[disk] path {str(directory)!r}: {exc.strerror}") from exc
    _trusted(directory, info)
    try:
        take_a_file(directory)
    except OSError as exc:
        raise DiskDirectoryError(
            f"[disk] path {str(directory)!r}: no file can be written in it ({exc.strerror})"
        ) from None


def take_a_file(directory: Path | str) -> None:
    """Create a file in ``directory`` and remove it again: OSError when it cannot be done
    (permission bits do not tell, for root or on a read-only or virtual file system)."""
    fd, probe = tempfile.mkstemp(prefix=".onehit-probe-", dir=directory)
    os.close(fd)
    os.unlink(probe)


def holder(directory: Path) -> int | None:
    """The process id a live claim of ``directory`` was written with, or None: unclaimed (or
    a lock file this process cannot open)."""
    if not claimed(directory):
        return None
    try:
        return int(read_file(directory / LOCK).split()[0])
    except (OSError, ValueError, IndexError):
        return -1  # claimed by a process that wrote no id yet


def claimed(directory: Path) -> bool:
    """Whether a live process holds ``directory``'s claim (False where it has no lock file,
    or one this process cannot open)."""
    try:
        fd = os.open(directory / LOCK, os.O_RDWR | NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # the probe's own lock goes with its descriptor
    return False


def release(fd: int) -> None:
    """Give the directory up (a clean stop; a crash gives it up too)."""
    os.close(fd)


def _trusted(directory: Path, info: os.stat_result) -> None:
    if not stat.S_ISDIR(info.st_mode):
        raise DiskDirectoryError(f"[disk] path {str(directory)!r} is not a directory")
    # Group write is trusted only for the process's own group (a user's private group, as a
    # umask of 002 gives): another group's members could plant records.
    group = info.st_mode & stat.S_IWGRP and info.st_gid != os.getegid()
    if info.st_mode & stat.S_IWOTH or group:
        who = "every user" if info.st_mode & stat.S_IWOTH else f"group {info.st_gid}"
        raise DiskDirectoryError(
            f"[disk] path {str(directory)!r}: {who} may write to it (mode "
            f"{stat.S_IMODE(info.st_mode):o}), and a record planted there would be served to "
            "every client: chmod go-w it, or give a directory of the proxy's own"
        )
    if info.st_uid not in (os.geteuid(), 0):
        raise DiskDirectoryError(
            f"[disk] path {str(directory)!r} belongs to another user (uid {info.st_uid}), who "
            "could plant records there: give a directory the proxy's user owns"
        )


def open_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` of one of the tier's files, never through a link."""
    return os.open(path, flags | NOFOLLOW, mode)


def read_file(path: Path) -> bytes:
    """The whole of one of the tier's files, read without following a link."""
    fd = open_file(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def replace_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` on the device, or (OSError) what it held before: written to a
    new file (0600, created afresh, never through a link), synced, then renamed over it, so a
    crash leaves one or the other whole; the rename is synced too, so a power cut does not
    bring back the old one."""
    fresh = path.with_suffix(".new")
    fresh.unlink(missing_ok=True)
    fd = open_file(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(fresh, path)
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Put ``directory``'s entries (files created, renamed or removed in it) on the device."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
