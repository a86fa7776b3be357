"""`onehit-proxy` as a user runs it: bad config stops start-up with one line; SIGTERM drains."""

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest
from conftest import served, wait_healthy

from loadgen.live.processes import free_port, onehit_process
from proxy.__main__ import YOUNG_COLLECTION_THRESHOLD, main, worker_count
from proxy.config.settings import DiskSection
from proxy.disk.store import DiskStore
from proxy.ops.handoff import SECRET_FIELD, HandedConfig


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--origin", "not a url"], {}, "command line: [upstream] origin = 'not a url': expected"),
        (["--origin", "http://127.0.0.1:1", "--cache-size", "big"], {}, "[cache] size = 'big'"),
        ([], {}, "no origin"),
        (
            ["--origin", "http://127.0.0.1:1"],
            {"ONEHIT_ADMISSION_POLICI": "always"},
            "did you mean ONEHIT_ADMISSION_POLICY",
        ),
        (["--set", "cache.sise=1MiB", "--origin", "http://127.0.0.1:1"], {}, "did you mean 'size'"),
    ],
)
def test_bad_config_stops_start_up_with_one_line(args, env, message):
    out = subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_check_config_prints_the_settings_in_force_with_secrets_redacted(tmp_path):
    path = tmp_path / "proxy.toml"
    path.write_text('[cache]\nsize = "64MiB"\n[admin]\ntoken = "s3cret"\n')
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "--check-config", "--config", str(path),
         "--origin", "http://127.0.0.1:1", "--cache-size", "1GiB",
         "--set", "admission.redis_url=redis://:pw@10.0.0.9:6379/0"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "ONEHIT_ADMISSION_POLICY": "always"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    settings = json.loads(out.stdout)
    assert settings["cache"]["size"] == 1 << 30  # the flag over the file
    assert settings["admission"]["policy"] == "always"  # the environment
    assert settings["upstream"]["origin"] == "http://127.0.0.1:1"
    assert settings["server"]["listen"] == "127.0.0.1:8080"  # a default
    assert "s3cret" not in out.stdout and ":pw@" not in out.stdout
    assert settings["admin"]["token"] == "<redacted>"


@pytest.mark.parametrize("warm", [False, True], ids=["new connection", "sent at once"])
async def test_sigterm_lets_requests_in_flight_finish_then_exits_0(origin, warm):
    origin.set("/slow", delay=1.0, body=b"finished")
    async with onehit_process(origin.url, {}) as proxy:
        process, url = proxy.process, proxy.url
        async with aiohttp.ClientSession() as client:
            if warm:  # an idle pooled origin connection: the miss is sent on it at once
                async with client.get(url + "/warm") as r:
                    assert r.status == 200
            in_flight = asyncio.ensure_future(client.get(url + "/slow"))
            await origin.arrived("/slow")  # in flight at the origin
            process.send_signal(signal.SIGTERM)
            response = await in_flight
            assert response.status == 200 and await response.read() == b"finished"
            response.release()
        assert await asyncio.wait_for(process.wait(), 15) == 0


async def test_the_served_process_freezes_its_start_up_objects_and_collects_less_often(origin):
    async with onehit_process(origin.url, {}) as proxy:
        process, admin = proxy.process, proxy.admin_url
        async with aiohttp.ClientSession() as client, client.get(admin + "/stats") as r:
            collector = (await r.json())["collector"]
        # Young objects collected less often than CPython's every 700 allocations, and the
        # objects alive at start-up (modules, engine) out of every collection.
        assert collector["threshold"][0] == YOUNG_COLLECTION_THRESHOLD > 700
        assert collector["frozen_objects"] > 10_000
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0


def test_workers_auto_is_one_per_core_this_process_may_use(capsys):
    assert worker_count("auto") == len(os.sched_getaffinity(0))
    assert worker_count("3") == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(SystemExit):
            main(["--workers", bad, "--check-config"])
        assert "expected a positive count or auto" in capsys.readouterr().err


def test_a_disk_admitting_by_auto_is_refused_under_workers(capsys, tmp_path):
    """auto keeps its ghosts in one process, and the workers share one tier: each would
    choose alone for it (it started, and did)."""
    assert main(["--workers", "2", "--check-config", "--set", f"disk.path={tmp_path}",
                 "--set", "disk.policy=auto"]) == 2  # fmt: skip
    said = capsys.readouterr().err
    assert "[disk] policy = 'auto' with [server] workers = 2" in said and "give the disk" in said


