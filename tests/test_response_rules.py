"""The compiled common case of a response's caching rules (RFC 9111 sections 3, 4.2.1, 4.2.3
and 4.1) answers as the Python rules do, and leaves every other message to them."""

import random

import pytest

from proxy.core import rfc9111 as r
from proxy.core._response_rules import common_case

DATE = "Sun, 06 Nov 1994 08:49:37 GMT"
T0 = 784111777.0
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# Cache-Control members, odd ones among them. The last is past 2**63: a digit counter that
# did not stop at the cap would wrap there.
DIRECTIVES = ("max-age=60", "max-age=0", "Max-Age = 300", "max-age=", "max-age=abc",
              "max-age=99999999999999", "\tpublic", "s-maxage=10", "s-maxage=x", "S-MAXAGE",
              "public", "private", "no-store", "No-Store", "must-understand", "no-cache", "", " ",
              "max-age=1\t", "must-revalidate", "max-age=-1", "max-age=1.5", "stale-if-error=9",
              "x=\u00e9", 'private="a"', "max-age=\x0b1",
              "max-age=9999999999999999999")  # fmt: skip
STATUSES = (100, 200, 203, 204, 206, 300, 301, 302, 303, 304, 307, 308, 400, 404, 405, 410,
            414, 500, 501, 503, 599)  # fmt: skip
# Dates the compiled rules leave to the Python ones (other forms, out of range, padded).
ODD_DATES = ("Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "0", "",
             "Sun, 06 Xyz 1994 08:49:37 GMT", "Sun, 06 Nov 0000 08:49:37 GMT",
             "Sun, 32 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 24:00:00 GMT",
             " Sun, 06 Nov 1994 08:49:37 GMT ", "Sun, 06 Nov 1994 08:49:37 UTC")  # fmt: skip


def _date(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.05:
        return rng.choice(ODD_DATES)
    day = rng.choice([1, 6, 28, 29, 30, 31])
    month = rng.choice(MONTHS)
    if rng.random() < 0.1:
        month = month.upper() if rng.random() < 0.5 else month.lower()
    zone = "gmt" if rng.random() < 0.05 else "GMT"
    year = rng.choice([1970, 1994, 2000, 2024, 2026, 9999])
    clock = f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(61):02d}"
    return f"{rng.choice(['Sun', 'mon', 'XYZ'])}, {day:02d} {month} {year} {clock} {zone}"


def _response(rng: random.Random) -> list[tuple[str, str]]:
    fields = [("Content-Type", "text/plain")]
    for _ in range(rng.randrange(3)):
        value = ",".join(rng.choice(DIRECTIVES) for _ in range(rng.randrange(1, 4)))
        fields.append((rng.choice(["Cache-Control", "cache-control"]), value))
    for name in ("Date", "Expires", "Last-Modified"):
        if rng.random() < 0.6:
            fields.append((name, _date(rng)))
    if rng.random() < 0.3:
        members = ["Accept-Encoding", " accept-language ", "*", "", "Cookie", '"x"', "X-\u00e9"]
        fields.append(("Vary", ",".join(rng.sample(members, rng.randrange(1, 3)))))
    uncommon = (("Age", "10"), ("Set-Cookie", "a=1"), ("Set-Cookie2", "a=1"),
                ("CDN-Cache-Control", "max-age=5"))  # fmt: skip
    for name, value in uncommon:
        if rng.random() < 0.05:
            fields.append((name, value))
    rng.shuffle(fields)
    return fields


def _request(rng: random.Random) -> list[tuple[str, str]]:
    fields = [("Host", "example.com"), ("Accept", "*/*")]
    for name, value in (("Cookie", "s=1"), ("Authorization", "Basic x"),
                        ("Cache-Control", "no-store"), ("Pragma", "no-cache")):  # fmt: skip
        if rng.random() < 0.05:
            fields.append((name, value))
    return fields


def test_the_compiled_common_case_answers_as_the_python_rules_over_random_messages():
    rng = random.Random(9111)
    decided = 0
    reasons = set()
    for _ in range(20000):
        request = r.Fields(_request(rng))
        response = r.Fields(_response(rng))
        method = "GET" if rng.random() < 0.9 else "HEAD"
        status = rng.choice(STATUSES)
        request_time = T0 + rng.choice([-30.0, 0.0, 0.25, 5.5, 86400.0])
        response_time = request_time + rng.choice([0.0, 0.125, 3.0])
        args = (method, status, request, response, request_time, response_time)
        expected = r.python_response_rules(*args)
        compiled = common_case(
            method, status, request.by_name, response.by_name, request_time, response_time
        )
        if compiled is not None:
            decided += 1
            reasons.add(compiled[1])
            assert compiled == expected, (args, list(request), list(response))
            assert [type(v) for v in compiled] == [type(v) for v in expected]
        assert r.response_rules(*args) == expected
    # Most messages took the compiled rules, and they reached every verdict of their own.
    assert decided > 8000
    assert reasons == {"", "method", "partial", "status", "no-store", "private", "vary-star"}


@pytest.mark.parametrize(
    "fields",
    [[], [("Cache-Control", "max-age=60")], [("Cache-Control", "must-understand, no-store")],
     [("Last-Modified", "Sat, 05 Nov 1994 08:49:37 GMT")], [("Expires", DATE)],
     [("Cache-Control", "public"), ("Last-Modified", "Sat, 05 Nov 1994 08:49:37 GMT")]],
)  # fmt: skip
def test_the_compiled_status_sets_are_the_python_rules_own(fields):
    request = r.Fields([("Host", "h")])
    response = r.Fields([("Date", DATE), *fields])
    for status in range(100, 600):
        compiled = common_case("GET", status, request.by_name, response.by_name, T0, T0)
        expected = r.python_response_rules("GET", status, request, response, T0, T0)
        assert compiled == expected, status


@pytest.mark.parametrize(
    ("request_fields", "response_fields"),
    [
        ([("Cookie", "a=1")], []),
        ([("Authorization", "Basic x")], []),
        ([("Cache-Control", "max-age=0")], []),
        ([], [("Age", "5")]),
        ([], [("Set-Cookie", "a=1")]),
        ([], [("Set-Cookie2", "a=1")]),
        ([], [("CDN-Cache-Control", "max-age=5")]),
        ([], [("Cache-Control", 'private="Set-Cookie"')]),
        ([], [("Cache-Control", "max-age=60\x0b")]),
        ([], [("Vary", "Caf\u00e9")]),
        ([], [("Date", "Sunday, 06-Nov-94 08:49:37 GMT")]),
        ([], [("Expires", "0")]),
        ([], [("Last-Modified", "Sun Nov  6 08:49:37 1994")]),
    ],
)
def test_the_compiled_rules_leave_uncommon_messages_to_the_python_rules(
    request_fields, response_fields
):
    request = r.Fields([("Host", "h"), *request_fields])
    response = r.Fields([*response_fields, ("Date", DATE)])  # a Date is read from the first
    assert common_case("GET", 200, request.by_name, response.by_name, T0, T0) is None


def test_rfc9111_4_2_the_common_case_reads_a_plain_origin_response():
    request = r.Fields([("Host", "h")])
    response = r.Fields([("Date", "Sun, 06 Nov 1994 08:49:30 GMT"), ("Vary", "Accept-Encoding"),
                         ("Cache-Control", "public, max-age=60")])  # fmt: skip
    assert common_case("GET", 200, request.by_name, response.by_name, T0 - 1, T0) == (
        True, "", 60.0, 7.0, ("accept-encoding",), {"public": None, "max-age": "60"}
    )  # fmt: skip
