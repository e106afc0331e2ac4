"""Luong "general" attention (Luong et al. 2015), q_i^T W_a k_j / sqrt(d) per head, on an LRA task.

    python -m lra_jax.train --config=configs/luong.py:listops,mini --workdir=runs/luong-mini
    python -m lra_jax.train --config=configs/luong.py              # full-scale ListOps

One run, one machine: mini ListOps test accuracy 0.357 (majority class 0.167; 2-core CPU, seed 0);
the LRA paper has no Luong-attention entry.

On GPU and TPU it runs softmax's flash kernels over the keys W_a k, so every full-scale task fits as
configured: Path-X's train / eval steps compile to 2.08 / 0.52 GiB on an H100, 2.24 / 1.16 GiB per
chip of `tpu-v5e:2x2` (`python -m lra_jax.tools.compile --variants=luong --tasks=pathx
--targets=h100,tpu-v5e:2x2`). With `--config.attention.impl=xla` it forms n x n scores: Path-X then
asks 417 / 256 GiB of one GPU and needs `--config.grad_accum_steps=8`.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="luong"))
