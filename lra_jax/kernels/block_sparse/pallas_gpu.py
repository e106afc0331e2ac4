"""Pallas block-sparse attention (GPU, Triton backend): the flash kernels driven by a block layout.

The online softmax of FlashAttention (Dao et al. 2022, Alg. 1 forward, Alg. 2
backward) visits only the key blocks listed for each query block (and, in the
dK/dV kernel, only the query blocks listed for each key block), as in the
block-sparse FlashAttention of the same paper (sec. 3.3) and the Sparse
Transformer / BigBird block layouts. The trip count of each loop is the row's
count, so empty blocks cost nothing; pairs inside a visited block that the
pattern excludes (a sliding-window band edge that is not block aligned,
segment boundaries, global tokens) are masked elementwise.

The kernels themselves live in `lra_jax.kernels.flash.pallas_gpu` (one
implementation, dense or sparse by a static flag); this module adds the layouts.
Shapes: q [b, nq, h, d], k, v [b, nk, h, d], block-aligned and head-padded (the
api pads). Backend: GPU via Triton; `interpret=True` anywhere; not TPU.
"""

from __future__ import annotations

import jax.numpy as jnp

from lra_jax.kernels import sharding
from lra_jax.kernels.block_sparse import layout as layouts
from lra_jax.kernels.block_sparse.static import BlockSparseStatic
from lra_jax.kernels.flash import pallas_gpu as flash
from lra_jax.kernels.operands import AttentionInputs, kernel_block, pad_axis, padded_head_dim, round_up, zero_rows


def attention(q, k, v, key_code, *, query_code, q_seg, k_seg, dense_blocks, dropout_seed, first_row,
              static: flash.KernelStatic):
    """Block-sparse attention over the block pairs `dense_blocks` [nq / B_q, nk / B_k] and `static.rule`,
    with attention dropout at `static.dropout_rate` from the uint32 seed `dropout_seed` [1] (q's rows are
    rows `first_row`... of the whole batch: `flash.dropout_state`); `static.tiles` the blocks, warps and
    stages (`flash.choose_tiling`)."""
    inputs = flash.KernelInputs(key_code, query_code, q_seg, k_seg, flash.dropout_state(dropout_seed, first_row),
                                layouts.compact(dense_blocks), layouts.compact(dense_blocks.T))
    return flash.attention(q, k, v, inputs, static)


def run(q, k, v, inputs: AttentionInputs, static: BlockSparseStatic):
    """The Triton implementation of the block-sparse op on a call's typed inputs: the pattern's layout at
    the kernel's blocks (intersected with the block matrix), the operands padded, the kernel run per
    device (`sharding.over_batch`), the padding cut off and padded query rows zeroed."""
    nq, nk, d = q.shape[1], k.shape[1], q.shape[3]
    block_mask, block = inputs.mask.block_mask, static.block
    if block_mask is None:
        block = kernel_block(max(nq, nk), block)
    elif block != kernel_block(block, block):
        raise ValueError(f"the Triton kernel needs a block_mask at a power-of-two block >= 16, got block={block}")
    rule, key_code, query_code, q_seg, k_seg = inputs.codes(nq)
    nq_pad, nk_pad = round_up(nq, block), round_up(nk, block)
    key_code, query_code = pad_axis(key_code, 1, nk_pad), pad_axis(query_code, 0, nq_pad)
    q_seg, k_seg = pad_axis(q_seg, 0, nq_pad, q_seg.max()), pad_axis(k_seg, 0, nk_pad, k_seg.max())
    d_pad = padded_head_dim(d)
    tiles = flash.choose_tiling(block, block, d_pad)  # square blocks, at most `block`
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
    kernel_static = flash.KernelStatic(static.scale, tiles, rule, static.dropout_rate, static.interpret)
    triton = lambda q, k, v, key_code, **shared: attention(q, k, v, key_code, **shared, static=kernel_static)  # noqa: E731
    out = sharding.over_batch(triton, first_row=True)(
        qp, kp, vp, key_code, query_code=query_code, q_seg=q_seg, k_seg=k_seg, dense_blocks=dense_blocks,
        dropout_seed=inputs.dropout_seed)
    return zero_rows(out[:, :nq, :, :d], inputs.query_mask)
