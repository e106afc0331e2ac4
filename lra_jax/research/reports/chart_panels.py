"""One panel of the LRA chart: LRA score (y) against training speed relative to softmax (x), bubble area
proportional to memory relative to softmax, as the LRA paper's Figure 3 (Transformer = 1 on both).

Our points, trained from scratch: full-scale scores solid, mini-scale scores hollow; a variant scored on fewer
tasks than the others of its scale is marked * (and dashed). Every variant has a colour and a marker of its
own, the same on every panel and in every chart (`variant_styles`, from the attention registry's names). The
LRA paper's points (`draw_paper`), all at the paper's full scale, go on the same axes as grey squares,
at the paper's Table 1 accuracy averaged over the tasks of our point of the same variant, so that both mean
the same thing; a dotted line joins one to our point only where ours is full scale too: no line joins
points of different scales. The legend and the title state the scale behind every point. Labels are placed
once the layout is final (`Panel.place_labels`) and checked against what was drawn (`Panel.problems`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no window, whatever backend the machine has
from matplotlib.colors import to_hex, to_rgb
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from lra_jax.attention import registry
from lra_jax.research.reports.chart_labels import covered, place_labels, point_box
from lra_jax.research.reports.chart_manifest import rounded
from lra_jax.research.reports.lra_results import (
    LRA_TASKS,
    REFERENCE_VARIANTS,
    TASK_TITLES,
    base_scale,
    is_pretrained,
    seed_counts,
)

LARGEST_AREA = 1100.0  # pt^2 of the panel's largest bubble
NO_MEMORY_AREA = 40.0  # pt^2 of a point whose memory was not measured
LABEL_PT = 9.0  # labels of points: 9 pt is 12.5 px at 100 dpi, 9.5 px on a 1000 px figure shown 760 px wide
RIGHT_ROOM = 0.1  # room right of the fastest point, a fraction of the x span (log span on a log axis)
CAP_PT = 4.0  # half the width of an error bar's caps
PAPER_COLOR = "0.35"
SCALE_ORDER = ("full", "mini")  # full-scale points first: they are the ones a paper point joins
PAPER_SCALE = "full"  # the LRA paper's models ran at the paper's full scale, the only scale a paper point joins
PAPER = "paper"  # the series of the LRA paper's points
# One colour per variant, never two alike: tab10 without its grey (the paper's), then tab20b and Dark2 shades
# far from those; black is the state-space reference's.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b",
           "#ce6dbd", "#1b9e77", "#e7298a", "#5254a3", "#ad494a", "#a55194", "#8ca252", "#bd9e39", "#31a354",
           "#756bb1", "#e6550d", "#3182bd")
# One filled marker per variant, never two alike; the square (the paper's) and the diamond (the reference's)
# are taken. (n, 1, angle) is an n-pointed star, (n, 0, angle) a regular n-gon.
MARKERS = ("o", "^", "v", "<", ">", "p", "h", "H", "8", "*", "P", "X", "d", (4, 1, 0), (6, 1, 0), (3, 1, 0),
           (7, 0, 0), (7, 1, 0), (8, 1, 0), (4, 1, 45), (10, 1, 0), (9, 0, 0), (5, 1, 36), (3, 1, 60), (5, 1, 0),
           (6, 1, 30), (9, 1, 0), (12, 1, 0), (5, 0, 36), (3, 1, 30))


def variant_styles(variants=()) -> dict[str, tuple[str, Any]]:
    """variant -> (colour, marker) for every registered attention variant and any other name in `variants`,
    each pair of its own (no colour and no marker shared), assigned in the registry's order so that a
    variant looks the same in every chart drawn from one registry (a new variant moves those after it:
    redraw the committed chart, as `chart --check` asks)."""
    names = [v for v in registry.names() if v not in REFERENCE_VARIANTS]
    names += sorted(set(variants) - set(names) - set(REFERENCE_VARIANTS))
    return {v: (PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]) for i, v in enumerate(names)}


@dataclasses.dataclass(frozen=True)
class Point:
    """One drawn bubble: `series` is our run's scale or PAPER (the LRA paper's point); `label` '' = drawn
    without a label; `err` the half-length of its error bar (None: no bar)."""
    variant: str
    series: str
    x: float
    y: float
    size: float
    label: str
    key: str
    color: Any = "0.45"
    marker: Any = "o"
    err: float | None = None

    def record(self) -> dict[str, Any]:
        """What the manifest keeps of it (`chart_manifest`): values to 6 significant digits, its colour and marker."""
        return {"variant": self.variant, "series": self.series, "x": rounded(self.x), "y": rounded(self.y),
                "size": rounded(self.size), "label": self.key, "color": to_hex(self.color),
                "marker": str(self.marker)}


@dataclasses.dataclass
class Panel:
    """A drawn panel and its points, for label placement (after the layout is final) and the manifest;
    `legends`: those that must stay clear of the labels."""
    ax: Any
    points: list[Point]
    legends: list = dataclasses.field(default_factory=list)
    annotations: list = dataclasses.field(default_factory=list)

    def _bars(self) -> list[tuple[str, tuple[float, float, float, float]]]:
        """(point, display box) of every error bar's line and of each of its caps."""
        half = CAP_PT * self.ax.figure.dpi / 72.0 + 1.0
        bars = []
        for p in self.points:
            if p.err:
                (x, low), (_, high) = self.ax.transData.transform([(p.x, p.y - p.err), (p.x, p.y + p.err)])
                bars += [(p.key, (x - 1.5, low - 1.5, x + 1.5, high + 1.5)),
                         (p.key, (x - half, low - 1.5, x + half, low + 1.5)),
                         (p.key, (x - half, high - 1.5, x + half, high + 1.5))]
        return bars

    def _point_boxes(self) -> list[tuple[str, tuple[float, float, float, float]]]:
        px_per_pt = self.ax.figure.dpi / 72.0
        return [(p.key, point_box(*self.ax.transData.transform((p.x, p.y)), math.sqrt(p.size) / 2 * px_per_pt))
                for p in self.points]

    def place_labels(self, fontsize: float = LABEL_PT) -> None:
        labelled = [p for p in self.points if p.label]
        if labelled:
            self.annotations = place_labels(
                self.ax, [(p.x, p.y) for p in labelled], [p.label for p in labelled], [p.size for p in labelled],
                fontsize, [p.color for p in labelled],
                obstacles=[((p.x, p.y), p.size) for p in self.points if not p.label],
                boxes=[box for _, box in self._bars()])

    def problems(self) -> list[str]:
        """Every label that overlaps another label, a point, an error bar or the legend, as drawn."""
        return covered(self.ax.figure, self.annotations, self._point_boxes(), self._bars(), self.legends)

    def record(self) -> dict[str, Any]:
        ax = self.ax
        return {"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                "texts": [t.get_text() for t in ax.texts], "points": [p.record() for p in self.points]}


def scored_tasks(measured: dict[str, dict[str, Any]]) -> list[str]:
    """The LRA tasks any variant of `measured` is scored on, in the paper's order."""
    return [t for t in LRA_TASKS if any(t in m["accuracy"] for m in measured.values())]


def scale_line(series: str, measured: dict[str, dict[str, Any]]) -> str:
    """'mini scale: ListOps + Pathfinder, 3 seeds' (or 'mini scale, SPT (masked): ...'): what one series'
    scores are."""
    tasks = " + ".join(TASK_TITLES[t] for t in scored_tasks(measured)) or "no LRA task"
    scale = base_scale(series)
    return f"{scale} scale{series[len(scale):]}: {tasks}, {seed_counts(measured)}"


def ordered_scales(scores: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Full scale first, from scratch before self-pretrained."""
    def order(series: str):
        scale = base_scale(series)
        return (SCALE_ORDER.index(scale) if scale in SCALE_ORDER else len(SCALE_ORDER), is_pretrained(series), series)
    return sorted(scores, key=order)


def bubble_area(relative_memory: float | None, largest: float) -> float:
    """Marker area (pt^2) proportional to memory relative to softmax; the panel's largest gets LARGEST_AREA."""
    return NO_MEMORY_AREA if not relative_memory else LARGEST_AREA * relative_memory / largest


def _score_bar(ax, x: float, y: float, err: float | None, color, gid: str) -> None:
    """A thin capped bar of ±err around the bubble, in a darker shade of its colour (SVG ids `<gid>-<i>`)."""
    if err is None:
        return
    dark = tuple(0.6 * c for c in to_rgb(color))
    bar = ax.errorbar([x], [y], yerr=[err], fmt="none", ecolor=dark, elinewidth=1.1, capsize=CAP_PT, capthick=1.1,
                      zorder=3.5)
    for i, artist in enumerate(bar.get_children()):
        artist.set_gid(f"{gid}-{i}")


def draw_ours(ax, scores: dict[str, dict[str, dict[str, Any]]], speeds: dict[str, tuple[float, float | None]],
              styles: dict[str, tuple[str, Any]], largest: float, gid: str = "score-bar") -> list[Point]:
    """Our scores (y) of every scale against `speeds` (variant -> (relative speed, relative memory)), each
    variant in its (colour, marker) of `styles` (`variant_styles`); score bars with SVG ids
    `<gid>-<scale>-<variant>-<i>`. Returns the drawn points."""
    points = []
    several = len({base_scale(s) for s in scores}) > 1
    for series in ordered_scales(scores):
        measured = scores[series]
        tasks = set(scored_tasks(measured))
        solid = base_scale(series) == "full"
        for variant, m in measured.items():
            if m["score"] is None or variant not in speeds:
                continue
            x, memory = speeds[variant]
            y, size = m["score"], bubble_area(memory, largest)
            color, marker = ("black", "D") if variant in REFERENCE_VARIANTS else styles[variant]
            partial = not tasks.issubset(m["accuracy"])
            _score_bar(ax, x, y, m["score_std"], color, f"{gid}-{series.replace(', ', '-')}-{variant}")
            style = dict(s=size, linewidth=1.6, alpha=0.7, zorder=3, linestyle="--" if partial else "-")
            if variant in REFERENCE_VARIANTS:  # a diamond with a black rim: not an attention variant
                ax.scatter([x], [y], marker="D", facecolor="0.15" if solid else "none", edgecolor="black", **style)
            else:
                ax.scatter([x], [y], marker=marker, facecolor=color if solid else "none", edgecolor=color, **style)
            ax.scatter([x], [y], s=6, color="black", zorder=4)
            label = variant + (f" ({base_scale(series)})" if several else "") + ("*" if partial else "")
            points.append(Point(variant, series, x, y, size, label, label, color, marker, m["score_std"]))
    return points


def draw_paper(ax, reference: dict[str, Any] | None, ours: list[Point],
               scores: dict[str, dict[str, dict[str, Any]]], largest: float) -> list[Point]:
    """The LRA paper's models with a Table 2 entry (all at the paper's full scale): x its speed at 4K relative
    to the Transformer, bubble its memory at 4K relative to the Transformer's, y its Table 1 accuracy averaged
    over the tasks of our point of the same variant (full scale first, else our first scale's tasks). Joined
    to that point by a dotted line only where ours is full scale too (PAPER_SCALE); otherwise labelled, since
    a line between scales would set two different experiments side by side as one."""
    if not reference or not scores:
        return []
    base = next(m for m in reference["models"] if m["relative_speed_4k"] == 1.0)
    first = scored_tasks(scores[ordered_scales(scores)[0]])
    points = []
    for model in reference["models"]:
        if not (model.get("relative_speed_4k") and model.get("memory_4k_gb")):
            continue
        ours_of = [p for p in ours if p.variant == model["variant"] and not is_pretrained(p.series)]
        joined = next((p for p in ours_of if base_scale(p.series) == PAPER_SCALE), None)
        same = joined or next(iter(ours_of), None)
        tasks = scored_tasks({model["variant"]: scores[same.series][model["variant"]]}) if same else first
        if not tasks:
            continue
        x, y = model["relative_speed_4k"], math.fsum(model["accuracy"][t] for t in tasks) / len(tasks)
        size = bubble_area(model["memory_4k_gb"] / base["memory_4k_gb"], largest)
        ax.scatter([x], [y], s=size, marker="s", facecolor=PAPER_COLOR, edgecolor="0.1", linewidth=1.2, alpha=0.35,
                   zorder=2.5)
        ax.scatter([x], [y], s=6, marker="s", color="0.15", zorder=4)
        if joined:
            ax.plot([x, joined.x], [y, joined.y], linestyle=":", color=PAPER_COLOR, linewidth=1.2, zorder=2,
                    gid=f"paper-line-{model['variant']}")
        key = f"LRA paper: {model['paper_name']} ({model['variant']})"
        label = f"{model['paper_name']} (paper)"
        points.append(Point(model["variant"], PAPER, x, y, size, "" if joined else label, key, PAPER_COLOR, "s"))
    return points


def paper_memory_ratios(reference: dict[str, Any] | None) -> list[float]:
    """Every paper model's memory at 4K relative to the Transformer's (for a shared bubble scale)."""
    if not reference:
        return []
    base = next(m for m in reference["models"] if m["relative_speed_4k"] == 1.0)
    return [m["memory_4k_gb"] / base["memory_4k_gb"] for m in reference["models"]
            if m.get("relative_speed_4k") and m.get("memory_4k_gb")]


def log_axis_with_plain_ticks(axis) -> None:
    """A log scale labelled 0.05, 0.1, 0.2, 0.5, 1, ... rather than 10^-1 and 10^0 alone."""
    axis.axes.set_xscale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def finish(ax, points: list[Point]) -> None:
    """Log x where the speeds span more than 10x, margins, a line at softmax (x = 1) and a light grid. The
    right margin is the wider: the fastest variants crowd there, and their labels need room beside them
    rather than leader lines back across the cluster."""
    xs = [p.x for p in points]
    if xs and max(xs) / max(min(xs), 1e-12) > 10:
        log_axis_with_plain_ticks(ax.xaxis)
    ax.axvline(1.0, color="0.6", linewidth=0.8, zorder=1)
    ax.grid(True, alpha=0.3, which="both")
    ax.margins(x=0.08, y=0.12)
    low, high = ax.get_xlim()
    if ax.get_xscale() == "log":
        ax.set_xlim(low, high * (high / low) ** RIGHT_ROOM)
    else:
        ax.set_xlim(low, high + (high - low) * RIGHT_ROOM)


def legend_handles(ax, points: list[Point], largest: float) -> list:
    """The legend's entries: the memory scale and what solid, hollow, arrow, *, diamond and square mean (only
    those drawn)."""
    handles = [ax.scatter([], [], s=LARGEST_AREA * f / largest, facecolor="none", edgecolor="0.4",
                          label=f"{f:g}× softmax's memory") for f in _legend_ratios(largest)]
    series = {base_scale(p.series) for p in points if p.series != PAPER}
    marks = [("full", "o", "0.3", "ours, full scale (solid)"), ("mini", "o", "none", "ours, mini scale (hollow)")]
    handles += [Line2D([], [], marker=m, linestyle="", markerfacecolor=face, markeredgecolor="0.3", markersize=9,
                       label=text) for s, m, face, text in marks if s in series]
    if any(p.label.endswith("*") for p in points):
        handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor="0.3",
                              markersize=9, label="* scored on fewer tasks (dashed)"))
    for variant, what in REFERENCE_VARIANTS.items():
        if any(p.variant == variant for p in points):
            handles.append(Line2D([], [], marker="D", linestyle="", markerfacecolor="none", markeredgecolor="black",
                                  markersize=9, label=f"{variant}: state-space yardstick"))
    papers = [p for p in points if p.series == PAPER]
    if papers:
        joined = any(not p.label for p in papers)
        handles.append(Line2D([], [], marker="s", linestyle=":" if joined else "", color=PAPER_COLOR,
                              markerfacecolor=PAPER_COLOR, markersize=9, alpha=0.6,
                              label=f"LRA paper ({PAPER_SCALE} scale, TPU v3)"
                              + (f"; dotted: to our {PAPER_SCALE}-scale point" if joined else "")))
    return handles


def _legend_ratios(largest: float) -> list[float]:
    """Reference bubbles for the legend: the largest drawn (to 2 significant digits), 1 and a quarter."""
    ratios = [float(f"{largest:.2g}")] + [r for r in (1.0, 0.25) if r < 0.8 * largest]
    return ratios
