"""Additive (Bahdanau et al. 2015) attention, v^T tanh(q_i + k_j) per head, on an LRA task.

    python -m lra_jax.train --config=configs/additive.py:listops,mini --workdir=runs/additive-mini
    python -m lra_jax.train --config=configs/additive.py              # full-scale ListOps

`query_chunk` bounds the tanh tensor to batch * query_chunk * n * emb_dim floats: 64 at mini
(~67 MB at batch 32), 8 at full scale (~1 GB at batch 32, n = 2001, emb 512).

Expected: mini ListOps not yet measured (a first run on a busy 2-core CPU went at ~1 step/s, so
~25 min for its 1500 steps: the elementwise tanh over n * n * emb_dim values dominates); the LRA
paper has no additive-attention entry.
"""

from configs import base


def get_config(arg: str | None = None):
    _, scale = base.parse(arg)
    return base.get_config(arg, attention=dict(name="additive", query_chunk=64 if scale == "mini" else 8))
