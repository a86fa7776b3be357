"""Records found only after an anchor: the slices of an object and the variants of a URL.

* Slices of large objects (``proxy.handler.slicing``) are records of their own under their
  slice keys, written after an anchor record of their object (``write_slice``): a purge of
  the URL, or a change of the object's version, drops or replaces the anchor, and no slice
  written before the anchor on disk is found again (``anchored``).
* A response that varies (``Vary``) is a record under its variant key, written after an
  anchor record naming the fields its URL's variants are selected on (``write_variant``); a
  lookup reads the anchor to know which variant a request selects (``lookup_request``). A
  purge of the URL drops the anchor, other fields write a new one, and no variant written
  before the anchor on disk is found again. At most ``max_variants`` are found after one
  anchor, as memory keeps at most that many.
"""

from __future__ import annotations

from collections.abc import Callable

from cachetools import LRUCache

from proxy.core import rfc9111, slices, variants
from proxy.core.disk import DiskTier, Slot
from proxy.core.events import RequestMeta, ResponseMeta
from proxy.core.keys import url_of, whole_url
from proxy.core.rfc9110 import Headers
from proxy.core.store import Entry
from proxy.disk.reads import RecordReader

# URLs whose count of variants written after their anchor is kept (least recently written
# forgotten: such a URL's next variant is counted from one again).
VARIANT_COUNTS = 4096

Write = Callable[[str, ResponseMeta, bytes, float], None]


class Anchors:
    """The anchored records of ``tier``: read through ``reader``, written through ``write``
    (``DiskStore.write``: a record appended and indexed)."""

    def __init__(self, tier: DiskTier, reader: RecordReader, write: Write) -> None:
        self.tier = tier
        self.reader = reader
        self.write = write
        # Variants kept per URL, as in memory (``[cache] max_variants``; set by the service),
        # and how many each URL's anchor has had written after it, for the URLs written last.
        self.max_variants = 32
        self._variants_written: LRUCache[str, int] = LRUCache(VARIANT_COUNTS)

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
        found = self.reader.lookup(anchor_key, Entry, warm_only=True)
        if found is None or not holds(found.headers):
            self.write(anchor_key, anchor, b"", stored_at)
        self.write(key, response, body, stored_at)

    async def lookup_request(
        self, request: RequestMeta, entry_type: type[Entry], own: Slot | None = None
    ) -> tuple[Entry, tuple[str, ...]] | None:
        """The entry the disk holds for ``request`` (``lookup_off_loop``): the URL's own
        record, or, when the anchor of its variants lies after that, the variant the request
        selects, written after the anchor; with the names it was selected on (none for the
        URL's own). ``own``: where the URL's own record lay when a reader found it on an
        earlier turn of the loop (``ColdRecord``): not looked up before the read, and asked
        after it whether it still lies there."""
        url = request.key
        anchor = self.tier.find(variants.anchor_key(url))
        carried = own is not None
        if own is None:
            own = self.tier.find(url)
        if _own_found(own, anchor):
            if own is None:
                return None
            entry = await self.reader.lookup_off_loop(url, entry_type, own, found_before=carried)
            return None if entry is None else (entry, ())
        if carried:
            # Written before the anchor when it was found: it may have been written again.
            return await self.lookup_request(request, entry_type)
        names = await self.reader.lookup_off_loop(variants.anchor_key(url), Entry, anchor)
        if names is None:
            return None
        vary = rfc9111.vary_names(names.headers)
        key = variants.variant_key(url, vary, request.headers)
        slot = self.tier.find(key)
        if slot is None or not _after(slot, anchor):
            return None
        entry = await self.reader.lookup_off_loop(key, entry_type, slot)
        return None if entry is None else (entry, vary)

    def reachable(self, key: str) -> bool:
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
            return _own_found(slot, anchor)
        return not _own_found(self.tier.find(url), anchor) and _after(slot, anchor)

    def anchored(self, url: str, key: str) -> bool:
        """Whether the slice record ``key`` of ``url``'s object lies after the anchor of its
        slices: of the object as it stands since its last purge or change of version."""
        anchor = self.tier.find(slices.anchor_key(url))
        slot = None if anchor is None else self.tier.find(key)
        return slot is not None and _after(slot, anchor)


def _own_found(own: Slot | None, anchor: Slot | None) -> bool:
    """Whether a lookup of a URL finds its own record (at ``own``), not a variant: no anchor
    of its variants (at ``anchor``) lies after it. When one does, the variants written after
    the anchor are found instead."""
    return anchor is None or (own is not None and _after(own, anchor))


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
