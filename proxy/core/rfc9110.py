"""HTTP semantics a cache reads (RFC 9110), as plain functions: header fields, numbers and
dates, the fields a proxy forwards, conditionals and byte ranges.

* Headers are sequences of ``(name, value)`` pairs; names compare case-insensitively and a field
  may repeat. ``Fields`` are such a sequence indexed by name in one pass: for a message that
  several rules read.
* Parsers never raise on hostile input: a number is ASCII digits only, read up to
  ``NUMBER_CAP``; a date that does not parse is None; an invalid range is ignored.
* Hop-by-hop fields (section 7.6.1) are the fixed set, ``proxy-*`` and whatever ``Connection``
  names; the compiled filter (``_native.end_to_end``) answers every message without a
  ``Connection`` field, and must answer as ``_end_to_end`` does.
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from proxy.core._native import end_to_end as _compiled_end_to_end
from proxy.core._native import index_fields, indexed_fields

Headers = Sequence[tuple[str, str]]
Directives = dict[str, str | None]

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
)
# Answers that never carry content (sections 15.2, 15.3.5 and 15.4.5): 1xx, 204 and 304.
BODILESS_STATUSES = frozenset((*range(100, 200), 204, 304))


class Fields(Sequence[tuple[str, str]]):
    """Header fields as given (a sequence of pairs, like any ``Headers``) that also index
    themselves by lower-cased name in one pass, so every rule reading them looks a field up
    instead of scanning for it. Their cache directives are parsed once, when first read
    (``response_directives``). For a message that several rules read."""

    __slots__ = ("_pairs", "by_name", "directives")

    def __init__(
        self, headers: Iterable[tuple[str, str]], index: dict[str, list[str]] | None = None
    ) -> None:
        """``index``: the index of exactly ``headers``, when it was made in the pass that
        chose them (``end_to_end_fields``)."""
        pairs = tuple(headers)
        self._pairs = pairs
        self.by_name: dict[str, list[str]] = index_fields(pairs) if index is None else index
        self.directives: Directives | None = None

    def __len__(self) -> int:
        return len(self._pairs)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._pairs)

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[tuple[str, str], ...]: ...
    def __getitem__(self, index: int | slice) -> tuple[str, str] | tuple[tuple[str, str], ...]:
        return self._pairs[index]

    def __eq__(self, other: object) -> bool:
        return self._pairs == (other._pairs if isinstance(other, Fields) else other)

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __repr__(self) -> str:
        return f"Fields({list(self._pairs)!r})"


def get_all(headers: Headers, name: str) -> list[str]:
    """Every value of field ``name``, in order."""
    name = name.lower()
    if type(headers) is Fields:
        return list(headers.by_name.get(name, ()))
    size = len(name)  # compared first: most fields are ruled out without lower-casing them
    return [v for k, v in headers if len(k) == size and k.lower() == name]


def get_first(headers: Headers, name: str) -> str | None:
    name = name.lower()
    if type(headers) is Fields:
        values = headers.by_name.get(name)
        return values[0] if values else None
    size = len(name)
    for k, v in headers:
        if len(k) == size and k.lower() == name:
            return v
    return None


def split_outside_quotes(text: str, sep: str) -> list[str]:
    if '"' not in text:
        return text.split(sep)  # the common case, and what the loop below gives for it
    parts, current, quoted, escaped = [], [], False, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


# Past this many digits a number is only ever compared with smaller ones: read as NUMBER_CAP,
# so that no field's value makes the cache parse a number of thousands of digits.
_MOST_DIGITS = 18
NUMBER_CAP = 10**_MOST_DIGITS


def digits(text: str) -> int | None:
    """A non-negative decimal of ASCII digits (RFC 9110 section 5.6.1's DIGIT), read up to
    ``NUMBER_CAP``; None for anything else (a sign, a space, a superscript two)."""
    if not text.isascii() or not text.isdigit():
        return None
    text = text.lstrip("0")
    return NUMBER_CAP if len(text) > _MOST_DIGITS else int(text or "0")


_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
# RFC 9110 section 5.6.7: IMF-fixdate, and the obsolete rfc850 and asctime forms a recipient
# must also accept.
# Recipients compare the zone case-insensitively ("gmt" is seen in the wild).
_IMF = re.compile(r"^[A-Za-z]{3}, (\d{2}) ([A-Za-z]{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT$", re.I)
_RFC850 = re.compile(
    r"^[A-Za-z]+, (\d{2})-([A-Za-z]{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) GMT$", re.I
)
_ASCTIME = re.compile(r"^[A-Za-z]{3} ([A-Za-z]{3}) ([ \d]\d) (\d{2}):(\d{2}):(\d{2}) (\d{4})$")


def http_date(value: str | None) -> float | None:
    """An HTTP-date (any of the three forms) as POSIX seconds; None when it does not parse."""
    if not value:
        return None
    return _http_date(value)


# Most dates a cache reads repeat: every response of one second has the same Date, and an
# object's Last-Modified and Expires come back with each fetch of it.
@functools.lru_cache(maxsize=256)
def _http_date(value: str) -> float | None:
    text = value.strip()
    if m := _IMF.match(text):
        day, month, year, hh, mm, ss = m.groups()
    elif m := _RFC850.match(text):
        day, month, yy, hh, mm, ss = m.groups()
        year = str(1900 + int(yy) if int(yy) >= 70 else 2000 + int(yy))
    elif m := _ASCTIME.match(text):
        month, day, hh, mm, ss, year = m.groups()
    else:
        return None
    month_number = _MONTHS.get(month.title())
    if month_number is None:
        return None
    try:
        fields = (int(year), month_number, int(day), int(hh), int(mm), int(ss))
        if not (1 <= fields[2] <= 31 and fields[3] < 24 and fields[4] < 60 and fields[5] < 61):
            return None
        return float(calendar.timegm(fields))
    except (ValueError, OverflowError):
        return None


def not_modified(request_headers: Headers, stored_headers: Headers) -> bool:
    """RFC 9110 section 13.1.2/13.1.3: a client conditional the stored response satisfies
    (If-None-Match by weak comparison; else If-Modified-Since)."""
    inm = get_all(request_headers, "if-none-match")
    if inm:
        etag = get_first(stored_headers, "etag")
        if etag is None:
            return False
        tags = {weak_tag(t) for t in list_values(inm)}
        return "*" in tags or weak_tag(etag) in tags
    since = http_date(get_first(request_headers, "if-modified-since"))
    modified = http_date(get_first(stored_headers, "last-modified"))
    return since is not None and modified is not None and modified <= since


def end_to_end(headers: Headers, without: frozenset[str] = HOP_BY_HOP) -> list[tuple[str, str]]:
    """RFC 9110 section 7.6.1: the fields a proxy forwards, without hop-by-hop ones (the fixed
    set, ``proxy-*`` and any that ``Connection`` names). ``without``: lower-cased names left
    out, ``HOP_BY_HOP`` and any more the caller drops in the same pass."""
    kept = _compiled_end_to_end(headers, without)
    return kept if kept is not None else _end_to_end(headers, without)


def end_to_end_fields(
    headers: Headers, without: frozenset[str] = HOP_BY_HOP, extra: Headers = ()
) -> Fields:
    """``end_to_end`` as ``Fields``, chosen and indexed in one pass, then ``extra``: fields a
    proxy adds itself, which no ``Connection`` of the message can name away."""
    done = indexed_fields(headers, without, extra, True)
    if done is not None:
        return Fields(*done)
    return Fields([*_end_to_end(headers, without), *extra])


def _end_to_end(headers: Headers, without: frozenset[str] = HOP_BY_HOP) -> list[tuple[str, str]]:
    """``end_to_end`` in full; the compiled filter answers every message without a
    ``Connection`` field, and must answer as this does."""
    kept = []
    named: set[str] = set()
    for k, v in headers:
        low = k.lower()
        if low in without or low.startswith("proxy-"):
            if low == "connection":
                named.update(t.strip().lower() for t in v.split(","))
            continue
        kept.append((k, v))
    if named:
        return [(k, v) for k, v in kept if k.lower() not in named]
    return kept


def byte_range(
    request_headers: Headers, stored_headers: Headers, length: int
) -> tuple[int, int] | bool | None:
    """RFC 9110 section 14: the single byte range a GET asks of a stored representation of
    ``length`` bytes, as (first, last) inclusive; None to send the whole representation (no
    Range, several ranges, a non-bytes unit, or an If-Range that does not match); False when
    the range cannot be satisfied (416)."""
    values = get_all(request_headers, "range")
    if len(values) != 1:
        return None
    unit, _, spec = values[0].strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    if_range = get_first(request_headers, "if-range")
    if if_range is not None:
        etag = get_first(stored_headers, "etag")
        if_range = if_range.strip()
        if if_range.startswith(('"', "W/")):
            if etag is None or etag.strip() != if_range or if_range.startswith("W/"):
                return None
        elif if_range != (get_first(stored_headers, "last-modified") or "").strip():
            return None
    first_text, dash, last_text = spec.strip().partition("-")
    # An invalid range-spec (no dash, a digit that is not ASCII) is ignored: section 14.2.
    first = digits(first_text) if first_text else None
    last = digits(last_text) if last_text else None
    if not dash or (first_text and first is None) or (last_text and last is None):
        return None
    if first is None:
        if last is None:
            return None
        if last == 0 or length == 0:
            return False
        return max(0, length - last), length - 1
    if last is not None and last < first:
        return None
    if first >= length:
        return False
    return first, length - 1 if last is None else min(last, length - 1)


def weak_tag(tag: str) -> str:
    """An entity tag as the weak comparison compares it (section 8.8.3.2): without ``W/``."""
    tag = tag.strip()
    return tag[2:] if tag.startswith("W/") else tag


def list_values(values: Iterable[str]) -> list[str]:
    return [part for value in values for part in split_outside_quotes(value, ",")]
