"""``onehit-proxy --workers 2`` as one cache: what one worker stored is a hit through the other,
a removal one decides reaches the other, a restart keeps the disk tier, and a worker killed
at any moment leaves no wrong body and an index that agrees with the region files."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp import web
from conftest import Origin, serve_trace, served, until

from loadgen.live.processes import free_port
from loadgen.live.replay import ReplayConfig, replay
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.config.settings import DiskSection
from proxy.disk.checkpoint import CHECKPOINT
from proxy.disk.directory import claimed
from proxy.disk.store import DiskStore
from proxy.ops.workers import BATCH_BYTES, MachineForgets

pytestmark = pytest.mark.live

QUIET = ("--set", "server.access_log=false")


async def ask(url: str, paths: list[str], headers: dict[str, str] | None = None) -> list[tuple]:
    """Each of ``paths`` once, each on a new connection (the kernel hands each to either
    worker): (status, Cache-Status, body) of each."""
    connector = aiohttp.TCPConnector(force_close=True)
    out = []
    async with aiohttp.ClientSession(connector=connector) as client:
        for path in paths:
            async with client.get(url + path, headers=headers or {}) as r:
                out.append((r.status, r.headers.get("Cache-Status", ""), await r.read()))
    return out


async def stats(admin: str) -> dict:
    async with aiohttp.ClientSession() as client, client.get(admin + "/stats") as r:
        return await r.json()


def distinct_bodies(origin: Origin, paths: list[str]) -> None:
    for path in paths:
        origin.set(path, body=f"body of {path}".encode(), headers={"Cache-Control": "max-age=300"})


async def stop(process: asyncio.subprocess.Process) -> None:
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_two_workers_store_a_second_request_and_hit_the_third_whichever_answers(origin):
    """Without a disk, the tier in shared memory is the machine's cache: a URL seen once by
    each worker is stored, and its third request is a hit on either."""
    paths = [f"/u{i}" for i in range(100)]
    distinct_bodies(origin, paths)
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, url, admin):
        tier = (await stats(admin))["shared_tier"]
        scratch = Path(tier["path"])
        assert tier["in_memory"] and scratch.is_dir()
        assert scratch.parent == Path("/dev/shm") or not Path("/dev/shm").is_dir(), "in RAM"
        await ask(url, paths)
        await ask(url, paths)
        third = await ask(url, paths)
        machine = await stats(admin)
        assert min(w["metrics"]["requests"] for w in machine["workers"]) > 0, "both answered"
        hits = [p for p, (_, cache, _) in zip(paths, third, strict=True) if "; hit" in cache]
        assert len(hits) >= 97, f"{len(hits)} third requests hit"
        for path, (status, _, body) in zip(paths, third, strict=True):
            assert status == 200 and body == f"body of {path}".encode()
        assert machine["disk"]["objects"] >= 97, "the shared tier's records, counted once"
        assert machine["sum"]["hits_from_disk"] > 0, "some hits came through the other worker"
        await stop(process)
    assert not scratch.exists(), "removed at the stop"


@pytest.mark.slow
async def test_a_scratch_tier_a_killed_parent_left_is_removed_by_the_next_start(origin):
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, _, admin):
        left = Path((await stats(admin))["shared_tier"]["path"])
        process.kill()
        await process.wait()
    assert left.is_dir(), "a parent killed removes nothing"
    await until(lambda: not claimed(left))  # its workers drain (PDEATHSIG), the claim with them
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, _, _admin):
        assert not left.exists()
        await stop(process)


@pytest.mark.slow
async def test_with_a_disk_what_one_worker_stored_is_a_hit_through_the_other_after_a_restart(
    origin, tmp_path
):
    paths = [f"/d{i}" for i in range(60)]
    distinct_bodies(origin, paths)
    args = ("--workers", "2", "--origin", origin.url, "--set", f"disk.path={tmp_path}",
            "--set", "disk.size=8MiB", "--set", "disk.region_size=1MiB", *QUIET)  # fmt: skip
    port = free_port()  # the keys hold the Host: the restart listens where the first did
    async with served(*args, port=port) as (process, url, admin):
        await ask(url, paths)
        await ask(url, paths)
        assert (await stats(admin))["disk"]["objects"] >= 58
        async with aiohttp.ClientSession() as client, client.post(url + "/d0") as r:
            assert r.status == 200  # an unsafe method: /d0 is forgotten, and journaled
        assert list(tmp_path.glob("drops-*.log")), "the worker journaled its removal"
        await stop(process)
    assert (tmp_path / CHECKPOINT).exists(), "the parent wrote the tier's checkpoint"
    assert not list(tmp_path.glob("drops-*.log")), "its checkpoint holds the removal"
    fetched = sum(origin.hits[p] for p in paths)
    async with served(*args, port=port) as (process, url, admin):
        answers = await ask(url, paths)
        from_disk = [a for a in answers if "detail=disk" in a[1]]
        assert len(from_disk) >= 57, "both memory tiers start empty: each hit is the tier's"
        assert "detail=disk" not in answers[0][1], "the removal outlived the restart"
        for path, (status, _, body) in zip(paths, answers, strict=True):
            assert status == 200 and body == f"body of {path}".encode()
        machine = await stats(admin)
        assert {w["disk"]["hits"] > 0 for w in machine["workers"]} == {True}
        assert machine["disk"]["restored_from_checkpoint"] == len(from_disk)
        await stop(process)
    assert sum(origin.hits[p] for p in paths) - fetched == len(paths) - len(from_disk)


async def large_through_two_workers(
    origin: Origin,
    disk: Path,
    body: bytes,
    cache: str,
    region: str,
    asked: int,
    *more: str,
) -> tuple[list[tuple], dict]:
    """``/big`` (``body``) asked ``asked`` times of two workers sharing ``cache`` of memory
    and a disk tier of ``region`` regions."""
    origin.set("/big", body=body, headers={"Cache-Control": "max-age=300"})
    args = ("--workers", "2", "--origin", origin.url, "--cache-size", cache, "--set",
            f"disk.path={disk}", "--set", "disk.size=16MiB", "--set",
            f"disk.region_size={region}", "--set", "disk.policy=always", *QUIET, *more)  # fmt: skip
    async with served(*args) as (process, url, admin):
        answers = await ask(url, ["/big"] * asked)
        counted = await stats(admin)
        await stop(process)
    assert {got for _, _, got in answers} == {body}
    return answers, counted


async def test_a_body_past_a_workers_memory_share_is_kept_on_the_machines_disk(origin, tmp_path):
    """With 2 MiB of memory for the machine, each of two workers holds 1 MiB: a 1.5 MiB body,
    within the machine's largest object (2 MiB), is kept by the disk tier they share and hit
    from it, as one process would keep it (before: refused by every tier as too large)."""
    body = bytes(range(256)) * 6144  # 1.5 MiB
    answers, counted = await large_through_two_workers(origin, tmp_path, body, "2MiB", "4MiB", 8,
                                                       "--admission", "always")  # fmt: skip
    # Kept once written (the write ends after its answer: a request or two may come first).
    assert "detail=disk" in answers[-1][1] and origin.hits["/big"] <= 4
    # Each fetch memory would keep, but past the share, is counted (it was not).
    assert counted["sum"]["beyond_memory"] == origin.hits["/big"]


async def test_a_body_no_tier_of_a_worker_holds_is_said_too_large_not_stored(origin, tmp_path):
    """Past a worker's memory share and a disk record's region: kept nowhere, and its answer
    says so (before: ``stored``, while every request went to the origin)."""
    body = bytes(range(256)) * 12288  # 3 MiB
    answers, _ = await large_through_two_workers(origin, tmp_path, body, "4MiB", "1MiB", 3)
    statuses = [status for _, status, _ in answers]
    # Refused as too large, then passed to the origin for a while (hit-for-miss).
    assert "detail=too-large" in statuses[0] and not any("stored" in s for s in statuses)


async def test_a_removal_one_worker_decides_reaches_the_other_workers_memory(origin):
    """The origin turns a stored URL private: the worker that learns it forgets the URL in
    the shared tier and, through the parent, in the other worker's memory."""
    origin.set("/p", body=b"old public", headers={"Cache-Control": "public, max-age=300"})
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, url, admin):
        await ask(url, ["/p"] * 30)
        machine = await stats(admin)
        assert [w["store"]["entries"] for w in machine["workers"]] == [1, 1], "both hold it"
        origin.set("/p", body=b"new private", headers={"Cache-Control": "private, max-age=300"})
        (_, _, body), = await ask(url, ["/p"], {"Cache-Control": "no-cache"})  # fmt: skip
        assert body == b"new private"
        for _ in range(200):  # the other worker is told within milliseconds
            if sum(w["store"]["entries"] for w in (await stats(admin))["workers"]) == 0:
                break
            await asyncio.sleep(0.01)
        answers = await ask(url, ["/p"] * 20)
        assert {body for _, _, body in answers} == {b"new private"}
        await stop(process)


