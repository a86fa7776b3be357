"""The report's PNG plots (matplotlib, Agg backend): one file per figure, axes labelled with
units.

Rules the curves' figures keep (hit ratio, byte hit ratio and writes against size, hit ratio
against writes):

* At most ``MAX_SERIES`` curves a panel, LRU (admission ``always``) among them: more are
  small multiples, a panel per eviction (and one for libCacheSim's peers), each cut into
  panels that fit.
* Each curve of a panel has a colour and a marker of its own; LRU is black and drawn last,
  never hidden under another curve.
* Legends stand below their panel, outside the data; titles wrap; the image is cut to what
  it draws, so no text is clipped.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, NullLocator

from loadgen.sim.cells import BASELINE, Cell, flash_group
from proxy.core.units import format_size

# More swept sizes than this and their labels would crowd the axis: powers of ten instead.
_MAX_SIZE_TICKS = 8
# Distinct colours for up to 16 admissions (a report of every policy has 8 and more): a
# second hue of each family before any colour repeats.
_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#17becf", "#bcbd22", "#000080", "#ff1493", "#006400", "#b8860b", "#4b0082",
            "#ff6347", "#2f4f4f"]  # fmt: skip


# A policy label is "admission" or "admission / eviction": the colour follows the admission,
# the line style the eviction, so a cross-product of both stays readable.
_STYLES = {"lru": "-", "s3fifo": "--", "sieve": ":", "wtinylfu": "-.", "twoq": (0, (5, 1, 1, 1))}


def colours(cells: Sequence[Cell]) -> dict[str, str]:
    """One colour per policy label, the same for every eviction of one admission: LRU's
    admission (``always``) grey, the rest in a fixed order."""
    admissions = sorted({_admission(c["policy"]) for c in cells} - {"always"})
    by_admission = {a: _PALETTE[i % len(_PALETTE)] for i, a in enumerate(admissions)}
    by_admission["always"] = "#555555"
    return {c["policy"]: by_admission[_admission(c["policy"])] for c in cells}


def _admission(label: str) -> str:
    return label.split(" / ")[0]


def _line_style(label: str) -> str:
    _, _, eviction = label.partition(" / ")
    return _STYLES.get(eviction or "lru", "-")


# The curves of one panel at most, LRU among them; a colour and a marker for each of the others.
MAX_SERIES = 8
_DISTINCT = _PALETTE[:MAX_SERIES]
_MARKERS = ["o", "^", "D", "v", "P", "*", "X", "h"]
_BASELINE_STYLE = ("#000000", "s")
PEERS = "libCacheSim"


def _family(policy: str) -> str:
    """The small multiple a curve is drawn in: its eviction, or libCacheSim's peers."""
    if policy.startswith(f"{PEERS} "):
        return PEERS
    return policy.partition(" / ")[2] or "lru"


