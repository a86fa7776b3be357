"""Reports of simulated and live runs: the terminal table, summary.md, results.json, index.html
and PNG plots.

A report is built from *cells*, plain JSON-able dicts, one per (workload, mode, policy, cache
size): ``workload``, ``mode`` ("simulate" or "live"), ``policy``, ``cache``, ``cache_bytes``,
``stats`` (the metrics of ``proxy.core.stats.METRICS``), ``timeline``, and for live cells
``client`` (what the load generator saw, latency included). ``results.json`` holds them, so
``render`` rebuilds every other file without rerunning anything.

The baseline is the ``always`` policy (plain LRU). For every other policy and cache size S, the
space saved at equal hit ratio is ``1 - S'/S`` with S' the smallest cache at which that policy
reaches LRU's hit ratio at S (``simulate.space_saved``); ``>=`` marks a lower bound (reached at
the smallest size swept; "below sweep" when that size is S itself), ``-`` a policy that never
reaches it inside the sweep.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from loadgen.reports import provenance
from loadgen.sim.cells import BASELINE, Cell, flash_group
from loadgen.sim.simulate import SimResult, space_saved
from proxy.core.units import format_size

COLUMNS = [
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


def sim_cell(result: SimResult, workload: str, cache: str) -> Cell:
    cell = result.to_dict()
    cell.update(workload=workload, mode="simulate", cache=cache)
    return cell


def add_space_saved(cells: Sequence[Cell]) -> None:
    """Set ``space_saved`` (and ``space_saved_lower_bound``) on every non-baseline cell, per
    workload and mode, from the size curves the cells form."""
    curves: dict[tuple[str, str, str], list[tuple[int, float]]] = defaultdict(list)
    for c in cells:
        curves[(c["workload"], c["mode"], c["policy"])].append(
            (c["cache_bytes"], float(c["stats"]["hit_ratio"]))
        )
    for c in cells:
        baseline = curves.get((c["workload"], c["mode"], BASELINE))
        saved, bound = None, False
        c["space_saved_measurable"] = bool(baseline) and len(baseline) > 1
        if c["space_saved_measurable"] and c["policy"] != BASELINE:
            saved, bound = space_saved(
                baseline, curves[(c["workload"], c["mode"], c["policy"])], c["cache_bytes"]
            )
        c["space_saved_at_equal_hit_ratio"] = saved
        c["space_saved_is_lower_bound"] = bound


# What each form of the space-saved column says, as the report itself defines it.
SPACE_NOTE = (
    "Space saved: how much smaller a cache the policy needs than LRU (`always`) to reach LRU's "
    "hit ratio at that size, 1 - S'/S, with S' interpolated along the sweep. `40%`: it "
    "reaches it at 60% of the size. `>=40%`: at least that; S' is the smallest size swept, "
    "and the policy may need less. `below sweep`: it beats LRU already at the smallest size "
    "swept, so the saving cannot be measured. `needs 1.40x`: it needs 1.4 times LRU's size. "
    "`-`: it never reaches LRU's hit ratio inside the sweep. `n/a`: no LRU curve of two "
    "sizes or more to compare with. Blank: LRU itself."
)
SPACE_SHORT = (
    "space saved: 1 - S'/S to reach LRU's hit ratio at this size; >= at least; below sweep: "
    "above LRU at the smallest size; needs Nx: N times LRU's size; -: never reaches it"
)
MARK_NOTE = "`*` marks, per cache size, the best hit ratio and the fewest bytes written."


def _space_text(c: Cell) -> str:
    """The space saved at LRU's hit ratio: ``>=`` a lower bound, ``below sweep`` when the
    smallest size swept already reaches it, and for a policy that needs more space than LRU
    to reach it, how many times LRU's (``needs 1.40x``)."""
    if c["policy"] == BASELINE:
        return ""
    if not c.get("space_saved_measurable"):
        return "n/a"
    saved = c.get("space_saved_at_equal_hit_ratio")
    if saved is None:
        return "-"
    if c.get("space_saved_is_lower_bound"):
        return "below sweep" if saved <= 0 else f">={saved:.0%}"
    if saved < 0:
        return f"needs {1 - saved:.2f}x"
    return f"{saved:.0%}"