async def look(admin: str, url: str) -> dict:
    async with (
        aiohttp.ClientSession() as client,
        client.get(admin + "/cache", params={"url": url}) as r,
    ):
        assert r.status == 200
        return await r.json()


async def test_a_purge_reaches_every_worker_and_the_shared_tier_once(origin):
    """And a look inside (``GET /cache``) asks every worker: each sees the record the tier
    they share holds, then none."""
    origin.set("/q", body=b"v1", headers={"Cache-Control": "max-age=300"})
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, url, admin):
        await ask(url, ["/q"] * 20)
        seen = await look(admin, url + "/q")
        assert seen["missing"] == 0 and [w["disk"]["size"] for w in seen["workers"]] == [2, 2]
        async with (
            aiohttp.ClientSession() as client,
            client.post(admin + "/purge", json={"url": url + "/q"}) as r,
        ):
            assert r.status == 200
            purged = await r.json()
        assert purged["removed"] == 3, "two memory copies and the shared record"
        after = await look(admin, url + "/q")
        assert [(w["memory"], w["disk"]) for w in after["workers"]] == [(None, None)] * 2
        origin.set("/q", body=b"v2", headers={"Cache-Control": "max-age=300"})
        answers = await ask(url, ["/q"] * 10)
        assert {body for _, _, body in answers} == {b"v2"}
        await stop(process)


