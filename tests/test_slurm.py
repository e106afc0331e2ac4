"""Sweeps on Slurm: `sweep --executor=slurm` and `--status` against a real one-node cluster (slurmctld,
slurmd; `.ci/slurm-cluster start`), a run preempted with SIGTERM that requeues and ends as an undisturbed
one, `srun --ntasks=2 train --distributed` against one process on two devices; and, without Slurm, the
sbatch command and the states read from scontrol, and the TPU VM launcher's dry run."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import child_xla_flags

from lra_jax.experiments import slurm, sweep_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURED = ("steps_per_second", "examples_per_second", "host_max_rss_bytes")  # of the process: they may differ
# A one-layer, 16-wide mini ListOps (tests/test_distributed.py's): 400 steps of a few milliseconds, so
# that a SIGTERM sent once the first metrics appear (step 2) still finds the run training.
TINY = ["--config.max_len=32", "--config.data.generator.num_train=256", "--config.data.generator.num_val=40",
        "--config.data.generator.num_test=40", "--config.data.generator.min_length=5",
        "--config.data.generator.max_length=32", "--config.model.num_layers=1", "--config.model.num_heads=2",
        "--config.model.emb_dim=16", "--config.model.mlp_dim=32", "--config.batch_size=8",
        "--config.eval_every=200", "--config.checkpoint_every=200", "--config.log_every=2"]


def cluster_skip_reason() -> str | None:
    if os.environ.get("LRA_JAX_SLURM_TESTS") == "0":
        return "LRA_JAX_SLURM_TESTS=0: the Slurm tests run on the other CI stack"
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no Slurm here (sinfo, sbatch not on PATH); as root, .ci/slurm-cluster start runs a one-node cluster"
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0 or not {"idle", "mix", "alloc"} & set(done.stdout.split()):
        return f"no Slurm node answers here (sinfo: {(done.stderr or done.stdout).strip()[:200]})"
    return None


needs_cluster = pytest.mark.skipif(cluster_skip_reason() is not None, reason=str(cluster_skip_reason()))


def child_env(cache) -> dict:
    """The children's environment: CPU, this session's compilation cache (a run compiled once is a lookup)."""
    env = dict(os.environ, LRA_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags(),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if "LRA_JAX_TEST_XLA_CACHE" in env:
        env["JAX_COMPILATION_CACHE_DIR"] = env["LRA_JAX_TEST_XLA_CACHE"]
    return env


def sweep(root, env, *flags, steps=400, timeout=600):
    return subprocess.run([sys.executable, "-m", "lra_jax.tools.sweep", "--variants=softmax,linformer",
                           "--tasks=listops", "--scales=mini", f"--root={root}", *flags, "--",
                           *TINY, f"--config.num_train_steps={steps}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f] if path.endswith(".jsonl") else json.load(f)


def wait_for(condition, what, timeout=300):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@needs_cluster
def test_a_sweep_submitted_to_slurm_and_preempted_ends_as_the_local_sweep_and_is_not_submitted_twice(tmp_path):
    env = child_env(tmp_path / "cache")
    local = sweep(tmp_path / "local", env)
    assert local.returncode == 0, local.stderr[-3000:]

    root = tmp_path / "slurm"
    resources = ["--executor=slurm", "--gpus_per_run=0", "--cpus_per_run=1", "--time=00:10:00"]
    submitted = sweep(root, env, *resources)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert "submitted 2 runs as Slurm array job" in submitted.stdout, submitted.stdout
    (job,) = slurm.read_jobs(str(root))
    preempted = root / "listops-mini" / "softmax" / "seed0"
    assert job["workdirs"][0] == str(preempted)

    # Preempt the first run as soon as it trains: Slurm's SIGTERM to the batch script, as at a time limit.
    wait_for(lambda: (preempted / "metrics.jsonl").exists() and read(str(preempted / "metrics.jsonl")),
             "the first run's metrics")
    subprocess.run(["scancel", "--batch", "--signal=TERM", f"{job['job_id']}_1"], check=True, timeout=30)
    log = root / "slurm" / f"lra-sweep-{job['job_id']}_1.out"
    wait_for(lambda: "requeueing" in log.read_text(), "the task to requeue itself")
    status = sweep(root, env, "--status")
    assert status.returncode == 0, status.stderr[-3000:]
    assert "listops-mini/softmax/seed0" in status.stdout and "requeued 1x" in status.stdout, status.stdout

    # Submitting again while both are queued or running submits nothing.
    again = sweep(root, env, *resources)
    assert "nothing to submit" in again.stdout, again.stdout + again.stderr[-2000:]
    assert len(slurm.read_jobs(str(root))) == 1

    wait_for(lambda: all((root / "listops-mini" / v / "seed0" / "results.json").exists()
                         for v in ("softmax", "linformer")), "both runs to finish", timeout=600)
    text = log.read_text()
    assert "stopped at step" in text and "(restart 1)" in text, text[-3000:]
    for variant in ("softmax", "linformer"):
        here, there = tmp_path / "local" / "listops-mini" / variant / "seed0", root / "listops-mini" / variant / "seed0"
        assert read(str(there / "metrics.jsonl")) == read(str(here / "metrics.jsonl")), variant
        expected, got = read(str(here / "results.json")), read(str(there / "results.json"))
        assert {k: v for k, v in got.items() if k not in MEASURED} == {
            k: v for k, v in expected.items() if k not in MEASURED}, variant

    status = sweep(root, env, "--status")
    assert status.stdout.strip().splitlines()[-1] == "2 done", status.stdout
    again = sweep(root, env, *resources)
    assert "nothing to submit" in again.stdout, again.stdout + again.stderr[-2000:]
    assert len(slurm.read_jobs(str(root))) == 1
