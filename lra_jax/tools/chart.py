r"""Speed-vs-score bubble chart and results table, regenerated from runs and a bench JSON.

    python -m lra_jax.tools.chart --runs=runs/ --bench=experiments/results/bench-<device>-<date>.json \
        --out=experiments/charts/ --scale=full --length=4096

Reads every results.json under --runs with `lra_jax.tools.selection`: per variant and task, the grid
point with the best mean validation accuracy (never test) is reported by its test accuracy, mean and
sample std over seeds; a run without a grid is one point. Diverged runs are never results: they are
named under the chart and table. Each variant is scored the LRA way: the mean of its tasks' test means
(%) over ListOps, Text, Retrieval, Image and Pathfinder (Path-X is reported on its own).

Left panel: x = examples/s at --length from the bench JSON, y = LRA score with a bar of ±1 std of a
single-seed score (sqrt(sum of the tasks' variances) / T), bubble area proportional to peak memory;
variants missing a task are drawn hollow and scored over the tasks they have; a caption says how the
points were chosen. Right panel: the LRA paper's published Table 1 score against its Table 2 speed and
memory at 4K (relative to Transformer, as the paper's Figure 3), from experiments/reference/lra_paper.json.
With --modeled (a compile JSON of the Table 2 protocol, `python -m lra_jax.tools.compile --lengths=...`) a
middle panel puts the same scores against the TPU compiler's modeled speed on the paper's hardware,
labelled modeled: no TPU ran.
Variants that are not attention and serve as the yardstick (`REFERENCE_VARIANTS`: s4d, the diagonal
state-space model) are drawn as diamonds in the left panel; the right panel marks the S4D paper's
published score (experiments/reference/s4d_paper.json) as a line. The table gives our figures (mean ±
std), the grid point chosen per cell with every candidate's validation accuracy (where a grid was
swept) and both papers' figures. Writes lra_chart.png, lra_chart.svg and lra_results.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import textwrap
from collections import defaultdict
from typing import Any

from absl import app, flags

from lra_jax.errors import LraError
from lra_jax.tools import selection, table2

LRA_TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
PATH_X = ("path_x", "pathx", "path-x")
TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
               "pathfinder": "Pathfinder"}
REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "experiments", "reference", "lra_paper.json")
SSM_REFERENCE = os.path.join(os.path.dirname(REFERENCE), "s4d_paper.json")
# Not attention: the yardstick the attention variants are measured against, drawn apart.
REFERENCE_VARIANTS = {"s4d": "the reference: a state-space model, not attention"}

# Characters per line of the caption under the left panel (7 pt): about the panel's width.
NOTE_WIDTH = 120

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command-line flags (defined only when run as a command, so modules import side by side)."""
    flags.DEFINE_string("runs", "runs", "Directory searched recursively for results.json files.")
    flags.DEFINE_string("bench", None, "Bench JSON from `python -m lra_jax.tools.bench` (speed and memory); "
                        "without it the chart has no speed axis and only the table is written.")
    flags.DEFINE_string("out", "experiments/charts", "Output directory for PNG, SVG and Markdown.")
    flags.DEFINE_enum("scale", None, ["full", "mini"], "Only runs of this scale (default: all scales).")
    flags.DEFINE_integer("length", None, "Sequence length whose bench results set speed and memory "
                         "(default: the longest length in the bench JSON).")
    flags.DEFINE_string("modeled", None, "Table 2 compile JSON (`python -m lra_jax.tools.compile --lengths=...`) "
                        "for a middle panel: our scores against the TPU compiler's modeled speed at its longest length.")
    flags.DEFINE_string("reference", REFERENCE, "Published LRA figures for the right panel.")
    flags.DEFINE_integer("min_seeds", 1, "Leave out (and name) a variant's task whose chosen grid point has "
                         "fewer finished seeds: a chart of a sweep still running shows only finished cells.")


# ----------------------------------------------------------------------------- reading and scoring

