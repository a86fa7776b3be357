"""Experiments: files are checked before anything runs; a small matrix runs live and simulated."""

import hashlib
import json
import re
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from loadgen.live.experiment import run
from loadgen.live.experiment_file import ExperimentError, demo_experiment, load_experiment
from loadgen.live.processes import onehit_process
from loadgen.traces.trace import Trace, write_trace
from proxy.core.admission import POLICIES
from proxy.core.evictions import EVICTIONS

CONFIG = Path(__file__).parent.parent / "config"
EXPERIMENTS = sorted(CONFIG.glob("experiments/*.toml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_ready_experiments_load(path):
    experiment = load_experiment(path)
    assert experiment.policies and experiment.workloads and experiment.cache_sizes


def test_the_policies_experiment_crosses_every_admission_with_every_eviction():
    specs = load_experiment(CONFIG / "experiments" / "policies.toml").policies
    pairs = {(p.admission.policy.split(":")[0], p.eviction) for p in specs}
    memory = [name for name in POLICIES if name != "auto"]  # auto is a disk tier's
    assert pairs == {(name, eviction) for name in memory for eviction in EVICTIONS}


def test_the_fleet_experiment_puts_nginx_in_front_by_round_robin_and_url_hash():
    labels = [p.label() for p in load_experiment(CONFIG / "experiments" / "fleet.toml").policies]
    assert "second-hit(auto) x3 shared filter behind nginx round-robin" in labels
    assert "second-hit(auto) x3 local filters behind nginx url-hash" in labels
    assert "second-hit(auto) (3x cache)" in labels


def test_demo_file_runs_the_same_cells_as_the_embedded_demo():
    from_file = load_experiment(CONFIG / "demo.toml")
    assert replace(from_file, meta={}) == replace(demo_experiment(), meta={})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('mode = "fast"\ncache_sizes = ["1%"]\n[[policies]]\n', "mode = 'fast': expected one of"),
        ('cache_sizes = "1%"\n[[policies]]\n', "cache_sizes must be a list"),
        ('cache_sizes = ["1%"]\n', "at least one [[policies]]"),
        ('cache_sizes = ["1%"]\n[[policies]]\npolicy = "lfu"\n', "unknown admission policy 'lfu'"),
        (
            'cache_sizes = ["1%"]\n[[policies]]\nfp_rate = "0.01"\n',
            "fp_rate = '0.01': expected a number",
        ),
        ('cache_sizes = ["1%"]\n[[policies]]\nwindoe = "1m"\n', "did you mean 'window'"),
        ('cache_sizes = ["1%"]\n[[policies]]\n[[workloads]]\nalpha = -1\n', "alpha must be >= 0"),
        ('cache_sizes = ["1%"]\n[[policies]]\n[live]\nconcurency = 2\n', "'concurrency'"),
        ('cache_sizes = ["1%"]\n[[policies]]\nwindow = "soon"\n', "duration 'soon'"),
        ('cache_sizes = ["1%"]\n[[policies]]\nbalancer = "random"\n', "balancer = 'random'"),
        ('cache_sizes = ["1%"]\n[[policies]]\ncache_scale = 0\n', "cache_scale = 0"),
        (
            'cache_sizes = ["1%"]\n[[policies]]\npolicy = "second-hit:x4"\ninstances = 3\n'
            'backend = "redis"\n',
            "backend = 'redis' shares the second-hit filter",
        ),
        ('sample = 2\ncache_sizes = ["1%"]\n[[policies]]\n', "sample = 2: expected a rate"),
    ],
)
def test_bad_experiment_files_name_the_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert message in str(info.value) and str(path) in str(info.value)


