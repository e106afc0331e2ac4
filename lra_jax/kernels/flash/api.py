"""Dense softmax attention with padding, causal or not: the op's table (`FLASH`) and
`flash_attention(q, k, v, mask, impl=)`.

The implementations, in `FLASH` (`lra_jax.kernels.dispatch`): "xla", the jnp reference (an explicit
n x n matrix); "pallas-triton", a FlashAttention kernel (Dao et al. 2022, Alg. 1/2; O(n) memory,
`pallas_gpu`) for a GPU target (interpreted on CPU); "pallas-mosaic-splash", jax's splash attention
(`pallas_tpu`) for a TPU target without dropout; "pallas-mosaic-flash", our Mosaic kernel
(`pallas_mosaic`) for a TPU target with dropout (splash has none). Attention dropout (`dropout_rate`,
`dropout_seed`) runs in the Triton and our Mosaic kernel and the reference, with the same mask
(`lra_jax.kernels.dropout`). A causal mask runs the same kernel over the causal block layout (the
block-sparse op's implementation of it: only the key blocks at or before each query block are visited,
half the work); splash is not used for it. Shapes: q [b, nq, h, d], k, v [b, nk, h, d] -> [b, nq, h, d]
in q's dtype.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array, Float

from lra_jax.kernels import dispatch, sharding
from lra_jax.kernels.block_sparse import pallas_gpu as block_sparse_triton
from lra_jax.kernels.block_sparse import pallas_mosaic as block_sparse_mosaic
from lra_jax.kernels.block_sparse import reference as block_sparse_reference
from lra_jax.kernels.block_sparse.static import BlockSparseStatic
from lra_jax.kernels.dispatch import MOSAIC_FLASH, SPLASH, TRITON, XLA, Implementation, KernelOp, KernelPlan
from lra_jax.kernels.flash import pallas_gpu, pallas_mosaic, pallas_tpu, reference
from lra_jax.kernels.masking import Mask
from lra_jax.kernels.operands import (
    AttentionInputs,
    BlockSizes,
    check_dropout,
    pad_axis,
    padded_head_dim,
    round_up,
    zero_rows,
)


@dataclasses.dataclass(frozen=True)
class FlashStatic:
    """The static settings of a call: softmax scale, the largest blocks, dropout rate, interpreter."""

    scale: float
    blocks: BlockSizes = BlockSizes()
    dropout_rate: float = 0.0
    interpret: bool = False


def _or_over_the_causal_layout(dense: Callable, block_sparse: Callable) -> Callable:
    """A FLASH implementation: `dense` for a padding mask; for a causal one `block_sparse`, the same kernel
    driven by the causal block layout (the block-sparse op's implementation, same mask and dropout)."""

    def run(q, k, v, inputs: AttentionInputs, static: FlashStatic):
        if not inputs.mask.causal:
            return dense(q, k, v, inputs, static)
        block = max(static.blocks.block_q, static.blocks.block_k)
        return block_sparse(q, k, v, inputs, BlockSparseStatic(static.scale, block, static.dropout_rate, static.interpret))

    return run


def _xla(q, k, v, inputs: AttentionInputs, static: FlashStatic):
    return reference.attention(q, k, v, inputs.key_mask, inputs.query_mask, static.scale, static.dropout_rate,
                               inputs.dropout_seed)


def _triton(q, k, v, inputs: AttentionInputs, static: FlashStatic):
    nq, nk, d = q.shape[1], k.shape[1], q.shape[3]
    d_pad = padded_head_dim(d)
    blocks = static.blocks.for_lengths(nq, nk)
    tiles = pallas_gpu.choose_dense_tiling(blocks.block_q, blocks.block_k, d_pad)
    nq_pad, nk_pad = round_up(nq, tiles.block_q), round_up(nk, tiles.block_k)
    qp = pad_axis(pad_axis(q, 1, nq_pad), 3, d_pad)
    kp = pad_axis(pad_axis(k, 1, nk_pad), 3, d_pad)
    vp = pad_axis(pad_axis(v.astype(q.dtype), 1, nk_pad), 3, d_pad)
    key_code = pad_axis(inputs.key_mask.astype(jnp.int32), 1, nk_pad)
    kernel_static = pallas_gpu.KernelStatic(static.scale, tiles, dropout_rate=static.dropout_rate,
                                            interpret=static.interpret)

    def triton(q, k, v, key_code, seed, first_row):
        state = pallas_gpu.dropout_state(seed, first_row)
        return pallas_gpu.attention(q, k, v, pallas_gpu.KernelInputs.dense(key_code, nq_pad, state), kernel_static)

    out = sharding.over_batch(triton, first_row=True)(qp, kp, vp, key_code, seed=inputs.dropout_seed)
    return zero_rows(out[:, :nq, :, :d], inputs.query_mask)


def _splash(q, k, v, inputs: AttentionInputs, static: FlashStatic):
    nq, nk = q.shape[1], k.shape[1]
    nq_pad, nk_pad = round_up(nq, pallas_tpu.BLOCK), round_up(nk, pallas_tpu.BLOCK)
    splash = lambda q, k, v, q_ids, k_ids: pallas_tpu.attention(  # noqa: E731
        q, k, v, q_ids, k_ids, pallas_tpu.full_mask(nq_pad, nk_pad), static.scale, static.interpret)
    out = sharding.over_batch(splash)(
        pad_axis(q, 1, nq_pad), pad_axis(k, 1, nk_pad), pad_axis(v, 1, nk_pad),
        pallas_tpu.segment_ids(pad_axis(inputs.query_mask, 1, nq_pad, False)),
        pallas_tpu.segment_ids(pad_axis(inputs.key_mask, 1, nk_pad, False)))[:, :nq]
    # a row with no real key is 0, as in the reference
    return zero_rows(out, inputs.query_mask & inputs.key_mask.any(1, keepdims=True))


def _mosaic(q, k, v, inputs: AttentionInputs, static: FlashStatic):
    return pallas_mosaic.run_padded(q, k, v, inputs.key_mask.astype(jnp.int32)[:, None, :], inputs.query_mask,
                                    static.scale, static.dropout_rate, inputs.dropout_seed, static.interpret)


FLASH = KernelOp("flash", (
    Implementation(XLA, _or_over_the_causal_layout(_xla, block_sparse_reference.run)),
    Implementation(TRITON, _or_over_the_causal_layout(_triton, block_sparse_triton.run), backend="triton",
                   platforms=("cpu", "gpu")),
    Implementation(SPLASH, _splash, backend="mosaic", platforms=("tpu",), dropout=False, causal=False),
    Implementation(MOSAIC_FLASH, _or_over_the_causal_layout(_mosaic, block_sparse_mosaic.attention), backend="mosaic",
                   platforms=("tpu",)),
))


def flash_attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    mask: Mask | None = None,
    *,
    scale: float | None = None,
    impl: str = "auto",
    block_q: int = 64,
    block_k: int = 64,
    interpret: bool = False,
    platform: str | None = None,
    dropout_rate: float = 0.0,
    dropout_seed: Array | None = None,
    plan: KernelPlan | None = None,
) -> Float[Array, "b q h d"]:
    """softmax(scale q k^T) v over the allowed keys; padded query rows and rows without keys are 0.

    Args:
      q, k, v: queries [b, nq, h, d], keys and values [b, nk, h, d] (float32 or bfloat16).
      mask: padding and causality (`masking.Mask`; None: every pair). A band, segments, global tokens or
        a block matrix are `block_sparse_attention`'s.
      scale: softmax scale, default 1 / sqrt(d).
      plan: the implementation to run (`kernels.plan(..., FLASH)`, a layer's `kernel_plan`); without
        one, it is planned here from `impl` ("auto" | "xla" | "pallas"), `platform` ("gpu", "tpu";
        default: the current kernel target) and `interpret` (the Pallas interpreter, CPU tests).
      block_q, block_k: the largest Triton blocks (rounded to powers of two >= 16); smaller ones are
        used where these would not fit the target GPU (`pallas_gpu.choose_dense_tiling`).
      dropout_rate, dropout_seed: attention dropout rate and its uint32 seed [1] (`dropout.seed_from_key`).
    """
    b, nq, _, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    mask = (mask or Mask()).resolved(b, nq, k.shape[1])
    if mask.pattern:
        raise ValueError("flash_attention takes padding and causal masks; a band, segments, global tokens or a "
                         "block matrix run in block_sparse_attention")
    dropout_seed = check_dropout(dropout_rate, dropout_seed)
    if plan is None:
        plan = dispatch.plan(impl, dispatch.call_target(platform, interpret), FLASH, dropout_active=dropout_rate > 0,
                             dtype=jnp.dtype(q.dtype).name, causal=mask.causal)
    dispatch.check_plan(FLASH, plan, dropout_rate, causal=mask.causal)
    static = FlashStatic(scale, BlockSizes(block_q, block_k), dropout_rate, plan.interpret)
    return plan.implementation.run(q, k, v, AttentionInputs(mask, dropout_seed), static)
