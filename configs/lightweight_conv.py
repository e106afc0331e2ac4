"""Lightweight convolution (Wu et al. 2019, "Pay Less Attention...") in place of attention, on an LRA task.

    python -m lra_jax.train --config=configs/lightweight_conv.py:listops,mini --workdir=runs/lightweight_conv-mini
    python -m lra_jax.train --config=configs/lightweight_conv.py              # full-scale ListOps

`kernel_size` 31, the paper's widest kernel (its encoders use 3, 7, 15, 31, 31, 31, 31); one kernel per
head (config.model.num_heads); GLU input projection; weight dropout = config.model.attention_dropout_rate.

One run, one machine: mini ListOps test accuracy 0.366 (majority class 0.167; 2-core CPU, seed 0; from
`python -m lra_jax.tools.sweep --variants=lightweight_conv --tasks=listops --root=experiments/mini-lra`); the LRA paper has no
convolution entry.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="lightweight_conv", kernel_size=31, glu=True))
