"""The flash question (loadgen/sim/flash.py): the disk admission family behind one memory tier, each
rule placed by hit ratio against the bytes it wrote, the Pareto front marked."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.live.experiment import run
from loadgen.live.experiment_file import ExperimentError, load_experiment
from loadgen.reports.report import flash_table
from loadgen.sim.flash import DYNAMIC, flash_sweep, mark_pareto, region_size
from loadgen.sim.tiers import DiskSpec, simulate_tiers
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig
from proxy.core.disk import AUTO_CANDIDATES

MEMORY = 256 << 10
DISKS = [2 << 20, 8 << 20]


@pytest.fixture(scope="module")
def trace():
    sizes = SizeSpec.parse("lognormal:median=4KiB,sigma=1,max=64KiB")
    spec = WorkloadSpec(objects=4_000, requests=40_000, alpha=0.8, one_hit_share=0.4, rate=500.0,
                        sizes=sizes, seed=11)  # fmt: skip
    return generate(spec)


@pytest.fixture(scope="module")
def cells(trace):
    return flash_sweep(trace, "zipf", MEMORY, DISKS, entry_overhead=0, workers=2)


def test_every_rule_of_the_family_runs_at_every_disk_size(cells):
    for disk in DISKS:
        rules = {c["rule"] for c in cells if c["disk_bytes"] == disk}
        assert rules == {
            "always",
            "second-hit",
            "nth-hit",
            "probabilistic",
            "size-below",
            DYNAMIC,
            "auto",
        }


def test_each_cell_is_the_two_tier_simulation_of_its_rule(trace, cells):
    for c in cells[:: max(1, len(cells) // 6)]:
        disk = DiskSpec(c["disk_bytes"], c["region_bytes"], AdmissionConfig(policy=c["admission"]),
                        max_write_rate=c["budget"])  # fmt: skip
        again = simulate_tiers(trace, MEMORY, AdmissionConfig(policy="always"), disk,
                               entry_overhead=0).stats  # fmt: skip
        assert (again["hit_ratio"], again["disk_bytes_written"]) == (
            c["hit_ratio"], c["disk_bytes_written"])  # fmt: skip


def test_the_auto_cells_say_which_rule_decides_at_the_end(cells):
    auto = [c for c in cells if c["rule"] == "auto"]
    assert len(auto) == len(DISKS)
    for c in auto:
        assert c["decides"] in AUTO_CANDIDATES or c["decides"].startswith("size-below:")
        assert f"auto (at the end, {c['decides']})" in flash_table(cells)


def test_admitting_all_writes_most_and_second_hit_a_fraction_of_it(cells):
    for disk in DISKS:
        at = {c["policy"]: c for c in cells if c["disk_bytes"] == disk}
        most = max(c["disk_bytes_written"] for c in at.values())
        assert at["always"]["disk_bytes_written"] == most
        assert at["second-hit"]["disk_bytes_written"] < 0.6 * most


def test_dynamic_random_writes_about_its_budget(trace, cells):
    """Within its budget of 1x second hit's rate: about what second hit wrote (the budget is
    followed second by second, so a little over it)."""
    for disk in DISKS:
        at = [c for c in cells if c["disk_bytes"] == disk]
        second = next(c for c in at if c["policy"] == "second-hit")
        budgeted = next(c for c in at if c["rule"] == DYNAMIC and c["policy"].startswith(
            "always within 1x"))  # fmt: skip
        assert budgeted["budget"] == pytest.approx(second["disk_bytes_written"] / trace.duration())
        assert budgeted["disk_bytes_written"] < 1.5 * second["disk_bytes_written"]


def test_the_front_holds_the_cells_no_other_cell_beats(cells):
    for c in cells:
        group = [o for o in cells if o["disk_bytes"] == c["disk_bytes"] and o is not c]
        beaten = any(o["hit_ratio"] >= c["hit_ratio"]
                     and o["disk_bytes_written"] <= c["disk_bytes_written"]
                     and (o["hit_ratio"], -o["disk_bytes_written"])
                     != (c["hit_ratio"], -c["disk_bytes_written"]) for o in group)  # fmt: skip
        assert c["pareto"] is not beaten
    assert any(c["pareto"] for c in cells)


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 100)), min_size=1, max_size=12))
def test_every_cell_off_the_front_is_beaten_by_one_on_it(points):
    cells = [{"workload": "w", "memory_bytes": 1, "disk_bytes": 1, "hit_ratio": h,
              "disk_bytes_written": w} for h, w in points]  # fmt: skip
    mark_pareto(cells)
    front = [c for c in cells if c["pareto"]]
    assert front
    for c in cells:
        if not c["pareto"]:
            assert any(
                f["hit_ratio"] >= c["hit_ratio"]
                and f["disk_bytes_written"] <= c["disk_bytes_written"]
                for f in front
            )


def test_a_region_leaves_at_least_sixteen_regions_and_is_a_power_of_two():
    for disk in (64 << 10, 5 << 20, 100 << 20, 10 << 30):
        size = region_size(disk)
        assert size & (size - 1) == 0 and size <= 16 << 20
        assert disk // size >= 16 or size == 4096


@pytest.mark.slow
def test_the_ready_flash_experiment_reports_the_family_and_its_plot(tmp_path):
    experiment = load_experiment("config/experiments/flash.toml")
    small = WorkloadSpec(objects=3_000, requests=20_000, alpha=0.8, one_hit_share=0.3,
                         rate=2000.0)  # fmt: skip
    experiment = replace(experiment, workloads=(replace(experiment.workloads[0], spec=small),))
    written = run(experiment, tmp_path, workers=2, say=lambda _: None)
    results = json.loads((tmp_path / "results.json").read_text())
    assert len({c["disk_bytes"] for c in results["flash"]}) == 3
    assert tmp_path / "flash-hit-ratio-vs-disk-writes.png" in written
    summary = (tmp_path / "summary.md").read_text()
    assert "## The flash tier: disk admission rules" in summary and "second-hit" in summary


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[flash]\ndisk_size = ['1%']\n", "did you mean 'disk_sizes'"),
        ("[flash]\ndisk_sizes = '1%'\n", "disk_sizes = '1%': expected a list"),
        ("[flash]\nmemory = 'lots'\n", "lots"),
        ("[flash]\nmemory_admission = 'lfu'\n", "unknown admission policy 'lfu'"),
        ("[flash]\nmemory_admission = 'auto'\n", "auto is a disk tier's"),
        ("[flash]\ndisk_sizes = ['0%']\n", "'0%': a share above 0%"),
        ("[flash]\ndisk_sizes = ['-5%']\n", "'-5%': a share above 0%"),
    ],
)
def test_a_bad_flash_table_names_its_key(tmp_path, text, message):
    path = tmp_path / "x.toml"
    path.write_text('cache_sizes = ["1%"]\n[[policies]]\n' + text)
    with pytest.raises(ExperimentError, match=message):
        load_experiment(path)
