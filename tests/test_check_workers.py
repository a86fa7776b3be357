"""``--check-config`` judges what each worker of ``--workers N`` will run: a configuration it
passes starts with that many workers, and one a worker could not run is refused by both, in
the same words, naming the key and what would work."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from conftest import served

SHIPPED = str(Path(__file__).resolve().parent.parent / "config" / "proxy.toml")
QUIET = ("--set", "server.access_log=false")


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "--check-config", "--origin", "http://127.0.0.1:9",
         *args], capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2, 5, 16, 64])
def test_the_shipped_configuration_passes_for_any_count_of_workers(workers):
    done = check("--config", SHIPPED, "--workers", str(workers))
    assert done.returncode == 0, done.stderr


async def answers(url: str) -> bytes:
    async with aiohttp.ClientSession() as client, client.get(url + "/a") as r:
        return await r.read()


async def test_the_shipped_configuration_starts_with_five_workers(origin):
    origin.set("/a", body=b"five")
    async with served("--config", SHIPPED, "--workers", "5", "--origin", origin.url,
                      *QUIET) as (process, url, _):  # fmt: skip
        assert await answers(url) == b"five"
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [16, 64])
async def test_the_shipped_configuration_starts_with_many_workers(origin, workers):
    # 64 workers start in about 18 s on 2 cores.
    async with served("--config", SHIPPED, "--workers", str(workers), "--origin", origin.url,
                      *QUIET, within=60) as (process, url, _):  # fmt: skip
        assert await answers(url) == b"hello from the origin"
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 60) == 0


def started(*args: str) -> subprocess.CompletedProcess[str]:
    """A start that is expected to fail before it listens."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "--origin", "http://127.0.0.1:9", "--listen",
         "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # Each of 64 workers' share of 64 KiB is 1 KiB: too small for one entry.
        (("--cache-size", "64KiB", "--workers", "64", "--set", "disk.path={disk}",
          "--set", "disk.size=4MiB", "--set", "disk.region_size=1MiB"),
         "with 64 workers, each keeps 1024 bytes of memory"),
        # The tier standing for memory needs room on /dev/shm (a container's is 64 MiB).
        (("--cache-size", "1TiB", "--workers", "2"), "docker run --shm-size"),
    ],
)  # fmt: skip
def test_what_a_worker_could_not_run_is_refused_by_the_check_and_the_start_alike(
    args, named, tmp_path
):
    args = tuple(a.format(disk=tmp_path) for a in args)
    checked, start = check(*args), started(*args)
    assert checked.returncode == start.returncode == 2
    assert named in checked.stderr
    assert checked.stderr.strip() == start.stderr.strip()
