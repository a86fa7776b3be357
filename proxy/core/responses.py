"""What becomes of an origin response: decided from its head (kept, or not stored and why),
stored when its body ends whole, refreshed by a 304, and what that removes (through
``proxy.core.invalidation``). The part of ``CacheEngine`` that its module docstring's rules on
responses describe.
"""

from __future__ import annotations

from typing import NamedTuple

from proxy.core import rfc9111
from proxy.core.admission import AdmissionPolicy
from proxy.core.events import (
    ASK_ADMISSION,
    BEYOND_MEMORY,
    COLLAPSED,
    CUT_SHORT,
    FIRST_SIGHTING,
    NEVER_FRESH,
    PURGED_IN_FLIGHT,
    TOO_LARGE,
    TOO_MANY_TAGS,
    TOO_MANY_VARIANTS,
    AskAdmission,
    Keep,
    NotStored,
    Outcome,
    RequestMeta,
    RequestSample,
    ResponseMeta,
    Store,
)
from proxy.core.invalidation import Removals
from proxy.core.keys import url_of
from proxy.core.lru import ChargedLRU
from proxy.core.rfc9110 import Headers, get_first
from proxy.core.slices import SliceIndex
from proxy.core.stats import Counters
from proxy.core.store import CacheStore, Entry
from proxy.core.tags import TagIndex, response_tags, storable_tags
from proxy.core.tiers import SUPERSEDED, UNSTORABLE, VARIES, Tier, own_record
from proxy.core.ttl_rules import TtlRules, rule_response
from proxy.core.variants import Variants, variant_key

# Bytes of URLs remembered as uncacheable (hit-for-miss); least recently used forgotten past
# this, so a flood of long uncacheable URLs cannot grow the process.
HIT_FOR_MISS_BYTES = 4 << 20
# What one remembered URL costs beyond its characters (dict slot, float, tuple).
_REMEMBERED_OVERHEAD = 160


# Cacheable responses that were not stored: requests the what-if's ghosts take, as they take
# those stored (``proxy.core.whatif``).
_CACHEABLE = (FIRST_SIGHTING, TOO_LARGE, COLLAPSED, TOO_MANY_VARIANTS)

# Memory's decisions that no tier behind it is offered: a response no purge could reach by
# every tag, one that could never answer fresh (its record dropped at its first read), one
# past the largest object (no copy is kept of its body), one a purge made since its request
# went out reaches.
_NO_TIER = (TOO_MANY_TAGS, NEVER_FRESH, TOO_LARGE, PURGED_IN_FLIGHT)

# Reasons a response may not be stored that belong to the request, not to the URL.
_REQUEST_REASONS = frozenset({"cookie", "authorization", "request-no-store", "method"})


class Decided(NamedTuple):
    """The engine's decision at a fetched response's head: whether memory keeps its body
    (``memory``) and which tiers behind the store write it (``tiers``, each having said it
    takes it), both carried out by ``finish`` once the body ends whole."""

    memory: Keep | NotStored
    response: ResponseMeta
    tiers: tuple[Tier, ...] = ()


