"""``onehit-proxy --workers 2`` as one cache: what one worker stored is a hit through the other,
a removal one decides reaches the other, a restart keeps the disk tier, and a worker killed
at any moment leaves no wrong body and an index that agrees with the region files."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path

import aiohttp
import pytest
from conftest import Origin, served

from loadgen.processes import free_port
from proxy.config.settings import DiskSection
from proxy.core._native import hash64
from proxy.core.regions import Regions
from proxy.disk.region_log import RegionLog
from proxy.disk.store import CHECKPOINT, DiskStore

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
    before = set(Path("/dev/shm").glob("onehit-tier-*"))
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, url, admin):
        scratch = set(Path("/dev/shm").glob("onehit-tier-*")) - before
        assert len(scratch) == 1, "the shared tier's files, in shared memory"
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
    assert not scratch & set(Path("/dev/shm").glob("onehit-tier-*")), "removed at the stop"


async def test_a_scratch_tier_a_killed_parent_left_is_removed_by_the_next_start(origin):
    before = set(Path("/dev/shm").glob("onehit-tier-*"))
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, _, _admin):
        left = set(Path("/dev/shm").glob("onehit-tier-*")) - before
        assert len(left) == 1
        process.kill()
        await process.wait()
    await asyncio.sleep(0.5)  # the orphaned workers drain (PDEATHSIG) and let the lock go
    assert left <= set(Path("/dev/shm").glob("onehit-tier-*"))
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, _, _admin):
        assert not left & set(Path("/dev/shm").glob("onehit-tier-*"))
        await stop(process)


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
        await stop(process)
    assert (tmp_path / CHECKPOINT).exists(), "the parent wrote the tier's checkpoint"
    assert not list(tmp_path.glob("drops-*.log")), "every worker's journal taken up"
    async with served(*args, port=port) as (process, url, admin):
        answers = await ask(url, paths)
        from_disk = [a for a in answers if "detail=disk" in a[1]]
        assert len(from_disk) >= 58, "both memory tiers start empty: each hit is the tier's"
        for path, (status, _, body) in zip(paths, answers, strict=True):
            assert status == 200 and body == f"body of {path}".encode()
        machine = await stats(admin)
        assert {w["disk"]["hits"] > 0 for w in machine["workers"]} == {True}
        await stop(process)
    assert origin.hits["/d0"] == 2


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


async def test_a_purge_reaches_every_worker_and_the_shared_tier_once(origin):
    origin.set("/q", body=b"v1", headers={"Cache-Control": "max-age=300"})
    async with served("--workers", "2", "--origin", origin.url, *QUIET) as (process, url, admin):
        await ask(url, ["/q"] * 20)
        async with (
            aiohttp.ClientSession() as client,
            client.post(admin + "/purge", json={"url": url + "/q"}) as r,
        ):
            assert r.status == 200
            purged = await r.json()
        assert purged["removed"] == 3, "two memory copies and the shared record"
        origin.set("/q", body=b"v2", headers={"Cache-Control": "max-age=300"})
        answers = await ask(url, ["/q"] * 10)
        assert {body for _, _, body in answers} == {b"v2"}
        await stop(process)


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
    records = scanned_records(tmp_path, 4 << 20, 256 << 10)
    store = DiskStore(DiskSection(path=str(tmp_path), size=4 << 20, region_size=256 << 10))
    try:
        assert store.scanned == 0, "the parent's checkpoint describes the files"
        held = store.tier.index.dump()
        assert len(held) // 20 == store.from_checkpoint > 0
        for i in range(0, len(held), 20):
            key = int.from_bytes(held[i : i + 8], "little")
            region, offset, length = (int.from_bytes(held[i + j : i + j + 4], "little")
                                      for j in (8, 12, 16))  # fmt: skip
            assert records.get((region, offset)) == (key, length), "a slot with no record"
    finally:
        store.close()


def scanned_records(directory: Path, size: int, region_size: int) -> dict:
    """Every whole record in the region files: (region, offset) -> (key hash, length)."""
    log = RegionLog(directory, Regions(region_size, size // region_size))
    found = {}
    for region in log.regions_found():
        for key, slot in log.scan(region):
            found[(slot.region, slot.offset)] = (hash64(key.decode())[0] or 1, slot.length)
    log.close()
    return found


async def test_the_tier_in_shared_memory_stays_within_the_cache_size(origin):
    """What the machine keeps in /dev/shm is bounded by ``[cache] size`` (the ring evicts
    whole regions), and each worker's own memory tier by a quarter of it over the workers."""
    paths = [f"/s{i}" for i in range(120)]
    for path in paths:
        origin.set(path, body=path.encode() * 3000, headers={"Cache-Control": "max-age=300"})
    size = 1 << 20
    before = set(Path("/dev/shm").glob("onehit-tier-*"))
    args = ("--workers", "2", "--origin", origin.url, "--cache-size", str(size), *QUIET)
    async with served(*args) as (process, url, admin):
        (scratch,) = set(Path("/dev/shm").glob("onehit-tier-*")) - before
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
