"""A configuration read again while serving (SIGHUP, POST /reload): what may change takes effect
for the next requests, with no request failed and no cached object lost but what a smaller
memory tier evicts and what the new rules key or fetch otherwise (purged); what cannot
change, or does not load, changes nothing."""

import asyncio
import os
import signal
import socket
import threading

import aiohttp
import pytest
from conftest import admin, base, served, until

from proxy.config.settings import load
from proxy.ops.reload import KEYED, LIVE, STOPPING, keys_built_otherwise
from proxy.ops.service import Service, hold_signals, until_signalled

HOST = {"Host": "example.test"}


def _write(path, size="1MiB", hit_for_miss="5s", routes="", policy="second-hit", extra="",
           max_object=None):  # fmt: skip
    largest = f'max_object_size = "{max_object}"\n' if max_object else ""
    path.write_text(
        f'[cache]\nsize = "{size}"\nhit_for_miss = "{hit_for_miss}"\n{largest}'
        f'[admission]\npolicy = "{policy}"\n{extra}{routes}'
    )


@pytest.fixture
async def reloadable(origin, tmp_path):
    """A proxy started from a file it reads again on a reload; (the service, the file)."""
    path = tmp_path / "proxy.toml"
    _write(path)
    flags = {"upstream.origin": origin.url, "server.listen": "127.0.0.1:0",
             "admin.listen": "127.0.0.1:0", "server.access_log": False}  # fmt: skip

    def read():
        return load(path, env={}, overrides=flags)

    service = await Service.start(read(), read_config=read)
    yield service, path
    await service.stop()


def canned(answer: bytes):
    """A raw server's handler: each connection's request answered with ``answer``, then
    closed."""

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    return handle


async def _reload(client, service) -> tuple[int, dict]:
    async with client.post(admin(service) + "/reload", json={}) as r:
        return r.status, await r.json()


async def _get(client, service, path: str, host: str = "example.test") -> tuple[int, str]:
    async with client.get(base(service) + path, headers={"Host": host}) as r:
        await r.read()
        return r.status, r.headers.get("X-Cache", "")


async def test_a_smaller_memory_tier_evicts_to_its_new_size_and_keeps_the_rest(
    origin, reloadable, client
):
    service, path = reloadable
    origin.set("/big", body=b"x" * 20_000)
    for i in range(40):
        origin.set(f"/o{i}", body=b"y" * 20_000)
        for _ in range(2):
            await _get(client, service, f"/o{i}")
    store = service.proxy.engine.store
    assert len(store) == 40 and store.bytes_used > 512 * 1024
    _write(path, size="256KiB")
    status, answer = await _reload(client, service)
    # The largest object follows the size unless set: both change.
    assert (status, answer) == (
        200,
        {"reloaded": True, "changed": ["cache.size", "cache.max_object_size"], "purged": []},
    )
    assert store.capacity_bytes == 256 * 1024 and store.bytes_used <= 256 * 1024
    kept = [key.rsplit("/", 1)[1] for key in store]
    assert 0 < len(kept) < 40
    for name in kept:  # what was not evicted is still answered from memory
        assert await _get(client, service, f"/{name}") == (200, "HIT")
    assert service.config.cache.size == 256 * 1024


async def test_a_larger_largest_object_is_kept_whole_after_a_reload(origin, reloadable, client):
    """A body the old max_object_size refused, arriving chunked (no length to judge by):
    kept whole under the new one, and its hits are the whole body."""
    service, path = reloadable
    body = b"z" * 2_000_000
    origin.set("/large", body=body, chunked=True)
    assert service.proxy.engine.store.max_object_bytes < len(body)
    _write(path, size="8MiB", max_object="4MiB")
    status, _ = await _reload(client, service)
    assert status == 200
    for _ in range(3):
        async with client.get(base(service) + "/large", headers=HOST) as r:
            got = (await r.read(), r.headers.get("X-Cache"))
    assert got == (body, "HIT")


async def test_a_new_route_and_admission_take_effect_for_the_next_request(
    origin, raw_origin, reloadable, client
):
    service, path = reloadable

    other = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nother"
    elsewhere = await raw_origin(canned(other))

    async def body(host: str) -> bytes:
        async with client.get(base(service) + "/r", headers={"Host": host}) as r:
            return await r.read()

    assert await body("new.example") != b"other"  # the default origin's, before
    routes = f'[[routes]]\nhost = "new.example"\norigin = "{elsewhere}"\n'
    _write(path, routes=routes, policy="always")
    status, answer = await _reload(client, service)
    assert status == 200 and set(answer["changed"]) >= {"routes", "admission.policy"}
    assert await body("new.example") == b"other"
    assert (await _get(client, service, "/once"))[0] == 200  # stored on its first request
    assert await _get(client, service, "/once") == (200, "HIT")