def response_meta(
    request: RequestMeta,
    status: int,
    headers: Headers,
    request_time: float,
    response_time: float,
    *,
    allow_set_cookie: bool = False,
    ignored_cookies: tuple[str, ...] = (),
    payload: object = None,
    rules: TtlRules | None = None,
) -> ResponseMeta:
    """The engine's view of an origin response, by RFC 9111 and the operator's TTL ``rules``:
    storable or why not, lifetime, the age it already had when it arrived, and what it varies
    on. Its ``headers`` are what may be stored and shared: never a ``Set-Cookie``, whatever
    ``allow_set_cookie`` says (a cookie set for one client is never replayed to another)."""
    fields = headers if type(headers) is rfc9111.Fields else rfc9111.Fields(headers)
    ok, reason, lifetime, initial_age, vary, directives = rfc9111.response_rules(
        request.method, status, request.headers, fields, request_time, response_time,
        allow_set_cookie=allow_set_cookie, ignored_cookies=ignored_cookies,
    )  # fmt: skip
    rule = rules.rule_for(request.key, status) if rules else None
    by_rule = False
    if rule is not None:
        # A request a user is known by (an Authorization, a cookie not ignored) never has
        # directives set aside: RFC 9111's exceptions for shared responses (s-maxage,
        # must-revalidate) would then store what its private or no-store kept to one user.
        if not ok and rule.override and not _personal(request, ignored_cookies):
            ok, reason = rfc9111.storable(
                request.method, status, request.headers, fields,
                allow_set_cookie=allow_set_cookie, ignored_cookies=ignored_cookies,
                overridden=rule.override,
            )  # fmt: skip
        ruled = rule_response(rule, status, fields, ok, reason, lifetime, directives)
        ok, reason, lifetime = ruled.storable, ruled.reason, ruled.lifetime
        directives, by_rule = ruled.directives, ruled.by_rule
    if not rfc9111.PER_CLIENT_FIELDS.isdisjoint(fields.by_name):
        headers = shared_fields(headers)
    return ResponseMeta(
        cacheable=ok,
        lifetime=lifetime,
        initial_age=initial_age,
        headers=tuple(headers),
        vary=vary,
        reason=reason,
        payload=payload,
        status=status,
        directives=directives,
        requested_at=request_time,
        by_rule=by_rule,
    )


def _personal(request: RequestMeta, ignored_cookies: tuple[str, ...]) -> bool:
    """Whether ``request`` says who sent it: an Authorization, or a cookie not ignored."""
    return bool(request.headers) and (
        get_first(request.headers, "authorization") is not None
        or rfc9111.carries_cookie(request.headers, ignored_cookies)
    )


def shared_fields(headers: Headers) -> list[tuple[str, str]]:
    """``headers`` as a stored response may hold them for every client: without the cookies
    (``rfc9111.PER_CLIENT_FIELDS``) set for one client alone (a fetched response's, or a
    304's)."""
    return [h for h in headers if h[0].lower() not in rfc9111.PER_CLIENT_FIELDS]


def client_fields(headers: Headers) -> tuple[tuple[str, str], ...]:
    """What ``shared_fields`` leaves out: the fields for the one client ``headers`` answer."""
    return tuple(h for h in headers if h[0].lower() in rfc9111.PER_CLIENT_FIELDS)


def _directives(response: ResponseMeta) -> rfc9111.Directives:
    if response.directives is not None:
        return response.directives
    return rfc9111.response_directives(response.headers) if response.headers else {}


