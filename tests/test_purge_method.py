"""PURGE on the data port, as Varnish users send it: from the addresses ``[server] purge_from``
lists, it removes what a GET of the URL is answered from, keyed as that GET is keyed; from any
other address it is refused and never reaches the origin; while it is off, it passes through."""

import asyncio
import os
import signal

import aiohttp
import pytest
from conftest import admin, base, served


async def _send(client, service, method: str, path: str, host: str = "example.test"):
    async with client.request(method, base(service) + path, headers={"Host": host}) as r:
        body = await r.read()
        return r.status, r.headers.get("X-Cache", ""), body


async def test_a_purge_from_an_allowed_address_removes_the_stored_response(
    origin, start_proxy, client
):
    service = await start_proxy(server__purge_from=["127.0.0.1"], cache__key_query_sort=True)
    for _ in range(2):
        await _send(client, service, "GET", "/a?y=2&x=1")
    assert (await _send(client, service, "GET", "/a?x=1&y=2"))[1] == "HIT"
    status, _, body = await _send(client, service, "PURGE", "/a?y=2&x=1", host="EXAMPLE.test")
    assert status == 200
    assert body == b'{"removed": 1, "key": "http://example.test/a?x=1&y=2"}'
    assert (await _send(client, service, "GET", "/a?x=1&y=2"))[1] != "HIT"
    assert sum(n for p, n in origin.hits.items() if p.startswith("/a")) == 3  # no PURGE


async def test_a_purge_from_another_address_is_refused_and_never_reaches_the_origin(
    origin, start_proxy, client
):
    service = await start_proxy(server__purge_from=["10.0.0.0/8"])
    for _ in range(2):
        await _send(client, service, "GET", "/b")
    status, _, _ = await _send(client, service, "PURGE", "/b")
    assert status == 405
    assert (await _send(client, service, "GET", "/b"))[1] == "HIT"
    assert origin.hits["/b"] == 2  # the two GETs that stored it


async def test_while_purge_from_is_empty_purge_passes_to_the_origin(origin, start_proxy, client):
    service = await start_proxy()
    status, _, _ = await _send(client, service, "PURGE", "/c")
    assert status == 200 and origin.hits["/c"] == 1


async def test_the_admin_purge_answer_names_the_key_it_used(origin, start_proxy, client):
    service = await start_proxy()
    port = service.proxy_address[1]
    for _ in range(2):
        await _send(client, service, "GET", "/d", host=f"localhost:{port}")
    async with client.post(admin(service) + "/purge",
                           json={"url": f"http://127.0.0.1:{port}/d"}) as r:  # fmt: skip
        answer = await r.json()
    assert answer == {"removed": 0, "key": f"http://127.0.0.1:{port}/d"}  # not how it was keyed
    async with client.post(admin(service) + "/purge",
                           json={"url": f"http://localhost:{port}/d"}) as r:  # fmt: skip
        assert await r.json() == {"removed": 1, "key": f"http://localhost:{port}/d"}


@pytest.mark.slow
async def test_a_purge_through_one_worker_reaches_every_workers_memory(origin):
    args = ("--workers", "2", "--origin", origin.url, "--admission", "always",
            "--set", "server.access_log=false", "--set", "server.purge_from=127.0.0.1")  # fmt: skip
    async with served(*args) as (process, url, _):
        connector = aiohttp.TCPConnector(force_close=True)  # new connections: either worker
        async with aiohttp.ClientSession(connector=connector) as client:

            async def get() -> str:
                async with client.get(url + "/w", headers={"Host": "example.test"}) as r:
                    await r.read()
                    return r.headers["X-Origin-Count"]

            assert {await get() for _ in range(12)} == {"1"}  # both workers hold it
            async with client.request("PURGE", url + "/w", headers={"Host": "example.test"}) as r:
                assert r.status == 200
                assert (await r.json())["missing"] == 0  # it reached the other worker
            # Fetched again, never the purged copy: by one worker, or by both when the second
            # asks before the first has written the new copy to the shared tier (the client
            # may read its last byte first, on a loaded machine).
            again = {await get() for _ in range(12)}
            assert "1" not in again and again <= {"2", "3"}
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


@pytest.mark.slow
async def test_a_purge_that_cannot_reach_a_worker_says_so(origin):
    """A worker being replaced is not reached by a PURGE through another: the answer says
    how many it missed (``missing``), as the admin's ``/purge`` does; its memory is empty."""
    args = ("--workers", "2", "--origin", origin.url, "--set", "server.access_log=false",
            "--set", "server.purge_from=127.0.0.1")  # fmt: skip
    async with served(*args) as (process, url, admin_url):
        async with aiohttp.ClientSession() as client:
            async with client.get(admin_url + "/stats") as r:
                pid = (await r.json())["workers"][0]["pid"]
            os.kill(pid, signal.SIGKILL)
            answer = None
            for _ in range(20):  # a connection the dying worker's socket took is reset
                try:
                    async with client.request("PURGE", url + "/w",
                                              headers={"Host": "example.test"}) as r:  # fmt: skip
                        answer = (r.status, await r.json())
                    break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.01)
            assert answer is not None, "no PURGE was answered"
            assert (answer[0], answer[1]["missing"]) == (200, 1), answer
            for _ in range(200):  # replaced, then a purge reaches it again
                async with client.get(admin_url + "/stats") as r:
                    stats = await r.json()
                if stats["workers_replaced"] == 1 and stats["missing"] == 0:
                    break
                await asyncio.sleep(0.05)
            async with client.request("PURGE", url + "/w", headers={"Host": "example.test"}) as r:
                assert (await r.json())["missing"] == 0
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