async def test_new_ttl_rules_are_taken_for_the_responses_stored_next(origin, reloadable, client):
    service, path = reloadable
    origin.set("/a", headers={})  # nothing fresh to say: stored only by a rule
    origin.set("/b", headers={})
    for _ in range(3):
        assert await _get(client, service, "/a") == (200, "MISS")
    _write(path, extra='[[ttl]]\ndefault = "1m"\n')
    assert await _reload(client, service) == (
        200, {"reloaded": True, "changed": ["ttl"], "purged": []}
    )  # fmt: skip
    answers = [await _get(client, service, "/b") for _ in range(3)]
    assert answers[-1] == (200, "HIT") and origin.hits["/b"] == 2  # the second sighting stores


async def test_a_configuration_that_does_not_load_or_needs_a_restart_changes_nothing(
    origin, reloadable, client, caplog
):
    service, path = reloadable
    for _ in range(2):
        await _get(client, service, "/kept")
    path.write_text('[cache]\nsize = "lots"\n')
    status, answer = await _reload(client, service)
    assert status == 409 and answer["reloaded"] is False and "[cache] size" in answer["error"]
    _write(path, extra='[disk]\npath = "/tmp/elsewhere"\n')
    status, answer = await _reload(client, service)
    assert status == 409 and answer["error"] == ("disk.path changed, which takes a restart")
    assert service.proxy.engine.store.capacity_bytes == 1 << 20  # the running one stays
    assert await _get(client, service, "/kept") == (200, "HIT")
    refusals = [r for r in caplog.records if "reload refused" in r.getMessage()]
    assert len(refusals) == 2


async def test_a_process_given_its_configuration_refuses_a_reload(start_proxy, client):
    service = await start_proxy()
    status, answer = await _reload(client, service)
    assert status == 409 and "none to read again" in answer["error"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
async def test_reloads_under_load_lose_no_request_and_no_cached_object(origin, tmp_path, workers):
    """Clients keep asking for stored objects and new ones through three SIGHUPs (each
    changing what a reload may change); every request is answered 200, and every object
    stored before is still a hit after."""
    path = tmp_path / "proxy.toml"
    _write(path, size="8MiB")
    for i in range(50):
        origin.set(f"/s{i}", body=b"s" * 2000)
    args = ("--config", str(path), "--origin", origin.url, "--set", "server.access_log=false",
            "--workers", str(workers))  # fmt: skip
    async with served(*args) as (process, url, admin_url):
        connector = aiohttp.TCPConnector(force_close=workers > 1)  # spread over workers
        async with aiohttp.ClientSession(connector=connector) as client:

            async def get(p: str) -> tuple[int, str]:
                async with client.get(url + p) as r:
                    await r.read()
                    return r.status, r.headers.get("X-Cache", "")

            for i in range(50):
                while (await get(f"/s{i}"))[1] != "HIT":
                    pass
            statuses: list[int] = []
            going = True

            async def load_one(n: int) -> None:
                i = 0
                while going:
                    statuses.append((await get(f"/s{i % 50}"))[0])
                    statuses.append((await get(f"/new{n}-{i}"))[0])
                    i += 1

            clients = [asyncio.ensure_future(load_one(n)) for n in range(4)]
            for hit_for_miss in ("1s", "2s", "3s"):
                _write(path, size="8MiB", hit_for_miss=hit_for_miss)
                process.send_signal(signal.SIGHUP)
                before = len(statuses)
                await until(lambda before=before: len(statuses) >= before + 100)
            going = False
            await asyncio.gather(*clients)
            assert len(statuses) > 100 and set(statuses) == {200}
            assert [await get(f"/s{i}") for i in range(50)] == [(200, "HIT")] * 50
            async with client.post(admin_url + "/reload", json={}) as r:
                answer = await r.json()
            # Nothing left to change: every process took the last SIGHUP's hit_for_miss.
            assert r.status == 200 and answer["reloaded"] is True and answer["changed"] == []
            if workers > 1:
                assert [w["changed"] for w in answer["workers"]] == [[]] * workers
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


def test_the_operators_guide_names_every_key_a_reload_takes():
    import re
    from pathlib import Path

    from proxy.ops.reload import LIVE

    text = (Path(__file__).resolve().parent.parent / "docs/operations.md").read_text()
    section = text[text.index("## Reload") : text.index("## Signals")]
    named = {key.split(".")[-1] for key in LIVE - {"routes"}}
    # Each as `name` or `[section] name`; the route table in words.
    missing = [n for n in named if not re.search(rf"(`|\] ){n}`", section)]
    assert not missing and "the routes" in section, missing
    assert "`[admission]` policy" in section  # LIVE_ADMISSION, for one process


@pytest.mark.slow
async def test_the_reload_flag_asks_the_running_proxy_and_says_what_it_did(origin, tmp_path):
    import subprocess
    import sys

    path = tmp_path / "proxy.toml"
    _write(path)
    args = ("--config", str(path), "--origin", origin.url, "--set", "server.access_log=false")
    async with served(*args) as (process, _, admin_url):
        flags = [*args, "--admin-listen", admin_url.removeprefix("http://"), "--reload"]

        def reload() -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "proxy", *flags], capture_output=True,
                                  text=True, timeout=60)  # fmt: skip

        _write(path, hit_for_miss="9s")
        done = await asyncio.to_thread(reload)
        assert done.returncode == 0 and '"cache.hit_for_miss"' in done.stdout, done.stderr
        _write(path, extra='[disk]\npath = "/tmp/elsewhere"\n')
        done = await asyncio.to_thread(reload)
        assert done.returncode == 1 and "disk.path changed, which takes a restart" in done.stdout
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


