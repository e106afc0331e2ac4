"""LRU, the Linear Recurrent Unit (Orvieto et al. 2023): a diagonal complex recurrence with ring
initialisation and normalisation, computed by a parallel scan, not attention, on an LRA task.

    python -m lra_jax.train --config=configs/lru.py:listops,mini --workdir=runs/lru-mini
    python -m lra_jax.train --config=configs/lru.py:pathfinder   # full scale

The layer is a bidirectional LRU with N = 64 complex states, GELU and a GLU output projection
(lra_jax/attention/recurrent/diagonal.py). ν, θ and log γ train with no weight decay at
min(`optimizer.ssm_max_learning_rate` = 0.001, the main peak), the rest at `optimizer.learning_rate`.

Full scale uses the task's encoder and optimiser of the LRA paper, as for the attention variants, with the
LRU in place of attention; the LRU paper's own per-task radii and recipe are not reproduced: the ring is
r in [0, 0.99], phases in [0, 2π] (`--config.attention.r_min=0.9` and so on to change them).
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    config = task_defaults.get_config(arg, attention=dict(name="lru", state_size=64, r_min=0.0, r_max=0.99,
                                                          bidirectional=True, glu=True))
    with config.unlocked():
        config.optimizer.ssm_max_learning_rate = 0.001
    return config
