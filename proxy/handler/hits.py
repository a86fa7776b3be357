"""Plain requests answered as soon as they are parsed: the Python answerer and its compiled
common case, which give the same bytes and counts as the request handler.

* Plain: GET or HEAD, HTTP/1.1 keep-alive, an origin-form target and fields within the limits,
  a routed Host, no body, no precondition (a validator or a Range is answered from the stored
  response: 304, 206, 416). Anything else is declined, with nothing counted, and the request
  handler answers it.
* A plain request is routed and planned once (``CacheEngine.plan``, which counts it). A fresh
  hit is delivered at once; anything else (a miss, a stale entry, a record to read off the
  event loop) goes to the lane as planned (``Planned``), and the handler carries out that
  plan: the request is neither routed nor planned, nor counted, again.
* A URL memory holds nothing for (``Behind``) is asked of its disk record when the page cache
  holds it and it is short enough to read on the event loop, and judged as the handler judges
  it (``CacheEngine.found_behind``: a hit from disk, kept in memory too when
  ``CacheEngine._promotes`` says so).
* A hit is delivered with the head every answer from a response in hand has
  (``proxy.handler.answers.delivered``). The part every plain hit on an entry writes the same
  is rendered once per stored response and kept beside it (``ServedEntry``), for as long as
  its fields are the ones it was rendered from; each hit adds only its ``Cache-Status`` ttl,
  ``Age`` and, where the origin sent none, ``Date``.
* The compiled answerer (``plain_hits``, ``proxy/handler/hitpath/``) finds and counts a fresh
  hit, in memory as ``plan`` does and on disk as ``found_behind`` does (kept in memory only
  when the store's admission and its promotion filter take it: ``HitState``), and writes
  the bytes ``answer`` would; what it declines it has counted nothing for, and ``answer``
  decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.config.logs import HTTP_ERRORS
from proxy.core._native import hash64
from proxy.core.cache_status import DISK, HIT_TTL, hit, ttl_of
from proxy.core.cached import hit_head, render_fields
from proxy.core.engine import CacheEngine
from proxy.core.events import (
    ANSWERED_FIELDS,
    NOT_FAST,
    RULE_FIELDS,
    Action,
    Behind,
    FromCache,
    RequestMeta,
)
from proxy.core.store import Entry
from proxy.disk.reads import READ_INLINE, ColdRecord, cold_record
from proxy.disk.record_meta import RecordMeta, record_entry
from proxy.disk.region_log import CHECKSUM_HASH
from proxy.disk.store import DiskStore
from proxy.front.lane import JOIN_BELOW, RawRequestMessage, lane_may_answer
from proxy.handler._hits import PlainHits
from proxy.handler.answers import delivered, span
from proxy.handler.routing import Router, fields_size, hosts, key_origin
from proxy.wire.dates import http_date

# The fields ``answer`` writes per hit (its ttl and Age): ``per_answer``'s, as bytes.
_HIT_STATUS = f"Cache-Status: {HIT_TTL}".encode()
_PER_HIT = _HIT_STATUS + b"%d\r\nAge: %d\r\n"
_PER_DISK_HIT = _HIT_STATUS + f"%d; detail={DISK}\r\nAge: %d\r\n".encode()
# Valid routed Host values the compiled plain hit knows; any other Host goes through
# ``hosts``, which is cached as widely.
ROUTED_HOSTS_MAX = 1024


@dataclass(slots=True, eq=False)
class ServedEntry(Entry):
    """A stored response, with the head its hits write (``rendered``): (the head without its
    per-answer fields, or None when the handler answers its hits; whether it holds a Date; the
    ``headers`` it was rendered from). A refresh gives the entry new headers, and so a new
    head at its next hit."""

    rendered: Any = None


@dataclass(frozen=True, slots=True)
class Planned:
    """A request the answerers routed and the engine planned, and did not answer: the lane's
    handler carries out ``action`` for it (``Proxy.start``), neither routing nor planning it
    again, so the engine counts it once."""

    meta: RequestMeta
    url: str
    action: Action
    # Where the URL's disk record lies, when the answerer found one the page cache does not
    # hold (the handler reads it from there).
    cold: ColdRecord | None = None


class HitAnswers:
    """The answerers of plain fresh hits over one engine and one router."""

    def __init__(
        self,
        engine: CacheEngine,
        router: Router,
        clock: Callable[[], float],
        disk: DiskStore | None = None,
    ) -> None:
        self.engine = engine
        self.router = router
        self.clock = clock
        self.disk = disk
        self.answered = 0  # hits ``answer`` answered (also counted among the engine's)
        self.routed_hosts: dict[bytes, str] = {}
        engine.entry_type = ServedEntry
        state = engine.hit_state()
        self.promote = state.promote
        self.plain_hits = PlainHits(
            entries=state.entries,
            vary=state.vary,
            index=state.index,
            counters=state.counters,
            observe=state.observe,
            hash=hash64,
            clock=clock,
            date=http_date,
            hosts=self.routed_hosts,
            declined=tuple(sorted(name.encode() for name in NOT_FAST | RULE_FIELDS)),
            per_hit=_HIT_STATUS,
            max_url=router.max_url,
            max_headers=router.max_headers,
            join_below=JOIN_BELOW,
        )
        # A query the cache keys otherwise than as sent is keyed by ``answer`` alone.
        self.plain_hits.query_as_sent = router.queries_as_sent
        self.follow_engine()
        if disk is not None:
            self.plain_hits.attach_disk(
                index=disk.reads.index, fds=disk.log.read_fds, bans=disk.tier.bans,
                uncacheable=state.uncacheable,
                checksum=CHECKSUM_HASH, promote=self._promoted_record, counters=disk.tier.counters,
                observe=disk.tier.admission.observe if disk.tier.admission.observes else None,
                cold=cold_record, meta=RecordMeta,
                stamp=disk.stamp,
                read_inline=READ_INLINE,
            )  # fmt: skip

    @property
    def fast_hits(self) -> int:
        """Hits answered as soon as they were parsed (also counted among the engine's hits)."""
        return self.answered + self.plain_hits.answered

    def answer(
        self, message: RawRequestMessage, remote: str, scheme: str
    ) -> tuple[bytes, bytes, int] | Planned | None:
        """The whole answer to a plain fresh hit, in memory or on disk (bytes to write, then
        a large body to write apart or b"", and the status); else, for a request a plain hit
        may answer, what the engine planned for it (``Planned``), which the lane carries out
        without routing or planning it again; None, with nothing counted, for any other.
        Three steps: the request is one a plain hit may answer (``_plain``), routed and
        planned once, as the handler would (``CacheEngine.plan``, which counts it; a
        ``Behind`` asked of the disk when the page cache holds its record), and a fresh
        answer from either tier delivered (``_deliver``)."""
        plain = self._plain(message)
        if plain is None:
            return None
        host_pair, names, origin = plain
        meta = self.router.meta(message.method, host_pair, message.path, message.headers,
                                remote, scheme)  # fmt: skip
        now = self.clock()
        try:
            action = self.engine.plan(meta, now)
        except Exception:
            # The handler makes the plan again, and answers and logs the failure as its own.
            return None
        cold = None
        try:
            if type(action) is Behind:
                action, cold = self._behind(meta, action, now)
            if type(action) is FromCache and action.fresh:
                out = self._deliver(message.method, names, meta, action)
                if out is not None:
                    self.answered += 1
                    return out
        except Exception:
            # A bug here costs speed, never the count: the handler carries the plan out.
            HTTP_ERRORS.exception("answering %s %s as parsed failed", meta.method, message.path)
        return Planned(meta, origin + message.path, action, cold)

    def _plain(self, message: RawRequestMessage) -> tuple[tuple[str, str], set[str], str] | None:
        """The routed host (name, as sent), the lower-cased field names and the origin of a
        request a plain hit may answer: one the lane may answer (``lane_may_answer``: a GET or
        HEAD kept alive, no body nor upgrade), carrying none of ``NOT_FAST``, its path and
        fields within the limits, its host routed; None for any other."""
        if not lane_may_answer(message):
            return None
        fields = message.headers
        names = set(map(str.lower, fields))
        path = message.path
        router = self.router
        if (
            not names.isdisjoint(NOT_FAST)
            or len(path) > router.max_url
            or fields_size(message.raw_headers) > router.max_headers
        ):
            return None
        host = fields.get("Host")
        host_pair = None if host is None else hosts(host)
        origin = None if host_pair is None else router.origin(host_pair[0])
        if origin is None:
            return None
        if len(self.routed_hosts) < ROUTED_HOSTS_MAX:
            self.routed_hosts[host.encode("utf-8", "surrogateescape")] = key_origin(host_pair[1])
        return host_pair, names, origin

    def _behind(
        self, meta: RequestMeta, behind: Behind, now: float
    ) -> tuple[Action, ColdRecord | None]:
        """What the disk makes of ``behind``, a request memory holds nothing for, when its
        record is short enough and in the page cache to read on the event loop
        (``READ_INLINE``; a damaged one is dropped): ``CacheEngine.found_behind``'s verdict.
        Else ``behind`` itself, for the handler, which reads off the loop, with where the
        record lies when it found one (``ColdRecord``; a URL whose variants memory holds
        is the handler's alone: they are found after their anchor)."""
        disk, engine = self.disk, self.engine
        if disk is None or meta.key in engine.variants:
            return behind, None
        found = disk.reads.lookup_warm(meta.key, engine.entry_type)
        if found is None or type(found) is ColdRecord:
            return behind, found
        return engine.found_behind(disk, meta, (found, ()), now, behind.then), None

    def _deliver(
        self, method: str, names: set[str], meta: RequestMeta, found: FromCache
    ) -> tuple[bytes, bytes, int] | None:
        """The answer from ``found``, whichever tier held it (counted where it was found:
        ``CacheEngine.plan``, ``found_behind``); None when its head cannot be rendered here,
        and the handler answers it."""
        router = self.router
        entry = found.entry
        rendered = getattr(entry, "rendered", None)
        if rendered is None or rendered[2] is not entry.headers:
            rendered = _render(entry, router.hidden)
            if type(entry) is ServedEntry:
                entry.rendered = rendered
        head, dated, _ = rendered
        if head is None:
            return None
        ttl = ttl_of(entry.lifetime, found.age)
        body = entry.payload
        status = entry.status
        answer = None
        if not names.isdisjoint(ANSWERED_FIELDS):
            answer = self.engine.answer(meta, status, entry.headers, len(body))
        if answer is not None and answer.status != status:
            # A part of the stored response (304, 206, 416): the deliver step's head, whole.
            cache_status = hit(ttl, DISK if found.behind else None)
            part, fields = delivered(status, entry.headers, answer, len(body), cache_status,
                                     "HIT", found.age, router.hidden)  # fmt: skip
            head, per_hit = render_fields(answer.status, fields), b""
            body, status = span(body, part), answer.status
        else:
            # The same head, rendered once per entry: the per-answer fields added per hit.
            per_hit = (_PER_DISK_HIT if found.behind else _PER_HIT) % (ttl, int(found.age))
            if not dated:
                per_hit += b"Date: %s\r\n" % http_date().encode()
        if method == "HEAD":
            return b"".join((head, per_hit, b"\r\n")), b"", status
        if len(body) < JOIN_BELOW:
            return b"".join((head, per_hit, b"\r\n", body)), b"", status
        return b"".join((head, per_hit, b"\r\n")), body, status

    def follow_engine(self) -> None:
        """The compiled answerer takes what the engine now has it feed: the admission's
        observe, the what-if's record and its sample (at the start, and after a reload
        replaced either)."""
        state = self.engine.hit_state()
        plain = self.plain_hits
        plain.observe, plain.whatif, plain.sample_below, plain.sample_key = (
            state.observe,
            state.whatif,
            state.sample_below,
            state.sample_key,
        )
        plain.admit, plain.promotion_admit = state.admit, state.promotion_admit

    def _promoted_record(self, key: str, body: bytes, meta: RecordMeta) -> None:
        """Keep in memory a plain hit the compiled answerer read from ``key``'s disk record
        (its ``body`` and its ``meta``, decoded), counted there, which the store's admission
        took (``HitState.promote``)."""
        self.promote(record_entry(key, meta, body, self.engine.entry_type))


def _render(
    entry: Entry, hidden: frozenset[str]
) -> tuple[bytes | None, bool, tuple[tuple[str, str], ...]]:
    """What every hit on ``entry`` writes the same (``ServedEntry.rendered``): ``hit_head``,
    and the fields it was rendered from."""
    headers = entry.headers
    if not isinstance(entry.payload, bytes):
        return None, False, headers
    return (*hit_head(entry.status, headers, len(entry.payload), hidden), headers)
