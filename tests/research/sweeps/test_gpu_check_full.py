""".ci/gpu-check's full-lra stage, run as a GPU machine runs it but at mini scale on the CPU with tiny runs: the
data made and timed where it runs, the precision check of each task, two runs sharing one device, the time box
that stops every run cleanly, the tar.gz that brings back the finished runs and carries the unfinished one, and
a second call in a fresh root (another machine: fresh data cache, fresh scratch) that restores the carried run
and resumes it. The exactness of a carried run is tests/research/sweeps/test_run_carry.py's; the rules are checked on
given records below.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from helpers import FAST_COMPILE

from lra_jax.config import paths as config_paths
from lra_jax.errors import LraError
from lra_jax.research.reports import lra_results
from lra_jax.research.sweeps import device_sharing, full_lra_stage, sweep_plan
from lra_jax.tools import full_scale as full_scale_tool

STAGE = os.path.join(config_paths.REPO_ROOT, ".ci", "gpu-check")
VARIANTS = ("softmax", "local")
LISTOPS_STEPS, PRECISION_STEPS = 6, 2
TINY = ("--config.batch_size=16 --config.model.num_layers=1 --config.model.emb_dim=16 --config.model.mlp_dim=32 "
        "--config.model.num_heads=2")
LISTOPS = (f"num_train_steps={LISTOPS_STEPS} max_len=32 data.generator.num_train=256 data.generator.num_val=64 "
           "data.generator.num_test=64 data.generator.min_length=5 data.generator.max_length=32")
# Pathfinder's runs never end here: the time box stops them, and they travel.
PATHFINDER = "num_train_steps=1000000 data.generator.num_examples=640 checkpoint_every=50 eval_every=50 log_every=10"


def run_stage(tmp_path, call: str, root, cap: int, tasks: str = "listops,pathfinder") -> tuple[subprocess.CompletedProcess, str]:
    """`.ci/gpu-check full-lra` at mini scale with the stage's cap `cap` (time box cap - 45 s), as one machine
    (its own data cache and scratch) named `call`; the run's output and the stage's log."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}  # the stage's own knobs
    overrides = [f"--override={task}:--config.{o}" for task, spec in (("listops", LISTOPS), ("pathfinder", PATHFINDER))
                 for o in spec.split() if task in tasks]
    env = dict(inherited, OUT=str(tmp_path / call), PYTHON=sys.executable, JAX_PLATFORMS="cpu",
               LRA_JAX_CACHE=str(tmp_path / f"cache-{call}"), XLA_FLAGS=FAST_COMPILE, GPU_CHECK_FULL_SCALE="mini",
               GPU_CHECK_FULL_ROOT=str(root), GPU_CHECK_RUNS_PER_DEVICE="2", GPU_CHECK_CAPS=f"60 130 400 150 {cap}",
               GPU_CHECK_FULL_ARGS=f"--scratch={tmp_path / f'scratch-{call}'} --variants={','.join(VARIANTS)} "
                                   f"--tasks={tasks} --precision_steps={PRECISION_STEPS} --parallel=2 "
                                   f"{' '.join(overrides)} -- {TINY}")
    done = subprocess.run(["bash", STAGE, "full-lra"], env=env, capture_output=True, text=True, timeout=cap + 120,
                          check=False)
    return done, (tmp_path / call / "full-lra.log").read_text(encoding="utf-8")


