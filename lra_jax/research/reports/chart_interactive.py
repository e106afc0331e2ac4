"""The interactive view's data (lra_interactive.json, beside the chart): every point of every panel, with
what a hover shows.

Per panel (the accelerator the headline measures, the CPU, the TPU model), every variant with a speed there,
once per arm (trained from scratch, self-pretrained) it was scored in, and, on the accelerator panel, the LRA
paper's points. A point's hover: the variant and arm, its per-task test accuracy ± std with the seeds that
learned (`learning`), its score, speed and memory relative to softmax, its scale and device, and the files
it came from (the chosen grid point's run directory per task, the bench or compile JSON of its speed).
The docs site draws it with Plotly (`python -m lra_jax.tools.docs`: docs/results/interactive.md); the chart
command writes it and `chart --check` compares it whole, like the tables.
"""

from __future__ import annotations

import json
import os
from typing import Any

from lra_jax.research.reports.chart_manifest import display_path, rounded
from matplotlib.colors import to_hex

from lra_jax.research.reports.chart_panels import PAPER, bubble_area, ordered_scales, variant_styles
from lra_jax.research.reports.lra_results import (
    LRA_TASKS,
    REFERENCE_VARIANTS,
    TASK_TITLES,
    base_scale,
    is_pretrained,
)

NAME = "lra_interactive.json"
PAGE = "results/interactive.md"  # the docs page, and the assets it loads (paths under docs/)
DATA_SCRIPT = "assets/lra_interactive.js"  # the data as a script (window.LRA_CHART): it loads from file:// too
PLOTLY = "assets/javascripts/plotly.min.js"  # plotly.js 4.1.1, MIT, vendored from the plotly package on PyPI
PLOTLY_SHA256 = "3b6e15d45dbb7fca5bd2094291e961ddc5472cd887009e6009a56dab668d721f"
VIEW = "assets/javascripts/lra_interactive_view.js"  # draws the data with Plotly: the menus and the hover
SCRATCH, PRETRAINED, PAPER_ARM = "from scratch", "self-pretrained", "LRA paper"
PANEL_TITLES = {"lra_chart": "measured on {device}", "lra_cpu": "measured on {device}",
                "lra_tpu_modeled": "{device}: compiled, not measured"}
LARGEST_PX = 44.0  # marker diameter (px) of the panel's largest memory


def _task_lines(m: dict[str, Any], files: dict[str, str]) -> list[str]:
    lines = []
    for task in [t for t in (*LRA_TASKS, "path_x") if t in m["accuracy"]]:
        std = m["std"].get(task)
        learned = m.get("learned", {}).get(task)
        counts = f", {learned[0]}/{learned[1]} learned" if learned else ", learned: not judged (no majority rate)"
        lines.append(f"{TASK_TITLES.get(task, task)}: {m['accuracy'][task]:.1f}"
                     + (f" ± {std:.1f}" if std is not None else "") + f" ({m['seeds'][task]} seeds{counts})")
        if files.get(task):
            lines.append(f"  runs: {files[task]}")
    return lines


def _ours(view, series: str, variant: str, m: dict[str, Any], largest: float, color: str) -> dict[str, Any]:
    x, memory = view.speeds[variant]
    files = m.get("files", {})
    hover = [f"<b>{variant}</b> ({SCRATCH if not is_pretrained(series) else series.split(', ', 1)[1]})",
             *_task_lines(m, files),
             f"score: {m['score']:.1f}" + (f" ± {m['score_std']:.1f}" if m["score_std"] is not None else ""),
             f"speed: {x:.3g}× softmax's", "memory: " + (f"{memory:.3g}× softmax's" if memory else "not recorded"),
             f"scale: {base_scale(series)}", f"device: {view.device}",
             f"speed from: {view.sources.get(variant, '—')}"]
    return {"arm": PRETRAINED if is_pretrained(series) else SCRATCH, "variant": variant, "x": rounded(x),
            "y": rounded(m["score"]), "err": rounded(m["score_std"]) if m["score_std"] is not None else None,
            "size": _size(memory, largest), "color": color,
            "symbol": "diamond" if variant in REFERENCE_VARIANTS else "circle", "hover": hover}


def _size(memory: float | None, largest: float) -> float:
    """Marker diameter (px), its area proportional to memory as the figures' bubbles (`bubble_area`)."""
    return rounded(LARGEST_PX * (bubble_area(memory, largest) / bubble_area(largest, largest)) ** 0.5)


