"""A run's recipe, read from its config.json: the settings that make two runs of a task comparable.

    SETTINGS  (name, dotted config path): depth, width, steps, learning rate, warm-up, batch, and the
              Pathfinder generator's contour length, distractors and examples (None where a task has none)
    RECIPE    SETTINGS without the learning rate, which a sweep's grid chooses within one recipe

Scores are set side by side only within one recipe: the recipe comparison refuses a column that mixes two,
and the chart says so where its self-pretraining comparison trained a task on another recipe than its
headline (`difference_note`).
"""

from __future__ import annotations

import json
import os
from typing import Any

SETTINGS = (("layers", "model.num_layers"), ("width", "model.emb_dim"), ("steps", "num_train_steps"),
            ("rate", "optimizer.learning_rate"), ("warm-up", "optimizer.warmup_steps"), ("batch", "batch_size"),
            ("contour", "data.generator.contour_length"), ("distractors", "data.generator.num_distractors"),
            ("examples", "data.generator.num_examples"))
RECIPE = tuple((name, path) for name, path in SETTINGS if name != "rate")


def setting(config: dict[str, Any], path: str) -> Any:
    """The value at dotted `path` of a run's config (as config.json holds it); None where it has none."""
    for key in path.split("."):
        config = config.get(key, {}) if isinstance(config, dict) else {}
    return config if config != {} else None


def recipe(config: dict[str, Any]) -> dict[str, Any]:
    """Setting name -> value (`RECIPE`) of a run's config."""
    return {name: setting(config, path) for name, path in RECIPE}


def words(recipe_: dict[str, Any], other: dict[str, Any]) -> str:
    """The settings of `recipe_` that differ from `other`'s, e.g. 'layers 1, steps 1000'; 'the same' if none."""
    return ", ".join(f"{name} {value:g}" if isinstance(value, (int, float)) else f"{name} {value}"
                     for name, value in recipe_.items() if value != other.get(name)) or "the same"


def of_runs(directory: str) -> dict[str, Any] | None:
    """The recipe of the first run (in walk order) under `directory`, from its config.json; None if none."""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        if "config.json" in files:
            with open(os.path.join(root, "config.json"), encoding="utf-8") as f:
                return recipe(json.load(f))
    return None


def of_tasks(measured: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """task -> the distinct recipes of the cells of `measured` (variant -> `lra_results.aggregate` entry with
    its "files": {task: the chosen point's run directory}), in variant order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for _, m in sorted(measured.items()):
        for task, directory in sorted(m.get("files", {}).items()):
            r = of_runs(directory)
            if r is not None and r not in found.setdefault(task, []):
                found[task].append(r)
    return found


def difference_note(compared: dict[str, dict[str, Any]], headline: dict[str, dict[str, Any]],
                    titles: dict[str, str]) -> str:
    """One sentence per task whose recipes in `compared` (a comparison's from-scratch cells) are not those of
    `headline` (the headline's from-scratch cells), naming the settings that differ ("" where every task
    shares its recipes); `titles`: task -> its name."""
    ours, theirs = of_tasks(compared), of_tasks(headline)
    lines = []
    for task in sorted(set(ours) & set(theirs)):
        if ours[task] == theirs[task]:
            continue
        here = "; ".join(words(r, theirs[task][0]) for r in ours[task])
        there = "; ".join(words(r, ours[task][0]) for r in theirs[task])
        lines.append(f"{titles.get(task, task)} on another recipe than the headline's ({here}; the headline: {there})")
    return ". ".join(lines) + ("." if lines else "")
