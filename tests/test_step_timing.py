"""step_timing: random batches of a task's shape, and `train --estimate` (a run's projected training time)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lra_jax import step_timing
from lra_jax.data import tasks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("task", ["listops", "retrieval"])
def test_random_batch_has_the_task_shape_ragged_lengths_and_no_ids_outside_the_vocabulary(task):
    spec = tasks.get_task(task)
    batch = step_timing.random_batch(spec, batch_size=64, max_len=40, seed=0)
    tokens = batch["inputs"]
    assert tokens.shape == ((64, 2, 40) if spec.dual else (64, 40)) and tokens.dtype == np.int32
    lengths = (tokens > 0).sum(-1)
    assert lengths.min() >= 20 and lengths.max() <= 40 and len(np.unique(lengths)) > 1
    assert np.all((tokens > 0).cumsum(-1)[..., -1] == lengths)  # padding only at the end
    assert tokens.max() < spec.vocab_size
    assert set(np.unique(batch["label"])) <= set(range(spec.num_classes))
    assert np.array_equal(tokens, step_timing.random_batch(spec, 64, 40, seed=0)["inputs"])


def test_train_estimate_prints_a_projection_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "lra_jax.train", "--config=configs/transformer.py:retrieval,mini", "--estimate",
         f"--workdir={workdir}", "--config.model.emb_dim=16", "--config.model.mlp_dim=16",
         "--config.model.num_heads=2", "--config.max_len=32", "--config.batch_size=4",
         "--config.num_train_steps=500", "--config.data.data_dir=/nonexistent"],  # no data is read
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    estimate = json.loads(out.stdout.strip().splitlines()[-1])
    assert (estimate["task"], estimate["variant"], estimate["max_len"], estimate["num_train_steps"]) == (
        "retrieval", "softmax", 32, 500)
    assert estimate["seconds_per_step"] > 0 and estimate["compile_seconds"] > 0
    assert estimate["projected_train_seconds"] == pytest.approx(
        estimate["compile_seconds"] + 500 * estimate["seconds_per_step"])
    assert not workdir.exists()
