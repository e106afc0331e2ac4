"""What a sweep prints (the library of `python -m lra_jax.tools.sweep`): the plan (`plan_lines`), the
projected training time of its runs from `train --estimate` (`estimate_runs`, `estimate_table`), the
summary of a sweep that ran (`summary_table`), the grid point chosen per cell on validation accuracy
(`selection_table`) and, with `--pretrain=none,spt`, each (variant, task) from scratch beside
self-pretrained (`pretraining_table`).
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections import Counter
from collections.abc import Callable

from lra_jax.research.sweeps import selection
from lra_jax.research.progress import print_now
from lra_jax.research.sweeps.sweep_plan import FINAL, REPO, Run, shape_key
from lra_jax.measure.text_table import table


def estimate_runs(runs: list[Run], capture: Callable[[list[str], str], tuple[int, str]],
                  log: Callable[[str], None] = print_now, cwd: str = REPO) -> list[dict]:
    """`train --estimate` once per distinct shape of the unfinished runs; one row per run (its JSON, or
    status "failed")."""
    rows, measured = [], {}
    for i, r in enumerate(runs, 1):
        if r.state() in FINAL:
            continue
        key = shape_key(r)
        if key not in measured:
            code, output = capture([*r.command, "--estimate", "--json"], cwd)
            lines = output.strip().splitlines()
            try:
                measured[key] = {"status": "ok", **json.loads(lines[-1])}
            except (IndexError, json.JSONDecodeError):
                measured[key] = {"status": "failed", "error": f"exit status {code}: "
                                 + (lines[-1] if lines else "no output")}
        row = {"run": r.name, **measured[key]}
        pretrain_steps = ((r.config or {}).get("pretrain") or {}).get("num_steps", 0) if r.pretrain == "spt" else 0
        if pretrain_steps and row["status"] == "ok":
            # modeled: a pretraining step is timed as the fine-tuning step (its head is a token head)
            row = {**row, "pretrain_steps": pretrain_steps,
                   "projected_pretrain_seconds": row["seconds_per_step"] * pretrain_steps}
        rows.append(row)
        log(f"[{i}/{len(runs)}] {r.name}: " + (f"{row['projected_train_seconds'] / 60:.1f} min projected"
                                               if row["status"] == "ok" else row["error"]))
    return rows


def capture_output(command: list[str], cwd: str) -> tuple[int, str]:
    """Runs `command`; returns its exit status and its stdout (stderr passes through)."""
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, text=True, check=False)
    return done.returncode, done.stdout


def estimate_table(rows: list[dict], parallel: int = 1) -> str:
    """Per run: seconds per step, steps and projected minutes; then the total per task and overall."""
    cells = []
    per_task: dict[str, float] = {}
    pretraining = 0.0
    for r in rows:
        if r["status"] != "ok":
            cells.append((r["run"], f"failed: {r['error']}"))
            continue
        if r.get("pretrain_steps"):
            pretraining += r["projected_pretrain_seconds"] / 60
            cells.append((r["run"] + " (pretraining)", f"{r['seconds_per_step']:.3f}", f"{r['pretrain_steps']:,}",
                          f"{r['projected_pretrain_seconds'] / 60:,.1f}"))
        minutes = r["projected_train_seconds"] / 60
        per_task[r["run"].split("/")[0]] = per_task.get(r["run"].split("/")[0], 0.0) + minutes
        cells.append((r["run"], f"{r['seconds_per_step']:.3f}", f"{r['num_train_steps']:,}", f"{minutes:,.1f}"))
    lines = [table(("run", "s/step", "steps", "minutes"), cells, align="lrrr")]
    lines += [f"{task}: {minutes:,.0f} min" for task, minutes in per_task.items()]
    if pretraining:
        lines.append(f"pretraining: {pretraining:,.0f} min, modeled (each pretraining step timed as its run's "
                     "fine-tuning step)")
    total = sum(per_task.values()) + pretraining
    failed = sum(r["status"] != "ok" for r in rows)
    lines.append(f"total: {total:,.0f} min of training ({total / 60:,.1f} h) in one process at a time"
                 + (f", about {total / parallel / 60:,.1f} h of wall time with --parallel={parallel}"
                    if parallel > 1 else "")
                 + (f"; {failed} runs failed to compile or run and are not counted" if failed else ""))
    return "\n".join(lines)


def plan_lines(runs: list[Run], now: list[Run]) -> list[str]:
    """`sweep --dry_run`: per run planned now, its state, name and train command as a shell line; then
    the totals: the grid's runs as a product of its axes, and how many are finished and how many to run."""
    states = [r.state() for r in now]
    lines = [f"{state:<8} {r.name:<48} {r.shell_command()}" for r, state in zip(now, states)]
    axes = [("variant", {r.variant for r in runs}), ("task", {r.task for r in runs}),
            ("scale", {r.scale for r in runs}), ("pretraining arm", {r.pretrain for r in runs}),
            ("grid point", {r.point for r in runs}), ("seed", {r.seed for r in runs})]
    product = " x ".join(f"{len(values)} {name}{'s' if len(values) != 1 else ''}" for name, values in axes
                         if name != "pretraining arm" or len(values) > 1)
    count = Counter(states)
    finished = ", ".join(f"{count[s]} {s}" for s in (*FINAL, "damaged") if count[s] or s == "done")
    totals = (f"total: {len(runs)} runs ({product}): {finished}; {count['resume'] + count['new']} to run "
              f"({count['resume']} to resume from their checkpoints, {count['new']} new)")
    if len(now) < len(runs):
        totals += (f"; {len(runs) - len(now)} not planned now (with two_stage a cell's other seeds run only at "
                   "the grid point its first seed chooses)")
    return [*lines, totals, f"(run the commands from {REPO}: their config paths start there)"]


