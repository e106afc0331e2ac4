"""FNet (Lee-Thorp et al. 2021): Fourier token mixing in place of attention, on an LRA task.

    python -m lra_jax.train --config=configs/fnet.py:listops,mini --workdir=runs/fnet-mini
    python -m lra_jax.train --config=configs/fnet.py              # full-scale ListOps

`out_proj=True` adds a learned output projection after the transform; `--config.attention.out_proj=False`
gives the paper's parameter-free Fourier sublayer.

One run, one machine: mini ListOps test accuracy 0.343 (majority class 0.167; 2-core CPU, seed 0);
the LRA paper has no FNet entry.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="fnet", out_proj=True))
