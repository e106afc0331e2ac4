"""Full-scale LRA (ListOps and Pathfinder) with the LRA paper's recipe on one GPU, in device calls of bounded
time: the library of `python -m lra_jax.tools.full_scale` (the `full-lra` stage of `.ci/gpu-check`).

The recipe is `configs/<variant>.py:<task>,full` unchanged, with two overrides that keep the function and
change only its cost: layers unscanned and not rematerialised (`RUN_OVERRIDES`; a GPU has the memory), and
the compute dtype the precision check allows. One call of the stage:

0. Carried runs (`run_carry`): unfinished runs packed by an earlier call on another machine are verified
   (every file's size and sha256) and unpacked into their directories, where the runs below resume them; a
   damaged archive stops the stage with one line, and nothing of it is written.
1. Data (`prepare_data`): each task's data is generated where the stage runs, with every core, before any
   run starts; the time it took is recorded in <root>/<task>-<scale>/data.json.
2. Precision check, per task (`precision_runs`, `compare_precision`): softmax trained `steps` steps from one
   seed in float32 and in bfloat16 (parameters and optimizer stay float32 either way), in a scratch root.
   bfloat16 holds when it did not diverge and its validation accuracy and loss at the last step are within
   `TOLERANCE` of float32's (validation only, never test); it is used when it holds and its steps are
   faster. The record, <root>/<task>-<scale>/precision.json, is reused by later calls; delete it to check
   again. It also gives the stage its estimate of a run's time and whether the task's runs can travel.
3. The runs (`main_runs`): `VARIANTS` in order, softmax first, the tasks taking turns, as a sweep into
   <root>/<task>-<scale>/<variant>/seed0 (the layout `lra_jax.research.sweeps.selection` and the chart read),
   several at once on one device where asked (`device_slots`, runs_per_device). A finished run is skipped,
   an interrupted one resumes. Within a time box every run is stopped cleanly before the call's end (its
   checkpoint saved, no results.json: never a result); a run whose checkpoint cannot travel (full ListOps,
   ~120 MB) is started only when its estimated time fits in what is left (`admitted`).
4. Pack (`pack`): one tar.gz, named relative to the root, to be unpacked into it and committed: each finished
   run's results.json, config.json and metrics.jsonl, each task's records, and carried.tar.gz with the
   unfinished runs whose checkpoints travel (`run_carry`).
"""

from __future__ import annotations

import datetime
import json
import os
import tarfile
import time
from collections.abc import Callable
from typing import Any

from lra_jax import provenance
from lra_jax.config import settings as config_settings
from lra_jax.data import tasks as task_registry
from lra_jax.errors import LraError
from lra_jax.research.sweeps import device_sharing, run_carry, sweep_plan, sweep_run
from lra_jax.research.compilation.table2_report import REFERENCE
from lra_jax.training import metrics

TASKS = ("listops", "pathfinder")
SEED = "0"
# Softmax first; then the LRA paper's Table 1 variants, then the others, each group fastest first by the
# full-scale train step at 4K on an H200 (experiments/results/bench-h200-b32-4096-*.json, dropout 0.1),
# so that each call finishes as many as it can. Left out, as no call of 10 minutes could finish them:
# additive (~3.5 s a step at 4K) and s4d (its own paper's recipe: 76,800 steps of batch 50).
PAPER_VARIANTS = ("linear", "strided", "local", "sinkhorn", "linformer", "longformer", "bigbird", "performer",
                  "reformer", "synthesizer")
OTHER_VARIANTS = ("mixer", "taylor", "fnet", "lightweight_conv", "routing", "gmlp", "dynamic_conv", "nystromformer",
                  "luong")
VARIANTS = ("softmax", *PAPER_VARIANTS, *OTHER_VARIANTS)
RUN_OVERRIDES = ("--config.model.remat=False", "--config.model.scan_layers=False")
DTYPES = ("float32", "bfloat16")
CHECK_VARIANT = "softmax"
# bfloat16 may fall short of float32 by at most this at the check's last validation: 2 points of
# accuracy (the spread of an accuracy on 2,000 examples near 35% is ~1.1 points) and 0.05 nats of loss.
TOLERANCE = {"val_accuracy": 0.02, "val_loss": 0.05}
PRECISION_RECORD = "precision.json"
DATA_RECORD = "data.json"
CARRIED = "carried.tar.gz"
PACKED_FILES = ("results.json", "config.json", "metrics.jsonl")
# Runs that share one device where no probe has measured the best number (device_sharing): Pathfinder's full
# model (~2 GB a step, compiled for an H100) leaves an H200 mostly idle, and a quarter of its memory (~31 GiB)
# holds a full ListOps step unscanned (its compiled estimate: ~3.6 GB scanned with remat).
RUNS_PER_DEVICE = 4
# A run's estimated time is its task's check run's (startup and compilation, then steps at its rate) with
# this margin for the validations and checkpoints the short check did not make.
ESTIMATE_MARGIN = 1.2


