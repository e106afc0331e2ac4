"""Fault injection: a training process killed with SIGKILL during a step, during an evaluation and
during a checkpoint save (kill points drawn from a seed) resumes each time with the same command,
and ends with the metrics.jsonl and results.json of an undisturbed run."""

import json
import os
import signal
import subprocess
import sys

import jax
import killed_training
import numpy as np
import pytest

from lra_jax.config.settings import from_config
from lra_jax.training import trainer

# Four training processes, three of them killed: the slow tier.
pytestmark = pytest.mark.slow

SEED = 27
MEASURED = ("steps_per_second", "examples_per_second", "host_max_rss_bytes")  # of the process: they may differ


def read(workdir: str, name: str):
    with open(os.path.join(workdir, name)) as f:
        return [json.loads(line) for line in f] if name.endswith(".jsonl") else json.load(f)


def test_a_run_killed_during_a_step_an_evaluation_and_a_save_resumes_to_the_undisturbed_end(tmp_path, data_cache):
    undisturbed = str(tmp_path / "undisturbed")
    trainer.train_and_evaluate(from_config(killed_training.config(str(data_cache))), undisturbed)

    rng = np.random.default_rng(SEED)
    # Each is reached whatever the run resumed from: a step within the first 5 (a checkpoint every 2),
    # a batch of the next evaluation (4 batches each), one of the next 3 saves.
    kills = [("step", int(rng.integers(1, 6))), ("eval", int(rng.integers(1, 5))), ("save", int(rng.integers(1, 4)))]
    workdir = str(tmp_path / "killed")
    xla_cache = jax.config.jax_compilation_cache_dir or str(tmp_path / "xla")  # the session's: steps compiled once
    command = [sys.executable, killed_training.__file__, str(data_cache), workdir, xla_cache]
    for where, n in kills:
        done = subprocess.run([*command, where, str(n)], capture_output=True, text=True, timeout=300)
        assert done.returncode == -signal.SIGKILL, (where, n, done.stderr[-3000:])
    if os.path.isdir(os.path.join(workdir, "checkpoints")):
        assert not os.path.exists(os.path.join(workdir, "results.json"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr

    assert read(workdir, "metrics.jsonl") == read(undisturbed, "metrics.jsonl")
    expected, results = read(undisturbed, "results.json"), read(workdir, "results.json")
    assert {k: v for k, v in results.items() if k not in MEASURED} == {k: v for k, v in expected.items()
                                                                     if k not in MEASURED}
    debris = [d for _, dirs, _ in os.walk(workdir) for d in dirs if d.endswith(".orbax-checkpoint-tmp")]
    assert debris == []
