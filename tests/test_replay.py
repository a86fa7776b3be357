"""HTTP replay through the real proxy and the embedded origin, on 127.0.0.1."""

import asyncio
import json
import signal
import sys
import time

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from conftest import admin, base

from loadgen.live.origin import OriginConfig, start_origin
from loadgen.live.replay import ReplayConfig, cache_outcome, replay
from loadgen.traces.trace import Trace, write_trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate

SIZES = SizeSpec.parse("lognormal:median=1KiB,sigma=1,max=32KiB")
# How early the event loop may run a timer: it runs those due within its clock's resolution.
TIMER_SLACK = 0.01


@pytest.fixture
def trace() -> Trace:
    return generate(WorkloadSpec(objects=200, requests=800, one_hit_share=0.3, sizes=SIZES))


@pytest.fixture
async def trace_origin(trace):
    runner, _, url = await start_origin(trace, OriginConfig(max_age=600))
    yield url
    await runner.cleanup()


async def test_origin_serves_deterministic_bodies_etags_and_404(trace, trace_origin):
    url = trace_origin
    key = trace.key_strings(0, 1)[0]
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{url}/obj/{key}") as r:
            body, etag = await r.read(), r.headers["ETag"]
            assert len(body) == int(trace.sizes[0]) and r.headers["Cache-Control"] == "max-age=600"
        async with client.get(f"{url}/obj/{key}") as r:
            assert await r.read() == body
        async with client.get(f"{url}/obj/{key}", headers={"If-None-Match": etag}) as r:
            assert r.status == 304
        async with client.get(f"{url}/obj/no-such-key") as r:
            assert r.status == 404


async def test_client_and_proxy_counts_agree_exactly_at_concurrency_1(
    trace, trace_origin, start_proxy
):
    url = trace_origin
    size = str(trace.distinct_bytes() // 10)
    proxy = await start_proxy(upstream__origin=url, cache__size=size, cache__max_object_size=size)
    result = await replay(trace, ReplayConfig(target=base(proxy), concurrency=1))
    async with aiohttp.ClientSession() as client, client.get(admin(proxy) + "/stats") as r:
        stats = (await r.json())["metrics"]
    assert result.completed == result.requests == len(trace) == stats["requests"]
    assert result.hits == stats["hits"] > 0
    assert result.outcomes["MISS"] == stats["misses"]
    assert result.histogram.get_total_count() == len(trace)
    assert result.statuses == {200: len(trace)} and not result.errors
    assert result.bytes == int(trace.sizes.sum())
    doc = result.to_dict()
    assert doc["latency_ms"]["p50"] <= doc["latency_ms"]["p99"] <= doc["latency_ms"]["max"]


async def test_a_target_refusing_connections_yields_errors_not_a_crash(trace):
    result = await replay(trace, ReplayConfig(target="http://127.0.0.1:9", max_requests=20))
    assert result.completed == 0 and result.errors["connect"] == 20
    assert result.to_dict()["hit_ratio"] == 0.0


async def test_open_loop_sends_at_the_requested_rate_whatever_the_target_does(trace, origin):
    in_flight = most = 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)  # twenty sends' time at 400/s
        in_flight -= 1
        return web.Response(body=b"x")

    origin.responder = slow
    result = await replay(trace, ReplayConfig(target=origin.url, rate=400.0, max_requests=400))
    assert result.completed == 400 == origin.hits.total()
    # Never early: the last request goes out 399/400 s after the first, whatever the target
    # (within the event loop's timer resolution, which may wake a sleep a little early).
    assert result.elapsed >= 399 / 400 - TIMER_SLACK
    # Open: it sends without waiting for answers, so a slow target has many at once.
    assert most > 1


async def test_open_loop_at_trace_time_follows_the_trace_clock(trace, trace_origin):
    url = trace_origin
    timed = Trace(np.arange(len(trace)) * 0.002, trace.ids, trace.sizes)
    result = await replay(timed, ReplayConfig(target=url, trace_time=True, max_requests=250))
    # Never ahead of the trace: its 250th request is 0.498 s of trace time after the first.
    assert result.completed == 250 and result.elapsed >= 249 * 0.002 - TIMER_SLACK


async def test_time_bound_stops_a_run_with_partial_results(trace, trace_origin):
    url = trace_origin
    result = await replay(trace, ReplayConfig(target=url, rate=100.0, max_seconds=0.5))
    # At 100/s, no more than 51 requests are due in 0.5 s, however fast the target answers.
    assert 1 <= result.completed <= 51 < len(trace) and not result.interrupted


async def test_ctrl_c_stops_the_replay_command_with_partial_results_written(trace, tmp_path):
    runner, origin, url = await start_origin(trace)
    write_trace(trace, tmp_path / "trace.csv")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadgen", "replay", "--trace", str(tmp_path / "trace.csv"),
        "--target", url, "--rate", "200", "--output", str(tmp_path / "out"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while origin.requests < 50 and time.monotonic() < deadline:  # 800 take 4 s at 200/s
        await asyncio.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, _ = await asyncio.wait_for(process.communicate(), 20)
    await runner.cleanup()
    assert process.returncode == 130, out
    written = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert written["interrupted"] and 0 < written["completed"] < len(trace)
    assert b"interrupted: partial results" in out


def test_cache_outcome_reads_x_cache_then_cache_status():
    assert cache_outcome({"X-Cache": "HIT"}) == "HIT"
    assert cache_outcome({"X-Cache": "miss from edge, HIT from shield"}) == "MISS"
    assert cache_outcome({"Cache-Status": "onehit; hit; ttl=30"}) == "HIT"
    assert cache_outcome({"Cache-Status": "onehit; fwd=uri-miss"}) == "MISS"
    assert cache_outcome({}) == "-"
