"""Sweep results as the table a person reads: terminal, Markdown, and results.json.

The baseline is the ``always`` policy (plain LRU). For every other policy and cache size S, the
space saved at equal hit ratio is ``1 - S'/S`` with S' the smallest cache at which that policy
reaches LRU's hit ratio at S (see ``simulate.space_saved``); ``>=`` marks a lower bound (already
reached at the smallest size swept; "below sweep" when that size is S itself), ``-`` a policy
that never reaches it inside the sweep.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadgen.simulate import SimResult, space_saved
from proxy.units import format_size

BASELINE = "always"


@dataclass(frozen=True)
class Row:
    result: SimResult
    size_label: str
    space_saved: float | None
    space_saved_lower_bound: bool

    def cells(self) -> list[str]:
        s = self.result.stats
        return [
            self.result.label,
            self.size_label,
            f"{s['hit_ratio']:.4f}",
            f"{s['byte_hit_ratio']:.4f}",
            f"{s['admissions']:,}",
            format_size(s["bytes_written"]),
            format_size(s["dead_bytes"]),
            f"{s['writes_saved']:.1%}",
            self.space_saved_text(),
        ]

    def space_saved_text(self) -> str:
        if self.result.label == BASELINE:
            return ""
        if self.space_saved is None:
            return "-"
        if self.space_saved_lower_bound and self.space_saved <= 0:
            return "below sweep"
        return f"{'>=' if self.space_saved_lower_bound else ''}{self.space_saved:.0%}"


HEADERS = [
    "policy",
    "cache",
    "hit ratio",
    "byte hit ratio",
    "writes",
    "bytes written",
    "dead bytes",
    "writes saved",
    "space saved",
]


def rows(results: Sequence[SimResult], size_labels: dict[int, str] | None = None) -> list[Row]:
    """One row per result, with space saved against the ``always`` baseline when it was swept."""
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in results:
        curves[r.label].append((r.cache_bytes, float(r.stats["hit_ratio"])))
    baseline = curves.get(BASELINE)
    out = []
    for r in results:
        saved: float | None = None
        bound = False
        if baseline and r.label != BASELINE:
            saved, bound = space_saved(baseline, curves[r.label], r.cache_bytes)
        label = (size_labels or {}).get(r.cache_bytes) or format_size(r.cache_bytes)
        out.append(Row(r, label, saved, bound))
    return out


def text_table(table: Sequence[Row]) -> str:
    body = [row.cells() for row in table]
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for c in body:
        cols = [c[0].ljust(widths[0]), c[1].ljust(widths[1])]
        cols += [v.rjust(w) for v, w in zip(c[2:], widths[2:], strict=True)]
        lines.append("  ".join(cols))
    return "\n".join(lines)


def markdown_table(table: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in table]
    return "\n".join(lines)


def to_json(table: Sequence[Row], meta: dict[str, object]) -> dict[str, object]:
    cells = []
    for row in table:
        cell = row.result.to_dict()
        cell["cache"] = row.size_label
        cell["space_saved_at_equal_hit_ratio"] = row.space_saved
        cell["space_saved_is_lower_bound"] = row.space_saved_lower_bound
        cells.append(cell)
    return {"meta": meta, "cells": cells}


def write_reports(
    directory: Path, table: Sequence[Row], meta: dict[str, object], title: str
) -> list[Path]:
    """Write results.json and summary.md under ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    results = directory / "results.json"
    results.write_text(json.dumps(to_json(table, meta), indent=2) + "\n")
    summary = directory / "summary.md"
    described = "\n".join(f"- {k}: {v}" for k, v in meta.items())
    summary.write_text(f"# {title}\n\n{described}\n\n{markdown_table(table)}\n")
    return [results, summary]
