"""The disk tier's files: region files of records written once each, every record carrying its
key and a checksum, read back verified and scanned again after a crash.

What it guarantees:

* A record is written at the place ``Regions`` reserved for it in the open region, so the
  device sees the ring filled front to back (the workers of a machine, reserving places in
  one region, ``SharedRegions``, write them in whatever order they get to); an evicted
  region's file is removed whole. Nothing is rewritten in place.
* A record is ``magic, length, checksum, key length, meta length, key, meta, body``; the
  checksum (``checksum``: xxh3's low 32 bits, fast enough to check on every read) covers
  everything after it. ``read`` returns a record's meta and body only when its magic,
  length and checksum hold and its key is the one asked for: a torn, corrupt or misplaced
  record is a miss, never a wrong body.
* After a crash, ``recover`` scans the region files oldest first and yields every whole record
  up to the first gap or torn record of each; a region's file is cut back there, and records
  go on from there. (A worker killed between reserving a place and writing it leaves such a
  gap: the records after it in that region are lost to the scan, never misread.)
* A full disk, a read error or a region file removed by hand make the record concerned a miss,
  with one log line (at most one a second); nothing raises to the caller.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from xxhash import xxh3_64_intdigest

from proxy.config.logs import OneLineEvery
from proxy.core.disk import RECORD, Slot
from proxy.core.regions import Ring
from proxy.disk.directory import open_file

DISK_ERRORS = logging.getLogger("onehit.disk")
DISK_ERRORS.addFilter(OneLineEvery())

MAGIC = b"OHR2"
HEADER = RECORD  # the one definition of a record's header, in the core
MAX_KEY = 0xFFFF  # the longest key a record's header can say the length of
_FILE = re.compile(r"region-(\d{10})\.log")
# Region files kept open for reading; past this many the oldest opened is closed, so a large
# disk tier stays within the process's file limit.
READ_FDS = 64
# preadv2's flag that reads only what the page cache holds (Linux 4.14+), or 0 where there is none.
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


def _read_warm(fd: int, length: int, offset: int) -> bytes | bytearray:
    """``length`` bytes at ``offset`` when the page cache holds them all, else BlockingIOError;
    a plain read where the kernel or the file system cannot tell."""
    if not _NOWAIT:
        return os.pread(fd, length, offset)
    buffer = bytearray(length)
    try:
        got = os.preadv(fd, [buffer], offset, _NOWAIT)
    except OSError as exc:
        if exc.errno != errno.EOPNOTSUPP:
            raise
        return os.pread(fd, length, offset)
    if got != length:
        raise BlockingIOError(errno.EAGAIN, "part of the record is not in the page cache")
    return buffer


# What a record's checksum is the low 32 bits of (its field keeps 32): the compiled reader
# calls it as it is, no Python frame per hit.
CHECKSUM_HASH = xxh3_64_intdigest


def checksum(data: bytes | memoryview) -> int:
    """A record's checksum of ``data``, what follows its checksum field."""
    return CHECKSUM_HASH(data) & 0xFFFFFFFF


def encode(key: bytes, meta: bytes, body: bytes) -> bytes:
    """One record."""
    tail = struct.pack("<HI", len(key), len(meta)) + key + meta + body
    length = HEADER.size + len(key) + len(meta) + len(body)
    return MAGIC + struct.pack("<II", length, checksum(tail)) + tail


def decode(data: bytes | bytearray | memoryview) -> tuple[bytes, bytes, bytes] | None:
    """(key, meta, body) of the record ``data`` holds exactly; None when it is not one."""
    if len(data) < HEADER.size:
        return None
    magic, length, crc, key_length, meta_length = HEADER.unpack_from(data)
    if magic != MAGIC or length != len(data) or HEADER.size + key_length + meta_length > length:
        return None
    view = memoryview(data)  # slices of a view copy nothing; of bytes, all they hold
    if checksum(view[12:]) != crc:
        return None
    start = HEADER.size
    key = bytes(view[start : start + key_length])
    meta = bytes(view[start + key_length : start + key_length + meta_length])
    return key, meta, bytes(view[start + key_length + meta_length :])


