"""The LRA chart's figures and the whole chart-and-table run (`make_chart`, `check_chart`): the library behind
`python -m lra_jax.tools.chart`.

The figures (`chart_views`): the headline, lra_chart.png (the LRA paper's Figure 3 measured: score against
training speed relative to softmax on one accelerator, bubble area memory, one point per variant from
scratch, the paper's points on the same axes), and, each on its own, the self-pretraining arrows
(lra_spt.png), every variant on a CPU (lra_cpu.png) and the TPU compiler's modeled step (lra_tpu_modeled.png).
Beside them: the tables (`lra_results`, `results_summary`), the interactive view's data
(`chart_interactive`) and the manifest (`chart_manifest`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no window, whatever backend the machine has
import matplotlib.pyplot as plt

from lra_jax.errors import LraError
from lra_jax.research.compilation import table2_report
from lra_jax.research.reports import chart_interactive, chart_manifest, chart_views, results_summary, spt_report
from lra_jax.research.reports.chart_manifest import ChartOptions
from lra_jax.research.reports.chart_panels import ordered_scales
from lra_jax.research.reports.chart_speeds import device_speeds
from lra_jax.research.reports.lra_results import (
    MIXER_REFERENCES,
    SPT_REFERENCE,
    aggregate,
    caption,
    diverged_note,
    is_pretrained,
    markdown_table,
    read_runs,
    unfinished_note,
)
from lra_jax.research.sweeps import selection


def save(views: list[chart_views.View], out_dir: str, digest: str) -> dict[str, str]:
    """Writes each view as <name>.png and <name>.svg, as deterministically as the backends allow (no date, no
    software version, a fixed SVG id salt), each carrying `digest`, the sha256 of the values drawn
    (`chart_manifest.drawn_digest`), for `--check`; returns their paths and closes the figures."""
    paths = {}
    with plt.rc_context({"svg.hashsalt": "lra_chart"}):
        for view in views:
            for ext, metadata in chart_manifest.image_metadata(digest).items():
                name = f"{view.name}.{ext}"
                paths[name] = os.path.join(out_dir, name)
                view.fig.savefig(paths[name], dpi=view.fig.dpi, metadata=metadata)
            plt.close(view.fig)
    return paths


def close(views: list[chart_views.View]) -> None:
    for view in views:
        plt.close(view.fig)


def _read_reference(path: str | None) -> dict[str, Any] | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_scores(options: ChartOptions, runs: str | None = None, pretrained: bool = True
                ) -> tuple[dict[str, dict[str, dict[str, Any]]], str, list[str]]:
    """(series -> `aggregate` of that series' cells, each variant's with "files": {task: the chosen point's run
    directory}, note naming what was left out, results files read) from every directory of `runs` (comma-
    separated; default `options.runs`), self-pretrained runs left out unless `pretrained`. A cell whose chosen
    point has fewer than `options.min_seeds` seeds is left out and named."""
    runs = runs or options.runs
    dirs = [d for d in runs.split(",") if d]
    results = [r for d in dirs for r in read_runs(d, options.scale) if pretrained or not is_pretrained(r.scale)]
    selections = selection.select_all(results)
    note = "\n".join(filter(None, [diverged_note(results), unfinished_note(selections, options.min_seeds)]))
    kept = {cell: s for cell, s in selections.items() if s is None or s.n >= options.min_seeds}
    scales = sorted({scale or "unknown" for _, scale, _ in kept})
    scores = {scale: aggregate({(t, s, v): c for (t, s, v), c in kept.items() if (s or "unknown") == scale})
              for scale in scales}
    scores = {scale: measured for scale, measured in scores.items() if measured}
    files = chart_interactive.run_files(results, kept)
    for scale, measured in scores.items():
        for variant, m in measured.items():
            m["files"] = {t: files[(t, scale, variant)] for t in m["accuracy"] if (t, scale, variant) in files}
    if not scores:
        raise LraError(f"no results.json{' of scale ' + options.scale if options.scale else ''} under "
                       f"{runs}" + (" that is a result: " + note if results else ""))
    return scores, note, [f for d in dirs for f in chart_manifest.results_files(d)]


def render(options: ChartOptions, mixer_references: Sequence[str] = MIXER_REFERENCES):
    """Everything `options` draw, in memory: ([views], {output file name: its text}, manifest record).
    `mixer_references`: the state-space and modern-mixer papers' published-figures files, each listed in the
    table and an input of the manifest (a missing file is skipped). Prints one line per label that covers
    something in a figure (`chart_panels.Panel.problems`)."""
    options = options.normalized()  # every path as the manifest records it, so that --check draws the same text
    scores, note, inputs = read_scores(options, pretrained=not options.spt_runs)
    spt_scores, spt_source = scores, ""
    if options.spt_runs:  # the self-pretraining comparison from runs of its own, both arms
        spt_scores, spt_left_out, spt_inputs = read_scores(options, options.spt_runs)
        inputs += spt_inputs
        note = "\n".join(filter(None, [note, spt_left_out]))
        spt_source = spt_report.source_note(options.spt_runs, spt_scores, scores)
    note = "\n".join(filter(None, [note, spt_report.unmatched_note(spt_scores)]))
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
    pretraining = spt_report.gain_table(spt_scores, main, spt_source)
    spt_reference = _read_reference(SPT_REFERENCE) if pretraining else None
    inputs += [p for p, r in ((options.reference, reference), *mixers.items(), (SPT_REFERENCE, spt_reference)) if r]
    # One caption per scale; the two arms of one scale share theirs, said once.
    captions = "\n".join(dict.fromkeys(filter(None, [caption(scores[s]) for s in ordered_scales(scores)] + [note])))
    views = chart_views.views(scores, main, reference, cpu, modeled,
                              chart_manifest.display_path(options.modeled) if options.modeled else "", captions,
                              spt_scores, spt_source)
    # The tables and the interactive view: the headline's series from scratch and the comparison's self-pretrained.
    scores = {**scores, **{s: m for s, m in spt_scores.items() if is_pretrained(s)}}
    for view in views:
        for problem in view.panel.problems():
            print(f"warning: {view.name}: {problem}", file=sys.stderr)
    record = chart_manifest.manifest(options, inputs, [view.record() for view in views])
    header = (f"Generated by `{record['command']}` from the inputs listed with their sha256 in "
              f"{chart_manifest.MANIFEST_NAME}; do not edit by hand: `python -m lra_jax.tools.chart --check` "
              "fails when an input or this file changes.")
    table = markdown_table(scores, main, cpu, reference, "\n".join(filter(None, [note, spt_source])),
                           list(mixers.values()), header=header, pretraining=pretraining, spt_reference=spt_reference)
    short = results_summary.summary(scores, main, header.replace(
        "from the inputs", f"beside {chart_manifest.TABLE_NAME} (the full table) from the inputs", 1),
        not_drawn=views[0].not_drawn)
    reference_path = chart_manifest.display_path(options.reference) if reference else None
    interactive = chart_interactive.data(views, scores, reference_path, record["command"])
    return views, {chart_manifest.TABLE_NAME: table, results_summary.NAME: short,
                   chart_interactive.NAME: chart_interactive.text(interactive)}, record


def make_chart(options: ChartOptions, mixer_references: Sequence[str] = MIXER_REFERENCES) -> dict[str, str]:
    """Draws what `options` say and writes the figures, the tables (`lra_results`, `results_summary`), the
    interactive view's data (`chart_interactive`) and the manifest (`chart_manifest`) into `options.out`;
    returns their paths."""
    views, texts, record = render(options, mixer_references)
    os.makedirs(options.out, exist_ok=True)
    paths = save(views, options.out, record["drawn_sha256"])
    for name, text in (*texts.items(), (chart_manifest.MANIFEST_NAME, chart_manifest.manifest_text(record))):
        paths[name] = os.path.join(options.out, name)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write(text)
    aliases = {"png": "lra_chart.png", "svg": "lra_chart.svg", "md": chart_manifest.TABLE_NAME,
               "summary": results_summary.NAME, "inputs": chart_manifest.MANIFEST_NAME}
    return {**paths, **{key: paths[name] for key, name in aliases.items()}}


def check_chart(options: ChartOptions, mixer_references: Sequence[str] = MIXER_REFERENCES) -> list[str]:
    """Redraws in memory what `options` draw and returns one line per disagreement with the files in
    `options.out` (`chart_manifest.problems`); [] when the committed chart is up to date."""
    views, texts, record = render(options, mixer_references)
    close(views)
    return chart_manifest.problems(options.out, record, texts)