def summary_table(summary: list[dict]) -> str:
    width = max([len(s["run"]) for s in summary] + [3])
    lines = [f"{'run':<{width}}  {'status':<12} {'time':>8}  note"]
    for s in summary:
        note = s.get("error", "") if s["status"] in ("failed", "crashed", "interrupted", "stale", "diverged") else s["workdir"]
        lines.append(f"{s['run']:<{width}}  {s['status']:<12} {s['seconds']:>7.0f}s  {note}")
    counts = {k: sum(s["status"] == k for s in summary) for k in dict.fromkeys(s["status"] for s in summary)}
    hours = sum(s["seconds"] for s in summary) / 3600
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items())
                 + f"; runs took {hours:.2f} h in all (the sum over runs)")
    return "\n".join(lines)


def selection_table(runs: list[Run]) -> str:
    """Per cell with more than one grid point: the chosen point, the validation means it was chosen
    on, and its test accuracy as mean +- std over seeds (%)."""
    lines = []
    for cell, group in itertools.groupby(runs, key=lambda r: r.cell):
        group = list(group)
        if len({r.point for r in group}) < 2:
            continue
        finished = [res for r in group if (res := r.result()) is not None]
        chosen = selection.select(finished)
        if chosen is None:
            if finished:
                lines.append(f"{cell}: nothing to report, every grid point diverged")
            continue
        val = ", ".join(f"{p} {100 * v:.1f}" for p, v in chosen.candidates.items())
        std = f" ± {100 * chosen.test_std:.2f}" if chosen.test_std is not None else ""
        lines.append(f"{cell}: {chosen.point}  test {100 * chosen.test_mean:.2f}{std} (n={chosen.n}); "
                     f"val on seeds {','.join(map(str, chosen.compared_on)) or 'own'}: {val}"
                     + (f"; diverged: {', '.join(chosen.diverged)}" if chosen.diverged else ""))
    return "\n".join(["selected on validation accuracy, never test:", *lines]) if lines else ""


def pretraining_table(runs: list[Run]) -> str:
    """Per (task, variant) with both: test accuracy from scratch and self-pretrained, each at the grid
    point chosen on validation (mean ± std over seeds, %), the gain, and the pretraining compute (steps
    and the mean measured seconds of the stage, reported apart from the equal fine-tuning budget)."""
    chosen: dict[tuple[str, str], dict[str, selection.Selection]] = {}
    seconds: dict[tuple[str, str], list[float]] = {}
    steps: dict[tuple[str, str], int] = {}
    for r in runs:
        key = (f"{r.task}-{r.scale}", r.variant)
        if r.pretrain == "spt" and (record := (r.results() or {}).get("pretrain")):
            seconds.setdefault(key, []).append(record.get("seconds") or float("nan"))
            steps[key] = record.get("num_steps", 0)
    for cell, group in itertools.groupby(runs, key=lambda r: r.cell):
        group = list(group)
        picked = selection.select([res for r in group if (res := r.result()) is not None])
        if picked is not None:
            chosen.setdefault((f"{group[0].task}-{group[0].scale}", group[0].variant), {})[group[0].pretrain] = picked

    def fmt(s: selection.Selection) -> str:
        return f"{100 * s.test_mean:.2f}" + (f" ± {100 * s.test_std:.2f}" if s.test_std is not None else "")

    lines = []
    for key, both in chosen.items():
        if {"none", "spt"} <= both.keys():
            scratch, spt = both["none"], both["spt"]
            cost = (f"{steps.get(key, 0)} steps, {sum(seconds[key]) / len(seconds[key]):.0f} s a run"
                    if seconds.get(key) else "n/a")
            lines.append(f"{key[0]} {key[1]}: scratch {fmt(scratch)} (n={scratch.n}), SPT {fmt(spt)} (n={spt.n}), "
                         f"gain {100 * (spt.test_mean - scratch.test_mean):+.2f}; pretraining {cost}")
    return "\n".join(["from scratch vs self-pretrained (test %, chosen on validation; same fine-tuning budget):",
                      *lines]) if lines else ""
