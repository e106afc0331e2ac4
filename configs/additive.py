"""Additive (Bahdanau et al. 2015) attention, v^T tanh(q_i + k_j) per head, on an LRA task.

    python -m lra_jax.train --config=configs/additive.py:listops,mini --workdir=runs/additive-mini
    python -m lra_jax.train --config=configs/additive.py              # full-scale ListOps

`query_chunk` is how many queries' tanh values are computed at once: at most
batch * query_chunk * n * emb_dim floats, which XLA fuses into the sum over d so that they are
usually not stored at all. Left unset it is 1 on CPU (the fastest there at every size measured)
and 64 on GPU/TPU; override with `--config.attention.query_chunk=8`.

One run, one machine: mini ListOps test accuracy 0.363 (majority class 0.167; 2-core CPU, seed 0,
experiments/mini-lra/listops-mini/additive). The elementwise tanh over n * n * emb_dim values makes
it the slowest variant on CPU. The LRA paper has no additive-attention entry.

Full-scale Path-X (64 examples of 16,384 tokens) forms n x n scores and does not fit one 80 GB GPU:
compiled for an H100 or A100 its train step asks for 417 GiB and its eval step for 256 GiB. There pass
`--config.grad_accum_steps=8` (8 examples at a time: 52 / 32 GiB compiled;
`python -m lra_jax.tools.compile --variants=additive --tasks=pathx --targets=h100` prints the plan).
On TPU slices pass `--config.grad_accum_steps=8` too: on `tpu-v5e:2x2` (4 chips of 16 GiB) that is
2 examples per chip at a time (8.06 / 8.01 GiB compiled), on `tpu-v4:2x2x1` (8 TensorCores of 16 GiB)
1 per core (4.04 / 4.01 GiB; 2 per core ask for 16.04).
"""

from ml_collections import config_dict

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="additive", query_chunk=config_dict.placeholder(int)))
