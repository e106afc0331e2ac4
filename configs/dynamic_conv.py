"""Dynamic convolution (Wu et al. 2019, "Pay Less Attention...") in place of attention, on an LRA task.

    python -m lra_jax.train --config=configs/dynamic_conv.py:listops,mini --workdir=runs/dynamic_conv-mini
    python -m lra_jax.train --config=configs/dynamic_conv.py              # full-scale ListOps

Every position predicts its own kernel (heads x `kernel_size`, softmax over the width) from its input.
`kernel_size` 31, the paper's widest; GLU input projection; weight dropout = config.model.attention_dropout_rate.

One run, one machine: mini ListOps test accuracy 0.365 (majority class 0.167; 2-core CPU, seed 0; from
`python -m lra_jax.tools.sweep --variants=dynamic_conv --tasks=listops --root=experiments/mini-lra`); the LRA paper has no
convolution entry.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="dynamic_conv", kernel_size=31, glu=True))
