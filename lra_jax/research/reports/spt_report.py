"""Self-pretrained against from scratch, from the chart's scores: the gain table and what it says.

Both arms run at the same scale, each (variant, task) at its own grid point chosen on validation, with the
same fine-tuning budget (docs/self-pretraining.md). A variant is compared task by task on the tasks both
arms scored. Its score gain, and its arrow on the chart, exist only where both arms scored the same tasks
(`same_tasks`): a mean over other tasks is never set against it.

What the table says (`findings`) is computed here, never typed: per task, how many variants gain or lose
by a stated test, Welch's two-sided t-test on the seeds of the two arms (`welch`: unequal variances, the
Welch-Satterthwaite degrees of freedom), with the p-values Holm-corrected over the variants compared on
that task (`holm`) and a gain or loss called only where the corrected p is below `ALPHA`; how far softmax
is from S4D in each arm; how much the order of the attention variants agrees between the arms (Kendall's
tau-b); and which variants are Pareto-optimal in speed and accuracy in each arm. The table shows every raw
and Holm-adjusted p-value (`welch_table`).
"""

from __future__ import annotations

import math
from typing import Any

from lra_jax.research.reports import recipes, seed_statistics
from lra_jax.research.reports.lra_results import (
    LRA_TASKS,
    REFERENCE_VARIANTS,
    TASK_TITLES,
    UNCOMMITTED,
    _header,
    _row,
    base_scale,
    is_pretrained,
    uncommitted_note,
)
from lra_jax.research.reports.seed_statistics import ALPHA, Welch, holm, kendall_tau, p_text

Scores = dict[str, dict[str, dict[str, Any]]]  # series -> variant -> `lra_results.aggregate` entry
BASELINE, SSM = "softmax", "s4d"


def lra_tasks(m: dict[str, Any]) -> list[str]:
    """The LRA tasks a variant's entry has, in the paper's order."""
    return [t for t in LRA_TASKS if t in m["accuracy"]]


def same_tasks(spt: dict[str, Any], scratch: dict[str, Any]) -> bool:
    """Whether both arms of a variant are scored on the same tasks, so their scores can be compared."""
    return lra_tasks(spt) == lra_tasks(scratch)


def arms(scores: Scores) -> list[tuple[str, dict[str, dict[str, Any]], dict[str, dict[str, Any]]]]:
    """(series, its variants self-pretrained, the same scale's variants from scratch), per pretrained series
    whose scale also has runs from scratch."""
    return [(s, scores[s], scores[base_scale(s)]) for s in sorted(scores)
            if is_pretrained(s) and base_scale(s) in scores]


def _titles(tasks: list[str]) -> str:
    return " + ".join(TASK_TITLES[t] for t in tasks) or "no LRA task"