def task_key(task: str) -> str:
    """Canonical task name: every spelling of Path-X becomes 'path_x'."""
    return "path_x" if task.lower() in PATH_X else task


def read_runs(runs_dir: str, scale: str | None = None) -> list[selection.Result]:
    """Every run under `runs_dir` of `scale` (`selection.load`), Path-X spellings made one."""
    if not os.path.isdir(runs_dir):
        raise LraError(f"--runs={runs_dir} is not a directory")
    return [dataclasses.replace(r, task=task_key(r.task)) for r in selection.load(runs_dir, scale)]


def short_point(point: str) -> str:
    """'optimizer.learning_rate=0.005,model.dropout=0' -> 'learning_rate=0.005, dropout=0' (a key keeps
    its prefix where dropping it would make two keys alike); '' (a run outside a grid) -> '(no grid)'."""
    if not point:
        return "(no grid)"
    pairs = [p.partition("=") for p in re.split(r",(?=[^,=]+=)", point)]
    names = [key.rpartition(".")[2] for key, _, _ in pairs]
    if len(set(names)) < len(names):
        names = [key for key, _, _ in pairs]
    return ", ".join(f"{name}={value}" for name, (_, _, value) in zip(names, pairs))


def score_spread(stds: list[float | None]) -> float | None:
    """Standard deviation of a single-seed score, the mean of T tasks run independently:
    sqrt(sum of the tasks' variances) / T; None when a task has no std (one seed) or there is none."""
    if not stds or any(s is None for s in stds):
        return None
    return math.sqrt(sum(s * s for s in stds)) / len(stds)


def aggregate(selections: dict[tuple[str, str | None, str], selection.Selection | None]) -> dict[str, dict[str, Any]]:
    """variant -> {"accuracy": {task: test mean %}, "std": {task: sample std % or None}, "seeds": {task: n},
    "chosen": {task: Selection}, "score", "score_std", "missing", "path_x", "extra_tasks"}, from
    `selection.select_all`; a cell whose every point diverged (None) counts as missing."""
    by = defaultdict(dict)
    for (task, _, variant), chosen in selections.items():
        if chosen is not None:
            by[variant][task] = chosen
    out = {}
    for variant, chosen in sorted(by.items()):
        accuracy = {t: 100.0 * s.test_mean for t, s in chosen.items()}
        std = {t: None if s.test_std is None else 100.0 * s.test_std for t, s in chosen.items()}
        present = [t for t in LRA_TASKS if t in accuracy]
        out[variant] = {
            "accuracy": accuracy, "std": std, "seeds": {t: s.n for t, s in chosen.items()}, "chosen": chosen,
            "score": sum(accuracy[t] for t in present) / len(present) if present else None,
            "score_std": score_spread([std[t] for t in present]),
            "missing": [t for t in LRA_TASKS if t not in accuracy],
            "path_x": accuracy.get("path_x"),
            "extra_tasks": sorted(t for t in accuracy if t not in LRA_TASKS and t != "path_x"),
        }
    return out


def has_grid(measured: dict[str, dict[str, Any]]) -> bool:
    """Whether any reported cell chose among more than one grid point (diverged points included)."""
    return any(len(s.candidates) + len(s.diverged) > 1
               for m in measured.values() for s in m["chosen"].values())


def load_bench(path: str, length: int | None) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """(length used, variant -> bench result at that length); only results with status 'ok'."""
    try:
        with open(path, encoding="utf-8") as f:
            bench = json.load(f)
        results = bench["results"]
    except (OSError, ValueError, KeyError) as error:
        raise LraError(f"cannot read bench JSON {path}: {error}") from error
    lengths = sorted({r["length"] for r in results})
    if length is None:
        ok = sorted({r["length"] for r in results if r.get("status") == "ok"})
        length = ok[-1] if ok else (lengths[-1] if lengths else None)
    elif length not in lengths:
        raise LraError(f"--length={length} is not in {path}; it has lengths {', '.join(map(str, lengths))}")
    return length, {r["variant"]: r for r in results if r["length"] == length and r.get("status") == "ok"}


