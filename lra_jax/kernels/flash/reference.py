"""Pure-jnp softmax attention with key/query padding: the oracle for the flash kernel.

    out_i = sum_{j : key_mask_j} softmax_j(scale * q_i . k_j) v_j   if query_mask_i, else 0,

computed in float32 with an explicit n x n matrix; a row with no real key is 0.
With `dropout_rate` r > 0 the weights are dropped by the mask of `lra_jax.kernels.dropout`
(the one the kernels draw) and rescaled by 1 / (1 - r). Shapes: q [b, nq, h, d], k, v [b, nk, h, d], masks [b, nq], [b, nk].
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from lra_jax.kernels import dropout
from lra_jax.kernels.masking import MASK_VALUE


def masked_attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    allowed: Bool[Array, "b h q k"],
    scale: float,
    dropout_rate: float = 0.0,
    dropout_seed: Array | None = None,
) -> Float[Array, "b q h d"]:
    """Softmax attention over the allowed pairs, float32 inside; rows with no allowed key give 0.

    `dropout_rate` > 0 drops weights with the mask of seed `dropout_seed` [1] (uint32)."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    logits = jnp.where(allowed, logits, MASK_VALUE)
    probs = jnp.exp(logits - logits.max(-1, keepdims=True))
    probs = jnp.where(allowed, probs, 0.0)
    total = probs.sum(-1, keepdims=True)
    probs = probs / jnp.where(total > 0, total, 1.0)
    if dropout_rate > 0.0:
        probs = dropout.apply(probs, dropout_seed, dropout_rate)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v.astype(jnp.float32)).astype(q.dtype)


def attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    key_mask: Bool[Array, "b k"],
    query_mask: Bool[Array, "b q"],
    scale: float,
    dropout_rate: float = 0.0,
    dropout_seed: Array | None = None,
) -> Float[Array, "b q h d"]:
    """Full attention over the real keys; padded query rows are 0."""
    out = masked_attention(q, k, v, key_mask[:, None, None, :], scale, dropout_rate, dropout_seed)
    return jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))