def panel_sets(policies: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The panels a workload's ``policies`` are drawn in (a name, and the policies of each):
    one when they fit ``MAX_SERIES``, else one per family, cut to fit, LRU in every one."""
    ordered = list(dict.fromkeys(policies))
    if len(ordered) <= MAX_SERIES:
        return [("", ordered)]
    baseline = [BASELINE] if BASELINE in ordered else []
    families: dict[str, list[str]] = defaultdict(list)
    for policy in ordered:
        if policy != BASELINE:
            families[_family(policy)].append(policy)
    room = MAX_SERIES - len(baseline)
    panels = []
    for family, members in families.items():
        count = -(-len(members) // room)
        each = -(-len(members) // count)  # cut evenly: 8 in two panels are 4 and 4, not 7 and 1
        cuts = [members[i : i + each] for i in range(0, len(members), each)]
        for k, cut in enumerate(cuts):
            name = family if len(cuts) == 1 else f"{family} ({k + 1} of {len(cuts)})"
            panels.append((name, baseline + cut))
    return panels


def _panels_of(
    series: dict[tuple[str, str, str], list[Cell]],
) -> list[tuple[str, str, list[str]]]:
    """The panels of a figure of ``series``: per workload, its ``panel_sets``."""
    return [(w, name, members) for w in sorted({w for w, _, _ in series})
            for name, members in panel_sets([p for (sw, _, p) in series if sw == w])]  # fmt: skip


def _in_panel(
    series: dict[tuple[str, str, str], list[Cell]], workload: str, members: Sequence[str]
) -> list[tuple[tuple[str, str, str], list[Cell]]]:
    """The series a panel of ``workload`` draws (its ``members``), in drawing order: curves
    first, then live crosses, LRU last, over the others, never under."""
    return sorted(((key, group) for key, group in series.items()
                   if key[0] == workload and key[2] in members),
                  key=lambda kv: (kv[0][1] == "live", kv[0][2] == BASELINE))  # fmt: skip


def _styles(members: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Each curve of a panel's colour and marker: LRU's black squares, the others distinct."""
    others = [m for m in members if m != BASELINE]
    styles = {m: (_DISTINCT[i % len(_DISTINCT)], _MARKERS[i % len(_MARKERS)])
              for i, m in enumerate(others)}  # fmt: skip
    styles[BASELINE] = _BASELINE_STYLE
    return styles


def _shown(policy: str) -> str:
    """A curve's label: LRU's says it is the baseline."""
    return f"{policy} (LRU, the baseline)" if policy == BASELINE else policy


def _panel_title(workload: str, name: str, what: str = "") -> str:
    title = ": ".join(part for part in (workload, name, what) if part)
    return textwrap.fill(title, 60)


def _legend(ax: Any) -> None:
    """The legend below the panel, outside its data."""
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.24),
                  ncol=2 if len(handles) > 3 else 1, frameon=False)  # fmt: skip


def _series(cells: Sequence[Cell]) -> dict[tuple[str, str, str], list[Cell]]:
    out: dict[tuple[str, str, str], list[Cell]] = defaultdict(list)
    for c in cells:
        out[(c["workload"], c["mode"], c["policy"])].append(c)
    for group in out.values():
        group.sort(key=lambda c: c["cache_bytes"])
    return out


def _panels(cells: Sequence[Cell]) -> list[tuple[str, str]]:
    return sorted({(c["workload"], c["mode"]) for c in cells})


# Every figure of a report has this width, so the HTML shows them at one scale: panels go
# two to a row.
_WIDTH = 12.4


