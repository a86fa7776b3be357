"""HTTP caching rules for a shared cache (RFC 9111, with RFC 9213 and RFC 5861), as plain functions.

Rules this module keeps:

* Headers are ``rfc9110`` headers. Nothing here does I/O or reads a clock: times are
  arguments, in seconds.
* Parsers are forgiving where the RFCs allow and never raise on hostile input: an invalid
  directive value is ignored, a duplicated directive keeps its first value (section 4.2.1),
  quoted values are unquoted, whitespace is trimmed, delta-seconds cap at 2**31 (section 1.2.2).
* This is a shared cache: ``private`` responses are not stored, ``s-maxage`` wins over
  ``max-age``, and ``CDN-Cache-Control`` (RFC 9213) replaces ``Cache-Control`` for it when present
  and valid. It is a Structured Field Dictionary (RFC 8941): one that does not parse is ignored
  as a whole, and ``Cache-Control`` applies.
* Any final status may be stored with explicit freshness; without it only the heuristically
  cacheable ones (RFC 9110 section 15.1). ``must-understand`` limits storing to statuses this
  cache understands, and then overrides ``no-store`` (section 5.2.2.3). Partial (206) and 304
  responses are never stored whole.
* ``Pragma: no-cache`` on a request without ``Cache-Control`` acts as ``no-cache`` (section 5.4).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

import http_sfv

from proxy.core._response_rules import common_case
from proxy.core.rfc9110 import (
    Directives,
    Fields,
    Headers,
    digits,
    get_all,
    get_first,
    http_date,
    list_values,
    split_outside_quotes,
    weak_tag,
)

DELTA_SECONDS_CAP = 2**31
HEURISTIC_FRACTION = 0.1
HEURISTIC_CAP = 86400.0

# RFC 9110 section 15.1: statuses a cache may store with a heuristic lifetime.
HEURISTICALLY_CACHEABLE = frozenset({200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501})
# Statuses whose caching requirements this cache implements (for ``must-understand``).
UNDERSTOOD_STATUSES = (HEURISTICALLY_CACHEABLE - {206}) | {302, 303, 307}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# Statuses that answer the request's own Range or preconditions: never stored, and never
# taken to replace what is stored for requests without them.
ANSWERS_ITS_REQUEST = frozenset({206, 304, 412, 416})
# Fields that set state for the one client a response answers (RFC 6265's Set-Cookie, and
# RFC 2965's obsolete Set-Cookie2): never stored for every client.
PER_CLIENT_FIELDS = frozenset({"set-cookie", "set-cookie2"})


# RFC 9111 section 3.2: fields a 304 must not overwrite in the stored response.
_NOT_UPDATED_BY_304 = frozenset({"content-length", "content-encoding", "transfer-encoding"})


def parse_directives(values: Iterable[str]) -> Directives:
    """Cache-Control style directives: lower-cased names to (unquoted) values or None."""
    out: Directives = {}
    for value in values:
        for item in split_outside_quotes(value, ","):
            name, eq, arg = item.partition("=")
            name = name.strip().lower()
            if not name or name in out:
                continue
            arg = arg.strip()
            if len(arg) >= 2 and arg[0] == arg[-1] == '"':
                arg = arg[1:-1].replace('\\"', '"')
            out[name] = arg if eq else None
    return out


def delta_seconds(value: str | None) -> int | None:
    """A delta-seconds value (section 1.2.2): ASCII digits only, capped at 2**31; else None."""
    if value is None:
        return None
    number = digits(value.strip())
    return None if number is None else min(number, DELTA_SECONDS_CAP)


def response_directives(headers: Headers) -> Directives:
    """The directives this cache obeys: CDN-Cache-Control when present and a valid Structured
    Field Dictionary (RFC 9213 section 2.1), else Cache-Control."""
    if type(headers) is Fields:
        if headers.directives is None:
            headers.directives = _response_directives(headers)
        return headers.directives
    return _response_directives(headers)


def _response_directives(headers: Headers) -> Directives:
    targeted = get_all(headers, "cdn-cache-control")
    if targeted:
        directives = targeted_directives(targeted)
        if directives is not None:
            return directives
    return parse_directives(get_all(headers, "cache-control"))


# Targeted directives whose value is an Integer (RFC 9213 section 2.1, RFC 9111 section 5.2):
# a member of another type is invalid.
_INTEGER_DIRECTIVES = frozenset({"max-age", "s-maxage", "stale-while-revalidate", "stale-if-error"})


def targeted_directives(values: Sequence[str]) -> Directives | None:
    """A targeted cache-control field (RFC 9213) as directives; None when it is not a valid
    Structured Field Dictionary (RFC 8941 section 3.2), or none of its members is a valid
    directive: the whole field is then ignored. A true Boolean is a directive without a value;
    a false one is absent; a directive whose value has the wrong type (``max-age="60"``, a
    negative or fractional age) is invalid and ignored (section 2.1)."""
    field = http_sfv.Dictionary()
    try:
        field.parse(",".join(values).encode("latin-1"))
    except (ValueError, UnicodeEncodeError):
        return None
    out: Directives = {}
    for name, member in field.items():
        value = getattr(member, "value", None)
        if name in _INTEGER_DIRECTIVES:
            if type(value) is int and value >= 0:
                out[name] = str(value)
        elif value is True:
            out[name] = None
        elif value is not False and isinstance(value, int | float | str):
            out[name] = str(value)
    return out if out or not field else None


def request_directives(headers: Headers) -> Directives:
    """Request Cache-Control; ``Pragma: no-cache`` counts as ``no-cache`` when there is none."""
    # Looked up, or one pass for both fields: read on every hit, and most requests carry neither.
    if type(headers) is Fields:
        cc = headers.by_name.get("cache-control", [])
        pragma = headers.by_name.get("pragma", [])
    else:
        cc, pragma = [], []
        for k, v in headers:
            size = len(k)
            if size == 13 and k.lower() == "cache-control":
                cc.append(v)
            elif size == 6 and k.lower() == "pragma":
                pragma.append(v)
    if cc:
        return parse_directives(cc)
    if pragma and "no-cache" in parse_directives(pragma):
        return {"no-cache": None}
    return {}


def carries_cookie(request_headers: Headers, ignored: Sequence[str] = ()) -> bool:
    """Whether a request sends a cookie (RFC 6265 section 5.4) whose name matches none of the
    ``ignored`` globs: a request that may be answered for this user alone. A pair that is not
    a plain ``name=value`` (no name, or a comma, which some servers read as a separator of
    more pairs) counts as a cookie: what an origin may read as a session is never ignored."""
    for value in get_all(request_headers, "cookie"):
        for pair in value.split(";"):
            if not pair.strip():
                continue
            name, eq, rest = pair.partition("=")
            name = name.strip()
            if not name or not eq or "," in rest or "," in name:
                return True
            if not any(fnmatchcase(name, pattern) for pattern in ignored):
                return True
    return False


def meant_for_shared_caches(response_headers: Headers, cc: Directives) -> bool:
    """The response says shared caches may store it for everyone (section 3.5): ``public``,
    ``s-maxage``, or a CDN-Cache-Control field (RFC 9213), which only shared caches obey.
    ``cc``: the directives in force (``response_directives``)."""
    return (
        "public" in cc
        or "s-maxage" in cc
        or get_first(response_headers, "cdn-cache-control") is not None
    )


def storable(
    method: str,
    status: int,
    request_headers: Headers,
    response_headers: Headers,
    *,
    allow_set_cookie: bool = False,
    ignored_cookies: Sequence[str] = (),
    overridden: frozenset[str] = frozenset(),
) -> tuple[bool, str]:
    """Whether a shared cache may store this response (section 3), and why not if it may not.
    A request with ``Authorization`` (section 3.5), or with a cookie not ``ignored``, makes a
    response storable only when it is meant for shared caches (``must-revalidate`` also does for
    ``Authorization``, as section 3.5 says). The response directives ``overridden`` (an
    operator's TTL rule's, ``proxy.core.ttl_rules``) are judged as if absent."""
    if method != "GET":  # a HEAD response has no body to store; other methods are not cached
        return False, "method"
    req = request_directives(request_headers)
    if "no-store" in req:
        return False, "request-no-store"
    if status == 206:  # this cache stores complete responses only
        return False, "partial"
    # A 304, 412 or 416 answers the request's own preconditions or Range (RFC 9110 sections
    # 15.4.5, 15.5.13 and 15.5.17): stored under the URL it would answer requests without them
    # (a poisoned cache's denial of service).
    if status < 200 or status in ANSWERS_ITS_REQUEST:
        return False, "status"
    cc = response_directives(response_headers)
    if overridden:
        cc = {k: v for k, v in cc.items() if k not in overridden}
    if "must-understand" in cc:
        if status not in UNDERSTOOD_STATUSES:
            return False, "status"
    elif "no-store" in cc:
        return False, "no-store"
    if "private" in cc:
        return False, "private"
    if any(v.strip() == "*" for v in list_values(get_all(response_headers, "vary"))):
        return False, "vary-star"
    if get_first(request_headers, "authorization") is not None and not (
        "public" in cc or "s-maxage" in cc or "must-revalidate" in cc
    ):
        return False, "authorization"
    if carries_cookie(request_headers, ignored_cookies) and not meant_for_shared_caches(
        response_headers, cc
    ):
        return False, "cookie"
    if not allow_set_cookie and any(get_first(response_headers, f) for f in PER_CLIENT_FIELDS):
        return False, "set-cookie"
    explicit = "public" in cc or explicit_freshness(response_headers, cc)
    if not explicit and status not in HEURISTICALLY_CACHEABLE:
        return False, "status"
    return True, ""


def explicit_freshness(headers: Headers, cc: Directives) -> bool:
    """Whether a response says how long it is fresh (section 4.2.1): a valid ``s-maxage`` or
    ``max-age`` among its directives ``cc``, or an ``Expires``."""
    return (
        delta_seconds(cc.get("s-maxage")) is not None
        or delta_seconds(cc.get("max-age")) is not None
        or get_first(headers, "expires") is not None
    )


def never_fresh(headers: Headers, cc: Directives) -> bool:
    """Whether a storable response says nothing that would let it answer a request as stored:
    no freshness (no ``max-age``, ``s-maxage`` or Expires), none to guess (no Last-Modified
    for section 4.2.2's heuristic), no validator to revalidate it with (no ETag either), and no
    staleness it allows (``stale-while-revalidate``, ``stale-if-error``). Only a client's
    ``max-stale`` or an operator's grace could ever serve one; the cache does not write it for
    them (a 404 without fields would be written again on every request)."""
    return (
        "max-age" not in cc
        and "s-maxage" not in cc
        and "stale-while-revalidate" not in cc
        and "stale-if-error" not in cc
        and get_first(headers, "expires") is None
        and get_first(headers, "last-modified") is None
        and get_first(headers, "etag") is None
    )


def response_rules(
    method: str,
    status: int,
    request_headers: Headers,
    response_headers: Headers,
    request_time: float,
    response_time: float,
    *,
    allow_set_cookie: bool = False,
    ignored_cookies: Sequence[str] = (),
) -> tuple[bool, str, float, float, tuple[str, ...], Directives]:
    """What a cache reads of an origin response as it arrives: whether it may be stored and
    why not (``storable``), its freshness lifetime, its age on arrival (``current_age``), the
    request fields it varies on and the directives in force. Every miss asks this once, so
    the common case (plain fields: see ``proxy/core/_response_rules.c``) is compiled; it gives
    what ``python_response_rules`` gives, which decides every other message."""
    if type(request_headers) is Fields and type(response_headers) is Fields:
        common = common_case(
            method, status, request_headers.by_name, response_headers.by_name,
            request_time, response_time,
        )  # fmt: skip
        if common is not None:
            return common  # type: ignore[no-any-return]
    return python_response_rules(
        method, status, request_headers, response_headers, request_time, response_time,
        allow_set_cookie=allow_set_cookie, ignored_cookies=ignored_cookies,
    )  # fmt: skip


def python_response_rules(
    method: str,
    status: int,
    request_headers: Headers,
    response_headers: Headers,
    request_time: float,
    response_time: float,
    *,
    allow_set_cookie: bool = False,
    ignored_cookies: Sequence[str] = (),
) -> tuple[bool, str, float, float, tuple[str, ...], Directives]:
    """``response_rules`` by the rules of this module alone, for any message."""
    ok, reason = storable(
        method, status, request_headers, response_headers,
        allow_set_cookie=allow_set_cookie, ignored_cookies=ignored_cookies,
    )  # fmt: skip
    return (
        ok,
        reason,
        freshness_lifetime(status, response_headers, response_time),
        current_age(response_headers, request_time, response_time, response_time),
        vary_names(response_headers),
        response_directives(response_headers),
    )


def freshness_lifetime(status: int, headers: Headers, response_time: float | None = None) -> float:
    """Seconds a response stays fresh (section 4.2.1): s-maxage, max-age, Expires - Date, then
    10% of Date - Last-Modified (capped at a day) for heuristically cacheable statuses. Without a
    valid Date, the time the response arrived stands in for it (section 4.2.1); an invalid
    Expires means already expired (section 5.3)."""
    cc = response_directives(headers)
    for name in ("s-maxage", "max-age"):
        seconds = delta_seconds(cc.get(name))
        if seconds is not None:
            return float(seconds)
        if name in cc:
            return 0.0  # present but invalid: treat as stale (section 4.2.1)
    date = http_date(get_first(headers, "date"))
    if date is None:
        date = response_time
    expires_values = get_all(headers, "expires")
    if expires_values:
        expires = http_date(expires_values[0])
        if expires is None or date is None:
            return 0.0
        return max(0.0, expires - date)
    if status in HEURISTICALLY_CACHEABLE or "public" in cc:
        modified = http_date(get_first(headers, "last-modified"))
        if modified is not None and date is not None and date > modified:
            return min(HEURISTIC_CAP, HEURISTIC_FRACTION * (date - modified))
    return 0.0


def age_value(headers: Headers) -> int | None:
    """The Age field (section 5.1): of a list, the first member; an invalid value is ignored
    (None), never read as some number."""
    values = list_values(get_all(headers, "age"))
    return delta_seconds(values[0]) if values else None


def current_age(headers: Headers, request_time: float, response_time: float, now: float) -> float:
    """Section 4.2.3: the age of a stored response at ``now``."""
    age = age_value(headers) or 0
    date_value = http_date(get_first(headers, "date"))
    apparent_age = max(0.0, response_time - date_value) if date_value is not None else 0.0
    response_delay = max(0.0, response_time - request_time)
    corrected_initial_age = max(apparent_age, age + response_delay)
    return corrected_initial_age + max(0.0, now - response_time)


def must_revalidate_before_use(response: Directives, request: Directives) -> bool:
    """``no-cache`` on either side (section 5.2.2.4, 5.2.1.4): revalidate even when fresh.
    Takes parsed directives (``response_directives``, ``request_directives``)."""
    return "no-cache" in response or "no-cache" in request


def fresh_enough(lifetime: float, age: float, req: Directives) -> bool:
    """Fresh for a request with directives ``req``: its ``max-age`` and ``min-fresh``
    (sections 5.2.1.1, 5.2.1.3)."""
    max_age = delta_seconds(req.get("max-age"))
    if max_age is not None and age > max_age:
        return False
    min_fresh = delta_seconds(req.get("min-fresh")) or 0
    return lifetime - age > min_fresh


def may_serve_stale(
    lifetime: float,
    age: float,
    req: Directives,
    cc: Directives,
    *,
    origin_failed: bool = False,
    grace: float = 0.0,
) -> bool:
    """Whether a stale response may be served: never under must-revalidate/proxy-revalidate
    (section 5.2.2.2, 5.2.2.8), nor under ``no-cache`` on either side, which asks for a
    validation before any use (5.2.2.4, 5.2.1.4; section 4.2.4 forbids a stale answer a
    directive prohibits); else with request ``max-stale`` (5.2.1.2),
    ``stale-while-revalidate`` or, when the origin failed, ``stale-if-error`` (RFC 5861) or
    up to ``grace`` seconds stale (the operator's, as Varnish's grace; section 4.2.4 lets a
    cache serve stale when disconnected from the origin).
    ``req`` and ``cc`` are the parsed request and stored-response directives."""
    if "must-revalidate" in cc or "proxy-revalidate" in cc or "s-maxage" in cc:
        return False
    if must_revalidate_before_use(cc, req):
        return False
    staleness = age - lifetime
    if "max-stale" in req:
        limit = delta_seconds(req["max-stale"])
        if limit is None and req["max-stale"] is None:
            return True
        if limit is not None and staleness <= limit:
            return True
    swr = delta_seconds(cc.get("stale-while-revalidate"))
    if swr is not None and not origin_failed and staleness <= swr:
        return True
    sie = delta_seconds(cc.get("stale-if-error")) or delta_seconds(req.get("stale-if-error"))
    if origin_failed and sie is not None and staleness <= sie:
        return True
    # No grace is none at all: a response exactly its lifetime old is stale already.
    return origin_failed and grace > 0 and staleness <= grace


def only_if_cached(request_headers: Headers) -> bool:
    """Section 5.2.1.7: answer from cache or 504."""
    return "only-if-cached" in request_directives(request_headers)


def vary_names(response_headers: Headers) -> tuple[str, ...]:
    """The request header names a response varies on, lower-cased and sorted."""
    values = get_all(response_headers, "vary")
    if not values:
        return ()
    names = {v.strip().lower() for v in list_values(values)}
    names.discard("")
    return tuple(sorted(names))


# Fields whose values are lists of case-insensitive tokens with parameters (RFC 9110 12.5):
# "en-US;q=0.8, fr" and "en-us; q=0.8,fr" select the same variant.
_CASELESS_LISTS = frozenset({"accept-encoding", "accept-language", "accept-charset"})
_LIST_SPACING = re.compile(r"\s*([,;=])\s*")


def vary_key(names: Sequence[str], request_headers: Headers) -> tuple[tuple[str, str], ...]:
    """Section 4.1: the variant a request selects, from the values of the varied-on headers,
    combined and whitespace-normalized; for the content-negotiation lists whose tokens are
    case-insensitive, lower-cased with no space around separators."""
    key = []
    for name in names:
        value = ", ".join(" ".join(v.split()) for v in get_all(request_headers, name))
        if name in _CASELESS_LISTS:
            value = _LIST_SPACING.sub(r"\1", value.lower())
        key.append((name, value))
    return tuple(key)


def validates(stored_headers: Headers, headers_304: Headers) -> bool:
    """Section 4.3.4: whether a 304 selects the stored response for update. An entity tag it
    carries must be the stored one's: the same strong tag, or for a weak one the weak
    comparison (RFC 9110 section 8.8.3.2); without one, a Last-Modified it carries must be
    the stored one's. A 304 carrying two entity tags, or naming another response, selects
    none and updates none; one carrying no validator answers the validators the request
    sent, the stored response's."""
    tags = list_values(get_all(headers_304, "etag"))
    if len(tags) > 1:
        return False
    if tags:
        tag, stored = tags[0].strip(), get_first(stored_headers, "etag")
        if stored is None:
            return False
        return weak_tag(stored) == weak_tag(tag) if tag.startswith("W/") else stored.strip() == tag
    modified = get_first(headers_304, "last-modified")
    if modified is None:
        return True
    stored_modified = get_first(stored_headers, "last-modified")
    if stored_modified is None:
        return False
    when, stored_when = http_date(modified), http_date(stored_modified)
    return when == stored_when if when is not None else modified.strip() == stored_modified.strip()


def conditional_headers(stored_headers: Headers) -> list[tuple[str, str]]:
    """Section 4.3.1: validators of a stored response as a revalidation request's headers."""
    out = []
    etag = get_first(stored_headers, "etag")
    if etag:
        out.append(("If-None-Match", etag))
    modified = get_first(stored_headers, "last-modified")
    if modified:
        out.append(("If-Modified-Since", modified))
    return out


def updated_by_304(stored_headers: Headers, headers_304: Headers) -> list[tuple[str, str]]:
    """Section 4.3.4: the stored headers with every field the 304 carries replaced by its values
    (except the framing fields section 3.2 protects)."""
    replaced = {k.lower() for k, _ in headers_304} - _NOT_UPDATED_BY_304
    kept = [(k, v) for k, v in stored_headers if k.lower() not in replaced]
    return kept + [(k, v) for k, v in headers_304 if k.lower() in replaced]


def invalidates(method: str, status: int) -> bool:
    """Section 4.4: a non-error response to an unsafe method invalidates the stored URL."""
    return method.upper() not in SAFE_METHODS and 200 <= status < 400