async def test_new_listen_addresses_are_taken_and_connections_on_the_old_go_on(origin, tmp_path):
    from loadgen.live.processes import free_port

    path = tmp_path / "proxy.toml"

    def write(port: int, admin_port: int) -> None:
        path.write_text(f'[server]\nlisten = "127.0.0.1:{port}"\naccess_log = false\n'
                        f'[admin]\nlisten = "127.0.0.1:{admin_port}"\n')  # fmt: skip

    def read():
        return load(path, env={}, overrides={"upstream.origin": origin.url})

    old, old_admin = free_port(), free_port()
    write(old, old_admin)
    service = await Service.start(read(), read_config=read)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", old)  # kept alive
        ask = b"GET /k HTTP/1.1\r\nHost: example.test\r\n\r\n"
        taken = socket.socket()  # an address another process holds
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        write(taken.getsockname()[1], old_admin)
        async with aiohttp.ClientSession() as client:
            async with client.post(f"http://127.0.0.1:{old_admin}/reload", json={}) as r:
                refused = (r.status, await r.json())
            assert refused[0] == 409 and "cannot listen" in refused[1]["error"]
            new, new_admin = free_port(), free_port()
            write(new, new_admin)
            async with client.post(f"http://127.0.0.1:{old_admin}/reload", json={}) as r:
                moved = (r.status, await r.json())
            assert moved[0] == 200 and set(moved[1]["changed"]) == {"server.listen",
                                                                    "admin.listen"}  # fmt: skip
            assert service.proxy_address == ("127.0.0.1", new)
            async with client.get(f"http://127.0.0.1:{new}/k", headers=HOST) as r:
                assert r.status == 200
            async with client.get(f"http://127.0.0.1:{new_admin}/healthz") as r:
                assert r.status == 200
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", old)
        writer.write(ask)  # the connection accepted before goes on
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()
        taken.close()
    finally:
        await service.stop()


async def test_reloads_at_once_move_the_listener_once_each_and_leave_one(origin):
    """Two reloads asked together (a SIGHUP storm, two POST /reload) run one after the other:
    the second moves on from where the first left the listener, and nothing it opened is left
    listening, during the run or after the stop."""
    from loadgen.live.processes import free_port

    ports = [free_port(), free_port(), free_port()]
    reads = iter(ports)

    def read():
        settings = {"upstream.origin": origin.url, "server.listen": f"127.0.0.1:{next(reads)}",
                    "admin.listen": "127.0.0.1:0", "server.access_log": False}  # fmt: skip
        return load(env={}, overrides=settings)

    service = await Service.start(read(), read_config=read)
    try:
        first, second = await asyncio.gather(service.reload(), service.reload())
        assert first.changed == second.changed == ("server.listen",)
        assert len(service.proxy_runner.sites) == 1
        assert service.proxy_address == ("127.0.0.1", ports[2])
        for gone in ports[:2]:
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", gone)
        taken = socket.socket()  # a refused move leaves no listener registered behind it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports.append(taken.getsockname()[1])
        reads = iter(ports[3:])
        assert (await service.reload()).refused
        assert len(service.proxy_runner.sites) == 1
        taken.close()
    finally:
        await service.stop()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", ports[2])
    assert (await service.reload()).refused == STOPPING