class ResponseDecisions:
    """``CacheEngine``'s decisions on responses, over the state the engine holds; what they
    remove goes through its removals (``Removals``)."""

    removals: Removals
    store: CacheStore
    admission: AdmissionPolicy
    counters: Counters
    variants: Variants
    tags: TagIndex
    slices: SliceIndex
    hit_for_miss: float
    admission_elsewhere: bool
    ttl_rules: TtlRules  # the operator's (``[[ttl]]``)
    # The largest body the cache keeps in any tier: memory's own largest (``store.fits``), or
    # past it where memory is a worker's share and the tier behind is the machine's.
    max_object_bytes: int

    def fits(self, size: int) -> bool:
        """Whether a body of ``size`` bytes is one the cache keeps (in some tier)."""
        return size <= self.max_object_bytes

    grace: float
    ignore_cookies: tuple[str, ...]
    entry_type: type[Entry]
    whatif: RequestSample | None
    # URL -> (until when it goes straight to the origin, bytes it is charged)
    _uncacheable: ChargedLRU[str, tuple[float, int]]

    def on_response_head(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        now: float,
        *,
        admitted: bool | None = None,
        whole: bool = True,
    ) -> Decided | AskAdmission:
        """Decide from the head of a response fetched from the origin whether memory will
        keep its body and which tiers behind the store write it (``length``: its
        Content-Length, None when unknown). Only a response fetched for the cache
        (``whole``, ``Fetch.whole``) is offered to the tiers: one fetched as the client asked
        (a cookie's, a hit-for-miss pass, a precondition's) answers a request no tier is
        read for, and would only make the device write it again each time.
        ``admitted``: the answer of the backend that decides admission when the engine's
        own policy does not (``admission_elsewhere``), which the engine asks for
        (``ASK_ADMISSION``) when it would consult a policy."""
        if admitted is None and self.admission_elsewhere and self._asks(request, response, length):
            return ASK_ADMISSION
        self.counters.origin_fetches += 1
        memory = self._decide(request, response, length, now, admitted, True)
        tiers = self._offer(request, response, length, memory, now) if whole else ()
        return Decided(memory, response, tiers)

    def finish(
        self,
        request: RequestMeta,
        decided: Decided,
        size: int,
        now: float,
        *,
        payload: object = None,
        complete: bool = True,
        served: bool = True,
    ) -> Outcome:
        """The body of a decided response ended after ``size`` bytes (``complete=False``: cut
        short; ``served=False``: no client got it, as in a background refresh). A body that
        ended whole is stored when memory keeps it and fits, with ``payload`` (the driver's
        own: the store never reads it), and written, after, to the tiers that took it; a
        driver that kept no copy passes None, and no tier is written."""
        c = self.counters
        c.origin_bytes += size
        if served:
            c.bytes_served += size
        if not complete:
            c.cut_short += 1
            return CUT_SHORT
        outcome = self._settle(request, decided.memory, size, now, payload)
        if decided.tiers and payload is not None:
            self._write_behind(request, decided.response, decided.tiers, payload, size, now)
        return outcome

    def on_response(
        self, request: RequestMeta, response: ResponseMeta, size: int, now: float
    ) -> Outcome:
        """``on_response_head`` and ``finish`` for a fetched response whose whole body
        (``size`` bytes, ``response.payload``) is in hand: the simulator's path."""
        c = self.counters
        c.origin_fetches += 1
        c.origin_bytes += size
        c.bytes_served += size
        decision = self._decide(request, response, size, now, None, True)
        return self._in_hand(request, response, decision, size, now, response.payload)

    def _in_hand(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        decision: Keep | NotStored,
        size: int,
        now: float,
        payload: object,
    ) -> Outcome:
        """``finish`` of a decided response whose whole body is in hand: offered to the tiers,
        stored in memory, written to the tiers that took it."""
        if not self.removals.behind:
            return self._settle(request, decision, size, now, payload)
        tiers = self._offer(request, response, size, decision, now)
        outcome = self._settle(request, decision, size, now, payload)
        self._write_behind(request, response, tiers, payload, size, now)
        return outcome

    def _offer(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        memory: Keep | NotStored,
        now: float,
    ) -> tuple[Tier, ...]:
        """The tiers behind the store that take a fetched response, memory having decided
        ``memory`` (``proxy.core.tiers``: what no tier is offered)."""
        if not self.removals.behind or not response.cacheable or memory in _NO_TIER:
            return ()
        kept = type(memory) is Keep
        return tuple(
            tier
            for tier in self.removals.behind
            if tier.takes(request, response, length, kept, now)
        )

    def _write_behind(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        tiers: tuple[Tier, ...],
        payload: object,
        size: int,
        now: float,
    ) -> None:
        """Write a body that ended whole to the ``tiers`` that took it at its head: not one
        past the store's largest object, nor one a purge made since its request went out
        reaches. Written after the store took it: what the engine forgot as it did (the URL's
        old variants when the selecting fields change) is forgotten in every tier, and must
        not take this record with it."""
        if not tiers or not self.fits(size) or self.purged_since(request.key, response):
            return
        for tier in tiers:
            tier.put(request, response, payload, size, now)

    def on_shared(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        size: int,
        now: float,
        *,
        payload: object,
        admitted: bool | None = None,
    ) -> Outcome | AskAdmission:
        """A response another request fetched (single flight) answered this one: a sighting
        of its URL, not an origin fetch. It is stored (with ``payload``) if this sighting
        admits it and no other request stored it already, and offered to the tiers as a
        sighting too: a tier that did not take it at its fetch (its admission, or memory's
        for a tier that follows memory) may take it now; one that holds it takes it no
        more. ``admitted``: as for ``on_response_head``."""
        if admitted is None and self.admission_elsewhere and self._asks(request, response, size):
            return ASK_ADMISSION
        c = self.counters
        c.collapsed += 1
        c.bytes_served += size
        decision = self._decide(request, response, size, now, admitted, False)
        return self._in_hand(request, response, decision, size, now, payload)

    def _decide(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        now: float,
        admitted: bool | None,
        known: bool,
    ) -> Keep | NotStored:
        """Keep or not, by the HTTP rules, the size and the admission policy; a URL already
        stored is kept again (a refresh) when ``known`` says so, else it is ``COLLAPSED``.
        A response fetched for the request (``known``) is the newest for its key: no tier
        answers with an older copy again (RFC 9111 section 4), so the tiers behind the store
        forget theirs (they write this one if they take it) and the store drops its own when
        this one will not replace it."""
        c = self.counters
        if not response.cacheable:
            c.uncacheable += 1
            self._refused(request, response, now)
            return NotStored(response.reason or "uncacheable")
        if known and self.purged_since(request.key, response):
            # A purge made since its request went out reaches it: no tier stores it, and its
            # Cache-Status says so (one made before its body ends is caught as it is stored,
            # ``_settle``). What the tiers hold of its key is either older than the purge, and
            # went with it, or stored since, and newer than this: both are left as they are.
            c.purged_in_flight += 1
            return PURGED_IN_FLIGHT
        if known:
            self._varies_now(request.key, response.vary)
        key, stored = self._storage_key(request, response)
        if known:
            for tier in self.removals.behind:
                tier.forget(key, SUPERSEDED)
        # A response without fields is the simulator's (a trace's sizes alone): nothing to
        # judge. With a grace, one may yet answer while the origin fails: it is written.
        if (
            response.headers
            and not self.grace
            and response.lifetime <= 0
            and rfc9111.never_fresh(response.headers, _directives(response))
        ):
            c.uncacheable += 1
            self._pass_for_a_while(request, now)
            return self._superseded(key, known, NEVER_FRESH)
        tags = storable_tags(response.headers) if response.headers else ()
        if tags is None:  # a purge could not reach it by every tag it carries
            c.uncacheable += 1
            self._pass_for_a_while(request, now)
            return self._superseded(key, known, TOO_MANY_TAGS)
        if self.admission.observes:
            self.admission.observe(request.key, length or 0, now)
        if length is not None and not self.fits(length):
            c.too_large += 1
            self._pass_for_a_while(request, now)
            return self._superseded(key, known, TOO_LARGE)
        if (
            response.vary
            and key not in self.store
            and self.variants.full(request.key, response.vary)
        ):
            c.too_many_variants += 1
            return TOO_MANY_VARIANTS
        if stored:
            return Keep(key, response, tags) if known else COLLAPSED
        if admitted is None:
            admitted = self.admission.admit(request.key, length or 0, now)
        if not admitted:
            return FIRST_SIGHTING
        return Keep(key, response, tags)

    def _varies_now(self, url: str, vary: tuple[str, ...]) -> None:
        """A response fetched for ``url`` varies on ``vary`` (none: it does not vary): what is
        stored of the URL under other selecting fields, or unvaried, is unreachable now,
        whether or not this response is kept (every tier)."""
        if vary:
            if self.variants.selected_on(url, vary):
                return
            if url in self.variants or self.store.peek(url) is not None:
                self.removals.invalidate(url, VARIES)
            else:  # a tier's variants are selected on names it checks as it writes one
                for tier in self.removals.behind:
                    tier.forget(own_record(url), VARIES)
        elif url in self.variants:
            self.removals.invalidate(url, VARIES)  # a tier's anchor goes with the URL's own record

    def _superseded(self, key: str, known: bool, why: NotStored) -> NotStored:
        """``why`` a response fetched (``known``) for ``key`` is not kept: the store's older
        copy of ``key`` goes too."""
        if known:
            self.removals.drop_from_memory(key)
        return why

    def _settle(
        self,
        request: RequestMeta,
        decision: Keep | NotStored,
        size: int,
        now: float,
        payload: object,
    ) -> Outcome:
        """Store a kept body of ``size`` bytes, or count why it was not."""
        if self.whatif is not None and (type(decision) is Keep or decision in _CACHEABLE):
            self.whatif.record(request.key, size, now, missed=True)
        c = self.counters
        if type(decision) is Keep and self.purged_since(
            decision.key, decision.response, decision.tags
        ):
            c.purged_in_flight += 1
            return PURGED_IN_FLIGHT
        if type(decision) is NotStored:
            if decision is FIRST_SIGHTING:
                c.rejected_first_sighting += 1
                c.bytes_not_written += size
            return decision
        if not self.fits(size):
            c.too_large += 1
            self._pass_for_a_while(request, now)
            self.removals.drop_from_memory(
                decision.key
            )  # superseded by this response, which is not kept
            return TOO_LARGE
        if not self.store.fits(size):  # the cache's, but past this memory tier's largest
            c.beyond_memory += 1
            self.removals.drop_from_memory(decision.key)
            return BEYOND_MEMORY
        response = decision.response
        url = request.key
        # What was stored under other selecting fields (or none) is unreachable now; a tier's
        # variants under the same ones stay (it checks the names as it writes one).
        self._varies_now(url, response.vary)
        if response.vary:
            self.variants.add(url, response.vary, decision.key)
        entry = self.entry_type(
            decision.key,
            size,
            now,
            response.lifetime,
            response.initial_age,
            response.headers,
            _directives(response),
            payload,
            status=response.status,
        )
        entry.tags = decision.tags
        try:
            evicted = self._put(entry)
        except ValueError:  # the body fits, but with headers past the overhead estimate it does not
            c.too_large += 1
            self.removals.drop_from_memory(decision.key)
            return TOO_LARGE
        c.admissions += 1
        c.bytes_written += size
        return Store(entry, tuple(evicted))

    def purged_since(
        self, key: str, response: ResponseMeta, tags: tuple[str, ...] | None = None
    ) -> bool:
        """Whether a purge made since ``response``'s request went out reaches it, stored
        under ``key`` (with ``tags``, when known: else read from its fields): then no tier
        may store it (``RecentPurges``)."""
        if not self.recent_purges:
            return False
        if tags is None:
            tags = (storable_tags(response.headers) if response.headers else ()) or ()
        return self.recent_purges.reach(key, tags, response.requested_at)

    def _asks(self, request: RequestMeta, response: ResponseMeta, length: int | None) -> bool:
        """Whether deciding this response would consult the admission policy: what a backend
        the driver awaits is asked first (``ASK_ADMISSION``), and only then."""
        if not response.cacheable or (length is not None and not self.fits(length)):
            return False
        return not self._storage_key(request, response)[1]

    def on_not_modified(
        self,
        entry: Entry,
        headers_304: Headers,
        request_time: float,
        now: float,
        *,
        served: bool = True,
    ) -> Entry:
        """A 304 answered a revalidation of ``entry``: refresh it (RFC 9111 section 4.3.4),
        keeping its status, re-charge its size for the new headers and, when a client gets it,
        count the stored body as served from cache. Refreshed into a response a shared cache
        may not store, it is removed from every tier; otherwise each tier behind the store
        takes the refreshed fields and times for its copy (``Tier.refreshed``), whether or not
        memory still holds it. A purge made since the revalidation went out stands: then the
        304 refreshes nothing, in any tier (``purged_in_flight``), though one that makes the
        entry a response a shared cache may not store still removes it (a soft-purged entry
        would otherwise be served stale)."""
        c = self.counters
        c.revalidated += 1
        c.origin_fetches += 1
        if served:
            c.hit_bytes += entry.size
            c.bytes_served += entry.size
        if self._reached_since(entry, headers_304, request_time):
            c.purged_in_flight += 1
            updated = rfc9111.updated_by_304(entry.headers, shared_fields(headers_304))
            if not self._stores(entry.key, entry.status, tuple(updated)):
                self.removals.forget(entry.key, UNSTORABLE)
            return entry
        if served:
            self.store.record_hit(entry)
        self._refresh(entry, headers_304, request_time, now)
        return entry

    def _reached_since(self, entry: Entry, headers_304: Headers, request_time: float) -> bool:
        """Whether a purge made since a 304's request went out (at ``request_time``) reaches
        ``entry``: by its key, a tag it carries, or a tag the 304 gives it."""
        purges = self.recent_purges
        if not purges:
            return False
        tags = (*entry.tags, *response_tags(headers_304))
        return purges.reach(entry.key, tags, request_time)

    def _refresh(self, entry: Entry, headers_304: Headers, request_time: float, now: float) -> None:
        """``on_not_modified``'s refresh of ``entry``, in the store and every tier."""
        validated = tuple(rfc9111.conditional_headers(entry.headers))
        headers = tuple(rfc9111.updated_by_304(entry.headers, shared_fields(headers_304)))
        if rfc9111.vary_names(headers) != rfc9111.vary_names(entry.headers):
            # It now varies otherwise (RFC 9110 section 15.4.5: a 304 carries the Vary a 200
            # would): stored under a key chosen by the old fields, it would answer requests
            # that select other variants. What is stored of the URL goes, from every tier.
            self.removals.invalidate(url_of(entry.key), VARIES)
            return
        entry.headers = headers
        entry.directives = rfc9111.response_directives(headers)
        entry.lifetime = rfc9111.freshness_lifetime(entry.status, headers, now)
        rule = self.ttl_rules.rule_for(entry.key, entry.status) if self.ttl_rules else None
        if rule is not None:  # refreshed as it was stored: by its rule too
            ruled = rule_response(rule, entry.status, headers, True, "", entry.lifetime,
                                    entry.directives)  # fmt: skip
            entry.lifetime, entry.directives = ruled.lifetime, ruled.directives
        entry.initial_age = rfc9111.current_age(headers_304, request_time, now, now)
        entry.stored_at = now
        entry.soft_purged = False
        self.tags.forget((entry,))
        # The request that revalidated is not the rules' to judge here: only the response's.
        overridden = rule.override if rule is not None else frozenset()
        may_store = self._stores(entry.key, entry.status, headers, overridden)
        tags = storable_tags(headers) if may_store else None
        if tags is None:  # now private, no-store, or past the tag limit: kept nowhere
            entry.tags = ()
            self.removals.forget(entry.key, UNSTORABLE)
        else:
            entry.tags = tags
            if self.store.peek(entry.key) is entry:
                self.tags.add(entry)
                self.removals.left_memory(self.store.recharge(entry))
            # Memory may have evicted it while it was revalidated, or never held it (a disk
            # record too large for memory), and another worker may have written a newer
            # record: a tier's copy is refreshed only if it carries the validators the 304
            # answered, so neither a newer response nor one a purge reached since is.
            held = self.store.peek(entry.key) is entry
            for tier in self.removals.behind:
                tier.refreshed(entry, validated, held)

    def _refused(self, request: RequestMeta, response: ResponseMeta, now: float) -> None:
        """An uncacheable response: remember it (hit-for-miss), and let it supersede what was
        stored for its URL, in every tier, unless it is a server error (section 4.3.3 lets the cache
        keep the stored response then), it answers the request's own Range or preconditions
        (``ANSWERS_ITS_REQUEST``), the request alone made it uncacheable, or the request
        sent credentials (``Authorization``, a cookie not ignored): its answer may be for that
        user alone, and a client must not empty what every client shares by sending a cookie.
        (Section 4.4 requires no removal here; the stored copy is still the URL's newest public
        answer, served within its own freshness.)"""
        if response.status == 304 and not (
            request.method != "GET"
            or response.reason in _REQUEST_REASONS
            or self._credentialed(request)
        ):
            self._validated_elsewhere(request, response, now)
            return
        if (
            response.status >= 500
            or response.status in rfc9111.ANSWERS_ITS_REQUEST
            or request.method != "GET"
            or response.reason in _REQUEST_REASONS
            or self._credentialed(request)
        ):
            return
        self._pass_for_a_while(request, now)
        # Every variant goes, not only the one the request selects: the response may have
        # stopped varying, and a tier behind the store may hold variants the store does not
        # know. The safe side of a response that may not be kept.
        self.removals.invalidate(request.key, SUPERSEDED)

    def _validated_elsewhere(
        self, request: RequestMeta, response: ResponseMeta, now: float
    ) -> None:
        """A 304 that answered a client's own conditional, asked of the origin as it was sent
        (RFC 9111 section 4.3.4 has it update the stored responses it validates): the one the
        request selects, when it carries the validator the 304 names, is refreshed as a
        revalidation's is (fields, times, storability and Vary, in every tier). When none is
        selected and the 304 makes the representation one a shared cache may not store
        (``private``, ``no-store``), what is stored of the URL goes from every tier: a copy of
        it may lie in one."""
        headers = response.headers
        entry = self.store.peek(self.variants.key(request))
        if entry is not None and _names_it(headers, entry.headers):
            if not self._reached_since(entry, headers, response.requested_at):
                self._refresh(entry, headers, response.requested_at, now)
                return
            self.counters.purged_in_flight += 1  # a purge since it went out stands
        if not self._stores(request.key, 200, headers):
            self.removals.invalidate(request.key, UNSTORABLE)

    def _stores(
        self, key: str, status: int, headers: Headers, overridden: frozenset[str] | None = None
    ) -> bool:
        """Whether a response of ``status`` with ``headers`` for ``key`` is one the cache may
        store, by the response's rules alone (``rfc9111.storable``) and the directives its
        TTL rule sets aside (``overridden``; None: its rule's): the request that brought it,
        a revalidation or a client's own conditional, is not judged here."""
        if overridden is None:
            rule = self.ttl_rules.rule_for(key, status) if self.ttl_rules else None
            overridden = rule.override if rule is not None else frozenset()
        return rfc9111.storable("GET", status, (), headers, allow_set_cookie=True,
                                overridden=overridden)[0]  # fmt: skip

    def _credentialed(self, request: RequestMeta) -> bool:
        return _personal(request, self.ignore_cookies)

    def _put(self, entry: Entry) -> list[Entry]:
        """Store ``entry`` (its tags set), replacing any entry of its key; what it evicted
        has left the variant and tag indexes. ValueError as ``CacheStore.put``."""
        # The entry it replaces leaves the tag index; with no tags held, there is none to look up.
        replaced = self.store.peek(entry.key) if self.tags.keys else None
        evicted = self.store.put(entry)
        if replaced is not None:
            self.tags.forget((replaced,))
        self.tags.add(entry)
        self.slices.add(entry.key)
        self.removals.left_memory(evicted)
        return evicted

    def part_refused(self, request: RequestMeta, response: ResponseMeta, now: float) -> None:
        """A part of ``request``'s object (a slice, ``response``) may not be stored: unless
        the request alone made it so, the object's URL goes straight to the origin for
        ``hit_for_miss`` seconds, as a whole uncacheable response's does."""
        if response.reason not in _REQUEST_REASONS:
            self._pass_for_a_while(request, now)

    def _pass_for_a_while(self, request: RequestMeta, now: float) -> None:
        if self.hit_for_miss > 0:
            url = request.key
            self._uncacheable[url] = (now + self.hit_for_miss, len(url) + _REMEMBERED_OVERHEAD)

    def _storage_key(self, request: RequestMeta, response: ResponseMeta) -> tuple[str, bool]:
        """The key a response is stored under (its variant, if it varies), and whether its URL
        is already known (stored, or has variants): a known URL skips admission."""
        url = request.key
        key = url
        if response.vary:
            key = variant_key(url, response.vary, request.headers)
        return key, key in self.store or url in self.variants


def _names_it(headers_304: Headers, stored: Headers) -> bool:
    """Whether a 304 to a client's own conditional selects ``stored`` for update: it names a
    validator of its own (the validators the client sent need not be the stored response's)
    and that validator selects it (``rfc9111.validates``)."""
    named = get_first(headers_304, "ETag") or get_first(headers_304, "Last-Modified")
    return named is not None and rfc9111.validates(stored, headers_304)
