"""S6, Mamba's selective state space (Gu and Dao 2023): the Mamba block in place of attention, bidirectional,
on an LRA task.

    python -m lra_jax.train --config=configs/s6.py:listops,mini --workdir=runs/s6-mini
    python -m lra_jax.train --config=configs/s6.py:pathfinder    # full scale

The layer is the Mamba block with state size N = 16, E = 2d, a 4-step convolution and Δ of rank
ceil(d / 16), scanned in chunks of 16 steps, run in both directions (lra_jax/attention/recurrent/selective.py). A_log and D train at the main rate
without weight decay, as in the paper (`optimizer.ssm_max_learning_rate` = 1 caps nothing). The Mamba paper
reports no LRA run: full scale uses the task's encoder and optimiser of the LRA paper, as for the attention
variants.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    config = task_defaults.get_config(arg, attention=dict(name="s6", state_size=16, expand=2, conv_kernel=4, chunk=16,
                                                          bidirectional=True))
    with config.unlocked():
        config.optimizer.ssm_max_learning_rate = 1.0  # A_log and D: the main rate, no weight decay
    return config
