"""gMLP spatial gating unit (Liu et al. 2021) as the token mixer, on an LRA task.

    python -m lra_jax.train --config=configs/gmlp.py:listops,mini --workdir=runs/gmlp-mini
    python -m lra_jax.train --config=configs/gmlp.py              # full-scale ListOps

`expansion=2`: the gated channels are 2 * emb_dim, split into two halves of emb_dim.

One run, one machine: mini ListOps test accuracy 0.345 (majority class 0.167; 2-core CPU, seed 0);
the LRA paper has no gMLP entry.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="gmlp", expansion=2))
