"""LRA scores from finished runs and the results table (lra_results.md): the library behind
`python -m lra_jax.tools.chart`, with `lra_chart` drawing the chart from the same figures.

Per variant and task the grid point chosen on validation accuracy (`selection`) is reported by its
test accuracy, mean and sample std over seeds; each variant is scored the LRA way, the mean of its
tasks' test means over the scored tasks (`LRA_TASKS`: every task of `lra_jax.data.tasks` but Path-X,
which is reported on its own), in the order of the paper's columns.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import defaultdict
from typing import Any

from lra_jax.data import tasks as task_registry
from lra_jax.errors import LraError
from lra_jax.research.sweeps import selection
from lra_jax.research.compilation.table2_report import REFERENCE
from lra_jax.research.reports.learning import LEARNED_MARGIN, learned_note, learned_seeds

PATH_X = ("path_x", "pathx", "path-x")  # its spellings; `task_key` makes them one


LRA_TASKS = tuple(t for t in task_registry.TASKS if t not in PATH_X)  # the tasks of the score, paper order
TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
               "pathfinder": "Pathfinder"}
SSM_REFERENCE = os.path.join(os.path.dirname(REFERENCE), "s4d_paper.json")
MODERN_REFERENCE = os.path.join(os.path.dirname(REFERENCE), "modern_papers.json")  # S5, LRU, Mega
# The state-space and modern-mixer papers' LRA tables: the results list each, the chart marks each implemented row.
MIXER_REFERENCES = (SSM_REFERENCE, MODERN_REFERENCE)
SPT_REFERENCE = os.path.join(os.path.dirname(REFERENCE), "spt_paper.json")  # the self-pretraining paper's
# Not attention: the yardstick the attention variants are measured against, drawn apart.
REFERENCE_VARIANTS = {"s4d": "the reference: a state-space model, not attention"}

def task_key(task: str) -> str:
    """Canonical task name: every spelling of Path-X becomes 'path_x'."""
    return "path_x" if task.lower() in PATH_X else task


def series_name(scale: str | None, pretrain: str = "none") -> str:
    """What a run's scores are reported under: its scale ('mini'), and for a self-pretrained run the
    objective too ('mini, SPT (masked)'), so that the two protocols are selected and scored apart."""
    scale = scale or "unknown"
    return scale if pretrain == "none" else f"{scale}, SPT ({pretrain})"


def base_scale(series: str) -> str:
    """'mini, SPT (masked)' -> 'mini'."""
    return series.split(",")[0]


def is_pretrained(series: str) -> bool:
    return series != base_scale(series)


def read_runs(runs_dir: str, scale: str | None = None) -> list[selection.Result]:
    """Every run under `runs_dir` of `scale` (`selection.load`), Path-X spellings made one; each run's scale
    is its `series_name`, so self-pretrained runs form cells of their own."""
    if not os.path.isdir(runs_dir):
        raise LraError(f"--runs={runs_dir} is not a directory")
    return [dataclasses.replace(r, task=task_key(r.task), scale=series_name(r.scale, r.pretrain))
            for r in selection.load(runs_dir, scale)]


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
    return math.sqrt(math.fsum(s * s for s in stds)) / len(stds)


def aggregate(selections: dict[tuple[str, str | None, str], selection.Selection | None]) -> dict[str, dict[str, Any]]:
    """variant -> {"accuracy": {task: test mean %}, "std": {task: sample std % or None}, "seeds": {task: n},
    "learned": {task: (seeds that learned, seeds judged) or None} (`learning.learned_seeds`),
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
            "accuracy": accuracy, "std": std, "seeds": {t: s.n for t, s in chosen.items()},
            "learned": {t: learned_seeds(s) for t, s in chosen.items()}, "chosen": chosen,
            "score": math.fsum(accuracy[t] for t in present) / len(present) if present else None,
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
    """How the scores are computed: what a cell holds and how its grid point was chosen."""
    chosen = ("where a grid was swept, each cell reports the point with the best mean validation accuracy "
              "over the seeds every point finished (see Selected grid points)" if has_grid(measured) else
              "no cell has more than one grid point, so nothing was selected")
    return ("Test accuracy (%): mean ± sample std over seeds (ddof 1; the mean alone with one seed). "
            f"Selection is on validation, never on test: {chosen}. Score = mean over ListOps, Text, Retrieval, "
            "Image, Pathfinder (Path-X separate), ± the std of a single-seed score, sqrt(Σ std²)/T. Seeds: "
            "n per task present, in column order (one number when alike). A score marked * is over the tasks "
            f"present only. {LEARNED_WORDS}")


LEARNED_WORDS = (f"A seed learned when its test accuracy is at least {100 * LEARNED_MARGIN:g} points above its test "
                 "set's majority-class rate (the rate its run records); a cell where some seeds did not says how "
                 "many did ('2/3 learned'): its mean and std are over every seed, those at chance included.")


def _speed_cells(variant: str, speeds) -> list[str]:
    """'× softmax' and 'GiB' of `variant` on one device (`chart_speeds.DeviceSpeeds`), '—' where not measured."""
    speed = speeds.speeds.get(variant)
    if speed is None:
        return ["—", "—"]
    memory = speed.memory_bytes / 2**30 if speed.memory_bytes else None
    return [_significant(speed.relative_speed), _fmt(memory, 2)]


UNCOMMITTED = "‡"  # a cell with a run made from code with uncommitted changes


def _task_cell(m: dict[str, Any], task: str) -> str:
    """A task's mean ± std, ', k/n learned' where some seeds did not learn (`learning`), marked UNCOMMITTED
    where a run behind it was made from uncommitted code."""
    chosen = m.get("chosen", {}).get(task)
    return _pm(m["accuracy"].get(task), m["std"].get(task), learned_note(m.get("learned", {}).get(task))
               + (UNCOMMITTED if chosen and chosen.uncommitted else ""))


def uncommitted_note(measured: dict[str, dict[str, Any]]) -> list[str]:
    """The footnote naming the cells marked UNCOMMITTED ([] when there are none)."""
    cells = [f"{v} {TASK_TITLES.get(t, t)}" for v, m in sorted(measured.items())
             for t, s in sorted(m.get("chosen", {}).items()) if s.uncommitted]
    return ["", f"{UNCOMMITTED} Made, in part, from code with uncommitted changes (the run's commit says "
                f"`+changes`): not reproducible from any commit. Cells: {', '.join(cells)}."] if cells else []


REFERENCE_MARK = "†"  # a row of REFERENCE_VARIANTS, explained under its table


def _variant_name(variant: str) -> str:
    return f"{variant} {REFERENCE_MARK}" if variant in REFERENCE_VARIANTS else variant


def reference_note(variants) -> list[str]:
    """The footnote naming the rows marked REFERENCE_MARK ([] when there are none)."""
    marked = [f"{v}: {REFERENCE_VARIANTS[v]}" for v in variants if v in REFERENCE_VARIANTS]
    return ["", f"{REFERENCE_MARK} {'; '.join(marked)}."] if marked else []


def table_tasks(measured: dict[str, dict[str, Any]]) -> tuple[list[str], bool]:
    """The LRA tasks that some variant of `measured` has (column order), and whether any has Path-X: a
    scale's table shows only those columns; the others are named once under it."""
    tasks = [t for t in LRA_TASKS if any(t in m["accuracy"] for m in measured.values())]
    return tasks, any(m["path_x"] is not None for m in measured.values())


def _variant_row(variant: str, m: dict[str, Any], tasks: list[str], path_x: bool) -> str:
    """One variant's row of a scale's scores table: its tasks, score, Path-X where the table has it, seeds."""
    return _row([_variant_name(variant), *(_task_cell(m, t) for t in tasks),
                 _pm(m["score"], m["score_std"], "*" if m["missing"] else ""),
                 *([_pm(m["path_x"], m["std"].get("path_x"))] if path_x else []), _seeds_cell(m)])


def _selection_row(variant: str, task: str, s: selection.Selection) -> str:
    """One (variant, task) row of the selected-grid-points table."""
    val = "; ".join(f"{short_point(p)}: {100 * v:.2f}" for p, v in s.candidates.items())
    if s.diverged:
        val += "; diverged: " + ", ".join(map(short_point, s.diverged))
    compared = ", ".join(map(str, s.compared_on)) or "none common: each point on its own"
    return _row([variant, TASK_TITLES.get(task, task), short_point(s.point), val, compared,
                 ", ".join(map(str, s.seeds)), _pm(100 * s.test_mean, None if s.test_std is None
                                                    else 100 * s.test_std)])


def selected_points(measured: dict[str, dict[str, Any]], order: list[str], scale: str) -> list[str]:
    """The "Selected grid points" section of a scale: every cell run in a grid; [] when no cell chose among points."""
    if not has_grid(measured):
        return []
    lines = ["", f"## Selected grid points ({scale} scale)", "",
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


def ranked_and_apart(measured: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The variants of one scale split in two: those scored on every task that some variant ran, best score
    first (the ranking), and the rest, most tasks then best score first. A mean over fewer tasks is a
    different quantity (one easy task alone can top every full score), so it is listed apart, never ranked."""
    tasks = set(table_tasks(measured)[0])
    ran = {v: len(tasks & set(m["accuracy"])) for v, m in measured.items()}
    order = sorted(measured, key=lambda v: (-ran[v], -(measured[v]["score"] or -1)))
    return [v for v in order if ran[v] == len(tasks)], [v for v in order if ran[v] < len(tasks)]


def score_order(measured: dict[str, dict[str, Any]]) -> list[str]:
    """The variants of one scale: the ranked ones best score first, then those scored on fewer tasks."""
    ranked, apart = ranked_and_apart(measured)
    return ranked + apart


def scale_table(scale: str, measured: dict[str, dict[str, Any]]) -> list[str]:
    """One scale's scores table, best score first: the tasks some variant ran, the score, Path-X where any
    variant ran it, the seeds; the tasks no variant ran are named under it."""
    tasks, path_x = table_tasks(measured)
    lines = ["", f"## Scale: {scale}", "",
             *_header(["Variant", *(TASK_TITLES[t] for t in tasks), "Score", *(["Path-X"] if path_x else []),
                       "Seeds"])]
    ranked, apart = ranked_and_apart(measured)
    order = ranked + apart
    lines += [_variant_row(v, measured[v], tasks, path_x) for v in ranked]
    if apart:
        lines += ["", "Scored on fewer tasks than the rows above, so not ranked with them (a mean over other "
                  "tasks compares nothing):", "",
                  *_header(["Variant", *(TASK_TITLES[t] for t in tasks), "Score*", *(["Path-X"] if path_x else []),
                            "Seeds"]),
                  *(_variant_row(v, measured[v], tasks, path_x) for v in apart)]
    absent = [TASK_TITLES[t] for t in LRA_TASKS if t not in tasks] + ([] if path_x else ["Path-X"])
    if absent:
        lines += ["", f"Not scored at this scale: {', '.join(absent)}." + (
            " A score marked * is over the tasks a variant ran." if any(measured[v]["missing"] for v in order) else "")]
    lines += reference_note(order)
    lines += uncommitted_note(measured)
    return lines


def speed_table(scores: dict[str, dict[str, dict[str, Any]]], devices: list) -> list[str]:
    """Every scored variant's speed and memory on each device (`chart_speeds.DeviceSpeeds`), in the score
    order of the first scale; where each figure comes from is in `speed_sources`."""
    if not devices:
        return []
    scales = sorted(scores, key=lambda s: (s != "full", s))
    order = list(dict.fromkeys(v for s in scales for v in score_order(scores[s])))
    heads = [h for d in devices for h in (f"× softmax @{d.length} ({d.device})",
                                          f"{d.memory_short} @{d.length} ({d.device})")]
    lines = ["", "## Speed and memory", "",
             "The train step of each variant (the LRA paper's Table 2 protocol), relative to softmax on the same "
             "device; the rows in the score order above. Where each figure comes from: the sections per device "
             "below.", "", *_header(["Variant", *heads])]
    lines += [_row([_variant_name(v), *(cell for d in devices for cell in _speed_cells(v, d))]) for v in order]
    for d in devices:
        absent = [v for v in order if v not in d.speeds]
        if absent:
            lines += ["", f"Not measured on {d.device} at length {d.length}: {', '.join(absent)}."]
    return lines


def full_scale_against_paper(measured: dict[str, dict[str, Any]], reference: dict[str, Any] | None) -> list[str]:
    """Per task: our full-scale test accuracy beside the paper's Table 1 figure for the same variant, the
    difference, the seeds, the device and the precision the runs trained in, and their speed there."""
    papers = {m["variant"]: m for m in (reference or {}).get("models", [])}
    lines = ["", "## Full scale against the LRA paper", "",
             "Test accuracy (%) of our full-scale runs (the paper's recipe), mean ± std over seeds, beside the "
             "paper's Table 1; difference = ours - paper. Steps/s: training on the device named, as results.json "
             "records it."]
    for task in [t for t in (*LRA_TASKS, "path_x") if any(t in m["accuracy"] for m in measured.values())]:
        lines += ["", f"### {TASK_TITLES.get(task, task)}", "",
                  *_header(["Variant", "Ours", "Paper", "Difference", "Seeds", "Device", "Precision", "Steps/s"])]
        seeds = set()
        for variant in sorted(measured, key=lambda v: (v != "softmax", v)):
            m = measured[variant]
            if task not in m["accuracy"]:
                continue
            ours, theirs, chosen = m["accuracy"][task], papers.get(variant, {}).get("accuracy", {}).get(task), \
                m["chosen"][task]
            seeds.add(chosen.n)
            lines.append(_row([variant, _pm(ours, m["std"].get(task)), theirs if isinstance(theirs, str) else _fmt(theirs, 2),
                               _fmt(ours - theirs, 2) if isinstance(theirs, float) else "—", str(chosen.n),
                               ", ".join(chosen.devices) or "—", ", ".join(chosen.dtypes) or "—",
                               _fmt(chosen.steps_per_second, 2)]))
        if seeds == {1}:
            lines += ["", f"{TASK_TITLES.get(task, task)} is scored at full scale on one seed: no spread is known."]
    return lines


def _softmax_from(s) -> str:
    """Where the softmax a `chart_speeds.Speed` divides by was measured, in words."""
    if not s.same_file:
        return f"{s.baseline_source} (nearest in date: its file has no softmax step as impl=auto runs it)"
    return "the same command" if s.same_command else "the same file, another command (`--update`, at another time)"


def speed_sources(devices: list) -> list[str]:
    """Per device, every variant's measured examples/s and the softmax its ratio divides by (one table), its
    memory and the bench JSON it was read from (another), as `chart_speeds.device_speeds` found them."""
    lines = []
    for d in devices:
        ordered = sorted(d.speeds.items(), key=lambda kv: -kv[1].relative_speed)
        lines += ["", f"## Speed and memory on {d.device}", "",
                  f"Train step at length {d.length}, batch {d.batch_size}, dropout {d.dropout_rate:g}, as "
                  "`impl=auto` runs it (`python -m lra_jax.tools.bench`); where several files measured a variant, "
                  "the most recent. × softmax divides by the softmax of the variant's own file, measured by the "
                  "same command (at one time, with the same kernel code) unless the file merged several commands "
                  "(`--update`), as Softmax from says; a file with no softmax step as `impl=auto` runs it "
                  "borrows the one of the file nearest in date, named here. Memory: a measured device peak, or XLA's compiled "
                  "estimate of the step (the compiler's buffer plan, not a measurement), as the Memory column says; "
                  "a ratio divides two figures of the same kind.", "",
                  *_header(["Variant", "examples/s", "× softmax", "Softmax's examples/s", "Softmax from"])]
        lines += [_row([variant, _significant(s.examples_per_second), _significant(s.relative_speed),
                        _significant(s.baseline_examples_per_second),
                        _softmax_from(s)]) for variant, s in ordered]
        lines += ["", *_header(["Variant", "GiB", "Memory", "× softmax's memory", "File"])]
        lines += [_row([variant, _fmt(s.memory_bytes / 2**30 if s.memory_bytes else None, 2),
                        {"device": "measured peak", "xla": "XLA estimate"}.get(s.memory_kind, "—"),
                        _significant(s.relative_memory), s.source]) for variant, s in ordered]
    return lines


def published_lra(reference: dict[str, Any]) -> list[str]:
    """The LRA paper's Table 1 accuracies and, apart, its Table 2 speed and memory at 4K."""
    lines = ["", "## Published (LRA paper)", "", reference["paper"] + ".", "",
             *_header(["Model (variant)", *(TASK_TITLES[t] for t in LRA_TASKS), "Avg"])]
    for r in reference["models"]:
        acc = r["accuracy"]
        lines.append(_row([f"{r['paper_name']} ({r['variant']})", *(_fmt(acc[t], 2) for t in LRA_TASKS),
                           _fmt(r["avg"], 2)]))
    lines += ["", *_header(["Model (variant)", "Speed @4K (×)", "Memory @4K (GB)"])]
    lines += [_row([f"{r['paper_name']} ({r['variant']})", _fmt(r.get("relative_speed_4k"), 1),
                    _fmt(r.get("memory_4k_gb"), 2)]) for r in reference["models"]]
    return lines + ["", "Sources: " + " ".join(reference.get("source", {}).values())]


def papers(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The papers of a published-figures file: its "papers" (modern_papers.json), or the file itself, one
    paper (s4d_paper.json)."""
    return list(document["papers"]) if "papers" in document else [document]


S4D_AVERAGES = ("Avg (5) is the LRA score above (Path-X apart); Avg (6) is the paper's own, with a failed Path-X "
                "counted as 50.")  # what a paper's "averages" says, for s4d_paper.json, which has none


def published_paper(reference: dict[str, Any]) -> list[str]:
    """One paper's LRA table (a paper of `papers`) with both averages, its sources and notes; the paper whose
    implemented row is a REFERENCE_VARIANTS row (S4D) is named the state-space yardstick."""
    implemented = {m["variant"] for m in reference["models"] if m.get("variant")}
    role = ": the state-space yardstick, not attention" if implemented & set(REFERENCE_VARIANTS) else ""
    page = reference.get("page")
    where = ", ".join(filter(None, [reference.get("table"), f"p. {page}" if page else None]))
    lines = ["", f"## Published ({reference.get('name', 'S4D')} paper){role}", "",
             f"{reference['paper']}{f' ({where})' if where else ''}. {reference.get('averages', S4D_AVERAGES)}", "",
             *_header(["Model (variant)", *(TASK_TITLES[t] for t in LRA_TASKS), "Path-X", "Avg (5)", "Avg (6)"])]
    for r in reference["models"]:
        acc = r["accuracy"]
        path_x = acc["path_x"] if isinstance(acc["path_x"], str) else _fmt(acc["path_x"], 2)
        name = f"{r['paper_name']} ({r['variant']})" if r["variant"] else r["paper_name"]
        lines.append(_row([name, *(_fmt(acc[t], 2) for t in LRA_TASKS), path_x, _fmt(r["avg5"], 2),
                           _fmt(r["avg6"], 2)]))
    lines += ["", "Sources: " + " ".join(reference.get("source", {}).values())]
    return lines + (["", "Notes: " + " ".join(reference["notes"])] if reference.get("notes") else [])


def published_mixers(documents: list[dict[str, Any]]) -> list[str]:
    """Every paper's LRA table of `documents` (the MIXER_REFERENCES read), and, per file, the implemented
    mixers whose papers report no LRA run."""
    lines = []
    for document in documents:
        lines += [line for paper in papers(document) for line in published_paper(paper)]
        absent = document.get("no_lra_run", [])
        if absent:
            lines += ["", "Implemented, with no LRA run in their papers (so nothing to list): "
                      + "; ".join(f"{a['variant']} ({a['paper']})" for a in absent) + "."]
    return lines


def markdown_table(scores: dict[str, dict[str, dict[str, Any]]], main, cpu, reference: dict[str, Any] | None,
                   note: str = "", mixer_references: list[dict[str, Any]] = (), header: str = "",
                   pretraining: list[str] = (), spt_reference: dict[str, Any] | None = None) -> str:
    """The results first: per scale, every variant's per-task accuracy, score, Path-X and seeds, best score
    first; then every variant's speed and memory on each device (`chart_speeds.DeviceSpeeds`: the main
    panel's, the CPU's); how the scores are computed; the self-pretraining sections (`pretraining`, from
    `spt_report.gain_table`, followed by `spt_reference`'s published figures where there are any);
    full-scale scores beside the paper's; where each speed comes from; the grid points chosen; the published
    figures (the LRA paper's, then every state-space and modern-mixer paper of `mixer_references`, the
    MIXER_REFERENCES files read); last, `header`: how the file was made."""
    lines = ["# LRA results"]
    devices = [d for d in (main, cpu) if d is not None]
    ordered = sorted(scores, key=lambda s: (s != "full", s))
    for scale in ordered:
        lines += scale_table(scale, scores[scale])
    lines += speed_table(scores, devices)
    lines += ["", "## How the scores are computed", "",
              _table_caption({v: m for s in scores.values() for v, m in s.items()})]
    for part in note.splitlines():
        lines += ["", part]
    lines += pretraining
    if pretraining and spt_reference:
        lines += published_spt(spt_reference)
    if "full" in scores:
        lines += full_scale_against_paper(scores["full"], reference)
    lines += speed_sources(devices)
    for scale in ordered:
        lines += selected_points(scores[scale], score_order(scores[scale]), scale)
    if reference:
        lines += published_lra(reference)
    lines += published_mixers(list(mixer_references))
    if header:
        lines += ["", "## How this file was made", "", header]
    return "\n".join(lines) + "\n"

def published_spt(reference: dict[str, Any]) -> list[str]:
    """The self-pretraining paper's figures (experiments/reference/spt_paper.json), as its text states them."""
    lines = ["", "## Published (self-pretraining paper)", "", reference["paper"] + ".", "",
             *_header(["Model", "Training", "Over", "Accuracy (%) or gain (points)", "Where"])]
    lines += [_row([f["model"], f["training"], f["over"], f["figure"], f["where"]]) for f in reference["figures"]]
    return lines + ["", "Sources: " + " ".join(reference.get("source", {}).values())]


def unfinished_note(selections: dict, min_seeds: int) -> str:
    """One line naming the cells whose chosen point has fewer than `min_seeds` seeds ("" if none)."""
    short = [f"{variant} {task} (n={s.n})" for (task, _, variant), s in selections.items()
             if s is not None and s.n < min_seeds]
    return f"Left out, fewer than {min_seeds} seeds at the chosen point: {', '.join(short)}." if short else ""


def implemented_rows(documents: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """variant -> (paper, its published row), for every row of `documents` (the MIXER_REFERENCES read) whose
    `variant` names the registered variant this framework implements; the first file's row where two name one."""
    rows = {}
    for document in documents:
        for paper in papers(document):
            for model in paper["models"]:
                if model.get("variant"):
                    rows.setdefault(model["variant"], (paper, model))
    return rows
