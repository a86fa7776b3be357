"""Slices: a large object cached as byte ranges of one size, each fetched, admitted and stored on
its own (as nginx's slice module and Traffic Server's slice plugin do), so a Range of part of a
large object fetches and stores only the slices it covers.

Rules this module keeps:

* Slice ``n`` of an object is its bytes ``n * size`` to ``(n + 1) * size - 1`` (the last one
  ends with the object). It is stored under ``slice_key``: the URL, a NUL and ``slice n``, a
  key no variant has (a variant's selecting field names are tokens, which hold no space).
* A slice response joins others only when it is a 206 whose ``Content-Range`` is exactly the
  slice asked for, of the same complete length, with the same validator (``validator``: the
  strong ETag, else Last-Modified). RFC 9111 section 3.4 combines partial responses only on a
  shared strong validator; Last-Modified stands in where the origin sends no ETag, as
  Traffic Server's plugin does. A slice without either may answer the request that fetched it
  but is never stored: nothing would tell a later version from it.
* The slice index holds only stored slices: one leaves when its entry is evicted, replaced or
  deleted (``forget``), so it is bounded by the store's byte budget, as the Vary index is.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.core import rfc9110
from proxy.core.keys import part_key
from proxy.core.rfc9110 import Headers
from proxy.core.store import Entry

_MARK = part_key("", "slice ")
_NONE: frozenset[int] = frozenset()


def slice_key(url: str, n: int) -> str:
    """The store key of slice ``n`` of ``url``."""
    return f"{url}{_MARK}{n}"


def is_slice_key(key: str) -> bool:
    """Whether ``key`` names a slice (``slice_key``)."""
    return _MARK in key


def url_of(key: str) -> str:
    """The URL of the slice key ``key``."""
    return key.partition(_MARK)[0]


def anchor_key(url: str) -> str:
    """The key under which a tier behind the store (the disk) keeps the anchor of ``url``'s
    slices: only slices written after it are of the object as it stands (see the disk's
    ``write_slice``)."""
    return part_key(url, "slices")


def bounds(n: int, size: int, length: int) -> tuple[int, int]:
    """The first and last byte of slice ``n`` of a ``length``-byte object, in slices of
    ``size``."""
    first = n * size
    return first, min(first + size, length) - 1


def covering(first: int, last: int, size: int) -> range:
    """The slices that bytes ``first`` to ``last`` (inclusive) span."""
    return range(first // size, last // size + 1)


def first_wanted(request_headers: Headers, size: int) -> int:
    """The slice a request's single byte Range starts in, when it names its first byte (the
    slice that tells the object's length, without fetching what the request does not want);
    else slice 0."""
    values = rfc9110.get_all(request_headers, "range")
    if len(values) != 1:
        return 0
    unit, _, spec = values[0].strip().partition("=")
    first_text, dash, _ = spec.strip().partition("-")
    first = rfc9110.digits(first_text.strip()) if first_text.strip() else None
    if unit.strip().lower() != "bytes" or "," in spec or not dash or first is None:
        return 0
    return first // size


def content_range(headers: Headers) -> tuple[int, int, int] | None:
    """A 206's ``Content-Range`` (RFC 9110 section 14.4) as (first, last, complete length);
    None when it is absent, not bytes, of an unknown length or not a valid range."""
    value = rfc9110.get_first(headers, "content-range")
    if value is None:
        return None
    unit, _, rest = value.strip().partition(" ")
    span, slash, total_text = rest.strip().partition("/")
    first_text, dash, last_text = span.partition("-")
    first, last = rfc9110.digits(first_text), rfc9110.digits(last_text)
    total = rfc9110.digits(total_text)
    if unit.lower() != "bytes" or not slash or not dash:
        return None
    if first is None or last is None or total is None or not first <= last < total:
        return None
    return first, last, total


def validator(headers: Headers) -> str | None:
    """What tells one version of an object from another across its slices: its strong entity
    tag (RFC 9110 section 8.8.3); None without one. A Last-Modified is never enough, whatever
    its distance from the Date: deploys that keep files' times (reproducible builds, images
    stamped with ``SOURCE_DATE_EPOCH``: 1970-01-01) give two versions of one length the same
    one, and slices of both would be stitched into one answer."""
    etag = rfc9110.get_first(headers, "etag")
    if etag is not None and not etag.strip().startswith("W/"):
        return etag.strip()
    return None


class SliceIndex:
    """URL -> the numbers of its stored slices."""

    def __init__(self) -> None:
        self.urls: dict[str, set[int]] = {}

    def add(self, key: str) -> None:
        """Index ``key`` when it is a slice's (any other key is not indexed)."""
        url, mark, n = key.partition(_MARK)
        if mark:
            self.urls.setdefault(url, set()).add(int(n))

    def numbers(self, url: str) -> set[int] | frozenset[int]:
        """The numbers of the stored slices of ``url`` (the index's own set: not to change)."""
        return self.urls.get(url, _NONE)

    def keys(self, url: str) -> list[str]:
        """The store keys of the stored slices of ``url``."""
        return [slice_key(url, n) for n in self.numbers(url)]

    def pop(self, url: str) -> list[str]:
        """Unindex ``url``: the store keys of its slices."""
        keys = self.keys(url)
        self.urls.pop(url, None)
        return keys

    def forget(self, gone: Iterable[Entry]) -> None:
        """Entries that left the store leave the index with them."""
        urls = self.urls
        if not urls:
            return
        for entry in gone:
            url, mark, n = entry.key.partition(_MARK)
            stored = urls.get(url) if mark else None
            if stored is not None:
                stored.discard(int(n))
                if not stored:
                    del urls[url]
