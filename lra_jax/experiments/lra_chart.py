"""The speed-vs-score bubble chart (lra_chart.png and .svg) and the whole chart-and-table run
(`make_chart`): the drawing behind `python -m lra_jax.tools.chart`, from the figures of `lra_results`.
"""

from __future__ import annotations

import json
import os
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no window, whatever backend the machine has
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from lra_jax.errors import LraError
from lra_jax.experiments import chart_manifest, selection, table2_report
from lra_jax.experiments.chart_labels import place_labels
from lra_jax.experiments.chart_manifest import ChartOptions, rounded
from lra_jax.experiments.lra_results import (
    REFERENCE,
    REFERENCE_VARIANTS,
    SSM_REFERENCE,
    aggregate,
    caption,
    diverged_note,
    implemented_ssm,
    load_bench,
    markdown_table,
    memory_bytes,
    read_runs,
    score_bars,
    unfinished_note,
)

# Characters per line of the caption under the left panel (7 pt): about the panel's width.
NOTE_WIDTH = 120

def _legend(ax, handles, title: str) -> None:
    """Memory-scale legend outside the axes, with room for the largest bubble."""
    ax.legend(handles=handles, title=title, loc="upper left", bbox_to_anchor=(1.02, 1.0), labelspacing=2.2,
              borderpad=1.4, handletextpad=2.0, fontsize=8, title_fontsize=8, frameon=False)


def _bubble_sizes(memory: list[float], largest: float) -> list[float]:
    """Marker areas (pt^2) proportional to memory; the largest gets 1600 pt^2."""
    return [1600.0 * m / largest for m in memory]


def _memory_legend(ax, largest: float, unit: str, scale: float) -> None:
    """Three reference bubbles that tell the reader what an area means."""
    handles = []
    for fraction in (1.0, 0.25, 0.05):
        value = largest * fraction
        handles.append(ax.scatter([], [], s=1600.0 * fraction, facecolor="none", edgecolor="0.4",
                                  label=f"{value / scale:.2g} {unit}"))
    return handles

def _draw_score_bar(ax, x: float, y: float, err: float | None, color, variant: str, gid: str = "score-bar") -> None:
    """A thin capped vertical bar, ±err around the bubble, under the centre dot and the labels; in a darker
    shade of the bubble's colour, so that it shows inside the bubble too."""
    if err is None:
        return
    color = tuple(0.6 * c for c in to_rgb(color))
    bar = ax.errorbar([x], [y], yerr=[err], fmt="none", ecolor=color, elinewidth=1.2, capsize=4,
                      capthick=1.2, zorder=3.5)
    for i, artist in enumerate(bar.get_children()):
        artist.set_gid(f"{gid}-{variant}-{i}")


def figure(measured: dict[str, dict[str, Any]], bench: dict[str, dict[str, Any]] | None,
           length: int | None, reference: dict[str, Any] | None,
           device: str = "", note: str = "", ssm_reference: dict[str, Any] | None = None,
           modeled: tuple[int, str, dict[str, dict[str, Any]]] | None = None):
    """The chart (`note` under the left panel) and what each panel draws (`panel_record`): (figure, panels).

    Panels: our scores against the bench's measured speed; with `modeled` ((length, target, variant ->
    modeled speed and memory), `table2_report.load_modeled`) our scores against the TPU compiler's modeled
    speed; the LRA paper's figure."""
    ratios = [1.3, 1.3, 1] if modeled else [1.3, 1]
    fig, axes = plt.subplots(1, len(ratios), figsize=(18 + 12 * bool(modeled), 7), constrained_layout=True,
                             gridspec_kw={"width_ratios": ratios})
    label_jobs = []  # labels go on last, once every panel (and so the layout) is final
    where = f" on {device}" if device else ""
    label_jobs.append(_draw_ours(
        axes[0], measured, bench, f"training speed at length {length} (examples/s{where}, measured)",
        "This framework: score vs speed (bubble area = peak memory)", "peak memory / step"))
    if note:  # broken into lines here: a line wider than the panel would squeeze the layout
        note = "\n".join(textwrap.fill(part, NOTE_WIDTH, break_on_hyphens=False) for part in note.splitlines())
        axes[0].text(0.0, -0.12, note, transform=axes[0].transAxes, fontsize=7, va="top")
    if modeled:
        modeled_length, target, speeds = modeled
        chip = target.removeprefix("tpu-").split(":")[0].upper()
        label_jobs.append(_draw_ours(
            axes[1], measured, speeds, f"training speed at length {modeled_length} (examples/s on {target}, "
            "modeled by the XLA TPU compiler, not measured)",
            f"TPU {chip}, modeled by the XLA TPU compiler: the LRA paper's Table 2 setting",
            "memory per device (compiled)", gid="modeled-score-bar"))
        bounds = sorted(v for v, s in speeds.items() if not s.get("examples_per_second"))
        axes[1].text(0.0, -0.12, "Speed: the TPU compiler's modeled train step time (`compile --lengths`), "
                     "compiled on a CPU; no TPU ran. Score: this framework's runs, as in the left panel."
                     + (f"\nNot drawn: {', '.join(bounds)} (loops in the step, which the cost model counts once: "
                        "their modeled time is only a lower bound)." if bounds else ""),
                     transform=axes[1].transAxes, fontsize=7, va="top")
    reference_labels = _draw_reference(axes[-1], reference)
    _draw_ssm_line(axes[-1], ssm_reference)
    label_jobs.append(reference_labels)
    panels = [panel_record(ax, job) for ax, job in zip(axes, label_jobs)]
    fig.canvas.draw()
    fig.set_layout_engine("none")  # freeze the layout so the placed labels stay where they were placed
    for job in filter(None, label_jobs):
        place_labels(*job[:6])
    return fig, panels