def _row(c: Cell, best: frozenset[tuple[int, str]] = frozenset()) -> list[str]:
    """One table row; ``best`` holds the (cell id, metric) pairs to mark with ``*``."""
    s = c["stats"]

    def show(name: str, fmt: Callable[[Any], str]) -> str:
        text = "n/a" if s.get(name) is None else fmt(s[name])
        return f"*{text}" if (id(c), name) in best else text

    return [
        c["policy"],
        c["cache"],
        show("hit_ratio", "{:.4f}".format),
        show("byte_hit_ratio", "{:.4f}".format),
        show("admissions", "{:,}".format),
        show("bytes_written", format_size),
        show("dead_bytes", format_size),
        show("writes_saved", "{:.1%}".format),
        _space_text(c),
    ]


def _best(group: Sequence[Cell]) -> frozenset[tuple[int, str]]:
    """Per cache size with more than one policy: the best hit ratio and the fewest bytes
    written (ties all marked)."""
    marks = set()
    by_size: dict[int, list[Cell]] = defaultdict(list)
    for c in group:
        by_size[c["cache_bytes"]].append(c)
    for at_size in by_size.values():
        if len(at_size) < 2:
            continue
        for name, pick in (("hit_ratio", max), ("bytes_written", min)):
            values = [c["stats"].get(name) for c in at_size if c["stats"].get(name) is not None]
            if values:
                chosen = pick(values)
                marks |= {(id(c), name) for c in at_size if c["stats"].get(name) == chosen}
    return frozenset(marks)


def rows(group: Sequence[Cell]) -> list[list[str]]:
    """The table rows of one (workload, mode) group, best values marked with ``*``."""
    best = _best(group)
    return [_row(c, best) for c in group]