@pytest.mark.slow
async def test_a_worker_killed_under_load_leaves_no_wrong_body_and_a_consistent_index(
    origin, tmp_path
):
    """SIGKILL of a worker at random moments while clients load both: every answer is its
    URL's body (or a 502 of the connection the kill cut), the parent replaces the worker, and
    after a clean stop every record the index holds is a whole record of its key."""
    paths = [f"/k{i}" for i in range(200)]
    for path in paths:
        origin.set(path, body=(path.encode() * 400), headers={"Cache-Control": "max-age=300"})
    args = ("--workers", "2", "--origin", origin.url, "--set", f"disk.path={tmp_path}",
            "--set", "disk.size=4MiB", "--set", "disk.region_size=256KiB",
            "--set", "disk.policy=always", *QUIET)  # fmt: skip
    rng = random.Random(7)
    wrong: list[str] = []
    async with served(*args) as (process, url, admin):

        async def load() -> None:
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as client:
                for _ in range(600):
                    path = rng.choice(paths)
                    try:
                        async with client.get(url + path) as r:
                            body = await r.read()
                            if r.status == 200 and body != path.encode() * 400:
                                wrong.append(path)
                    except aiohttp.ClientError:
                        pass  # the connection the kill cut

        loading = asyncio.ensure_future(load())
        for _ in range(5):
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            machine = await stats(admin)
            if machine["missing"] == 0:
                os.kill(rng.choice(machine["workers"])["pid"], signal.SIGKILL)
        await loading
        for _ in range(100):
            machine = await stats(admin)
            if machine["missing"] == 0:
                break
            await asyncio.sleep(0.05)
        assert machine["missing"] == 0 and machine["workers_replaced"] >= 1
        await stop(process)
    assert wrong == []
    store = DiskStore(DiskSection(path=str(tmp_path), size=4 << 20, region_size=256 << 10))
    try:
        assert store.keeping.scanned == 0, "the parent's checkpoint describes the files"
        agrees, held = store.keeping.agrees_with_files()
        assert agrees and held == store.keeping.from_checkpoint > 0
    finally:
        store.close()


async def test_the_tier_in_shared_memory_stays_within_the_cache_size(origin):
    """What the machine keeps in /dev/shm is bounded by ``[cache] size`` (the ring evicts
    whole regions), and each worker's own memory tier by a quarter of it over the workers."""
    paths = [f"/s{i}" for i in range(120)]
    for path in paths:
        origin.set(path, body=path.encode() * 3000, headers={"Cache-Control": "max-age=300"})
    size = 1 << 20
    args = ("--workers", "2", "--origin", origin.url, "--cache-size", str(size), *QUIET)
    async with served(*args) as (process, url, admin):
        scratch = Path((await stats(admin))["shared_tier"]["path"])
        await ask(url, paths)
        await ask(url, paths)
        held = sum(f.stat().st_size for f in scratch.glob("region-*.log"))
        machine = await stats(admin)
        assert machine["disk"]["bytes_written"] > size, "more was written than it holds"
        assert held <= size, f"{held} bytes in shared memory for a cache of {size}"
        for worker in machine["workers"]:
            assert worker["store"]["capacity_bytes"] == size // 8
            assert worker["store"]["bytes_used"] <= size // 8
        await stop(process)


