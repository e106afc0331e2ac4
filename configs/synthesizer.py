"""Synthesizer (Tay et al. 2021): attention weights synthesised without dot products, on an LRA task.

    python -m lra_jax.train --config=configs/synthesizer.py:listops,mini --workdir=runs/synthesizer-mini
    python -m lra_jax.train --config=configs/synthesizer.py              # full-scale ListOps, dense mode

Other modes: `--config.attention.mode=random` (learned R; add `--config.attention.random_trainable=False`
for fixed random), `--config.attention.mode=factorized_random --config.attention.factor=8`; mix in
dot-product logits with e.g. `--config.attention.mix=1.0`.

One run, one machine: mini ListOps test accuracy 0.379 (majority class 0.167; dense mode, 2-core CPU,
seed 0); full-scale ListOps, LRA paper Table 1: 36.99 test accuracy.

On a GPU or TPU the dense and factorized modes run softmax's flash kernels (their logits are products
of per-token rows: `lra_jax/attention/synthesized/synthesizer.py`), so every task fits as configured: full-scale
Path-X (64 examples of 16,384 tokens) compiles to 2.59 GiB per H100 for its train step, 2.42 per
`tpu-v5e:2x2` chip and 1.22 per `tpu-v4:2x2x1` core. The random mode (a learned n x n matrix) has no
kernel and forms n x n scores on XLA, where the dense mode's Path-X train step asked for 417 GiB per
H100 and needed `--config.grad_accum_steps=8` on an H100, A100 or `tpu-v5e:2x2` and `=4` on
`tpu-v4:2x2x1` (`python -m lra_jax.tools.compile --variants=synthesizer --tasks=pathx --targets=h100
--impl=xla` prints that plan); size the random mode's accumulation the same way.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="synthesizer", mode="dense", mix=0.0, factor=8))