def memory_bytes(result: dict[str, Any]) -> float | None:
    return result.get("peak_memory_bytes") or result.get("compiled_step_memory_bytes")


# ----------------------------------------------------------------------------- drawing

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


def diverged_note(results: list[selection.Result]) -> str:
    """One line naming the diverged runs left out of the chart and table ("" if none)."""
    diverged = [" ".join([r.variant, r.task, *([short_point(r.point)] if r.point else []),
                          f"seed {r.seed} (step {r.diverged_at_step})"]) for r in results if r.diverged]
    return f"Left out, diverged (not results): {', '.join(diverged)}." if diverged else ""


def seed_counts(measured: dict[str, dict[str, Any]]) -> str:
    """'3 seeds' or '1 to 3 seeds': the seeds per LRA task over the variants in `measured`."""
    counts = sorted({n for m in measured.values() for t, n in m["seeds"].items() if t in LRA_TASKS})
    if not counts:
        return "no seeds"
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    return f"{span} seed{'s' if counts[-1] > 1 else ''}"


def caption(measured: dict[str, dict[str, Any]]) -> str:
    """What the left panel shows and how each task's figure was chosen (true to `selection.select`)."""
    if has_grid(measured):
        how = ("Each variant and task: the grid point with the best mean validation accuracy (over the seeds "
               "every point finished; points with a diverged seed out) is reported, never chosen on test.")
    else:
        how = "Each variant and task: test accuracy, mean over seeds (no grid, nothing selected)."
    return (f"{how} Bubble at the mean score; bar ±1 std of a single-seed score, sqrt(Σ std²)/T "
            f"(none when a task has one seed). n = {seed_counts(measured)} per task.")


def score_bars(measured: dict[str, dict[str, Any]], variants: list[str]) -> list[float | None]:
    """Half-length of each variant's error bar: ±1 std of a single-seed score (None: no bar)."""
    return [measured[v]["score_std"] for v in variants]


def _draw_score_bar(ax, x: float, y: float, err: float | None, color, variant: str, gid: str = "score-bar") -> None:
    """A thin capped vertical bar, ±err around the bubble, under the centre dot and the labels; in a darker
    shade of the bubble's colour, so that it shows inside the bubble too."""
    if err is None:
        return
    from matplotlib.colors import to_rgb

    color = tuple(0.6 * c for c in to_rgb(color))
    bar = ax.errorbar([x], [y], yerr=[err], fmt="none", ecolor=color, elinewidth=1.2, capsize=4,
                      capthick=1.2, zorder=3.5)
    for i, artist in enumerate(bar.get_children()):
        artist.set_gid(f"{gid}-{variant}-{i}")


