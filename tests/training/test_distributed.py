"""Several devices in one process, and several processes over localhost (`--distributed`)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from distributed_helpers import SMALL, last_state, metric_lines, run_train, small_flags
from helpers import REPO, child_xla_flags

from lra_jax.errors import INTERRUPTED, LraError
from lra_jax.training import distributed

# The multi-device command, shortened: 400 val and 400 test examples in batches of 8 are
# 50 eval steps each, more than the 32 computations XLA's CPU client admits per device at once;
# the mini model keeps each step slow enough that the old evaluation queued them all (it aborted
# 3 times in 3 like this).
MULTI_DEVICE = ["--config=configs/linformer.py:listops,mini", "--config.data.generator.num_train=256",
                "--config.data.generator.num_val=400", "--config.data.generator.num_test=400",
                "--config.batch_size=8", "--config.num_train_steps=4", "--config.eval_every=2",
                "--config.checkpoint_every=2"]


@pytest.mark.slow
def test_two_device_run_validates_saves_and_tests_without_deadlock(tmp_path):
    # Used to abort in XLA's collective rendezvous (exit 134) when evaluation queued every eval step.
    done = run_train(MULTI_DEVICE, tmp_path / "run", tmp_path / "cache", devices=2)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "run" / "results.json", encoding="utf-8") as f:
        results = json.load(f)
    assert results["devices"]["count"] == 2
    assert 0.0 <= results["test_accuracy"] <= 1.0


SMALL_FLAGS = small_flags()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(workdir, cache, count=2, flags=SMALL_FLAGS):
    """`count` processes of one run over localhost, one CPU device each."""
    port = free_port()
    procs = []
    for index in range(count):
        env = dict(os.environ, LRA_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu",
                   XLA_FLAGS=child_xla_flags("--xla_force_host_platform_device_count=1"),
                   JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(count),
                   JAX_PROCESS_ID=str(index))
        procs.append(subprocess.Popen([sys.executable, "-m", "lra_jax.train", *flags, "--distributed",
                                       f"--workdir={workdir}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs, timeout=240, status=0):
    """Waits for every process; kills them all if one fails or hangs, or exits with another status than
    `status`. Returns (stdout, stderr) pairs."""
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
            assert proc.returncode == status, outputs[-1][1][-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outputs


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_match_one_process_on_two_devices_and_resume_after_sigterm(tmp_path):
    cache = tmp_path / "cache"
    workdir = tmp_path / "two"
    procs = start_processes(workdir, cache)
    try:  # SIGTERM both as soon as training is under way, as a pod preemption would
        deadline = time.monotonic() + 180
        while not (workdir / "metrics.jsonl").exists() or not metric_lines(workdir):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no training"
            time.sleep(0.01)
        for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGCONT):  # both get it before either goes on
            for proc in procs:
                proc.send_signal(sig)
    finally:
        outputs = finish(procs, status=INTERRUPTED)  # an interrupted run never exits 0
    stopped = re.search(r"stopped at step (\d+)", outputs[0][0])
    assert stopped and 2 <= int(stopped.group(1)) < SMALL["num_train_steps"], outputs[0][0][-2000:] + outputs[0][1][-3000:]
    assert "stopped at step" not in outputs[1][0]  # one process reports and writes
    assert last_state(workdir)[0] == int(stopped.group(1))  # one consistent checkpoint of that step
    assert not os.path.exists(workdir / "results.json")

    # The same command resumes; it and the one-process reference end 10 steps after the stop
    # (num_train_steps may change on resume), several log windows, not the 300 steps of the start.
    steps = int(stopped.group(1)) + 10
    finish(start_processes(workdir, cache, flags=small_flags(num_train_steps=steps)))
    one = run_train(small_flags(num_train_steps=steps), tmp_path / "one", cache, devices=2)
    assert one.returncode == 0, one.stderr[-3000:]
    reference, resumed = metric_lines(tmp_path / "one"), metric_lines(workdir)
    assert [sorted(line) for line in resumed] == [sorted(line) for line in reference]
    for ref, got in zip(reference, resumed):
        # float32 round-off of the same sums taken in another order (gloo vs in-process all-reduce)
        for key in ref:
            assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (ref["step"], key)
    (step_1, params_1), (step_2, params_2) = last_state(tmp_path / "one"), last_state(workdir)
    assert step_1 == step_2 == steps
    worst = max(float(np.abs(a - b).max() / (np.abs(a).max() + 1e-12)) for a, b in zip(params_1, params_2))
    print("largest parameter difference relative to the tensor's magnitude", worst)
    assert worst < 1e-4
    with open(workdir / "results.json", encoding="utf-8") as f:
        assert json.load(f)["devices"]["count"] == 2


@pytest.mark.parametrize("flags,env,expected", [
    ((None, 2, 0), {}, "missing --coordinator_address \\(or JAX_COORDINATOR_ADDRESS\\)"),
    ((None, None, None), {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234", "JAX_NUM_PROCESSES": "2"},
     "missing --process_id \\(or JAX_PROCESS_ID\\)"),
    (("localhost", 2, 0), {}, "'localhost' is not HOST:PORT"),
    (("127.0.0.1:1234", 2, 2), {}, "process id 2 is not in 0..1"),
    ((None, None, None), {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     "must be integers"),
])
def test_partial_or_malformed_multi_process_settings_are_named(flags, env, expected, monkeypatch):
    for name in distributed.ENV.values():
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LraError, match=expected):
        distributed.explicit_settings(*flags)


def test_settings_from_flags_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:9999")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert distributed.explicit_settings(None, None, 1) == {
        "coordinator_address": "10.0.0.1:9999", "num_processes": 4, "process_id": 1}
    for name in distributed.ENV.values():
        monkeypatch.delenv(name)
    assert distributed.explicit_settings(None, None, None) is None  # detect the cluster


@pytest.mark.slow
def test_a_partial_setting_on_the_command_line_is_one_line(tmp_path):
    done = run_train(["--config=configs/linformer.py:listops,mini", "--distributed"], tmp_path / "run",
                     tmp_path / "cache", timeout=120, JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="0")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: a multi-process run needs all of"), done.stderr
    assert "Traceback" not in done.stderr


def test_a_mesh_whose_process_rows_are_not_one_block_is_named_with_the_fix(monkeypatch):
    from lra_jax.data import pipeline

    class Interleaved:  # this process's devices hold rows 0-1 and 4-5 of an 8-row batch
        def addressable_devices_indices_map(self, shape):
            return {"d0": (slice(0, 2),), "d1": (slice(4, 6),)}

    monkeypatch.setattr(pipeline, "data_sharding", lambda mesh: Interleaved())
    with pytest.raises(LraError, match=r"not one block.*jax\.make_mesh"):
        pipeline.process_rows(None, 8)

    class Contiguous:
        def addressable_devices_indices_map(self, shape):
            return {"d0": (slice(2, 4),), "d1": (slice(4, 6),)}

    monkeypatch.setattr(pipeline, "data_sharding", lambda mesh: Contiguous())
    assert pipeline.process_rows(None, 8) == slice(2, 6)


SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS", "SLURM_PROCID")


def test_a_slurm_batch_script_is_one_process_on_one_node_and_named_with_the_fix_on_several(monkeypatch):
    for name in SLURM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert distributed.slurm_batch_settings() is None  # not under Slurm
    monkeypatch.setenv("SLURM_JOB_ID", "4097")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert distributed.slurm_batch_settings() == {"coordinator_address": "127.0.0.1:61441", "num_processes": 1,
                                                  "process_id": 0}
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    with pytest.raises(LraError, match="start one process per node with srun, e.g. srun --ntasks=2"):
        distributed.slurm_batch_settings()
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node[01-02]")  # a task of srun: jax's Slurm detection
    assert distributed.slurm_batch_settings() is None
