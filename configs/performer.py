"""Performer (FAVOR+, Choromanski et al. 2021) with positive orthogonal random features, on an LRA task.

    python -m lra_jax.train --config=configs/performer.py:listops,mini
    python -m lra_jax.train --config=configs/performer.py              # full-scale ListOps

One run, one machine: mini ListOps test accuracy 0.362 (majority class 0.167; 2-core CPU, seed 0); full-scale
ListOps, LRA paper Table 1: 18.01.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention=dict(name="performer", num_features=64 if scale == "mini" else 256,
                                               redraw=False))