async def test_the_reload_flag_says_plainly_when_something_else_answers(tmp_path):
    """An admin address that another server holds (an HTML error page): exit 2 and a line
    naming it, not a traceback."""
    import subprocess
    import sys

    html = canned(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n"
                  b"Content-Length: 13\r\nConnection: close\r\n\r\n<html></html>")  # fmt: skip
    server = await asyncio.start_server(html, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    path = tmp_path / "proxy.toml"
    # A disk directory this user cannot use: --reload leaves it to the running proxy to judge.
    path.write_text(f'[upstream]\norigin = "http://127.0.0.1:9"\n[admin]\n'
                    f'listen = "127.0.0.1:{port}"\n[disk]\npath = "/proc/onehit"\n')  # fmt: skip
    try:
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "proxy", "--config", str(path), "--reload"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        server.close()
    assert done.returncode == 2, done.stderr
    assert "answered 404, not as onehit's admin does" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
async def test_a_worker_replaced_after_a_refused_reload_runs_the_machines_configuration(
    origin, tmp_path
):
    """A refused reload leaves an edited file; a worker replaced after it (a crash, an OOM
    kill) runs the machine's configuration, not the file: its cache keys and its admin token
    are the others' (a PURGE through either reaches both)."""

    async def echo(request):
        count = str(origin.hits[request.path_qs])
        fields = {"Cache-Control": "max-age=600", "X-Origin-Count": count}
        return aiohttp.web.Response(text=request.path_qs, headers=fields)

    origin.responder = echo
    path = tmp_path / "proxy.toml"
    path.write_text(
        '[cache]\nkey_query = {include = ["id", "lang"]}\n[admission]\npolicy = "always"\n'
        '[admin]\ntoken = "first"\n[server]\npurge_from = ["127.0.0.1"]\n'
    )
    token = {"Authorization": "Bearer first"}
    args = ("--config", str(path), "--workers", "2", "--origin", origin.url,
            "--set", "server.access_log=false")  # fmt: skip
    async with served(*args, token="first") as (process, url, admin_url):
        async with aiohttp.ClientSession(headers=token) as client:
            path.write_text(
                '[cache]\nkey_query = {include = ["id"]}\n[admission]\npolicy = "always"\n'
                '[admin]\ntoken = "second"\n[server]\nmax_url_length = 4000\n'
                'purge_from = ["127.0.0.1"]\n'
            )
            async with client.post(admin_url + "/reload", json={}) as r:
                assert r.status == 409  # max_url_length takes a restart: nothing changed
            async with client.get(admin_url + "/stats") as r:
                pid = (await r.json())["workers"][0]["pid"]
            os.kill(pid, signal.SIGKILL)
            for _ in range(200):  # until the parent has replaced it and it answers
                async with client.get(admin_url + "/stats") as r:
                    stats = await r.json() if r.status == 200 else {}
                if stats.get("workers_replaced") == 1 and stats.get("missing") == 0:
                    break
                await asyncio.sleep(0.05)
            assert stats["workers_replaced"] == 1 and stats["missing"] == 0
            assert pid not in [w["pid"] for w in stats["workers"]]
        connector = aiohttp.TCPConnector(force_close=True)  # each request to either worker
        async with aiohttp.ClientSession(connector=connector, headers=HOST) as client:
            wrong = []
            for _ in range(30):
                for query in ("?id=7&lang=fr", "?id=7"):
                    async with client.get(url + "/p" + query) as r:
                        body = await r.text()
                    if body != "/p" + query:
                        wrong.append((query, body))
            assert wrong == []
            # A PURGE on the data port reaches the other worker through the parent: no worker
            # answers with the copy fetched before it.
            async with client.get(url + "/p?id=7") as r:
                purged = r.headers["X-Origin-Count"]
            async with client.request("PURGE", url + "/p?id=7") as r:
                assert (r.status, (await r.json())["missing"]) == (200, 0)
            for _ in range(10):
                async with client.get(url + "/p?id=7") as r:
                    assert r.headers["X-Origin-Count"] != purged
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


KEY_QUERIES = {"id": '{include = ["id"]}', "all": '"all"'}


@pytest.mark.parametrize("asked", ["from memory", "from disk after a restart",
                                   "after a restart with no reload"])  # fmt: skip
@pytest.mark.parametrize("change", ["key_query", "route's origin"])
async def test_a_reload_that_keys_or_fetches_otherwise_purges_what_the_old_rules_stored(
    origin, raw_origin, tmp_path, change, asked
):
    """Stored under the old rules (``?id=1&lang=fr`` keyed as ``?id=1``, or a route's old
    origin), an answer is never served under the new ones: from memory, nor from the disk
    after a restart, whether the new rules came by a reload (which names what it purged) or
    by the restart itself."""

    async def echo(request):
        return aiohttp.web.Response(text="old " + request.path_qs,
                                    headers={"Cache-Control": "max-age=600"})  # fmt: skip

    origin.responder = echo

    elsewhere = await raw_origin(
        canned(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nCache-Control: max-age=600"
            b"\r\nConnection: close\r\n\r\nnew"
        )
    )
    path = tmp_path / "proxy.toml"

    def write(keyed: str, route_origin: str) -> None:
        path.write_text(
            f'[cache]\nkey_query = {KEY_QUERIES[keyed]}\n[admission]\npolicy = "always"\n'
            f'[disk]\npath = "{tmp_path / "disk"}"\nsize = "4MiB"\nregion_size = "1MiB"\n'
            f'policy = "always"\n[[routes]]\nhost = "example.test"\norigin = "{route_origin}"\n'
        )

    flags = {"server.listen": "127.0.0.1:0", "admin.listen": "127.0.0.1:0",
             "server.access_log": False}  # fmt: skip

    def read():
        return load(path, env={}, overrides=flags)

    write("id", origin.url)
    service = await Service.start(read(), read_config=read)
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(base(service) + "/p?id=1&lang=fr", headers=HOST) as r:
                assert await r.text() == "old /p?id=1&lang=fr"
            if change == "key_query":
                write("all", origin.url)
                wanted = "old /p?id=1"
            else:
                write("id", elsewhere)
                wanted = "new"
            if asked != "after a restart with no reload":
                status, answer = await _reload(client, service)
                assert status == 200 and answer["purged"], answer
            if asked == "from memory":
                async with client.get(base(service) + "/p?id=1", headers=HOST) as r:
                    assert await r.text() == wanted
    finally:
        await service.stop()
    if asked != "from memory":  # the disk kept the rules its records were keyed by
        service = await Service.start(read(), read_config=read)
        try:
            async with (
                aiohttp.ClientSession() as client,
                client.get(base(service) + "/p?id=1", headers=HOST) as r,
            ):
                assert await r.text() == wanted, r.headers["Cache-Status"]
        finally:
            await service.stop()


def test_every_setting_that_makes_a_key_is_one_a_reload_takes():
    assert KEYED <= LIVE


def test_what_a_reload_purges_follows_what_changed():
    base_settings = {"upstream.origin": "http://127.0.0.1:9", "server.access_log": False}

    def config(**settings):
        return load(env={}, overrides={**base_settings, **settings})

    route = [{"host": "a.example", "origin": "http://127.0.0.1:8"}]
    moved = [{"host": "a.example", "origin": "http://127.0.0.1:7"}]
    old = config(routes=route)
    assert keys_built_otherwise(old, config(routes=route, **{"cache.grace": "5s"})) == ()
    assert keys_built_otherwise(old, config(routes=moved)) == (
        "http://a.example/", "http://a.example:")  # fmt: skip
    changes = {"cache.key_query": "none", "cache.ignore_cookies": ["sess"],
               "server.deny_headers": ["x-a"], "upstream.origin": "http://127.0.0.1:6"}  # fmt: skip
    for key, value in changes.items():
        assert keys_built_otherwise(old, config(routes=route, **{key: value})) == ("",), key


async def test_a_sighup_sent_while_the_process_starts_is_held_and_taken_once_it_serves():
    """A worker told to reload while it starts (a reload taken meanwhile) must not lose the
    signal, nor die of it: SIGHUP is held from the start of ``main`` until
    ``until_signalled`` handles it, then handled. (Ignored, as it was, the worker kept the
    old rules; blocked in the main thread alone, another thread (numpy's OpenBLAS) took it
    with its default action, and the process died.)"""
    loop = asyncio.get_running_loop()
    another = threading.Event()
    thread = threading.Thread(target=another.wait)  # a library's thread, started first
    thread.start()
    hold_signals()
    try:
        os.kill(os.getpid(), signal.SIGHUP)  # to the process: any thread may take it
        await asyncio.sleep(0.05)
        reloads = asyncio.Event()
        serving = asyncio.ensure_future(until_signalled(None, reloads.set))
        await asyncio.wait_for(reloads.wait(), 5)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, 5)
    finally:
        another.set()
        thread.join()
        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


