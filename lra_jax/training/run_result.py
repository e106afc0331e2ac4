"""A run's result read with its evidence: results.json is believed only where the run's own records agree.

    workdir/results.json    test_accuracy, val_accuracy (at best_step), config: what the run claims
    workdir/metrics.jsonl   the trainer's log: "test/accuracy" on the run's last line (written as the run
                            ends), "val/accuracy" at every validation, best_step's among them
    workdir/config.json     the config the run was trained with (`run_dir.check_config` writes it)

A finished run ("status": "complete", or no status in older records) is backed when each accuracy is a
number in [0, 1], its test accuracy is the last "test/accuracy" of metrics.jsonl, its validation accuracy
the "val/accuracy" logged at its best_step, and its config is config.json's (up to the settings a run may
change on resume, `run_dir.config_changes`). A diverged run holds no accuracy; its config is checked alike.
Anything else is a `DamagedResult`: one line naming the run's results.json and what disagrees. Every
command that reads results.json as a result (the trainer's finished check, the sweep's states and
selection, the chart and its tables) goes through `read`, `check` or `problem`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from lra_jax.errors import LraError
from lra_jax.training import metrics, run_dir

RESULTS, METRICS, CONFIG = "results.json", "metrics.jsonl", "config.json"
TOLERANCE = 1e-6  # far below one example of any split (1/n); the trainer writes the same float to both files


class DamagedResult(LraError):
    """results.json disagrees with the run's metrics.jsonl or config.json, or holds no accuracy in [0, 1]."""


def read(workdir: str) -> dict[str, Any]:
    """The results.json of the run in `workdir`, checked against its evidence (`check`).

    Raises:
        OSError: results.json is missing or cannot be read.
        ValueError: it is not JSON, or not a JSON object, or its config is not one (a bad copy).
        DamagedResult: it is readable but its records do not back it.
    """
    with open(os.path.join(workdir, RESULTS), encoding="utf-8") as f:
        record = json.load(f)
    if not isinstance(record, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(record), "a number")
        raise ValueError(f"not a JSON object but {kind}")
    if not isinstance(record.get("config", {}), dict):
        raise ValueError("its config is not a JSON object")
    check(workdir, record)
    return record


def check(workdir: str, record: dict[str, Any]) -> None:
    """DamagedResult (one line) unless the run's metrics.jsonl and config.json back `record`, its results.json."""
    found = problem(workdir, record)
    if found:
        raise DamagedResult(found)


def problem(workdir: str, record: dict[str, Any]) -> str | None:
    """The one line saying why `record` (the results.json of the run in `workdir`) is not believed; None
    when its evidence backs it."""
    why = _config_problem(workdir, record)
    if why is None and record.get("status") != "diverged":
        why = _accuracy_problem(workdir, record)
    if why is None:
        return None
    return (f"{os.path.join(workdir, RESULTS)}: {why}; the run is damaged, not done: delete that results.json "
            f"to evaluate the run again from its checkpoints (or delete {workdir} to train it again)")


def accuracy(value: Any) -> float | None:
    """`value` as an accuracy: a finite number in [0, 1]; None when it is not one (NaN, 37.0, -0.5, "0.9")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def _config_problem(workdir: str, record: dict[str, Any]) -> str | None:
    saved = _json_object(os.path.join(workdir, CONFIG))
    if saved is None:
        return f"no readable {CONFIG} beside it to back its config"
    config = record.get("config")
    if not isinstance(config, dict):
        return "it records no config"
    changed = run_dir.config_changes(saved, config)
    if changed:
        return f"its config differs from {CONFIG} in {', '.join(changed)}"
    return None


def _accuracy_problem(workdir: str, record: dict[str, Any]) -> str | None:
    for key in ("test_accuracy", "val_accuracy"):
        if key not in record:
            return f"it has no {key}"
        if accuracy(record[key]) is None:
            return f"{key} {record[key]!r} is not an accuracy (a finite fraction in [0, 1])"
    path = os.path.join(workdir, METRICS)
    try:
        lines, _ = metrics.read_lines(path)  # lines after a damaged one are no evidence
    except OSError as error:
        return f"no readable {METRICS} beside it to back its accuracies ({error.strerror})"
    tests = [line for line in lines if "test/accuracy" in line]
    if not tests:
        return f"{METRICS} records no test accuracy to back its test_accuracy {record['test_accuracy']}"
    logged = tests[-1]["test/accuracy"]
    if not _same(logged, record["test_accuracy"]):
        return (f"test_accuracy {record['test_accuracy']} disagrees with the {logged} that {METRICS} records at "
                f"step {tests[-1]['step']}")
    vals = {line["step"]: line["val/accuracy"] for line in lines if "val/accuracy" in line}
    step = record.get("best_step")
    logged = vals.get(step) if step is not None else max((v for v in vals.values() if v is not None), default=None)
    if not _same(logged, record["val_accuracy"]):
        where = f"at best_step {step}" if step is not None else "as its best"
        return (f"val_accuracy {record['val_accuracy']} disagrees with {METRICS}, which records "
                f"{'none' if logged is None else logged} {where}")
    return None


def _same(logged: Any, claimed: float) -> bool:
    return accuracy(logged) is not None and abs(logged - claimed) <= TOLERANCE


def _json_object(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