def _figure(n: int) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels, two to a row, ``_WIDTH`` inches wide."""
    cols = min(n, 2)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(_WIDTH, 5.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for spare in flat[n:]:
        spare.set_visible(False)
    return fig, flat[:n]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return path


def _by_size(
    cells: Sequence[Cell],
    directory: Path,
    name_of: str,
    metric: Callable[[Cell], float | None],
    ylabel: str,
    bytes_axis: bool = False,
) -> Path | None:
    """Panels per workload (``panel_sets``): simulated curves as lines, live runs as crosses
    on them."""
    series = _series(cells)
    panels = _panels_of(series)
    fig, axes = _figure(len(panels))
    for ax, (workload, name, members) in zip(axes, panels, strict=True):
        styles = _styles(members)
        # On a log axis a policy that wrote nothing is drawn at half the least written, not
        # lost below the axis.
        written = [metric(c) for c in cells if c["workload"] == workload]
        floor = min((w for w in written if w), default=2) / 2 if bytes_axis else None
        for (_, mode, policy), group in _in_panel(series, workload, members):
            group = [c for c in group if metric(c) is not None]
            if not group:
                continue
            colour, marker = styles[policy]
            # A cache that held more than its size (nginx) is placed at the bytes it held.
            xs = [c.get("held_bytes", c["cache_bytes"]) for c in group]
            ys = [metric(c) for c in group]
            if floor:
                ys = [y or floor for y in ys]
            if mode == "live":
                held = any("held_bytes" in c for c in group)
                label = f"{policy} (live{', at the bytes it held' if held else ''})"
                ax.scatter(xs, ys, marker="X", s=90, label=label,
                           color=colour, edgecolors="black", zorder=4)  # fmt: skip
                if metric is _hit_ratio:
                    _whatif_curve(ax, group, policy, colour)
            else:
                ax.plot(xs, ys, marker=marker, label=_shown(policy), color=colour,
                        linestyle=_line_style(policy),
                        zorder=3 if policy == BASELINE else 2)  # fmt: skip
        ax.set_xscale("log")
        swept = sorted({c["cache_bytes"] for c in cells if c["workload"] == workload})
        if len(swept) <= _MAX_SIZE_TICKS:  # ticks at the sizes run, not at powers of ten
            ax.set_xticks(swept, [format_size(size) for size in swept], rotation=30, ha="right")
            ax.xaxis.set_minor_locator(NullLocator())
        else:
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(v)))
        ax.set_xlabel("cache size (bytes, log scale)")
        ax.set_ylabel(ylabel)
        if bytes_axis:  # policies write orders of magnitude apart: a log axis shows them all
            ax.set_yscale("log", base=4)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(v)))
        ax.set_title(_panel_title(workload, name))
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return _save(fig, directory / f"{name_of}.png")


def _hit_ratio(cell: Cell) -> float:
    return float(cell["stats"]["hit_ratio"])


def _whatif_curve(ax: Any, group: Sequence[Cell], policy: str, colour: str) -> None:
    """The live proxies' own policy's what-if, as they estimated it from their traffic: a
    dotted line through 0.25x to 4x each live cache."""
    for c in group:
        whatif = c.get("whatif")
        if not whatif:
            continue
        own = _admission(policy).split("(")[0]
        curve = sorted((k["size"], 1 - k["miss_ratio"]) for k in whatif["curves"]
                       if k["tier"] == "memory" and k["policy"] == own
                       and k["miss_ratio"] is not None)  # fmt: skip
        if curve:
            ax.plot(*zip(*curve, strict=True), linestyle=":", marker="x", color=colour,
                    label=f"{policy} (live what-if, from {c['cache']})")  # fmt: skip


def _tradeoff(cells: Sequence[Cell], directory: Path) -> Path | None:
    """Hit ratio against bytes written, one point per cache size, a line per policy: the
    trade-off a flash-backed cache decides on (up and to the left is better)."""
    simulated = [c for c in cells if c["mode"] == "simulate" and c["stats"]["bytes_written"]]
    return _against_writes(
        simulated, directory / "hit-ratio-vs-bytes-written.png",
        lambda c: c["stats"]["bytes_written"], log=True,
        xlabel="bytes written to the cache (log scale; one point per cache size)",
        ylabel="hit ratio (hits / requests)", title="hit ratio against writes",
    )  # fmt: skip


def _disk_tradeoff(cells: Sequence[Cell], directory: Path) -> Path | None:
    """The live proxies' hit ratio (memory and disk hits) against the bytes written to their
    disk tiers, a line per policy over the cache sizes: what each policy costs the device."""
    return _against_writes(
        [c for c in cells if "disk" in c], directory / "hit-ratio-vs-disk-writes.png",
        lambda c: c["disk"]["bytes_written"], log=False,
        xlabel="bytes written to the disk tier (one point per memory size)",
        ylabel="hit ratio, memory and disk (hits / requests)",
        title="hit ratio against disk writes (live)",
    )  # fmt: skip


def _against_writes(
    drawn: Sequence[Cell],
    path: Path,
    written: Callable[[Cell], float],
    *,
    log: bool,
    xlabel: str,
    ylabel: str,
    title: str,
) -> Path | None:
    """Panels per workload of ``drawn`` (``panel_sets``): each policy's hit ratio against
    ``written``, a point per cache size. None when there is nothing to draw."""
    if not drawn:
        return None
    series = _series(drawn)
    panels = _panels_of(series)
    fig, axes = _figure(len(panels))
    for ax, (workload, name, members) in zip(axes, panels, strict=True):
        styles = _styles(members)
        for (_, _, policy), group in _in_panel(series, workload, members):
            colour, marker = styles[policy]
            ax.plot([written(c) for c in group], [c["stats"]["hit_ratio"] for c in group],
                    marker=marker, label=_shown(policy), color=colour,
                    linestyle=_line_style(policy),
                    zorder=3 if policy == BASELINE else 2)  # fmt: skip
        if log:
            ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(v)))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(_panel_title(workload, name, title))
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return _save(fig, path)


def _middle_size(group: Sequence[Cell]) -> int:
    """The middle of the cache sizes a group of cells ran: the one the over-time plots show."""
    sizes = sorted({c["cache_bytes"] for c in group})
    return sizes[len(sizes) // 2]


def _over_time(cells: Sequence[Cell], directory: Path) -> Path | None:
    """Hit ratio over the run, for the middle cache size of each workload and mode, in
    panels of at most ``MAX_SERIES`` policies (``panel_sets``), LRU black and last."""
    panels = []
    for workload, mode in _panels(cells):
        group = [c for c in cells if (c["workload"], c["mode"]) == (workload, mode)]
        middle = _middle_size(group)
        timed = [c for c in group if c["cache_bytes"] == middle and c.get("timeline")]
        for name, members in panel_sets([c["policy"] for c in timed]):
            chosen = sorted((c for c in timed if c["policy"] in members),
                            key=lambda c: c["policy"] == BASELINE)  # fmt: skip
            panels.append((workload, mode, middle, name, members, chosen))
    if not panels:
        return None
    fig, axes = _figure(len(panels))
    for ax, (workload, mode, middle, name, members, chosen) in zip(axes, panels, strict=True):
        styles = _styles(members)
        for c in chosen:
            points = c["timeline"]
            if mode == "live":
                xs = [p["t"] for p in points]
                ys = [p["cumulative_hit_ratio"] for p in points]
                ax.set_xlabel("time since start (s)")
            else:
                xs = [p["requests"] for p in points]
                ys = [p["hit_ratio"] for p in points]
                ax.set_xlabel("requests replayed")
            colour, _ = styles[c["policy"]]
            ax.plot(xs, ys, label=_shown(c["policy"]), color=colour,
                    zorder=3 if c["policy"] == BASELINE else 2)  # fmt: skip
        ax.set_ylabel("cumulative hit ratio")
        ax.set_title(_panel_title(f"{workload} ({mode}), cache {format_size(middle)}", name))
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return _save(fig, directory / "hit-ratio-over-time.png")


def _latency(cells: Sequence[Cell], directory: Path) -> Path | None:
    live = [c for c in cells if c.get("client")]
    if not live:
        return None
    palette = colours(cells)
    percentiles = ["p50", "p90", "p99", "p99.9"]
    fig, axes = _figure(1)
    ax = axes[0]
    width = 0.8 / len(live)
    for i, c in enumerate(live):
        values = [c["client"]["latency_ms"][p] for p in percentiles]
        xs = [j + i * width for j in range(len(percentiles))]
        label = f"{c['policy']} @ {c['cache']} ({c['workload']})"
        ax.bar(
            xs, values, width, label=label, color=palette[c["policy"]], alpha=0.6 + 0.4 * (i % 2)
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(percentiles))], percentiles)
    ax.set_ylabel("latency (ms)")
    ax.set_title("client-side latency per policy (live)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, directory / "latency-percentiles.png")


def _filter_health(cells: Sequence[Cell], directory: Path) -> Path | None:
    """Filter fill and false-positive estimate over the run, at the middle cache size of each
    simulated workload (as the hit ratio over time), against each policy's target rate."""
    simulated = [c for c in cells if c["mode"] == "simulate"]
    chosen = []
    for workload in sorted({c["workload"] for c in simulated}):
        group = [c for c in simulated if c["workload"] == workload]
        middle = _middle_size(group)
        chosen += [
            c
            for c in group
            if c["cache_bytes"] == middle and c["policy"] != BASELINE and c.get("timeline")
        ]
    if not chosen:
        return None
    palette = colours(cells)
    fig, axes = _figure(2)
    for c in chosen:
        xs = [p["requests"] for p in c["timeline"]]
        label = f"{c['policy']} @ {c['cache']} ({c['workload']})"
        colour = palette[c["policy"]]
        axes[0].plot(xs, [p["filter_fill"] for p in c["timeline"]], label=label, color=colour)
        axes[1].plot(
            xs, [p["filter_fp_estimate"] for p in c["timeline"]], label=label, color=colour
        )
    for target in sorted({c["admission"]["fp_rate"] for c in chosen if c.get("admission")}):
        axes[1].axhline(target, color="black", linestyle="--", linewidth=1,
                        label=f"target fp rate {target:g}")  # fmt: skip
    axes[0].set_ylim(0, 1)
    axes[1].set_ylim(bottom=0)
    axes[0].set_ylabel("fill of the fullest generation (share of bits set)")
    axes[1].set_ylabel("estimated false-positive rate")
    for ax in axes:
        ax.set_xlabel("requests replayed")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("admission filter fill over time")
    axes[1].set_title("admission filter false-positive estimate over time")
    return _save(fig, directory / "filter-health.png")