@pytest.mark.slow
async def test_under_workers_what_takes_a_start_is_taken_by_replacing_workers_one_at_a_time(
    origin, tmp_path
):
    """A --workers parent reloads what a worker takes only as it starts (its log's format,
    its memory share with a disk) by draining and starting its workers one at a time, the
    others serving meanwhile: every request is answered, and the answer says so."""
    path, log = tmp_path / "proxy.toml", tmp_path / "access.log"
    disk = f'[disk]\npath = "{tmp_path / "disk"}"\nsize = "8MiB"\nregion_size = "1MiB"\n'

    def write(log_format: str, size: str) -> None:
        path.write_text(f'[server]\naccess_log = true\naccess_log_file = "{log}"\n'
                        f'access_log_format = "{log_format}"\naccess_log_flush = "20ms"\n'
                        f'[cache]\nsize = "{size}"\n{disk}')  # fmt: skip

    write("combined", "8MiB")
    args = ("--config", str(path), "--origin", origin.url, "--workers", "2")
    async with served(*args) as (process, url, admin_url):
        connector = aiohttp.TCPConnector(force_close=True)  # spread over the workers
        async with aiohttp.ClientSession(connector=connector) as client:
            statuses: list[int] = []
            going = True

            async def load() -> None:
                while going:
                    async with client.get(url + "/a") as r:
                        await r.read()
                        statuses.append(r.status)

            loading = asyncio.ensure_future(load())
            write("json", "4MiB")
            async with client.post(admin_url + "/reload", json={}) as r:
                answer = await r.json()
            assert answer["reloaded"] and answer["replacing"] == 2, answer
            assert sorted(answer["changed"]) == [  # the largest object follows the size
                "cache.max_object_size",
                "cache.size",
                "server.access_log_format",
            ]

            async def both_replaced() -> bool:
                async with client.get(admin_url + "/stats") as r:
                    workers = (await r.json())["workers"]
                return len(workers) == 2 and all(
                    w["store"]["capacity_bytes"] == 2 << 20 for w in workers
                )

            deadline = asyncio.get_running_loop().time() + 60
            while not await both_replaced():
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.2)
            going = False
            await loading
        assert statuses and set(statuses) == {200}
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)
    assert log.read_text().splitlines()[-1].startswith("{")  # the last lines are json


