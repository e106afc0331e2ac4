"""Sweeps on Slurm: `sweep --executor=slurm` and `--status` against a real one-node cluster (slurmctld,
slurmd; `.ci/slurm-cluster start`), a run preempted with SIGTERM that requeues and ends as an undisturbed
one, `srun --ntasks=2 train --distributed` against one process on two devices; and, without Slurm, the
sbatch command and the states read from scontrol, and the TPU VM launcher's dry run."""

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from distributed_helpers import last_state, metric_lines, run_train, small_flags
from helpers import REPO, child_xla_flags
from run_records import write_run

from lra_jax.research.sweeps import slurm, sweep_plan

MEASURED = ("steps_per_second", "examples_per_second", "host_max_rss_bytes")  # of the process: they may differ
# A one-layer, 16-wide mini ListOps (tests/distributed_helpers.py's SMALL): 400 steps of a few milliseconds, so
# that a SIGTERM sent once the first metrics appear (step 2) still finds the run training.
TINY = ["--config.max_len=32", "--config.data.generator.num_train=256", "--config.data.generator.num_val=40",
        "--config.data.generator.num_test=40", "--config.data.generator.min_length=5",
        "--config.data.generator.max_length=32", "--config.model.num_layers=1", "--config.model.num_heads=2",
        "--config.model.emb_dim=16", "--config.model.mlp_dim=32", "--config.batch_size=8",
        "--config.eval_every=200", "--config.checkpoint_every=200", "--config.log_every=2"]


