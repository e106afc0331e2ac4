"""Strided attention (Sparse Transformer, Child et al. 2019), stride `stride`, on an LRA task.

    python -m lra_jax.train --config=configs/strided.py:listops,mini
    python -m lra_jax.train --config=configs/strided.py                  # full-scale ListOps

Half the heads attend within their block of `stride` tokens, half to every `stride`-th token.
One run, one machine: mini ListOps test accuracy 0.340 (majority class 0.167; 2-core CPU, seed 0); LRA paper
Table 1 (Sparse Trans.): 17.07 on ListOps.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention=dict(name="strided", stride=16 if scale == "mini" else 128))
