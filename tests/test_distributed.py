"""Several devices in one process, and several processes over localhost (`--distributed`)."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The multi-device command, shortened: 400 val and 400 test examples in batches of 8 are
# 50 eval steps each, more than the 32 computations XLA's CPU client admits per device at once;
# the mini model keeps each step slow enough that the old evaluation queued them all (it aborted
# 3 times in 3 like this).
MULTI_DEVICE = ["--config=configs/linformer.py:listops,mini", "--config.data.generator.num_train=256",
                "--config.data.generator.num_val=400", "--config.data.generator.num_test=400",
                "--config.batch_size=8", "--config.num_train_steps=4", "--config.eval_every=2",
                "--config.checkpoint_every=2"]

def run_train(flags, workdir, cache, devices=1, timeout=240, **env):
    env = dict(os.environ, LRA_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu", **env,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
                         "--xla_cpu_collective_call_terminate_timeout_seconds=15")
    return subprocess.run([sys.executable, "-m", "lra_jax.train", *flags, f"--workdir={workdir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_two_device_run_validates_saves_and_tests_without_deadlock(tmp_path):
    # Used to abort in XLA's collective rendezvous (exit 134) when evaluation queued every eval step.
    done = run_train(MULTI_DEVICE, tmp_path / "run", tmp_path / "cache", devices=2)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "run" / "results.json", encoding="utf-8") as f:
        results = json.load(f)
    assert results["devices"]["count"] == 2
    assert 0.0 <= results["test_accuracy"] <= 1.0
