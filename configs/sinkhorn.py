"""Sparse Sinkhorn attention (Tay et al. 2020): own block + a Gumbel-Sinkhorn sorted block, on an LRA task.

    python -m lra_jax.train --config=configs/sinkhorn.py:listops,mini
    python -m lra_jax.train --config=configs/sinkhorn.py              # full-scale ListOps

Full scale: blocks of 50 tokens (the LRA code's block_size), 5 Sinkhorn iterations, temperature 1.0.
Mini: blocks of 16 tokens (9 blocks at length 129).

One run, one machine: mini ListOps test accuracy 0.400 (majority class 0.167; 2-core CPU, seed 0; from
`python -m lra_jax.tools.sweep --variants=sinkhorn --tasks=listops --root=experiments/mini-lra`).
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention={"name": "sinkhorn", "block": 16 if scale == "mini" else 50,
                                               "sinkhorn_iterations": 5, "temperature": 1.0})