async def test_workers_share_the_port_and_the_admin_sums_them(origin):
    args = ("--workers", "2", "--origin", origin.url, "--set", "server.access_log=false")
    async with served(*args) as (process, url, admin):
        connector = aiohttp.TCPConnector(force_close=True)  # new connections spread over workers
        async with aiohttp.ClientSession(connector=connector) as client:
            for i in range(30):
                async with client.get(f"{url}/w{i % 5}") as r:
                    assert r.status == 200
            async with client.get(admin + "/stats") as r:
                stats = await r.json()
            async with client.get(admin + "/metrics") as r:
                metrics = await r.text()
            async with client.get(admin + "/readyz") as r:
                ready = (r.status, await r.json())
        assert stats["worker_count"] == 2
        assert ready[0] == 200 and [w["worker"] for w in ready[1]["workers"]] == [0, 1]
        assert all(c["ok"] for w in ready[1]["workers"] for c in w["checks"])
        per_worker = [w["metrics"]["requests"] for w in stats["workers"]]
        assert sum(per_worker) == stats["sum"]["requests"] == 30
        assert "onehit_requests_total 30.0" in metrics
        assert 'onehit_worker_up{worker="0"} 1' in metrics
        assert 'onehit_worker_up{worker="1"} 1' in metrics
        per = re.findall(r'^onehit_worker_requests_total\{worker="\d"\} (\d+)$', metrics, re.M)
        assert len(per) == 2 and sum(map(int, per)) == 30
        if shutil.which("promtool"):
            out = subprocess.run(["promtool", "check", "metrics"], input=metrics, text=True,
                                 capture_output=True, timeout=30)  # fmt: skip
            assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


async def twice_on_new_connections(url: str, admin: str, paths: list[str]) -> dict:
    """Ask each of ``paths`` twice, each request on a new connection (the kernel hands each
    to either worker); the parent's /stats after."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as client:
        for _ in range(2):
            for path in paths:
                async with client.get(url + path) as r:
                    assert r.status == 200
        async with client.get(admin + "/stats") as r:
            return await r.json()


async def test_workers_share_one_admission_window_so_a_second_request_is_stored(origin):
    """Each request on a new connection lands on either worker: with one window per worker
    a URL's second request went to the other worker half the time and was not stored."""
    args = ("--workers", "2", "--origin", origin.url, "--set", "server.access_log=false")
    async with served(*args) as (process, url, admin):
        stats = await twice_on_new_connections(url, admin, [f"/u{i}" for i in range(100)])
        per_worker = [w["metrics"]["requests"] for w in stats["workers"]]
        assert min(per_worker) > 0  # both workers answered
        assert stats["sum"]["admissions"] >= 98  # false positives of the filter aside
        one = stats["workers"][0]["metrics"]
        assert stats["sum"]["filter_bytes"] == one["filter_bytes"] > 0  # one window, counted once
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


@pytest.mark.slow
async def test_the_parent_shows_the_machines_what_if_memory_from_each_worker_disk_from_all(
    origin, tmp_path
):
    """Each worker's memory ghosts see its share: the parent's /stats and /metrics give the
    memory curves of all of them as one (``merged_curves``). The disk they share has one set
    of ghosts, the parent's, fed by every worker: a URL written through one worker and asked
    again through the other is a hit there, so admitting all to it misses each URL once."""
    args = ("--workers", "2", "--origin", origin.url, "--set", "server.access_log=false",
            "--set", "whatif.sample=1", "--set", f"disk.path={tmp_path}")  # fmt: skip
    async with served(*args) as (process, url, admin):
        stats = await twice_on_new_connections(url, admin, [f"/w{i}" for i in range(100)])
        mine = {(c["tier"], c["policy"], c["scale"]): c for c in stats["whatif"]["curves"]}
        theirs = [c for w in stats["workers"] for c in w["whatif"]["curves"]]
        assert {c["tier"] for c in theirs} == {"memory"}
        for (tier, policy, scale), curve in mine.items():
            if tier == "disk":
                continue
            parts = [c for c in theirs if (c["policy"], c["scale"]) == (policy, scale)
                     and c["miss_ratio"] is not None]  # fmt: skip
            assert curve["sampled"] == sum(c["sampled"] for c in parts) > 0
            low, high = min(c["miss_ratio"] for c in parts), max(c["miss_ratio"] for c in parts)
            assert low - 1e-9 <= curve["miss_ratio"] <= high + 1e-9
        disk = [c for key, c in mine.items() if key[0] == "disk" and key[1] == "always"]
        assert disk and all(c["sampled"] == 200 and c["miss_ratio"] == 0.5 for c in disk)
        assert [w["whatif"]["batches_dropped"] for w in stats["workers"]] == [0, 0]
        assert stats["whatif"]["batches_dropped"] == 0
        async with aiohttp.ClientSession() as client, client.get(admin + "/metrics") as r:
            text = await r.text()
        assert 'onehit_whatif_miss_ratio{tier="memory"' in text
        assert 'onehit_whatif_miss_ratio{tier="disk",policy="always"' in text
        assert "onehit_whatif_batches_dropped_total 0" in text
        # The workers' own counts, summed as the engine's are.
        assert "onehit_answers_cut_total 0" in text and "onehit_fast_misses_total" in text
        good = {"from": 0, "pid": 1234, "rate": 1.0, "requests": 1,
                "sample": [[1.0], [1], [1], [1], [1]]}  # fmt: skip
        columns = [[[1.0], [1], [1], [1]], [[1.0], [-1], [1], [1], [1]],
                   [[1.0, 2.0], [1], [1], [1], [1]], [["NaN"], [1], [1], [1], [1]],
                   [[1.0], [1], [1], [1], [-5]], [[1.0], [1], [1], [1], [2**62]],
                   [[1.0], [2**64], [1], [1], [1]], [[1.0], [1.5], [1], [1], [1]]]  # fmt: skip
        bad = [[], *({**good, "sample": c} for c in columns),
               *({**good, key: value} for key, value in (
                   ("from", 2), ("from", -1), ("from", True), ("requests", 10**400),
                   ("requests", True), ("rate", 0.0), ("rate", 1), ("pid", 0)))]  # fmt: skip
        async with aiohttp.ClientSession() as client:
            # Another user of the machine, without the secret the parent hands its workers.
            for forged in ({}, {SECRET_FIELD: "guess"}):
                async with client.post(admin + "/whatif", json=good, headers=forged) as r:
                    assert r.status == 403
            machine = {SECRET_FIELD: machine_secret(process.pid)}
            for body in bad:
                async with client.post(admin + "/whatif", json=body, headers=machine) as r:
                    assert r.status == 400, body
            async with client.post(admin + "/whatif", json=good, headers=machine) as r:
                assert (r.status, await r.json()) == (200, {"fed": 1})
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


