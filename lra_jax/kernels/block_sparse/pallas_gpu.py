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

from lra_jax.kernels.block_sparse import layout as layouts
from lra_jax.kernels.flash import pallas_gpu as flash


def attention(q, k, v, key_code, *, query_code, q_seg, k_seg, dense_blocks, dropout_seed, first_row,
              static: flash.KernelStatic):
    """Block-sparse attention over the block pairs `dense_blocks` [nq / B_q, nk / B_k] and `static.rule`,
    with attention dropout at `static.dropout_rate` from the uint32 seed `dropout_seed` [1] (q's rows are
    rows `first_row`... of the whole batch: `flash.dropout_state`); `static.tiles` the blocks, warps and
    stages (`flash.choose_tiling`)."""
    inputs = flash.KernelInputs(key_code, query_code, q_seg, k_seg, flash.dropout_state(dropout_seed, first_row),
                                layouts.compact(dense_blocks), layouts.compact(dense_blocks.T))
    return flash.attention(q, k, v, inputs, static)
