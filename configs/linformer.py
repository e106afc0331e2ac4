"""Linformer (Wang et al. 2020): keys and values projected to `k` positions, on an LRA task.

    python -m lra_jax.train --config=configs/linformer.py:listops,mini --workdir=runs/linformer-mini
    python -m lra_jax.train --config=configs/linformer.py              # full-scale ListOps

One run, one machine: mini ListOps test accuracy 0.358 (majority class 0.167; 2-core CPU, seed 0); full-scale
ListOps, LRA paper Table 1: 35.70 test accuracy.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention=dict(name="linformer", k=32 if scale == "mini" else 256))
