"""The compiled access log's lines (``LogLines``): each the line its format defines (JSON as
``json.dumps`` writes it, combined with Apache's escapes), whichever way its fields came; held
and written in batches, within a bound when the log cannot be written."""

import fcntl
import json
import os
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import EMPTY_PAYLOAD
from aiohttp.http import HttpRequestParser
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.front.lane import LoggedRequest, LoggedResponse
from proxy.handler._hits import LogLines
from proxy.ops.access_log import AccessLog

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_UNSAFE = re.compile(rb'["\\\x00-\x1f\x7f-\xff]')
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def _as_sent(value: str | None) -> str | None:
    """A field as a strict reader takes it: bytes that were not UTF-8 become U+FFFD."""
    if value is None:
        return None
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _escaped(value: str) -> str:
    raw = value.encode("utf-8", "surrogateescape")
    return _UNSAFE.sub(lambda m: b'\\"' if m[0] == b'"' else b"\\\\" if m[0] == b"\\"
                       else b"\\x%02x" % m[0][0], raw).decode("ascii")  # fmt: skip


def json_line(began_us: int, f: dict) -> str:
    """The JSON line of ``f`` as the format's definition (docs/operations.md) writes it."""
    when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=began_us)
    record = {
        "time": when.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        **{name: _as_sent(f[name]) for name in ("client", "method", "target", "host", "protocol")},
        "status": f["status"], "bytes": f["bytes"], "duration_us": f["duration_us"],
        "origin_us": f["origin_us"],
        **{name: _as_sent(f[name]) for name in ("cache_status", "user_agent", "referer")},
        "request_id": f["request_id"],
    }  # fmt: skip
    return json.dumps(record, ensure_ascii=True, separators=(",", ":"))


def combined_line(began_us: int, f: dict) -> str:
    """The combined line of ``f``: Apache's ``%h %l %u %t "%r" %>s %b "%{Referer}i"
    "%{User-Agent}i"``, escaped as Apache escapes."""
    t = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=began_us)).timetuple()
    stamp = (f"{t.tm_mday:02d}/{MONTHS[t.tm_mon - 1]}/{t.tm_year}:"
             f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000")  # fmt: skip
    line = _escaped(f"{f['method']} {f['target']} {f['protocol']}")
    referer, agent = f["referer"], f["user_agent"]
    return (
        f'{_escaped(f["client"] or "-")} - - [{stamp}] "{line}" {f["status"]} '
        f'{f["bytes"] or "-"} "{_escaped(referer) if referer is not None else "-"}" '
        f'"{_escaped(agent) if agent is not None else "-"}"'
    )


def plain(target: str) -> tuple:
    """``LogLines.entry``'s arguments after the duration for a GET of ``target`` from ::1."""
    return ("::1", "GET", target, None, "HTTP/1.1", 200, 0, None, None, None, None, None, None)


def lines_of(log_format: str, limit: int = 1 << 20) -> tuple[LogLines, int]:
    read, write = os.pipe()
    return LogLines(write, log_format == "json", limit), read


def taken(lines: LogLines, read: int) -> list[str]:
    lines.flush()
    fcntl.fcntl(read, fcntl.F_SETFL, os.O_NONBLOCK)
    out = b""
    try:
        while chunk := os.read(read, 1 << 16):
            out += chunk
    except BlockingIOError:
        pass
    return out.decode("ascii").splitlines()


# Text as a client may send it: any byte, read as aiohttp reads it (UTF-8, surrogateescape).
sent = st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape"))
fields = st.fixed_dictionaries({
    "client": st.one_of(st.none(), st.sampled_from(["127.0.0.1", "::1", ""])),
    "method": st.sampled_from(["GET", "HEAD", "POST", "PURGE"]),
    "target": sent.map(lambda t: "/" + t),
    "host": st.one_of(st.none(), sent),
    "protocol": st.sampled_from(["HTTP/1.1", "HTTP/1.0"]),
    "status": st.integers(100, 599),
    "bytes": st.integers(0, 1 << 40),
    "duration_us": st.integers(0, 10**9),
    "origin_us": st.one_of(st.none(), st.integers(0, 10**9)),
    "cache_status": st.one_of(st.none(), st.text(max_size=60)),
    "user_agent": st.one_of(st.none(), sent, st.text(max_size=20)),
    "referer": st.one_of(st.none(), sent),
    "request_id": st.one_of(st.none(), sent, st.from_regex(_CLIENT_ID, fullmatch=True)),
})  # fmt: skip
moments = st.integers(0, 4102444800 * 10**6)  # the epoch to 2100
# LogLines.entry's text and number fields, in its order (after the duration, before now and
# the origin's time).
ENTRY_FIELDS = ("client", "method", "target", "host", "protocol", "status", "bytes",
                "cache_status", "user_agent", "referer", "request_id")  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(fields, moments)
def test_a_json_line_is_what_json_dumps_writes_of_its_fields(f, now_us):
    lines, read = lines_of("json")
    lines.entry(f["duration_us"], *(f[name] for name in ENTRY_FIELDS), now_us, f["origin_us"])
    [line] = taken(lines, read)
    made = json.loads(line)["request_id"]
    given_id = f["request_id"]
    if given_id is not None and _CLIENT_ID.fullmatch(given_id):
        assert made == given_id
    else:  # one made here: 12 random hex digits and a count
        assert re.fullmatch(r"[0-9a-f]{12}0{9}1", made)
    assert line == json_line(now_us - f["duration_us"], {**f, "request_id": made})


@settings(max_examples=150, deadline=None)
@given(fields, moments)
def test_a_combined_line_is_apaches_with_its_escapes(f, now_us):
    lines, read = lines_of("combined")
    lines.entry(f["duration_us"], *(f[name] for name in ENTRY_FIELDS), now_us, f["origin_us"])
    assert taken(lines, read) == [combined_line(now_us - f["duration_us"], f)]


def parsed(head: bytes):
    """``head`` as aiohttp's handler reads it."""
    parser = HttpRequestParser(None, None, 2**16)  # type: ignore[arg-type]
    messages, _, _ = parser.feed_data(head)
    [(message, payload)] = messages
    assert payload is EMPTY_PAYLOAD
    return message


visible = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)
value = st.tuples(st.sampled_from(["", " ", "\t "]), visible, st.sampled_from(["", " ", " \t"]))
named = st.sampled_from(["User-Agent", "user-agent", "Referer", "REFERER", "X-Request-ID",
                         "x-request-id", "Accept", "X-Other"])  # fmt: skip