def draw_all(cells: Sequence[Cell], directory: Path) -> list[Path]:
    """Every plot the cells support; returns the files written."""
    drawn = [
        _by_size(
            cells,
            directory,
            "hit-ratio-vs-cache-size",
            _hit_ratio,
            "hit ratio (hits / requests)",
        ),
        _by_size(
            cells,
            directory,
            "byte-hit-ratio-vs-cache-size",
            lambda c: c["stats"]["byte_hit_ratio"],
            "byte hit ratio (cached bytes / bytes)",
        ),
        _by_size(
            cells,
            directory,
            "bytes-written-vs-cache-size",
            lambda c: c["stats"]["bytes_written"],
            "bytes written to the cache",
            True,
        ),
        _tradeoff(cells, directory),
        _disk_tradeoff(cells, directory),
        _over_time(cells, directory),
        _latency(cells, directory),
        _filter_health(cells, directory),
    ]
    return [p for p in drawn if p is not None]


# The disk admission family's curves (``loadgen.sim.flash``): a colour and a marker each.
_FLASH_STYLES = {
    "always": ("#555555", "s"),
    "second-hit": ("#1f77b4", "o"),
    "nth-hit": ("#2ca02c", "^"),
    "probabilistic": ("#ff7f0e", "D"),
    "size-below": ("#9467bd", "v"),
    "dynamic random": ("#d62728", "P"),
    "auto": ("#17becf", "*"),
}


