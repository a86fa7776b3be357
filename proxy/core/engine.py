"""The cache engine: a store, an admission policy and the HTTP rules that decide between them.

Rules this module keeps:

* A driver (the live proxy) asks ``plan`` what to do with a request and gets one action, a small
  frozen dataclass: ``FromCache`` (answer from a stored response), ``Revalidate`` (ask the origin
  about a stored one), ``Fetch`` (go to the origin) or ``Refuse`` (answer with an error, no origin
  contact), or ``Behind`` (ask the tier behind the store first; ``found_behind`` judges
  what it holds). The offline simulator's model drives ``plan``, ``found_behind`` and
  ``on_response`` as the proxy does: the same counting, the same store, the same admission.
* ``lookup``: a method other than GET or HEAD is a ``Bypass`` (counted apart). A fresh entry is a
  ``Hit`` (counted; the entry's hit count goes up). An entry that is expired, or that the request
  or response says must be revalidated (``no-cache``, request ``max-age``/``min-fresh``), is
  ``Stale`` (a miss; ``serve_stale`` says whether RFC 9111/5861 allow answering with it while
  revalidating). Nothing stored is a ``Miss``.
* ``fresh`` peeks: the hit ``lookup`` would find, with nothing counted or moved.
* ``plan`` on top of it: ``only-if-cached`` never contacts the origin (a stale entry answers only
  when it may be served stale; else 504, section 5.2.1.7). A GET miss fetches the whole
  representation (``Fetch.whole``): the client's conditionals and Range are answered from what
  arrives (``answer``), so what revalidating browsers and video players ask for is cached too.
  A URL whose response was uncacheable a moment ago (``hit_for_miss`` seconds) goes straight to
  the origin with the client's own fields and is not collapsed.
* Responses are decided from their head, before their body: ``on_response_head`` says, for
  memory, ``Keep`` (copy the body as it streams) or ``NotStored`` (stream it, keep nothing),
  and which tiers behind the store take it (``Tier.takes``: copy it for them too). An uncacheable
  response is ``NotStored(reason)``; one over the max object size is ``NotStored("too-large")``
  without consulting the policy; a URL already stored (a refresh) is kept without consulting the
  policy; otherwise the admission policy decides on the URL, and a refusal is
  ``NotStored("first-sighting")``; one a purge made since its request went out reaches is
  ``NotStored("purged-in-flight")``. ``finish`` then stores a kept body that ended whole and
  fits, and writes it to the tiers that took it (``Tier.put``): no driver writes a tier; a
  body cut short is stored nowhere. ``on_response`` is both steps for a body already in hand;
  ``on_shared`` counts a request answered by another's fetch as a sighting, not a fetch.
* A full response that may not be stored removes what was stored for its URL, every variant,
  in every tier (section 4.3.4); a full response that may be stored is the newest for its
  key, so no tier answers with an older copy again (section 4): the store's is replaced or
  dropped, a tier behind it forgets its own (and writes the new one if it takes it). A 304
  refreshes the stored one, keeping its status, and re-charges its size; each tier behind
  takes the refreshed fields and times for its copy (``Tier.refreshed``); refreshed into a
  response that may not be stored (``private``, ``no-store``), or no longer stored itself
  (purged or evicted meanwhile), it goes from every tier. Every removal goes through the
  engine's ``removals`` (``proxy.core.invalidation``: an operator's purges too), and from
  there through ``proxy.core.tiers``.
* Variants (``Vary``) are stored under the URL plus the selecting request header values; the
  admission policy sees only the URL. The index of a URL's variants holds only stored variants:
  a variant leaves it when evicted or deleted, so it is bounded by the store's byte budget.
  ``Removals.invalidate`` removes a URL with all its variants.
* Cookies (as Varnish's built-in policy): a request carrying a cookie that is not ignored is
  never answered from a stored response, nor collapsed with another request, and its response
  is stored only when it is meant for shared caches (``public``, ``s-maxage``,
  CDN-Cache-Control), as with ``Authorization``. A stored response never carries a
  ``Set-Cookie``.
* Purge tags (``proxy.core.tags``: ``Surrogate-Key``, ``Cache-Tag``) are indexed for the
  entries stored, each charged to its entry; a purge of tags (``Removals.purge``) removes
  every entry carrying one of them. A response with more than ``MAX_TAGS`` is not stored
  (``too-many-tags``): a purge must reach it whichever of its tags it names.
* Slices (``proxy.core.slices``): a driver that fetches a large object as byte ranges stores
  each under its slice key, judged and admitted as a response of its own; the slice index
  holds the stored ones, so a purge of the URL removes them. ``slice_hit`` finds and counts a
  stored slice; ``sliced`` counts the request they answered as one, a hit when none was
  fetched.
* Memory is bounded by configuration: at most ``max_variants`` variants per URL (responses for
  more are not stored, ``NotStored("variants")``), the hit-for-miss memory by bytes, the Vary
  index by the stored variants, the store by its capacity (which charges keys and headers).
* Time is an argument. Nothing here does I/O.
"""