@pytest.mark.slow
async def test_a_parent_killed_leaves_the_directory_claimed_until_its_workers_have_drained(
    origin, tmp_path
):
    """The old workers finish what is in flight after their parent's kill -9, and may write
    it into the tier: a new parent on the directory meanwhile would reserve the same places
    and index what they overwrite. It is refused until the last of them has exited."""
    released = asyncio.Event()

    async def held(request: web.Request) -> web.Response:
        await released.wait()  # until the test has tried a new parent
        return web.Response(body=b"version-1", headers={"Cache-Control": "max-age=300"})

    origin.responder = held
    args = ("--workers", "2", "--origin", origin.url, "--set", f"disk.path={tmp_path}",
            "--set", "disk.policy=always", *QUIET)  # fmt: skip
    async with served(*args) as (process, url, _admin):
        in_flight = asyncio.ensure_future(ask(url, ["/slow"]))
        await origin.arrived("/slow")
        process.kill()
        await process.wait()
        again = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", *args, "--listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{free_port()}", stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(again.communicate(), 30)
        assert again.returncode == 1 and "in use by another onehit process" in err.decode()
        released.set()
        [(status, _, body)] = await in_flight
        assert (status, body) == (200, b"version-1"), "the old worker drained its request"
    await until(lambda: not claimed(tmp_path))  # the drained workers exit, the claim with them
    async with served(*args) as (process, url, _admin):
        [(status, cache, body)] = await ask(url, ["/slow"])
        assert body == b"version-1" and "hit" in cache
        await stop(process)


@pytest.mark.slow
async def test_a_trace_through_two_workers_hits_as_through_one_process(origin, tmp_path):
    """The same [cache] size and disk, a Zipf trace replayed on sixteen connections (spread
    over the workers by the kernel: all on one worker once in 30,000 runs): the hit ratio
    within a point of one process's, and the disk written within 5%."""
    trace = generate(WorkloadSpec(objects=800, requests=3000, sizes=SizeSpec("fixed", fixed=2048),
                                  seed=5))  # fmt: skip
    serve_trace(origin, trace)
    ratios, written = [], []
    for workers in ("1", "2"):
        args = ("--workers", workers, "--origin", origin.url, "--cache-size", "512KiB",
                "--set", f"disk.path={tmp_path / workers}", "--set", "disk.size=1MiB",
                "--set", "disk.region_size=128KiB", *QUIET)  # fmt: skip
        async with served(*args) as (process, url, admin):
            await replay(trace, ReplayConfig(target=url, concurrency=16))
            machine = await stats(admin)
            metrics = machine["sum"] if workers == "2" else machine["metrics"]
            ratios.append(metrics["hit_ratio"])
            written.append(machine["disk"]["bytes_written"])
            if workers == "2":
                assert min(w["metrics"]["requests"] for w in machine["workers"]) > 0
            await stop(process)
    assert ratios[0] > 0.2
    assert abs(ratios[1] - ratios[0]) <= 0.01, ratios
    assert abs(written[1] / written[0] - 1) <= 0.05, written


async def test_a_purge_no_worker_can_take_is_refused_to_be_asked_again(origin):
    """Both workers killed: a purge kept by none would never reach the shared tier."""
    async with (
        served("--workers", "2", "--origin", origin.url, *QUIET) as (process, url, admin),
        aiohttp.ClientSession() as client,
    ):
        for worker in (await stats(admin))["workers"]:
            os.kill(worker["pid"], signal.SIGKILL)
        async with client.post(admin + "/purge", json={"prefix": url + "/"}) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
        for _ in range(200):  # the parent replaces them
            if (await stats(admin))["missing"] == 0:
                break
            await asyncio.sleep(0.05)
        async with client.post(admin + "/purge", json={"prefix": url + "/"}) as r:
            assert r.status == 200
        await stop(process)


async def worker_holding(writer: asyncio.StreamWriter, pids: list[int]) -> int:
    """The pid of the worker that accepted the connection ``writer`` writes to (it may be in
    the listener's queue a moment first)."""
    port = writer.get_extra_info("sockname")[1]
    for _ in range(100):
        for pid in pids:
            connections = psutil.Process(pid).net_connections()
            if any(c.raddr and c.raddr.port == port for c in connections):
                return pid
        await asyncio.sleep(0.02)
    raise AssertionError("no worker holds the connection")