def verdict(cells: Sequence[Cell]) -> str | None:
    """The report's finding in a sentence: at the middle size swept, what the policy with the
    best hit ratio did against plain LRU, for each simulated (else live) workload."""
    sentences = []
    for (workload, mode), group in _groups(cells).items():
        if mode == "live" and any(c["mode"] == "simulate" for c in cells):
            continue
        sizes = sorted({c["cache_bytes"] for c in group})
        at = [c for c in group if c["cache_bytes"] == sizes[len(sizes) // 2]]
        lru = next((c for c in at if c["policy"] == BASELINE), None)
        others = [c for c in at if c["policy"] != BASELINE]
        if lru is None or not others:
            continue
        best = max(others, key=lambda c: c["stats"]["hit_ratio"])
        before, after = lru["stats"]["hit_ratio"], best["stats"]["hit_ratio"]
        change = "raised" if after > before else "lowered" if after < before else "kept"
        written = best["stats"].get("bytes_written")  # None: a peer that does not count it
        wrote = "" if written is None else (
            f" and wrote {written / max(1, lru['stats']['bytes_written']):.0%} of LRU's bytes"
        )  # fmt: skip
        sentences.append(
            f"{workload}: with a cache of {best['cache']}, {_named(best)} {change} the hit "
            f"ratio from {before:.3f} (plain LRU) to {after:.3f}{wrote}{_credit(best, at)}."
        )
    return " ".join(sentences) or None


def _named(cell: Cell) -> str:
    """A cell's policy, and how much more than the cache it held when it held more (nginx's
    cache counts bodies only: it is not the same size as the others)."""
    held = cell.get("held_bytes")
    if held and held > cell["cache_bytes"]:
        return f"{cell['policy']} (holding {held / cell['cache_bytes']:.1f}x the cache)"
    return cell["policy"]


def _credit(best: Cell, at: Sequence[Cell]) -> str:
    """What the eviction of ``best`` does alone (admitting all) at that size, and what its
    admission adds to it: each part credited at the same other part, not both to one."""
    admission, _, eviction = best["policy"].partition(" / ")
    if not eviction:
        return ""
    alone = next((c for c in at if c["policy"] == f"{BASELINE} / {eviction}"), None)
    if alone is None or alone is best:
        return ""
    by_eviction = alone["stats"]["hit_ratio"]
    return (
        f" ({eviction} alone, admitting all, reaches {by_eviction:.3f}; {admission} adds "
        f"{best['stats']['hit_ratio'] - by_eviction:+.3f} at that eviction)"
    )


def _groups(cells: Iterable[Cell]) -> dict[tuple[str, str], list[Cell]]:
    groups: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for c in cells:
        groups[(c["workload"], c["mode"])].append(c)
    return groups


def text_table(cells: Sequence[Cell]) -> str:
    """One aligned table per (workload, mode)."""
    out = []
    groups = _groups(cells)
    for (workload, mode), group in groups.items():
        if len(groups) > 1:
            out.append(f"\n{workload} ({mode})")
        out.append(aligned(COLUMNS, rows(group), left=2))
    if any(_space_text(c) not in ("", "n/a") for c in cells):
        out.append(SPACE_SHORT)
    return "\n".join(out).lstrip("\n")


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A terminal table: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        cols = [
            v.ljust(w) if i < left else v.rjust(w)
            for i, (v, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cols))
    return "\n".join(lines)


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


HEADLINE = [
    "workload",
    "mode",
    "cache",
    "LRU hit ratio",
    "policy",
    "hit ratio",
    "delta",
    "writes saved",
    "space saved",
    "p99 ms",
]


def headline_columns(rows: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """The headline's columns and rows, without the p99 column when no row has one (a
    simulation measures no latency)."""
    if any(row[-1] for row in rows):
        return list(HEADLINE), [list(row) for row in rows]
    return list(HEADLINE[:-1]), [list(row[:-1]) for row in rows]


def headline(cells: Sequence[Cell]) -> list[list[str]]:
    """Per workload, mode and size: LRU against the best other policy (by hit ratio)."""
    rows = []
    for (workload, mode), group in _groups(cells).items():
        by_size: dict[int, list[Cell]] = defaultdict(list)
        for c in group:
            by_size[c["cache_bytes"]].append(c)
        for _, at_size in sorted(by_size.items()):
            lru = next((c for c in at_size if c["policy"] == BASELINE), None)
            others = [c for c in at_size if c["policy"] != BASELINE]
            if lru is None or not others:
                continue
            best = max(others, key=lambda c: c["stats"]["hit_ratio"])
            delta = best["stats"]["hit_ratio"] - lru["stats"]["hit_ratio"]
            p99 = best.get("client", {}).get("latency_ms", {}).get("p99")
            saved = best["stats"]["writes_saved"]
            rows.append(
                [
                    workload,
                    mode,
                    best["cache"],
                    f"{lru['stats']['hit_ratio']:.4f}",
                    _named(best),
                    f"{best['stats']['hit_ratio']:.4f}",
                    f"{delta * 100:+.1f} pp",
                    "n/a" if saved is None else f"{saved:.1%}",
                    _space_text(best),
                    "" if p99 is None else f"{p99:.2f}",
                ]
            )
    return rows


def agreement(cells: Sequence[Cell]) -> list[list[str]]:
    """Live against simulated hit ratio for every configuration run both ways. A live proxy
    with a disk tier counts its disk's hits too, which a one-tier simulation has not: it is
    listed, not compared (``simulate --disk-size`` is its twin, held to it by the parity
    test)."""
    sim = {
        (c["workload"], c["policy"], c["cache_bytes"]): c for c in cells if c["mode"] == "simulate"
    }
    rows = []
    for c in cells:
        twin = sim.get((c["workload"], c["policy"], c["cache_bytes"]))
        if c["mode"] != "live" or twin is None:
            continue
        live_hr, sim_hr = c["stats"]["hit_ratio"], twin["stats"]["hit_ratio"]
        if "disk" in c:
            rows.append([c["workload"], c["policy"], c["cache"], f"{live_hr:.4f}",
                         f"{sim_hr:.4f}", "", "n/a: a disk tier too"])  # fmt: skip
            continue
        gap = abs(live_hr - sim_hr) * 100
        rows.append(
            [
                c["workload"],
                c["policy"],
                c["cache"],
                f"{live_hr:.4f}",
                f"{sim_hr:.4f}",
                f"{gap:.2f} pp",
                "yes" if gap <= 1.0 else "NO",
            ]
        )
    return rows


AGREEMENT = ["workload", "policy", "cache", "live hit ratio", "simulated", "gap", "within 1 pp"]


def summary_markdown(results: dict[str, Any]) -> str:
    cells = results["cells"]
    parts = [f"# {results.get('title', 'onehit report')}", ""]
    if finding := verdict(cells):
        parts += [finding, ""]
    parts += [f"- {k}: {v}" for k, v in results.get("meta", {}).items()]
    if table := tier_rows(cells):
        parts += ["", "## Two tiers", "", _markdown(TIER_COLUMNS, table)]
    if found := results.get("provenance"):
        parts += ["", "## Provenance", ""]
        parts += [f"- {label}: ``` {text} ```" if label == "command" else f"- {label}: {text}"
                  for label, text in provenance.lines(found)]  # fmt: skip
    if table := headline(cells):
        parts += ["", "## Headline", "", _markdown(*headline_columns(table))]
    if table := agreement(cells):
        parts += ["", "## Live against simulated", "", _markdown(AGREEMENT, table)]
    for (workload, mode), group in _groups(cells).items():
        parts += ["", f"## {workload} ({mode})", "", _markdown(COLUMNS, rows(group))]
        parts += ["", MARK_NOTE, "", SPACE_NOTE]
    if table := whatif_rows(cells):
        parts += ["", "## What if (live)", "", WHATIF_NOTE, "", _markdown(WHATIF_COLUMNS, table)]
        parts += [f"- {line}" for line in whatif_warnings(cells)]
    if flash := results.get("flash"):
        parts += ["", "## The flash tier: disk admission rules", "", FLASH_NOTE]
        for title, group in _flash_groups(flash):
            parts += ["", f"### {title}", "", _markdown(FLASH_COLUMNS, flash_rows(group))]
    for heading, lines in _remarks(cells):
        parts += ["", f"## {heading}", ""]
        parts += [f"- {line}" for line in lines]
    return "\n".join(parts) + "\n"


FLASH_COLUMNS = ("disk", "rule", "hit ratio", "vs always", "disk written", "of always's",
                 "on the front")  # fmt: skip


def flash_rows(cells: Sequence[Cell]) -> list[list[str]]:
    """One row a flash cell (``loadgen.sim.flash``): its hit ratio and writes against admitting
    all at the same disk size."""
    always = {flash_group(c): c for c in cells if c["policy"] == "always"}
    rows = []
    for c in cells:
        base = always.get(flash_group(c))
        delta = "" if base is None else f"{(c['hit_ratio'] - base['hit_ratio']) * 100:+.2f} pp"
        share = ("" if base is None or not base["disk_bytes_written"]
                 else f"{c['disk_bytes_written'] / base['disk_bytes_written']:.1%}")  # fmt: skip
        rows.append([
            f"{format_size(c['disk_bytes'])} ({format_size(c['region_bytes'])} regions)",
            c["policy"] + (f" (at the end, {c['decides']})" if "decides" in c else ""),
            f"{c['hit_ratio']:.4f}", delta, format_size(int(c["disk_bytes_written"])),
            share, "yes" if c["pareto"] else "",
        ])  # fmt: skip
    return rows


def flash_table(cells: Sequence[Cell]) -> str:
    """The cells of one flash sweep (``loadgen.sim.flash``) as an aligned table, headed by the
    trace and the memory tier."""
    head = {(c["workload"], c["memory_bytes"]) for c in cells}
    title = "; ".join(f"{w}, memory {format_size(m)}" for w, m in sorted(head))
    return f"{title}\n" + aligned(FLASH_COLUMNS, flash_rows(cells), left=2)


TIER_COLUMNS = ("policies", "memory", "hit ratio", "memory hits", "disk hits", "disk written",
                "disk spared")  # fmt: skip


def tier_table(results: Sequence[SimResult], sizes: dict[int, str]) -> str:
    """One row per two-tier run (``loadgen.sim.tiers``): the hit ratio of both tiers, and
    what the disk was written and spared."""
    cells = [sim_cell(r, "", sizes.get(r.cache_bytes, format_size(r.cache_bytes)))
             for r in results]  # fmt: skip
    return aligned(TIER_COLUMNS, tier_rows(cells))


def tier_rows(cells: Sequence[Cell]) -> list[list[str]]:
    """The rows of ``tier_table`` for the cells of two-tier runs among ``cells``."""
    rows = []
    for c in cells:
        s = c["stats"]
        if "disk_bytes_written" not in s:
            continue
        requests = s["requests"] or 1
        rows.append([
            c["policy"], c["cache"], f"{s['hit_ratio']:.4f}",
            f"{s['hits_from_memory'] / requests:.4f}", f"{s['hits_from_disk'] / requests:.4f}",
            format_size(int(s["disk_bytes_written"])),
            format_size(int(s["disk_bytes_not_written"])),
        ])  # fmt: skip
    return rows


WHATIF_COLUMNS = ["workload", "live policy", "cache", "ghost", "0.25x", "0.5x", "1x", "2x", "4x",
                  "sampled requests"]  # fmt: skip


def whatif_warnings(cells: Sequence[Cell]) -> list[str]:
    """What the live what-if said of its own estimates (a ghost of a handful of objects),
    each once, by cell and ghost."""
    said = []
    for c in cells:
        for curve in (c.get("whatif") or {}).get("curves", []):
            if curve.get("warning"):
                ghost = f"ghost {curve['policy']} x{curve['scale']:g}"
                said.append(f"{c['workload']}, {c['policy']} at {c['cache']}: {ghost}: "
                            f"{curve['warning']}")  # fmt: skip
    return list(dict.fromkeys(said))


def whatif_rows(cells: Sequence[Cell]) -> list[list[str]]:
    """The live proxies' what-if (``/stats`` ``whatif``): for each live cell, each ghost
    policy's estimated hit ratio at each scale of the cell's cache (memory ghosts; disk
    ghosts with their tier named)."""
    rows = []
    for c in cells:
        whatif = c.get("whatif")
        if c["mode"] != "live" or not whatif:
            continue
        curves: dict[str, dict[float, float | None]] = defaultdict(dict)
        sampled: dict[str, int] = {}
        for curve in whatif["curves"]:
            name = curve["policy"] if curve["tier"] == "memory" else f"disk {curve['policy']}"
            curves[name][curve["scale"]] = curve["miss_ratio"]
            sampled[name] = curve.get("sampled", 0)
        for name, by_scale in curves.items():
            shown = ["" if by_scale.get(x) is None else f"{1 - by_scale[x]:.4f}"
                     for x in (0.25, 0.5, 1.0, 2.0, 4.0)]  # fmt: skip
            rows.append([c["workload"], c["policy"], c["cache"], name, *shown,
                         f"{sampled[name]:,}"])  # fmt: skip
    return rows


WHATIF_NOTE = (
    "Estimated hit ratios of ghost caches the live proxy kept beside its own (keys only, fed "
    "a sample of the keys, [whatif]), at 0.25x to 4x its cache: what the same traffic "
    "would have done to another size or policy, read from one run. A few hundred sampled "
    "requests make a rough estimate: raise [whatif] sample for a short run."
)


FLASH_NOTE = (
    "Each rule of the disk admission family behind the same memory tier, at each disk size: "
    "its hit ratio (memory and disk) against the bytes it wrote to the device. A row on the "
    "front: no other rule hits as often with fewer bytes written."
)


def _flash_groups(cells: Sequence[Cell]) -> list[tuple[str, list[Cell]]]:
    """The flash cells per workload and memory size, in the order they came."""
    groups: dict[tuple[str, int], list[Cell]] = defaultdict(list)
    for c in cells:
        groups[(c["workload"], c["memory_bytes"])].append(c)
    return [(f"{w}, memory {format_size(m)}", g) for (w, m), g in groups.items()]


def _remarks(cells: Sequence[Cell]) -> list[tuple[str, list[str]]]:
    """What a reader must know beside the tables: flagged disagreements, and notes on cells."""
    out = []
    if flagged := [d for c in cells for d in c.get("disagreements", [])]:
        out.append(("Disagreements between client and proxy counts", flagged))
    if notes := [n for c in cells for n in c.get("notes", [])]:
        out.append(("Notes", notes))
    return out


def write_report(directory: Path, results: dict[str, Any]) -> list[Path]:
    """results.json, then everything ``render`` draws from it."""
    directory.mkdir(parents=True, exist_ok=True)
    add_space_saved(results["cells"])
    path = directory / "results.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    return [path, *render(directory)]


def render(directory: Path) -> list[Path]:
    """summary.md, index.html and the PNGs from ``directory/results.json``."""
    results = json.loads((directory / "results.json").read_text())
    cells = results["cells"]
    add_space_saved(cells)
    summary = directory / "summary.md"
    summary.write_text(summary_markdown(results))
    from loadgen.reports import plots  # matplotlib is imported only when plots are drawn

    images = plots.draw_all(cells, directory)
    if drawn := plots.flash(results.get("flash", []), directory):
        images.append(drawn)
    page = directory / "index.html"
    page.write_text(_html(results, images))
    return [summary, page, *images]


def _html(results: dict[str, Any], images: Sequence[Path]) -> str:
    cells = results["cells"]

    def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    title = html.escape(results.get("title", "onehit report"))
    parts = [f"<h1>{title}</h1>"]
    if finding := verdict(cells):
        parts.append(f"<p><strong>{html.escape(finding)}</strong></p>")
    parts.append("<ul>")
    parts += [
        f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>"
        for k, v in results.get("meta", {}).items()
    ]
    parts.append("</ul>")
    if found := results.get("provenance"):
        parts += ["<h2>Provenance</h2>", "<ul>"]
        parts += [
            f"<li>{html.escape(label)}: <code>{html.escape(text)}</code></li>"
            for label, text in provenance.lines(found)
        ]
        parts.append("</ul>")
    if found := headline(cells):
        parts += ["<h2>Headline</h2>", table(*headline_columns(found))]
    if found := tier_rows(cells):
        parts += ["<h2>Two tiers</h2>", table(TIER_COLUMNS, found)]
    if found := agreement(cells):
        parts += ["<h2>Live against simulated</h2>", table(AGREEMENT, found)]
    parts.append("<h2>Plots</h2>")
    for image in images:
        data = base64.b64encode(image.read_bytes()).decode()
        alt = html.escape(image.stem.replace("-", " "))
        parts.append(f'<figure><img alt="{alt}" src="data:image/png;base64,{data}"></figure>')
    for (workload, mode), group in _groups(cells).items():
        parts += [
            f"<h2>{html.escape(workload)} ({mode})</h2>",
            table(COLUMNS, rows(group)),
            f"<p>{html.escape(MARK_NOTE)}</p><p>{html.escape(SPACE_NOTE)}</p>",
        ]
    if found := whatif_rows(cells):
        parts += ["<h2>What if (live)</h2>", f"<p>{html.escape(WHATIF_NOTE)}</p>",
                  table(WHATIF_COLUMNS, found)]  # fmt: skip
        if said := whatif_warnings(cells):
            parts.append("<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in said) + "</ul>")
    if flash := results.get("flash"):
        parts += ["<h2>The flash tier: disk admission rules</h2>",
                  f"<p>{html.escape(FLASH_NOTE)}</p>"]  # fmt: skip
        for title, group in _flash_groups(flash):
            parts += [f"<h3>{html.escape(title)}</h3>", table(FLASH_COLUMNS, flash_rows(group))]
    for heading, lines in _remarks(cells):
        parts.append(f"<h2>{html.escape(heading)}</h2><ul>")
        parts += [f"<li>{html.escape(line)}</li>" for line in lines]
        parts.append("</ul>")
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:right}th{background:#f3f3f3}img{max-width:100%}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )
