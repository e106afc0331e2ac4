"""Longformer (Beltagy et al. 2020): sliding window of radius `window` + `num_global` global tokens.

    python -m lra_jax.train --config=configs/longformer.py:listops,mini
    python -m lra_jax.train --config=configs/longformer.py                  # full-scale ListOps

The first `num_global` positions are global (1: the CLS token), with their own Q/K/V projections;
the LRA code had no global token. One run, one machine: mini ListOps test accuracy 0.389 (majority class 0.167;
2-core CPU, seed 0); LRA paper Table 1 (Longformer): 35.63 on ListOps.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(
        arg, attention=dict(name="longformer", window=16 if scale == "mini" else 128, num_global=1)
    )