targets = st.from_regex(r"/[A-Za-z0-9._~%/?=&-]{0,30}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["GET", "HEAD"]), targets,
       st.lists(st.tuples(named, value), max_size=6).filter(
           lambda e: [n.lower() for n, _ in e].count("user-agent") < 2  # a singleton
       ), visible.filter(bool), st.booleans())  # fmt: skip
def test_a_hit_read_from_its_bytes_logs_what_the_handler_would_of_the_same_request(
    method, target, extra, host, json_format
):
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n".encode()
    for name, (before, text, after) in extra:
        head += f"{name}:{before}{text}{after}\r\n".encode()
    head += b"\r\n"
    answer = b"HTTP/1.1 200 OK\r\nCache-Status: onehit; hit; ttl=5\r\nContent-Length: 3\r\n\r\n"
    lines, read = lines_of("json" if json_format else "combined")
    lines.hit(b"xx" + head + b"GET", 2, 2 + len(head), "10.0.0.1", answer, b"abc", 200, 0.0)
    # The handler's line, as the front logs a hit it answered as parsed.
    AccessLog(lines).log(LoggedRequest(parsed(head), "10.0.0.1"),
                         LoggedResponse(answer, b"abc", 200), 0.0)  # fmt: skip
    hit, handler = taken(lines, read)
    # Only when (and the id made for a line without one) may differ.
    moment = r'"time":"[^"]+"|"duration_us":\d+|\[[^]]+\]|"request_id":"[0-9a-f]{22}"'
    assert re.sub(moment, "*", hit) == re.sub(moment, "*", handler)
    if json_format:
        assert json.loads(hit)["cache_status"] == "onehit; hit; ttl=5"


def test_a_hits_duration_is_timed_by_perf_counters_clock():
    """The compiled paths read a start taken by ``time.perf_counter`` against their own clock
    (``core/native/clock.h``): a hit begun 20 ms ago logs about 20,000 us."""
    head = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    lines, read = lines_of("json")
    lines.hit(head, 0, len(head), "::1", answer, b"", 200, time.perf_counter() - 0.02)
    [line] = taken(lines, read)
    assert 20_000 <= json.loads(line)["duration_us"] < 1_000_000


def test_lines_are_held_until_the_limit_then_written_whole():
    lines, read = lines_of("combined", limit=1000)
    args = ("127.0.0.1", "GET", "/x", "h", "HTTP/1.1", 200, 10, None, None, None, None, 0, None)
    lines.entry(5, *args)
    assert lines.pending > 0
    fcntl.fcntl(read, fcntl.F_SETFL, os.O_NONBLOCK)
    with pytest.raises(BlockingIOError):
        os.read(read, 1)  # nothing written yet
    while lines.pending:
        lines.entry(5, *args)
    written = os.read(read, 1 << 16)
    assert written.endswith(b"\n") and written.count(b"\n") == lines.lines > 1
    assert len(written) > 1000


