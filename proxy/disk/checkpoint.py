"""The disk index's checkpoint file: the index's slots and where the open region ended, written
whole or not at all, and read back only when it describes the region files.

What it guarantees:

* ``write_checkpoint`` replaces the file (``journal.replaced``: a new file, synced, renamed over the
  last), so a crash leaves the old checkpoint or the new one whole, never a mix.
* ``read_checkpoint`` gives (open region, where it ended, slots) only when the magic, the count of
  slots and their checksum hold, and the open region's file is at least as long as the
  checkpoint says (a file cut shorter since, by a crash before its bytes reached the device,
  is scanned instead). Otherwise None, with one log line: the caller scans every region.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from proxy.disk.directory import read_file
from proxy.disk.journal import replaced
from proxy.disk.region_log import DISK_ERRORS, RegionLog

CHECKPOINT = "index.checkpoint"
_MAGIC = b"OHC1"
# magic, the open region, where it ended, slots, crc32 of the slots
_HEAD = struct.Struct("<4sQQQI")


def write_checkpoint(path: Path, open_region: int, fill: int, slots: bytes) -> bool:
    """Replace the checkpoint at ``path`` with ``slots`` (an index's ``dump``) and where the
    open region ended; whether the device took it."""
    head = _HEAD.pack(_MAGIC, open_region, fill, len(slots) // 20, zlib.crc32(slots))
    return replaced(path, head + slots, "the disk index's checkpoint")


def read_checkpoint(path: Path, log: RegionLog) -> tuple[int, int, bytes] | None:
    """(open region, where it ended, slots) of the checkpoint at ``path``, when it describes
    ``log``'s files; None when there is none, or one not to be trusted."""
    try:
        data = read_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        DISK_ERRORS.warning("reading the disk index's checkpoint failed: %r", exc)
        return None
    if len(data) < _HEAD.size:
        return None
    magic, region, fill, count, crc = _HEAD.unpack_from(data)
    slots = data[_HEAD.size :]
    if magic != _MAGIC or len(slots) != 20 * count or zlib.crc32(slots) != crc:
        DISK_ERRORS.warning("the disk index's checkpoint is not whole: every region is scanned")
        return None
    if os.path.lexists(log.path(region)) and log.size(region) < fill:
        DISK_ERRORS.warning("the disk index's checkpoint is past its region's end: scanning")
        return None
    return region, fill, slots