def _written_or(least: float, cell: Cell) -> float:
    return max(cell["disk_bytes_written"], least)


def flash(cells: Sequence[Cell], directory: Path) -> Path | None:
    """Hit ratio (memory and disk) against the bytes written to the disk tier, a panel per
    workload and disk size: each rule of the disk admission family a curve over its
    parameter, the Pareto front a dashed black line, its points ringed."""
    if not cells:
        return None
    groups = sorted({flash_group(c) for c in cells})
    fig, axes = _figure(len(groups))
    for ax, (workload, memory, disk) in zip(axes, groups, strict=True):
        group = [c for c in cells if flash_group(c) == (workload, memory, disk)]
        # A rule that wrote nothing is drawn at the left edge, not lost off a log axis.
        floor = min((c["disk_bytes_written"] for c in group if c["disk_bytes_written"] > 0),
                    default=2)  # fmt: skip
        x = partial(_written_or, floor / 2)
        for rule in dict.fromkeys(c["rule"] for c in group):
            curve = sorted((c for c in group if c["rule"] == rule), key=x)
            colour, marker = _FLASH_STYLES.get(rule, ("#8c564b", "x"))
            ax.plot([x(c) for c in curve], [c["hit_ratio"] for c in curve], marker=marker,
                    color=colour, label=rule, markersize=7)  # fmt: skip
        front = sorted((c for c in group if c["pareto"]), key=x)
        ax.plot([x(c) for c in front], [c["hit_ratio"] for c in front], linestyle="--",
                color="black", linewidth=1, label="Pareto front", zorder=1)  # fmt: skip
        ax.scatter([x(c) for c in front], [c["hit_ratio"] for c in front], s=160,
                   facecolors="none", edgecolors="black", zorder=3)  # fmt: skip
        ax.set_xscale("log", base=4)  # ticks at 1, 4, 16 MiB...: powers of ten read badly
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(v)))
        ax.set_xlabel("bytes written to the disk tier (log scale)")
        ax.set_ylabel("hit ratio, memory and disk")
        ax.set_title(f"{workload}: memory {format_size(memory)}, disk {format_size(disk)}",
                     fontsize=10)  # fmt: skip
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return _save(fig, directory / "flash-hit-ratio-vs-disk-writes.png")
