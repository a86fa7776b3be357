"""Reading a record back, verified, as an entry the engine judges by its own rules.

* A record is found through the tier's index (``DiskTier.find``: a record a ban by prefix
  purges is dropped there), read whole and checked (``RegionLog.read``): one torn, damaged
  or misplaced is a miss, dropped from the index, never a wrong body; one a ban by tag purges
  is dropped as it is read.
* ``lookup`` reads on the event loop; ``lookup_off_loop`` only a record no longer than
  ``READ_INLINE`` that the page cache holds, else on a worker thread, and one moved, purged
  or evicted while the thread read it is a miss.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.core._native import DiskIndex, SharedIndex
from proxy.core.disk import DiskTier, Slot
from proxy.core.store import Entry
from proxy.core.tags import response_tags
from proxy.disk.record_meta import decode_meta, record_entry
from proxy.disk.region_log import RegionLog
from proxy.disk.sharing import FollowingIndex

# A record up to this long is read on the event loop when the page cache holds all of it
# (``RegionLog.read(warm_only=True)``): a copy of at most ~100 us. A longer one, or one the
# device must be asked for, is read on a worker thread by the request handler, so that neither
# a large copy nor a slow device holds up the other connections. A 1 MiB body with its key and
# meta (a slice of the usual size) is within it.
READ_INLINE = (1 << 20) + (16 << 10)


@dataclass(frozen=True, slots=True)
class ColdRecord:
    """The record of a URL that the compiled reader found at ``slot`` and the page cache did
    not hold: the handler reads it from there, off the event loop (or on it, when the kernel
    has read it ahead since), without looking it up first; the index is asked after the
    read whether it still lies there (one purged, written again or evicted since is a
    miss)."""

    key: str
    slot: Slot


def cold_record(key: str, region: int, offset: int, length: int) -> ColdRecord:
    """A ``ColdRecord``, as the compiled reader hands one over."""
    return ColdRecord(key, Slot(region, offset, length))


def raw(key: str) -> bytes:
    """A key as records hold it: its text as written, whatever it holds."""
    return key.encode("utf-8", "surrogateescape")


def text(key: bytes) -> str:
    """A record's key (``raw``) as the index and the engine name it."""
    return key.decode("utf-8", "surrogateescape")


class RecordReader:
    """The records of ``tier`` in ``log``, read back as entries by a proxy whose heads are
    rendered under ``stamp`` (``record_meta.record_stamp``)."""

    def __init__(self, tier: DiskTier, log: RegionLog, stamp: int) -> None:
        self.tier = tier
        self.log = log
        self.stamp = stamp

    @property
    def index(self) -> DiskIndex | SharedIndex | FollowingIndex:
        """The index the compiled disk reader asks (``get``): a worker's first brings in the
        bans the others saved, as ``DiskTier.find`` does."""
        if self.tier.follow_bans is None:
            return self.tier.index
        return FollowingIndex(self.tier.index, self.tier.follow_bans)

    def lookup(self, key: str, entry_type: type[Entry], *, warm_only: bool = False) -> Entry | None:
        """The entry ``key``'s record holds, read back whole on the event loop, or None: no
        record, (``warm_only``) one the page cache does not hold all of (left unread), or
        one not whole (dropped). The caller counts whether it answered
        (``DiskTier.answered``)."""
        slot = self.tier.find(key)
        if slot is None:
            return None
        try:
            found = self.log.read(slot, raw(key), warm_only=warm_only)
        except BlockingIOError:
            return None
        return self._entry(key, slot, found, entry_type)

    def lookup_warm(self, key: str, entry_type: type[Entry]) -> Entry | ColdRecord | None:
        """``lookup`` of a record the page cache holds, read on the event loop: its entry;
        where it lies (``ColdRecord``) when it is longer than ``READ_INLINE`` or the page
        cache does not hold all of it, for a read off the loop that need not look it up
        again; None when there is no record, or one not whole (dropped)."""
        slot = self.tier.find(key)
        return None if slot is None else self._on_loop(key, slot, entry_type)

    def _on_loop(self, key: str, slot: Slot, entry_type: type[Entry]) -> Entry | ColdRecord | None:
        """The record at ``slot`` read on the event loop when it is no longer than
        ``READ_INLINE`` and the page cache holds all of it (``_entry``'s verdict), else
        ``ColdRecord``: left for a read off the loop."""
        if slot.length > READ_INLINE:
            return ColdRecord(key, slot)
        try:
            found = self.log.read(slot, raw(key), warm_only=True)
        except BlockingIOError:
            return ColdRecord(key, slot)
        return self._entry(key, slot, found, entry_type)

    async def lookup_off_loop(
        self,
        key: str,
        entry_type: type[Entry],
        slot: Slot | None = None,
        *,
        found_before: bool = False,
    ) -> Entry | None:
        """``lookup``, read on the event loop only when the record is no longer than
        ``READ_INLINE`` and the page cache holds it, else on a worker thread; one moved,
        purged or evicted while the thread read it is a miss. ``slot``: where the index
        said the record lies, when the caller has just asked it (not asked again); or, with
        ``found_before``, on an earlier turn of the loop (``ColdRecord``), when a purge, a
        write or another worker may have moved it since: the index is asked after the read
        whichever way it went."""
        slot = self.tier.find(key) if slot is None else slot
        if slot is None:
            return None
        inline = self._on_loop(key, slot, entry_type)
        if type(inline) is not ColdRecord:
            if found_before and self.tier.find(key) != slot:
                return None
            return inline
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, self.log.read_apart, slot, raw(key))
        if self.tier.find(key) != slot:
            return None
        return self._entry(key, slot, found, entry_type)

    def _entry(
        self, key: str, slot: Slot, found: tuple[bytes, bytes] | None, entry_type: type[Entry]
    ) -> Entry | None:
        """The entry of a record read at ``slot``, or None: not whole (dropped), or purged by
        a ban by tag (dropped, counted ``purged``)."""
        if found is None:
            self.tier.drop(key, at=slot)
            return None
        meta, body = found
        m = decode_meta(meta, self.stamp)
        if self.tier.bans and self.tier.tag_banned(response_tags(m.headers), slot):
            self.tier.drop(key, purged=True, at=slot)
            return None
        return record_entry(key, m, body, entry_type)