def cell_dir(root: str, task: str, scale: str) -> str:
    """<root>/<task>-<scale>: a task's runs, and its records."""
    return os.path.join(root, f"{task}-{scale}")


def _plan(variants: str, task: str, scale: str, root: str, overrides: list[str], grid=()) -> list[sweep_plan.Run]:
    return sweep_plan.plan(variants, task, [scale], [SEED], root, overrides, grid=list(grid))


def precision_runs(task: str, scale: str, scratch: str, steps: int, overrides: list[str] = ()) -> list[sweep_plan.Run]:
    """The task's check runs (float32, then bfloat16) of `steps` steps, validated once, at the last."""
    if steps < 1:
        raise LraError(f"--precision_steps={steps}; give 1 or more")
    check = [f"--config.num_train_steps={steps}", f"--config.eval_every={steps}",
             f"--config.checkpoint_every={steps}"]
    return _plan(CHECK_VARIANT, task, scale, scratch, [*RUN_OVERRIDES, *overrides, *check],
                 grid=[("model.dtype", list(DTYPES))])


def main_runs(scale: str, root: str, dtypes: dict[str, str], variants: list[str] = VARIANTS,
              overrides: dict[str, list[str]] | None = None) -> list[sweep_plan.Run]:
    """The recipe's runs of every task in `dtypes` (task -> dtype), variant by variant in the order of
    `variants`, the tasks taking turns; `overrides` (task -> `--config.*` flags) go last."""
    by_task = {}
    for task, dtype in dtypes.items():
        if dtype not in DTYPES:
            raise LraError(f"{task}: dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        by_task[task] = {r.variant: r for r in _plan(",".join(variants), task, scale, root,
                                                     [*RUN_OVERRIDES, f"--config.model.dtype={dtype}",
                                                      *(overrides or {}).get(task, [])])}
    return [by_task[task][v] for v in variants for task in dtypes if v in by_task[task]]


def prepare_data(task: str, scale: str, run: sweep_plan.Run) -> dict[str, Any] | None:
    """Generates (or finds in the cache) the data `run` trains on, with every core; the record of the time
    it took when it was generated here, None when it was already there."""
    config = config_settings.from_config(sweep_plan.train_config(run.command))
    cache = os.path.join(config.data.cache(), task)
    before = set(os.listdir(cache)) if os.path.isdir(cache) else set()
    start = time.perf_counter()
    splits = task_registry.get_task(task).load(config.data, config.max_len)
    seconds = time.perf_counter() - start
    if (set(os.listdir(cache)) if os.path.isdir(cache) else set()) <= before:
        return None
    return {"what": f"{task} ({scale} scale) generated by our generator and decoded into arrays where the stage ran",
            "task": task, "scale": scale, "seconds": round(seconds, 1), "cpu_cores": len(os.sched_getaffinity(0)),
            "examples": {name: int(len(labels)) for name, (_, labels) in splits.items()},
            "generator": dict(config.data.generator or {}), "commit": provenance.source_commit(),
            "date": datetime.date.today().isoformat()}


def last_metrics(workdir: str) -> dict[str, float]:
    """The last logged value of each metric in the run's metrics.jsonl."""
    path = os.path.join(workdir, "metrics.jsonl")
    lines, damaged = metrics.read_lines(path) if os.path.exists(path) else ([], None)
    if damaged:
        raise LraError(f"{damaged}; delete {workdir} to run the precision check again")
    last: dict[str, float] = {}
    for line in lines:
        last.update({key: value for key, value in line.items() if key != "step"})
    return last


