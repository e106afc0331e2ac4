r"""Speed-vs-score bubble chart and results table, regenerated from runs and a bench JSON.

    python -m lra_jax.tools.chart --runs=runs/ --bench=experiments/results/bench-<device>-<date>.json \
        --out=experiments/charts/ --scale=full --length=4096

Reads every results.json under --runs, averages seeds, and scores each variant the LRA way:
the mean test accuracy (%) over ListOps, Text, Retrieval, Image and Pathfinder (Path-X is
reported on its own). Left panel: x = examples/s at --length from the bench JSON, y = LRA
score, bubble area proportional to peak memory; variants missing a task are drawn hollow and
scored over the tasks they have. Right panel: the LRA paper's published Table 1 score against
its Table 2 speed and memory at 4K (relative to Transformer, as the paper's Figure 3), from
experiments/reference/lra_paper.json. Variants that are not attention and serve as the yardstick
(`REFERENCE_VARIANTS`: s4d, the diagonal state-space model) are drawn as diamonds in the left panel;
the right panel marks the S4D paper's published score (experiments/reference/s4d_paper.json) as a
line, and the table gives both papers' figures. Writes lra_chart.png, lra_chart.svg and lra_results.md.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from typing import Any

from absl import app, flags

from lra_jax.errors import LraError

LRA_TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
PATH_X = ("path_x", "pathx", "path-x")
TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
               "pathfinder": "Pathfinder"}
REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "experiments", "reference", "lra_paper.json")
SSM_REFERENCE = os.path.join(os.path.dirname(REFERENCE), "s4d_paper.json")
# Not attention: the yardstick the attention variants are measured against, drawn apart.
REFERENCE_VARIANTS = {"s4d": "state-space model, not attention (the reference)"}

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
    flags.DEFINE_string("reference", REFERENCE, "Published LRA figures for the right panel.")


# ----------------------------------------------------------------------------- reading and scoring

def load_results(runs_dir: str, scale: str | None = None) -> list[dict[str, Any]]:
    """Every results.json under `runs_dir` (recursively) of `scale`, as {task, variant, seed, accuracy,
    status}; a diverged run has status "diverged" and accuracy None (`aggregate` leaves it out)."""
    if not os.path.isdir(runs_dir):
        raise LraError(f"--runs={runs_dir} is not a directory")
    found = []
    for root, _, files in os.walk(runs_dir):
        if "results.json" not in files:
            continue
        path = os.path.join(root, "results.json")
        try:
            with open(path, encoding="utf-8") as f:
                r = json.load(f)
            diverged = r.get("status") == "diverged"
            row = {"task": r["task"], "variant": r["variant"],
                   "accuracy": None if diverged else float(r["test_accuracy"]),
                   "status": r.get("status", "complete"), "diverged_at_step": r.get("diverged_at_step"),
                   "scale": r.get("scale") or r.get("config", {}).get("scale"),
                   "seed": r.get("config", {}).get("seed", 0), "path": path}
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"warning: skipping {path}: {error!r}", file=sys.stderr)
            continue
        if scale is None or row["scale"] == scale:
            found.append(row)
    return found


def task_key(task: str) -> str:
    """Canonical task name: every spelling of Path-X becomes 'path_x'."""
    return "path_x" if task.lower() in PATH_X else task


def aggregate(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """variant -> {"accuracy": {task: mean % over seeds}, "seeds": {task: n}, "score", "missing", "path_x"}."""
    by = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["status"] == "diverged":
            continue
        by[r["variant"]][task_key(r["task"])].append(100.0 * r["accuracy"])
    out = {}
    for variant, tasks in sorted(by.items()):
        accuracy = {t: sum(v) / len(v) for t, v in tasks.items()}
        present = [t for t in LRA_TASKS if t in accuracy]
        out[variant] = {
            "accuracy": accuracy,
            "seeds": {t: len(v) for t, v in tasks.items()},
            "score": sum(accuracy[t] for t in present) / len(present) if present else None,
            "missing": [t for t in LRA_TASKS if t not in accuracy],
            "path_x": accuracy.get("path_x"),
            "extra_tasks": sorted(t for t in accuracy if t not in LRA_TASKS and t != "path_x"),
        }
    return out


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


def diverged_note(rows: list[dict[str, Any]]) -> str:
    """One line naming the diverged runs left out of the chart and table ("" if none)."""
    diverged = [f"{r['variant']} {r['task']} seed {r['seed']} (step {r['diverged_at_step']})"
                for r in rows if r["status"] == "diverged"]
    return f"Left out, diverged (not results): {', '.join(diverged)}." if diverged else ""


def draw(measured: dict[str, dict[str, Any]], bench: dict[str, dict[str, Any]] | None,
         length: int | None, reference: dict[str, Any] | None, out_dir: str,
         device: str = "", note: str = "", ssm_reference: dict[str, Any] | None = None) -> dict[str, str]:
    """Writes lra_chart.png and lra_chart.svg (`note` under the left panel); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from lra_jax.tools.chart_labels import place_labels

    fig, axes = plt.subplots(1, 2, figsize=(18, 7), constrained_layout=True,
                             gridspec_kw={"width_ratios": [1.3, 1]})
    label_jobs = []  # labels go on last, once both panels (and so the layout) are final
    ax = axes[0]
    points = [(v, m, bench[v]) for v, m in measured.items()
              if bench and v in bench and m["score"] is not None and bench[v].get("examples_per_second")]
    if points:
        xs = [b["examples_per_second"] for _, _, b in points]
        ys = [m["score"] for _, m, _ in points]
        mems = [memory_bytes(b) or 0.0 for _, _, b in points]
        largest = max(mems) or 1.0
        sizes = _bubble_sizes(mems, largest)
        colors = matplotlib.colormaps["tab20"].colors
        for i, ((variant, m, _), x, y, s) in enumerate(zip(points, xs, ys, sizes)):
            color = colors[i % len(colors)]
            partial = bool(m["missing"])
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
        point_colors = ["black" if v in REFERENCE_VARIANTS else colors[i % len(colors)]
                        for i, (v, _, _) in enumerate(points)]
        label_jobs.append((ax, list(zip(xs, ys)), labels, sizes, 9, point_colors))
        if max(xs) / max(min(xs), 1e-12) > 10:
            ax.set_xscale("log")
        ax.margins(x=0.12, y=0.15)
        handles = _memory_legend(ax, largest, "GiB", 2**30)
        handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none",
                              markeredgecolor="0.3", markersize=10, label="* missing tasks (hollow)"))
        for variant, what in REFERENCE_VARIANTS.items():
            if any(v == variant for v, _, _ in points):
                handles.append(Line2D([], [], marker="D", linestyle="", markerfacecolor="none",
                                      markeredgecolor="black", markersize=10, label=f"{variant}: {what}"))
        _legend(ax, handles, "peak memory / step")
    else:
        ax.text(0.5, 0.5, "no variant has both results and a bench entry", ha="center",
                transform=ax.transAxes)
    where = f" on {device}" if device else ""
    ax.set_xlabel(f"training speed at length {length} (examples/s{where})")
    ax.set_ylabel("LRA score (mean test accuracy, %)")
    ax.set_title("This framework: score vs speed (bubble area = peak memory)")
    ax.grid(True, alpha=0.3, which="both")
    if note:
        ax.text(0.0, -0.12, note, transform=ax.transAxes, fontsize=7, va="top", wrap=True)

    reference_labels = _draw_reference(axes[1], reference)
    _draw_ssm_line(axes[1], ssm_reference)
    if reference_labels:
        label_jobs.append(reference_labels)
    fig.canvas.draw()
    fig.set_layout_engine("none")  # freeze the layout so the placed labels stay where they were placed
    for job_ax, anchors, labels, sizes, fontsize, point_colors in label_jobs:
        place_labels(job_ax, anchors, labels, sizes, fontsize, point_colors)
    paths = {}
    for ext in ("png", "svg"):
        paths[ext] = os.path.join(out_dir, f"lra_chart.{ext}")
        fig.savefig(paths[ext], dpi=110)
    plt.close(fig)
    return paths


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
    ax.text(0.02, model["avg5"], f"{model['paper_name']} ({model['variant']}; state space, not attention): "
            f"{model['avg5']:.1f} published (S4D paper; experiments/reference/s4d_paper.json)",
            transform=ax.get_yaxis_transform(), fontsize=8, va="bottom")
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


