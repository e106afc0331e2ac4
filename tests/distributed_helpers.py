"""Training processes run through `python -m lra_jax.train` over CPU devices, and what they leave behind:
shared by the multi-device tests (tests/training/test_distributed.py) and the Slurm tests
(tests/research/sweeps/test_slurm.py)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
from helpers import REPO, child_xla_flags


def run_train(flags, workdir, cache, devices=1, timeout=240, **env):
    env = dict(os.environ, LRA_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu", **env,
               XLA_FLAGS=child_xla_flags(f"--xla_force_host_platform_device_count={devices}",
                                         "--xla_cpu_collective_call_terminate_timeout_seconds=15"))
    return subprocess.run([sys.executable, "-m", "lra_jax.train", *flags, f"--workdir={workdir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


# A one-layer, 16-wide mini ListOps that trains in seconds; batch 8 is split over two devices. 300
# steps, so that a test which signals once the first metrics appear (step 2) still finds the run
# training when the busiest machine lets it act (40 steps were over before it did, under pytest -n);
# the resumed run and its reference then stop a few log windows after the stop (`small_flags`).
SMALL = {"max_len": 32, "attention.k": 8, "data.generator.num_train": 256, "data.generator.num_val": 40,
         "data.generator.num_test": 40, "data.generator.min_length": 5, "data.generator.max_length": 32,
         "model.num_layers": 1, "model.num_heads": 2, "model.emb_dim": 16, "model.mlp_dim": 32,
         "model.dropout_rate": 0.1, "batch_size": 8, "num_train_steps": 300, "eval_every": 100,
         "checkpoint_every": 100, "log_every": 2}
def small_flags(**changes) -> list[str]:
    settings = {**SMALL, **changes}
    return ["--config=configs/linformer.py:listops,mini", *(f"--config.{k}={v}" for k, v in settings.items())]


def metric_lines(workdir):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def last_state(workdir):
    """(step, parameters as numpy arrays) of the newest checkpoint."""
    directory = os.path.join(workdir, "checkpoints", "last")
    step = max(int(name) for name in os.listdir(directory) if name.isdigit())  # the newest of those kept
    checkpointer = ocp.StandardCheckpointer()
    path = os.path.join(directory, str(step), "state")
    metadata = checkpointer.metadata(path)
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # saved over two devices, read on one
    like = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                        getattr(metadata, "item_metadata", metadata))
    state = checkpointer.restore(path, like)
    assert int(state["step"]) == step
    return step, [np.asarray(x) for x in jax.tree.leaves(state["params"])]
