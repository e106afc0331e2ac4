"""Pure-jnp block-sparse attention: an explicit n x n mask, the oracle for the block-sparse kernel.

    out_i = sum_{j : allowed(i, j)} softmax_j(scale * q_i . k_j) v_j   if query_mask_i, else 0,

allowed(i, j) = block_mask[i // B, j // B] and the element rule of
`lra_jax.kernels.masking` (key padding, band |i - j| <= window, equal segments,
global queries/keys), with the attention dropout of `lra_jax.kernels.dropout` if asked. Shapes: q [b, nq, h, d], k, v [b, nk, h, d].
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from lra_jax.kernels import masking
from lra_jax.kernels.block_sparse.static import BlockSparseStatic
from lra_jax.kernels.flash.reference import masked_attention
from lra_jax.kernels.operands import AttentionInputs


def attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    key_code: Int[Array, "b k"],
    query_code: Array,
    q_seg: Array,
    k_seg: Array,
    query_mask: Bool[Array, "b q"],
    rule,
    block_mask: Bool[Array, "qb kb"] | None,
    block: int,
    scale: float,
    dropout_rate: float = 0.0,
    dropout_seed: Array | None = None,
) -> Float[Array, "b q h d"]:
    """Attention over the allowed pairs (float32 inside); padded query rows and keyless rows are 0."""
    nq, nk = q.shape[1], k.shape[1]
    ok = masking.allowed(jnp.arange(nq), jnp.arange(nk), key_code, query_code, q_seg, k_seg, rule)  # [b q k]
    if block_mask is not None:
        ok &= jnp.repeat(jnp.repeat(block_mask, block, 0), block, 1)[None, :nq, :nk]
    out = masked_attention(q, k, v, ok[:, None], scale, dropout_rate, dropout_seed)
    return jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))


def run(q, k, v, inputs: AttentionInputs, static: BlockSparseStatic) -> Float[Array, "b q h d"]:
    """`attention` on a call's typed inputs: the XLA implementation of the block-sparse op."""
    codes = inputs.codes(q.shape[1])
    block_mask = None if inputs.mask.block_mask is None else jnp.asarray(inputs.mask.block_mask, bool)
    return attention(q, k, v, codes.key_code, codes.query_code, codes.q_seg, codes.k_seg, inputs.query_mask,
                     codes.rule, block_mask, static.block, static.scale, static.dropout_rate, inputs.dropout_seed)