def read(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def metric_lines(workdir) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.one_stack("newest")  # the device machine runs the newest jax; the stage is one process tree
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="the stage is a bash script run under coreutils' timeout")
@pytest.mark.slow
def test_the_stage_at_mini_scale_makes_data_checks_shares_a_device_stops_in_time_packs_and_resumes_elsewhere(tmp_path):
    root = tmp_path / "root"
    # ListOps alone first, to its end (no time box is reached): data, its check, its runs
    done, log = run_stage(tmp_path, "listops", root, cap=400, tasks="listops")
    assert "== full-lra: exit 0" in done.stdout, done.stdout + done.stderr + log[-3000:]
    assert " (run 2 of 2)" in log, "two runs share one core"
    runs = lra_results.read_runs(str(root))
    assert sorted((r.task, r.variant) for r in runs) == [("listops", v) for v in sorted(VARIANTS)]
    assert all(read(root / "listops-mini" / v / "seed0" / "results.json")["num_train_steps"] == LISTOPS_STEPS
               for v in VARIANTS)

    # then both tasks: ListOps is done; Pathfinder's runs never end here, so the time box stops them
    done, log = run_stage(tmp_path, "first", root, cap=105)
    assert "== full-lra: exit 130" in done.stdout and "the time box of 60 s is over" in log, \
        done.stdout + done.stderr + log[-3000:]
    assert all(f"listops-mini/{v}/seed0: done, skipped" in log for v in VARIANTS)
    for task in full_lra_stage.TASKS:  # made and timed where it ran, checked once
        data = read(root / f"{task}-mini" / "data.json")
        assert data["seconds"] >= 0 and data["cpu_cores"] >= 1 and data["examples"]["train"] > 0
        record = read(root / f"{task}-mini" / "precision.json")
        assert (record["task"], record["scale"], record["steps"]) == (task, "mini", PRECISION_STEPS)
        assert all(record[d]["status"] == "complete" and record[d]["seconds"] > 0 for d in full_lra_stage.DTYPES)
    stopped = root / "pathfinder-mini" / "softmax" / "seed0"
    assert not (stopped / "results.json").exists() and (stopped / "checkpoints" / "last").is_dir()
    assert len(lra_results.read_runs(str(root))) == len(VARIANTS), "a run cut short is never a result"

    # what comes back: the finished runs, the records, and the carried run with its newest checkpoint
    with tarfile.open(tmp_path / "first" / "full-lra.tar.gz") as tar:
        names = set(tar.getnames())
    assert names == {"carried.tar.gz", *(f"{t}-mini/{n}" for t in full_lra_stage.TASKS for n in ("precision.json",
                                                                                             "data.json")),
                     *(f"listops-mini/{v}/seed0/{f}" for v in VARIANTS for f in full_lra_stage.PACKED_FILES)}
    assert "pathfinder-mini/softmax/seed0" in log.split("packed", 1)[1].splitlines()[0]

    # another machine: the tar.gz unpacked into a fresh root, as committed; the carried run resumes
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    subprocess.run(["tar", "-xzf", str(tmp_path / "first" / "full-lra.tar.gz"), "-C", str(fresh)], check=True)
    step = max(int(n) for n in os.listdir(stopped / "checkpoints" / "last"))
    again, log = run_stage(tmp_path, "second", fresh, cap=80)
    assert "== full-lra: exit 130" in again.stdout, again.stdout + again.stderr + log[-3000:]
    assert f"carried run restored: pathfinder-mini/softmax/seed0 at step {step}" in log
    assert all(f"precision check {t} recorded earlier" in log for t in full_lra_stage.TASKS)
    assert all(f"listops-mini/{v}/seed0: done, skipped" in log for v in VARIANTS)
    assert "pathfinder-mini/softmax/seed0: resuming" in log, log[-3000:]
    moved = metric_lines(fresh / "pathfinder-mini" / "softmax" / "seed0")
    assert [line for line in moved if line["step"] <= step] == [line for line in metric_lines(stopped)
                                                                 if line["step"] <= step]
    assert max(line["step"] for line in moved) > step, "the resumed run trained on"


RECORD = {"dtype": "float32", "steps": 300, "float32": {"steps_per_second": 10.0, "seconds": 80.0,
                                                        "checkpoint_bytes": 120 << 20}}


def test_a_run_that_cannot_travel_starts_only_when_its_estimate_fits_and_a_small_one_always_does(tmp_path):
    # 50 s of startup and compilation (80 s less 300 steps at 10/s), then 5,000 steps at 10/s with the margin
    assert full_lra_stage.estimated_seconds(RECORD, 5000) == pytest.approx(50 + full_lra_stage.ESTIMATE_MARGIN * 500)
    assert not full_lra_stage.travels(RECORD)
    runs = full_lra_stage.main_runs("mini", str(tmp_path), {"listops": "float32"}, ["softmax", "local"],
                                {"listops": ["--config.num_train_steps=5000"]})
    need = full_lra_stage.estimated_seconds(RECORD, 5000)
    assert full_lra_stage.admitted(runs, {"listops": RECORD}, need + 1) == runs
    assert full_lra_stage.admitted(runs, {"listops": RECORD}, need - 1) == []
    small = {**RECORD, "float32": {**RECORD["float32"], "checkpoint_bytes": 1 << 20}}
    assert full_lra_stage.admitted(runs, {"listops": small}, 0) == runs
    os.makedirs(os.path.join(runs[1].workdir, "checkpoints"))  # started on this machine: it resumes
    assert full_lra_stage.admitted(runs, {"listops": RECORD}, 0) == [runs[1]]