def markdown_table(measured: dict[str, dict[str, Any]], bench: dict[str, dict[str, Any]] | None,
                   length: int | None, scale: str | None, reference: dict[str, Any] | None,
                   note: str = "", ssm_reference: dict[str, Any] | None = None) -> str:
    """Per-task accuracy, score, Path-X, speed and memory of every variant, best score first."""
    lines = [f"# LRA results ({'scale ' + scale if scale else 'all scales'})", "",
             ("Test accuracy (%) averaged over seeds; score = mean over ListOps, Text, Retrieval, Image, "
             "Pathfinder (Path-X separate). A score marked * is over the tasks present only."), ""]
    speed = f"examples/s @{length}" if length else "examples/s"
    memory = f"memory GiB @{length}" if length else "memory GiB"
    head = ["Variant", *(TASK_TITLES[t] for t in LRA_TASKS), "Score", "Path-X", "Seeds", speed, memory,
            "Missing tasks"]
    lines += _header(head)
    order = sorted(measured, key=lambda v: -(measured[v]["score"] or -1))
    for variant in order:
        m = measured[variant]
        b = (bench or {}).get(variant, {})
        mem = memory_bytes(b) if b else None
        seeds = sorted(set(m["seeds"].values()))
        name = f"{variant} ({REFERENCE_VARIANTS[variant]})" if variant in REFERENCE_VARIANTS else variant
        cells = [name, *(_fmt(m["accuracy"].get(t), 2) for t in LRA_TASKS),
                 _fmt(m["score"], 2, "*" if m["missing"] else ""), _fmt(m["path_x"], 2),
                 "/".join(map(str, seeds)), _significant(b.get("examples_per_second")),
                 _fmt(mem / 2**30 if mem else None, 2), ", ".join(m["missing"]) or "—"]
        lines.append(_row(cells))
    if note:
        lines += ["", note]
    no_bench = [v for v in order if bench is not None and v not in bench]
    if no_bench:
        lines += ["", f"Not in the bench JSON at length {length} (not on the chart): {', '.join(no_bench)}."]
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

