"""Vanilla Transformer (full softmax attention; Vaswani et al. 2017) on an LRA task.

    python -m lra_jax.train --config=configs/transformer.py:listops,mini
    python -m lra_jax.train --config=configs/transformer.py            # full-scale ListOps

One run, one machine: mini ListOps test accuracy 0.362 (majority class 0.167; 2-core CPU, seed 0); full-scale
ListOps, LRA paper Table 1: 36.37 test accuracy.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="softmax"))