def machine_secret(parent: int) -> str:
    """The secret a --workers parent (pid ``parent``) hands its workers, read as a worker
    reads it: from the memory file it inherits (here, through /proc)."""
    for fd in os.listdir(f"/proc/{parent}/fd"):
        if "onehit-config" in os.readlink(f"/proc/{parent}/fd/{fd}"):
            handed = HandedConfig(os.open(f"/proc/{parent}/fd/{fd}", os.O_RDONLY))
            try:
                return handed.read().secret
            finally:
                handed.close()
    raise AssertionError("no configuration handed to workers")


@pytest.mark.slow
async def test_a_worker_killed_is_replaced_and_shares_the_window_with_the_others(origin):
    args = ("--workers", "2", "--origin", origin.url, "--set", "server.access_log=false")
    async with served(*args) as (process, url, admin):
        async with aiohttp.ClientSession() as client:
            async with client.get(admin + "/stats") as r:
                pids = [w["pid"] for w in (await r.json())["workers"]]
            os.kill(pids[0], signal.SIGKILL)
            await wait_healthy(client, admin + "/healthz")
            for _ in range(100):  # until the parent has replaced it
                async with client.get(admin + "/stats") as r:
                    stats = await r.json()
                if stats["workers_replaced"] == 1 and pids[0] not in [
                    w["pid"] for w in stats["workers"]
                ]:
                    break
                await asyncio.sleep(0.1)
            assert stats["workers_replaced"] == 1 and stats["worker_count"] == 2
        stats = await twice_on_new_connections(url, admin, [f"/k{i}" for i in range(50)])
        assert stats["sum"]["admissions"] >= 49
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


