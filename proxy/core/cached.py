"""The head of an answer given from a stored (or already fetched) response, as one rule for
every path that writes one: the proxy's handler, its fast path and, mirrored byte for byte,
its compiled hit.

Rules this module keeps:

* The status is the stored one, or the 304, 206 or 416 that the request's conditionals and
  Range ask of it (``CacheEngine.answer``).
* The fields are the stored ones, in their order, but for those the cache writes itself:
  ``Content-Length`` and ``Age`` (recomputed), the marks every answer carries (``Cache-Status``,
  ``X-Cache``, ``Via``), and ``Content-Range`` where the answer is a range of its own (206,
  416). A stored ``Content-Range`` on an answer of the stored status passes as it came, as
  does a stored ``Accept-Ranges`` (``none`` included: the origin's word on its resource).
* A 304 carries no ``Content-Length``, ``Content-Type``, ``Content-Encoding`` or
  ``Content-Range`` (RFC 9110 section 15.4.5), nor an ``Accept-Ranges`` of the cache's own.
* After them come ``Content-Range`` (206: ``bytes first-last/size``; 416: ``bytes */size``,
  section 14.4), ``Content-Length`` (not for a status without content: 1xx, 204, 304; section
  8.6), ``Accept-Ranges: bytes`` when the stored
  response named none (but on a 304: the cache answers byte ranges of what it holds),
  ``X-Cache``, ``Via``; then what differs with each answer (``per_answer``): ``Cache-Status``,
  ``Age`` and, when the stored response has none, ``Date`` (section 6.6.1).
* The body is ``size`` bytes (the stored status), the range ``first``..``last`` (the
  cache's 206), or nothing (the cache's 416, and statuses that have none).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import NamedTuple

from proxy.core.rfc9110 import Headers

# What the cache writes itself on every answer from a stored response.
RECOMPUTED = frozenset({"content-length", "age"})
MARKS = frozenset({"cache-status", "x-cache", "via"})
# Body fields a 304 leaves out (RFC 9110 section 15.4.5).
NOT_MODIFIED_DROPS = frozenset({"content-length", "content-type", "content-encoding"})
# Statuses whose answers carry no body (RFC 9110 sections 15.3.5, 15.4.5).
BODILESS = frozenset({204, 304})
REASONS = {status.value: status.phrase for status in HTTPStatus}


class CachedHead(NamedTuple):
    """An answer's status, its fields but the per-answer ones, whether they hold a Date, and
    the body bytes it carries (``first``..``last`` inclusive; ``last < first``: none)."""

    status: int
    fields: tuple[tuple[str, str], ...]
    dated: bool
    first: int
    last: int


def cached_head(
    stored_status: int,
    stored: Headers,
    answer_status: int,
    first: int,
    last: int,
    size: int,
    *,
    x_cache: str,
    via: str,
    hidden: frozenset[str] = frozenset(),
) -> CachedHead:
    """The head of the ``answer_status`` answer (with ``first``..``last`` for a 206) from a
    stored ``stored_status`` response with fields ``stored`` and a body of ``size`` bytes;
    ``hidden``: stored fields (lower-case names) clients are not given."""
    # A 206 or 416 of the cache's own (not the stored status) carries its own Content-Range.
    ranged = answer_status in (206, 416) and answer_status != stored_status
    drops = RECOMPUTED | MARKS | hidden
    if answer_status == 304:
        drops = drops | NOT_MODIFIED_DROPS | {"content-range"}
    elif ranged:
        drops = drops | {"content-range"}
    fields = []
    dated = accepts = False
    for name, value in stored:
        low = name.lower()
        if low in drops:
            continue
        dated = dated or low == "date"
        accepts = accepts or low == "accept-ranges"
        fields.append((name, value))
    bodiless = answer_status in BODILESS or answer_status < 200
    if ranged and answer_status == 206:
        fields.append(("Content-Range", f"bytes {first}-{last}/{size}"))
        body_first, body_last = first, last
    elif ranged:
        fields.append(("Content-Range", f"bytes */{size}"))
        body_first, body_last = 0, -1
    elif bodiless:
        body_first, body_last = 0, -1
    else:
        body_first, body_last = 0, size - 1
    if not bodiless:
        fields.append(("Content-Length", str(body_last - body_first + 1)))
    if answer_status != 304 and not accepts:
        fields.append(("Accept-Ranges", "bytes"))
    fields.append(("X-Cache", x_cache))
    fields.append(("Via", via))
    return CachedHead(answer_status, tuple(fields), dated, body_first, body_last)


def per_answer(cache_status: str, age: float, date: str | None) -> tuple[tuple[str, str], ...]:
    """The fields that differ with each answer: ``Cache-Status``, ``Age`` (whole seconds,
    section 5.1), and ``Date`` when given (the stored response had none)."""
    fields = (("Cache-Status", cache_status), ("Age", str(int(age))))
    return (*fields, ("Date", date)) if date is not None else fields


def status_line(status: int) -> str:
    """``HTTP/1.1 status reason``, with the reason phrase RFC 9110 registers (none for an
    unregistered status)."""
    return f"HTTP/1.1 {status} {REASONS.get(status, '')}"


def render_fields(status: int, fields: tuple[tuple[str, str], ...]) -> bytes:
    """A ``status`` line and ``fields`` as bytes, each line CRLF-terminated, without the
    blank line. Field bytes that a parser decoded with surrogateescape go out as they
    came."""
    lines = [status_line(status), *(f"{k}: {v}" for k, v in fields)]
    return ("\r\n".join(lines) + "\r\n").encode("utf-8", "surrogateescape")


# How the proxy names itself, in ``Via`` (never in ``Server``).
VIA = "1.1 onehit"
# Stored statuses whose hits are not their fields and body as stored: no body (204, 304), or
# a part whose range the handler writes (206).
NOT_PLAIN = frozenset({204, 206, 304})


def hit_head(
    status: int, headers: Headers, size: int, hidden: frozenset[str] = frozenset()
) -> tuple[bytes | None, bool]:
    """What every plain hit on a stored ``status`` response with ``headers`` and a body of
    ``size`` bytes writes the same: its head without the per-answer fields (``cached_head``,
    rendered, ``hidden`` fields left out), and whether it holds a Date; None for a status
    whose hits the handler answers."""
    if status in NOT_PLAIN or status < 200:
        return None, False
    head = cached_head(status, headers, status, 0, size - 1, size, x_cache="HIT", via=VIA,
                       hidden=hidden)  # fmt: skip
    return render_fields(head.status, head.fields), head.dated
