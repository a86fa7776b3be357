"""The disk tier's removals, kept on the device: the journal of records dropped since the last
checkpoint (``drops.log``) and the bans of purges by prefix or tag (``bans.json``).

What it guarantees:

* A record dropped (invalidated, superseded, purged by URL) is journaled before the drop
  returns, as its key's hash and where it lay; a start after a crash drops it again where the
  index still holds it there (a record written after the drop, elsewhere, stays). The journal
  is emptied once a checkpoint holds every drop.
* The journal is appended to whole entries only: opened, it is cut back to whole entries (a
  crash or a failed write may leave part of one, which would shift every entry after it).
* ``durable`` puts the journal and the bans on the device; when the device refuses, the
  regions the lost removals could reach are removed instead (a record is read only from its
  region's file), and ``durable`` says so. A restart then finds none of it either way.
* A journal or bans file that cannot be read may hide purges: every record written so far is
  purged.
* The workers of one machine share one tier (``--workers``): each journals its own drops and
  keeps its bans in files of its own (``worker``: ``drops-1.log``, ``bans-1.json``), and
  empties its journal once a checkpoint begun after its last drop is written (``covered``).
  Whatever process opens the directory next, one process or a parent of workers, takes up
  every worker's files (``restore``), and gives them up once a checkpoint holds them
  (``take_over``). A tier that lives no longer than its processes (in ``/dev/shm``) journals
  no drops (``keeps_drops``), and keeps its bans, which a worker started later must know.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

from proxy.core._native import hash64
from proxy.core.disk import MAX_BANS, Ban, DiskTier, Slot
from proxy.disk.directory import open_file, read_file, replace_file, sync_directory
from proxy.disk.region_log import DISK_ERRORS, RegionLog

BANS = "bans.json"
# Records invalidated since the last checkpoint, which a start after a crash drops again.
DROPS = "drops.log"
_DROP = struct.Struct("<QII")  # the key's hash, the record's region and offset
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def replaced(path: Path, data: bytes, what: str) -> bool:
    """``directory.replace_file``, or (with one log line, False) ``path`` holds what it held
    before: a file of the tier (``what``) written whole or not at all."""
    try:
        replace_file(path, data)
    except OSError as exc:
        DISK_ERRORS.warning("writing %s failed: %r", what, exc)
        return False
    return True


class Journal:
    """The removals of the disk tier under ``directory`` (its index ``tier``, its files
    ``log``), kept on the device."""

    def __init__(
        self,
        directory: Path,
        tier: DiskTier,
        log: RegionLog,
        worker: int | None = None,
        begun: Callable[[], int] = lambda: 0,
        keeps_drops: bool = True,
    ) -> None:
        self.tier = tier
        self.log = log
        self.directory = directory
        self.drops_path = directory / _named(DROPS, worker)
        self.bans_path = directory / _named(BANS, worker)
        self.keeps_drops = keeps_drops
        # The checkpoints begun when the last drop was journaled (``covered``); at first, when
        # this journal opened: a worker that replaces one takes up its file, whose drops only
        # a checkpoint begun from now on holds.
        self._begun = begun
        self._mark = begun()
        self._drops: int | None = None  # the journal's descriptor, opened at its first drop
        self._unsynced: set[int] = set()  # regions of drops journaled since the last sync
        self._bans_saved = True
        self._kept = True  # False once a removal the device refused lost regions instead

    def restore(self) -> int:
        """At start-up, from this journal's files and every worker's: the bans back in the
        tier (a purge each worker kept, once: ``bans_of_all``), the drops made again; how
        many."""
        self.tier.bans.clear()
        self.bans_of_all()
        return sum(self._drop_again(path) for path in self._files(DROPS))

    def others(self) -> list[Path]:
        """The files of the other processes that journaled here (workers of a parent)."""
        return [path for path in [*self._files(DROPS), *self._files(BANS)]
                if path not in (self.drops_path, self.bans_path)]  # fmt: skip

    def take_over(self) -> None:
        """After ``restore``, and a checkpoint that holds every drop, with no worker running:
        every file's bans in this journal's file alone, every other file removed."""
        self.bans_of_all()
        if not self.save_bans():
            return
        for path in self.others():
            path.unlink(missing_ok=True)
        self.checkpointed()

    def bans_of_all(self) -> None:
        """The bans every worker and the loader saved, with the tier's own, in the tier: of
        a purge each worker kept, the one that reaches furthest (the last place)."""
        furthest: dict[tuple[str, bool], Ban] = {}
        for saved in [self.tier.bans, *(self._saved_bans(p) for p in self._files(BANS))]:
            for ban in saved:
                value, region, offset, by_tag = ban
                kept = furthest.get((value, by_tag))
                if kept is None or (kept[1], kept[2]) < (region, offset):
                    furthest[(value, by_tag)] = ban
        bans = sorted(furthest.values(), key=lambda ban: (ban[1], ban[2]))
        self.tier.bans[:] = bans if len(bans) <= MAX_BANS else self._everything()
        self.tier.expire_bans()

    def _files(self, name: str) -> list[Path]:
        """This tier's files of kind ``name`` (``drops.log``, ``bans.json``): the loader's and
        every worker's."""
        stem, suffix = name.split(".")
        return sorted(
            p
            for p in self.directory.iterdir()
            if p.name == name or (p.name.startswith(f"{stem}-") and p.name.endswith(f".{suffix}")
                                  and p.name[len(stem) + 1 : -len(suffix) - 1].isdigit())
        )  # fmt: skip

    def dropped(self, key: str, slot: Slot) -> None:
        """Journal the drop of ``key``'s record, which lay at ``slot``; one the journal cannot
        take loses the record's region."""
        if not self.keeps_drops:
            return
        entry = _DROP.pack(hash64(key)[0], slot.region, slot.offset)
        try:
            if self._drops is None:
                self._drops = self._open()
            if os.write(self._drops, entry) != len(entry):
                raise OSError("the journal took part of a drop")
            self._mark = self._begun()
        except OSError as exc:
            DISK_ERRORS.warning("journaling a dropped record failed: %r", exc)
            self.lose([slot.region], "a dropped record")
            self.close()  # reopened whole: a torn entry would shift every later one
            return
        self._unsynced.add(slot.region)

    def banned(self, *, now: bool = False) -> None:
        """The tier took a ban: saved by the next ``durable`` or checkpoint, or (``now``: a
        worker's, which the others read) at once, and again by ``durable`` only if the device
        refused it."""
        self._bans_saved = now and self.save_bans()

    def durable(self) -> bool:
        """Put the bans and the journal on the device. When it refuses, drop what the lost
        removals could reach instead (the regions that held the dropped records; every
        region, for a ban, which may reach any record written before it): False."""
        if not self._bans_saved:
            if not self.save_bans():
                self.lose(list(self.tier.regions.live), "a purge's ban")
            self._bans_saved = True
        if self._unsynced:
            try:
                if self._drops is not None:
                    os.fsync(self._drops)
            except OSError as exc:
                DISK_ERRORS.warning("syncing the journal of dropped records failed: %r", exc)
                self.lose(sorted(self._unsynced), "dropped records")
            self._unsynced.clear()
        kept, self._kept = self._kept, True
        return kept

    def save_bans(self) -> bool:
        """Replace the bans file with the tier's bans; whether the device took it."""
        return replaced(self.bans_path, json.dumps(self.tier.bans).encode(), "the disk tier's bans")

    def covered(self, done: int) -> None:
        """Checkpoint ``done`` is written: the journal starts again when it began after the
        last drop was journaled (so it holds every drop)."""
        if done > self._mark:
            self.checkpointed()

    def checkpointed(self) -> None:
        """The checkpoint just written holds every drop: the journal starts again."""
        try:
            if self._drops is not None:
                os.ftruncate(self._drops, 0)
            elif self.drops_path.exists():
                self.drops_path.unlink()
        except OSError as exc:
            DISK_ERRORS.warning("emptying the journal of dropped records failed: %r", exc)

    def lose(self, regions: list[int], what: str) -> None:
        """Remove ``regions``' files, whose records a removal the device could not keep
        (``what``) may reach: their records are misses from now on, and after any restart."""
        DISK_ERRORS.warning("the device could not keep %s: %d regions dropped", what,
                            len(regions))  # fmt: skip
        self._kept = False
        live = self.tier.regions
        for region in regions:
            self.log.remove(region)
            if live.live and region == live.live[-1]:
                live.close()

    def close(self) -> None:
        """Close the journal's descriptor (the next drop opens it again)."""
        if self._drops is not None:
            fd, self._drops = self._drops, None
            try:
                os.close(fd)
            except OSError as exc:
                DISK_ERRORS.warning("closing the journal of dropped records failed: %r", exc)

    def _open(self) -> int:
        """The journal, opened for appending, cut back to whole entries."""
        fd = open_file(self.drops_path, _CREATE)
        try:
            size = os.fstat(fd).st_size
            if size % _DROP.size:
                os.ftruncate(fd, size - size % _DROP.size)
            sync_directory(self.drops_path.parent)  # syncing its drops keeps a file that is there
        except OSError:
            os.close(fd)
            raise
        return fd

    def _saved_bans(self, path: Path) -> list[Ban]:
        try:
            saved = json.loads(read_file(path))
            return [(str(value), int(region), int(offset), bool(by_tag))
                    for value, region, offset, by_tag in saved]  # fmt: skip
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            DISK_ERRORS.warning("reading the disk tier's bans failed, purging all: %r", exc)
            return self._everything()

    def _everything(self) -> list[Ban]:
        """A ban of every record written so far (none where nothing was)."""
        live = self.tier.regions.live
        return [("", live[-1], self.tier.regions.fill, False)] if live else []

    def _drop_again(self, path: Path) -> int:
        try:
            data = read_file(path)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            DISK_ERRORS.warning("reading the journal of dropped records failed, purging all: %r",
                                exc)  # fmt: skip
            self.tier.bans.extend(self._everything())
            self.save_bans()
            return 0
        whole = len(data) - len(data) % _DROP.size  # a write torn by the crash is no drop
        return sum(self.tier.forget_at(*entry) for entry in _DROP.iter_unpack(data[:whole]))


def _named(name: str, worker: int | None) -> str:
    """A journal file's name (``drops.log``), a worker's (``drops-1.log``)."""
    if worker is None:
        return name
    stem, suffix = name.split(".")
    return f"{stem}-{worker}.{suffix}"