async def test_the_parent_admin_answers_while_a_worker_is_replaced_and_refuses_bad_purges(
    origin,
):
    args = ("--workers", "2", "--origin", origin.url, "--set", "server.access_log=false")
    async with served(*args) as (process, _, admin), aiohttp.ClientSession() as client:
        for body in ('{"url": "http://example.test/\\ud800"}', "{not json"):
            async with client.post(admin + "/purge", data=body,
                                   headers={"Content-Type": "application/json"}) as r:  # fmt: skip
                assert r.status == 400, await r.text()
        async with client.get(admin + "/stats") as r:
            pid = (await r.json())["workers"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        statuses = set()
        for _ in range(300):  # while the parent replaces it
            async with client.get(admin + "/stats") as r:
                statuses.add(r.status)
                stats = await r.json()
            async with client.post(admin + "/purge", json={"prefix": "http://a/"}) as r:
                statuses.add(r.status)
            if stats["workers_replaced"] == 1 and stats["missing"] == 0:
                break
            await asyncio.sleep(0.02)
        assert statuses == {200} and stats["worker_count"] == 2
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0


async def test_workers_stop_when_their_parent_is_killed(origin):
    """A worker left behind a dead parent would hold the port and serve alone: it drains."""
    args = ("--workers", "2", "--origin", origin.url, "--set", "server.access_log=false")
    async with served(*args) as (process, _, admin):
        async with aiohttp.ClientSession() as client, client.get(admin + "/stats") as r:
            pids = [w["pid"] for w in (await r.json())["workers"]]
        process.kill()
        await process.wait()
        for _ in range(100):
            alive = [pid for pid in pids if _running(pid)]
            if not alive:
                break
            await asyncio.sleep(0.1)
        assert not alive, f"workers {alive} outlived their parent"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_errors_logged_while_serving_do_not_carry_the_uvloop_import_error():
    from proxy.__main__ import _run

    async def context_of_a_new_error() -> BaseException | None:
        try:
            raise RuntimeError("while serving")
        except RuntimeError as exc:
            return exc.__context__

    assert _run(context_of_a_new_error()) is None


def test_a_disk_directory_in_use_or_open_to_every_user_stops_start_up_with_one_line(tmp_path):
    def start(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "proxy", "--origin", "http://127.0.0.1:1", "--listen",
             "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *args],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    held = DiskStore(DiskSection(path=str(tmp_path / "held")))
    try:
        one = start("--set", f"disk.path={tmp_path / 'held'}")
        many = start("--set", f"disk.path={tmp_path / 'held'}", "--workers", "2", "--listen",
                     "127.0.0.1:8999")  # fmt: skip
    finally:
        held.close()
    for out in (one, many):
        assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "[disk] path" in out.stderr and "in use by another onehit process" in out.stderr
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    out = start("--set", f"disk.path={tmp_path / 'open'}")
    # A configuration problem, found before the start (as --check-config finds it): status 2.
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "every user may write to it" in out.stderr


def test_aiohttps_pure_python_parser_stops_start_up_with_one_line():
    """It reads some requests otherwise than llhttp (a lower-case "get" as GET), and the
    front's reader is a subset of llhttp's: the proxy would answer by two readers."""
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "--origin", "http://127.0.0.1:1", "--listen",
         "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "AIOHTTP_NO_EXTENSIONS": "1"},
    )  # fmt: skip
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "pure-Python parser" in out.stderr


async def test_a_lower_case_method_is_refused(origin):
    async with served("--origin", origin.url) as (_, url, _):
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"get /x HTTP/1.1\r\nHost: a.example\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(1024), 5)
        writer.close()
    assert answer[9:12] == b"400", answer[:100]
    assert origin.hits["/x"] == 0


def test_workers_on_a_port_in_use_stop_start_up_with_the_reason():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "proxy", "--origin", "http://127.0.0.1:1", "--workers", "2",
             "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{free_port()}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (  # the parent binds the port, before any
        f"onehit-proxy: cannot start: [Errno 98] cannot listen on 127.0.0.1:{port} "  # worker
        "([server] listen): address already in use"
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "disk.path=/proc/onehit-cache",
            "[disk] path '/proc/onehit-cache' does not exist and cannot be created",
        ),
        ("server.access_log_file=/proc/access.log", "[server] access_log_file '/proc/access.log'"),
        ("server.access_log_file=/tmp", "[server] access_log_file '/tmp' is a directory"),
    ],
)
@pytest.mark.parametrize("check", [True, False], ids=["--check-config", "start"])
def test_an_unusable_path_is_refused_by_check_config_and_at_start_with_one_line(
    setting, message, check
):
    out = subprocess.run(
        [sys.executable, "-m", "proxy", *(["--check-config"] if check else []),
         "--origin", "http://127.0.0.1:1", "--set", setting,
         "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


async def test_after_a_reload_the_workers_feed_the_machines_new_disk_ghosts(origin, tmp_path):
    """A reload that changes ``[whatif]`` builds the ghosts afresh, the workers' and the
    parent's: the workers' new ghosts hand their samples on as the old ones did, and the
    parent's disk ghosts count the requests since the reload alone."""
    path = tmp_path / "proxy.toml"

    def write(policies: str) -> None:
        path.write_text(f'[whatif]\nsample = 1.0\npolicies = [{policies}]\n'
                        f'[disk]\npath = "{tmp_path / "disk"}"\n')  # fmt: skip

    write('"always"')
    args = ("--config", str(path), "--workers", "2", "--origin", origin.url,
            "--set", "server.access_log=false")  # fmt: skip
    async with served(*args) as (process, url, admin):
        await twice_on_new_connections(url, admin, [f"/a{i}" for i in range(50)])
        write('"always", "tinylfu"')
        async with aiohttp.ClientSession() as client, client.post(admin + "/reload", json={}) as r:
            assert r.status == 200, await r.text()
        stats = await twice_on_new_connections(url, admin, [f"/b{i}" for i in range(50)])
        disk = [c for c in stats["whatif"]["curves"] if c["tier"] == "disk"]
        assert disk and {c["sampled"] for c in disk} == {100}
        assert {c["policy"] for c in stats["whatif"]["curves"]} >= {"tinylfu"}
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
