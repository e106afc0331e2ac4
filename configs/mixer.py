"""MLP-Mixer token mixing (Tolstikhin et al. 2021) in place of attention, on an LRA task.

    python -m lra_jax.train --config=configs/mixer.py:listops,mini --workdir=runs/mixer-mini
    python -m lra_jax.train --config=configs/mixer.py              # full-scale ListOps

`hidden` is the width of the MLP along the length (the paper's D_S): 256 at full scale, 64 at mini.

One run, one machine: mini ListOps test accuracy 0.383 (majority class 0.167; 2-core CPU, seed 0);
the LRA paper has no MLP-Mixer entry.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention=dict(name="mixer", hidden=64 if scale == "mini" else 256))
