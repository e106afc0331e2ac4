"""Mega (Ma et al. 2023): single-head gated attention over a damped moving average, bidirectional, on an LRA
task.

    python -m lra_jax.train --config=configs/mega.py:listops,mini --workdir=runs/mega-mini
    python -m lra_jax.train --config=configs/mega.py:pathfinder    # full scale
    python -m lra_jax.train --config=configs/mega.py:pathfinder --config.attention.chunk=128   # Mega-chunk

The layer (lra_jax/attention/recurrent/mega.py) has a 16-dimensional moving average per channel, a shared
representation of 64 and values of 2d, attending to the whole sequence (`chunk` = 0; Mega-chunk with
`chunk` > 0). Full scale uses the task's encoder and optimiser of the LRA paper, as for the attention
variants; the Mega paper's own per-task recipe is not reproduced.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="mega", ema_dim=16, shared_dim=64, expansion=2,
                                                        chunk=0, bidirectional=True))
