"""A route's several origin servers (``[[routes]] servers``, ``proxy.origin.servers``): weighted,
backups, marked down after ``max_fails`` within ``fail_timeout``, a GET or HEAD retried on the
next server when one fails before any byte of its answer; with real origins that die, hang and
come back."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest
from aiohttp import web
from conftest import admin, base

from loadgen.live.processes import free_port
from proxy.config.settings import Server
from proxy.origin.servers import ServerGroup

HOST = {"Host": "www.example.test"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_smooth_weighted_round_robin_spreads_each_servers_share():
    group = ServerGroup([Server("http://a:1", 3), Server("http://b:1", 1)])
    picks = [group.pick() for _ in range(8)]
    assert Counter(picks) == {"http://a:1": 6, "http://b:1": 2}
    assert picks[:4].count("http://b:1") == 1  # spread, not bunched: a a b a as nginx's


def test_a_server_is_down_for_fail_timeout_after_max_fails_then_asked_again():
    clock = Clock()
    group = ServerGroup([Server("http://a:1"), Server("http://b:1")], max_fails=2,
                        fail_timeout=10.0, clock=clock)  # fmt: skip
    group.failed("http://a:1")
    assert group.up("http://a:1")  # one failure of two
    clock.now = 11.0
    group.failed("http://a:1")  # the first is past fail_timeout: counted afresh
    assert group.up("http://a:1")
    group.failed("http://a:1")
    assert not group.up("http://a:1") and {group.pick() for _ in range(4)} == {"http://b:1"}
    clock.now = 21.5
    assert group.up("http://a:1") and "http://a:1" in {group.pick() for _ in range(2)}


def test_backups_are_asked_only_while_no_primary_is_up_and_all_when_none_is():
    clock = Clock()
    group = ServerGroup([Server("http://a:1"), Server("http://b:1", backup=True)],
                        fail_timeout=5.0, clock=clock)  # fmt: skip
    assert {group.pick() for _ in range(4)} == {"http://a:1"}
    group.failed("http://a:1")
    assert group.pick() == "http://b:1"
    group.failed("http://b:1")
    assert group.pick() in {"http://a:1", "http://b:1"}  # every one down: a guess
    assert group.pick({"http://a:1", "http://b:1"}) is None


def test_a_probe_answered_lifts_only_what_a_probe_set_down():
    """A server whose probe passes while its requests fail stays down for fail_timeout (a
    passing probe put it back in rotation, a failed request each time)."""
    clock = Clock()
    group = ServerGroup([Server("http://a:1"), Server("http://b:1")], fail_timeout=10.0,
                        clock=clock)  # fmt: skip
    group.failed("http://b:1")
    group.probed("http://b:1", True)
    assert not group.up("http://b:1")
    group.probed("http://a:1", False)
    group.succeeded("http://a:1")  # a request answered does not undo a failed probe
    assert not group.up("http://a:1")
    clock.now = 10.5
    assert group.up("http://b:1") and not group.up("http://a:1")
    group.probed("http://a:1", True)
    assert group.up("http://a:1")


class Backend:
    """An origin server on a port of its own, stopped and started again on it; ``hang``
    makes it accept requests and never answer."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.seen: Counter[str] = Counter()
        self.hang = False
        self.health = 200  # what the probe path answers
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/healthz":  # the probe's, not counted
            return web.Response(status=self.health)
        self.seen[request.method] += 1
        if self.hang:
            await asyncio.sleep(30)
        return web.Response(body=f"{self.name} {request.path}".encode(),
                            headers={"Cache-Control": "no-store"})  # fmt: skip

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@pytest.fixture
async def backends():
    made = [Backend("a"), Backend("b")]
    for backend in made:
        await backend.start()
    yield made
    for backend in made:
        await backend.stop()


async def fetch(service, path: str, method: str = "GET") -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as client,
        client.request(method, base(service) + path, headers=HOST) as r,
    ):
        return r.status, await r.read()


def route(*servers, **extra) -> list[dict]:
    return [{"host": "www.example.test", "servers": list(servers), **extra}]


async def test_requests_spread_by_weight_and_fail_over_while_a_server_is_dead(
    start_proxy, backends
):
    a, b = backends
    service = await start_proxy(routes=route({"url": a.url, "weight": 2}, b.url,
                                             max_fails=1, fail_timeout="1s"))  # fmt: skip
    answers = [await fetch(service, f"/{i}") for i in range(6)]
    assert {status for status, _ in answers} == {200} and (a.seen["GET"], b.seen["GET"]) == (4, 2)
    await a.stop()  # a dies: its next request fails over to b, then a is down
    answers = [await fetch(service, f"/d{i}") for i in range(4)]
    assert answers == [(200, f"b /d{i}".encode()) for i in range(4)]
    async with (
        aiohttp.ClientSession() as client,
        client.get(admin(service) + "/readyz") as ready,
        client.get(admin(service) + "/metrics") as metrics,
    ):
        checks = (await ready.json())["checks"]
        text = await metrics.text()
    [check] = [c for c in checks if c["name"] == "origin www.example.test"]
    assert check["ok"] and check["reason"].startswith("1 of 2 servers ready (server 1:")
    assert f'onehit_origin_server_up{{route="www.example.test",server="{a.url}"' in text
    assert f'server="{a.url}",backup="false"}} 0' in text
    await a.start()  # a comes back: asked again once fail_timeout passed
    await asyncio.sleep(1.1)
    before = a.seen["GET"]
    for i in range(6):
        assert (await fetch(service, f"/r{i}"))[0] == 200
    assert a.seen["GET"] > before


