"""A run's records as `train` leaves them, for tests that fake runs: results.json beside the config.json and
metrics.jsonl that back it (`lra_jax.training.run_result`)."""

import json
import os

BEST_STEP, LAST_STEP = 4, 8


def write_run(workdir, config, test=0.5, val=None, **fields):
    """A finished run in `workdir`: config.json (`config`), metrics.jsonl (validation accuracy `val`, default
    `test`, at BEST_STEP; test accuracy `test` at the last step) and results.json (the same, `config`, then
    `fields`)."""
    val = test if val is None else val
    record = {"status": "complete", "test_accuracy": test, "val_accuracy": val, "best_step": BEST_STEP,
              "config": config, **fields}
    _write(workdir, config, [{"step": BEST_STEP, "val/accuracy": val},
                             {"step": LAST_STEP, "test/accuracy": test}], record)


def write_record(workdir, record):
    """`record`, a finished run's results.json with its accuracies and config, and the records that back it."""
    rest = {k: v for k, v in record.items() if k not in ("config", "test_accuracy", "val_accuracy")}
    write_run(workdir, record.get("config", {}), record["test_accuracy"], record["val_accuracy"], **rest)


def write_diverged_run(workdir, config, step=7, **fields):
    """A run that stopped on a non-finite loss at `step`: config.json, its log, and a results.json that says
    "diverged" and holds no accuracy."""
    record = {"status": "diverged", "diverged_at_step": step, "loss": "nan", "config": config, **fields}
    _write(workdir, config, [{"step": step - 1, "train/loss": 1.0}], record)


def _write(workdir, config, lines, record):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)


def task_config(task_and_scale, seed, **changes):
    """The config of `task_and_scale` (e.g. "pathfinder,mini") as config.json holds it, with `seed` and
    `changes` (dotted path -> value) applied."""
    from lra_jax.config import task_defaults

    c = task_defaults.get_config(task_and_scale).to_dict()
    c["seed"] = seed
    for key, value in changes.items():
        *path, last = key.split(".")
        node = c
        for part in path:
            node = node[part]
        node[last] = value
    return c
