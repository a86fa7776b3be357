"""The live disk tier: the core's ``DiskTier`` over region files (``RegionLog``), behind the
memory tier, keeping what it took across restarts; the ``Tier`` the engine drives.

* A response reaches the disk only when the tier's own admission says so at its head
  (``takes``), and only once its body ended whole (``put``, called by the engine): a record
  of its key, its body and its meta (``proxy.disk.record_meta``: times, the head its plain
  hits write, fields, directives) appended at the end of the open region.
* On a memory miss, a record is read back, verified, as an entry the engine judges by its
  own freshness rules (``proxy.disk.reads``, the store's ``reads``); slices and variants are
  records found only after an anchor record (``proxy.disk.anchors``, its ``anchors``).
* Each removal the engine decides is journaled before it returns (``forget``, ``ban``) and
  put on the device by ``durable``; the directory, the checkpoints of the index, the journal
  and the bans are kept by ``proxy.disk.keeping`` (its ``keeping``).
* The workers of one machine share one tier (``Sharing``): its index, its ring and its
  admission window in memory the parent maps too. The parent is the tier's loader and keeper
  (``Sharing.worker`` None); each worker reads, writes and forgets records itself,
  journaling its own drops, and writes no checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict

from proxy.config.settings import DiskSection
from proxy.core import rfc9111
from proxy.core._native import SharedIndex
from proxy.core.admission import AdmissionConfig
from proxy.core.disk import (
    RECORD_HEADER,
    DiskTier,
    WriteBudget,
    record_key,
)
from proxy.core.events import RequestMeta, ResponseMeta
from proxy.core.regions import Regions, SharedRegions
from proxy.core.rfc9110 import Headers
from proxy.core.store import Entry
from proxy.core.tiers import PURGE, forgotten_keys
from proxy.disk.anchors import Anchors
from proxy.disk.keeping import Keeping
from proxy.disk.reads import RecordReader, raw
from proxy.disk.record_meta import encode_meta, record_stamp
from proxy.disk.sharing import Sharing

log = logging.getLogger("onehit.disk")
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
        # The index the workers of a machine share (None: the process's own).
        self.shared: SharedIndex | None = None
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
        self.keeping = Keeping(section, self.tier, self.shared,
                               None if sharing is None else sharing.worker,
                               self.follows_memory)  # fmt: skip
        self.log, self.journal = self.keeping.log, self.keeping.journal
        self.reads = RecordReader(self.tier, self.log, self.stamp)
        self.anchors = Anchors(self.tier, self.reads, self.write)

    def takes(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        kept: bool,
        now: float,
    ) -> bool:
        """``proxy.core.tiers.Tier.takes``: a GET of any status memory stores (a variant is
        written after its anchor, ``Anchors.write_variant``) or a slice's 206 under its slice
        key (``Anchors.write_slice``),
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
            self.anchors.write_variant(request.key, response, request.headers, body, now)
        elif response.status == 206:
            self.anchors.write_slice(request.key, response, body, now)
        else:
            self.write(request.key, response, body, now)

    def record_length(self, key: str, response: ResponseMeta, size: int) -> int:
        """The bytes of the record ``write`` appends for ``response`` (``size`` body bytes)
        under ``key``: the encoder's own count, which the simulator can be given too."""
        meta = encode_meta(response, 0.0, size, self.hidden, self.stamp)
        return RECORD_HEADER + len(raw(key)) + len(meta) + size

    def write(self, key: str, response: ResponseMeta, body: bytes, stored_at: float) -> None:
        """Append the record of a response ``takes`` took, now that its body is whole."""
        meta = encode_meta(response, stored_at, len(body), self.hidden, self.stamp)
        location = self.log.append(raw(key), meta, body)
        if location is not None:
            self.tier.recorded(key, location.region, location.offset, location.length)

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
        found = validated and self.anchors.reachable(key)
        record = self.reads.lookup(key, Entry, warm_only=True) if found else None
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
        says so to the others (``Keeping.banned``)."""
        self.tier.ban(value, by_tag=by_tag)
        self.keeping.banned()

    def key_rules(self, rules: str, *, purge: bool) -> bool:
        """The rules the records were keyed and fetched by (``rules``, a fingerprint): a
        directory whose records were written under others has every record banned, when
        ``purge`` says so (at a start: a restart after the key rules or an origin changed
        never answers with what the old ones stored); the directory then keeps ``rules``.
        Whether it purged. A directory that kept no rules (a release before this one) is
        taken as written under these."""
        path = self.keeping.checkpoint_path.parent / KEY_RULES
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

    def stats(self) -> dict[str, int | float | None]:
        """What /stats gives of the tier: its counters, what it holds, how it started, and the
        rates it is written at (``Keeping.rates``)."""
        regions, kept = self.tier.regions, self.keeping
        return {
            **asdict(self.tier.counters),
            "objects": len(self.tier),
            "index_bytes": self.tier.index.memory_bytes,
            "pushed_out": 0 if self.shared is None else self.shared.pushed_out,
            "regions": len(regions.live),
            "capacity_bytes": regions.capacity_bytes,
            "restored_from_checkpoint": kept.from_checkpoint,
            "restored_by_scan": kept.scanned,
            "bans": len(self.tier.bans),
            "dropped_again": kept.dropped_again,
            **kept.rates(),
        }

    def checkpoint(self) -> bool:
        """``Keeping.checkpoint``: the index and the bans on the device."""
        return self.keeping.checkpoint()

    def close(self) -> None:
        """``Keeping.close``: a last checkpoint, the files closed, the directory given up."""
        self.keeping.close()