@pytest.mark.slow
async def test_under_workers_a_reload_no_new_worker_could_run_is_refused_before_any_is_replaced(
    origin, tmp_path
):
    path = tmp_path / "proxy.toml"
    disk = f'[disk]\npath = "{tmp_path / "disk"}"\nsize = "8MiB"\nregion_size = "1MiB"\n'
    path.write_text(f'[cache]\nsize = "8MiB"\n{disk}')
    args = ("--config", str(path), "--origin", origin.url, "--workers", "2",
            "--set", "server.access_log=false")  # fmt: skip
    async with served(*args) as (process, _, admin_url):
        path.write_text(f'[cache]\nsize = "2KiB"\n{disk}')  # each worker's 1 KiB holds nothing
        async with aiohttp.ClientSession() as client:
            async with client.post(admin_url + "/reload", json={}) as r:
                answer = await r.json()
            assert r.status == 409 and "with 2 workers, each keeps 1024 bytes" in answer["error"]
            # What makes a key with what replaces workers: the old workers would fetch and
            # store by the old rules while they wait their turn.
            path.write_text(f'[cache]\nsize = "8MiB"\nkey_query = "none"\n'
                            f'[server]\nidle_timeout = "20s"\n{disk}')  # fmt: skip
            async with client.post(admin_url + "/reload", json={}) as r:
                answer = await r.json()
            assert r.status == 409 and "one after the other" in answer["error"]
            async with client.get(admin_url + "/stats") as r:
                workers = (await r.json())["workers"]
        assert [w["store"]["capacity_bytes"] for w in workers] == [4 << 20] * 2
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)
