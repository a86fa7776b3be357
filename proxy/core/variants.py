"""The Vary index: which URLs have stored variants, the request fields that select them, and
the store keys of those stored.

* A variant is stored under its URL, a NUL, and the selecting fields' values
  (``rfc9111.vary_key``); the admission filter sees only the URL.
* Only stored variants are indexed: one leaves when its entry is evicted, replaced or
  deleted (``forget``), so the index is bounded by the store's byte budget; a URL holds at most
  ``max_per_url`` of them.
* A URL's variants are selected on one list of fields: a response that varies on another
  list (or stops varying) makes the earlier ones unreachable, and the engine removes them.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.core import rfc9111
from proxy.core.events import RequestMeta
from proxy.core.keys import part_key, url_of, whole_url
from proxy.core.store import Entry


class Variants:
    """URL -> (the names its variants are selected on, the store keys of the stored ones)."""

    def __init__(self, max_per_url: int) -> None:
        self.max_per_url = max_per_url
        self.urls: dict[str, tuple[tuple[str, ...], set[str]]] = {}

    def __contains__(self, url: str) -> bool:
        return url in self.urls

    def __bool__(self) -> bool:
        return bool(self.urls)

    def key(self, request: RequestMeta) -> str:
        """The store key a request finds: its variant's when its URL varies, else its URL."""
        urls = self.urls
        if not urls:
            return request.key
        known = urls.get(request.key)
        if known is None:
            return request.key
        return variant_key(request.key, known[0], request.headers)

    def full(self, url: str, names: tuple[str, ...]) -> bool:
        """Whether ``url`` holds as many variants selected on ``names`` as it may."""
        known = self.urls.get(url)
        return known is not None and known[0] == names and len(known[1]) >= self.max_per_url

    def selected_on(self, url: str, names: tuple[str, ...]) -> bool:
        """Whether ``url``'s stored variants are selected on ``names``."""
        known = self.urls.get(url)
        return known is not None and known[0] == names

    def add(self, url: str, names: tuple[str, ...], key: str) -> None:
        """Index the stored variant ``key`` of ``url``, selected on ``names``."""
        known = self.urls.get(url)
        if known is None or known[0] != names:
            known = (names, set())
            self.urls[url] = known
        known[1].add(key)

    def pop(self, url: str) -> set[str]:
        """Unindex ``url``: the store keys of its variants."""
        return self.urls.pop(url, ((), set()))[1]

    def forget(self, gone: Iterable[Entry | str]) -> None:
        """Entries (or keys) that left the store leave the index with them."""
        urls = self.urls
        if not urls:
            return
        for item in gone:
            key = item if isinstance(item, str) else item.key
            url = url_of(key)
            known = None if whole_url(key) else urls.get(url)
            if known is not None:
                known[1].discard(key)
                if not known[1]:
                    del urls[url]

    def size(self) -> int:
        """Store keys the index holds: never more than the stored variants."""
        return sum(len(keys) for _, keys in self.urls.values())


def variant(url: str, selected: tuple[tuple[str, str], ...]) -> str:
    """The store key of ``url``'s variant selected by the field values ``selected``."""
    return part_key(url, *(f"{name}={value}" for name, value in selected))


def variant_key(url: str, names: tuple[str, ...], request_headers: rfc9111.Headers) -> str:
    """The store key of the variant of ``url``, selected on ``names``, that a request with
    ``request_headers`` selects."""
    return variant(url, rfc9111.vary_key(names, request_headers))


def anchor_key(url: str) -> str:
    """The key under which a tier behind the store (the disk) keeps the names ``url``'s
    variants are selected on: only variants written after it are found (see the disk's
    ``write_variant``). No variant has it: a variant's key holds ``name=value``."""
    return part_key(url, "vary")
