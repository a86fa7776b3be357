"""Sweeps on a Dask distributed cluster (a local two-worker one the test starts): the results a
local run gives, progress as they come, and a clear error when no scheduler answers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from loadgen.sim.cluster import cluster_sweep
from loadgen.sim.simulate import sweep
from loadgen.traces.trace import read_trace, write_trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig

distributed = pytest.importorskip("distributed")

POLICIES = [
    (AdmissionConfig(policy="always"), "lru"),
    (AdmissionConfig(policy="second-hit"), "s3fifo"),
    (AdmissionConfig(policy="tinylfu"), "sieve"),
]


@pytest.fixture(scope="module")
def scheduler():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None, silence_logs=50,
    )  # fmt: skip
    yield cluster.scheduler_address
    cluster.close()


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    sizes = SizeSpec.parse("lognormal:median=4KiB,sigma=1,max=256KiB")
    spec = WorkloadSpec(objects=3000, requests=40_000, one_hit_share=0.4, sizes=sizes)
    path = tmp_path_factory.mktemp("cluster") / "t.oracleGeneral.bin"
    write_trace(generate(spec), path)
    return path


def comparable(results):
    return [(r.label, r.eviction, r.cache_bytes, r.stats, r.timeline) for r in results]


def test_a_sweep_on_a_two_worker_cluster_gives_the_local_results(scheduler, trace_path):
    trace = read_trace(trace_path)
    sizes = [round(trace.distinct_bytes() * s) for s in (0.01, 0.05, 0.2)]
    local = sweep(trace, sizes, POLICIES, entry_overhead=64, workers=1)
    seen = []
    remote = cluster_sweep(scheduler, trace_path, None, sizes, POLICIES, entry_overhead=64,
                           report=lambda done, total, r: seen.append((done, total)))  # fmt: skip
    assert comparable(remote) == comparable(local)
    assert [done for done, _ in seen] == list(range(1, 10)) and {t for _, t in seen} == {9}
    assert len({r.stats["hits"] for r in remote}) > 1


def test_simulate_on_a_cluster_prints_what_a_local_run_prints(scheduler, trace_path):
    def run(*extra: str) -> list[dict]:
        out = subprocess.run(
            [sys.executable, "-m", "loadgen", "simulate", "--trace", str(trace_path),
             "--cache-size", "1%,10%", "--admission", "always,second-hit", "--json", *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        cells = json.loads(out.stdout)["cells"]
        return [{k: v for k, v in c.items() if k != "elapsed_s"} for c in cells]

    assert run("--cluster", scheduler) == run()


def test_no_scheduler_at_the_address_is_a_clear_error(trace_path):
    with pytest.raises(ConnectionError, match=r"no Dask scheduler answers at tcp://127\.0\.0\.1:9"):
        cluster_sweep("tcp://127.0.0.1:9", trace_path, None, [1 << 20], POLICIES[:1],
                      entry_overhead=64, connect_timeout=1.0)  # fmt: skip


@pytest.mark.slow
def experiment_cells(tmp_path, output: str, *extra: str) -> list[dict]:
    """The cells of ``tmp_path/e.toml`` run as a user runs it, into ``output`` (``extra``:
    more flags), their times left out."""
    out = subprocess.run(
        [sys.executable, "-m", "loadgen", "experiment", str(tmp_path / "e.toml"),
         "--output", str(tmp_path / output), *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    found = json.loads((tmp_path / output / "results.json").read_text())["cells"]
    return [{k: v for k, v in c.items() if k != "elapsed_s"} for c in found]


def test_an_experiment_on_a_cluster_reports_what_a_local_run_reports(scheduler, tmp_path):
    (tmp_path / "e.toml").write_text(
        'title = "t"\nmode = "simulate"\ncache_sizes = ["1%", "10%"]\n'
        '[[workloads]]\nname = "z"\nobjects = 2000\nrequests = 20000\n'
        '[[policies]]\npolicy = "always"\n[[policies]]\npolicy = "second-hit"\neviction = "sieve"\n'
    )

    remote = experiment_cells(tmp_path, "remote", "--cluster", scheduler)
    assert remote == experiment_cells(tmp_path, "local") and len(remote) == 4


def test_an_experiment_on_a_cluster_reads_a_traces_csv_columns_as_a_local_run(scheduler, tmp_path):
    rows = "\n".join(f"{i},{i % 5 if i % 2 else i % 97},{20_000 + i % 7}" for i in range(3000))
    (tmp_path / "t.csv").write_text("ts,obj,bytes\n" + rows + "\n")
    (tmp_path / "e.toml").write_text(
        'title = "t"\nmode = "simulate"\ncache_sizes = ["10%"]\n'
        '[[workloads]]\nname = "c"\ntrace = "t.csv"\ncsv_columns = ["ts", "obj", "bytes"]\n'
        '[[policies]]\npolicy = "always"\n'
    )

    local = experiment_cells(tmp_path, "local")
    remote = experiment_cells(tmp_path, "remote", "--cluster", scheduler)
    assert remote == local and local[0]["stats"]["hits"] > 0


@pytest.mark.slow
def test_ctrl_c_stops_a_cluster_sweep_and_leaves_the_cluster_with_nothing_to_do(
    scheduler, tmp_path
):
    path = tmp_path / "long.oracleGeneral.bin"
    spec = WorkloadSpec(objects=50_000, requests=1_000_000, one_hit_share=0.3)
    write_trace(generate(spec), path)
    process = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "simulate", "--trace", str(path),
         "--cache-size", "0.1%,0.3%,1%,3%,10%,30%", "--admission", "always,second-hit,tinylfu",
         "--eviction", "lru,s3fifo,sieve,wtinylfu", "--cluster", scheduler],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # As a terminal's Ctrl-C finds it: a shell starts background jobs with SIGINT
        # ignored, and Python then never turns it into KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        first = process.stderr.readline()  # the first cell back
        assert first.startswith("[1/72]"), first
        process.send_signal(signal.SIGINT)
        said = process.communicate(timeout=30)[1]
    finally:
        process.kill()
    assert process.returncode == 130 and "interrupted" in said
    with distributed.Client(scheduler, timeout=10) as client:
        deadline = time.monotonic() + 20
        while client.run_on_scheduler(_tasks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.run_on_scheduler(_tasks) == 0


def _tasks(dask_scheduler=None) -> int:
    """The tasks the scheduler still holds (run on the scheduler)."""
    return len(dask_scheduler.tasks)