async def exchange(reader, writer, method: str, path: str) -> bytes:
    """One request on a kept-alive connection; its answer's body."""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: example.test\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])
    return await reader.readexactly(length)


async def test_a_purge_through_one_worker_reaches_what_another_wrote_from_a_fetch_begun_before(
    origin, tmp_path
):
    """Worker B's fetch goes out; a PURGE through worker A removes the URL; B's response
    lands, and B writes it to the shared tier before it hears of the purge (the parent is
    busy). The purge reaches B as B's own: the record B wrote is removed, and no worker
    answers with the body from before the purge."""
    version, held = {"body": b"old"}, asyncio.Event()

    async def responder(request: web.Request) -> web.StreamResponse:
        body = version["body"]  # what the origin has when the request arrives
        if not held.is_set():
            await held.wait()
        return web.Response(body=body, headers={"Cache-Control": "max-age=600"})

    origin.responder = responder
    args = ("--workers", "2", "--origin", origin.url, "--admission", "always",
            "--set", "server.access_log=false", "--set", "server.purge_from=127.0.0.1",
            "--set", f"disk.path={tmp_path}", "--set", "disk.size=8MiB",
            "--set", "disk.region_size=1MiB", "--set", "disk.policy=always")  # fmt: skip
    async with served(*args) as (process, url, admin_url):
        pids = [w["pid"] for w in (await stats(admin_url))["workers"]]
        host, port = url.removeprefix("http://").split(":")
        connections: dict[int, tuple] = {}
        while len(connections) < 2:  # one connection to each worker
            reader, writer = await asyncio.open_connection(host, int(port))
            pid = await worker_holding(writer, pids)
            if pid in connections:
                writer.close()
            else:
                connections[pid] = (reader, writer)
        on_b, on_a = connections.values()
        fetching = asyncio.ensure_future(exchange(*on_b, "GET", "/k"))
        await origin.arrived("/k")
        version["body"] = b"new"
        os.kill(process.pid, signal.SIGSTOP)  # the parent is busy: B hears late
        try:
            purging = asyncio.ensure_future(exchange(*on_a, "PURGE", "/k"))
            await asyncio.sleep(0.3)  # A has purged its memory and the shared tier
            held.set()
            assert await fetching == b"old"  # asked before the purge
            await asyncio.sleep(0.3)  # B has written it, in memory and to the shared tier
        finally:
            os.kill(process.pid, signal.SIGCONT)
        await asyncio.wait_for(purging, 10)
        bodies = set()
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as client:
            for _ in range(10):
                async with client.get(url + "/k", headers={"Host": "example.test"}) as r:
                    bodies.add(await r.read())
        assert bodies == {b"new"}
        for _, writer in (on_a, on_b):
            writer.close()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


def test_removals_wait_to_be_sent_once_each_purged_ones_first_and_batched_within_bounds():
    """A flood of removals of one URL (unsafe requests) waits as one key; purged keys go
    before plain removals, never in one batch with them; a batch stays within BATCH_BYTES."""
    forgets = MachineForgets("http://127.0.0.1:9", 0, "", "secret", 2)
    forgets._send_soon = lambda: None  # what is sent, not the sending, is judged here
    for _ in range(1000):
        forgets("http://a/flooded")
    forgets("http://a/other")
    forgets.purged["http://a/purged"] = 1.0
    assert forgets._next() == (
        {"keys": ["http://a/purged"], "at": [1.0], "from": 0, "purge": True}, 1)  # fmt: skip
    batch, count = forgets._next()
    assert (batch["keys"], batch["from"], batch["purge"], count) == (
        ["http://a/flooded", "http://a/other"], 0, False, 2)  # fmt: skip
    # When each was removed last: a sibling's fetch sent after that is stored.
    assert batch["at"][0] <= batch["at"][1] <= time.time()
    assert forgets._next() is None
    long = ["http://a/" + "x" * 100_000 + str(i) for i in range(5)]
    for key in long:
        forgets(key)
    sizes = []
    while (batch := forgets._next()) is not None:
        sizes.append(sum(len(k) + 4 for k in batch[0]["keys"]))
    assert len(sizes) > 1 and max(sizes) <= BATCH_BYTES
