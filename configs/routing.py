"""Routing Transformer (Roy et al. 2021): attention within online k-means clusters, on an LRA task.

    python -m lra_jax.train --config=configs/routing.py:listops,mini
    python -m lra_jax.train --config=configs/routing.py              # full-scale ListOps

Full scale: 16 clusters of ceil(2001 / 16) = 126 tokens (about the `local` window), centroid EMA
decay 0.999 (the paper's). Mini: 8 clusters of ceil(129 / 8) = 17 tokens.

One run, one machine: mini ListOps test accuracy 0.364 (majority class 0.167; 2-core CPU, seed 0; from
`python -m lra_jax.tools.sweep --variants=routing --tasks=listops --root=experiments/mini-lra`).
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention={"name": "routing", "num_clusters": 8 if scale == "mini" else 16,
                                               "decay": 0.999})
