"""The LRA chart (lra_chart.png and .svg) and the whole chart-and-table run (`make_chart`, `check_chart`):
the library behind `python -m lra_jax.tools.chart`.

Main panel, the LRA paper's Figure 3 measured: x = training speed at length 4K relative to softmax of the
same bench file on one accelerator (`chart_speeds`; the note under the panel names any ratio taken against
another file's softmax), bubble = the step's memory there relative to softmax's, named for what it is (a
measured device peak or XLA's compiled estimate), y = LRA score (`lra_results`); the paper's own
full-scale points on the same axes, joined only to our full-scale points (`chart_panels.draw_paper`); the
published score of each implemented state-space or modern-mixer row (`lra_results.MIXER_REFERENCES`) marked
above or below our point of that variant (`chart_panels.draw_published`).
Secondary panels under it, also relative to softmax: a CPU bench (`cpu`) and the TPU compiler's modeled step
on the paper's hardware (`modeled`, labelled modeled: no TPU ran).
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no window, whatever backend the machine has
import matplotlib.pyplot as plt

from lra_jax.errors import LraError
from lra_jax.research.compilation import table2_report
from lra_jax.research.reports import chart_manifest, chart_panels, results_summary, spt_report
from lra_jax.research.sweeps import selection
from lra_jax.research.reports.chart_manifest import ChartOptions
from lra_jax.research.reports.chart_panels import Panel, ordered_scales, scale_line
from lra_jax.research.reports.chart_speeds import BASELINE, DeviceSpeeds, device_speeds, ratio_note
from lra_jax.research.reports.lra_results import (
    MIXER_REFERENCES,
    SPT_REFERENCE,
    aggregate,
    caption,
    diverged_note,
    implemented_rows,
    markdown_table,
    read_runs,
    unfinished_note,
)

NOTE_WIDTH = 150  # characters per line of a note under a panel (7 pt)
SIDE_TITLE_WIDTH = 90  # characters per title line of a lower, half-width panel (10 pt): wider ones leave the figure
Modeled = tuple[int, str, dict[str, dict[str, Any]]]  # `table2_report.load_modeled`: (length, target, variants)


def _note(ax, text: str, width: int = NOTE_WIDTH) -> None:
    """`text` under the axes, broken into lines here: a line wider than the panel would squeeze the layout."""
    if text:
        ax.text(0.0, -0.1, _wrap(text, width), transform=ax.transAxes, fontsize=7, va="top")


def _wrap(text: str, width: int) -> str:
    """`text` with each of its lines broken at `width` characters."""
    return "\n".join(textwrap.fill(part, width, break_on_hyphens=False) for part in text.splitlines())


def _ours_line(scores: dict[str, dict[str, dict[str, Any]]]) -> str:
    return "ours: " + "; ".join(scale_line(s, scores[s]) for s in ordered_scales(scores))


def _relative(speeds: DeviceSpeeds) -> dict[str, tuple[float, float | None]]:
    return {v: (s.relative_speed, s.relative_memory) for v, s in speeds.speeds.items()}


def relative_modeled(modeled: Modeled) -> tuple[dict[str, tuple[float, float | None]], dict[str, str]]:
    """(variant -> (modeled speed, memory) relative to softmax's, variant -> why it is not drawn)."""
    _, _, variants = modeled
    reasons = {v: m.get("reason") or "no modeled time" for v, m in variants.items() if not m.get("examples_per_second")}
    base = variants.get(BASELINE) or {}
    if not base.get("examples_per_second"):
        return {}, {**reasons, BASELINE: reasons.get(BASELINE, "not modeled") + " (every speed is relative to it)"}
    drawn = {v: (m["examples_per_second"] / base["examples_per_second"],
                 m["peak_memory_bytes"] / base["peak_memory_bytes"] if m.get("peak_memory_bytes") else None)
             for v, m in variants.items() if m.get("examples_per_second")}
    return drawn, reasons


def _draw_panel(ax, scores, speeds: dict[str, tuple[float, float | None]], styles, title: str, xlabel: str,
                memory_title: str, reference: dict[str, Any] | None = None, gid: str = "score-bar",
                published: dict[str, tuple[dict[str, Any], dict[str, Any]]] | None = None) -> Panel:
    """Our scores against `speeds` (and the paper's points where `reference` is given, the implemented
    variants' published scores where `published`, `lra_results.implemented_rows`, is) on `ax`."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("LRA score: mean test accuracy over the tasks scored (%)")
    drawn = [m for s in scores.values() for v, (_, m) in ((v, speeds[v]) for v in s if v in speeds) if m]
    largest = max(drawn + (chart_panels.paper_memory_ratios(reference) if reference else []) + [1.0])
    points = chart_panels.draw_ours(ax, scores, speeds, styles, largest, gid)
    if reference:
        points += chart_panels.draw_paper(ax, reference, points, scores, largest)
    if published:
        points += chart_panels.draw_published(ax, published, points, scores, styles)
    if not points:
        ax.text(0.5, 0.5, "no variant has both a score and a speed", ha="center", transform=ax.transAxes)
    chart_panels.finish(ax, points, largest, memory_title, paper=reference is not None and bool(points))
    return Panel(ax, points)


def figure(scores: dict[str, dict[str, dict[str, Any]]], main: DeviceSpeeds | None,
           reference: dict[str, Any] | None, cpu: DeviceSpeeds | None = None, modeled: Modeled | None = None,
           note: str = "", published: dict[str, tuple[dict[str, Any], dict[str, Any]]] | None = None):
    """The chart and what each panel draws: (figure, [panel records]). `scores`: scale -> `aggregate`;
    `published`: the implemented variants' published rows (`lra_results.implemented_rows`), marked on the
    main panel."""
    secondary = [kind for kind, given in (("cpu", cpu), ("modeled", modeled)) if given]
    fig = plt.figure(figsize=(20, 18 if secondary else 10), constrained_layout=True)
    grid = fig.add_gridspec(2 if secondary else 1, max(len(secondary), 1), height_ratios=[1.3, 1] if secondary else [1])
    styles = chart_panels.variant_styles({v for s in scores.values() for v in s})  # (colour, marker), every panel
    panels = [_main_panel(fig.add_subplot(grid[0, :]), scores, main, reference, styles, note, published)]
    for column, kind in enumerate(secondary):
        ax = fig.add_subplot(grid[1, column])
        panels.append(_cpu_panel(ax, scores, cpu, styles) if kind == "cpu" else
                      _modeled_panel(ax, scores, modeled, styles))
    records_before = [p.record() for p in panels]  # what is drawn, before labels are placed
    fig.canvas.draw()
    fig.set_layout_engine("none")  # freeze the layout so the placed labels stay where they were placed
    for panel in panels:
        panel.place_labels()
    return fig, records_before


def _main_panel(ax, scores, main: DeviceSpeeds | None, reference, styles, note: str, published=None) -> Panel:
    where = f"measured on {main.device}" if main else "no bench given"
    length = main.length if main else 4096
    settings = f" (batch {main.batch_size}, dropout {main.dropout_rate:g})" if main else ""
    title = (f"LRA score against training speed at length {length}, relative to softmax, {where}{settings}\n"
             f"{_ours_line(scores)}" + ("  ·  LRA paper (squares): full scale, Table 1 accuracy over the same "
                                        "tasks, Table 2 speed and memory at 4K on TPU v3" if reference else ""))
    memory = _memory_title(main) + "\n(paper: peak memory per TPU v3 core)" if main else "bubble area: no memory"
    panel = _draw_panel(ax, scores, _relative(main) if main else {}, styles, title,
                        f"training speed at length {length}, × softmax's (examples/s; {where})", memory, reference,
                        published=published)
    files = (f"Speed and memory: `python -m lra_jax.tools.bench` on {main.device}, {len(main.files)} file(s), each "
             f"variant's and its softmax's named in the table. {ratio_note(main)}") if main else ""
    _note(ax, "\n".join(filter(None, [note, files])), width=200)
    return panel


def _memory_title(speeds: DeviceSpeeds) -> str:
    """The bubble's legend title: what the memory is (`DeviceSpeeds.memory_words`), on which device."""
    return _wrap(f"bubble area: {speeds.memory_words} on {speeds.device}, relative to softmax's", 36)


def _cpu_panel(ax, scores, cpu: DeviceSpeeds, styles) -> Panel:
    across = sum(not s.same_command for s in cpu.speeds.values())
    title = (f"{cpu.device}, measured: speed at length {cpu.length} relative to softmax\n(batch {cpu.batch_size}, "
             f"dropout {cpu.dropout_rate:g}); {_ours_line(scores)}"
             + (f"; {across} of {len(cpu.speeds) - 1} ratios divide by a softmax measured at another time "
                "(drift included; the table names them)" if across else ""))
    return _draw_panel(ax, scores, _relative(cpu), styles, _wrap(title, SIDE_TITLE_WIDTH),
                       f"training speed at length {cpu.length}, × softmax's (examples/s on {cpu.device})",
                       _memory_title(cpu), gid="cpu-score-bar")


def _modeled_panel(ax, scores, modeled: Modeled, styles) -> Panel:
    length, target, variants = modeled
    speeds, reasons = relative_modeled(modeled)
    batches = sorted({m["per_device_batch"] for m in variants.values() if m.get("per_device_batch")})
    batch = f", {'/'.join(map(str, batches))} examples per core" if batches else ""
    title = (f"{target}, modeled by the XLA TPU compiler, not measured{batch}:\nspeed at length {length} relative "
             f"to softmax; {_ours_line(scores)}")
    panel = _draw_panel(ax, scores, speeds, styles, _wrap(title, SIDE_TITLE_WIDTH),
                        f"training speed at length {length}, × softmax's (modeled on {target}; no TPU ran)",
                        "bubble area: memory per device\n(compiled), relative to softmax's", gid="modeled-score-bar")
    scored = {v for s in scores.values() for v in s}
    missing = {v: reasons.get(v, "not in the compile JSON") for v in sorted(scored - set(speeds))}
    label = next((m["modeled_label"] for m in variants.values() if m.get("modeled_label")), "")
    _note(ax, f"Speed: the step compiled on a CPU for the TPU target (`python -m lra_jax.tools.compile --lengths`), "
          f"{label or 'modeled by libtpu'}; score: as in the main panel."
          + ("\nNot drawn: " + "; ".join(f"{', '.join(vs)} ({why})" for why, vs in _by_reason(missing).items())
             + "." if missing else ""),
          width=110)
    return panel


def _by_reason(reasons: dict[str, str]) -> dict[str, list[str]]:
    """reason -> the variants it holds for, in the order first met: one mention of a reason many share."""
    grouped: dict[str, list[str]] = {}
    for variant, why in reasons.items():
        grouped.setdefault(why, []).append(variant)
    return grouped


def save(fig, out_dir: str, digest: str) -> dict[str, str]:
    """Writes the figure as lra_chart.png and lra_chart.svg, as deterministically as the backends allow
    (no date, no software version, a fixed SVG id salt), each carrying `digest`, the sha256 of the values
    drawn (`chart_manifest.drawn_digest`), for `--check`; returns their paths and closes the figure."""
    paths = {}
    with plt.rc_context({"svg.hashsalt": "lra_chart"}):
        for ext, metadata in chart_manifest.image_metadata(digest).items():
            paths[ext] = os.path.join(out_dir, f"lra_chart.{ext}")
            fig.savefig(paths[ext], dpi=100, metadata=metadata)
    plt.close(fig)
    return paths


def _read_reference(path: str | None) -> dict[str, Any] | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_scores(options: ChartOptions) -> tuple[dict[str, dict[str, dict[str, Any]]], str, list[str]]:
    """(scale -> `aggregate` of that scale's cells, note naming what was left out, results files read) from
    every directory of `options.runs` (comma-separated). A cell whose chosen point has fewer than
    `options.min_seeds` seeds is left out and named."""
    dirs = [d for d in options.runs.split(",") if d]
    results = [r for d in dirs for r in read_runs(d, options.scale)]
    selections = selection.select_all(results)
    note = "\n".join(filter(None, [diverged_note(results), unfinished_note(selections, options.min_seeds)]))
    kept = {cell: s for cell, s in selections.items() if s is None or s.n >= options.min_seeds}
    scales = sorted({scale or "unknown" for _, scale, _ in kept})
    scores = {scale: aggregate({(t, s, v): c for (t, s, v), c in kept.items() if (s or "unknown") == scale})
              for scale in scales}
    scores = {scale: measured for scale, measured in scores.items() if measured}
    if not scores:
        raise LraError(f"no results.json{' of scale ' + options.scale if options.scale else ''} under "
                       f"{options.runs}" + (" that is a result: " + note if results else ""))
    return scores, note, [f for d in dirs for f in chart_manifest.results_files(d)]


def render(options: ChartOptions, mixer_references: Sequence[str] = MIXER_REFERENCES):
    """Everything `options` draw, in memory: (figure, {table file name: its text}, manifest record).
    `mixer_references`: the state-space and modern-mixer papers' published-figures files, each listed in the
    table and an input of the manifest, their implemented rows marked on the main panel (a missing file is
    skipped)."""
    scores, note, inputs = read_scores(options)
    note = "\n".join(filter(None, [note, spt_report.unmatched_note(scores)]))
    if note:
        print(note)
    main = cpu = modeled = None
    if options.bench:
        main = device_speeds(options.bench, options.device, options.length, options.dropout_rate)
        inputs += main.files
    if options.cpu_bench:
        cpu = device_speeds(options.cpu_bench, None, None, options.dropout_rate)
        inputs += cpu.files
    if options.modeled:
        modeled = table2_report.load_modeled(options.modeled, None)
        inputs.append(options.modeled)
    reference = _read_reference(options.reference)
    mixers = {path: document for path in mixer_references if (document := _read_reference(path))}
    pretraining = spt_report.gain_table(scores, main)
    spt_reference = _read_reference(SPT_REFERENCE) if pretraining else None
    inputs += [p for p, r in ((options.reference, reference), *mixers.items(), (SPT_REFERENCE, spt_reference)) if r]
    # One caption per scale; the two arms of one scale share theirs, said once.
    captions = "\n".join(dict.fromkeys(filter(None, [caption(scores[s]) for s in ordered_scales(scores)] + [note])))
    fig, panels = figure(scores, main, reference, cpu, modeled, captions, implemented_rows(list(mixers.values())))
    record = chart_manifest.manifest(options, inputs, panels)
    header = (f"Generated by `{record['command']}` from the inputs listed with their sha256 in "
              f"{chart_manifest.MANIFEST_NAME}; do not edit by hand: `python -m lra_jax.tools.chart --check` "
              "fails when an input or this file changes.")
    table = markdown_table(scores, main, cpu, reference, note, list(mixers.values()), header=header,
                           pretraining=pretraining, spt_reference=spt_reference)
    short = results_summary.summary(scores, main, header.replace(
        "from the inputs", f"beside {chart_manifest.TABLE_NAME} (the full table) from the inputs", 1))
    return fig, {chart_manifest.TABLE_NAME: table, results_summary.NAME: short}, record


def make_chart(options: ChartOptions, mixer_references: Sequence[str] = MIXER_REFERENCES) -> dict[str, str]:
    """Draws what `options` say and writes the chart, its table, the short table (`results_summary`) and
    the manifest (`chart_manifest`) into `options.out`; returns their paths."""
    fig, tables, record = render(options, mixer_references)
    os.makedirs(options.out, exist_ok=True)
    paths = save(fig, options.out, record["drawn_sha256"])
    for key, name, text in (("md", chart_manifest.TABLE_NAME, tables[chart_manifest.TABLE_NAME]),
                            ("summary", results_summary.NAME, tables[results_summary.NAME]),
                            ("inputs", chart_manifest.MANIFEST_NAME, chart_manifest.manifest_text(record))):
        paths[key] = os.path.join(options.out, name)
        with open(paths[key], "w", encoding="utf-8") as f:
            f.write(text)
    return paths


def check_chart(options: ChartOptions, mixer_references: Sequence[str] = MIXER_REFERENCES) -> list[str]:
    """Redraws in memory what `options` draw and returns one line per disagreement with the files in
    `options.out` (`chart_manifest.problems`); [] when the committed chart is up to date."""
    fig, tables, record = render(options, mixer_references)
    plt.close(fig)
    return chart_manifest.problems(options.out, record, tables)
