"""What keeps a disk tier across restarts: its directory, claimed; its region files
(``RegionLog``); the checkpoint of its index; the journal of its drops and its bans.

* The index is checkpointed (``checkpoint``: every ``[disk] checkpoint_interval`` and on a
  clean stop) after the regions' bytes reached the device (the file's rules are in
  ``proxy.disk.checkpoint``). At start-up the checkpoint's slots go back into the index, and
  only the records written after it are scanned (``RegionLog.recover``); without a
  checkpoint, or with one that does not describe the files, every region is scanned.
* The workers of one machine share one tier (``Sharing``): the parent is its loader and
  keeper (``worker`` None): it claims the directory, takes up what it holds (every worker's
  journal and bans too), and writes the checkpoints; each worker journals its own drops and
  bans, follows the others' bans, and writes no checkpoint.
* Writes are counted as the store appends them (``bytes_written``) and as the kernel counts
  the process's writes to storage (``write_bytes`` of ``/proc/self/io``, where it exists),
  in total and per second over the last checkpoint interval (``rates``).
"""

from __future__ import annotations

import time
from pathlib import Path

from proxy.config.settings import DiskSection
from proxy.core._native import SharedIndex
from proxy.core.disk import DiskTier, index_key, slots
from proxy.disk.checkpoint import CHECKPOINT, read_checkpoint, write_checkpoint
from proxy.disk.directory import claim, release
from proxy.disk.journal import Journal
from proxy.disk.reads import text
from proxy.disk.region_log import RegionLog


