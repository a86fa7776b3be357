"""An upgrade without a refused connection (``[server] handover``, ``--take-over``,
``proxy.ops.handover``): real processes under load, new connections and kept-alive ones."""

from __future__ import annotations

import asyncio
import shutil
import sys

import aiohttp
import pytest
from conftest import wait_healthy

from loadgen.live.processes import free_port

pytestmark = pytest.mark.live

PATHS = [f"/k{i}" for i in range(20)]


async def ended(*processes: asyncio.subprocess.Process | None) -> None:
    """Stop each process a test started that still runs (SIGTERM, as an operator would)."""
    for process in processes:
        if process is not None and process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)


async def load(url: str, until: asyncio.Event, fresh: bool) -> dict[str, int]:
    """GETs of ``PATHS`` until ``until``, each on a connection of its own (``fresh``) or on
    kept-alive ones: what came back."""
    seen = {"ok": 0, "wrong": 0, "refused": 0, "dropped": 0}
    connector = aiohttp.TCPConnector(force_close=fresh)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        i = 0
        while not until.is_set():
            path = PATHS[i % len(PATHS)]
            i += 1
            try:
                async with client.get(url + path) as r:
                    body = await r.read()
                    good = r.status == 200 and body == f"body of {path}".encode()
                    seen["ok" if good else "wrong"] += 1
            except aiohttp.ClientConnectorError as exc:
                refused = isinstance(exc.os_error, ConnectionRefusedError)
                seen["refused" if refused else "dropped"] += 1
            except aiohttp.ClientConnectionError:
                # A kept-alive connection the old one closed as it drained, or one it had
                # accepted just before the handover and closed before its request came.
                seen["dropped"] += 1
    return seen