def run_summary(run: sweep_plan.Run, seconds: float | None = None) -> dict[str, Any]:
    """What the check compares of one finished run: its status and last validation, from its workdir, with
    the wall time it took (`seconds`: startup, compilation and steps) and the bytes of its checkpoint."""
    results = run.results()
    if results is None:  # the sweep ran it to its end: it failed or crashed (its output says why)
        return {"status": "failed", "run": run.name}
    if results.get("status") == "diverged":
        return {"status": "diverged", "diverged_at_step": results.get("diverged_at_step"), "run": run.name}
    last = last_metrics(run.workdir)
    _, files = run_carry.travelling_files(run.workdir)
    return {"status": "complete", "val_accuracy": last["val/accuracy"], "val_loss": last["val/loss"],
            "train_loss": last.get("train/loss"), "steps_per_second": results.get("steps_per_second"),
            "seconds": None if seconds is None else round(seconds, 1),
            "checkpoint_bytes": sum(os.path.getsize(f) for f in files) or None,
            "test_majority_class_rate": results.get("test_majority_class_rate"), "device": results.get("devices"),
            "commit": (results.get("versions") or {}).get("lra_jax_commit"), "run": run.name}


def compare_precision(f32: dict[str, Any], bf16: dict[str, Any], steps: int, scale: str,
                      task: str = "listops") -> dict[str, Any]:
    """The precision record: both runs' summaries, the tolerances, whether bfloat16 holds, the dtype to use.

    bfloat16 is used when it holds (did not diverge; validation accuracy and loss within `TOLERANCE` of
    float32's) and its steps were faster: it is there for speed alone."""
    if f32["status"] != "complete":
        raise LraError(f"the {task} precision check's float32 run {f32['run']} {f32['status']}: the recipe itself "
                       "fails, bfloat16 or not; see its output and metrics.jsonl before running the stage again")
    rates = (f32.get("steps_per_second"), bf16.get("steps_per_second"))
    speedup = rates[1] / rates[0] if all(rates) else None
    notes = []
    if bf16["status"] == "diverged":
        holds, reason = False, f"bfloat16 diverged at step {bf16.get('diverged_at_step')}"
    elif bf16["status"] != "complete":
        holds, reason = False, f"the bfloat16 run {bf16['status']} (its output in the stage's log says why)"
    else:
        short = {key: f32[key] - bf16[key] if key == "val_accuracy" else bf16[key] - f32[key] for key in TOLERANCE}
        failed = [f"{key} {short[key]:+.4f} worse (tolerance {TOLERANCE[key]})" for key in TOLERANCE
                  if short[key] > TOLERANCE[key]]
        holds = not failed
        reason = "bfloat16 within tolerance of float32" if holds else "bfloat16 " + "; ".join(failed)
        if holds and not (speedup and speedup > 1):
            reason += f", but not faster ({speedup or 0:.2f}x its steps/s)"
        majority = f32.get("test_majority_class_rate")
        if majority is not None and f32["val_accuracy"] <= majority + TOLERANCE["val_accuracy"]:
            notes.append(f"float32 is still near the majority-class rate ({majority:.3f}) after {steps} steps: "
                         "the accuracies say little, the losses carry the comparison")
    use = holds and bool(speedup and speedup > 1)
    return {"what": f"precision check: {CHECK_VARIANT} {task} ({scale} scale) trained {steps} steps from seed "
                    f"{SEED} in float32 and in bfloat16, compared at the last validation (never test)",
            "task": task, "scale": scale, "variant": CHECK_VARIANT, "steps": steps, "tolerance": TOLERANCE,
            "float32": f32, "bfloat16": bf16, "bfloat16_speedup": speedup, "holds": holds, "reason": reason,
            "notes": notes, "dtype": "bfloat16" if use else "float32"}


def _read(path: str, check: Callable[[dict], bool]) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return record if check(record) else None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LraError(f"{path} is damaged ({type(error).__name__}: {error}); delete it to make it again") from None


def write_json(path: str, record: dict[str, Any]) -> str:
    """Writes `record` to `path` atomically (a temporary file renamed); returns the path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(f"{path}.tmp", path)
    return path


def read_record(root: str, task: str, scale: str) -> dict[str, Any] | None:
    """The task's precision record of an earlier call, or None if there is none."""
    return _read(os.path.join(cell_dir(root, task, scale), PRECISION_RECORD), lambda r: r["dtype"] in DTYPES)