from __future__ import annotations

from cachetools import LRUCache

from proxy.core import rfc9110, rfc9111
from proxy.core.admission import AdmissionPolicy, promotion_filter
from proxy.core.cache_status import GRACE, STALE_IF_ERROR
from proxy.core.events import (
    ANSWERED_FIELDS,
    CONDITIONALS,
    FETCH_AS_ASKED,
    FETCH_BYPASS,
    FETCH_STALE,
    FETCH_WHOLE,
    FETCH_WITH_CONTENT,
    FWD_STALE,
    FWD_URI_MISS,
    METHOD_BYPASS,
    PRECONDITIONS,
    PRIVATE_MISS,
    URI_MISS,
    Action,
    Answer,
    Behind,
    Bypass,
    Fetch,
    FromCache,
    Hit,
    HitState,
    Lookup,
    Miss,
    Refuse,
    RequestMeta,
    RequestSample,
    Revalidate,
    Stale,
    Step,
)
from proxy.core.invalidation import Removals
from proxy.core.keys import url_of
from proxy.core.lru import ChargedLRU
from proxy.core.purges import RecentPurges
from proxy.core.responses import HIT_FOR_MISS_BYTES, ResponseDecisions
from proxy.core.rfc9110 import Headers
from proxy.core.slices import SliceIndex
from proxy.core.stats import Counters, snapshot
from proxy.core.store import CacheStore, Entry
from proxy.core.tags import TagIndex, storable_tags
from proxy.core.tiers import Tier
from proxy.core.ttl_rules import TtlRules
from proxy.core.variants import Variants

CACHEABLE_METHODS = frozenset({"GET", "HEAD"})
# How a hit's request was counted before it was known to be one (``CacheEngine._count_hit``).
AS_REQUEST, AS_MISS = range(2)

_NO_DIRECTIVES: rfc9111.Directives = {}
# What a client sends to have a fresh stored response revalidated (RFC 9111 sections 5.2.1.1,
# 5.2.1.3, 5.2.1.4; Pragma: no-cache is read as no-cache), and how often one URL is, at most,
# for clients (``CacheEngine._client_directives``), remembered for this many URLs.
_CLIENT_REVALIDATES = frozenset({"no-cache", "max-age", "min-fresh"})
CLIENT_REVALIDATION_EVERY = 1.0
CLIENT_REVALIDATED_URLS = 4096
# Request fields ``plan`` reads on a miss; most requests carry none of them.
_PLAN_FIELDS = frozenset({"cache-control", "cookie", *PRECONDITIONS})


def fresh(entry: Entry, age: float, req: rfc9111.Directives) -> bool:
    """Whether ``entry`` at ``age`` answers a request with directives ``req`` without
    revalidation (RFC 9111 sections 4.2, 5.2.1 and 5.2.2)."""
    if age >= entry.lifetime:
        return False
    if req or "no-cache" in entry.directives:
        return rfc9111.fresh_enough(
            entry.lifetime, age, req
        ) and not rfc9111.must_revalidate_before_use(entry.directives, req)
    return True