def draw(measured: dict[str, dict[str, Any]], bench: dict[str, dict[str, Any]] | None,
         length: int | None, reference: dict[str, Any] | None, out_dir: str,
         device: str = "", note: str = "", ssm_reference: dict[str, Any] | None = None,
         modeled: tuple[int, str, dict[str, dict[str, Any]]] | None = None) -> dict[str, str]:
    """Writes lra_chart.png and lra_chart.svg (`note` under the left panel); returns their paths.

    Panels: our scores against the bench's measured speed; with `modeled` ((length, target, variant ->
    modeled speed and memory), `table2.load_modeled`) our scores against the TPU compiler's modeled
    speed; the LRA paper's figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lra_jax.tools.chart_labels import place_labels

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
    fig.canvas.draw()
    fig.set_layout_engine("none")  # freeze the layout so the placed labels stay where they were placed
    for job in filter(None, label_jobs):
        place_labels(*job)
    paths = {}
    for ext in ("png", "svg"):
        paths[ext] = os.path.join(out_dir, f"lra_chart.{ext}")
        fig.savefig(paths[ext], dpi=110)
    plt.close(fig)
    return paths


def _draw_ours(ax, measured: dict[str, dict[str, Any]], speeds: dict[str, dict[str, Any]] | None,
               xlabel: str, title: str, memory_title: str, gid: str = "score-bar"):
    """Our LRA scores (y) against `speeds`' examples/s (x), bubble area = its memory, score bars with SVG
    ids `<gid>-<variant>-<i>`; returns the label job for `place_labels`, or None when no variant has both."""
    import matplotlib
    from matplotlib.lines import Line2D

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
    return ax, list(zip(xs, ys)), labels, sizes, 9, point_colors


def _log_axis_with_plain_ticks(axis) -> None:
    """A log scale labelled 0.05, 0.1, 0.2, 0.5, 1, ... rather than 10^-1 and 10^0 alone."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.axes.set_xscale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def _draw_reference(ax, reference: dict[str, Any] | None):
    """The LRA paper's Figure 3 from its Table 1 and Table 2 (4K, relative to Transformer).

    Returns the label job (ax, anchors, labels, bubble sizes, fontsize, colours), or None without data.
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
    return ax, anchors, [f"{m['paper_name']} ({m['variant']})" for m in models], sizes, 8, None


def implemented_ssm(ssm_reference: dict[str, Any] | None) -> dict[str, Any] | None:
    """The published row of the state-space model this framework implements (its `variant` is set)."""
    if not ssm_reference:
        return None
    return next((m for m in ssm_reference["models"] if m.get("variant")), None)


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


# ----------------------------------------------------------------------------- table

def _fmt(value, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def _significant(value, digits: int = 3) -> str:
    """0.0342 -> '0.0342', 1234.5 -> '1.23e+03': slow CPU speeds keep their digits."""
    return "—" if value is None else f"{value:.{digits}g}"


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(cells) -> list[str]:
    """A Markdown table head: the names and a delimiter row with one `---` per column."""
    return [_row(cells), "|" + "---|" * len(cells)]


def _pm(mean: float | None, std: float | None, suffix: str = "") -> str:
    """'37.20 ± 1.05' (the mean alone without a std, '—' without a mean), then `suffix`."""
    if mean is None:
        return "—"
    return f"{mean:.2f}" + ("" if std is None else f" ± {std:.2f}") + suffix


def _task_order(m: dict[str, Any]) -> list[str]:
    """The tasks a variant has, in table column order (the LRA five, Path-X, then any others)."""
    return [t for t in (*LRA_TASKS, "path_x") if t in m["accuracy"]] + m["extra_tasks"]


def _seeds_cell(m: dict[str, Any]) -> str:
    """Seeds per task present in column order ('3/3/1'), or one number when all are alike."""
    counts = [m["seeds"][t] for t in _task_order(m)]
    return str(counts[0]) if len(set(counts)) == 1 else "/".join(map(str, counts))


def _table_caption(measured: dict[str, dict[str, Any]]) -> str:
    """The line under the title: what a cell holds and how its grid point was chosen."""
    chosen = ("where a grid was swept, each cell reports the point with the best mean validation accuracy "
              "over the seeds every point finished (see Selected grid points)" if has_grid(measured) else
              "no cell has more than one grid point, so nothing was selected")
    return ("Test accuracy (%): mean ± sample std over seeds (ddof 1; the mean alone with one seed). "
            f"Selection is on validation, never on test: {chosen}. Score = mean over ListOps, Text, Retrieval, "
            "Image, Pathfinder (Path-X separate), ± the std of a single-seed score, sqrt(Σ std²)/T. Seeds: "
            "n per task present, in column order (one number when alike). A score marked * is over the tasks "
            "present only.")


def _variant_row(variant: str, m: dict[str, Any], b: dict[str, Any]) -> str:
    """One variant's row of the results table."""
    mem = memory_bytes(b) if b else None
    name = f"{variant} ({REFERENCE_VARIANTS[variant]})" if variant in REFERENCE_VARIANTS else variant
    return _row([name, *(_pm(m["accuracy"].get(t), m["std"].get(t)) for t in LRA_TASKS),
                 _pm(m["score"], m["score_std"], "*" if m["missing"] else ""),
                 _pm(m["path_x"], m["std"].get("path_x")), _seeds_cell(m),
                 _significant(b.get("examples_per_second")), _fmt(mem / 2**30 if mem else None, 2),
                 ", ".join(m["missing"]) or "—"])