class Keeping:
    """The directory ``section.path`` keeping ``tier`` (its index ``shared`` among the
    workers of a machine, or None), taken up at construction: recovered by the process that
    loads the tier, joined by a worker (``worker``: its number). ``follows_memory``: the tier
    stands for the memory tier, and keeps no journal of drops."""

    def __init__(
        self,
        section: DiskSection,
        tier: DiskTier,
        shared: SharedIndex | None,
        worker: int | None,
        follows_memory: bool,
    ) -> None:
        self.tier = tier
        self.shared = shared
        self.worker = worker is not None
        self.follows_memory = follows_memory
        # (when, the store's bytes written, the process's write_bytes) at the last two
        # checkpoints: the rates /stats gives.
        self._samples = [self._sample(), self._sample()]
        # The open region at the last checkpoint: it and those after it are synced at the next.
        self._synced_from = 0
        # A worker's parent holds the directory for the machine.
        self._lock: int | None = None if self.worker else claim(Path(section.path))
        try:
            if worker is not None:
                self._join(section, worker)
            else:
                self._recover(section)
        except BaseException:
            if self._lock is not None:
                release(self._lock)  # a start that fails leaves the directory to the next
            raise

    @property
    def claim(self) -> int | None:
        """The descriptor of this process's claim on the directory (``directory.claim``; None:
        a worker's, its parent claims it). A parent hands it to its workers: the directory
        stays claimed until the last of them exits, however the parent ended."""
        return self._lock

    def _recover(self, section: DiskSection) -> None:
        """Take up what the directory holds: the checkpoint's index, the records written
        after it, the bans, the journal of drops."""
        self.log = RegionLog(section.path, self.tier.regions)
        self.checkpoint_path = Path(section.path) / CHECKPOINT
        saved = read_checkpoint(self.checkpoint_path, self.log)
        after = None if saved is None else (saved[0], saved[1])
        scanned = self.log.recover(after)
        self.from_checkpoint = 0 if saved is None else self.tier.restore_slots(saved[2])
        for key, location in scanned:
            self.tier.restore(text(key), location.region, location.offset, location.length)
        self.scanned = len(scanned)
        self.journal = Journal(Path(section.path), self.tier, self.log,
                               keeps_drops=not self.follows_memory)  # fmt: skip
        self.dropped_again = self.journal.restore()
        # Workers journaled here (this start's or the last's): their drops and bans are
        # held by a checkpoint and this journal's bans alone before any worker starts.
        if self.journal.others() and self.checkpoint():
            self.journal.take_over()

    def _join(self, section: DiskSection, worker: int) -> None:
        """A worker's start: the tier its parent loaded, with every worker's bans."""
        index = self.shared
        assert index is not None
        self.log = RegionLog(section.path, self.tier.regions)
        self.checkpoint_path = Path(section.path) / CHECKPOINT
        self.from_checkpoint = self.scanned = self.dropped_again = 0
        self.journal = Journal(Path(section.path), self.tier, self.log, worker,
                               begun=lambda: index.checkpoints_begun,
                               keeps_drops=not self.follows_memory)  # fmt: skip
        # Read before the files: a ban saved meanwhile moves it, and is read at the next find.
        self._bans_seen = index.bans_saved
        self.journal.bans_of_all()
        self.tier.follow_bans = self._follow_bans

    def _follow_bans(self) -> None:
        """The bans another worker saved since this one last read them (a purge that went
        round while this worker was starting, say), read from their files."""
        assert self.shared is not None
        saved = self.shared.bans_saved
        if saved != self._bans_seen:
            self._bans_seen = saved
            self.journal.bans_of_all()

    def banned(self) -> None:
        """A ban was kept (``DiskTier.ban``): journaled, and by a worker of a shared tier saved
        at once and said to the others (``_follow_bans``)."""
        self.journal.banned(now=self.worker)
        if self.worker:
            assert self.shared is not None
            saved = self.shared.banned()
            # Its own ban is no news to this worker: it reads the files again only for a ban
            # another saved (``_follow_bans``), not at every purge that goes round.
            if saved == self._bans_seen + 1:
                self._bans_seen = saved

    def checkpoint(self) -> bool:
        """Write the index and where the open region ends, replacing the last checkpoint;
        and the bans still outstanding. Whether a checkpoint was written. A worker of a
        shared tier writes its bans only, and empties its journal once a checkpoint its
        parent wrote holds its drops."""
        self._samples = [self._samples[-1], self._sample()]
        self.journal.save_bans()
        if self.worker:
            assert self.shared is not None
            self.journal.covered(self.shared.checkpoints_done)
            return False
        index, shared = self.tier.index, self.shared
        regions = self.tier.regions
        if not regions.live:
            return False
        begun = 0 if shared is None else shared.checkpoint_begin()
        # Read before the records are synced: records placed after it are scanned at a start.
        open_region, fill = regions.live[-1], regions.fill
        self.log.sync(range(max(self._synced_from, regions.live[0]), open_region + 1))
        if not write_checkpoint(self.checkpoint_path, open_region, fill, index.dump()):
            return False
        self._synced_from = open_region
        self.journal.checkpointed()
        if shared is not None:
            shared.checkpoint_end(begun)
        return True

    def agrees_with_files(self) -> tuple[bool, int]:
        """Whether every record the index holds is a whole record of its key where the index
        says (a scan of the live region files finds it there), and how many it holds: what a
        start after a crash or a worker's kill must leave."""
        found = {}
        for region in self.tier.regions.live:
            for key, slot in self.log.scan(region):
                found[slot] = index_key(text(key))
        held = slots(self.tier.index.dump())
        return all(found.get(slot) == key for key, slot in held), len(held)

    def _sample(self) -> tuple[float, int, int | None]:
        return time.monotonic(), self.tier.counters.bytes_written, process_write_bytes()

    def rates(self) -> dict[str, int | float | None]:
        """The bytes written a second, by the store and by the process, over the last
        checkpoint interval, and the process's bytes written in all."""
        (t0, b0, w0), (t1, b1, w1) = self._samples
        span = t1 - t0
        return {
            "bytes_written_per_second": round((b1 - b0) / span, 1) if span > 0 else None,
            "process_write_bytes": process_write_bytes(),
            "process_write_bytes_per_second": (
                round((w1 - w0) / span, 1)
                if span > 0 and w0 is not None and w1 is not None
                else None
            ),
        }

    def close(self) -> None:
        """Checkpoint (a worker of a shared tier: its bans), then close the open region and
        the journal, and give the directory up. The parent of workers, closing once they
        all stopped, takes their journals over: its checkpoint holds what they dropped."""
        if self.checkpoint() and self._lock is not None:
            self.journal.take_over()
        self.log.close()
        self.journal.close()
        if self._lock is not None:
            release(self._lock)
            self._lock = None


def process_write_bytes() -> int | None:
    """Bytes this process caused to be written to storage (Linux's ``/proc/self/io``), or None
    where that is not kept."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"write_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
