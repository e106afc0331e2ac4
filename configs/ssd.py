"""SSD, Mamba-2's state-space dual layer (Dao and Gu 2024): the Mamba-2 block, a scalar decay per head over a
matrix state, computed in chunks, bidirectional, on an LRA task.

    python -m lra_jax.train --config=configs/ssd.py:listops,mini --workdir=runs/ssd-mini
    python -m lra_jax.train --config=configs/ssd.py:pathfinder    # full scale

The layer (lra_jax/attention/recurrent/gated.py) has E = 2d in heads of 16, a state of N = 16 shared by the heads, a
4-step convolution and chunks of 64 steps. A_log and D train at the main rate without weight decay
(`optimizer.ssm_max_learning_rate` = 1 caps nothing). The Mamba-2 paper reports no LRA run: full scale uses
the task's encoder and optimiser of the LRA paper, as for the attention variants.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    config = task_defaults.get_config(arg, attention=dict(name="ssd", state_size=16, expand=2, head_size=16,
                                                          conv_kernel=4, chunk=64, bidirectional=True))
    with config.unlocked():
        config.optimizer.ssm_max_learning_rate = 1.0  # A_log and D: the main rate, no weight decay
    return config