@pytest.mark.slow
def test_a_small_matrix_runs_live_and_simulated_into_one_report(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(
        'title = "small"\nmode = "both"\ncache_sizes = ["2%", "10%"]\n'
        'live_cache_sizes = ["10%"]\n'
        '[[workloads]]\nname = "tiny"\nobjects = 300\nrequests = 1500\n'
        'sizes = "lognormal:median=2KiB,sigma=1,max=64KiB"\n'
        '[[policies]]\npolicy = "always"\n[[policies]]\npolicy = "second-hit"\n'
        '[live]\nconcurrency = 1\norigin_latency = "0ms"\n'
    )
    lines: list[str] = []
    written = run(load_experiment(path), tmp_path / "out", workers=1, say=lines.append)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    modes = [(c["mode"], c["policy"], c["cache_bytes"]) for c in results["cells"]]
    assert len([m for m in modes if m[0] == "simulate"]) == 4
    assert len([m for m in modes if m[0] == "live"]) == 2
    live = [c for c in results["cells"] if c["mode"] == "live"]
    for c in live:
        # The proxy's /stats and the client agree, and nothing was flagged.
        assert c["disagreements"] == []
        assert c["client"]["completed"] == c["stats"]["requests"] == 1500
    agreement = [line for line in lines if "within 1 pp" in line]
    assert agreement, "the run prints live against simulated"
    assert (tmp_path / "out" / "index.html") in written
    # Each live proxy's what-if is kept, and the report shows it.
    assert all(c["whatif"]["curves"] for c in live)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## What if (live)" in summary and "| tiny | second-hit(auto) | 10%" in summary


def test_a_sampled_experiment_simulates_a_sample_and_says_so(tmp_path):
    path = tmp_path / "sampled.toml"
    path.write_text(
        'sample = 0.25\ncache_sizes = ["2%", "10%"]\n'
        '[[workloads]]\nname = "z"\nobjects = 2000\nrequests = 20000\n'
        '[[policies]]\npolicy = "always"\n'
    )
    run(load_experiment(path), tmp_path / "out", workers=1, say=lambda _: None)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert "SHARDS" in results["meta"]["sampling z"]
    assert [c["sample_rate"] for c in results["cells"]] == [0.25, 0.25]
    assert all(c["stats"]["requests"] == 20_000 for c in results["cells"])


def test_a_workload_names_a_csv_traces_columns_and_the_report_says_where_it_came_from(
    tmp_path,
):
    """``csv_columns`` reads a trace another tool wrote; results.json and the report carry
    the provenance: the command, onehit's version and commit, the trace as named and its
    digest, the date and time taken, and no path of the machine it ran on."""
    trace = tmp_path / "other.csv"
    trace.write_text("ts,obj,bytes,extra\n0,a,10,x\n1,b,20,y\n2,a,10,x\n3,a,10,z\n")
    path = tmp_path / "e.toml"
    path.write_text('cache_sizes = ["10KiB"]\n[[workloads]]\nname = "other"\n'
                    'trace = "other.csv"\ncsv_columns = ["ts", "obj", "bytes"]\n'
                    '[[policies]]\npolicy = "always"\n')  # fmt: skip
    run(load_experiment(path), tmp_path / "out", workers=1, say=lambda _: None)
    written = (tmp_path / "out" / "results.json").read_text()
    results = json.loads(written)
    assert results["cells"][0]["stats"]["hits"] == 2
    made = results["provenance"]
    assert made["traces"] == [{"trace": "other: other.csv", "sha256": hashlib.sha256(
        trace.read_bytes()).hexdigest()}]  # fmt: skip
    assert made["configs"] == [{"file": "e.toml", "sha256": hashlib.sha256(
        path.read_bytes()).hexdigest()}]  # fmt: skip
    assert made["onehit"] and made["commit"] and made["date"].startswith("20")
    assert made["elapsed_s"] >= 0 and made["command"]  # the test runner's own, here
    for page in ("results.json", "summary.md", "index.html"):
        assert str(tmp_path) not in (tmp_path / "out" / page).read_text(), page
    assert "## Provenance" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.parametrize(
    ("workload", "said"),
    [('trace = "real:nope"', "the real traces are real:"),
     ('trace = "t.csv"\ncsv_columns = ["ts", "obj"]', "csv_columns is three names"),
     ('objects = 10\ncsv_columns = "1,2,3"', "csv_columns goes with a trace"),
     ('trace = "t.csv"\nrequests = 0', "requests is how many of the trace's first"),
     ("objects = 10\nrequests = true", "workload: requests is a whole number, not True"),
     ("objects = 2.5", "workload: objects is a whole number, not 2.5"),
     ('trace = "real:twitter52"\nrequests = "1M"', "a whole number: not '1M'")],
)  # fmt: skip
def test_a_workloads_trace_and_columns_are_checked_as_the_file_is_read(tmp_path, workload, said):
    path = tmp_path / "e.toml"
    path.write_text(f'cache_sizes = ["1%"]\n[[workloads]]\nname = "w"\n{workload}\n'
                    '[[policies]]\npolicy = "always"\n')  # fmt: skip
    with pytest.raises(ExperimentError, match=re.escape(said)):
        load_experiment(path)


@pytest.mark.parametrize("path", sorted((CONFIG / "experiments").glob("*.toml")), ids=str)
def test_every_shipped_experiment_file_reads(path):
    experiment = load_experiment(path)
    assert experiment.workloads and experiment.policies


def test_a_workload_names_a_real_trace_fetched_only_when_run(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('cache_sizes = ["1%"]\n[[workloads]]\nname = "t"\n'
                    'trace = "real:twitter52"\n[[policies]]\npolicy = "always"\n')  # fmt: skip
    (workload,) = load_experiment(path).workloads
    assert (workload.given, workload.trace_path) == ("real:twitter52", None)


def _recorded(tmp_path, lines: str = "") -> dict:
    """An experiment of a recorded four-request trace (keys 1, 2, 1, 1) with ``lines`` added
    to its workload: its results."""
    write_trace(Trace(np.arange(4.0), np.array([1, 2, 1, 1]), np.array([10, 20, 10, 10])),
                tmp_path / "t.csv")  # fmt: skip
    path = tmp_path / "e.toml"
    path.write_text('cache_sizes = ["10KiB"]\n[[workloads]]\nname = "rec"\ntrace = "t.csv"\n'
                    f'{lines}[[policies]]\npolicy = "always"\n')  # fmt: skip
    run(load_experiment(path), tmp_path / "out", workers=1, say=lambda _: None)
    return json.loads((tmp_path / "out" / "results.json").read_text())


def test_workload_can_replay_a_recorded_trace(tmp_path):
    (cell,) = _recorded(tmp_path)["cells"]
    assert cell["stats"]["hits"] == 2


def test_a_workload_replays_a_traces_first_requests_and_says_so(tmp_path):
    """``requests = 3``: the simulated cells run the first three requests (one hit of the
    four's two), and the report's workload line says so."""
    results = _recorded(tmp_path, "requests = 3\n")
    (cell,) = results["cells"]
    assert (cell["stats"]["requests"], cell["stats"]["hits"]) == (3, 1)
    assert "its first 3 requests: 3 requests" in results["meta"]["workload rec"]


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_a_fleet_with_a_shared_filter_admits_what_local_filters_miss(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(
        'mode = "live"\ncache_sizes = ["4MiB"]\n'
        '[[workloads]]\nname = "tiny"\nobjects = 200\nrequests = 1200\none_hit_share = 0.0\n'
        'sizes = "fixed:1KiB"\n'
        '[[policies]]\npolicy = "second-hit"\ninstances = 3\nbackend = "memory"\n'
        '[[policies]]\npolicy = "second-hit"\ninstances = 3\nbackend = "redis"\n'
        '[live]\nconcurrency = 1\norigin_latency = "0ms"\n'
    )
    run(load_experiment(path), tmp_path / "out", workers=1, say=lambda _: None)
    cells = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    local, shared = (next(c for c in cells if c["policy"].endswith(kind))
                     for kind in ("local filters", "shared filter"))  # fmt: skip
    for c in (local, shared):
        assert c["stats"]["requests"] == 1200 and c["disagreements"] == []
    # Round robin over three: a URL's second request usually lands on another instance.
    assert shared["stats"]["admissions"] > local["stats"]["admissions"]
    assert shared["stats"]["hits"] > local["stats"]["hits"]


async def test_a_live_cell_proxy_listens_where_the_kernel_put_it_and_answers():
    async with onehit_process("http://127.0.0.1:1", {}) as running:
        port = int(running.url.rsplit(":", 1)[1])
        assert port != 0 and running.admin_url != running.url
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 502")  # nothing listens at the origin


@pytest.mark.parametrize(
    "setting, said",
    [
        (("cache.sise", "1MiB"), r"exited with 2 at start; it said:\n.*did you mean 'size'"),
        (("server.listen", None), r"exited with 1 at start; it said:\n.*cannot start: .*in use"),
    ],
    ids=["bad config", "port taken"],
)
async def test_a_live_cell_proxy_that_cannot_start_is_reported_with_what_it_said(setting, said):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        key, value = setting
        value = value or f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(RuntimeError, match=f"(?s){said}"):
            async with onehit_process("http://127.0.0.1:1", {key: value}):
                pass


@pytest.mark.slow
def test_live_cells_with_a_disk_tier_show_what_each_disk_was_written_and_spared(tmp_path):
    path = tmp_path / "disk.toml"
    path.write_text(
        'title = "disk"\nmode = "live"\ncache_sizes = ["2%"]\n'
        '[[workloads]]\nname = "tiny"\nobjects = 300\nrequests = 3000\none_hit_share = 0.5\n'
        'sizes = "fixed:4KiB"\n'
        '[[policies]]\npolicy = "always"\n'
        '[live]\nconcurrency = 1\norigin_latency = "0ms"\ndisk_size = "8MiB"\n'
    )
    lines: list[str] = []
    run(load_experiment(path), tmp_path / "out", workers=1, say=lines.append)
    [cell] = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    disk = cell["disk"]
    # Second hit on the disk: the one-hit wonders (half the requests) are never written.
    assert disk["admissions"] > 0 and disk["rejected"] >= 1500
    assert disk["bytes_not_written"] > disk["bytes_written"] > 0
    # A hit from disk is a hit: what the client saw and what the proxy counted agree.
    assert cell["stats"]["hits_from_disk"] > 0 and cell["disagreements"] == []
    [table] = [line for line in lines if "the disk tier behind each live proxy" in line]
    assert "disk admission" in table and "second-hit" in table  # the disk's own, not memory's


def test_free_ports_in_a_row_are_never_the_same():
    """A proxy's port and its admin's, picked one after the other, once came out equal."""
    from loadgen.live.processes import free_port

    picked = [free_port() for _ in range(64)]
    assert len(set(picked)) == 64