def test_the_tasks_take_turns_softmax_first_and_a_task_override_reaches_only_its_runs(tmp_path):
    runs = full_lra_stage.main_runs("mini", str(tmp_path), {"listops": "bfloat16", "pathfinder": "float32"},
                                ["softmax", "linear"], {"pathfinder": ["--config.num_train_steps=7"]})
    assert [r.name for r in runs] == ["listops-mini/softmax/seed0", "pathfinder-mini/softmax/seed0",
                                      "listops-mini/linear/seed0", "pathfinder-mini/linear/seed0"]
    assert [(r.config["model"]["dtype"], r.config["num_train_steps"] == 7) for r in runs] == \
        [("bfloat16", False), ("float32", True)] * 2
    given = full_scale_tool.task_overrides(["pathfinder:--config.seed=3"], ["listops", "pathfinder"], ["--config.x=1"])
    assert given == {"listops": ["--config.x=1"], "pathfinder": ["--config.x=1", "--config.seed=3"]}
    for bad in ("image:--config.seed=3", "pathfinder:seed=3"):
        with pytest.raises(LraError, match="expected TASK:--config.KEY=VALUE"):
            full_scale_tool.task_overrides([bad], ["listops", "pathfinder"], [])
    assert isinstance(runs[0], sweep_plan.Run)


F32 = {"status": "complete", "val_accuracy": 0.30, "val_loss": 1.80, "steps_per_second": 10.0,
       "test_majority_class_rate": 0.17, "run": "f32"}


@pytest.mark.parametrize("bf16, dtype, says", [
    (dict(val_accuracy=0.29, val_loss=1.82, steps_per_second=18.0), "bfloat16", "within tolerance"),
    (dict(val_accuracy=0.27, val_loss=1.81, steps_per_second=18.0), "float32", "val_accuracy +0.0300 worse"),
    (dict(val_accuracy=0.31, val_loss=1.86, steps_per_second=18.0), "float32", "val_loss +0.0600 worse"),
    (dict(val_accuracy=0.30, val_loss=1.80, steps_per_second=9.0), "float32", "but not faster (0.90x"),
    (dict(status="diverged", diverged_at_step=120), "float32", "bfloat16 diverged at step 120"),
    (dict(status="failed"), "float32", "the bfloat16 run failed"),
])
def test_bfloat16_is_used_only_where_it_holds_validation_and_is_faster(bf16, dtype, says):
    record = full_lra_stage.compare_precision(F32, {**F32, "run": "bf16", **bf16}, 300, "full", "pathfinder")
    assert record["dtype"] == dtype and says in record["reason"] and record["task"] == "pathfinder"
    assert record["holds"] == (says == "within tolerance" or "not faster" in says)


def test_a_check_whose_float32_run_is_at_the_majority_rate_says_so_and_a_failed_float32_is_an_error():
    record = full_lra_stage.compare_precision({**F32, "val_accuracy": 0.18}, {**F32, "val_accuracy": 0.18,
                                                                          "steps_per_second": 18.0}, 300, "full")
    assert record["dtype"] == "bfloat16" and "near the majority-class rate" in record["notes"][0]
    for status in ("diverged", "failed"):
        with pytest.raises(LraError, match=f"float32 run f32 {status}: the recipe itself fails"):
            full_lra_stage.compare_precision({**F32, "status": status}, F32, 300, "full")


def test_the_best_runs_per_device_is_the_fewest_within_three_percent_of_the_most():
    assert device_sharing.best({1: 100.0, 2: 180.0, 4: 250.0, 8: 255.0}) == 4
    assert device_sharing.best({1: 100.0, 2: 99.0}) == 1
    assert device_sharing.best({1: 100.0, 2: 140.0, 4: 120.0}) == 2


@pytest.mark.slow
@pytest.mark.one_stack("newest")  # the device machine runs the newest jax, as for the stage itself
def test_the_probe_times_processes_sharing_a_core_and_the_stage_reads_its_best(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)
    config = ["--config=configs/transformer.py:pathfinder,mini", *(f"--config.{o}" for o in (
        "batch_size=8", "model.num_layers=1", "model.emb_dim=16", "model.mlp_dim=32", "model.num_heads=2"))]
    record = device_sharing.probe(config, [1, 2], steps=5, warmup=1, kind="cpu", log=lambda line: None)
    assert set(record["counts"]) == {"1", "2"} and record["best"] in (1, 2)
    two = record["counts"]["2"]
    assert len(two["per_run"]) == 2 and len(set(two["slots"])) == 2 and all("(run " in s for s in two["slots"])
    assert two["steps_per_second"] == pytest.approx(2 * 5 / max(r["seconds"] for r in two["per_run"]))
    full_lra_stage.write_json(str(tmp_path / device_sharing.RECORD), record)
    assert device_sharing.read_best(str(tmp_path)) == record["best"]
    assert device_sharing.read_best(str(tmp_path / "none")) is None
