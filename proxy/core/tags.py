"""Tags on stored responses, for purges by tag (Fastly's ``Surrogate-Key``, Cloudflare's and
Varnish xkey's ``Cache-Tag``).

Rules this module keeps:

* A response's tags are the space-separated tokens of its ``Surrogate-Key`` fields and the
  comma-separated ones of its ``Cache-Tag`` fields, once each, in the order they came.
* A response with more than ``MAX_TAGS`` tags is not stored: a purge by any of them must
  reach it, so none is dropped to fit (it passes, as any uncacheable response does).
* ``TagIndex`` maps each tag to the store keys of the stored entries that carry it, and
  holds nothing else: an entry leaves it when it leaves the store (``forget``), so it is
  bounded by what the store holds; each tag an entry carries is charged against the store's
  capacity (``proxy.core.store.TAG_CHARGE``), as its fields are.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.core import rfc9110
from proxy.core.store import Entry

MAX_TAGS = 256
# The fields that carry tags: the cache's to read, left out of answers unless configured.
TAG_FIELDS = frozenset({"surrogate-key", "cache-tag"})
_LENGTHS = frozenset(map(len, TAG_FIELDS))


def response_tags(headers: rfc9110.Headers) -> tuple[str, ...]:
    """The tags of a response with ``headers``."""
    if type(headers) is rfc9110.Fields:
        carried = [(n, v) for n in TAG_FIELDS for v in headers.by_name.get(n, ())]
    else:  # one pass, lengths first: most responses (and every promoted one) carry none
        carried = [(k.lower(), v) for k, v in headers if len(k) in _LENGTHS
                   and k.lower() in TAG_FIELDS]  # fmt: skip
    if not carried:
        return ()
    tags: dict[str, None] = {}
    for name, value in carried:
        if name == "surrogate-key":
            tags.update(dict.fromkeys(value.split()))
    for name, value in carried:
        if name == "cache-tag":
            tags.update(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
    return tuple(tags)


def storable_tags(headers: rfc9110.Headers) -> tuple[str, ...] | None:
    """``response_tags``, or None when there are more than ``MAX_TAGS``: such a response is
    not stored."""
    tags = response_tags(headers)
    return tags if len(tags) <= MAX_TAGS else None


class TagIndex:
    """Tag -> the store keys of the entries carrying it."""

    def __init__(self) -> None:
        self.keys: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, entry: Entry) -> None:
        """Index a stored ``entry`` under its tags (``entry.tags``)."""
        for tag in entry.tags:
            self.keys.setdefault(tag, set()).add(entry.key)

    def forget(self, gone: Iterable[Entry]) -> None:
        """Entries that left the store leave the index with them."""
        keys = self.keys
        if not keys:
            return
        for entry in gone:
            for tag in entry.tags:
                held = keys.get(tag)
                if held is not None:
                    held.discard(entry.key)
                    if not held:
                        del keys[tag]

    def tagged(self, tags: Iterable[str]) -> set[str]:
        """The store keys of the entries carrying any of ``tags``."""
        found: set[str] = set()
        for tag in tags:
            found |= self.keys.get(tag, set())
        return found
