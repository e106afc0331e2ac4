"""Synthesizer (Tay et al. 2021): attention weights synthesised without dot products, on an LRA task.

    python -m lra_jax.train --config=configs/synthesizer.py:listops,mini --workdir=runs/synthesizer-mini
    python -m lra_jax.train --config=configs/synthesizer.py              # full-scale ListOps, dense mode

Other modes: `--config.attention.mode=random` (learned R; add `--config.attention.random_trainable=False`
for fixed random), `--config.attention.mode=factorized_random --config.attention.factor=8`; mix in
dot-product logits with e.g. `--config.attention.mix=1.0`.

Expected: mini ListOps test accuracy 0.379 (majority class 0.167; dense mode, 2-core CPU,
seed 0); full-scale ListOps, LRA paper Table 1: 36.99 test accuracy.

Full-scale Path-X (64 examples of 16,384 tokens) forms n x n scores and does not fit one 80 GB GPU:
compiled for an H100 or A100 its train step asks for 417 GiB and its eval step for 256 GiB. There pass
`--config.grad_accum_steps=8` (8 examples at a time: 52 / 32 GiB compiled;
`python -m lra_jax.tools.compile --variants=synthesizer --tasks=pathx --targets=h100` prints the plan).
On TPU slices it fits 2 examples per device at a time (10.06 GiB train, 4.04-6.01 eval, compiled): pass
`--config.grad_accum_steps=8` on `tpu-v5e:2x2` (4 chips of 16 GiB) and `=4` on `tpu-v4:2x2x1`
(8 TensorCores of 16 GiB).
"""

from lra_jax import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="synthesizer", mode="dense", mix=0.0, factor=8))
