"""Luong "general" attention (Luong et al. 2015), q_i^T W_a k_j / sqrt(d) per head, on an LRA task.

    python -m lra_jax.train --config=configs/luong.py:listops,mini --workdir=runs/luong-mini
    python -m lra_jax.train --config=configs/luong.py              # full-scale ListOps

Expected: mini ListOps test accuracy 0.357 (majority class 0.167; 2-core CPU, seed 0);
the LRA paper has no Luong-attention entry.
"""

from lra_jax import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="luong"))
