"""The one invalidation contract between the engine and the tiers behind its memory store.

Rules it keeps:

* Every response the engine decides on at its head is offered to every tier behind the store
  (``takes``), each by its own admission, and written by the engine to those that took it
  (``put``) once its body ended whole and after the store took it: no driver writes a tier,
  so every path that stores a response (a miss, a background refresh, a slice) reaches them
  all by one rule. Never offered: a response that is not cacheable, larger than the store's
  largest object, that could never answer fresh, that a purge could not reach by every tag,
  one a purge made since its request went out reaches, or one fetched as the client asked
  rather than for the cache (a cookie's, a hit-for-miss pass: no tier is read for those).
* Every removal the engine decides reaches every tier, through ``CacheEngine`` and nothing
  else: an unsafe method (RFC 9111 section 4.4), a response that supersedes the stored one and
  may not be stored itself (section 4.3.4's replacement, ``private`` or ``no-store``), a
  refreshed entry that may no longer be kept (a 304 that makes it ``private``, say), slices whose
  object changed under them, a purge by URL, prefix or tag, hard or soft. The driver that
  finds the reason calls the engine; the engine removes from the memory store and hands each
  tier behind it (``Tier``) the same removal with its reason (``why``). A tier added later
  inherits every removal by implementing ``Tier``.
* ``forget(key, why)`` names either a URL, and then the URL goes with every variant and slice
  of it, or one stored part of it (a variant's key, a slice's, an anchor's, or the URL's own
  record alone, ``own_record``: ``proxy.core.keys``, whose ``whole_url`` tells them
  apart).
* ``ban(value, by_tag)`` removes every record of a key starting with ``value`` (a purge by
  prefix) or whose response carries the tag ``value``, written before the ban.
* A tier that persists journals each removal before ``forget`` or ``ban`` returns, and
  ``durable`` puts the journal on stable storage: a purge answers only after it did, or, when
  the device cannot keep it, after the tier dropped everything the lost purge could have
  reached (``durable`` then says so), so a restart never brings back what was purged.
* A tier that cannot mark what it holds stale (a record on disk is written once) purges
  what a soft purge marks stale.
* A 304 updates every stored copy (section 4.3.4): ``refreshed(entry)`` hands each tier the
  refreshed entry, and a tier holding a copy of its key replaces it with the entry's fields
  and times (or, when it cannot, forgets it), never answering with the old ones again. Memory
  may have evicted the entry while the 304 was on its way: a tier's copy is then refreshed
  when it carries the validators the 304 answered, which a purge or a newer response since
  would not have left there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from proxy.core import slices, variants
from proxy.core.keys import part_key, whole_url

if TYPE_CHECKING:
    from proxy.core.events import RequestMeta, ResponseMeta
    from proxy.core.rfc9110 import Headers
    from proxy.core.store import Entry

# Why a tier forgets: the reasons the engine gives (logs and counters name them).
UNSAFE = "unsafe"  # a successful unsafe method on the URL
SUPERSEDED = "superseded"  # a newer response that may not be stored replaced it
UNSTORABLE = "unstorable"  # a 304 refreshed it into a response that may not be stored
VARIES = "varies"  # the URL's response started, stopped or changed what it varies on
CHANGED = "changed"  # a slice of another version: the object changed under its slices
PURGE = "purge"  # an operator's purge (by URL, prefix or tag; soft where nothing is stale)


# Marks a URL's own record alone (``own_record``), without its variants and slices.
_OWN = part_key("", "own")


def own_record(url: str) -> str:
    """The key that names to ``forget`` only ``url``'s own, unvaried record."""
    return url + _OWN


def forgotten_keys(key: str) -> tuple[str, ...]:
    """The keys a tier forgets for ``key``: a URL's own and the anchors its variants and its
    slices are found after (so none of them is found again), or the one part ``key`` names."""
    if key.endswith(_OWN):
        return (key[: -len(_OWN)],)
    if whole_url(key):
        return key, variants.anchor_key(key), slices.anchor_key(key)
    return (key,)


class Tier(Protocol):
    """A tier behind the memory store (the disk): what the engine forgets, it forgets; what
    the engine stores and it takes, it writes."""

    def takes(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        kept: bool,
        now: float,
    ) -> bool:
        """Whether the tier writes ``response`` (``length`` body bytes, None when unknown),
        fetched for ``request``, once its body ends whole: asked once, at its head,
        after memory decided (``kept``: memory keeps it). Its admission counts the sighting."""
        ...

    def put(
        self, request: RequestMeta, response: ResponseMeta, body: object, size: int, now: float
    ) -> None:
        """Write what ``takes`` took: ``body`` (the driver's payload, ``size`` bytes: the
        proxy's bytes; None from the simulator, which keeps no bodies), whole."""
        ...

    def forget(self, key: str, why: str) -> bool:
        """Forget ``key`` (see ``whole_url``); whether the tier held it."""
        ...

    def ban(self, value: str, *, by_tag: bool) -> None:
        """Forget every record of a key under the prefix ``value``, or (``by_tag``) whose
        response carries the tag ``value``."""
        ...

    def served(self, key: str, size: int, now: float) -> None:
        """Its record of ``key`` (``size`` body bytes) answered a request at ``now``."""
        ...

    def answered(self, hit: bool) -> None:
        """Count a memory miss the engine asked this tier about: answered (``hit``) or not."""
        ...

    def refreshed(self, entry: Entry, validated: Headers, held: bool) -> None:
        """A 304 refreshed ``entry``: a copy of its key here that carries ``validated``, the
        validators the 304 answered (``rfc9111.conditional_headers`` of the fields before),
        takes the entry's fields and times (RFC 9111 section 4.3.4 selects the stored
        responses to update by validator); a copy with other validators is another response,
        left as it is. A tier that cannot read its copy's validators may trust ``held``
        (memory still holds ``entry``) only where nothing else writes the tier, and
        otherwise forgets its copy; so does any tier when ``validated`` is empty."""
        ...

    def durable(self) -> bool:
        """Put every removal so far on stable storage: True when it is there, False when the
        tier had to drop everything a lost removal could reach instead."""
        ...
