"""BigBird (Zaheer et al. 2020, ITC): blocks of `block` tokens, 3-block window, global and random blocks.

    python -m lra_jax.train --config=configs/bigbird.py:listops,mini
    python -m lra_jax.train --config=configs/bigbird.py                  # full-scale ListOps

The random block layout is drawn from the init key (config.seed) and saved with the model.
One run, one machine: mini ListOps test accuracy 0.372 (majority class 0.167; 2-core CPU, seed 0); LRA paper
Table 1 (BigBird): 36.05 on ListOps.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    block = 16 if scale == "mini" else 64
    return task_defaults.get_config(
        arg, attention=dict(name="bigbird", block=block, num_global_blocks=1, num_random_blocks=3)
    )
