"""/healthz says the process answers; /readyz says whether it can do its whole job now, each
check with its reason: its origins accept connections, Redis answers, its disk takes files."""

import asyncio
import shutil

from conftest import admin, base

from loadgen.live.processes import free_port
from proxy.config.settings import load
from proxy.ops.service import Service
from proxy.origin.health import WINDOW, OriginHealth


async def _ready(client, service) -> tuple[int, dict]:
    async with client.get(admin(service) + "/readyz") as r:
        return r.status, await r.json()


async def test_not_ready_while_an_origin_refuses_connections(origin, client):
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = {"server.listen": "127.0.0.1:0", "admin.listen": "127.0.0.1:0",
                "server.access_log": False, "upstream.origin": origin.url}  # fmt: skip
    service = await Service.start(
        load(env={"ONEHIT_ROUTES": f"down.test={gone}"}, overrides=settings)
    )
    try:
        status, answer = await _ready(client, service)
        async with client.get(admin(service) + "/healthz") as r:
            alive = r.status
    finally:
        await service.stop()
    assert status == 503 and answer["ready"] is False
    checks = {c["name"]: c for c in answer["checks"]}
    assert checks["origin default"] == {"name": "origin default", "ok": True,
                                        "reason": "accepts connections"}  # fmt: skip
    assert not checks["origin down.test"]["ok"]
    assert checks["origin down.test"]["reason"] == "cannot connect (ECONNREFUSED)"
    assert "127.0.0.1" not in str(answer)  # no address to whoever asks, without a token
    assert alive == 200  # the process answers all the same


async def test_ready_with_every_origin_up_and_its_disk_writable_then_not(
    origin, start_proxy, client, tmp_path
):
    service = await start_proxy(disk__path=str(tmp_path / "disk"))
    async with client.get(base(service) + "/x", headers={"Host": "example.test"}) as r:
        assert r.status == 200
    status, answer = await _ready(client, service)
    assert status == 200 and answer["ready"] is True
    assert {c["name"] for c in answer["checks"]} == {"origin default", "disk"}
    shutil.rmtree(tmp_path / "disk")
    deadline = asyncio.get_running_loop().time() + 5
    while status == 200 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)  # a check runs at most once a second: the next one sees it
        status, answer = await _ready(client, service)
    [disk] = [c for c in answer["checks"] if c["name"] == "disk"]
    assert status == 503 and not disk["ok"] and "no file can be written" in disk["reason"]
    assert not list(tmp_path.rglob(".onehit-probe-*"))  # the probe leaves nothing


async def test_probes_at_once_share_one_run_of_the_checks(raw_origin, client):
    """/readyz needs no token: a flood of probes opens one connection to the origin a
    second, not one each."""
    accepted = []

    async def count(reader, writer):
        accepted.append(1)
        writer.close()

    url = await raw_origin(count)
    settings = {"server.listen": "127.0.0.1:0", "admin.listen": "127.0.0.1:0",
                "server.access_log": False, "upstream.origin": url}  # fmt: skip
    service = await Service.start(load(env={}, overrides=settings))
    try:
        answers = await asyncio.gather(*(_ready(client, service) for _ in range(50)))
    finally:
        await service.stop()
    assert {status for status, _ in answers} == {200}
    assert len(accepted) == 1


async def test_an_origin_that_accepts_connections_and_answers_errors_is_not_ready(
    origin, start_proxy, client
):
    origin.set("/bad", status=503, body=b"down", headers={})  # not stored: each one fetched
    service = await start_proxy()
    for _ in range(25):
        async with client.get(base(service) + "/bad", headers={"Host": "example.test"}) as r:
            assert r.status == 503
    status, answer = await _ready(client, service)
    [check] = answer["checks"]
    assert status == 503 and check == {
        "name": "origin default", "ok": False,
        "reason": "25 of its last 25 requests within a minute failed or got 502-504",
    }  # fmt: skip


async def test_urls_the_application_fails_and_other_methods_never_count_against_the_origin(
    origin, start_proxy, client
):
    """A client cannot take an instance out by asking for what the application answers 500
    (a crafted URL a second) or for a method it does not implement (501): neither says the
    origin is down."""
    service = await start_proxy()
    for i in range(30):
        origin.set(f"/err{i}", status=500, body=b"bug", headers={})
        async with client.get(base(service) + f"/err{i}", headers={"Host": "example.test"}) as r:
            assert r.status == 500
    origin.set("/options", status=503, body=b"no", headers={})
    for _ in range(30):
        async with client.request("OPTIONS", base(service) + "/options",
                                  headers={"Host": "example.test"}) as r:  # fmt: skip
            assert r.status == 503
    status, answer = await _ready(client, service)
    assert status == 200 and answer["ready"] is True


def test_an_origins_outcomes_are_forgotten_after_a_minute():
    """One that recovered is judged by what it did lately, even while only hits reach the
    proxy (no new request to it)."""
    now = [0.0]
    health = OriginHealth(clock=lambda: now[0])
    for _ in range(30):
        health.answered(("o", 80), "GET", 503)
    assert health.failing(("o", 80)) == (30, 30)
    now[0] = WINDOW + 1
    assert health.failing(("o", 80)) == (0, 0)


def test_a_dropped_upload_is_not_the_origins_failure():
    health = OriginHealth()
    health.failed(("o", 80), "GET", streamed_body=True)
    health.failed(("o", 80), "POST")
    assert health.failing(("o", 80)) == (0, 0)
    health.failed(("o", 80), "GET")
    assert health.failing(("o", 80)) == (1, 1)


async def test_what_the_proxy_answers_itself_never_counts_against_the_origin(
    origin, start_proxy, client
):
    """A client cannot take an instance out of its load balancer: 504s for only-if-cached
    misses never reached the origin."""
    service = await start_proxy()
    for i in range(40):
        async with client.get(base(service) + f"/nothing{i}",
                              headers={"Host": "example.test",
                                       "Cache-Control": "only-if-cached"}) as r:  # fmt: skip
            assert r.status == 504
    status, answer = await _ready(client, service)
    assert status == 200 and answer["ready"] is True
