"""Taylor linear attention, sim = 1 + q^.k^ (Li et al. 2020, arXiv:2007.14902), on an LRA task.

    python -m lra_jax.train --config=configs/taylor.py:listops,mini --workdir=runs/taylor-mini
    python -m lra_jax.train --config=configs/taylor.py              # full-scale ListOps

`scale` is the fixed temperature on q^.k^ (1: the paper's first-order expansion).

One run, one machine: mini ListOps test accuracy 0.364 (majority class 0.167; 2-core CPU, seed 0; from
`python -m lra_jax.tools.sweep --variants=taylor --tasks=listops --root=experiments/mini-lra`); the LRA paper has no
Taylor entry.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="taylor", scale=1.0))
