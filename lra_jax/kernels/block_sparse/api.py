"""Block-sparse softmax attention, choosing the kernel: `block_sparse_attention(..., impl=)`.

The pattern is given by element-level settings (all optional) and, optionally,
an explicit block matrix:

    window         band |i - j| <= window (sliding window; need not be block aligned)
    *_segments     int ids, shared across the batch: attention only within equal ids
    global_*       bool per position: a global query sees every real key, a global
                   key is seen by every query
    block_mask     bool [nq / block, nk / block]: only these block pairs (BigBird's
                   window, global and random blocks)

How the sparse variants map onto it (`lra_jax.attention.sparse`):
  local       window=w.
  strided     local heads: segments i // l; strided heads: the sequence permuted
              to (i mod l, i // l) order, segments i mod l, output un-permuted.
  longformer  window=w plus global keys (the first k positions) in the same softmax;
              the k global query rows use separate projections over every key, so
              they are a small dense `flash_attention` call, not part of the layout.
  bigbird     block_mask with the window, global and random blocks at the model's
              block size B (so B must be a power of two >= 16 for the kernel).

impl="pallas" runs the kernel of the target platform (`platform`, default
`lra_jax.kernels.current_target()`): on GPU it derives the block layout (the
block pairs that may hold an allowed pair, intersected with block_mask) and runs
the Triton kernel; on TPU it maps the pattern onto jax's splash attention
(`pallas_tpu`: band, global rows and columns and block matrix as its mask,
segments and key padding as its segment ids). impl="xla" is the dense n x n
reference; "auto" is the kernel on GPU/TPU and XLA on CPU. Attention dropout
(`dropout_rate`, `dropout_seed`) runs in the Triton kernel and the reference
with the same mask, as in `flash_attention`; splash has none, so on TPU a call with
dropout runs our Mosaic flash kernel over the block layout (`pallas_mosaic`, the same
allowed pairs and mask) and one without runs splash. Shapes: q [b, nq, h, d],
k, v [b, nk, h, d] -> [b, nq, h, d] in q's dtype.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from lra_jax.kernels import masking, pallas_backend, resolve_impl, sharding
from lra_jax.kernels.block_sparse import layout as layouts
from lra_jax.kernels.block_sparse import pallas_gpu, pallas_mosaic, pallas_tpu, reference
from lra_jax.kernels.flash.api import (
    check_dropout,
    kernel_block,
    masks_from,
    pad_axis,
    padded_head_dim,
)
from lra_jax.kernels.flash.pallas_gpu import choose_tiling


def block_sparse_attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    *,
    key_mask: Bool[Array, "b k"] | None = None,
    query_mask: Bool[Array, "b q"] | None = None,
    lengths: Array | None = None,
    window: int | None = None,
    query_segments: Array | None = None,
    key_segments: Array | None = None,
    global_queries: Array | None = None,
    global_keys: Array | None = None,
    block_mask: Bool[Array, "qb kb"] | None = None,
    block: int = 64,
    scale: float | None = None,
    impl: str = "auto",
    interpret: bool = False,
    platform: str | None = None,
    dropout_rate: float = 0.0,
    dropout_seed: Array | None = None,
) -> Float[Array, "b q h d"]:
    """Softmax attention restricted to the pattern (module docstring); padded query rows are 0.

    Args:
      q, k, v: [b, nq, h, d], [b, nk, h, d], [b, nk, h, d].
      key_mask, query_mask, lengths: padding, as in `flash_attention`.
      window, query_segments, key_segments, global_queries, global_keys, block_mask: the pattern.
      block: kernel block size; with `block_mask` it is the mask's block size and must
        be a power of two >= 16. The kernel runs smaller blocks where these would not fit the
        target GPU (`flash.pallas_gpu.choose_tiling`; the layout is the same pattern at them).
      scale: softmax scale, default 1 / sqrt(d).
      impl: "auto" | "xla" | "pallas". interpret: Pallas interpreter (CPU tests).
      platform: "gpu" (Triton) or "tpu" (splash); default: the current kernel target.
      dropout_rate, dropout_seed: attention dropout, as in `flash_attention`.
    """
    b, nq, _, d = q.shape
    nk = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    key_mask, query_mask = masks_from(nq, nk, b, key_mask, query_mask, lengths)
    dropout_seed = check_dropout(dropout_rate, dropout_seed)
    resolved = resolve_impl(impl, interpret, platform)
    codes_of = lambda key_mask: masking.element_codes(  # noqa: E731
        nq, key_mask, window, query_segments, key_segments, global_queries, global_keys)
    codes = codes_of(key_mask)
    if resolved == "pallas" and pallas_backend(platform) == "mosaic":
        if dropout_rate > 0.0:  # splash has no dropout: our Mosaic flash kernel with the pattern
            return pallas_mosaic.attention(q, k, v, query_mask, codes, block_mask, block, scale, dropout_rate,
                                           dropout_seed, interpret, static_codes=codes_of)
        splash = lambda q, k, v, key_mask, query_mask, **traced: pallas_tpu.attention(  # noqa: E731
            q, k, v, key_mask, query_mask, window=window, global_queries=global_queries, global_keys=global_keys,
            block=block, scale=scale, interpret=interpret,
            **{"query_segments": None, "key_segments": None, "block_mask": None, **traced})
        traced = dict(query_segments=query_segments, key_segments=key_segments, block_mask=block_mask)
        out = sharding.over_batch(splash)(q, k, v, key_mask, query_mask,
                                          **{name: x for name, x in traced.items() if x is not None})
        return jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))
    if block_mask is None:
        block = kernel_block(max(nq, nk), block)
    elif block != kernel_block(block, block):
        raise ValueError(f"block_mask needs a power-of-two block >= 16, got block={block}")
    rule, key_code, query_code, q_seg, k_seg = codes
    nq_pad, nk_pad = -(-nq // block) * block, -(-nk // block) * block
    key_code, query_code = pad_axis(key_code, 1, nk_pad), pad_axis(query_code, 0, nq_pad)
    q_seg, k_seg = pad_axis(q_seg, 0, nq_pad, q_seg.max()), pad_axis(k_seg, 0, nk_pad, k_seg.max())
    if block_mask is not None:
        block_mask = jnp.asarray(block_mask, bool)[: nq_pad // block, : nk_pad // block]

    if resolved == "xla":
        return reference.attention(q, k, v, key_code[:, :nk], query_code[:nq], q_seg[:nq], k_seg[:nk],
                                   query_mask, rule, block_mask, block, scale, dropout_rate, dropout_seed)

    d_pad = padded_head_dim(d)
    tiles = choose_tiling(block, block, d_pad)  # square blocks, at most `block`
    if tiles.block_q < block and block_mask is not None:  # the mask at the kernel's smaller blocks
        repeat = block // tiles.block_q
        block_mask = jnp.repeat(jnp.repeat(block_mask, repeat, axis=0), repeat, axis=1)
    block = tiles.block_q
    dense_blocks = layouts.from_rule(nq_pad, nk_pad, block, block, rule, query_code, key_code, q_seg, k_seg)
    if block_mask is not None:
        dense_blocks &= block_mask
    qp = pad_axis(pad_axis(q, 1, nq_pad), 3, d_pad)
    kp = pad_axis(pad_axis(k, 1, nk_pad), 3, d_pad)
    vp = pad_axis(pad_axis(v.astype(q.dtype), 1, nk_pad), 3, d_pad)
    triton = lambda q, k, v, key_code, **shared: pallas_gpu.attention(  # noqa: E731
        q, k, v, key_code, **shared, scale=scale, rule=rule, tiles=tiles, interpret=interpret,
        dropout_rate=dropout_rate)
    out = sharding.over_batch(triton, first_row=True)(
        qp, kp, vp, key_code, query_code=query_code, q_seg=q_seg, k_seg=k_seg, dense_blocks=dense_blocks,
        dropout_seed=dropout_seed)[:, :nq, :, :d]
    return jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))
