"""`onehit-loadgen gen` and `simulate` as a user runs them, in a real subprocess."""

import json
import subprocess
import sys

import pytest


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "t.csv"
    out = run("gen", "--objects", "2000", "--requests", "30000", "--seed", "5", "-o", str(path))
    assert out.returncode == 0, out.stderr
    assert "wrote 30,000 requests" in out.stdout
    return path


def test_simulate_json_reports_every_metric(trace_file):
    out = run(
        "simulate", "--trace", str(trace_file), "--cache-size", "1%", "--admission",
        "second-hit", "--window", "10m", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (cell,) = json.loads(out.stdout)["cells"]
    assert cell["policy"] == "second-hit(10m)" and cell["cache"].startswith("1% (")
    assert cell["stats"]["requests"] == 30_000
    assert 0 < cell["stats"]["hit_ratio"] < 1


def test_sweep_prints_one_table_with_space_saved(trace_file, tmp_path):
    out = run(
        "simulate", "--trace", str(trace_file), "--cache-size", "0.5%,2%,8%",
        "--admission", "always,second-hit", "--auto-scale", "1,4", "--workers", "2",
        "--report-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    verdict, *lines = out.stdout.splitlines()
    assert verdict.startswith("t.csv: with a cache of 2% (") and "of LRU's bytes" in verdict
    assert lines[0].split()[:2] == ["policy", "cache"] and "space saved" in lines[0]
    assert len(lines) == 2 + 3 * 3 + 1 and lines[-1].startswith("space saved: 1 - S'/S")
    assert sum("second-hit(auto x4)" in line for line in lines) == 3
    for size in ("0.5%", "2%", "8%"):  # per size, the best hit ratio and the fewest writes
        at = [line for line in lines if f" {size} (" in line]
        assert sum(line.count("*") for line in at) >= 2
    assert json.loads((tmp_path / "r" / "results.json").read_text())["cells"]
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert summary.splitlines()[2] == verdict and "| policy |" in summary
    assert (tmp_path / "r" / "hit-ratio-vs-bytes-written.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cache-size", "lots"], "--cache-size: size 'lots' is not a size"),
        (
            ["--cache-size", "1%", "--admission", "lfu"],
            "--admission: unknown admission policy 'lfu'",
        ),
        (
            ["--cache-size", "1%", "--admission", "nth-hit"],
            "'nth-hit' needs its parameter: nth-hit:N",
        ),
        (["--cache-size", "1%", "--window", "soon"], "duration 'soon'"),
        (["--cache-size", "1%", "--sample", "2"], "--sample: a rate is above 0 and at most 1"),
        (["--cache-size", "1%", "--sample", "some"], "--sample: 'some' is not a rate"),
        (["--cache-size", "1%", "--csv-columns", "a,b,c"], "no column named 'a'"),
        (["--cache-size", "1%", "--disk-size", "1MiB"], "fewer than 2 regions"),
        (["--cache-size", "1%", "--disk-size", "inf%"], "disk size 'inf%' is not a percentage"),
        (["--cache-size", "nan%"], "cache size 'nan%' is not a percentage"),
        (["--cache-size", "1%", "--disk-size", "64MiB", "--sample", "0.1"], "not with --sample"),
        (
            ["--cache-size", "1%", "--disk-size", "64MiB", "--disk-admission", "tinylfu"],
            "use one of always, second-hit",
        ),
    ],
)
def test_bad_flags_get_one_clear_line(trace_file, flags, message):
    out = run("simulate", "--trace", str(trace_file), *flags)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_two_tiers_print_the_hit_ratio_of_both_and_what_the_disk_was_written(trace_file):
    out = run(
        "simulate", "--trace", str(trace_file), "--cache-size", "1%", "--admission", "always",
        "--disk-size", "8MiB", "--region-size", "1MiB", "--disk-admission", "always,second-hit",
        "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    always, second = json.loads(out.stdout)
    assert always["policy"] == "always + disk always"
    assert second["policy"] == "always + disk second-hit(auto)"
    for cell in (always, second):
        s = cell["stats"]
        assert s["requests"] == 30_000 and 0 < s["hit_ratio"] < 1
        assert s["hits"] == s["hits_from_memory"] + s["hits_from_disk"]
        assert s["hits_from_disk"] == s["disk_hits"] > 0
    assert second["stats"]["disk_bytes_written"] < always["stats"]["disk_bytes_written"]
    table = run(
        "simulate", "--trace", str(trace_file), "--cache-size", "1%", "--disk-size", "8MiB",
        "--region-size", "1MiB", "--disk-admission", "second-hit,auto",
    )  # fmt: skip
    assert table.returncode == 0 and "disk written" in table.stdout
    assert "disk auto behind 1% " in table.stderr and " decides (" in table.stderr
    # A disk as a share of the trace's distinct bytes, as the memory's may be: 50% of its
    # 247 MiB, more than 8 MiB, so more of it is hit.
    shared = run(
        "simulate", "--trace", str(trace_file), "--cache-size", "1%", "--disk-size", "50%",
        "--region-size", "1MiB", "--admission", "always", "--disk-admission", "always", "--json",
    )  # fmt: skip
    assert shared.returncode == 0, shared.stderr
    (half,) = json.loads(shared.stdout)
    assert half["stats"]["hits_from_disk"] > always["stats"]["hits_from_disk"]


def test_a_sampled_run_says_so_and_estimates_the_whole_trace(trace_file, tmp_path):
    out = run(
        "simulate", "--trace", str(trace_file), "--cache-size", "5%", "--admission", "always",
        "--sample", "50%", "--json", "--report-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert "SHARDS" in doc["meta"]["sampling"] and "of 30,000 requests" in doc["meta"]["sampling"]
    (cell,) = doc["cells"]
    assert cell["sample_rate"] == 0.5 and cell["stats"]["requests"] == 30_000
    assert "sampling: spatial (SHARDS) at 0.5" in (tmp_path / "r" / "summary.md").read_text()


def test_missing_trace_file_is_a_clear_error(tmp_path):
    out = run("simulate", "--trace", str(tmp_path / "nope.csv"), "--cache-size", "1MiB")
    assert out.returncode == 2 and "nope.csv" in out.stderr and "Traceback" not in out.stderr


def test_malformed_experiment_file_names_the_key_and_exits_non_zero(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('cache_sizes = ["1%"]\n[[policies]]\nwindoe = "1m"\n')
    out = run("experiment", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "'windoe'" in out.stderr and "did you mean 'window'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_simulate_honours_the_proxys_ttl_rules_as_the_library_does(trace_file, tmp_path):
    """``--ttl-rules`` reads a proxy configuration's ``[[ttl]]`` rules: the sweep's cells are
    what ``simulate`` gives with the same rules; the origin's max-age (``--ttl``) wins over
    a rule's default, as it does live."""
    from loadgen.sim.simulate import simulate
    from loadgen.traces.trace import read_trace
    from proxy.core.admission import AdmissionConfig
    from proxy.core.ttl_rules import TtlRule, TtlRules

    rules = tmp_path / "rules.toml"
    rules.write_text('[[ttl]]\ndefault = "5s"\n')

    def hits(*flags: str) -> list[int]:
        out = run("simulate", "--trace", str(trace_file), "--cache-size", "2%,8%",
                  "--admission", "second-hit", "--json", "--workers", "2", *flags)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return [cell["stats"]["hits"] for cell in json.loads(out.stdout)["cells"]]

    ruled = hits("--ttl-rules", str(rules))
    trace = read_trace(trace_file)
    size = round(trace.distinct_bytes() * 0.08)
    expected = simulate(trace, size, AdmissionConfig(policy="second-hit"),
                        ttl_rules=TtlRules([TtlRule(default=5.0)])).stats["hits"]  # fmt: skip
    assert ruled[1] == expected
    assert ruled != hits() and hits("--ttl", "10", "--ttl-rules", str(rules)) == hits("--ttl", "10")
    empty = tmp_path / "none.toml"
    empty.write_text("[server]\nworkers = 1\n")
    out = run(
        "simulate", "--trace", str(trace_file), "--cache-size", "1%", "--ttl-rules", str(empty)
    )
    assert out.returncode != 0 and "holds no [[ttl]] rule" in out.stderr
    by_path = tmp_path / "path.toml"
    by_path.write_text('[[ttl]]\npath = "/obj/"\nmax = "1s"\n')
    out = run("simulate", "--trace", str(trace_file), "--cache-size", "1%",
              "--ttl-rules", str(by_path))  # fmt: skip
    assert out.returncode == 0 and "keys are not URLs" in out.stderr  # said, not silent


def test_simulate_with_a_disk_tier_writes_a_report_as_one_tier_does(trace_file, tmp_path):
    out = run("simulate", "--trace", str(trace_file), "--cache-size", "1%", "--disk-size", "20%",
              "--admission", "always,second-hit", "--report-dir", str(tmp_path / "r"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "## Two tiers" in summary and "| always + disk second-hit(auto) | 1% (" in summary
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert len(results["cells"]) == 2 and results["provenance"]["traces"][0]["trace"] == "t.csv"
    assert str(tmp_path) not in (tmp_path / "r" / "index.html").read_text()


def test_simulate_takes_the_tuners_settings_from_a_proxy_configuration(trace_file, tmp_path):
    conf = tmp_path / "proxy.toml"
    conf.write_text('[tune]\nevictions = ["sieve"]\nadmissions = ["always"]\nsample = 1.0\n'
                    "period = 500\n")  # fmt: skip
    out = run("simulate", "--trace", str(trace_file), "--cache-size", "5%", "--admission",
              "always", "--eviction", "auto", "--tune-config", str(conf))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "keeps always / sieve" in out.stderr  # its one candidate, judged every 500
    conf.write_text("[tune]\nperiod = 10\n")
    out = run("simulate", "--trace", str(trace_file), "--cache-size", "5%", "--eviction",
              "auto", "--tune-config", str(conf))  # fmt: skip
    assert out.returncode != 0 and "--tune-config" in out.stderr and "[tune] period" in out.stderr