@functools.cache
def cluster_skip_reason() -> str | None:
    """Why the cluster tests skip here, or None. Asked when the first of them runs, not at import: where
    Slurm is installed but no controller runs, `sinfo` takes seconds to give up, and collecting this file
    (every `pytest`, the fast tier too) would wait for it."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no Slurm here (sinfo, sbatch not on PATH); as root, .ci/slurm-cluster start runs a one-node cluster"
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0 or not {"idle", "mix", "alloc"} & set(done.stdout.split()):
        return (f"no Slurm node answers here (sinfo: {(done.stderr or done.stdout).strip()[:200]}); as root, "
                ".ci/slurm-cluster start runs a one-node cluster")
    return None


def needs_cluster(test):
    """A test against the real cluster: skipped without one, run on one CI stack (they start training
    processes whose outcome does not depend on the jax version) and in the slow tier."""
    @functools.wraps(test)
    def on_the_cluster(*args, **kwargs):
        if cluster_skip_reason() is not None:
            pytest.skip(cluster_skip_reason())
        return test(*args, **kwargs)

    return pytest.mark.slow(pytest.mark.one_stack("oldest")(on_the_cluster))


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
    wait_for(lambda: ("PENDING", 1) in slurm.slurm_view([job["job_id"]]).values(), "the task to be pending again")
    # Slurm holds a requeued job for two minutes before it may start again; start it sooner instead,
    # though not within the second its first start was killed in (slurmd refuses that as revoked).
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job['job_id']}_1", "StartTime=now"], check=True, timeout=30)
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


@needs_cluster
@pytest.mark.multiprocess
def test_srun_two_tasks_find_each_other_from_slurm_and_match_one_process_on_two_devices(tmp_path):
    flags = small_flags(num_train_steps=20, eval_every=10, checkpoint_every=10)
    env = child_env(tmp_path / "cache")
    env["XLA_FLAGS"] = child_xla_flags("--xla_force_host_platform_device_count=1")
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):  # Slurm's alone
        env.pop(name, None)
    two = subprocess.run(["srun", "--ntasks=2", "--cpus-per-task=1", "--kill-on-bad-exit=1", sys.executable, "-m",
                          "lra_jax.train", *flags, "--distributed", f"--workdir={tmp_path / 'two'}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert two.returncode == 0, two.stderr[-3000:]
    one = run_train(flags, tmp_path / "one", tmp_path / "cache", devices=2)
    assert one.returncode == 0, one.stderr[-3000:]
    reference, got = metric_lines(tmp_path / "one"), metric_lines(tmp_path / "two")
    assert [sorted(line) for line in got] == [sorted(line) for line in reference]
    for ref, line in zip(reference, got):  # float32 round-off of sums taken in another order (gloo)
        for key in ref:
            assert line[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (ref["step"], key)
    (step_1, params_1), (step_2, params_2) = last_state(tmp_path / "one"), last_state(tmp_path / "two")
    assert step_1 == step_2 == 20
    assert max(float(np.abs(a - b).max() / (np.abs(a).max() + 1e-12)) for a, b in zip(params_1, params_2)) < 1e-4
    results = read(str(tmp_path / "two" / "results.json"))
    assert results["devices"]["count"] == 2 and results["devices"].get("processes", 2) == 2, results["devices"]


# ----------------------------------------------------------------------------- without Slurm

class FakeSlurm:
    """Answers sbatch with job ids 7, 8, ... and scontrol with `tasks`: {(job id, task): (state, restarts)}."""

    def __init__(self):
        self.calls, self.tasks, self.next_id = [], {}, 7

    def __call__(self, command):
        self.calls.append(command)
        if command[0] == "sbatch":
            self.next_id += 1
            return 0, f"{self.next_id - 1};cluster\n"
        lines = [f"JobId=1{j}{t} ArrayJobId={j} ArrayTaskId={t} JobState={state} Restarts={restarts} Command=x y"
                 for (j, t), (state, restarts) in self.tasks.items()]
        return 0, "\n".join(lines) + "\n"


def plan(root):
    files = {"softmax": "configs/transformer.py", "linformer": "configs/linformer.py"}
    return sweep_plan.plan("softmax,linformer", "listops", ["mini"], ["0", "1"], str(root), files=files,
                           task_names=["listops"], python="python")


def finish(r):
    write_run(r.workdir, {})


def test_submit_builds_one_array_job_records_it_and_submits_only_what_is_missing_or_failed(tmp_path):
    runs, fake = plan(tmp_path), FakeSlurm()
    finish(runs[0])
    options = slurm.Options(partition="gpu", account="lab", time="02:00:00", gpus_per_run=2, cpus_per_run=4,
                            mem="32G", max_running=3)
    job_id, submitted = slurm.submit(runs, str(tmp_path), options, run=fake)
    assert job_id == "7" and submitted == runs[1:]
    sbatch = fake.calls[-1]
    assert sbatch[:3] == ["sbatch", "--parsable", "--job-name=lra-sweep"] and sbatch[-2] == slurm.SCRIPT
    assert {"--array=1-3%3", "--time=02:00:00", "--cpus-per-task=4", "--gres=gpu:2", "--partition=gpu",
            "--account=lab", "--mem=32G", f"--output={tmp_path}/slurm/%x-%A_%a.out"} <= set(sbatch)
    with open(sbatch[-1], encoding="utf-8") as f:
        assert [shlex.split(line) for line in f] == [r.command for r in runs[1:]]
    assert slurm.read_jobs(str(tmp_path))[0]["workdirs"] == [r.workdir for r in runs[1:]]

    fake.tasks = {("7", 1): ("RUNNING", 0), ("7", 2): ("PENDING", 1), ("7", 3): ("FAILED", 0)}
    found = slurm.states(runs, str(tmp_path), run=fake)
    assert [found[r.name][0] for r in runs] == ["done", "running", "requeued", "failed"]
    assert "requeued 1x" in found[runs[2].name][1] and "lra-sweep-7_3.out" in found[runs[3].name][1]
    table = slurm.status_table(runs, found)
    assert table.splitlines()[-1] == "1 done, 1 running, 1 requeued, 1 failed"

    job_id, submitted = slurm.submit(runs, str(tmp_path), options, run=fake)  # only the failed one
    assert job_id == "8" and submitted == [runs[3]] and fake.calls[-1][3] == "--array=1-1%3"
    fake.tasks[("8", 1)] = ("PENDING", 0)
    assert slurm.submit(runs, str(tmp_path), options, run=fake) == (None, [])
    assert len(slurm.read_jobs(str(tmp_path))) == 2
    del fake.tasks[("7", 2)]  # left Slurm without results.json
    assert slurm.states(runs, str(tmp_path), run=fake)[runs[2].name][0] == "failed"


def test_a_pending_range_of_array_tasks_counts_for_each_and_defaults_ask_for_one_gpu(tmp_path):
    fake = FakeSlurm()
    fake.tasks = {("7", "2-4%2"): ("PENDING", 0)}
    assert slurm.slurm_view(["7"], run=fake) == {("7", t): ("PENDING", 0) for t in (2, 3, 4)}
    flags = slurm.Options().sbatch_flags(5, str(tmp_path))
    assert "--gres=gpu:1" in flags and "--array=1-5" in flags and not any(f.startswith("--partition") for f in flags)
    assert "--gres=none" in slurm.Options(gpus_per_run=0).sbatch_flags(1, "r")  # over the script's gpu:1


def test_never_submitted_runs_and_a_damaged_record_are_named(tmp_path):
    runs = plan(tmp_path)
    os.makedirs(os.path.join(runs[1].workdir, "checkpoints"))
    found = slurm.states(runs, str(tmp_path), run=FakeSlurm())
    assert {state for state, _ in found.values()} == {"not submitted"}
    assert found[runs[1].name][1] == "checkpoints to resume from"
    os.makedirs(tmp_path / "slurm")
    (tmp_path / "slurm" / "jobs.json").write_text("[{")
    with pytest.raises(slurm.LraError, match="jobs.json cannot be read"):
        slurm.states(runs, str(tmp_path), run=FakeSlurm())


@pytest.mark.slow
def test_the_tpu_vm_launcher_dry_run_prints_the_commands_it_would_run(tmp_path):
    env = dict(os.environ, DRY_RUN="1", SETUP="1", PROJECT="my-project", REPO_DIR="/opt/lra_jax",
               PYTHON=sys.executable, PYTHONPATH=REPO)
    done = subprocess.run(["bash", os.path.join(REPO, "scripts", "launch_tpu_vm.sh"), "lra-v4-32", "us-central2-b",
                           "--variants=softmax,linformer", "--tasks=listops", "--scales=mini", f"--root={tmp_path}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ssh = [shlex.split(line) for line in done.stdout.splitlines() if line.startswith("gcloud ")]
    prefix = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "lra-v4-32", "--zone", "us-central2-b",
              "--project", "my-project", "--worker=all", "--command"]
    assert len(ssh) == 3 and all(s[:-1] == prefix for s in ssh), done.stdout
    remote = [s[-1] for s in ssh]
    activate = "cd /opt/lra_jax && . .venv/bin/activate && "
    assert remote[0] == activate + "git pull --ff-only && pip install -q -e '.[tpu]'"
    for r, line in zip(plan(tmp_path)[::2], remote[1:]):  # seed 0 of each variant
        assert line == activate + shlex.join(["python", *r.command[1:], "--distributed"])
    assert not os.path.exists(tmp_path / "listops-mini")  # nothing ran