def make_chart(runs: str, out: str, bench_path: str | None = None, scale: str | None = None,
               length: int | None = None, reference_path: str | None = REFERENCE,
               ssm_reference_path: str | None = SSM_REFERENCE) -> dict[str, str]:
    """Reads runs (+ bench, + reference) and writes the chart and table into `out`; returns the paths."""
    rows = load_results(runs, scale)
    if not any(r["status"] != "diverged" for r in rows):
        raise LraError(f"no results.json{' of scale ' + scale if scale else ''} under {runs}"
                       + (" that is a result: " + diverged_note(rows) if rows else ""))
    measured = aggregate(rows)
    note = diverged_note(rows)
    if note:
        print(note)
    bench, device = None, ""
    if bench_path:
        length, bench = load_bench(bench_path, length)
        with open(bench_path, encoding="utf-8") as f:
            device = json.load(f).get("device", {}).get("kind", "")
    reference, ssm_reference = None, None
    if reference_path and os.path.exists(reference_path):
        with open(reference_path, encoding="utf-8") as f:
            reference = json.load(f)
    if ssm_reference_path and os.path.exists(ssm_reference_path):
        with open(ssm_reference_path, encoding="utf-8") as f:
            ssm_reference = json.load(f)
    os.makedirs(out, exist_ok=True)
    paths = draw(measured, bench, length, reference, out, device, note, ssm_reference)
    paths["md"] = os.path.join(out, "lra_results.md")
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown_table(measured, bench, length, scale, reference, note, ssm_reference))
    return paths


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        paths = make_chart(FLAGS.runs, FLAGS.out, FLAGS.bench, FLAGS.scale, FLAGS.length, FLAGS.reference)
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
