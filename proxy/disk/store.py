"""The live disk tier: the core's ``DiskTier`` over region files (``RegionLog``), behind the
memory tier, keeping what it took across restarts.

* A response reaches the disk only when the tier's own admission says so at its head
  (``takes``), and only once its body ended whole (``put``): a record of its key, its body
  and its meta (``proxy.disk.record_meta``: times, the head its plain hits write, fields,
  directives) appended at the end of the open region.
* On a memory miss, ``lookup`` reads the key's record back, verified (a torn, damaged or
  misplaced record is a miss, dropped from the index, never a wrong body), as an entry the
  engine judges by its own freshness rules.
* The index is checkpointed (``checkpoint``: every ``[disk] checkpoint_interval`` and on a
  clean stop) after the regions' bytes reached the device (the file's rules are in
  ``proxy.disk.checkpoint``). At start-up the checkpoint's slots go back into the index, and
  only the records written after it are scanned (``RegionLog.recover``); without a checkpoint,
  or with one that does not describe the files, every region is scanned.
* Writes are counted as the store appends them (``bytes_written``) and as the kernel counts
  the process's writes to storage (``write_bytes`` of ``/proc/self/io``, where it exists),
  in total and per second over the last checkpoint interval.
* Slices of large objects (``proxy.handler.slicing``) are records of their own under their slice
  keys, written after an anchor record of their object (``write_slice``): a purge of the URL,
  or a change of the object's version, drops or replaces the anchor, and no slice written
  before the anchor on disk is found again (``anchored``).
* A response that varies (``Vary``) is a record under its variant key, written after an
  anchor record naming the fields its URL's variants are selected on (``write_variant``); a
  lookup reads the anchor to know which variant a request selects (``lookup_request``). A
  purge of the URL drops the anchor, other fields write a new one, and no variant written
  before the anchor on disk is found again.
* The workers of one machine share one tier (``Sharing``): its index, its ring and its
  admission window in memory the parent maps too. The parent is the tier's loader and keeper
  (``Sharing.worker`` None): it claims the directory, takes up what it holds (every worker's
  journal and bans too), and writes the checkpoints; each worker reads, writes and forgets
  records itself, journaling its own drops, and writes no checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from cachetools import LRUCache

from proxy.config.settings import DiskSection
from proxy.core import rfc9111, slices, variants
from proxy.core._native import DiskIndex, SharedIndex
from proxy.core.admission import AdmissionConfig
from proxy.core.disk import (
    RECORD_HEADER,
    DiskTier,
    Slot,
    WriteBudget,
    index_key,
    record_key,
    slots,
)
from proxy.core.events import RequestMeta, ResponseMeta
from proxy.core.keys import url_of, whole_url
from proxy.core.regions import Regions, SharedRegions
from proxy.core.rfc9110 import Headers
from proxy.core.store import Entry
from proxy.core.tags import response_tags
from proxy.core.tiers import PURGE, forgotten_keys
from proxy.disk.checkpoint import CHECKPOINT, read_checkpoint, write_checkpoint
from proxy.disk.directory import claim, release
from proxy.disk.journal import Journal
from proxy.disk.record_meta import decode_meta, encode_meta, record_entry, record_stamp
from proxy.disk.region_log import RegionLog
from proxy.disk.sharing import FollowingIndex, Sharing

# A record up to this long is read on the event loop when the page cache holds all of it
# (``RegionLog.read(warm_only=True)``): a copy of at most ~100 us. A longer one, or one the
# device must be asked for, is read on a worker thread by the request handler, so that neither
# a large copy nor a slow device holds up the other connections. A 1 MiB body with its key and
# meta (a slice of the usual size) is within it.
log = logging.getLogger("onehit.disk")

READ_INLINE = (1 << 20) + (16 << 10)
# URLs whose variants written since their anchor are counted (``DiskStore.write_variant``).
VARIANT_COUNTS = 4096
# The file that keeps the rules the records were keyed by (``DiskStore.key_rules``).
KEY_RULES = "key-rules"


class DiskStore:
    """One disk tier under ``section.path``; ``sharing``: the part this process takes in a
    tier the workers of its machine share."""

    def __init__(
        self,
        section: DiskSection,
        hidden: frozenset[str] = frozenset(),
        sharing: Sharing | None = None,
    ) -> None:
        # Stored heads are rendered hiding these fields, under this stamp (``record_meta``).
        self.hidden = hidden
        self.stamp = record_stamp(hidden)
        self.sharing = sharing
        count = section.size // section.region_size
        admission = AdmissionConfig(policy=section.policy, window=section.window)
        budget = WriteBudget(section.max_write_rate)
        # The index the workers of a machine share (None: the process's own), and whether
        # this process is one of them (else it loads the tier, and writes its checkpoints).
        self.shared: SharedIndex | None = None
        self.worker = sharing is not None and sharing.worker is not None
        if sharing is None:
            self.tier = DiskTier(Regions(section.region_size, count), admission, budget=budget)
        else:
            self.shared = SharedIndex(sharing.index, count, section.region_size)
            ring = SharedRegions(self.shared, section.region_size, count)
            self.tier = DiskTier(ring, admission, budget=budget, index=self.shared,
                                 admission_memory=sharing.window)  # fmt: skip
        # ``proxy.core.tiers.Tier.answered``: the tier's own count of lookups, hit or miss;
        # ``served``: what its admission sees of a hit.
        self.answered = self.tier.answered
        self.served = self.tier.served
        self.follows_memory = sharing is not None and sharing.follows_memory
        # Called with each key a worker of a shared tier forgets (``forget``), to tell the
        # other workers: set by the service as it starts (``Service.start``).
        self.forgotten: Callable[[str], None] | None = None
        # Variants kept per URL, as in memory (``[cache] max_variants``; set by the service),
        # and how many each URL's anchor has had written after it, for the URLs written last.
        self.max_variants = 32
        self._variants_written: LRUCache[str, int] = LRUCache(VARIANT_COUNTS)
        # (when, the store's bytes written, the process's write_bytes) at the last two
        # checkpoints: the rates /stats gives.
        self._samples = [self._sample(), self._sample()]
        # The open region at the last checkpoint: it and those after it are synced at the next.
        self._synced_from = 0
        # A worker's parent holds the directory for the machine.
        self._lock: int | None = None if self.worker else claim(Path(section.path))
        try:
            if self.worker:
                self._join(section, sharing.worker)  # type: ignore[union-attr]
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
            self.tier.restore(_text(key), location.region, location.offset, location.length)
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

    @property
    def reader_index(self) -> DiskIndex | SharedIndex | FollowingIndex:
        """The index the compiled disk reader asks (``get``): a worker's first brings in the
        bans the others saved, as ``DiskTier.find`` does."""
        if self.tier.follow_bans is None:
            return self.tier.index
        return FollowingIndex(self.tier.index, self.tier.follow_bans)

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

    def takes(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        kept: bool,
        now: float,
    ) -> bool:
        """``proxy.core.tiers.Tier.takes``: a GET of any status memory stores (a variant is
        written by ``write_variant``) or a slice's 206 under its slice key (``write_slice``),
        when the tier's admission takes it, which counts the sighting of what would be
        written: the URL, or the variant the request selects (so each variant is asked for
        as often as a URL is before the device takes it, and a client cycling a varied
        field's values writes nothing). A tier that stands for the memory tier
        (``follows_memory``) takes only what memory keeps (``kept``)."""
        part = response.status == 206
        if (
            request.method != "GET"
            or (part and response.vary)
            or (self.follows_memory and not kept)
        ):
            return False
        size = length or 0
        key = record_key(request, response)
        return self.tier.admit(key, size, self.record_length(key, response, size), now)

    def put(
        self, request: RequestMeta, response: ResponseMeta, body: object, size: int, now: float
    ) -> None:
        """``proxy.core.tiers.Tier.put``: the record of a response ``takes`` took, under its
        URL, its variant's key or its slice's."""
        if not isinstance(body, bytes):
            raise TypeError(f"a record's body is bytes, not {type(body).__name__}")
        if response.vary:
            self.write_variant(request.key, response, request.headers, body, now)
        elif response.status == 206:
            self.write_slice(request.key, response, body, now)
        else:
            self.write(request.key, response, body, now)

    def record_length(self, key: str, response: ResponseMeta, size: int) -> int:
        """The bytes of the record ``write`` appends for ``response`` (``size`` body bytes)
        under ``key``: the encoder's own count, which the simulator can be given too."""
        meta = encode_meta(response, 0.0, size, self.hidden, self.stamp)
        return RECORD_HEADER + len(_raw(key)) + len(meta) + size

    def write(self, key: str, response: ResponseMeta, body: bytes, stored_at: float) -> None:
        """Append the record of a response ``takes`` took, now that its body is whole."""
        meta = encode_meta(response, stored_at, len(body), self.hidden, self.stamp)
        location = self.log.append(_raw(key), meta, body)
        if location is not None:
            self.tier.recorded(key, location.region, location.offset, location.length)

    def write_slice(self, key: str, response: ResponseMeta, body: bytes, stored_at: float) -> None:
        """``write`` slice record ``key`` after an anchor of its object's length and version
        (``_after_anchor``): the slices before a new one are never found again
        (``anchored``)."""
        self._after_anchor(
            slices.anchor_key(slices.url_of(key)),
            lambda fields: _same_object(fields, response.headers),
            response._replace(status=204),
            key, response, body, stored_at,
        )  # fmt: skip

    def write_variant(
        self,
        url: str,
        response: ResponseMeta,
        request_headers: Headers,
        body: bytes,
        stored_at: float,
    ) -> None:
        """``write`` the record of ``url``'s variant that ``request_headers`` select, after an
        anchor naming the fields its variants are selected on (``_after_anchor``): the
        variants before a new one are never found again (``lookup_request``). At most
        ``max_variants`` are found after one anchor, as memory keeps at most that many: the
        one past them is written after a new anchor, which leaves the others behind (a
        client sending a new User-Agent each time cannot fill the disk with one URL)."""
        anchor = variants.anchor_key(url)
        written = self._variants_written.get(anchor, 0)
        anew = written >= self.max_variants
        self._variants_written[anchor] = 1 if anew else written + 1
        self._after_anchor(
            anchor,
            lambda fields: not anew and rfc9111.vary_names(fields) == response.vary,
            ResponseMeta(status=204, headers=(("Vary", ", ".join(response.vary)),)),
            variants.variant_key(url, response.vary, request_headers),
            response, body, stored_at,
        )  # fmt: skip

    def _after_anchor(
        self,
        anchor_key: str,
        holds: Callable[[Headers], bool],
        anchor: ResponseMeta,
        key: str,
        response: ResponseMeta,
        body: bytes,
        stored_at: float,
    ) -> None:
        """``write`` ``key``'s record after the anchor under ``anchor_key``: the one on disk
        when ``holds`` says its fields still describe the record, else ``anchor``, written
        first. An anchor the page cache does not hold is not waited for: a new one is
        written (what lay before it is fetched again, never served wrong)."""
        found = self.lookup(anchor_key, Entry, warm_only=True)
        if found is None or not holds(found.headers):
            self.write(anchor_key, anchor, b"", stored_at)
        self.write(key, response, body, stored_at)

    async def lookup_request(
        self, request: RequestMeta, entry_type: type[Entry]
    ) -> tuple[Entry, tuple[str, ...]] | None:
        """The entry the disk holds for ``request`` (``lookup_off_loop``): the URL's own
        record, or, when the anchor of its variants lies after that, the variant the request
        selects, written after the anchor; with the names it was selected on (none for the
        URL's own)."""
        url = request.key
        anchor = self.tier.find(variants.anchor_key(url))
        own = self.tier.find(url)
        if anchor is None or (own is not None and _after(own, anchor)):
            entry = await self.lookup_off_loop(url, entry_type)
            return None if entry is None else (entry, ())
        names = await self.lookup_off_loop(variants.anchor_key(url), Entry)
        if names is None:
            return None
        vary = rfc9111.vary_names(names.headers)
        key = variants.variant_key(url, vary, request.headers)
        slot = self.tier.find(key)
        if slot is None or not _after(slot, anchor):
            return None
        entry = await self.lookup_off_loop(key, entry_type)
        return None if entry is None else (entry, vary)

    def _reachable(self, key: str) -> bool:
        """Whether a read could find ``key``'s record as the index holds it: a URL's own record
        while no anchor of its variants lies after it; a variant only after that anchor, with
        no own record after the anchor; a slice only after its anchor (``lookup_request``,
        ``anchored``)."""
        url, part = url_of(key), not whole_url(key)
        slot = self.tier.find(key)
        if slot is None:
            return False
        if slices.is_slice_key(key):
            return self.anchored(url, key)
        anchor = self.tier.find(variants.anchor_key(url))
        if not part:
            return anchor is None or _after(slot, anchor)
        own = self.tier.find(url)
        return (anchor is not None and _after(slot, anchor)
                and (own is None or not _after(own, anchor)))  # fmt: skip

    def anchored(self, url: str, key: str) -> bool:
        """Whether the slice record ``key`` of ``url``'s object lies after the anchor of its
        slices: of the object as it stands since its last purge or change of version."""
        anchor = self.tier.find(slices.anchor_key(url))
        slot = None if anchor is None else self.tier.find(key)
        return slot is not None and _after(slot, anchor)

    def forget(self, key: str, why: str) -> bool:
        """``proxy.core.tiers.Tier.forget``: each record it names dropped and journaled
        (``invalidate``); whether the tier held ``key`` itself. A worker of a shared tier
        tells the others (``forgotten``), whose memory tiers may hold ``key`` too; not of a
        purge, which reaches every worker itself."""
        if self.forgotten is not None and why != PURGE:
            self.forgotten(key)
        own, *parts = forgotten_keys(key)
        for part in parts:
            self.invalidate(part)
        return self.invalidate(own)

    def refreshed(self, entry: Entry, validated: Headers, held: bool) -> None:
        """``proxy.core.tiers.Tier.refreshed``: the record of ``entry``'s key, read back from the
        page cache, is replaced by one of the refreshed entry when it carries ``validated``,
        written at the ring's head within the write budget (whether memory ``held`` the entry
        or not: another worker of a shared tier may have written a newer record meanwhile);
        when the budget refuses, or the body is not in hand, the old record is only dropped.
        One with other validators is another response, left as it is. Dropped instead: one
        no read could find any more (a variant or slice before its anchor, which a purge or a
        newer response left there: written again it would be found), one with another body
        (validators that did not change with the content), one the page cache does not hold,
        or any when there are no validators to compare (``validated`` empty). Drops are
        journaled first, so a crash between the two loses the record, never revives it."""
        if not self.tier.refreshable(entry):
            return
        key = entry.key
        found = validated and self._reachable(key)
        record = self.lookup(key, Entry, warm_only=True) if found else None
        if record is not None and tuple(rfc9111.conditional_headers(record.headers)) != validated:
            return
        self.invalidate(key)
        if record is None or record.payload != entry.payload:
            return
        body = entry.payload
        if not isinstance(body, bytes) or not self.tier.budget.allow(entry.stored_at):
            return
        response = ResponseMeta(lifetime=entry.lifetime, initial_age=entry.initial_age,
                                headers=entry.headers, status=entry.status,
                                directives=entry.directives)  # fmt: skip
        self.write(entry.key, response, body, entry.stored_at)

    def ban(self, value: str, *, by_tag: bool) -> None:
        """``proxy.core.tiers.Tier.ban``: kept as ``DiskTier.ban`` keeps it, put on the device
        by ``durable`` (with the drop journal). A worker of a shared tier saves it at once and
        says so to the others (``_follow_bans``)."""
        self.tier.ban(value, by_tag=by_tag)
        self.journal.banned(now=self.worker)
        if self.worker:
            assert self.shared is not None
            saved = self.shared.banned()
            # Its own ban is no news to this worker: it reads the files again only for a ban
            # another saved (``_follow_bans``), not at every purge that goes round.
            if saved == self._bans_seen + 1:
                self._bans_seen = saved

    def key_rules(self, rules: str, *, purge: bool) -> bool:
        """The rules the records were keyed and fetched by (``rules``, a fingerprint): a
        directory whose records were written under others has every record banned, when
        ``purge`` says so (at a start: a restart after the key rules or an origin changed
        never answers with what the old ones stored); the directory then keeps ``rules``.
        Whether it purged. A directory that kept no rules (a release before this one) is
        taken as written under these."""
        path = self.checkpoint_path.parent / KEY_RULES
        try:
            before: str | None = path.read_text()
        except FileNotFoundError:
            before = None
        purged = purge and before is not None and before != rules
        if purged:
            log.warning("the disk tier's records were keyed or fetched by other rules than "
                        "these (key_query, routes, origins, forwarded fields): purged")  # fmt: skip
            self.ban("", by_tag=False)
            self.durable()
        if before != rules:
            written = path.with_suffix(".new")
            written.write_text(rules)
            written.replace(path)
        return purged

    def durable(self) -> bool:
        """``proxy.core.tiers.Tier.durable``: the journal and the bans on the device, or
        (False) the regions their lost removals could reach removed (``Journal.durable``)."""
        return self.journal.durable()

    def invalidate(self, key: str) -> bool:
        """Forget ``key``'s record, journaled (``Journal.dropped``); whether there was one."""
        slot = self.tier.drop(key)
        if slot is None:
            return False
        self.journal.dropped(key, slot)
        return True

    def lookup(
        self,
        key: str,
        entry_type: type[Entry],
        longest: float = math.inf,
        *,
        warm_only: bool = False,
    ) -> Entry | None:
        """The entry ``key``'s record holds, read back whole on the event loop, or None: no
        record, one longer than ``longest`` bytes or (``warm_only``) one the page cache does
        not hold all of (left unread), or one not whole (dropped). The caller counts whether
        it answered (``DiskTier.answered``)."""
        slot = self.tier.find(key)
        if slot is None or slot.length > longest:
            return None
        try:
            found = self.log.read(slot, _raw(key), warm_only=warm_only)
        except BlockingIOError:
            return None
        return self._entry(key, slot, found, entry_type)

    async def lookup_off_loop(self, key: str, entry_type: type[Entry]) -> Entry | None:
        """``lookup``, read on the event loop only when the record is no longer than
        ``READ_INLINE`` and the page cache holds it, else on a worker thread; one moved,
        purged or evicted while the thread read it is a miss."""
        slot = self.tier.find(key)
        if slot is None:
            return None
        if slot.length <= READ_INLINE:
            try:
                return self._entry(key, slot, self.log.read(slot, _raw(key), warm_only=True),
                                   entry_type)  # fmt: skip
            except BlockingIOError:
                pass
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, self.log.read_apart, slot, _raw(key))
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

    def agrees_with_files(self) -> tuple[bool, int]:
        """Whether every record the index holds is a whole record of its key where the index
        says (a scan of the live region files finds it there), and how many it holds: what a
        start after a crash or a worker's kill must leave."""
        found = {}
        for region in self.tier.regions.live:
            for key, slot in self.log.scan(region):
                found[slot] = index_key(_text(key))
        held = slots(self.tier.index.dump())
        return all(found.get(slot) == key for key, slot in held), len(held)

    def _sample(self) -> tuple[float, int, int | None]:
        return time.monotonic(), self.tier.counters.bytes_written, process_write_bytes()

    def stats(self) -> dict[str, int | float | None]:
        regions = self.tier.regions
        (t0, b0, w0), (t1, b1, w1) = self._samples
        span = t1 - t0
        device = process_write_bytes()
        index = self.tier.index
        return {
            **asdict(self.tier.counters),
            "objects": len(self.tier),
            "index_bytes": index.memory_bytes,
            "pushed_out": 0 if self.shared is None else self.shared.pushed_out,
            "regions": len(regions.live),
            "capacity_bytes": regions.capacity_bytes,
            "restored_from_checkpoint": self.from_checkpoint,
            "restored_by_scan": self.scanned,
            "bans": len(self.tier.bans),
            "dropped_again": self.dropped_again,
            "bytes_written_per_second": round((b1 - b0) / span, 1) if span > 0 else None,
            "process_write_bytes": device,
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


def _after(slot: Slot, anchor: Slot) -> bool:
    """Whether the record at ``slot`` was written after the one at ``anchor``."""
    return (slot.region, slot.offset) > (anchor.region, anchor.offset)


def _same_object(anchor: Headers, part: Headers) -> bool:
    """Whether a slice's fields (``part``) are of the length and version an anchor's are."""
    span, other = slices.content_range(anchor), slices.content_range(part)
    return (
        span is not None
        and other is not None
        and span[2] == other[2]
        and slices.validator(anchor) == slices.validator(part)
    )


def _raw(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def _text(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")
