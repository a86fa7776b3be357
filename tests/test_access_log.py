"""The access log as tools ingest it: every line JSON (``json.loads``) or Apache combined (a
strict pattern), whichever path answered; a file reopened on SIGUSR1, as logrotate needs."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from datetime import datetime

import aiohttp
import pytest
from conftest import base, served, until, wait_healthy

from loadgen.live.processes import free_port, onehit_process
from proxy.ops.access_log import FIELDS, AccessLogFile

# Apache's combined format exactly: host, ident, user, time, request line, status, bytes,
# referer, user agent; a quoted part holds no bare quote, and escapes only \", \\ and \xhh.
QUOTED = r'"((?:[^"\\\x00-\x1f\x7f-\xff]|\\["\\]|\\x[0-9a-f]{2})*)"'
COMBINED = re.compile(
    r"^(\S+) - - \[(\d{2}/(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)/\d{4}"
    r":\d{2}:\d{2}:\d{2} \+0000)\] " + QUOTED + r" (\d{3}) (\d+|-) " + QUOTED + " " + QUOTED + "$"
)

# Each way a request is answered: a miss, a hit (the fast path's compiled answer and the
# lane's), a HEAD, a POST (aiohttp's handler), an error; one with hostile fields.
REQUESTS = [
    ("GET", "/a?x=1", {}),
    ("GET", "/a?x=1", {}),
    ("GET", "/a?x=1", {"User-Agent": "curl/8.5"}),
    ("HEAD", "/a?x=1", {"Referer": "http://r.example/"}),
    ("POST", "/form", {"Content-Type": "text/plain"}),
    ("GET", "/missing", {"X-Request-ID": "req-42"}),
    ("GET", "/a?x=1", {"X-Request-ID": 'no "quotes" ' + "x" * 200}),
    ("GET", '/q"uote', {"User-Agent": 'evil" 200 9 "x\\y caf\u00e9'}),
]


async def _send(service, client: aiohttp.ClientSession) -> None:
    for method, path, headers in REQUESTS:
        async with client.request(
            method, base(service) + path, headers={"Host": "example.test", **headers},
            data=b"body" if method == "POST" else None,
        ) as r:  # fmt: skip
            await r.read()


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def _logged(origin, start_proxy, client, tmp_path, log_format: str) -> list[str]:
    """The log lines of every request of ``REQUESTS``, in ``log_format``."""
    origin.set("/missing", status=404)
    log = tmp_path / "access.log"
    service = await start_proxy(server__access_log=True, server__access_log_format=log_format,
                                server__access_log_file=str(log))  # fmt: skip
    await _send(service, client)
    await until(lambda: len(_lines(log)) == len(REQUESTS))
    return _lines(log)


async def test_json_lines_each_load_with_every_field(origin, start_proxy, client, tmp_path):
    lines = await _logged(origin, start_proxy, client, tmp_path, "json")
    records = [json.loads(line) for line in lines]
    sent = [(m, p.replace('"', "%22")) for m, p, _ in REQUESTS]  # the client quotes a '"'
    assert [(r["method"], r["target"]) for r in records] == sent
    for record in records:
        assert tuple(record) == FIELDS
        assert record["time"].endswith("Z") and datetime.fromisoformat(record["time"])
        assert record["client"] == "127.0.0.1" and record["host"] == "example.test"
        assert record["protocol"] == "HTTP/1.1" and record["bytes"] > 0
        assert isinstance(record["duration_us"], int) and record["duration_us"] >= 0
    assert [r["status"] for r in records] == [200, 200, 200, 200, 200, 404, 200, 200]
    assert records[2]["user_agent"] == "curl/8.5" and records[3]["referer"] == "http://r.example/"
    assert records[2]["cache_status"].startswith("onehit; hit")  # stored by the second
    assert records[5]["request_id"] == "req-42"
    assert len(records[6]["request_id"]) == 22  # quoted and long: one made in its place
    made = [r["request_id"] for i, r in enumerate(records) if i != 5]
    assert len(set(made)) == len(made)  # unique where the proxy made them
    assert records[7]["user_agent"] == 'evil" 200 9 "x\\y caf\u00e9'


async def test_durations_are_microseconds_of_the_answer_not_of_the_loops_clock(
    origin, start_proxy, client, tmp_path
):
    """``duration_us`` counts microseconds: a hit answered as read and a miss answered in the
    lane take tens or hundreds of them (before: the loop's clock, which uvloop keeps in whole
    milliseconds, logged most hits as 0 and the rest as multiples of 1000)."""
    lines = await _logged(origin, start_proxy, client, tmp_path, "json")
    durations = [json.loads(line)["duration_us"] for line in lines]
    assert all(d > 0 for d in durations[:4]), durations  # the miss, the hits, the HEAD
    assert any(d % 1000 for d in durations), durations


async def test_the_origins_time_is_logged_for_what_asked_it_and_null_for_hits(
    origin, start_proxy, client, tmp_path
):
    """``origin_us``: what a miss, a request passed through and an error waited on the
    origin; null for every hit, which asked it nothing."""
    origin.set("/slow", delay=0.05, headers={"Cache-Control": "max-age=60"})
    lines = await _logged(origin, start_proxy, client, tmp_path, "json")
    waits = [json.loads(line)["origin_us"] for line in lines]
    # The two misses (the second stores it), the POST, the 404; the hits (a HEAD one too).
    assert all(waits[i] > 0 for i in (0, 1, 4, 5)) and waits[2:4] + waits[6:7] == [None] * 3
    log = tmp_path / "slow.log"
    service = await start_proxy(server__access_log=True, server__access_log_format="json",
                                server__access_log_file=str(log))  # fmt: skip
    async with client.get(base(service) + "/slow", headers={"Host": "example.test"}) as r:
        await r.read()
    await until(lambda: len(_lines(log)) == 1)
    record = json.loads(_lines(log)[0])
    # The origin waits 50 ms by its loop's clock, which rounds to the millisecond.
    assert 45_000 <= record["origin_us"] <= record["duration_us"]


@pytest.mark.parametrize("log_format", ["json", "combined"])
async def test_a_host_or_target_that_is_not_utf8_is_logged_as_valid_utf8(
    origin, start_proxy, tmp_path, log_format
):
    """Bytes that are not UTF-8 in the Host (refused, 400) or the target are logged as valid
    UTF-8 (U+FFFD in json, ``\\xhh`` in combined): a strict reader takes every line."""
    log = tmp_path / "access.log"
    service = await start_proxy(server__access_log=True, server__access_log_format=log_format,
                                server__access_log_file=str(log))  # fmt: skip
    for request in (b"GET / HTTP/1.1\r\nHost: caf\xe9.example\r\n\r\n",
                    b"GET /caf\xe9 HTTP/1.1\r\nHost: example.test\r\n\r\n"):  # fmt: skip
        reader, writer = await asyncio.open_connection(*service.proxy_address)
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
    await until(lambda: log.exists() and len(log.read_bytes().splitlines()) == 2)
    for line in log.read_bytes().splitlines():
        text = line.decode("utf-8")  # strict
        if log_format == "json":  # no "\\udce9" either: strict JSON readers refuse one
            json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")


async def test_combined_lines_match_apaches_format_even_with_hostile_fields(
    origin, start_proxy, client, tmp_path
):
    lines = await _logged(origin, start_proxy, client, tmp_path, "combined")
    matches = [COMBINED.match(line) for line in lines]
    assert all(matches), [line for line, m in zip(lines, matches, strict=True) if not m]
    requests = [m[3] for m in matches]
    assert requests[:2] == ["GET /a?x=1 HTTP/1.1"] * 2 and requests[4] == "POST /form HTTP/1.1"
    assert [m[4] for m in matches] == ["200"] * 5 + ["404", "200", "200"]
    assert matches[3][6] == "http://r.example/" and matches[0][6] == "-"
    hostile = matches[7]
    assert hostile[3] == "GET /q%22uote HTTP/1.1"  # as the client sent it
    assert hostile[7] == 'evil\\" 200 9 \\"x\\\\y caf\\xc3\\xa9'


async def test_a_log_file_moved_away_is_written_again_after_sigusr1(origin, tmp_path):
    log = tmp_path / "access.log"
    settings = {"server.access_log": "true", "server.access_log_format": "json",
                "server.access_log_file": str(log),
                "server.access_log_flush": "50ms"}  # fmt: skip
    async with onehit_process(origin.url, settings) as proxy, aiohttp.ClientSession() as client:

        async def get(path: str) -> None:
            async with client.get(proxy.url + path) as r:
                assert r.status == 200

        await get("/before")
        await until(lambda: len(_lines(log)) == 1)
        rotated = tmp_path / "access.log.1"
        log.rename(rotated)  # as logrotate does
        await get("/moved")  # still written to the moved file, until the signal
        await until(lambda: len(_lines(rotated)) == 2)
        proxy.process.send_signal(signal.SIGUSR1)
        await until(lambda: log.exists())
        await get("/after")
        await until(lambda: len(_lines(log)) == 1)
        assert [json.loads(line)["target"] for line in _lines(rotated)] == ["/before", "/moved"]
        assert json.loads(_lines(log)[0])["target"] == "/after"
        proxy.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proxy.process.wait(), 15) == 0


def test_the_guide_and_the_documented_configuration_name_every_json_field():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    guide = (root / "docs/operations.md").read_text()
    toml = (root / "config/proxy.toml").read_text()
    assert [f for f in FIELDS if f"`{f}`" not in guide] == []
    assert [f for f in FIELDS if f not in toml] == []


async def test_every_hit_is_logged_across_a_reopen_and_a_stop_the_interval_never_came(
    origin, tmp_path
):
    log = tmp_path / "access.log"
    settings = {"server.access_log": "true", "server.access_log_format": "json",
                "server.access_log_file": str(log), "server.access_log_flush": "1h"}  # fmt: skip
    async with onehit_process(origin.url, settings) as proxy, aiohttp.ClientSession() as client:

        async def get(count: int) -> None:
            for _ in range(count):
                async with client.get(proxy.url + "/h") as r:
                    assert r.status == 200 and await r.read()

        await get(40)  # a miss, the miss that stores, then hits from the compiled path
        assert _lines(log) == []  # held: the buffer is not full, the interval an hour away
        rotated = tmp_path / "access.log.1"
        log.rename(rotated)
        proxy.process.send_signal(signal.SIGUSR1)
        await until(lambda: log.exists())
        assert len(_lines(rotated)) == 40  # written to the file it was, before it moved on
        await get(25)
        proxy.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proxy.process.wait(), 15) == 0
    after = [json.loads(line) for line in _lines(log)]
    assert len(after) == 25
    assert {line["cache_status"].split(";")[1].strip() for line in after} == {"hit"}
    assert {line["target"] for line in after} == {"/h"}


async def test_every_answer_of_two_workers_is_one_whole_line_after_a_stop(origin, tmp_path):
    """--workers 2 appending to one file, lines held (the interval an hour away) and written
    in batches at the stop: every answer of either worker is there once, whole."""
    log = tmp_path / "access.log"
    settings = {"server.workers": "2", "server.access_log": "true",
                "server.access_log_format": "json", "server.access_log_file": str(log),
                "server.access_log_flush": "1h", "upstream.origin": origin.url}  # fmt: skip
    args = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    async with served(*args) as (process, url, admin):
        connector = aiohttp.TCPConnector(limit=16, force_close=True)  # new connections
        async with aiohttp.ClientSession(connector=connector) as client:

            async def get(n: int) -> None:
                async with client.get(url + f"/w{n % 20}?n={n}") as r:
                    assert r.status == 200 and await r.read()

            await asyncio.gather(*(get(n) for n in range(400)))
            async with client.get(admin + "/stats") as r:
                answered = [w["metrics"]["requests"] for w in (await r.json())["workers"]]
        assert len(answered) == 2 and min(answered) > 0  # both workers answered
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    records = [json.loads(line) for line in _lines(log)]
    assert sorted(r["target"] for r in records) == sorted(f"/w{n % 20}?n={n}" for n in range(400))


async def test_a_request_aiohttps_handler_answers_is_timed_in_microseconds_too(
    origin, start_proxy, client, tmp_path
):
    """A POST (the connection handed to aiohttp's handler) is timed from when it was read by
    ``perf_counter`` (before: aiohttp's loop clock, whole milliseconds under uvloop, so its
    durations were multiples of 1000)."""
    log = tmp_path / "access.log"
    service = await start_proxy(server__access_log=True, server__access_log_format="json",
                                server__access_log_file=str(log))  # fmt: skip
    for _ in range(5):
        async with client.post(base(service) + "/form", data=b"body",
                               headers={"Host": "example.test"}) as r:  # fmt: skip
            await r.read()
    await until(lambda: len(_lines(log)) == 5)
    durations = [json.loads(line)["duration_us"] for line in _lines(log)]
    assert all(d > 0 for d in durations) and any(d % 1000 for d in durations), durations


REQUESTS_STUCK = 800


async def test_a_stderr_nobody_reads_costs_log_lines_never_the_answers(origin):
    """The access log and the error log on a stderr pipe whose reader stopped: the proxy goes
    on answering (its writes never wait on the pipe), the lines the pipe had no room for are
    dropped whole, and once it is read again the loss is said there."""
    port, admin = free_port(), free_port()
    settings = {"server.access_log": "true", "server.access_log_flush": "50ms",
                "upstream.origin": origin.url}  # fmt: skip
    args = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", *args, "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{admin}"],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
            await wait_healthy(client, f"http://127.0.0.1:{admin}/healthz", 10)
            # Far more lines than the pipe (64 KiB) and the log's hold (1 MiB) take, the pipe
            # never read meanwhile: lines of 3 KB, whole writes to a pipe (under PIPE_BUF).
            target = f"http://127.0.0.1:{port}/stuck?{'q' * 3000}"
            for _ in range(REQUESTS_STUCK):
                async with client.get(target) as r:
                    assert r.status == 200 and await r.read()
            async with client.get(f"http://127.0.0.1:{admin}/healthz") as r:
                assert r.status == 200
            os.set_blocking(process.stderr.fileno(), False)
            read = [_drain(process.stderr)]
            # Read again: the next flush says the loss, and writes what was held.
            async with client.get(target) as r:
                assert r.status == 200

            def written() -> bool:
                read.append(_drain(process.stderr))
                text = "".join(read)
                return "lines lost so far" in text and text.count(' HTTP/1.1" 200 ') > 300

            await until(written)  # the loss said, and what the log held written since
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    text = "".join(read)
    logged = [line for line in text.splitlines() if COMBINED.match(line)]
    assert 300 < len(logged) < REQUESTS_STUCK  # what the pipe and the hold took, then none
    others = [line for line in text.splitlines() if not COMBINED.match(line)]
    error_line = re.compile(r"^\S+Z onehit(\.\w+)* (INFO|WARNING|ERROR) ")
    assert others and all(error_line.match(line) for line in others)  # whole error-log lines


def _drain(pipe) -> str:
    """What a non-blocking pipe holds now."""
    out = b""
    while chunk := pipe.read(1 << 16):
        out += chunk
    return out.decode()


def test_a_reopen_that_cannot_open_its_path_says_so_and_logs_on_to_the_old_file(tmp_path, caplog):
    where = tmp_path / "logs"
    where.mkdir()
    log = AccessLogFile(str(where / "access.log"), "combined", 0, 1.0)
    args = ("127.0.0.1", "GET", "/x", "h", "HTTP/1.1", 200, 10, None, None, None, None, 0, None)
    log.lines.entry(5, *args)
    where.rename(tmp_path / "moved")  # the directory gone: the path cannot be opened
    log.reopen()
    log.lines.entry(5, *args)
    log.close()
    [said] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert said.startswith(f"reopening the access log {where / 'access.log'} failed")
    assert len((tmp_path / "moved" / "access.log").read_text().splitlines()) == 2
