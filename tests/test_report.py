"""Reports from a small fixed results.json: every file, self-contained HTML, no rerun needed."""

import html
import json
import re
import subprocess
import sys

import pytest

from loadgen.reports.report import (
    _space_text,
    add_space_saved,
    headline,
    headline_columns,
    render,
    verdict,
    write_report,
)
from proxy.core.stats import METRICS


def cell(policy, size, hit_ratio, mode="simulate", **extra):
    stats = dict.fromkeys(METRICS, 0)
    stats.update(hit_ratio=hit_ratio, byte_hit_ratio=hit_ratio, admissions=10,
                 bytes_written=1000 if policy == "always" else 100, writes_saved=0.5)  # fmt: skip
    timeline = [{"requests": n, "hit_ratio": hit_ratio * n / 100, "filter_fill": 0.1,
                 "filter_fp_estimate": 0.001, "t": n / 10, "cumulative_hit_ratio": hit_ratio}
                for n in (50, 100)]  # fmt: skip
    return {"workload": "w", "mode": mode, "policy": policy, "cache": f"{size}B",
            "cache_bytes": size, "stats": stats, "timeline": timeline, **extra}  # fmt: skip


@pytest.fixture
def results():
    client = {"latency_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0, "p99.9": 4.0}}
    return {
        "title": "fixed",
        "meta": {"note": "a test"},
        "cells": [
            cell("always", 100, 0.10), cell("second-hit(auto)", 100, 0.15),
            cell("always", 200, 0.20), cell("second-hit(auto)", 200, 0.25),
            cell("always", 400, 0.30), cell("second-hit(auto)", 400, 0.35),
            cell("always", 200, 0.21, "live", client=client),
            cell("second-hit(auto)", 200, 0.255, "live", client=client),
        ],
    }  # fmt: skip


def test_every_file_is_written_and_the_html_is_self_contained(tmp_path, results):
    written = write_report(tmp_path, results)
    names = {p.name for p in written}
    assert {"results.json", "summary.md", "index.html"} <= names
    assert {"hit-ratio-vs-cache-size.png", "byte-hit-ratio-vs-cache-size.png",
            "bytes-written-vs-cache-size.png", "hit-ratio-over-time.png",
            "latency-percentiles.png", "filter-health.png",
            "hit-ratio-vs-bytes-written.png"} <= names  # fmt: skip
    widths = set()
    for path in written:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".png":
            head = path.read_bytes()[:24]
            assert head[:8] == b"\x89PNG\r\n\x1a\n"
            widths.add(int.from_bytes(head[16:20], "big"))
    assert len(widths) == 1, f"every plot one width, got {widths}"
    page = (tmp_path / "index.html").read_text()
    references = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert references and all(ref.startswith("data:image/png;base64,") for ref in references)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Headline" in summary and "## Live against simulated" in summary
    assert summary.splitlines()[2].startswith("w: with a cache of 200B, second-hit(auto) raised")


def test_headline_and_space_saved_from_the_size_curves(results):
    add_space_saved(results["cells"])
    rows = headline(results["cells"])
    middle = next(r for r in rows if r[1] == "simulate" and r[2] == "200B")
    assert middle[3:7] == ["0.2000", "second-hit(auto)", "0.2500", "+5.0 pp"]
    # LRU's 0.20 at 200 B is reached by second hit at sqrt(100 * 200) ~ 141 B: 29% saved.
    assert middle[8] == "29%"
    live = next(r for r in rows if r[1] == "live")
    assert live[8] == "n/a" and live[9] == "3.00"


@pytest.mark.slow
def test_report_command_rerenders_from_results_json_alone(tmp_path, results):
    (tmp_path / "results.json").write_text(json.dumps(results))
    out = subprocess.run(
        [sys.executable, "-m", "loadgen", "report", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "index.html").exists() and (tmp_path / "filter-health.png").exists()
    assert render(tmp_path)  # and again, in-process: idempotent


def test_notes_on_cells_reach_the_summary_and_the_page(tmp_path, results):
    note = "w nginx (min_uses 2) @ 200B: its cache held 600B on disk, 3.0x the size it was given"
    client = {"latency_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0, "p99.9": 4.0}}
    results["cells"].append(cell("nginx (min_uses 2)", 200, 0.3, "live", client=client,
                                 held_bytes=600, notes=[note]))  # fmt: skip
    write_report(tmp_path, results)
    assert f"## Notes\n\n- {note}" in (tmp_path / "summary.md").read_text()
    assert f"<li>{note}</li>" in (tmp_path / "index.html").read_text()


def test_live_cells_with_a_disk_tier_plot_hit_ratio_against_disk_writes(tmp_path, results):
    for c, written in zip(results["cells"][-2:], (4000, 900), strict=True):
        c["disk"] = {"bytes_written": written, "bytes_not_written": 5000 - written, "hits": 7}
    names = {p.name for p in write_report(tmp_path, results)}
    assert "hit-ratio-vs-disk-writes.png" in names
    page = (tmp_path / "index.html").read_text()
    assert page.count("data:image/png;base64,") == len([n for n in names if n.endswith(".png")])


def test_without_a_disk_tier_there_is_no_disk_plot(tmp_path, results):
    names = {p.name for p in write_report(tmp_path, results)}
    assert "hit-ratio-vs-disk-writes.png" not in names


def test_a_peer_that_does_not_count_writes_is_drawn_and_tabled_without_them(tmp_path, results):
    peer = cell("libCacheSim S3-FIFO", 200, 0.9)
    peer["stats"] = {**dict.fromkeys(peer["stats"]), "hit_ratio": 0.9, "byte_hit_ratio": 0.8}
    results["cells"].append(peer)
    names = {p.name for p in write_report(tmp_path, results)}
    assert "hit-ratio-vs-cache-size.png" in names
    summary = (tmp_path / "summary.md").read_text()
    assert "libCacheSim S3-FIFO raised the hit ratio from 0.200 (plain LRU) to 0.900." in summary
    assert "| libCacheSim S3-FIFO | 200B | *0.9000 | 0.8000 | n/a | n/a |" in summary


def test_the_finding_credits_eviction_and_admission_each_at_the_other_fixed():
    """second-hit / s3fifo beats plain LRU, but s3fifo alone does most of it: the sentence
    says what each part adds, not all of it to second hit."""
    ratios = {"always": 0.209, "always / s3fifo": 0.313, "second-hit / s3fifo": 0.320}
    cells = [cell(policy, 200, ratio) for policy, ratio in ratios.items()]
    finding = verdict(cells)
    assert "second-hit / s3fifo raised the hit ratio from 0.209 (plain LRU) to 0.320" in finding
    assert "(s3fifo alone, admitting all, reaches 0.313; second-hit adds +0.007" in finding


def test_a_cache_that_held_more_than_its_size_says_so_in_its_row():
    cells = [cell("always", 200, 0.20), cell("nginx (min_uses 2)", 200, 0.34, held_bytes=880)]
    [row] = headline(cells)
    assert row[4] == "nginx (min_uses 2) (holding 4.4x the cache)"
    assert "holding 4.4x the cache" in verdict(cells)


def test_a_simulation_only_headline_has_no_latency_column(results):
    simulated = [c for c in results["cells"] if c["mode"] == "simulate"]
    columns, rows = headline_columns(headline(simulated))
    assert "p99 ms" not in columns and all(len(r) == len(columns) for r in rows)
    columns, _ = headline_columns(headline(results["cells"]))
    assert columns[-1] == "p99 ms"


def test_a_policy_needing_more_space_than_lru_says_how_much():
    cells = [cell("always", 100, 0.10), cell("always", 200, 0.20), cell("always", 400, 0.30),
             cell("x", 100, 0.05), cell("x", 200, 0.15), cell("x", 400, 0.25)]  # fmt: skip
    add_space_saved(cells)
    middle = next(c for c in cells if c["policy"] == "x" and c["cache_bytes"] == 200)
    assert middle["space_saved_at_equal_hit_ratio"] < 0
    # x reaches LRU's 0.20 halfway (in log size) from 200 B to 400 B: at 283 B, 1.41x.
    assert _space_text(middle) == "needs 1.41x"


def test_many_curves_are_small_multiples_of_at_most_eight_with_lru_in_each():
    """20 onehit pairs and 7 of libCacheSim's peers: a panel per eviction and one for the
    peers, none past eight curves, LRU in every one, every curve drawn once."""
    from loadgen.reports.plots import BASELINE, MAX_SERIES, panel_sets

    admissions = ["always", "second-hit(auto)", "tinylfu", "adaptive"]
    policies = [a if e == "lru" else f"{a} / {e}" for e in
                ("lru", "s3fifo", "sieve", "wtinylfu", "twoq") for a in admissions]  # fmt: skip
    policies += [f"libCacheSim {p}" for p in ("LRU", "S3-FIFO", "SIEVE", "2Q", "W-TinyLFU",
                                               "ARC", "LHD", "LeCaR", "Cacheus")]  # fmt: skip
    panels = panel_sets(policies)
    assert all(len(members) <= MAX_SERIES and BASELINE in members for _, members in panels)
    drawn = [p for _, members in panels for p in members if p != BASELINE]
    assert sorted(drawn) == sorted(p for p in policies if p != BASELINE)
    evictions = ["lru", "s3fifo", "sieve", "wtinylfu", "twoq"]
    peers = ["libCacheSim (1 of 2)", "libCacheSim (2 of 2)"]
    assert [name for name, _ in panels] == evictions + peers
    assert panel_sets(admissions) == [("", admissions)]  # few: one panel


def test_the_space_saved_column_is_defined_in_the_report_itself(tmp_path):
    from loadgen.reports.report import SPACE_NOTE

    cells = [cell("always", 1 << 20, 0.30), cell("always", 4 << 20, 0.50),
             cell("second-hit", 1 << 20, 0.40), cell("second-hit", 4 << 20, 0.55)]  # fmt: skip
    write_report(tmp_path, {"title": "t", "meta": {}, "cells": cells})
    summary = (tmp_path / "summary.md").read_text()
    assert "below sweep" in summary and SPACE_NOTE in summary
    assert "needs 1.40x`: it needs 1.4 times" in (tmp_path / "index.html").read_text()


def test_a_live_ghosts_warning_is_in_the_report_beside_its_curves(tmp_path):
    curves = [{"tier": "memory", "policy": "always", "scale": s, "size": 100, "miss_ratio": 0.5,
               "bytes_written": 10, "sampled": 500,
               **({"warning": "its 0.01 sample's cache holds 3 objects"} if s == 0.25 else {})}
              for s in (0.25, 0.5, 1.0, 2.0, 4.0)]  # fmt: skip
    live = cell("always", 100, 0.5, mode="live", whatif={"sample": 0.01, "curves": curves})
    write_report(tmp_path, {"title": "t", "meta": {}, "cells": [live]})
    said = "w, always at 100B: ghost always x0.25: its 0.01 sample's cache holds 3 objects"
    assert said in (tmp_path / "summary.md").read_text()
    assert html.escape(said) in (tmp_path / "index.html").read_text()
