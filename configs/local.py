"""Local (sliding-window) attention, radius `window`, on an LRA task.

    python -m lra_jax.train --config=configs/local.py:listops,mini
    python -m lra_jax.train --config=configs/local.py                  # full-scale ListOps

Unlike the LRA code's blocked "local attention", every query sees the `window` tokens on each side
of it. One run, one machine: mini ListOps test accuracy 0.364 (majority class 0.167; 2-core CPU, seed 0); LRA
paper Table 1 (its blocked variant): 15.82 on ListOps.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention=dict(name="local", window=16 if scale == "mini" else 128))
