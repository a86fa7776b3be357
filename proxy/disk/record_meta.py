"""The meta of a disk record: what the proxy needs, beside the body, to answer from it.

* Fixed part (``META``): status, stored at, lifetime (inf: never expires), age on arrival,
  flags (``DATED``, ``PLAIN``), the stamp of the proxy that wrote it, the stored head's
  length. Then the head its plain hits write, rendered once when the record is written
  (``hit_head``); then the response's fields; then its cache directives as parsed when it
  arrived. Fields and directives are pairs: their count, then each as its name's (u16) and
  value's (u32; ``NO_VALUE`` for a directive without one) lengths, name, value (UTF-8,
  surrogateescape). The compiled reader (``proxy/handler/hitpath/disk.c``) reads this same layout.
* The stamp (``record_stamp``) fingerprints how this proxy renders hits (with the fields it
  hides from clients) and parses directives: a record written by one that did either
  otherwise is answered from its fields, its head rendered and its directives parsed again,
  never as it was stored.
* ``PLAIN``: a plain hit may be answered with the stored head (the response has no
  ``no-cache`` to revalidate it first).
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from proxy.core import rfc9111
from proxy.core.cached import hit_head
from proxy.core.events import ResponseMeta
from proxy.core.store import Entry

META = struct.Struct("<HdddBII")
DATED = 1
PLAIN = 2
_COUNT = struct.Struct("<H")
_PAIR = struct.Struct("<HI")
NO_VALUE = 0xFFFFFFFF


class RecordMeta(NamedTuple):
    """A record's meta, decoded; ``head`` is None when hits are answered from ``headers``."""

    status: int
    stored_at: float
    lifetime: float
    initial_age: float
    head: bytes | None
    dated: bool
    headers: tuple[tuple[str, str], ...]
    directives: rfc9111.Directives


def record_stamp(hidden: frozenset[str] = frozenset()) -> int:
    """Two sample heads (with and without a Date, with fields the cache writes itself and
    tag fields) rendered hiding ``hidden``, and the directives of a sample field, as this
    proxy renders and parses them."""
    sample = (("Date", "Thu, 03 Dec 2026 14:00:00 GMT"), ("Content-Type", "text/plain"),
              ("Cache-Control", 'max-age=60, No-Cache="Set-Cookie", private'), ("Age", "3"),
              ("Via", "1.1 elsewhere"), ("Surrogate-Key", "a b"), ("Cache-Tag", "c"))  # fmt: skip
    heads = (hit_head(200, sample, 5, hidden)[0], hit_head(200, sample[1:], 0, hidden)[0])
    parsed = repr(sorted(rfc9111.response_directives(sample).items())).encode()
    return zlib.crc32(b"".join((*(head or b"" for head in heads), parsed)))


def encode_meta(
    response: ResponseMeta, stored_at: float, size: int, hidden: frozenset[str], stamp: int
) -> bytes:
    """The meta of a record of ``response``, whose body is ``size`` bytes, its head rendered
    hiding ``hidden`` (``stamp``: ``record_stamp(hidden)``)."""
    head, dated = hit_head(response.status, response.headers, size, hidden)
    directives = response.directives
    if directives is None:
        directives = rfc9111.response_directives(response.headers)
    flags = (DATED if dated else 0) | (PLAIN if "no-cache" not in directives else 0)
    head = head or b""
    parts = [
        META.pack(response.status, stored_at, response.lifetime, response.initial_age, flags,
                  stamp, len(head)),
        head,
    ]  # fmt: skip
    _pack(parts, response.headers)
    _pack(parts, directives.items())
    return b"".join(parts)


def decode_meta(meta: bytes, stamp: int) -> RecordMeta:
    """``encode_meta``'s ``meta``, read back by a proxy whose ``record_stamp`` is ``stamp``;
    struct.error when it is not one."""
    status, stored_at, lifetime, initial_age, flags, written_by, head_length = META.unpack_from(
        meta
    )
    end = META.size + head_length
    ours = written_by == stamp
    fields, end_of_fields = _unpack(meta, end)
    headers: tuple[tuple[str, str], ...] = tuple(fields)  # type: ignore[arg-type]
    if ours:
        directives: rfc9111.Directives = dict(_unpack(meta, end_of_fields)[0])
    else:
        directives = rfc9111.response_directives(headers)
    head = meta[META.size : end] if head_length and ours else None
    return RecordMeta(status, stored_at, lifetime, initial_age, head, bool(flags & DATED),
                      headers, directives)  # fmt: skip


def record_entry(key: str, m: RecordMeta, body: bytes, entry_type: type[Entry]) -> Entry:
    """The entry a record of ``key`` holds, its meta decoded (``m``) and its ``body``; an
    entry type with a ``rendered`` head (the proxy's) gets the record's, when it has one."""
    entry = entry_type(key, len(body), m.stored_at, m.lifetime, m.initial_age, m.headers,
                       m.directives, body, status=m.status)  # fmt: skip
    if m.head is not None and hasattr(entry, "rendered"):
        entry.rendered = (m.head, m.dated, m.headers)  # type: ignore[attr-defined]
    return entry


def _pack(parts: list[bytes], pairs: object) -> None:
    items = list(pairs)  # type: ignore[call-overload]
    parts.append(_COUNT.pack(len(items)))
    for name, value in items:
        raw_name = name.encode("utf-8", "surrogateescape")
        if value is None:
            parts += (_PAIR.pack(len(raw_name), NO_VALUE), raw_name)
        else:
            raw_value = value.encode("utf-8", "surrogateescape")
            parts += (_PAIR.pack(len(raw_name), len(raw_value)), raw_name, raw_value)


def _unpack(meta: bytes, at: int) -> tuple[list[tuple[str, str | None]], int]:
    """The pairs at ``at``, and where they end."""
    (count,) = _COUNT.unpack_from(meta, at)
    at += _COUNT.size
    pairs: list[tuple[str, str | None]] = []
    for _ in range(count):
        name_length, value_length = _PAIR.unpack_from(meta, at)
        at += _PAIR.size
        name = meta[at : at + name_length].decode("utf-8", "surrogateescape")
        at += name_length
        value = None
        if value_length != NO_VALUE:
            value = meta[at : at + value_length].decode("utf-8", "surrogateescape")
            at += value_length
        if at > len(meta):
            raise struct.error("a pair past the record's meta")
        pairs.append((name, value))
    return pairs, at
