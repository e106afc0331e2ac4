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

The implementations, in `BLOCK_SPARSE` (`lra_jax.kernels.dispatch`): "xla", the dense n x n
reference; "pallas-triton" derives the block layout (the block pairs that may hold an allowed
pair, intersected with block_mask) and runs the Triton kernel (GPU; interpreted on CPU);
"pallas-mosaic-splash" maps the pattern onto jax's splash attention (`pallas_tpu`: band, global
rows and columns and block matrix as its mask, segments and key padding as its segment ids);
"pallas-mosaic-block-sparse" is our Mosaic kernel over the layout (`pallas_mosaic`). Attention dropout
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

from lra_jax.kernels import dispatch, sharding
from lra_jax.kernels.block_sparse import layout as layouts
from lra_jax.kernels.block_sparse import pallas_gpu, pallas_mosaic, pallas_tpu, reference
from lra_jax.kernels.block_sparse.operands import BlockSparseInputs, BlockSparseStatic
from lra_jax.kernels.dispatch import MOSAIC_BLOCK_SPARSE, SPLASH, TRITON, XLA, Implementation, KernelOp, KernelPlan
from lra_jax.kernels.flash.pallas_gpu import KernelStatic, choose_tiling
from lra_jax.kernels.operands import (
    check_dropout,
    kernel_block,
    masks_from,
    pad_axis,
    padded_head_dim,
    round_up,
    zero_rows,
)


def _xla(q, k, v, inputs: BlockSparseInputs, static: BlockSparseStatic):
    codes = inputs.codes(static.window, q.shape[1])
    block_mask = None if inputs.block_mask is None else jnp.asarray(inputs.block_mask, bool)
    return reference.attention(q, k, v, codes.key_code, codes.query_code, codes.q_seg, codes.k_seg, inputs.query_mask,
                               codes.rule, block_mask, static.block, static.scale, static.dropout_rate,
                               inputs.dropout_seed)


def _triton(q, k, v, inputs: BlockSparseInputs, static: BlockSparseStatic):
    nq, nk, d = q.shape[1], k.shape[1], q.shape[3]
    block_mask, block = inputs.block_mask, static.block
    if block_mask is None:
        block = kernel_block(max(nq, nk), block)
    elif block != kernel_block(block, block):
        raise ValueError(f"the Triton kernel needs a block_mask at a power-of-two block >= 16, got block={block}")
    rule, key_code, query_code, q_seg, k_seg = inputs.codes(static.window, nq)
    nq_pad, nk_pad = round_up(nq, block), round_up(nk, block)
    key_code, query_code = pad_axis(key_code, 1, nk_pad), pad_axis(query_code, 0, nq_pad)
    q_seg, k_seg = pad_axis(q_seg, 0, nq_pad, q_seg.max()), pad_axis(k_seg, 0, nk_pad, k_seg.max())
    d_pad = padded_head_dim(d)
    tiles = choose_tiling(block, block, d_pad)  # square blocks, at most `block`
    if block_mask is not None:
        block_mask = jnp.asarray(block_mask, bool)[: nq_pad // block, : nk_pad // block]
        if tiles.block_q < block:  # the mask at the kernel's smaller blocks
            repeat = block // tiles.block_q
            block_mask = jnp.repeat(jnp.repeat(block_mask, repeat, axis=0), repeat, axis=1)
    dense_blocks = layouts.from_rule(nq_pad, nk_pad, tiles.block_q, tiles.block_q, rule, query_code, key_code,
                                     q_seg, k_seg)
    if block_mask is not None:
        dense_blocks &= block_mask
    qp = pad_axis(pad_axis(q, 1, nq_pad), 3, d_pad)
    kp = pad_axis(pad_axis(k, 1, nk_pad), 3, d_pad)
    vp = pad_axis(pad_axis(v.astype(q.dtype), 1, nk_pad), 3, d_pad)
    kernel_static = KernelStatic(static.scale, tiles, rule, static.dropout_rate, static.interpret)
    triton = lambda q, k, v, key_code, **shared: pallas_gpu.attention(q, k, v, key_code, **shared,  # noqa: E731
                                                                      static=kernel_static)
    out = sharding.over_batch(triton, first_row=True)(
        qp, kp, vp, key_code, query_code=query_code, q_seg=q_seg, k_seg=k_seg, dense_blocks=dense_blocks,
        dropout_seed=inputs.dropout_seed)
    return zero_rows(out[:, :nq, :, :d], inputs.query_mask)


def _splash(q, k, v, inputs: BlockSparseInputs, static: BlockSparseStatic):
    splash = lambda q, k, v, key_mask, query_mask, **traced: pallas_tpu.attention(  # noqa: E731
        q, k, v, key_mask, query_mask, window=static.window, global_queries=inputs.global_queries,
        global_keys=inputs.global_keys, block=static.block, scale=static.scale, interpret=static.interpret,
        **{"query_segments": None, "key_segments": None, "block_mask": None, **traced})
    traced = dict(query_segments=inputs.query_segments, key_segments=inputs.key_segments, block_mask=inputs.block_mask)
    out = sharding.over_batch(splash)(q, k, v, inputs.key_mask, inputs.query_mask,
                                      **{name: x for name, x in traced.items() if x is not None})
    return zero_rows(out, inputs.query_mask)


def _mosaic(q, k, v, inputs: BlockSparseInputs, static: BlockSparseStatic):
    return pallas_mosaic.attention(q, k, v, inputs, static)


BLOCK_SPARSE = KernelOp("block_sparse", (
    Implementation(XLA, _xla),
    Implementation(TRITON, _triton, backend="triton", platforms=("cpu", "gpu")),
    Implementation(SPLASH, _splash, backend="mosaic", platforms=("tpu",), dropout=False),
    Implementation(MOSAIC_BLOCK_SPARSE, _mosaic, backend="mosaic", platforms=("tpu",)),
))


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
    plan: KernelPlan | None = None,
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
      plan: the implementation to run (`kernels.plan(..., BLOCK_SPARSE)`, a layer's `kernel_plan`);
        without one, planned here from `impl`, `platform` and `interpret`, as in `flash_attention`.
      dropout_rate, dropout_seed: attention dropout, as in `flash_attention`.
    """
    b, nq, _, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    key_mask, query_mask = masks_from(nq, k.shape[1], b, key_mask, query_mask, lengths)
    dropout_seed = check_dropout(dropout_rate, dropout_seed)
    if plan is None:
        plan = dispatch.plan(impl, dispatch.call_target(platform, interpret), BLOCK_SPARSE,
                             dropout_active=dropout_rate > 0, dtype=jnp.dtype(q.dtype).name)
    dispatch.check_plan(BLOCK_SPARSE, plan, dropout_rate)
    inputs = BlockSparseInputs(key_mask, query_mask, dropout_seed, query_segments, key_segments, global_queries,
                               global_keys, block_mask)
    static = BlockSparseStatic(scale, window, block, dropout_rate, plan.interpret)
    return plan.implementation.run(q, k, v, inputs, static)
