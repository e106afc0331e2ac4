"""Linear Transformer (Katharopoulos et al. 2020), feature map elu(x) + 1, on an LRA task.

    python -m lra_jax.train --config=configs/linear.py:listops,mini
    python -m lra_jax.train --config=configs/linear.py                 # full-scale ListOps

One run, one machine: mini ListOps test accuracy 0.350 (majority class 0.167; 2-core CPU, seed 0); full-scale
ListOps, LRA paper Table 1: 16.13.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="linear"))