def _paper(point, reference_path: str, largest: float) -> dict[str, Any]:
    return {"arm": PAPER_ARM, "variant": point.variant, "x": rounded(point.x), "y": rounded(point.y), "err": None,
            "size": rounded(LARGEST_PX * (point.size / bubble_area(largest, largest)) ** 0.5), "color": "#808080",
            "symbol": "square",
            "hover": [f"<b>{point.key}</b>", f"Table 1 accuracy over our point's tasks: {point.y:.1f}",
                      f"Table 2 speed at 4K: {point.x:.3g}× the Transformer's", "scale: full (the paper's)",
                      "device: TPU v3 (the paper's)", f"from: {reference_path}"]}


def data(views: list, scores: dict[str, dict[str, dict[str, Any]]], reference_path: str | None,
         command: str) -> dict[str, Any]:
    """The interactive view's document: {"generated_by", "panels": [{"name", "title", "xlabel", "ylabel",
    "log_x", "points": [...]}]} from the chart's views (`chart_views.View`; the self-pretraining figure's
    points are the accelerator panel's, so it is not a panel of its own)."""
    styles = variant_styles({v for s in scores.values() for v in s})
    colors = {v: "#000000" if v in REFERENCE_VARIANTS else to_hex(styles[v][0]) for s in scores.values() for v in s}
    panels = []
    for view in views:
        if view.name not in PANEL_TITLES:
            continue
        memories = [m for _, m in view.speeds.values() if m]
        largest = max(memories + [1.0])
        points = [_ours(view, series, variant, m, largest, colors[variant]) for series in ordered_scales(scores)
                  for variant, m in sorted(scores[series].items())
                  if variant in view.speeds and m["score"] is not None]
        points += [_paper(p, reference_path or "", largest) for p in view.panel.points if p.series == PAPER]
        ax = view.panel.ax
        panels.append({"name": view.name, "title": PANEL_TITLES[view.name].format(device=view.device),
                       "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "log_x": ax.get_xscale() == "log",
                       "points": points})
    return {"generated_by": command, "arms": [SCRATCH, PRETRAINED], "panels": panels}


def text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def run_files(results: list, selections: dict) -> dict[tuple[str, str, str], str]:
    """(task, series, variant) -> the directory holding the chosen grid point's runs (their common
    parent), for the hover's 'runs:' line."""
    out = {}
    for cell, chosen in selections.items():
        if chosen is None:
            continue
        task, series, variant = cell
        dirs = [os.path.dirname(r.path) for r in results if (r.task, r.scale, r.variant) == cell
                and r.point == chosen.point and r.seed in chosen.seeds]
        if dirs:
            out[(task, series or "unknown", variant)] = display_path(os.path.commonpath(dirs))
    return out


def data_script(document_text: str) -> str:
    """The interactive view's data as a script that sets window.LRA_CHART."""
    return "window.LRA_CHART = " + document_text.rstrip("\n") + ";\n"


def page(document: dict[str, Any], source: str) -> str:
    """docs/results/interactive.md (after the generated-page mark): the menus, the plot and its scripts."""
    panels = "; ".join(f"{p['title']}: {sum(q['arm'] != PAPER_ARM for q in p['points'])} of ours"
                       + (f", {sum(q['arm'] == PAPER_ARM for q in p['points'])} of the LRA paper"
                          if any(q["arm"] == PAPER_ARM for q in p["points"]) else "") for p in document["panels"])
    return "\n".join([
        "# Interactive chart", "",
        "Every point of every panel of the chart: pick a panel (the device the speed is from) and an arm (trained "
        "from scratch or self-pretrained), then hover a point for its per-task scores ± std with the seeds that "
        "learned, its speed and memory relative to softmax, its scale and device, and the files it came from. "
        f"Points per panel and arm: {panels}.", "",
        '<div class="lra-interactive-menus">',
        '<label>Panel <select id="lra-panel"></select></label>',
        '<label>Arm <select id="lra-arm"></select></label>',
        '<span id="lra-count"></span>',
        "</div>",
        '<div id="lra-interactive"></div>',
        f'<script src="../../{PLOTLY}"></script>',
        f'<script src="../../{DATA_SCRIPT}"></script>',
        f'<script src="../../{VIEW}"></script>', "",
        f"The data is `{source}`, written by `python -m lra_jax.tools.chart` with the figures (`--check` keeps it "
        "current); Plotly's script is served from this site. The static figures: [LRA scores](lra.md)."]) + "\n"