def write_record(root: str, task: str, scale: str, record: dict[str, Any]) -> str:
    return write_json(os.path.join(cell_dir(root, task, scale), PRECISION_RECORD), record)


def estimated_seconds(record: dict[str, Any], steps: int) -> float | None:
    """A run's time in the record's dtype: the check run's startup and compilation (its wall time less its
    steps), then `steps` at its rate, with `ESTIMATE_MARGIN`; None when the record lacks either."""
    check = record.get(record["dtype"]) or {}
    rate, wall = check.get("steps_per_second"), check.get("seconds")
    if not rate or wall is None:
        return None
    startup = max(wall - record["steps"] / rate, 0.0)
    return startup + ESTIMATE_MARGIN * steps / rate


def travels(record: dict[str, Any]) -> bool:
    """Whether the task's runs can move between machines: its check run's checkpoint is small enough."""
    size = (record.get(record["dtype"]) or {}).get("checkpoint_bytes")
    return size is not None and size <= run_carry.RUN_LIMIT_BYTES


def admitted(runs: list[sweep_plan.Run], records: dict[str, dict], seconds_left: float) -> list[sweep_plan.Run]:
    """The runs that may start now: every run of a task whose runs travel (cut short, it is carried), and
    any other that is started already or whose estimated time fits in `seconds_left` (one cut short would
    be lost with its machine)."""
    out = []
    for r in runs:
        record = records[r.task]
        estimate = estimated_seconds(record, (r.config or {}).get("num_train_steps", 0))
        if travels(record) or r.state() != "new" or estimate is None or estimate <= seconds_left:
            out.append(r)
    return out


def unfinished(root: str, task: str, scale: str) -> list[str]:
    """The workdirs under the task's cell with checkpoints but no final results.json."""
    return [parent for parent, dirs, files in sorted(os.walk(cell_dir(root, task, scale)))
            if "checkpoints" in dirs and not ("results.json" in files and
                                              sweep_plan.read_json(os.path.join(parent, "results.json")))]


def finished(root: str, task: str, scale: str) -> list[str]:
    """The workdirs under the task's cell whose results.json is a final record (complete or diverged)."""
    found = []
    for parent, _, files in sorted(os.walk(cell_dir(root, task, scale))):
        if "results.json" in files and sweep_plan.read_json(os.path.join(parent, "results.json")) is not None:
            found.append(parent)
    return found


def pack(root: str, scale: str, dest: str, tasks: tuple[str, ...] = TASKS) -> tuple[list[str], list[str]]:
    """Writes `dest` (tar.gz, names relative to `root`: unpack with `tar -xzf DEST -C ROOT`): the finished
    runs' PACKED_FILES, each task's records, the device-sharing probe's record, and CARRIED with the unfinished runs that travel. Returns (the
    names packed, one line per unfinished run that stays behind and why)."""
    probed = os.path.join(root, device_sharing.RECORD)
    paths = [probed] if os.path.exists(probed) else []
    for task in tasks:
        cell = cell_dir(root, task, scale)
        paths += [os.path.join(cell, n) for n in (PRECISION_RECORD, DATA_RECORD) if os.path.exists(os.path.join(cell, n))]
        for workdir in finished(root, task, scale):
            paths += [os.path.join(workdir, n) for n in PACKED_FILES if os.path.exists(os.path.join(workdir, n))]
    carried_path = os.path.join(os.path.dirname(os.path.abspath(dest)), CARRIED)
    carried, left = run_carry.pack(root, [w for t in tasks for w in unfinished(root, t, scale)], carried_path)
    names = [os.path.relpath(p, root) for p in paths]
    with tarfile.open(dest, "w:gz") as tar:
        for path, name in zip(paths, names):
            tar.add(path, arcname=name)
        tar.add(carried_path, arcname=CARRIED)
    os.remove(carried_path)
    return [*names, *(f"{CARRIED}: {run}" for run in carried)], left


def paper_scores() -> dict[str, dict[str, float]]:
    """variant -> task -> the LRA paper's Table 1 test accuracy (%)."""
    with open(REFERENCE, encoding="utf-8") as f:
        return {m["variant"]: m["accuracy"] for m in json.load(f)["models"]}