async def test_a_server_that_hangs_is_left_for_the_next_within_the_read_timeout(
    start_proxy, backends
):
    a, b = backends
    a.hang = True
    service = await start_proxy(routes=route(a.url, {"url": b.url, "backup": True}),
                                upstream__read_timeout="300ms")  # fmt: skip
    assert await fetch(service, "/slow") == (200, b"b /slow")


async def test_what_is_not_idempotent_is_never_sent_twice(start_proxy, backends):
    a, b = backends
    a.hang = True
    service = await start_proxy(routes=route(a.url, {"url": b.url, "backup": True}),
                                upstream__read_timeout="300ms")  # fmt: skip
    status, _ = await fetch(service, "/form", "POST")
    assert status == 504 and (a.seen["POST"], b.seen["POST"]) == (1, 0)


async def test_misses_of_one_url_still_share_one_fetch(start_proxy, backends):
    a, b = backends
    service = await start_proxy(routes=route(a.url, b.url), admission__policy="always")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        (a if request.url.port == a.port else b).seen["shared"] += 1
        return web.Response(body=b"one", headers={"Cache-Control": "max-age=60"})

    for backend in backends:
        backend.handle = slow  # type: ignore[method-assign]
        await backend.stop()
        await backend.start()
    answers = await asyncio.gather(*(fetch(service, "/same") for _ in range(8)))
    assert answers == [(200, b"one")] * 8 and a.seen["shared"] + b.seen["shared"] == 1


async def test_a_route_of_one_origin_beside_a_group_of_it_is_never_sent_to_the_group(
    start_proxy, backends
):
    """A group is the route's own: another route (or the default origin) naming its first
    server keeps that one server (before: half its requests went to the group's others)."""
    a, b = backends
    service = await start_proxy(upstream__origin=a.url, routes=[
        {"host": "www.example.test", "servers": [a.url, b.url]},
        {"host": "plain.example.test", "origin": a.url},
    ])  # fmt: skip
    for i in range(6):
        for host in ("plain.example.test", "other.example.test"):  # a route, the default
            async with (
                aiohttp.ClientSession() as client,
                client.get(base(service) + f"/{host}/{i}", headers={"Host": host}) as r,
            ):
                assert (r.status, await r.read()) == (200, f"a /{host}/{i}".encode())
    assert b.seen["GET"] == 0


def test_a_reload_that_changes_only_a_routes_servers_purges_nothing():
    from proxy.config.settings import load
    from proxy.ops.reload import key_rules, keys_built_otherwise

    def config(servers, **extra):
        return load(env={}, overrides={"routes": route(*servers, **extra)})

    old = config(["http://10.0.0.1:80", "http://10.0.0.2:80"])
    new = config([{"url": "http://10.0.0.1:80", "weight": 3}, "http://10.0.0.3:80",
                  {"url": "http://10.0.0.2:80", "backup": True}], max_fails=5)  # fmt: skip
    assert keys_built_otherwise(old, new) == () and key_rules(old) == key_rules(new)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"origin": "http://10.0.0.1:80", "max_fails": 3}, "judge a route's servers"),
        ({"servers": ["http://10.0.0.1:80"], "probe": {"path": "healthz"}}, "probe path"),
        ({"servers": ["http://10.0.0.1:80"], "probe": {"expect": "ok"}}, "probe expect"),
        ({"servers": ["http://10.0.0.1:80"], "probe": {"interval": "1ms"}}, "at least 0.1s"),
        ({"servers": ["http://10.0.0.1:80"], "max_fails": -1}, "route www.example.test max_fails"),
        ({"servers": ["http://10.0.0.1:80"], "fail_timeout": "soon"}, "fail_timeout"),
        ({"servers": [{"url": "http://10.0.0.1:80", "backup": True}]}, "every server is a backup"),
        ({"servers": ["http://10.0.0.1:80", "http://10.0.0.1:80"]}, "named twice"),
        ({"servers": [{"url": "http://10.0.0.1:80", "weight": 0}]}, "whole number >= 1"),
        ({"servers": []}, "expected a list"),
    ],
)
def test_a_bad_server_list_names_its_key_and_the_fix(given, named):
    from proxy.config.settings import ConfigError, load

    with pytest.raises(ConfigError) as raised:
        load(env={}, overrides={"routes": [{"host": "www.example.test", **given}]})
    assert named in str(raised.value)


async def test_a_probe_takes_a_server_out_before_any_request_fails_and_back_when_it_answers(
    start_proxy, backends
):
    a, b = backends
    a.health = 503
    probe = {"path": "/healthz", "interval": "100ms", "expect": 200}
    service = await start_proxy(routes=route(a.url, b.url, probe=probe))
    await asyncio.sleep(0.3)  # a probe or two
    answers = [await fetch(service, f"/p{i}") for i in range(4)]
    assert {body.split()[0] for _, body in answers} == {b"b"} and a.seen["GET"] == 0
    a.health = 200
    await asyncio.sleep(0.3)
    answers = [await fetch(service, f"/q{i}") for i in range(4)]
    assert {body.split()[0] for _, body in answers} == {b"a", b"b"}
