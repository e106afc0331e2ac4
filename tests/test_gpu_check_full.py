""".ci/gpu-check's listops-full stage, run as a GPU machine runs it but at mini scale on the CPU with tiny runs:
the precision check and its record, the runs in order in the layout the chart reads, their scale, a second
call that skips what is finished, and the tar.gz that brings the results back (unfinished runs left out).
The precision decision itself is checked on given summaries.
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
from lra_jax.experiments import full_scale, lra_results

STAGE = os.path.join(config_paths.REPO_ROOT, ".ci", "gpu-check")
VARIANTS = ("softmax", "local")
STEPS, PRECISION_STEPS = 4, 2
TINY = ("--config.max_len=32 --config.batch_size=16 --config.model.num_layers=1 --config.model.emb_dim=16 "
        "--config.model.mlp_dim=32 --config.model.num_heads=2 --config.data.generator.num_train=256 "
        "--config.data.generator.num_val=64 --config.data.generator.num_test=64 "
        "--config.data.generator.min_length=5 --config.data.generator.max_length=32")


def run_stage(tmp_path, out: str) -> subprocess.CompletedProcess:
    """`.ci/gpu-check listops-full` at mini scale, everything it writes under tmp_path."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}  # the stage's own knobs
    env = dict(inherited, OUT=str(tmp_path / out), PYTHON=sys.executable, JAX_PLATFORMS="cpu",
               LRA_JAX_CACHE=str(tmp_path / "cache"), XLA_FLAGS=FAST_COMPILE, GPU_CHECK_FULL_SCALE="mini",
               GPU_CHECK_FULL_ROOT=str(tmp_path / "root"),
               GPU_CHECK_FULL_ARGS=f"--scratch={tmp_path / 'scratch'} --variants={','.join(VARIANTS)} "
                                   f"--steps={STEPS} --precision_steps={PRECISION_STEPS} -- {TINY}")
    return subprocess.run(["bash", STAGE, "listops-full"], env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def read(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.one_stack("newest")  # the device machine runs the newest jax; the stage is one process tree
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="the stage is a bash script run under coreutils' timeout")
def test_the_stage_at_mini_scale_checks_precision_trains_in_order_and_packs_what_the_chart_reads(tmp_path):
    done = run_stage(tmp_path, "out1")
    log = (tmp_path / "out1" / "listops-full.log").read_text(encoding="utf-8")
    assert done.returncode == 0 and "== listops-full: exit 0" in done.stdout, done.stdout + done.stderr + log[-3000:]
    cell = tmp_path / "root" / "listops-mini"

    record = read(cell / "precision.json")
    assert record["scale"] == "mini" and record["steps"] == PRECISION_STEPS
    for dtype in full_scale.DTYPES:  # both check runs finished, in the scratch root, not among the results
        assert record[dtype]["status"] == "complete" and record[dtype]["run"].endswith(f"model.dtype={dtype}/seed0")
        assert read(tmp_path / "scratch" / record[dtype]["run"] / "config.json")["model"]["dtype"] == dtype
    faster = record["bfloat16_speedup"] > 1
    assert record["dtype"] == ("bfloat16" if record["holds"] and faster else "float32")

    starts = [line.split(":")[0] for line in log.splitlines() if line.endswith(": starting")]
    assert starts == [f"listops-mini/softmax/model.dtype={d}/seed0" for d in full_scale.DTYPES] + \
        [f"listops-mini/{v}/seed0" for v in VARIANTS], log[-3000:]
    for variant in VARIANTS:
        results = read(cell / variant / "seed0" / "results.json")
        assert (results["status"], results["task"], results["scale"], results["variant"]) == \
            ("complete", "listops", "mini", variant)
        assert results["num_train_steps"] == STEPS
        model = results["config"]["model"]
        assert (model["dtype"], model["remat"], model["scan_layers"]) == (record["dtype"], False, False)

    # what the chart reads: these runs, of this scale, and nothing of the precision check
    runs = lra_results.read_runs(str(tmp_path / "root"))
    assert sorted((r.task, r.scale, r.variant, r.point, r.seed) for r in runs) == \
        sorted(("listops", "mini", v, "", 0) for v in VARIANTS)

    # what comes back from the device: unpacked into a fresh root, the chart reads the same runs
    with tarfile.open(tmp_path / "out1" / "listops-full.tar.gz") as tar:
        names = sorted(tar.getnames())
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert names == sorted(["listops-mini/precision.json"] + [f"listops-mini/{v}/seed0/{f}" for v in VARIANTS
                                                              for f in full_scale.PACKED_FILES])
    unpacked = lra_results.read_runs(str(tmp_path / "unpacked"))
    assert sorted((r.variant, r.test_accuracy) for r in unpacked) == sorted((r.variant, r.test_accuracy) for r in runs)

    # the next call: the recorded check is reused and the finished runs are skipped, nothing trains
    again = run_stage(tmp_path, "out2")
    log = (tmp_path / "out2" / "listops-full.log").read_text(encoding="utf-8")
    assert again.returncode == 0 and "precision check recorded earlier" in log, log[-3000:]
    assert ": starting" not in log and log.count("done, skipped") == len(VARIANTS), log[-3000:]
    with tarfile.open(tmp_path / "out2" / "listops-full.tar.gz") as tar:
        assert sorted(tar.getnames()) == names


def test_pack_leaves_out_unfinished_runs_and_checkpoints(tmp_path):
    cell = tmp_path / "listops-full"
    for variant, finished in (("softmax", True), ("local", False)):
        workdir = cell / variant / "seed0"
        (workdir / "checkpoints" / "last" / "500").mkdir(parents=True)
        (workdir / "config.json").write_text("{}", encoding="utf-8")
        (workdir / "metrics.jsonl").write_text('{"step": 50, "train/loss": 2.0}\n', encoding="utf-8")
        if finished:
            (workdir / "results.json").write_text('{"status": "complete"}', encoding="utf-8")
    names = full_scale.pack(str(tmp_path), "full", str(tmp_path / "out" / "packed.tar.gz"))
    assert sorted(names) == [f"listops-full/softmax/seed0/{f}" for f in sorted(full_scale.PACKED_FILES)]


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
    record = full_scale.compare_precision(F32, {**F32, "run": "bf16", **bf16}, 300, "full")
    assert record["dtype"] == dtype and says in record["reason"]
    assert record["holds"] == (says == "within tolerance" or "not faster" in says)


def test_a_check_whose_float32_run_is_at_the_majority_rate_says_so_and_a_failed_float32_is_an_error():
    record = full_scale.compare_precision({**F32, "val_accuracy": 0.18}, {**F32, "val_accuracy": 0.18,
                                                                          "steps_per_second": 18.0}, 300, "full")
    assert record["dtype"] == "bfloat16" and "near the majority-class rate" in record["notes"][0]
    for status in ("diverged", "failed"):
        with pytest.raises(LraError, match=f"float32 run f32 {status}: the recipe itself fails"):
            full_scale.compare_precision({**F32, "status": status}, F32, 300, "full")