def report(runs: list[sweep_plan.Run]) -> list[str]:
    """One line per run: its state and, when finished, its test accuracy (at full scale beside the paper's)."""
    paper = paper_scores()
    lines = []
    for run in runs:
        results = run.results() or {}
        state = run.state()
        if state == "done":
            ours = f"test accuracy {100 * results['test_accuracy']:.2f}%"
            if run.scale == "full":  # the paper's figure is a full-scale one
                theirs = paper.get(run.variant, {}).get(run.task)
                ours += f" (LRA paper Table 1: {theirs:.2f}%)" if theirs is not None else " (not in the paper)"
            lines.append(f"{run.name}: {ours}, {results.get('steps_per_second') or 0:.2f} steps/s, "
                         f"{(results.get('config') or {}).get('model', {}).get('dtype')}")
        else:
            lines.append(f"{run.name}: {state}")
    return lines


def run_stage(scale: str, root: str, scratch: str, tasks: list[str], variants: list[str], precision_steps: int,
              overrides: dict[str, list[str]], runner: sweep_run.Runner, stop: sweep_run.Stop,
              slots: list = (None,), time_box: float = 0.0, log=print) -> str:
    """Carried runs unpacked, the data, the checks (unless recorded), then the runs, within `time_box`
    seconds from now (0: no limit). Returns "complete" (every run finished or skipped), "stopped" (a signal
    or the time box: the runs in progress checkpointed) or "failed" (a run failed or crashed).
    A bfloat16 check run that fails means float32; a float32 one that fails stops the stage (LraError)."""
    start = time.monotonic()
    if time_box > 0:
        stop.after(time_box)
    for line in run_carry.unpack(root, os.path.join(root, CARRIED)):
        log(f"carried run restored: {line}")
    for task in tasks:
        first = main_runs(scale, root, {task: "float32"}, variants[:1], overrides)[0]
        record = prepare_data(task, scale, first)
        path = os.path.join(cell_dir(root, task, scale), DATA_RECORD)
        if record is not None and not os.path.exists(path):  # the first measurement stays
            write_json(path, record)
        log(f"data {task}: " + (f"generated in {record['seconds']:.1f} s on {record['cpu_cores']} cores "
                                f"({', '.join(f'{k} {v}' for k, v in record['examples'].items())})"
                                if record else "found in the cache"))
    if stop.requested:
        return "stopped"
    records = {task: read_record(root, task, scale) for task in tasks}
    for task in tasks:
        if records[task] is not None:
            log(f"precision check {task} recorded earlier: {records[task]['reason']}; the runs use "
                f"{records[task]['dtype']}")
    checks = {task: precision_runs(task, scale, scratch, precision_steps, overrides.get(task, []))
              for task in tasks if records[task] is None}
    if checks:
        rows = sweep_run.run_sweep([r for runs in checks.values() for r in runs], runner, stop, log=log, slots=slots)
        if stop.requested:
            return "stopped"
        seconds = {row["run"]: row["seconds"] for row in rows if row["status"] == "finished"}
        for task, runs in checks.items():
            records[task] = compare_precision(*(run_summary(r, seconds.get(r.name)) for r in runs),
                                              precision_steps, scale, task)
            log(f"precision check {task}: {records[task]['reason']}; the runs use {records[task]['dtype']} "
                f"(record in {write_record(root, task, scale, records[task])})")
    runs = main_runs(scale, root, {t: records[t]["dtype"] for t in tasks}, variants, overrides)
    for task in tasks:
        steps = next((r.config or {}).get("num_train_steps", 0) for r in runs if r.task == task)
        estimate = estimated_seconds(records[task], steps)
        log(f"{task}: runs " + ("travel (a run cut short is carried to the next machine)" if travels(records[task])
                                else "must finish within one call") +
            (f"; a run takes about {estimate:.0f} s (from the precision check)" if estimate else ""))

    def now_admitted() -> list[sweep_plan.Run]:
        left = time_box - (time.monotonic() - start) if time_box > 0 else float("inf")
        return admitted(runs, records, left)

    rows = sweep_run.run_sweep(now_admitted, runner, stop, log=log, slots=slots)
    for line in report(runs):
        log(line)
    started = now_admitted()
    skipped = [r.name for r in runs if r not in started]
    if skipped:
        log(f"not started, as their estimated time did not fit in the time box: {', '.join(skipped)}")
    if stop.requested:
        return "stopped"
    return "failed" if any(row["status"] in sweep_run.UNFINISHED for row in rows) else "complete"
