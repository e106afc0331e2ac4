"""Full-scale ListOps with the LRA paper's recipe on one GPU, in device calls of bounded time: the library
of `python -m lra_jax.tools.full_scale` (the `listops-full` stage of `.ci/gpu-check`).

The recipe is `configs/<variant>.py:listops,full` unchanged (LRA code and paper: 5,000 steps, batch 32,
length 2000, 4 layers, 8 heads, emb 512, MLP 1024, dropout 0.1), with two overrides that keep the
function and change only its cost: layers unscanned and not rematerialised (`RUN_OVERRIDES`; a GPU has
the memory), and the compute dtype the precision check allows.

1. Precision check (`precision_runs`, `compare_precision`): softmax trained `steps` steps from one seed
   in float32 and in bfloat16 (parameters and optimizer stay float32 either way), a sweep with a grid
   over model.dtype in a scratch root. bfloat16 holds when it did not diverge and its validation
   accuracy and loss at the last step are within `TOLERANCE` of float32's (validation only, never
   test); it is used when it holds and its steps are faster. The record,
   <root>/listops-<scale>/precision.json, is reused by later calls; delete it to check again.
2. The runs (`main_runs`): `VARIANTS` in order, softmax first, as a sweep in
   <root>/listops-<scale>/<variant>/seed0, the layout `lra_jax.experiments.selection` (and the chart)
   reads. A finished run is skipped, an interrupted one resumes from its checkpoint (the sweep's rules),
   so calls in a row each add what fits; a run cut short writes no results.json and is never a result.
3. Pack (`pack`): each finished run's results.json, config.json and metrics.jsonl and precision.json in
   one tar.gz, paths relative to the root, to be unpacked into it and committed. Checkpoints (~120 MB a
   run at full scale) are left out: they do not fit what a device call brings back.
"""

from __future__ import annotations

import json
import os
import tarfile
from typing import Any

from lra_jax.errors import LraError
from lra_jax.experiments import sweep_plan, sweep_run
from lra_jax.experiments.table2_report import REFERENCE
from lra_jax.training import metrics

TASK = "listops"
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
PACKED_FILES = ("results.json", "config.json", "metrics.jsonl")


def cell_dir(root: str, scale: str) -> str:
    """<root>/listops-<scale>: the runs' cell directory, which also holds the precision record."""
    return os.path.join(root, f"{TASK}-{scale}")


def _plan(variants: str, scale: str, root: str, overrides: list[str], grid=()) -> list[sweep_plan.Run]:
    return sweep_plan.plan(variants, TASK, [scale], [SEED], root, overrides, grid=list(grid))


def precision_runs(scale: str, scratch: str, steps: int, overrides: list[str] = ()) -> list[sweep_plan.Run]:
    """The check's two runs (float32, then bfloat16) of `steps` steps, validated once, at the last."""
    if steps < 1:
        raise LraError(f"--precision_steps={steps}; give 1 or more")
    check = [f"--config.num_train_steps={steps}", f"--config.eval_every={steps}",
             f"--config.checkpoint_every={steps}"]
    return _plan(CHECK_VARIANT, scale, scratch, [*RUN_OVERRIDES, *overrides, *check],
                 grid=[("model.dtype", list(DTYPES))])


