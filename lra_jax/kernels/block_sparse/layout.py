"""Block layouts: which key blocks each query block visits, as the kernels read them.

A layout is int32 [num_query_blocks, W], row r = [count_r, key block indices
(ascending)..., unused], W a power of two > num_key_blocks (Triton block shapes
are powers of two); its transpose lists, per key block, the query blocks that
visit it (for the dK/dV kernel). Layouts are built with jnp from a dense block
matrix [num_query_blocks, num_key_blocks] (at 16K tokens and blocks of 64 that is
256 x 256 booleans), so they may depend on traced values (BigBird's random
blocks stored as model state) and are never retraced per call.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Bool, Int

from lra_jax.kernels.masking import GLOBAL, KeyCode, MaskRule


def compact(dense: Bool[Array, "r c"]) -> Int[Array, "r w"]:
    """Dense block matrix -> [count, indices...] rows, W = next power of two above c."""
    rows, cols = dense.shape
    count = dense.sum(1, dtype=jnp.int32)
    order = jnp.argsort(1 - dense.astype(jnp.int32), axis=1, stable=True).astype(jnp.int32)  # listed first
    width = pl.next_power_of_2(cols + 1)
    return jnp.concatenate([count[:, None], order, jnp.zeros((rows, width - cols - 1), jnp.int32)], axis=1)


def _ranges(x: Array, block: int) -> tuple[Array, Array]:
    """Per-block min and max of x [n] (n a multiple of block)."""
    x = x.reshape(-1, block)
    return x.min(1), x.max(1)


def from_rule(
    nq: int,
    nk: int,
    block_q: int,
    block_k: int,
    rule: MaskRule | None,
    query_code: Array,
    key_code: Int[Array, "b k"],
    q_seg: Array,
    k_seg: Array,
) -> Bool[Array, "qb kb"]:
    """Block pairs holding at least one pair the element rule may allow (a superset, never less).

    Per block: the index range (band, causality), the segment id range (segments, exact for
    sorted ids) and whether it holds a global token; key blocks that are padding in
    every sequence of the batch are dropped.
    """
    q_lo, q_hi = _ranges(jnp.arange(nq), block_q)
    k_lo, k_hi = _ranges(jnp.arange(nk), block_k)
    any_real = (key_code.max(0).reshape(-1, block_k) > int(KeyCode.PADDING)).any(1)
    dense = jnp.ones((nq // block_q, nk // block_k), bool)
    if rule is not None:
        window = rule.window
        if window is not None:
            dense &= (k_lo[None, :] <= q_hi[:, None] + window) & (k_hi[None, :] >= q_lo[:, None] - window)
        if rule.segments:
            qs_lo, qs_hi = _ranges(q_seg, block_q)
            ks_lo, ks_hi = _ranges(k_seg, block_k)
            dense &= (ks_lo[None, :] <= qs_hi[:, None]) & (ks_hi[None, :] >= qs_lo[:, None])
        if rule.globals and rule.local:
            q_glob = (query_code.reshape(-1, block_q) == GLOBAL).any(1)
            k_glob = (key_code.max(0).reshape(-1, block_k) == GLOBAL).any(1)
            dense |= q_glob[:, None] | k_glob[None, :]
        if rule.causal:  # a block pair holds a pair j <= i iff its first key is at most its last query
            dense &= k_lo[None, :] <= q_hi[:, None]
    return dense & any_real[None, :]
