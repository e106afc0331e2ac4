"""A run's identity, through `python -m lra_jax.train`: a workdir holding another config's run is refused from
whatever record survives (checkpoints deleted, config.json deleted), a cosine run is not extended to more steps
(an rsqrt one is), one process trains in a workdir at a time, and Ctrl-C or SIGTERM saves the step in flight
and exits INTERRUPTED, never 0."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, child_xla_flags

from lra_jax.errors import INTERRUPTED

# Every test here trains through `python -m lra_jax.train` in child processes: the slow tier. What they check
# (records, locks, signals, exit codes) is this package's Python, not the jax version's: CI runs them once.
pytestmark = [pytest.mark.slow, pytest.mark.one_stack("newest")]

LISTOPS = ["--config=configs/transformer.py:listops,mini", "--config.num_train_steps=8", "--config.eval_every=4",
           "--config.checkpoint_every=4", "--config.log_every=4", "--config.max_len=32",
           "--config.model.num_layers=1", "--config.model.emb_dim=16", "--config.model.mlp_dim=32",
           "--config.model.num_heads=2", "--config.data.generator.num_train=128", "--config.data.generator.num_val=32",
           "--config.data.generator.num_test=32", "--config.data.generator.max_length=32"]
PATHFINDER = ["--config=configs/transformer.py:pathfinder,mini", "--config.num_train_steps=6", "--config.eval_every=3",
              "--config.checkpoint_every=3", "--config.log_every=3", "--config.batch_size=16",
              "--config.model.emb_dim=16", "--config.model.mlp_dim=32", "--config.data.generator.num_examples=320"]


def env(tmp_path):
    return dict(os.environ, LRA_JAX_CACHE=str(tmp_path / "cache"), JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags())


def train(tmp_path, *flags, workdir="run"):
    return subprocess.run([sys.executable, "-m", "lra_jax.train", *flags, f"--workdir={tmp_path / workdir}"],
                          cwd=REPO, env=env(tmp_path), capture_output=True, text=True, timeout=300)


def one_error(done) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return errors[0]


def test_another_config_is_refused_from_any_surviving_record_and_nothing_is_overwritten(tmp_path):
    assert train(tmp_path, *LISTOPS).returncode == 0
    run = tmp_path / "run"
    before = {n: (run / n).read_text() for n in ("config.json", "metrics.jsonl", "results.json")}
    shutil.rmtree(run / "checkpoints")  # to save disk
    error = one_error(train(tmp_path, *LISTOPS, "--config.model.emb_dim=32"))
    assert "model.emb_dim differ from its config.json" in error and "pass a new --workdir" in error
    os.remove(run / "config.json")
    error = one_error(train(tmp_path, *LISTOPS, "--config.model.emb_dim=32"))
    assert "model.emb_dim differ from its results.json" in error
    assert {n: (run / n).read_text() for n in ("metrics.jsonl", "results.json")} == \
        {n: before[n] for n in ("metrics.jsonl", "results.json")}
    os.remove(run / "results.json")  # only the log is left: whose run it was cannot be told
    error = one_error(train(tmp_path, *LISTOPS))
    assert "no record of its config" in error and (run / "metrics.jsonl").read_text() == before["metrics.jsonl"]


def test_a_cosine_run_is_not_extended_an_rsqrt_run_is(tmp_path):
    assert train(tmp_path, *PATHFINDER).returncode == 0
    error = one_error(train(tmp_path, *PATHFINDER, "--config.num_train_steps=9"))
    assert "num_train_steps differ" in error and "cosine schedule" in error
    assert json.loads((tmp_path / "run" / "results.json").read_text())["num_train_steps"] == 6

    assert train(tmp_path, *LISTOPS, workdir="rsqrt").returncode == 0
    longer = train(tmp_path, *LISTOPS, "--config.num_train_steps=12", workdir="rsqrt")
    assert longer.returncode == 0 and "resuming from step 8" in longer.stdout, longer.stderr[-2000:]


def test_one_trainer_per_workdir_and_an_interrupted_run_exits_interrupted_and_resumes(tmp_path):
    flags = [*LISTOPS, "--config.num_train_steps=100000", "--config.checkpoint_every=100000"]
    first = subprocess.Popen([sys.executable, "-m", "lra_jax.train", *flags, f"--workdir={tmp_path / 'run'}"],
                             cwd=REPO, env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text():
            assert first.poll() is None and time.monotonic() < deadline, "the first run does not train"
            time.sleep(0.05)
        error = one_error(train(tmp_path, *flags))
        assert "is in use by process" in error and str(first.pid) in error and "pass another --workdir" in error
        first.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == INTERRUPTED, err[-2000:]
    assert "stopped at step" in out and "Traceback" not in err, out[-1000:] + err[-2000:]
    assert not (tmp_path / "run" / "results.json").exists()
    # saved where it stopped, though no checkpoint was due; the same command resumes there
    stopped = int(out.split("stopped at step ")[1].split(";")[0])
    assert os.listdir(tmp_path / "run" / "checkpoints" / "last") == [str(stopped)]