class CacheEngine(ResponseDecisions):
    """Drives ``store`` and ``admission`` and keeps the counters of both. ``hit_for_miss``:
    seconds a URL whose response was uncacheable goes straight to the origin (0: never).
    ``max_variants``: variants stored per URL. ``ignore_cookies``: cookie names (globs) that
    do not make a request private. ``grace``: seconds past its allowance a stale response may
    still answer when the origin fails."""

    def __init__(
        self,
        store: CacheStore,
        admission: AdmissionPolicy,
        *,
        hit_for_miss: float = 0.0,
        max_variants: int = 32,
        ignore_cookies: tuple[str, ...] = (),
        grace: float = 0.0,
        client_revalidation: str = "honour",
        ttl_rules: TtlRules | None = None,
        behind_largest: int = 0,
    ) -> None:
        self.store = store
        # The largest body a tier behind memory keeps (0: none behind): memory's own largest
        # moves with its size and eviction (S3-FIFO's small queue bounds it), a disk's not.
        self.behind_largest = behind_largest
        self.ttl_rules = ttl_rules if ttl_rules is not None else TtlRules()
        self.use_admission(admission)
        self.hit_for_miss = hit_for_miss
        # A backend the driver awaits decides admission (the fleet's shared filter): the
        # engine asks for its answer (``ASK_ADMISSION``) instead of consulting its policy.
        self.admission_elsewhere = False
        self.grace = grace
        self.ignore_cookies = ignore_cookies
        self.counters = Counters()
        # The class of the entries stored: a driver's subclass keeps what it derives from an
        # entry (the proxy's rendered head) beside it, and the core never reads it.
        self.entry_type: type[Entry] = Entry
        # Ghost caches fed a sample of the requests answered (``proxy.core.whatif``), or None.
        self.whatif: RequestSample | None = None
        self.variants = Variants(max_variants)
        self.tags = TagIndex()
        self.slices = SliceIndex()
        self.recent_purges = RecentPurges()
        self.removals = Removals(store, self.variants, self.tags, self.slices, self.counters,
                                 self.recent_purges)  # fmt: skip
        # "honour" a client's no-cache, max-age, min-fresh at most once a second per URL, or
        # "ignore" them; when a client last made each URL revalidate.
        self.client_revalidation = client_revalidation
        self._revalidated: LRUCache[str, float] = LRUCache(CLIENT_REVALIDATED_URLS)
        # URL -> (until when it goes straight to the origin, bytes it is charged)
        self._uncacheable: ChargedLRU[str, tuple[float, int]] = ChargedLRU(
            HIT_FOR_MISS_BYTES, _second
        )

    @property
    def max_object_bytes(self) -> int:
        """The largest body the cache keeps in any tier (``ResponseDecisions.fits``): memory's,
        or a tier's behind it."""
        return max(self.store.max_object_bytes, self.behind_largest)

    def use_admission(self, admission: AdmissionPolicy) -> None:
        """Admit by ``admission`` from now on, and keep the hits of a tier behind the store
        by it and its ``promotion_filter``."""
        self.admission = admission
        self.promotion = promotion_filter(admission, self.store)

    @property
    def behind(self) -> tuple[Tier, ...]:
        """The tiers behind the store (the disk): asked on a memory miss (``Behind``),
        offered what memory is offered, and reached by every removal (``Removals``, which
        holds them)."""
        return self.removals.behind

    @behind.setter
    def behind(self, tiers: tuple[Tier, ...]) -> None:
        self.removals.behind = tiers

    # Requests

    def lookup(self, request: RequestMeta, now: float) -> Lookup:
        c = self.counters
        if request.method not in CACHEABLE_METHODS:
            c.bypass += 1
            return METHOD_BYPASS
        c.requests += 1
        entry = self.store.get(self.variants.key(request))
        if entry is None:
            c.misses += 1
            return URI_MISS
        if self._private(request, entry):
            c.misses += 1
            return PRIVATE_MISS
        age = entry.age(now)
        req = self._client_directives(request, entry, age, now, revalidating=True)
        if fresh(entry, age, req):
            self._count_hit(AS_REQUEST)
            self._from_store(request.key, entry, now)
            return Hit(entry, age)
        c.misses += 1
        return _stale(entry, age, req)

    def fresh(self, request: RequestMeta, now: float) -> Hit | None:
        """The stored response that answers ``request`` as a hit, or None; nothing is counted
        or moved."""
        if request.method not in CACHEABLE_METHODS:
            return None
        entry = self.store.peek(self.variants.key(request))
        return None if entry is None else self._answers_from(request, entry, now)

    def _answers_from(self, request: RequestMeta, entry: Entry, now: float) -> Hit | None:
        """Whether ``entry`` (stored, or found in a tier behind the store: the disk) answers
        ``request`` fresh; nothing is counted."""
        if request.method not in CACHEABLE_METHODS or self._private(request, entry):
            return None
        age = entry.age(now)
        req = self._client_directives(request, entry, age, now)
        return Hit(entry, age) if fresh(entry, age, req) else None

    def _client_directives(
        self,
        request: RequestMeta,
        entry: Entry,
        age: float,
        now: float,
        *,
        revalidating: bool = False,
    ) -> rfc9111.Directives:
        """The directives of ``request`` that judge ``entry`` at ``age``. A client's demand to
        revalidate a response fresh by its own rules (``no-cache``, ``max-age``,
        ``min-fresh``; RFC 9111 section 5.2.1) is left out under ``client_revalidation =
        "ignore"`` (as nginx does), and under "honour" when a client made the URL revalidate
        less than ``CLIENT_REVALIDATION_EVERY`` ago: that revalidation answers it, and a
        client cannot make every request an origin fetch. ``revalidating``: this request
        will be revalidated if it asks it (remembered for the URL)."""
        req = _directives(request)
        if _CLIENT_REVALIDATES.isdisjoint(req) or not fresh(entry, age, _NO_DIRECTIVES):
            return req
        key = request.key
        last = self._revalidated.get(key)
        if self.client_revalidation == "ignore" or (
            last is not None and 0 <= now - last < CLIENT_REVALIDATION_EVERY
        ):
            return {k: v for k, v in req.items() if k not in _CLIENT_REVALIDATES}
        if revalidating and not fresh(entry, age, req):
            self._revalidated[key] = now
        return req

    def _hit_behind(
        self,
        tier: Tier,
        key: str,
        entry: Entry,
        now: float,
        vary: tuple[str, ...] = (),
    ) -> None:
        """Count a request for the URL ``key``, planned as a miss, that ``tier`` (behind the
        store) answered from ``entry``, fresh for it (``_answers_from``), as a hit of that tier
        (``_count_hit``). The entry is kept in the store too (``_promote``) when ``_promotes``
        says so. The compiled hit path (``proxy/handler/hitpath/disk.c``, which counts a
        request it never planned) and the simulator's loop (``simulate.c``) mirror this, held
        equal by ``tests/test_disk_live.py`` and ``tests/test_tiers.py``."""
        self._count_hit(AS_MISS, from_disk=True)
        tier.answered(True)
        tier.served(key, entry.size, now)
        # Counted before it is kept: the promoted entry's own hits are those memory serves.
        self._served(key, entry, now)
        if self._promotes(key, entry.size, now):
            self._promote(entry, vary)

    def _promotes(self, key: str, size: int, now: float) -> bool:
        """Whether a hit on ``key`` (``size`` bytes) from a tier behind the store is kept in
        the store too: when the store's admission takes it, as it would the response fetched
        for that memory miss, and its ``promotion`` filter (a second hit within about the
        store's turnover) does; a small memory tier in front of a large disk is then not
        rewritten on every disk hit. Both are this process's own, as the store is: under a
        fleet's admission (``admission_elsewhere``) a hit from disk asks no other process."""
        admitted = self.admission.admit(key, size, now)
        # Asked whatever the admission said, as the admission is: each counts every sighting.
        again = self.promotion is None or self.promotion.admit(key, size, now)
        return admitted and again

    def _promote(self, entry: Entry, vary: tuple[str, ...] = ()) -> None:
        """Keep ``entry``, which a tier behind the store answered from, in the store too when
        it fits (counted among ``admissions``, as ``promoted``): a whole response when its URL
        has no variants here (they are selected on fields), a variant (``vary``: the names it
        is selected on) when its URL's variants here are selected on the same names, or it has
        none, and are not all taken."""
        url = url_of(entry.key) if vary else entry.key
        if not self.store.fits(entry.size):
            return
        if vary:
            known = url in self.variants
            if (known and not self.variants.selected_on(url, vary)) or self.variants.full(
                url, vary
            ):
                return
        elif url in self.variants:
            return
        tags = storable_tags(entry.headers)
        if tags is None:
            return
        entry.tags = tags
        try:
            self._put(entry)
        except ValueError:  # its fields take it past what an entry may be charged
            return
        if vary:
            self.variants.add(url, vary, entry.key)
        c = self.counters
        c.promoted += 1
        c.admissions += 1
        c.bytes_written += entry.size

    def hit_state(self) -> HitState:
        """The objects a compiled answerer of plain hits finds and counts hits in, as
        ``lookup`` does (``HitState``): the same objects for the engine's life but the
        admission's (``observe``, ``admit``, ``promotion_admit``) and the what-if's, which a
        reload may replace (the driver asks again then)."""
        observe = self.admission.observe if self.admission.observes else None
        store = self.store
        whatif = self.whatif
        return HitState(store.by_hash, self.variants.urls, store.index, self.counters, observe,
                        self._uncacheable, None if whatif is None else whatif.record,
                        0 if whatif is None else whatif.below,
                        0 if whatif is None else whatif.sample_key,
                        self.admission.admit,
                        None if self.promotion is None else self.promotion.admit,
                        self._promote)  # fmt: skip

    def _count_hit(self, before: int, *, from_disk: bool = False) -> None:
        """Count a hit, whichever tier and path answered it: the one place hits are counted
        (the compiled hit path mirrors it, from memory and from disk, held equal by
        ``tests/test_plain_hits.py`` and ``tests/test_disk_live.py``, as the compiled
        simulator's loop does, held equal by ``tests/test_tiers.py``).
        ``before``: how its request was counted until it was known to be a hit: as a request
        (``AS_REQUEST``, ``lookup``) or as a miss (``AS_MISS``, ``plan``)."""
        c = self.counters
        if before == AS_MISS:
            c.misses -= 1
        c.hits += 1
        c.hits_from_disk += from_disk

    def _from_store(self, key: str, entry: Entry, now: float) -> None:
        """Count ``entry``, stored under ``key``, as answering a request from the store."""
        self._served(key, entry, now)
        self.store.record_hit(entry)

    def _served(self, key: str, entry: Entry, now: float) -> None:
        """Count ``entry`` as answering a request for ``key`` from any tier."""
        if self.admission.observes:
            self.admission.observe(key, entry.size, now)
        if self.whatif is not None:  # a stored entry of the URL itself has its key's hash
            known = entry.key_hash if entry.key == key else 0
            self.whatif.record(key, entry.size, now, key_hash=known)
        c = self.counters
        c.hit_bytes += entry.size
        c.bytes_served += entry.size

    def slice_hit(
        self,
        request: RequestMeta,
        now: float,
        behind: Entry | None = None,
        tier: Tier | None = None,
    ) -> Hit | None:
        """The stored slice (``request``: the client's request, keyed as the slice), or the
        one ``tier`` behind the store was asked for (``behind``: what it found, then kept in
        the store too when ``_promotes`` says so), that answers fresh, counted as read and
        moved as a hit is; None when it does not."""
        entry = self.store.peek(request.key) if tier is None else behind
        hit = None if entry is None else self._answers_from(request, entry, now)
        if tier is not None:
            tier.answered(hit is not None)
        if hit is not None:
            self.counters.slice_hits += 1
            if behind is None:
                self.store.touch(hit.entry)
                self._from_store(request.key, hit.entry, now)
            else:
                self._served(request.key, hit.entry, now)
                if self._promotes(request.key, behind.size, now):
                    self._promote(behind)
        return hit

    def sliced(self, fetched: int, mismatched: bool, *, from_disk: bool = False) -> None:
        """A request ``plan`` counted as a miss was answered from slices, ``fetched`` of them
        from the origin: with none fetched it was a hit, from disk when the disk tier gave
        any of them (``from_disk``). ``mismatched``: a slice's validator differed from the
        others', and the object's stored slices were removed."""
        c = self.counters
        c.slice_fetches += fetched
        if mismatched:
            c.slice_mismatches += 1
        elif not fetched:
            self._count_hit(AS_MISS, from_disk=from_disk)

    def _private(self, request: RequestMeta, entry: Entry) -> bool:
        """``request`` carries a cookie and ``entry`` is not meant for shared caches."""
        return self._carries_cookie(request) and not rfc9111.meant_for_shared_caches(
            entry.headers, entry.directives
        )

    def plan(self, request: RequestMeta, now: float, *, content: bool = False) -> Action:
        """What the driver does with ``request`` (see the module's rules): with a tier behind
        the memory store, a request memory holds nothing for asks it first (``Behind``).
        ``content``: the request carries a body; a GET or HEAD with one passes the cache by
        (counted as a bypass): content in either has no defined meaning (RFC 9110 section
        9.3.1), and the cache keys on none."""
        if content and request.method in CACHEABLE_METHODS:
            self.counters.bypass += 1
            return FETCH_WITH_CONTENT
        action = self._plan(request, now)
        if (
            self.removals.behind
            and (type(action) is Fetch or type(action) is Refuse)
            and action.reason == FWD_URI_MISS
        ):
            return Behind(action)
        return action

    def found_behind(
        self,
        tier: Tier,
        request: RequestMeta,
        found: tuple[Entry, tuple[str, ...]] | None,
        now: float,
        then: Fetch | Refuse,
    ) -> Step:
        """What ``tier``'s answer to a ``Behind`` makes of ``request``: ``found``, the entry it
        holds for it and the names it was selected on (or None). A fresh one answers
        (``FromCache``, counted as the tier's hit, kept in memory when ``_promotes`` says so:
        ``_hit_behind``); a
        stale one is served stale, revalidated or refused as one in memory is
        (``_stale_behind``); anything else is ``then``, the tier's miss counted."""
        if found is not None:
            entry, vary = found
            hit = self._answers_from(request, entry, now)
            if hit is not None:
                self._hit_behind(tier, request.key, hit.entry, now, vary=vary)
                return FromCache(hit.entry, hit.age, behind=True)
            action = self._stale_behind(tier, request, entry, now, vary=vary)
            if action is not None:
                return action
        tier.answered(False)
        return then

    def _plan(self, request: RequestMeta, now: float) -> Action:
        """``plan``, memory alone."""
        found = self.lookup(request, now)
        if type(found) is Hit:
            return FromCache(found.entry, found.age)
        if type(found) is Bypass:
            return Fetch(found.reason, whole=False, collapse=False)
        headers = request.headers
        if type(found) is Miss and _none_of(headers, _PLAN_FIELDS):
            # What the rules below decide for a request without those fields, read at once.
            return self._plain_fetch(request, now)
        offline = rfc9111.only_if_cached(headers)
        if type(found) is Stale:
            action = self._on_stale(request, found, offline)
            if type(action) is FromCache:
                self.served_stale(found.entry)
            return action
        if offline:
            return Refuse(504, "only-if-cached: not in cache", FWD_URI_MISS)
        if found is PRIVATE_MISS or self._carries_cookie(request):
            # Answered for this user alone: never shared with another request's fetch.
            return FETCH_BYPASS
        # A precondition other than a validator check (If-Match, If-Unmodified-Since) is the
        # origin's to judge, and a request that forbids storing cannot be answered from what
        # the cache fetched for itself: such requests go as the client sent them.
        whole = not any(
            rfc9111.get_first(headers, name) for name in PRECONDITIONS
        ) and "no-store" not in rfc9111.request_directives(headers)
        return self._plain_fetch(request, now, whole=whole)

    def _on_stale(self, request: RequestMeta, found: Stale, offline: bool) -> Step:
        """What is done with a response that is not fresh for ``request``: served stale where
        the rules allow, revalidated with its validators, or (``offline``: only-if-cached) a
        504. Nothing is counted: the caller counts a stale answer (``served_stale``)."""
        entry = found.entry
        if found.serve_stale:
            return FromCache(entry, found.age, fresh=False, refresh=not offline)
        if offline:
            return Refuse(504, "only-if-cached: the stored response is stale", FWD_STALE)
        if request.method == "HEAD":
            return FETCH_STALE
        conditions = tuple(rfc9111.conditional_headers(entry.headers))
        return Revalidate(entry, found.age, conditions, self._may_serve_on_error(found, request))

    def _stale_behind(
        self,
        tier: Tier,
        request: RequestMeta,
        entry: Entry,
        now: float,
        *,
        vary: tuple[str, ...] = (),
    ) -> Step | None:
        """What is done with ``entry``, which ``tier`` behind the store holds for ``request``
        and which does not answer it fresh (``_answers_from``), when it is of use: served stale
        where the rules allow, revalidated with its validators, or kept to answer if the
        origin fails (RFC 9111 section 4, 5861). It is then kept in the store (``_promote``),
        a stored response like any other, and counted as the tier's (``stale_from_disk``,
        ``revalidated_from_disk``). None, and the request is fetched as a miss (the tier
        answered nothing), when it is of no use so (no validator, no stale answer allowed),
        the store cannot keep it, or it answers no one (private to another user)."""
        if request.method not in CACHEABLE_METHODS or self._private(request, entry):
            return None
        age = entry.age(now)
        stale = _stale(entry, age, self._client_directives(request, entry, age, now,
                                                           revalidating=True))  # fmt: skip
        action = self._on_stale(request, stale, rfc9111.only_if_cached(request.headers))
        if type(action) is Refuse:  # a 504, as for a stale response in memory: nothing kept
            tier.answered(False)
            return action
        stale_answer = type(action) is FromCache
        if not stale_answer and not (
            type(action) is Revalidate and (action.conditions or action.on_error)
        ):
            return None  # a plain refetch (a HEAD's, or one with no validator)
        # Kept whatever _promotes would say: not a hit but a response memory must hold, for
        # its revalidation to refresh or its stale answer to be served from.
        self._promote(entry, vary)
        if self.store.peek(entry.key) is not entry:
            return None
        # The tier answered when its record did, stale; a revalidation is the origin's answer.
        tier.answered(stale_answer)
        if stale_answer:
            self.served_stale(entry)
            self.counters.stale_from_disk += 1
        else:
            self.counters.revalidated_from_disk += 1
        return action

    def uncacheable_until(self, key: str) -> float | None:
        """Until when ``key``'s requests go straight to the origin (hit-for-miss), if it was
        uncacheable a moment ago; its place among those remembered is unchanged."""
        remembered = self._uncacheable.peek(key)
        return None if remembered is None else remembered[0]

    def _plain_fetch(self, request: RequestMeta, now: float, *, whole: bool = True) -> Fetch:
        """The fetch of a miss that may be shared, unless its URL was uncacheable a moment ago
        (hit-for-miss); ``whole`` when the request's fields allow it."""
        remembered = self._uncacheable.get(request.key)
        if remembered is not None:
            if now < remembered[0]:
                self.counters.hit_for_miss += 1
                return FETCH_BYPASS
            del self._uncacheable[request.key]
        return FETCH_WHOLE if whole and request.method == "GET" else FETCH_AS_ASKED

    def _carries_cookie(self, request: RequestMeta) -> bool:
        """Whether ``request`` sends a cookie that is not ignored (see the module's rules)."""
        return bool(request.headers) and rfc9111.carries_cookie(
            request.headers, self.ignore_cookies
        )

    def answer(
        self, request: RequestMeta, status: int, headers: Headers, length: int | None
    ) -> Answer:
        """How a whole ``status`` response of ``length`` body bytes answers ``request``: 304
        when a client conditional matches its validators (RFC 9110 section 13.1), 206 or 416
        for a single byte range of a 200 (section 14; not when the length is unknown, which
        RFC 9110 allows: Range is optional), else the response itself."""
        asked = request.headers
        if status != 200 or _none_of(asked, ANSWERED_FIELDS):
            return Answer(status)
        conditional = any(rfc9111.get_first(asked, name) is not None for name in CONDITIONALS)
        if conditional and rfc9110.not_modified(asked, headers):
            self.counters.not_modified_answers += 1
            return Answer(304)
        if length is None or request.method != "GET" or rfc9111.get_first(asked, "range") is None:
            return Answer(status)
        wanted = rfc9110.byte_range(asked, headers, length)
        if wanted is None:
            return Answer(status)
        self.counters.range_answers += 1
        if wanted is False:
            return Answer(416)
        return Answer(206, *wanted)

    # Responses

    def served_stale(self, entry: Entry, *, on_error: str = "") -> None:
        """The driver answered with a stale ``entry`` (allowed by ``Stale.serve_stale``, or,
        the origin failing, by what ``Revalidate.on_error`` names: ``on_error``)."""
        c = self.counters
        c.stale_served += 1
        if on_error == GRACE:
            c.served_in_grace += 1
        c.hit_bytes += entry.size
        c.bytes_served += entry.size
        self.store.record_hit(entry)

    def on_unsafe_response(self, request: RequestMeta, status: int, now: float) -> int:
        """RFC 9111 section 4.4: a successful unsafe method invalidates its URL (at ``now``:
        a GET fetched since before it is not stored after it)."""
        if not rfc9111.invalidates(request.method, status):
            return 0
        self.recent_purges.url(request.key, now)
        return self.removals.invalidate(request.key)

    def stats(self) -> dict[str, int | float]:
        """Every metric at this instant (see ``proxy.core.stats.METRICS``)."""
        admission = self.admission
        return snapshot(
            self.counters, self.store, admission.filter_stats(), admission.policy_stats()
        )

    # Internals

    def _may_serve_on_error(self, stale: Stale, request: RequestMeta) -> str:
        """What lets ``stale`` answer ``request`` if the origin fails (``Revalidate``)."""
        entry = stale.entry
        req = client_leeway(entry, rfc9111.request_directives(request.headers))
        rules = (entry.lifetime, stale.age, req, entry.directives)
        if rfc9111.may_serve_stale(*rules, origin_failed=True):
            return STALE_IF_ERROR
        if self.grace and rfc9111.may_serve_stale(*rules, origin_failed=True, grace=self.grace):
            return GRACE
        return ""


