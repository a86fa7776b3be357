"""Plain fresh hits answered as soon as they are parsed: the Python answerer and its compiled
common case, which give the same bytes and counts as the request handler.

* Plain: GET or HEAD, HTTP/1.1 keep-alive, an origin-form target and fields within the limits,
  a routed Host, no body, no precondition (a validator or a Range is answered from the stored
  response: 304, 206, 416), and a stored response whose status has a body. Anything else is
  declined, with nothing counted, and the request handler answers it.
* The head every hit on an entry writes the same is rendered once per stored response
  (``cached_head``) and kept beside it (``ServedEntry``), for as long as its fields are the
  ones it was rendered from; each hit adds only its ``Cache-Status`` ttl, ``Age`` and, where
  the origin sent none, ``Date``.
* A URL memory holds nothing for is answered from its disk record when it has one, whole,
  fresh, and short enough and in the page cache to read on the event loop (``from_disk``),
  with the head rendered when the record was written; counted as the handler counts it (a
  hit from disk, ``CacheEngine.hit_behind``), and kept in memory too.
* The compiled answerer (``plain_hits``, ``proxy/handler/hitpath/``) finds and counts a hit, in
  memory as ``CacheEngine.fresh_plain`` and ``served`` do and on disk as ``answer`` does, and
  writes the bytes ``answer`` would; what it declines ``answer`` decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.core._native import hash64
from proxy.core.cache_status import DISK, HIT_TTL, ttl_of
from proxy.core.cached import VIA, cached_head, hit_head, render
from proxy.core.engine import CacheEngine
from proxy.core.events import (
    ANSWERED_FIELDS,
    NOT_FAST,
    RULE_FIELDS,
    Answer,
    Hit,
    RequestMeta,
)
from proxy.core.store import Entry
from proxy.disk.reads import READ_INLINE
from proxy.disk.record_meta import RecordMeta, record_entry
from proxy.disk.region_log import checksum
from proxy.disk.store import DiskStore
from proxy.front.lane import JOIN_BELOW, RawRequestMessage, lane_may_answer
from proxy.handler._hits import PlainHits
from proxy.handler.answers import span
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
                checksum=checksum, kept=self._kept_record, meta=RecordMeta, stamp=disk.stamp,
                read_inline=READ_INLINE,
            )  # fmt: skip

    @property
    def fast_hits(self) -> int:
        """Hits answered as soon as they were parsed (also counted among the engine's hits)."""
        return self.answered + self.plain_hits.answered

    def answer(
        self, message: RawRequestMessage, remote: str, scheme: str
    ) -> tuple[bytes, bytes, int] | None:
        """The whole answer to a plain fresh hit, in memory or on disk (bytes to write, then
        a large body to write apart or b"", and the status), counted as the handler counts
        one; None, with nothing counted, for any other request. Three steps: the request is
        one a plain hit may answer (``_plain``), a fresh response is found for it in memory or
        on disk (``_found``), and it is delivered (``_deliver``), from either source alike."""
        plain = self._plain(message)
        if plain is None:
            return None
        host_pair, names = plain
        found = self._found(message, host_pair, names, remote, scheme)
        if found is None:
            return None
        return self._deliver(message.method, names, *found)

    def _plain(self, message: RawRequestMessage) -> tuple[tuple[str, str], set[str]] | None:
        """The routed host (name, as sent) and the lower-cased field names of a request a
        plain hit may answer: one the lane may answer (``lane_may_answer``: a GET or HEAD
        kept alive, no body nor upgrade), carrying none of ``NOT_FAST``, its path and fields
        within the limits, its host routed; None for any other."""
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
        if host_pair is None or not router.routed(host_pair[0]):
            return None
        if len(self.routed_hosts) < ROUTED_HOSTS_MAX:
            self.routed_hosts[host.encode("utf-8", "surrogateescape")] = key_origin(host_pair[1])
        return host_pair, names

    def _found(
        self,
        message: RawRequestMessage,
        host_pair: tuple[str, str],
        names: set[str],
        remote: str,
        scheme: str,
    ) -> tuple[str, Hit, RequestMeta | None, bool, float] | None:
        """The fresh stored response to a plain request: (its key, the hit, the request's
        meta where one was made, whether the disk answered, now); None when neither memory
        nor (read on the loop) the disk holds one. Nothing counted."""
        router, engine = self.router, self.engine
        now = self.clock()
        meta = None
        key = router.key(host_pair, message.path)
        if names.isdisjoint(RULE_FIELDS) and not engine.varies(key):
            hit = engine.fresh_plain(key, now)
        else:
            meta = router.meta(message.method, host_pair, message.path, message.headers, remote,
                               scheme)  # fmt: skip
            hit = engine.fresh(meta, now)
        if hit is not None:
            return key, hit, meta, False, now
        if meta is not None or self.disk is None or not engine.plain_miss(key):
            return None
        meta = router.meta(message.method, host_pair, message.path, message.headers, remote,
                           scheme)  # fmt: skip
        hit = self.from_disk(meta, now)
        return None if hit is None else (key, hit, meta, True, now)

    def _deliver(
        self,
        method: str,
        names: set[str],
        key: str,
        hit: Hit,
        meta: RequestMeta | None,
        on_disk: bool,
        now: float,
    ) -> tuple[bytes, bytes, int] | None:
        """The answer from ``hit``, wherever it was found, counted as the handler counts one
        (a disk hit kept in memory too); None when its head cannot be rendered here."""
        router, engine = self.router, self.engine
        entry = hit.entry
        rendered = getattr(entry, "rendered", None)
        if rendered is None or rendered[2] is not entry.headers:
            rendered = _render(entry, router.hidden)
            if type(entry) is ServedEntry:
                entry.rendered = rendered
        head, dated, _ = rendered
        if head is None:
            return None
        age = int(hit.age)
        ttl = ttl_of(entry.lifetime, hit.age)
        per_hit = (_PER_DISK_HIT if on_disk else _PER_HIT) % (ttl, age)
        if not dated:
            per_hit += b"Date: %s\r\n" % http_date().encode()
        body = entry.payload
        status = entry.status
        if meta is not None and not names.isdisjoint(ANSWERED_FIELDS):
            answer = engine.answer(meta, entry.status, entry.headers, len(entry.payload))
            if answer.status != entry.status:
                head, body = _render_part(entry, answer, router.hidden)
                status = answer.status
        if method == "HEAD":
            out = b"".join((head, per_hit, b"\r\n")), b"", status
        elif len(body) < JOIN_BELOW:
            out = b"".join((head, per_hit, b"\r\n", body)), b"", status
        else:
            out = b"".join((head, per_hit, b"\r\n")), body, status
        # Counted once rendered: an answer that fails to render is the handler's, which
        # counts it once, as it finds it.
        if on_disk:
            assert self.disk is not None
            engine.hit_behind(self.disk, key, entry, now, counted=False)
        else:
            engine.served(key, hit, now)
        self.answered += 1
        return out

    def from_disk(self, meta: RequestMeta, now: float) -> Hit | None:
        """The disk's fresh answer to ``meta``, a request the memory store holds nothing for,
        read on the event loop, or None (a damaged record is dropped; one over
        ``READ_INLINE``, or that the page cache does not hold, is left to the handler, which
        reads it off the loop); nothing counted."""
        assert self.disk is not None
        entry = self.disk.reads.lookup(
            meta.key, self.engine.entry_type, READ_INLINE, warm_only=True
        )
        return None if entry is None else self.engine.answers_from(meta, entry, now)

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

    def _kept_record(self, key: str, body: bytes, meta: RecordMeta) -> None:
        """Count a plain hit the compiled answerer read from ``key``'s disk record (its
        ``body`` and its ``meta``, decoded) as ``answer`` counts one it read itself."""
        assert self.disk is not None
        entry = record_entry(key, meta, body, self.engine.entry_type)
        self.engine.hit_behind(self.disk, key, entry, self.clock(), counted=False)


def _render(
    entry: Entry, hidden: frozenset[str]
) -> tuple[bytes | None, bool, tuple[tuple[str, str], ...]]:
    """What every hit on ``entry`` writes the same (``ServedEntry.rendered``): ``hit_head``,
    and the fields it was rendered from."""
    headers = entry.headers
    if not isinstance(entry.payload, bytes):
        return None, False, headers
    return (*hit_head(entry.status, headers, len(entry.payload), hidden), headers)


def _render_part(
    entry: Entry, answer: Answer, hidden: frozenset[str]
) -> tuple[bytes, bytes | memoryview]:
    """The head (without its per-answer fields) and body of a 304, 206 or 416 from
    ``entry``: a part of the stored body, never a copy."""
    size = len(entry.payload)
    head = cached_head(entry.status, entry.headers, answer.status, answer.first, answer.last,
                       size, x_cache="HIT", via=VIA, hidden=hidden)  # fmt: skip
    return render(head), span(entry.payload, head)