def main_runs(scale: str, root: str, dtype: str, variants: list[str] = VARIANTS, steps: int = 0,
              overrides: list[str] = ()) -> list[sweep_plan.Run]:
    """The recipe's runs in `dtype`, in the order of `variants`; `steps` > 0 replaces the 5,000 (tests)."""
    if dtype not in DTYPES:
        raise LraError(f"dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    extra = [f"--config.num_train_steps={steps}"] if steps > 0 else []
    return _plan(",".join(variants), scale, root, [*RUN_OVERRIDES, f"--config.model.dtype={dtype}",
                                                   *overrides, *extra])


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


def run_summary(run: sweep_plan.Run) -> dict[str, Any]:
    """What the check compares of one finished run: its status and last validation, from its workdir."""
    results = run.results()
    if results is None:  # the sweep ran it to its end: it failed or crashed (its output says why)
        return {"status": "failed", "run": run.name}
    if results.get("status") == "diverged":
        return {"status": "diverged", "diverged_at_step": results.get("diverged_at_step"), "run": run.name}
    last = last_metrics(run.workdir)
    return {"status": "complete", "val_accuracy": last["val/accuracy"], "val_loss": last["val/loss"],
            "train_loss": last.get("train/loss"), "steps_per_second": results.get("steps_per_second"),
            "test_majority_class_rate": results.get("test_majority_class_rate"), "device": results.get("devices"),
            "commit": (results.get("versions") or {}).get("lra_jax_commit"), "run": run.name}


def compare_precision(f32: dict[str, Any], bf16: dict[str, Any], steps: int, scale: str) -> dict[str, Any]:
    """The precision record: both runs' summaries, the tolerances, whether bfloat16 holds, the dtype to use.

    bfloat16 is used when it holds (did not diverge; validation accuracy and loss within `TOLERANCE` of
    float32's) and its steps were faster: it is there for speed alone."""
    if f32["status"] != "complete":
        raise LraError(f"the precision check's float32 run {f32['run']} {f32['status']}: the recipe itself fails, "
                       "bfloat16 or not; see its output and metrics.jsonl before running the stage again")
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
    return {"what": f"precision check: {CHECK_VARIANT} ListOps ({scale} scale) trained {steps} steps from seed "
                    f"{SEED} in float32 and in bfloat16, compared at the last validation (never test)",
            "scale": scale, "variant": CHECK_VARIANT, "steps": steps, "tolerance": TOLERANCE,
            "float32": f32, "bfloat16": bf16, "bfloat16_speedup": speedup, "holds": holds, "reason": reason,
            "notes": notes, "dtype": "bfloat16" if use else "float32"}


def read_record(root: str, scale: str) -> dict[str, Any] | None:
    """The precision record of an earlier call, or None if there is none."""
    path = os.path.join(cell_dir(root, scale), PRECISION_RECORD)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return record if record["dtype"] in DTYPES else None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LraError(f"{path} is damaged ({type(error).__name__}: {error}); delete it to check again") from None


def write_record(root: str, scale: str, record: dict[str, Any]) -> str:
    path = os.path.join(cell_dir(root, scale), PRECISION_RECORD)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def finished(root: str, scale: str) -> list[str]:
    """The workdirs under the cell whose results.json is a final record (complete or diverged)."""
    found = []
    for parent, _, files in sorted(os.walk(cell_dir(root, scale))):
        if "results.json" in files and sweep_plan.read_json(os.path.join(parent, "results.json")) is not None:
            found.append(parent)
    return found


def pack(root: str, scale: str, dest: str) -> list[str]:
    """Writes `dest` (tar.gz): the finished runs' PACKED_FILES and the precision record, named relative to
    `root` (unpack with `tar -xzf DEST -C ROOT`); returns the names packed."""
    names = []
    record = os.path.join(cell_dir(root, scale), PRECISION_RECORD)
    paths = [record] if os.path.exists(record) else []
    for workdir in finished(root, scale):
        paths += [os.path.join(workdir, n) for n in PACKED_FILES if os.path.exists(os.path.join(workdir, n))]
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for path in paths:
            names.append(os.path.relpath(path, root))
            tar.add(path, arcname=names[-1])
    return names


def paper_listops() -> dict[str, float]:
    """variant -> the LRA paper's Table 1 ListOps test accuracy (%)."""
    with open(REFERENCE, encoding="utf-8") as f:
        return {m["variant"]: m["accuracy"]["listops"] for m in json.load(f)["models"]}


def report(runs: list[sweep_plan.Run]) -> list[str]:
    """One line per run: its state and, when finished, its test accuracy (at full scale beside the paper's)."""
    paper = paper_listops()
    lines = []
    for run in runs:
        results = run.results() or {}
        state = run.state()
        if state == "done":
            ours = f"test accuracy {100 * results['test_accuracy']:.2f}%"
            if run.scale == "full":  # the paper's figure is a full-scale one
                ours += (f" (LRA paper Table 1: {paper[run.variant]:.2f}%)" if run.variant in paper
                         else " (not in the paper)")
            lines.append(f"{run.name}: {ours}, {results.get('steps_per_second') or 0:.2f} steps/s, "
                         f"{(results.get('config') or {}).get('model', {}).get('dtype')}")
        else:
            lines.append(f"{run.name}: {state}")
    return lines


def run_stage(scale: str, root: str, scratch: str, precision_steps: int, variants: list[str], steps: int,
              overrides: list[str], runner: sweep_run.Runner, stop: sweep_run.Stop | None,
              log=print) -> str:
    """The check (unless recorded), then the runs. Returns "complete" (every run finished or skipped),
    "stopped" (a signal: the run in progress checkpointed) or "failed" (a run failed or crashed).
    A bfloat16 check run that fails means float32; a float32 one that fails stops the stage (LraError)."""
    record = read_record(root, scale)
    if record is None:
        check = precision_runs(scale, scratch, precision_steps, overrides)
        sweep_run.run_sweep(check, runner, stop, log=log)
        if stop is not None and stop.requested:
            return "stopped"
        record = compare_precision(*(run_summary(r) for r in check), precision_steps, scale)
        log(f"precision check: {record['reason']}; the runs use {record['dtype']} "
            f"(record in {write_record(root, scale, record)})")
    else:
        log(f"precision check recorded earlier: {record['reason']}; the runs use {record['dtype']}")
    runs = main_runs(scale, root, record["dtype"], variants, steps, overrides)
    rows = sweep_run.run_sweep(runs, runner, stop, log=log)
    for line in report(runs):
        log(line)
    if stop is not None and stop.requested:
        return "stopped"
    return "failed" if any(row["status"] in ("failed", "crashed") for row in rows) else "complete"