def _selection_row(variant: str, task: str, s: selection.Selection) -> str:
    """One (variant, task) row of the selected-grid-points table."""
    val = "; ".join(f"{short_point(p)}: {100 * v:.2f}" for p, v in s.candidates.items())
    if s.diverged:
        val += "; diverged: " + ", ".join(map(short_point, s.diverged))
    compared = ", ".join(map(str, s.compared_on)) or "none common: each point on its own"
    return _row([variant, TASK_TITLES.get(task, task), short_point(s.point), val, compared,
                 ", ".join(map(str, s.seeds)), _pm(100 * s.test_mean, None if s.test_std is None
                                                    else 100 * s.test_std)])


def selected_points(measured: dict[str, dict[str, Any]], order: list[str]) -> list[str]:
    """The "Selected grid points" section: every cell run in a grid; [] when no cell chose among points."""
    if not has_grid(measured):
        return []
    lines = ["", "## Selected grid points", "",
             "Per cell, the grid point with the best mean validation accuracy over the seeds compared on "
             "(every point's finished seeds; a point with a diverged seed is out), then its test accuracy over "
             "all its seeds. Cells run without a grid are not listed.", "",
             *_header(["Variant", "Task", "Chosen", "Val % per candidate", "Compared on seeds",
                       "Seeds at chosen", "Test % mean ± std"])]
    for variant in order:
        m = measured[variant]
        for task in _task_order(m):
            s = m["chosen"][task]
            if s.point or len(s.candidates) + len(s.diverged) > 1:
                lines.append(_selection_row(variant, task, s))
    return lines


def markdown_table(measured: dict[str, dict[str, Any]], bench: dict[str, dict[str, Any]] | None,
                   length: int | None, scale: str | None, reference: dict[str, Any] | None,
                   note: str = "", ssm_reference: dict[str, Any] | None = None) -> str:
    """Per-task accuracy, score, Path-X, speed and memory of every variant, best score first; the grid
    points chosen; the published figures."""
    lines = [f"# LRA results ({'scale ' + scale if scale else 'all scales'})", "", _table_caption(measured), ""]
    speed = f"examples/s @{length}" if length else "examples/s"
    memory = f"memory GiB @{length}" if length else "memory GiB"
    lines += _header(["Variant", *(TASK_TITLES[t] for t in LRA_TASKS), "Score", "Path-X", "Seeds", speed,
                      memory, "Missing tasks"])
    order = sorted(measured, key=lambda v: -(measured[v]["score"] or -1))
    lines += [_variant_row(v, measured[v], (bench or {}).get(v, {})) for v in order]
    for part in note.splitlines():
        lines += ["", part]
    no_bench = [v for v in order if bench is not None and v not in bench]
    if no_bench:
        lines += ["", f"Not in the bench JSON at length {length} (not on the chart): {', '.join(no_bench)}."]
    lines += selected_points(measured, order)
    if reference:
        lines += ["", "## Published (LRA paper)", "", reference["paper"] + ".", "",
                  *_header(["Model", "Variant", *(TASK_TITLES[t] for t in LRA_TASKS), "Avg",
                            "Speed @4K (×)", "Memory @4K (GB)"])]
        for r in reference["models"]:
            acc = r["accuracy"]
            lines.append(_row([r["paper_name"], r["variant"], *(_fmt(acc[t], 2) for t in LRA_TASKS),
                               _fmt(r["avg"], 2), _fmt(r.get("relative_speed_4k"), 1),
                               _fmt(r.get("memory_4k_gb"), 2)]))
        lines += ["", "Sources: " + " ".join(reference.get("source", {}).values())]
    if ssm_reference:
        lines += ["", "## Published (S4D paper): the state-space yardstick, not attention", "",
                  ssm_reference["paper"] + ". Avg (5) is the LRA score above (Path-X apart); Avg (6) is the "
                  "paper's own, with a failed Path-X counted as 50.", "",
                  *_header(["Model", "Variant", *(TASK_TITLES[t] for t in LRA_TASKS), "Path-X", "Avg (5)",
                            "Avg (6)"])]
        for r in ssm_reference["models"]:
            acc = r["accuracy"]
            path_x = acc["path_x"] if isinstance(acc["path_x"], str) else _fmt(acc["path_x"], 2)
            lines.append(_row([r["paper_name"], r["variant"] or "—", *(_fmt(acc[t], 2) for t in LRA_TASKS),
                               path_x, _fmt(r["avg5"], 2), _fmt(r["avg6"], 2)]))
        lines += ["", "Sources: " + " ".join(ssm_reference.get("source", {}).values())]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- entry point

