"""The short results table (lra_summary.md), written by the chart beside its full table: one row per
variant trained from scratch, best score first, with what a reader needs to weigh the score: the speed and
memory of its train step on the main panel's device, the scale, the hardware it trained on and how long
one seed of every task took. `python -m lra_jax.tools.docs` places it in the README.

Train time per seed = Σ over the variant's tasks of (steps ÷ measured steps/s), each task's mean over the
seeds of its chosen grid point: the training compute, compilation and evaluation left out.
"""

from __future__ import annotations

import math
from typing import Any

from lra_jax.research.reports.chart_speeds import DeviceSpeeds
from lra_jax.research.reports.learning import learned_note
from lra_jax.research.reports.lra_results import (
    LEARNED_WORDS,
    LRA_TASKS,
    TASK_TITLES,
    base_scale,
    is_pretrained,
    ranked_and_apart,
)
from lra_jax.measure.units import duration

NAME = "lra_summary.md"


def _score(mean: float | None, std: float | None) -> str:
    return "—" if mean is None else f"{mean:.1f}" + ("" if std is None else f" ± {std:.1f}")


def _hardware(m: dict[str, Any]) -> str:
    devices = sorted({d for s in m["chosen"].values() for d in s.devices})
    return ", ".join(devices) or "not recorded"


def _train_time(m: dict[str, Any]) -> float | None:
    seconds = [s.train_seconds for s in m["chosen"].values()]
    return None if not seconds or None in seconds else math.fsum(seconds)


def _speed(speeds: DeviceSpeeds | None, variant: str) -> list[str]:
    speed = speeds.speeds.get(variant) if speeds else None
    if speed is None:
        return ["—", "—"]
    memory = f"{speed.memory_bytes / 2**30:.1f}" if speed.memory_bytes else "—"
    return [f"{speed.relative_speed:.2f}", memory]


def summary(scores: dict[str, dict[str, dict[str, Any]]], main: DeviceSpeeds | None, header: str,
            not_drawn: dict[str, str] | None = None) -> str:
    """The short table of every series trained from scratch (`scores`: series -> `lra_results.aggregate`),
    under `header` (how the file was made); `not_drawn`: variant -> why the headline chart cannot draw it."""
    series = [s for s in sorted(scores, key=lambda s: (s != "full", s)) if not is_pretrained(s)]
    tasks = [t for t in LRA_TASKS if any(t in m["accuracy"] for s in series for m in scores[s].values())]
    where = (f"the train step at {main.length:,} tokens on {main.device} (batch {main.batch_size}), relative "
             f"to softmax; memory: {main.memory_words}" if main else "no bench given")
    lines = ["# LRA results in short", "", header, "",
             "Test accuracy (%), mean ± sample std over seeds, of each variant trained from scratch; score = mean "
             f"over the tasks shown, best first. Speed and memory: {where}. Train time: one seed of every task, "
             f"steps ÷ measured steps/s (compilation and evaluation left out). {LEARNED_WORDS}"
             + (f" The chart (lra_chart.png) cannot draw {_names(not_drawn)}." if not_drawn else ""), "",
             "| Variant | " + " | ".join(TASK_TITLES[t] for t in tasks) + " | Score | Speed (× softmax) | "
             "Memory (GiB) | Scale | Trained on | Train time |",
             "|---" * (len(tasks) + 7) + "|"]
    header_at = len(lines) - 2
    apart = []
    for name in series:
        ranked, fewer = ranked_and_apart(scores[name])
        lines += [_row(scores[name][v], v, name, tasks, main) for v in ranked]
        apart += [_row(scores[name][v], v, name, tasks, main) for v in fewer]
    if apart:
        lines += ["", "Scored on fewer tasks than the rows above, so not ranked with them; their score (*) is the "
                  "mean over the tasks they ran:", "", *lines[header_at:header_at + 2], *apart]
    return "\n".join(lines) + "\n"


def _names(not_drawn: dict[str, str]) -> str:
    """'lru, mega and s6 (no measured speed on NVIDIA H200)', grouped by reason."""
    grouped: dict[str, list[str]] = {}
    for variant, why in not_drawn.items():
        grouped.setdefault(why, []).append(variant)
    return "; ".join(f"{', '.join(vs[:-1]) + ' and ' + vs[-1] if len(vs) > 1 else vs[0]} ({why})"
                     for why, vs in grouped.items())


def _row(m: dict[str, Any], variant: str, series: str, tasks: list[str], main: DeviceSpeeds | None) -> str:
    cells = [_score(m["accuracy"].get(t), m["std"].get(t)) + learned_note(m.get("learned", {}).get(t)) for t in tasks]
    score = _score(m["score"], m["score_std"]) + ("*" if any(t not in m["accuracy"] for t in tasks) else "")
    return "| " + " | ".join([variant, *cells, score, *_speed(main, variant), base_scale(series), _hardware(m),
                              duration(_train_time(m), missing="—")]) + " |"
