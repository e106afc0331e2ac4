"""Luong "general" attention (Luong et al. 2015), q_i^T W_a k_j / sqrt(d) per head, on an LRA task.

    python -m lra_jax.train --config=configs/luong.py:listops,mini --workdir=runs/luong-mini
    python -m lra_jax.train --config=configs/luong.py              # full-scale ListOps

Expected: mini ListOps test accuracy 0.357 (majority class 0.167; 2-core CPU, seed 0);
the LRA paper has no Luong-attention entry.

Full-scale Path-X (64 examples of 16,384 tokens) forms n x n scores and does not fit one 80 GB GPU:
compiled for an H100 or A100 its train step asks for 417 GiB and its eval step for 256 GiB. There pass
`--config.grad_accum_steps=8` (8 examples at a time: 52 / 32 GiB compiled;
`python -m lra_jax.tools.compile --variants=luong --tasks=pathx --targets=h100` prints the plan).
On TPU slices it fits 4 examples per device at a time (12.07 / 8.07 GiB compiled): pass
`--config.grad_accum_steps=4` on `tpu-v5e:2x2` (4 chips of 16 GiB) and `=2` on `tpu-v4:2x2x1`
(8 TensorCores of 16 GiB).
"""

from lra_jax import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="luong"))
