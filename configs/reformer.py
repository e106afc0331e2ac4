"""Reformer (Kitaev et al. 2020) LSH attention with shared QK, on an LRA task.

    python -m lra_jax.train --config=configs/reformer.py:listops,mini
    python -m lra_jax.train --config=configs/reformer.py              # full-scale ListOps

Chunks of 128 tokens (32 at mini scale), num_buckets derived from max_len so that a bucket holds
about one chunk, 2 hash rounds (see lra_jax/attention/learned_patterns/hashing.py for the sources).

One run, one machine: mini ListOps test accuracy 0.348 (majority class 0.167; 2-core CPU, seed 0; from
`python -m lra_jax.tools.sweep --variants=reformer --tasks=listops --root=experiments/mini-lra`).
Full-scale ListOps, LRA paper Table 1 (the LRA code's Reformer): 37.27.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    attention = {"name": "reformer", "chunk_size": 32 if scale == "mini" else 128, "num_buckets": None,
                 "num_hashes": 2}
    return task_defaults.get_config(arg, attention=attention)