def unmatched_note(scores: Scores) -> str:
    """One line naming the variants whose self-pretrained score is not drawn, scored on other tasks than
    from scratch, grouped by the two task sets ("" if none)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for _, spt, scratch in arms(scores):
        for v in sorted(set(spt) & set(scratch)):
            if not same_tasks(spt[v], scratch[v]):
                groups.setdefault((_titles(lra_tasks(spt[v])), _titles(lra_tasks(scratch[v]))), []).append(v)
    return "".join(f"Self-pretrained scores not drawn until both arms are scored on the same tasks (SPT: {a}; "
                   f"from scratch: {b}; per-task gains in the table): {', '.join(vs)}. "
                   for (a, b), vs in groups.items()).strip()


def source_note(runs: str, spt_scores: Scores, headline: Scores) -> str:
    """What a comparison drawn from runs of its own (`runs`, the chart's --spt_runs) says of its source: both
    arms from those runs, and each task whose recipe there is not the headline's from-scratch one
    (`recipes.difference_note`), so that no reader sets its arms against the headline's scores."""
    differences = [recipes.difference_note(spt_scores[s], headline[s], TASK_TITLES)
                   for s in sorted(spt_scores) if not is_pretrained(s) and s in headline]
    return " ".join(filter(None, [f"Both arms of the self-pretraining comparison are the runs under {runs}.",
                                  *differences]))


def _gain(after: float | None, before: float | None, std_after: float | None, std_before: float | None) -> str:
    if after is None or before is None:
        return "—"
    spread = None if std_after is None or std_before is None else math.sqrt(std_after ** 2 + std_before ** 2)
    return f"{after - before:+.2f}" + ("" if spread is None else f" ± {spread:.2f}")


def gain_table(scores: Scores, main=None, source: str = "") -> list[str]:
    """Per self-pretrained series, each variant's gain over the same variant from scratch at the same scale:
    per task and on the score, SPT mean - scratch mean (test accuracy, %), ± the std of a single-seed
    difference of independent runs, sqrt(std_spt² + std_scratch²) (none where either has one seed); then
    its `findings`, with the speeds of `main` (`chart_speeds.DeviceSpeeds`, or None). `source`
    (`source_note`), where the comparison has runs of its own, leads each section."""
    speed = {v: s.relative_speed for v, s in main.speeds.items()} if main else None
    lines = []
    for series, spt, scratch in arms(scores):
        both = sorted(set(spt) & set(scratch))
        tasks = [t for t in LRA_TASKS if any(t in spt[v]["accuracy"] and t in scratch[v]["accuracy"] for v in both)]
        lines += ["", f"## Self-pretraining gain ({series} against {base_scale(series)} from scratch)", "",
                  "Test accuracy (%) with self-pretraining minus from scratch, each at its own grid point chosen on "
                  "validation, the same fine-tuning budget: mean ± sqrt(std_spt² + std_scratch²), the spread of "
                  "one seed's difference. Score: only where both arms are scored on the same tasks."
                  + (f" {source}" if source else ""), "",
                  *_header(["Variant", *(TASK_TITLES[t] for t in tasks), "Score"])]
        for v in both:
            cells = [_gain(spt[v]["accuracy"].get(t), scratch[v]["accuracy"].get(t), spt[v]["std"].get(t),
                           scratch[v]["std"].get(t)) + (UNCOMMITTED if any(
                               (arm[v]["chosen"].get(t) and arm[v]["chosen"][t].uncommitted) for arm in (spt, scratch))
                           else "") for t in tasks]
            cells.append(_gain(spt[v]["score"], scratch[v]["score"], spt[v]["score_std"], scratch[v]["score_std"])
                         if same_tasks(spt[v], scratch[v]) else "—")
            lines.append(_row([v, *cells]))
        lines += uncommitted_note({f"{v} ({arm})": m for arm, group in (("SPT", spt), ("from scratch", scratch))
                                   for v, m in group.items() if v in both})
        lines += welch_table(spt, scratch, tasks)
        lines += findings(spt, scratch, speed, main.device if main else "")
        lines += pretraining_compute(spt, tasks)
    return lines


def pretraining_compute(spt: dict[str, dict[str, Any]], tasks: list[str]) -> list[str]:
    """The pretraining stage per variant and task, apart from fine-tuning: its steps, the mean seconds per run
    and the mean final training loss at the chosen grid point (`selection.Selection`)."""
    def cell(s) -> str:
        if s is None or not s.pretrain_steps:
            return "—"
        return ", ".join([f"{s.pretrain_steps} steps",
                          *([] if s.pretrain_seconds is None else [f"{s.pretrain_seconds:.0f} s"]),
                          *([] if s.pretrain_loss is None else [f"loss {s.pretrain_loss:.2f}"])])

    return ["", "Pretraining compute at the chosen grid point, apart from fine-tuning (whose budget is the same "
                "as from scratch): steps, wall seconds per run as each run recorded them (its device is in its "
                "results.json), and the objective's training loss at the end of the stage (nats per chosen "
                "token, the last logged window): how far pretraining got.", "",
            *_header(["Variant", *(TASK_TITLES[t] for t in tasks)]),
            *(_row([v, *(cell(spt[v]["chosen"].get(t)) for t in tasks)]) for v in sorted(spt))]


def welch(spt: dict[str, Any], scratch: dict[str, Any], task: str) -> Welch | None:
    """Welch's two-sided t-test of SPT against scratch on one task, on the seeds of the two arms
    (`seed_statistics.welch`: difference in percentage points; None where an arm cannot be tested)."""
    spt_arm, scratch_arm = ((m["accuracy"][task], m["std"].get(task), m["seeds"].get(task, 0)) for m in (spt, scratch))
    return seed_statistics.welch(spt_arm, scratch_arm)


def task_tests(spt: dict[str, dict[str, Any]], scratch: dict[str, dict[str, Any]], task: str,
               variants: list[str]) -> dict[str, tuple[Welch | None, float | None, str]]:
    """variant -> (its `welch` test on `task`, its Holm-adjusted p over the tested `variants`, verdict):
    'gain' or 'loss' where the adjusted p < ALPHA, 'noise' where not, 'untested' where `welch` is None."""
    tests = {v: welch(spt[v], scratch[v], task) for v in variants}
    adjusted = holm({v: w.p for v, w in tests.items() if w is not None})
    out = {}
    for v, w in tests.items():
        if w is None:
            out[v] = (None, None, "untested")
        else:
            clear = adjusted[v] < ALPHA
            out[v] = (w, adjusted[v], "noise" if not clear else "gain" if w.difference > 0 else "loss")
    return out


def verdict(spt: dict[str, Any], scratch: dict[str, Any], task: str) -> str:
    """'gain', 'loss', 'noise' or 'untested' for one comparison on its own (no correction: a family of one)."""
    return task_tests({"v": spt}, {"v": scratch}, task, ["v"])["v"][2]


def welch_table(spt: dict[str, dict[str, Any]], scratch: dict[str, dict[str, Any]], tasks: list[str]) -> list[str]:
    """Per variant and task: Welch's t (df), its two-sided p, the Holm-adjusted p over the task's variants,
    and the verdict at ALPHA."""
    both = sorted(set(spt) & set(scratch))
    per_task = {t: task_tests(spt, scratch, t, [v for v in both if t in spt[v]["accuracy"]
                                                 and t in scratch[v]["accuracy"]]) for t in tasks}

    def cell(v: str, t: str) -> str:
        if v not in per_task[t]:
            return "—"
        w, adjusted, said = per_task[t][v]
        if w is None:
            return "untested (an arm has one seed or no spread)"
        return f"t {w.t:+.2f} (df {w.df:.1f}), p {p_text(w.p)}, Holm {p_text(adjusted)}: {said}"

    return ["", f"Welch's two-sided t-test of SPT against scratch on the seeds of each arm (unequal variances, "
                f"Welch-Satterthwaite df), per task; Holm-adjusted over the variants compared on that task; a "
                f"gain or loss is claimed only where the adjusted p < {ALPHA:g}.", "",
            *_header(["Variant", *(TASK_TITLES[t] for t in tasks)]),
            *(_row([v, *(cell(v, t) for t in tasks)]) for v in both)]


def pareto(speed: dict[str, float], accuracy: dict[str, float]) -> list[str]:
    """The variants no other variant beats in both speed and accuracy (at least as good in both, better in
    one), fastest first."""
    front = [v for v in accuracy
             if not any(speed[u] >= speed[v] and accuracy[u] >= accuracy[v]
                        and (speed[u] > speed[v] or accuracy[u] > accuracy[v]) for u in accuracy if u != v)]
    return sorted(front, key=lambda v: -speed[v])


def _top(accuracy: dict[str, float], k: int = 3) -> str:
    return ", ".join(sorted(accuracy, key=lambda v: -accuracy[v])[:k])


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def findings(spt: dict[str, dict[str, Any]], scratch: dict[str, dict[str, Any]],
             speed: dict[str, float] | None = None, device: str = "") -> list[str]:
    """What the gain table says, per task both arms scored: the count of clear gains and losses (`task_tests`:
    Welch, Holm-corrected), the mean gain, softmax's distance from S4D in each arm, the agreement of the attention variants' order, and
    (given `speed`, variant -> speed relative to softmax on `device`) the Pareto-optimal variants."""
    lines = ["", "What it says, per task (computed from the cells above): a gain or loss is clear when Welch's "
                 f"two-sided t-test on the seeds, Holm-corrected over the variants compared on the task, gives "
                 f"p < {ALPHA:g}; rank agreement is Kendall's tau-b over the attention variants (S4D out) between "
                 "the two arms.", ""]
    for task in LRA_TASKS:
        both = sorted(v for v in set(spt) & set(scratch) if task in spt[v]["accuracy"] and task in scratch[v]["accuracy"])
        if not both:
            continue
        verdicts = {v: said for v, (_, _, said) in task_tests(spt, scratch, task, both).items()}
        gains = {v: spt[v]["accuracy"][task] - scratch[v]["accuracy"][task] for v in both}
        low, high = min(gains, key=gains.get), max(gains, key=gains.get)
        counts = {k: sum(1 for x in verdicts.values() if x == k) for k in ("gain", "loss", "noise", "untested")}
        parts = [f"{len(both)} variants compared: {_count(counts['gain'], 'clear gain', 'clear gains')}, "
                 f"{_count(counts['loss'], 'clear loss', 'clear losses')}, "
                 f"{counts['noise']} within noise"
                 + (f", {counts['untested']} untested (one seed or no spread)" if counts["untested"] else "")
                 + f" (Holm, p < {ALPHA:g}); mean gain {math.fsum(gains.values()) / len(gains):+.2f} "
                 f"({low} {gains[low]:+.2f} to {high} {gains[high]:+.2f})"]
        if BASELINE in both and SSM in both:
            gap = [arm[SSM]["accuracy"][task] - arm[BASELINE]["accuracy"][task] for arm in (scratch, spt)]
            parts.append(f"S4D minus softmax {gap[0]:+.2f} from scratch, {gap[1]:+.2f} with SPT")
        attention = [v for v in both if v not in REFERENCE_VARIANTS]
        before = {v: scratch[v]["accuracy"][task] for v in attention}
        after = {v: spt[v]["accuracy"][task] for v in attention}
        tau = kendall_tau([before[v] for v in attention], [after[v] for v in attention])
        if tau is not None:
            parts.append(f"rank agreement {tau:.2f} over {len(attention)} attention variants; best three from "
                         f"scratch: {_top(before)}; with SPT: {_top(after)}")
        if speed:
            timed = [v for v in attention if v in speed]
            if timed:
                parts.append(f"fastest for their accuracy on {device or 'the main device'} (Pareto) from scratch: "
                             f"{', '.join(pareto(speed, {v: before[v] for v in timed}))}; with SPT: "
                             f"{', '.join(pareto(speed, {v: after[v] for v in timed}))}")
        lines.append(f"- {TASK_TITLES[task]}: " + "; ".join(parts) + ".")
    return lines
