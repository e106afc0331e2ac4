"""`python -m lra_jax.train` as a command: signals at any moment, arguments that are not flags, what
`--estimate` says while it works, and a CPU step refused for the host memory it would take."""

import os
import signal
import subprocess
import sys

import pytest

from helpers import REPO, child_xla_flags

# Messages and exit codes are this package's Python, not the jax version's: CI checks them once.
pytestmark = pytest.mark.one_stack("oldest")

MINI = "--config=configs/transformer.py:listops,mini"
# Mini ListOps shrunk to seconds: 64 short examples, one 16-wide layer.
TINY = [MINI, "--config.num_train_steps=4", "--config.eval_every=4", "--config.checkpoint_every=4",
        "--config.log_every=4", "--config.max_len=32", "--config.batch_size=8", "--config.model.num_layers=1",
        "--config.model.num_heads=2", "--config.model.emb_dim=16", "--config.model.mlp_dim=16",
        "--config.data.generator.num_train=64", "--config.data.generator.num_val=16",
        "--config.data.generator.num_test=16", "--config.data.generator.min_length=10",
        "--config.data.generator.max_length=32"]
INTERRUPTED = 75  # docs/runs.md


def environment(tmp_path) -> dict[str, str]:
    return dict(os.environ, LRA_JAX_CACHE=str(tmp_path / "cache"), JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
                XLA_FLAGS=child_xla_flags())


def start(command: list[str], tmp_path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO, env=environment(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def train_command(*flags, workdir) -> list[str]:
    return [sys.executable, "-m", "lra_jax.train", *flags, f"--workdir={workdir}"]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def _block_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_the_first_instant_is_one_line_and_exit_75_with_nothing_written(sig, tmp_path):
    """The signal is sent as the process starts, held pending (blocked in the child from before the interpreter
    runs) until the command's first line takes it: it lands while the modules import, before anything is built."""
    child = start(train_command(*TINY, workdir=tmp_path / "run"), tmp_path, preexec_fn=_block_stop_signals)
    child.send_signal(sig)
    out, err = child.communicate(timeout=120)
    assert child.returncode == INTERRUPTED, err[-3000:]
    assert one_line(err) == (f"interrupted by {sig.name} while starting; nothing was done: run the same command "
                             "to start") and out == ""
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_data_loads_or_the_step_compiles_is_one_line_and_exit_75(sig, tmp_path):
    """Sent once the run has said its workdir, before its first step (SIGTERM then killed it, exit 143, silent)."""
    workdir = tmp_path / "run"
    child = start(train_command(*TINY, workdir=workdir), tmp_path)
    assert child.stdout.readline() == f"workdir: {workdir}\n"
    child.send_signal(sig)
    out, err = child.communicate(timeout=300)
    assert child.returncode == INTERRUPTED, err[-3000:]
    assert one_line(err) == (f"interrupted outside a training step; nothing was lost: run the same command to go "
                             f"on (workdir {workdir})")
    assert not (workdir / "results.json").exists() and not (workdir / "checkpoints").exists()


def test_an_argument_that_is_not_a_flag_is_one_line_and_exit_2(tmp_path):
    """It printed the whole help and exited 1."""
    done = subprocess.run(train_command(MINI, "stray", "--config.seed=1", "extra", workdir=tmp_path / "run"),
                          cwd=REPO, env=environment(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert one_line(done.stderr).startswith("error: unexpected arguments: stray extra (this command takes flags only")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_estimate_says_what_it_compiles_then_shows_its_steps(tmp_path):
    """Before compiling: what and for which platform, and about how long; then a progress line of the steps run."""
    done = subprocess.run(train_command(*TINY, "--estimate", workdir=tmp_path / "run"), cwd=REPO,
                          env=environment(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines[0] == ("estimating softmax on listops: compiling the mini-scale train step for the cpu (seconds to "
                        "a minute), then running 4 steps"), done.stderr
    assert all(line.startswith("timing the train step: ") for line in lines[1:]) and "4/4" in lines[-1], lines
    assert done.stdout.startswith("softmax on listops (mini scale): about ")


# In the child: the host's available memory is XLA's estimate of the step with 20% and 256 MiB to spare, which
# the check used to pass; 1.5x the step's temporaries (its real need, docs/configs.md) is more.
WITH_ESTIMATE_AS_AVAILABLE = """
import runpy
from lra_jax.training import memory
peak_memory, seen = memory.peak_memory, {}
def recording(compiled):
    seen.update(peak_memory(compiled))
    return seen
memory.peak_memory = recording
memory.available_memory = lambda: (int(1.2 * seen["compiled_step_memory_bytes"]) + 2**28, "this machine's memory")
runpy.run_module("lra_jax.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_cpu_step_that_fits_its_estimate_but_not_the_host_is_refused_before_it_runs(tmp_path):
    """A long sequence on a small model: the step's temporaries are nearly all of XLA's estimate."""
    workdir = tmp_path / "run"
    flags = [*TINY, "--config.max_len=256", "--config.data.generator.max_length=256"]
    done = subprocess.run([sys.executable, "-c", WITH_ESTIMATE_AS_AVAILABLE, *flags, f"--workdir={workdir}"],
                          cwd=REPO, env=environment(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    error = next(line for line in done.stderr.splitlines() if line.startswith("error: "))
    assert error.startswith("error: the train step needs about ") and "GiB of host memory" in error, error
    for fix in ("--config.grad_accum_steps=k", "--config.batch_size (now 8)", "--config=<file>:listops,mini",
                "on a GPU or TPU"):
        assert fix in error, error
    assert "Traceback" not in done.stderr and not (workdir / "metrics.jsonl").exists()
    assert not any(files for _, _, files in os.walk(workdir / "checkpoints"))