def unfinished_note(selections: dict, min_seeds: int) -> str:
    """One line naming the cells whose chosen point has fewer than `min_seeds` seeds ("" if none)."""
    short = [f"{variant} {task} (n={s.n})" for (task, _, variant), s in selections.items()
             if s is not None and s.n < min_seeds]
    return f"Left out, fewer than {min_seeds} seeds at the chosen point: {', '.join(short)}." if short else ""


def make_chart(runs: str, out: str, bench_path: str | None = None, scale: str | None = None,
               length: int | None = None, reference_path: str | None = REFERENCE,
               ssm_reference_path: str | None = SSM_REFERENCE, min_seeds: int = 1,
               modeled_path: str | None = None) -> dict[str, str]:
    """Reads runs (+ bench, + modeled Table 2, + reference) and writes the chart and table into `out`;
    returns the paths. A cell whose chosen point has fewer than `min_seeds` seeds is left out and named."""
    results = read_runs(runs, scale)
    selections = selection.select_all(results)
    note = "\n".join(filter(None, [diverged_note(results), unfinished_note(selections, min_seeds)]))
    measured = aggregate({c: s for c, s in selections.items() if s is None or s.n >= min_seeds})
    if not measured:
        raise LraError(f"no results.json{' of scale ' + scale if scale else ''} under {runs}"
                       + (" that is a result: " + note if results else ""))
    if note:
        print(note)
    bench, device = None, ""
    if bench_path:
        length, bench = load_bench(bench_path, length)
        with open(bench_path, encoding="utf-8") as f:
            device = json.load(f).get("device", {}).get("kind", "")
    modeled = table2.load_modeled(modeled_path, None) if modeled_path else None
    reference, ssm_reference = None, None
    if reference_path and os.path.exists(reference_path):
        with open(reference_path, encoding="utf-8") as f:
            reference = json.load(f)
    if ssm_reference_path and os.path.exists(ssm_reference_path):
        with open(ssm_reference_path, encoding="utf-8") as f:
            ssm_reference = json.load(f)
    os.makedirs(out, exist_ok=True)
    paths = draw(measured, bench, length, reference, out, device,
                 "\n".join(filter(None, [caption(measured), note])), ssm_reference, modeled)
    paths["md"] = os.path.join(out, "lra_results.md")
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown_table(measured, bench, length, scale, reference, note, ssm_reference))
    return paths


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        paths = make_chart(FLAGS.runs, FLAGS.out, FLAGS.bench, FLAGS.scale, FLAGS.length, FLAGS.reference,
                           min_seeds=FLAGS.min_seeds, modeled_path=FLAGS.modeled)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    for path in paths.values():
        print(f"wrote {path}")


def cli() -> None:
    """The command (`python -m lra_jax.tools.chart`, `lra-chart`)."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    cli()
