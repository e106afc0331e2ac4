"""GLA, gated linear attention (Yang et al. 2024): a matrix-state recurrence with a data-dependent gate per
key dimension, computed in chunks, bidirectional, on an LRA task.

    python -m lra_jax.train --config=configs/gla.py:listops,mini --workdir=runs/gla-mini
    python -m lra_jax.train --config=configs/gla.py:pathfinder    # full scale

The layer (lra_jax/attention/recurrent/gated.py) has d_k = d_v / 2 per head, a rank-16 gate with temperature 16,
a per-head norm and a SiLU output gate, in chunks of 16 steps (the weights inside a chunk are [C, C, d_k],
so the work grows with C; the GLA paper's inner chunk is 16 too). The GLA paper reports no LRA run: full
scale uses the task's encoder and optimiser of the LRA paper, as for the attention variants.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    return task_defaults.get_config(arg, attention=dict(name="gla", chunk=16, gate_rank=16, temperature=16.0,
                                                        bidirectional=True))