class RegionLog:
    """The region files of one disk tier under ``directory``, placed by ``regions``."""

    def __init__(self, directory: str | Path, regions: Ring) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.regions = regions
        self._writing: tuple[int, int] | None = None  # (region, fd) of the open region
        self._reading: dict[int, int] = {}  # region: fd, oldest opened first

    @property
    def read_fds(self) -> dict[int, int]:
        """The descriptors open for reading, by region: a compiled reader may read through
        them, and never opens or closes one."""
        return self._reading

    def path(self, region: int) -> Path:
        return self.directory / f"region-{region:010d}.log"

    def append(self, key: bytes, meta: bytes, body: bytes) -> Slot | None:
        """Write one record; where it lies, or None when it cannot be written (a key longer
        than its 16-bit length field, too large for a region, or the device refused it)."""
        if len(key) > MAX_KEY:
            return None  # a variant's key holds request fields: their limit is the operator's
        record = encode(key, meta, body)
        placement = self.regions.place(len(record))
        if placement is None:
            return None
        for region in placement.evicted:
            self.remove(region)
        try:
            fd = self._fd_for(placement.region)
            # At its place, not appended: the workers of a machine reserve places in one
            # region (``SharedRegions``) and write them in whatever order they get to.
            written = os.pwrite(fd, record, placement.offset)
            if written != len(record):
                raise OSError(f"wrote {written} of {len(record)} bytes")
        except OSError as exc:
            DISK_ERRORS.warning("writing region %d failed: %r", placement.region, exc)
            self._close_writing()
            self.regions.close()
            return None
        return Slot(placement.region, placement.offset, len(record))

    def read(
        self, location: Slot, key: bytes, *, warm_only: bool = False
    ) -> tuple[bytes, bytes] | None:
        """(meta, body) of the record at ``location`` when it is whole and holds ``key``.
        ``warm_only``: BlockingIOError, nothing read, unless the page cache holds all of it
        (where the kernel can tell: ``RWF_NOWAIT``)."""
        if not self.regions.holds(location.region):
            return None
        try:
            fd = self._reader(location.region)
            if warm_only:
                data = _read_warm(fd, location.length, location.offset)
            else:
                data = os.pread(fd, location.length, location.offset)
        except BlockingIOError:
            raise
        except OSError as exc:
            self._close_reading(location.region)
            DISK_ERRORS.warning("reading region %d failed: %r", location.region, exc)
            return None
        return self._record(data, location, key)

    def read_apart(self, location: Slot, key: bytes) -> tuple[bytes, bytes] | None:
        """``read`` on a worker thread: through a descriptor of its own, so a region the loop
        evicts meanwhile neither closes it under the read nor hands its number to another
        file (a removed file stays readable through it, and its records are whole)."""
        if not self.regions.holds(location.region):
            return None
        try:
            fd = open_file(self.path(location.region), os.O_RDONLY)
            try:
                data = os.pread(fd, location.length, location.offset)
            finally:
                os.close(fd)
        except OSError as exc:
            DISK_ERRORS.warning("reading region %d failed: %r", location.region, exc)
            return None
        return self._record(data, location, key)

    def _record(self, data: bytes, location: Slot, key: bytes) -> tuple[bytes, bytes] | None:
        found = decode(data)
        if found is None or found[0] != key:
            DISK_ERRORS.warning(
                "region %d at %d: not a whole record of the key asked for", location.region,
                location.offset,
            )  # fmt: skip
            return None
        return found[1], found[2]

    def scan(self, region: int, start: int = 0) -> Iterator[tuple[bytes, Slot]]:
        """Every whole record of ``region``'s file from ``start``, in order, up to the first
        that is not."""
        try:
            with os.fdopen(open_file(self.path(region), os.O_RDONLY), "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError as exc:
            DISK_ERRORS.warning("scanning region %d failed: %r", region, exc)
            return
        offset = 0
        while offset + HEADER.size <= len(data):
            length = HEADER.unpack_from(data, offset)[1]
            found = decode(memoryview(data)[offset : offset + length]) if length else None
            if found is None:
                return
            yield found[0], Slot(region, start + offset, length)
            offset += length

    def regions_found(self) -> list[int]:
        """The region files present, oldest first; those past the ring's size (the oldest)
        are removed."""
        found = sorted(
            int(m.group(1))
            for p in self.directory.iterdir()
            if (m := _FILE.fullmatch(p.name)) and self._regular(p)
        )
        for region in found[: max(0, len(found) - self.regions.regions)]:
            self.remove(region)
        return found[-self.regions.regions :]

    def _regular(self, path: Path) -> bool:
        """Whether ``path`` is a regular file; anything else in a region file's place (a link
        planted there) is removed, never followed."""
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                return True
            DISK_ERRORS.warning("%s is not a regular file: removed, not followed", path.name)
            path.unlink()
        except OSError as exc:
            DISK_ERRORS.warning("checking %s failed: %r", path.name, exc)
        return False

    def recover(self, after: tuple[int, int] | None = None) -> list[tuple[bytes, Slot]]:
        """The records of the region files found, oldest region first, or only those from
        ``after`` (region, offset: what a checkpoint does not hold) on; each region scanned is
        cut back to its last whole record, and the ring takes up where the last one ends."""
        return list(self._recovered(after))

    def _recovered(self, after: tuple[int, int] | None) -> Iterator[tuple[bytes, Slot]]:
        found = self.regions_found()
        fill = 0
        for region in found:
            start = 0
            if after is not None and region <= after[0]:
                start = after[1] if region == after[0] else self.size(region)
            end = start
            for key, location in self.scan(region, start):
                end = location.offset + location.length
                yield key, location
            fill = end
            self._cut(region, end)
        self.regions.resume(found, fill)

    def size(self, region: int) -> int:
        """Bytes in ``region``'s file (0 when there is none), never through a link."""
        try:
            return os.lstat(self.path(region)).st_size
        except OSError:
            return 0

    def sync(self, regions: Iterable[int]) -> None:
        """The bytes of ``regions``' files to the device (before a checkpoint claims them),
        whichever process wrote them."""
        for region in regions:
            try:
                fd = open_file(self.path(region), os.O_RDONLY)
            except FileNotFoundError:
                continue  # none was written there: nothing to sync
            except OSError as exc:
                DISK_ERRORS.warning("syncing region %d failed: %r", region, exc)
                continue
            try:
                os.fsync(fd)
            except OSError as exc:
                DISK_ERRORS.warning("syncing region %d failed: %r", region, exc)
            finally:
                os.close(fd)

    def _cut(self, region: int, end: int) -> None:
        """Drop what follows the last whole record of ``region`` (a write the crash tore)."""
        try:
            fd = open_file(self.path(region), os.O_WRONLY)
            try:
                if os.fstat(fd).st_size > end:
                    os.ftruncate(fd, end)
            finally:
                os.close(fd)
        except OSError as exc:
            DISK_ERRORS.warning("cutting region %d back failed: %r", region, exc)

    def _fd_for(self, region: int) -> int:
        writing = self._writing
        if writing is not None and writing[0] == region:
            return writing[1]
        self._close_writing()
        fd = open_file(self.path(region), os.O_WRONLY | os.O_CREAT)
        self._writing = (region, fd)
        return fd

    def _reader(self, region: int) -> int:
        """A descriptor open for reading ``region``'s file; OSError when the file was removed
        by hand since (its records are then misses at once, as a restart would see them)."""
        fd = self._reading.get(region)
        if fd is None:
            if len(self._reading) >= READ_FDS:
                self._close_reading(next(iter(self._reading)))
            fd = open_file(self.path(region), os.O_RDONLY)
            self._reading[region] = fd
        if os.fstat(fd).st_nlink == 0:
            raise FileNotFoundError(f"region {region}'s file was removed")
        return fd

    def _close_reading(self, region: int) -> None:
        fd = self._reading.pop(region, None)
        if fd is not None:
            os.close(fd)

    def _close_writing(self) -> None:
        if self._writing is not None:
            os.close(self._writing[1])
            self._writing = None

    def remove(self, region: int) -> None:
        """Remove ``region``'s file (its records are misses from now on); closed first."""
        if self._writing is not None and self._writing[0] == region:
            self._close_writing()
        self._close_reading(region)
        try:
            self.path(region).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            DISK_ERRORS.warning("removing region %d failed: %r", region, exc)

    def close(self) -> None:
        self._close_writing()
        for region in list(self._reading):
            self._close_reading(region)