def _directives(request: RequestMeta) -> rfc9111.Directives:
    """The cache directives of ``request``."""
    return rfc9111.request_directives(request.headers) if request.headers else _NO_DIRECTIVES


def _stale(entry: Entry, age: float, req: rfc9111.Directives) -> Stale:
    """``entry``, not fresh at ``age`` for a request of directives ``req``, and whether it may
    be served stale (RFC 9111 section 4.2.4, RFC 5861): for the store's and a tier's alike."""
    req = client_leeway(entry, req)
    return Stale(entry, age, rfc9111.may_serve_stale(entry.lifetime, age, req, entry.directives))


# What a client may ask of a stale response for itself (RFC 9111 section 5.2.1.2, RFC 5861
# section 4): the leeway an operator's soft purge takes away.
_CLIENT_LEEWAY = frozenset({"max-stale", "stale-if-error"})


def client_leeway(entry: Entry, req: rfc9111.Directives) -> rfc9111.Directives:
    """The request directives ``req`` that judge serving ``entry`` stale: without the
    client's own leeway (``max-stale``, ``stale-if-error``) when an operator's soft purge made
    it stale, which a client must not undo."""
    if not entry.soft_purged or _CLIENT_LEEWAY.isdisjoint(req):
        return req
    return {k: v for k, v in req.items() if k not in _CLIENT_LEEWAY}


def _none_of(headers: rfc9111.Headers, names: frozenset[str]) -> bool:
    """Whether ``headers`` hold none of the lower-case ``names``: looked up when indexed."""
    if type(headers) is rfc9111.Fields:
        return names.isdisjoint(headers.by_name)
    return not any(k.lower() in names for k, _ in headers)


def _second(item: tuple[float, int]) -> int:
    return item[1]