def test_a_limit_of_zero_writes_each_line_as_it_is_made():
    lines, read = lines_of("json", limit=0)
    lines.entry(5, *plain("/x"))
    assert lines.pending == 0
    assert json.loads(os.read(read, 1 << 16))["target"] == "/x"


def test_a_log_that_cannot_be_written_drops_its_lines_counted_and_says_so_once():
    full = os.open("/dev/full", os.O_WRONLY)
    lines = LogLines(full, True, 0)
    args = ("::1", "GET", "/x", None, "HTTP/1.1", 200, 0, None, None, None, None, None, None)
    lines.entry(5, *args)
    lines.entry(5, *args)
    assert (lines.lines, lines.lost, lines.pending) == (2, 2, 0)
    with pytest.raises(OSError) as raised:
        lines.flush()
    assert raised.value.errno == 28  # ENOSPC
    lines.flush()  # said once
    os.close(full)


def test_what_a_stuck_log_holds_is_bounded():
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETFL, os.O_NONBLOCK)  # a reader that never reads: EAGAIN
    lines = LogLines(write, False, 4096)
    args = ("::1", "GET", "/" + "x" * 500, None, "HTTP/1.1", 200, 0, None, None, None, None, None,
            None)  # fmt: skip
    for _ in range(20_000):
        lines.entry(5, *args)
    assert lines.lost > 0
    assert lines.pending <= 1 << 20
    assert lines.lines == 20_000
    os.close(read)
    os.close(write)


def test_a_swap_writes_what_is_held_to_the_descriptor_before():
    lines, first = lines_of("combined")
    lines.entry(5, *plain("/one"))
    read, write = os.pipe()
    assert lines.swap(write) > 0
    lines.entry(5, *plain("/two"))
    fcntl.fcntl(first, fcntl.F_SETFL, os.O_NONBLOCK)
    assert b"/one" in os.read(first, 1 << 16)
    assert [line.split('"')[1] for line in taken(lines, read)] == ["GET /two HTTP/1.1"]


def test_processes_sharing_a_pipe_never_split_a_line_of_each_other():
    """Two processes write 64 KiB batches of long JSON lines to one pipe (the workers' stderr):
    each write to a pipe is at most PIPE_BUF bytes of whole lines, which the kernel keeps
    whole, so every line the reader gets is one line of one writer."""
    read, write = os.pipe()
    children = []
    for writer in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child's)
            os.close(read)
            lines = LogLines(write, True, 64 << 10)
            for n in range(600):
                lines.entry(5, "::1", "GET", f"/{writer}/{n}/" + "x" * 700, None, "HTTP/1.1",
                            200, 0, None, None, None, None, None, None)  # fmt: skip
            lines.flush()
            os._exit(0)
        children.append(pid)
    os.close(write)
    out = b""
    while chunk := os.read(read, 1 << 12):
        out += chunk
    os.close(read)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    targets = [json.loads(line)["target"] for line in out.decode("ascii").splitlines()]
    assert sorted(targets) == sorted(f"/{w}/{n}/" + "x" * 700 for w in range(2) for n in range(600))


def test_a_log_that_loses_lines_says_so_at_its_next_flush(caplog, tmp_path):
    from proxy.ops.access_log import AccessLogFile

    log = AccessLogFile(str(tmp_path / "a.log"), "combined", 0, 1.0)
    full = os.open("/dev/full", os.O_WRONLY)
    os.close(log.lines.swap(full))
    log.lines.entry(5, *plain("/x"))
    log.flush()
    assert "writing the access log" in caplog.text and "1 lines lost" in caplog.text
    caplog.clear()
    log.flush()  # nothing new lost: nothing said
    assert caplog.text == ""
    log.close()


def test_a_reopen_after_the_log_closed_opens_nothing(tmp_path, caplog):
    """SIGUSR1 while the service stops: the log is closed, and stays so (before: a new file
    was opened, never closed, and the reopen raised on the closed descriptor)."""
    from proxy.ops.access_log import AccessLogFile

    log = AccessLogFile(str(tmp_path / "a.log"), "combined", 1 << 16, 1.0)
    log.close()
    opened = len(os.listdir("/proc/self/fd"))
    log.reopen()
    assert log.closed and len(os.listdir("/proc/self/fd")) == opened
    log.lines.entry(5, *plain("/x"))
    log.flush()
    assert (log.lines.pending, log.lines.lost) == (0, 1)  # dropped, and counted
    assert "was closed: 1 lines lost" in caplog.text