def panel_record(ax, job) -> dict[str, Any]:
    """What a panel draws, independent of fonts and library versions: its title, axis labels, texts and
    per point the variant, x, y, bubble size (pt^2) and label (`chart_manifest.rounded`)."""
    points = []
    if job:
        _, anchors, labels, sizes, _, _, variants = job
        points = [{"variant": v, "x": rounded(x), "y": rounded(y), "size": rounded(s), "label": label}
                  for v, (x, y), s, label in zip(variants, anchors, sizes, labels)]
    return {"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "texts": [t.get_text() for t in ax.texts], "points": points}


def save(fig, out_dir: str) -> dict[str, str]:
    """Writes the figure as lra_chart.png and lra_chart.svg, as deterministically as the backends allow
    (no date, no software version, a fixed SVG id salt); returns their paths and closes the figure."""
    paths = {}
    with plt.rc_context({"svg.hashsalt": "lra_chart"}):
        for ext, metadata in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
            paths[ext] = os.path.join(out_dir, f"lra_chart.{ext}")
            fig.savefig(paths[ext], dpi=110, metadata=metadata)
    plt.close(fig)
    return paths


def draw(measured: dict[str, dict[str, Any]], bench: dict[str, dict[str, Any]] | None,
         length: int | None, reference: dict[str, Any] | None, out_dir: str,
         device: str = "", note: str = "", ssm_reference: dict[str, Any] | None = None,
         modeled: tuple[int, str, dict[str, dict[str, Any]]] | None = None) -> dict[str, str]:
    """Writes lra_chart.png and lra_chart.svg (`figure`); returns their paths."""
    fig, _ = figure(measured, bench, length, reference, device, note, ssm_reference, modeled)
    return save(fig, out_dir)


def _draw_ours(ax, measured: dict[str, dict[str, Any]], speeds: dict[str, dict[str, Any]] | None,
               xlabel: str, title: str, memory_title: str, gid: str = "score-bar"):
    """Our LRA scores (y) against `speeds`' examples/s (x), bubble area = its memory, score bars with SVG
    ids `<gid>-<variant>-<i>`; returns the label job for `place_labels` with the variants last, or None
    when no variant has both."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("LRA score (mean test accuracy, %)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    points = [(v, m, speeds[v]) for v, m in measured.items()
              if speeds and v in speeds and m["score"] is not None and speeds[v].get("examples_per_second")]
    if not points:
        ax.text(0.5, 0.5, "no variant has both results and a speed", ha="center", transform=ax.transAxes)
        return None
    xs = [b["examples_per_second"] for _, _, b in points]
    ys = [m["score"] for _, m, _ in points]
    mems = [memory_bytes(b) or 0.0 for _, _, b in points]
    largest = max(mems) or 1.0
    sizes = _bubble_sizes(mems, largest)
    colors = matplotlib.colormaps["tab20"].colors
    bars = score_bars(measured, [v for v, _, _ in points])
    order = list(measured)  # a variant's colour is the same in every panel
    point_colors = ["black" if v in REFERENCE_VARIANTS else colors[order.index(v) % len(colors)] for v, _, _ in points]
    for (variant, m, _), x, y, s, err, color in zip(points, xs, ys, sizes, bars, point_colors):
        partial = bool(m["missing"])
        _draw_score_bar(ax, x, y, err, color, variant, gid)
        if variant in REFERENCE_VARIANTS:  # a diamond with a black rim: not an attention variant
            ax.scatter([x], [y], s=s, marker="D", facecolor="none" if partial else "0.15",
                       edgecolor="black", linewidth=2.5, alpha=0.6, zorder=3, hatch="xx" if partial else None)
        else:
            ax.scatter([x], [y], s=s, facecolor="none" if partial else color, edgecolor=color,
                       linewidth=2.0, linestyle="--" if partial else "-", alpha=0.75, zorder=3,
                       hatch="///" if partial else None)
        ax.scatter([x], [y], s=8, color="black", zorder=4)
    labels = [variant + (" (SSM reference)" if variant in REFERENCE_VARIANTS else "")
              + ("*" if m["missing"] else "") for variant, m, _ in points]
    if max(xs) / max(min(xs), 1e-12) > 10:
        _log_axis_with_plain_ticks(ax.xaxis)
    ax.margins(x=0.12, y=0.15)
    handles = _memory_legend(ax, largest, "GiB", 2**30)
    handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none",
                          markeredgecolor="0.3", markersize=10, label="* missing tasks (hollow)"))
    for variant, what in REFERENCE_VARIANTS.items():
        if any(v == variant for v, _, _ in points):
            handles.append(Line2D([], [], marker="D", linestyle="", markerfacecolor="none",
                                  markeredgecolor="black", markersize=10, label=f"{variant}, {what}"))
    _legend(ax, handles, memory_title)
    return ax, list(zip(xs, ys)), labels, sizes, 9, point_colors, [v for v, _, _ in points]


def _log_axis_with_plain_ticks(axis) -> None:
    """A log scale labelled 0.05, 0.1, 0.2, 0.5, 1, ... rather than 10^-1 and 10^0 alone."""
    axis.axes.set_xscale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def _draw_reference(ax, reference: dict[str, Any] | None):
    """The LRA paper's Figure 3 from its Table 1 and Table 2 (4K, relative to Transformer).

    Returns the label job (ax, anchors, labels, bubble sizes, fontsize, colours, variants), or None.
    """
    ax.set_title("LRA paper (Tay et al. 2021): Table 1 score vs Table 2 speed at 4K")
    ax.set_xlabel("training speed at 4K, relative to Transformer (× steps/s)")
    ax.set_ylabel("published LRA average (%)")
    ax.grid(True, alpha=0.3)
    if not reference:
        ax.text(0.5, 0.5, "no reference data", ha="center", transform=ax.transAxes)
        return None
    models = [m for m in reference["models"] if m.get("relative_speed_4k") and m.get("memory_4k_gb")]
    largest = max(m["memory_4k_gb"] for m in models)
    anchors = [(m["relative_speed_4k"], m["avg"]) for m in models]
    sizes = [1600.0 * m["memory_4k_gb"] / largest for m in models]
    for (x, y), s in zip(anchors, sizes):
        ax.scatter([x], [y], s=s, alpha=0.45, edgecolor="0.2", zorder=3)
    handles = [ax.scatter([], [], s=1600.0 * g / largest, facecolor="none", edgecolor="0.4",
                          label=f"{g:g} GB") for g in (largest, 2.0, 1.0) if g <= largest]
    _legend(ax, handles, "peak memory at 4K")
    ax.margins(x=0.12, y=0.12)
    absent = [m["paper_name"] for m in reference["models"] if m not in models]
    note = "Source: " + reference["paper"] + "; figures in experiments/reference/lra_paper.json."
    if absent:
        note += f"\nNo Table 2 entry: {', '.join(absent)}."
    ax.text(0.0, -0.16, note, transform=ax.transAxes, fontsize=7, va="top", wrap=True)
    return (ax, anchors, [f"{m['paper_name']} ({m['variant']})" for m in models], sizes, 8, None,
            [m["variant"] for m in models])

def _draw_ssm_line(ax, ssm_reference: dict[str, Any] | None) -> None:
    """The S4D paper's published score as a horizontal line: it has no Table 2 speed to place it by."""
    model = implemented_ssm(ssm_reference)
    if model is None:
        return
    ax.axhline(model["avg5"], color="black", linestyle="--", linewidth=1.5, zorder=2)
    ax.annotate(f"{model['paper_name']} ({model['variant']}; state space, not attention): "
                f"{model['avg5']:.1f} published (S4D paper)",
                xy=(0.02, model["avg5"]), xycoords=ax.get_yaxis_transform(), xytext=(0, 4),
                textcoords="offset points", fontsize=8, va="bottom")  # clear of the dashes
    low, high = ax.get_ylim()
    ax.set_ylim(low, max(high, model["avg5"] + 3))

def render(options: ChartOptions, ssm_reference_path: str | None = SSM_REFERENCE):
    """Everything `options` draw, in memory: (figure, table text, manifest record). A cell whose chosen point
    has fewer than `options.min_seeds` seeds is left out and named."""
    runs, scale, min_seeds = options.runs, options.scale, options.min_seeds
    results = read_runs(runs, scale)
    selections = selection.select_all(results)
    note = "\n".join(filter(None, [diverged_note(results), unfinished_note(selections, min_seeds)]))
    measured = aggregate({c: s for c, s in selections.items() if s is None or s.n >= min_seeds})
    if not measured:
        raise LraError(f"no results.json{' of scale ' + scale if scale else ''} under {runs}"
                       + (" that is a result: " + note if results else ""))
    if note:
        print(note)
    inputs = chart_manifest.results_files(runs)
    bench, device, length = None, "", options.length
    if options.bench:
        length, bench = load_bench(options.bench, length)
        with open(options.bench, encoding="utf-8") as f:
            device = json.load(f).get("device", {}).get("kind", "")
        inputs.append(options.bench)
    modeled = None
    if options.modeled:
        modeled = table2_report.load_modeled(options.modeled, None)
        inputs.append(options.modeled)
    reference, ssm_reference = None, None
    if options.reference and os.path.exists(options.reference):
        with open(options.reference, encoding="utf-8") as f:
            reference = json.load(f)
        inputs.append(options.reference)
    if ssm_reference_path and os.path.exists(ssm_reference_path):
        with open(ssm_reference_path, encoding="utf-8") as f:
            ssm_reference = json.load(f)
        inputs.append(ssm_reference_path)
    fig, panels = figure(measured, bench, length, reference, device,
                         "\n".join(filter(None, [caption(measured), note])), ssm_reference, modeled)
    record = chart_manifest.manifest(options, inputs, panels)
    header = (f"Generated by `{record['command']}` from the inputs listed with their sha256 in "
              f"{chart_manifest.MANIFEST_NAME}; do not edit by hand: `python -m lra_jax.tools.chart --check` "
              "fails when an input or this file changes.")
    table = markdown_table(measured, bench, length, scale, reference, note, ssm_reference, header=header)
    return fig, table, record


def make_chart(runs: str, out: str, bench_path: str | None = None, scale: str | None = None,
               length: int | None = None, reference_path: str | None = REFERENCE,
               ssm_reference_path: str | None = SSM_REFERENCE, min_seeds: int = 1,
               modeled_path: str | None = None) -> dict[str, str]:
    """Reads runs (+ bench, + modeled Table 2, + reference) and writes the chart, its table and its manifest
    (`chart_manifest`) into `out`; returns the paths."""
    options = ChartOptions(runs=runs, bench=bench_path, out=out, scale=scale, length=length,
                           min_seeds=min_seeds, modeled=modeled_path, reference=reference_path)
    fig, table, record = render(options, ssm_reference_path)
    os.makedirs(out, exist_ok=True)
    paths = save(fig, out)
    paths["md"] = os.path.join(out, chart_manifest.TABLE_NAME)
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(table)
    paths["inputs"] = os.path.join(out, chart_manifest.MANIFEST_NAME)
    with open(paths["inputs"], "w", encoding="utf-8") as f:
        f.write(chart_manifest.manifest_text(record))
    return paths


def check_chart(options: ChartOptions, ssm_reference_path: str | None = SSM_REFERENCE) -> list[str]:
    """Redraws in memory what `options` draw and returns one line per disagreement with the files in
    `options.out` (`chart_manifest.problems`); [] when the committed chart is up to date."""
    fig, table, record = render(options, ssm_reference_path)
    plt.close(fig)
    return chart_manifest.problems(options.out, record, table)