@pytest.mark.parametrize(
    ("before", "after", "disk"),
    [
        (1, 1, True),
        pytest.param(2, 2, True, marks=pytest.mark.slow),
        pytest.param(2, 2, False, marks=pytest.mark.slow),
        pytest.param(1, 2, True, marks=pytest.mark.slow),
        pytest.param(3, 1, True, marks=pytest.mark.slow),
    ],
    ids=["one", "workers", "workers-memory", "one-to-workers", "workers-to-one"],
)
async def test_a_new_onehit_takes_the_listeners_and_no_connection_is_refused(
    origin, tmp_path, before, after, disk
):
    """Under load, new connections and kept-alive ones, a new onehit (``after`` processes
    serving) takes over from a running one (``before``): no connection refused, no wrong
    body; the disk tier comes over, and the workers' shared memory tier."""
    for path in PATHS:
        origin.set(path, body=f"body of {path}".encode(), headers={"Cache-Control": "max-age=300"})
    port, admin_port = free_port(), free_port()
    args = [sys.executable, "-m", "proxy", "--origin", origin.url,
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--set", f"server.handover={tmp_path / 'handover.sock'}",
            "--set", "server.access_log=false", "--set", "server.drain_timeout=2s"]  # fmt: skip
    if disk:
        args += ["--set", f"disk.path={tmp_path / 'disk'}", "--set", "disk.size=8MiB",
                 "--set", "disk.region_size=1MiB", "--set", "disk.policy=always"]  # fmt: skip
    url, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    old = await asyncio.create_subprocess_exec(*args, "--workers", str(before),
                                               stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    new = None
    try:
        async with aiohttp.ClientSession() as client:
            await wait_healthy(client, admin + "/healthz", 30)
            for _ in range(2):
                for path in PATHS:
                    async with client.get(url + path) as r:
                        await r.read()
        stored = sum(origin.hits[path] for path in PATHS)
        done = asyncio.Event()
        loads = [asyncio.ensure_future(load(url, done, fresh)) for fresh in (True, False)]
        await asyncio.sleep(0.5)
        new = await asyncio.create_subprocess_exec(*args, "--workers", str(after), "--take-over",
                                                   stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
        assert await asyncio.wait_for(old.wait(), 30) == 0  # drained and gone
        async with aiohttp.ClientSession() as client:
            await wait_healthy(client, admin + "/healthz", 30)  # the admin port was handed too
            async with client.get(admin + "/stats") as r:
                stats = await r.json()
        assert len(stats.get("workers", [None])) == after, stats.get("workers")
        await asyncio.sleep(1.0)
        done.set()
        fresh, kept = await asyncio.gather(*loads)
        assert fresh["refused"] == kept["refused"] == 0, (fresh, kept)
        assert fresh["wrong"] == kept["wrong"] == 0 and fresh["dropped"] == 0, (fresh, kept)
        assert fresh["ok"] > 50 and kept["ok"] > 50, (fresh, kept)
        # The disk tier came over, or the workers' shared memory tier: the new one fetched
        # nothing again.
        assert sum(origin.hits[path] for path in PATHS) == stored
    finally:
        await ended(old, new)


def test_taking_over_where_nothing_offers_its_listeners_says_what_to_set(tmp_path):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "proxy", "--origin", "http://127.0.0.1:9", "--take-over",
         "--set", f"server.handover={tmp_path / 'none.sock'}", "--listen", "127.0.0.1:0",
         "--admin-listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "no onehit offers its listeners at" in done.stderr
    assert "[server] handover" in done.stderr


async def test_a_take_over_that_would_move_a_listener_is_refused_and_the_running_one_goes_on(
    origin, tmp_path
):
    port, admin_port = free_port(), free_port()
    sock = tmp_path / "handover.sock"
    args = [sys.executable, "-m", "proxy", "--origin", origin.url,
            "--admin-listen", f"127.0.0.1:{admin_port}", "--set", f"server.handover={sock}",
            "--set", "server.access_log=false"]  # fmt: skip
    old = await asyncio.create_subprocess_exec(*args, "--listen", f"127.0.0.1:{port}",
                                               stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    try:
        async with aiohttp.ClientSession() as client:
            await wait_healthy(client, f"http://127.0.0.1:{admin_port}/healthz", 20)
        new = await asyncio.create_subprocess_exec(
            *args, "--listen", f"127.0.0.1:{free_port()}", "--take-over",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(new.communicate(), 30)
        assert new.returncode == 1 and b"a handover keeps the addresses" in err
        assert old.returncode is None  # untold: it serves on
        async with aiohttp.ClientSession() as client:
            await wait_healthy(client, f"http://127.0.0.1:{admin_port}/healthz", 5)
    finally:
        await ended(old)


async def test_a_take_over_whose_disk_another_onehit_holds_is_refused_before_the_old_one_goes(
    origin, tmp_path
):
    """Told first, the old one would have drained and gone while this one could not start:
    nothing would listen."""
    admin_port, other_admin = free_port(), free_port()
    base = [sys.executable, "-m", "proxy", "--origin", origin.url,
            "--set", "server.access_log=false", "--set", "disk.size=4MiB",
            "--set", "disk.region_size=1MiB"]  # fmt: skip
    offered = f"server.handover={tmp_path / 'h.sock'}"
    mine = [*base, "--listen", f"127.0.0.1:{free_port()}", "--admin-listen",
            f"127.0.0.1:{admin_port}", "--set", offered]  # fmt: skip
    old = await asyncio.create_subprocess_exec(*mine, "--set", f"disk.path={tmp_path / 'a'}",
                                               stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    other = await asyncio.create_subprocess_exec(
        *base, "--listen", f"127.0.0.1:{free_port()}", "--admin-listen",
        f"127.0.0.1:{other_admin}", "--set", f"disk.path={tmp_path / 'b'}",
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as client:
            for port in (admin_port, other_admin):
                await wait_healthy(client, f"http://127.0.0.1:{port}/healthz", 20)
        new = await asyncio.create_subprocess_exec(
            *mine, "--set", f"disk.path={tmp_path / 'b'}", "--take-over",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(new.communicate(), 30)
        assert new.returncode == 1 and b"is held by another onehit" in err
        assert old.returncode is None
    finally:
        await ended(old, other)


async def test_a_take_over_after_a_reload_moved_the_listener_takes_the_new_one(origin, tmp_path):
    first, second, admin_port = free_port(), free_port(), free_port()
    config = tmp_path / "proxy.toml"

    def write(port: int) -> None:
        config.write_text(f'[server]\nlisten = "127.0.0.1:{port}"\naccess_log = false\n'
                          f'handover = "{tmp_path / "h.sock"}"\n[admin]\n'
                          f'listen = "127.0.0.1:{admin_port}"\n')  # fmt: skip

    write(first)
    args = [sys.executable, "-m", "proxy", "--config", str(config), "--origin", origin.url]
    old = await asyncio.create_subprocess_exec(*args, stderr=asyncio.subprocess.DEVNULL)
    new = None
    try:
        async with aiohttp.ClientSession() as client:
            await wait_healthy(client, f"http://127.0.0.1:{admin_port}/healthz", 20)
            write(second)
            async with client.post(f"http://127.0.0.1:{admin_port}/reload", json={}) as r:
                assert (await r.json())["changed"] == ["server.listen"]
            quiet = asyncio.subprocess.DEVNULL
            new = await asyncio.create_subprocess_exec(*args, "--take-over", stderr=quiet)
            assert await asyncio.wait_for(old.wait(), 30) == 0
            await wait_healthy(client, f"http://127.0.0.1:{admin_port}/healthz", 20)
            async with client.get(f"http://127.0.0.1:{second}/x") as r:
                assert r.status == 200 and new.returncode is None
    finally:
        await ended(old, new)


def test_only_a_scratch_tier_of_this_user_is_adopted_or_removed_on_a_handovers_word(tmp_path):
    """The memory tier a handover names is opened or removed only where a parent of this
    user makes one (``/dev/shm/onehit-tier-*``, not a link): any other path is left alone."""
    from proxy.ops import shared_tier

    root = shared_tier._scratch_root()
    ours = shared_tier._scratch_directory()
    elsewhere = tmp_path / f"{shared_tier.SCRATCH_PREFIX}x"
    elsewhere.mkdir()
    link = root / f"{shared_tier.SCRATCH_PREFIX}link-{tmp_path.name}"
    link.symlink_to(elsewhere)
    try:
        assert shared_tier.left_scratch(str(ours)) == ours
        for path in (str(elsewhere), str(link), str(root), "", "/"):
            assert shared_tier.left_scratch(path) is None
            shared_tier.discard_scratch(path)
        assert elsewhere.is_dir() and link.is_symlink()
        shared_tier.discard_scratch(str(ours))
        assert not ours.exists()
    finally:
        link.unlink()
        if ours.exists():
            ours.rmdir()


def test_each_worker_place_gets_listening_sockets_whatever_was_taken_over():
    """``place_listeners``: one SO_REUSEPORT socket per place and address when it binds them;
    taken over, every socket is served (past the places, a place serves several; short of
    them, more are bound beside them), and a single process's socket, not bound to share
    the port, is shared by every place."""
    import socket

    from proxy.ops.workers import place_listeners

    port = free_port()
    made = place_listeners(("127.0.0.1", port), 3)
    try:
        assert [len(p) for p in made] == [1, 1, 1] and len({id(p[0]) for p in made}) == 3
        fewer = place_listeners(("127.0.0.1", port), 2, [p[0] for p in made])
        assert [len(p) for p in fewer] == [2, 1]  # all three served
        more = place_listeners(("127.0.0.1", port), 5, [p[0] for p in made])
        assert [len(p) for p in more] == [1] * 5 and len({id(p[0]) for p in more}) == 5
        assert all(p[0].getsockname()[1] == port for p in more)
        for place in more[3:]:
            place[0].close()
    finally:
        for place in made:
            place[0].close()
    single = socket.socket()
    single.bind(("127.0.0.1", 0))
    single.listen()
    try:
        shared = place_listeners(("127.0.0.1", single.getsockname()[1]), 3, [single])
        assert all(place == [single] for place in shared)
    finally:
        single.close()
    both = place_listeners(("localhost", free_port()), 2)
    try:  # one socket per address localhost resolves to, in each place
        addresses = {s.getsockname()[0] for s in both[0]}
        assert len(both[0]) == len(addresses) >= 1 and len(both[1]) == len(both[0])
    finally:
        for place in both:
            for sock in place:
                sock.close()


def test_a_memory_tier_another_onehit_holds_is_neither_adopted_nor_removed(tmp_path):
    """A handover naming the memory tier a live onehit holds (its lock refuses this one):
    the new parent starts an empty tier of its own, and the other's is left as it is (the
    failed open removed it before, and the other's workers lost their files)."""
    from proxy.config.settings import load
    from proxy.disk.directory import claim, release
    from proxy.ops import shared_tier

    held = shared_tier._scratch_directory()
    (held / "kept").write_text("another onehit's")
    lock = claim(held)
    config = load(env={}, overrides={"upstream.origin": "http://127.0.0.1:9",
                                     "cache.size": "4MiB"})  # fmt: skip
    tier = None
    try:
        tier = shared_tier.open_shared_tier(config, 2, adopt=str(held))
        assert tier.scratch is not None and tier.scratch != held
        assert (held / "kept").read_text() == "another onehit's"
    finally:
        if tier is not None:
            tier.close()
        release(lock)
        shutil.rmtree(held, ignore_errors=True)
