"""Block-sparse softmax attention, choosing the kernel: `block_sparse_attention(q, k, v, mask, impl=)`.

The pattern is the call's `masking.Mask` (every part optional, composable with `&`):

    key_mask, query_mask   padding (True on real tokens)
    window                 band |i - j| <= window (sliding window; need not be block aligned)
    causal                 key j only for queries i >= j (next-token pretraining); the layout skips
                           the block pairs above the diagonal
    *_segments             int ids, shared across the batch: attention only within equal ids
    global_*               bool per position: a global query sees every real key, a global key is
                           seen by every query (both lift the band and segments, not causality)
    block_mask, block      bool [nq / block, nk / block]: only these block pairs (BigBird's
                           window, global and random blocks)

How the sparse variants map onto it (`lra_jax.attention.sparse.windows`):
  local       Mask(window=w).
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
rows and columns and block matrix as its mask, segments and key padding as its segment ids; not
causal here); "pallas-mosaic-block-sparse" is our Mosaic kernel over the layout (`pallas_mosaic`).
Attention dropout (`dropout_rate`, `dropout_seed`) runs in the Triton kernel and the reference
with the same mask, as in `flash_attention`; splash has none, so on TPU a call with
dropout (or a causal mask) runs our Mosaic flash kernel over the block layout (`pallas_mosaic`,
the same allowed pairs and mask) and one without runs splash. Shapes: q [b, nq, h, d],
k, v [b, nk, h, d] -> [b, nq, h, d] in q's dtype.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float

from lra_jax.kernels import dispatch, sharding
from lra_jax.kernels.block_sparse import pallas_gpu, pallas_mosaic, pallas_tpu, reference
from lra_jax.kernels.block_sparse.static import BlockSparseStatic
from lra_jax.kernels.dispatch import MOSAIC_BLOCK_SPARSE, SPLASH, TRITON, XLA, Implementation, KernelOp, KernelPlan
from lra_jax.kernels.masking import Mask
from lra_jax.kernels.operands import AttentionInputs, check_dropout, zero_rows


def _splash(q, k, v, inputs: AttentionInputs, static: BlockSparseStatic):
    mask = inputs.mask
    splash = lambda q, k, v, key_mask, query_mask, **traced: pallas_tpu.attention(  # noqa: E731
        q, k, v, key_mask, query_mask, window=mask.window, global_queries=mask.global_queries,
        global_keys=mask.global_keys, block=static.block, scale=static.scale, interpret=static.interpret,
        **{"query_segments": None, "key_segments": None, "block_mask": None, **traced})
    traced = dict(query_segments=mask.query_segments, key_segments=mask.key_segments, block_mask=mask.block_mask)
    out = sharding.over_batch(splash)(q, k, v, mask.key_mask, mask.query_mask,
                                      **{name: x for name, x in traced.items() if x is not None})
    return zero_rows(out, mask.query_mask)


def _mosaic(q, k, v, inputs: AttentionInputs, static: BlockSparseStatic):
    return pallas_mosaic.attention(q, k, v, inputs, static)


BLOCK_SPARSE = KernelOp("block_sparse", (
    Implementation(XLA, reference.run),
    Implementation(TRITON, pallas_gpu.run, backend="triton", platforms=("cpu", "gpu")),
    Implementation(SPLASH, _splash, backend="mosaic", platforms=("tpu",), dropout=False, causal=False),
    Implementation(MOSAIC_BLOCK_SPARSE, _mosaic, backend="mosaic", platforms=("tpu",)),
))


def block_sparse_attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    mask: Mask | None = None,
    *,
    block: int = 64,
    scale: float | None = None,
    impl: str = "auto",
    interpret: bool = False,
    platform: str | None = None,
    dropout_rate: float = 0.0,
    dropout_seed: Array | None = None,
    plan: KernelPlan | None = None,
) -> Float[Array, "b q h d"]:
    """Softmax attention restricted to `mask` (module docstring); padded query rows are 0.

    Args:
      q, k, v: [b, nq, h, d], [b, nk, h, d], [b, nk, h, d].
      mask: the pattern and padding (`masking.Mask`; None: every pair).
      block: the kernel's block size where the mask has no block_mask (the mask's own otherwise, a power
        of two >= 16 for the kernel). The kernel runs smaller blocks where these would not fit the
        target GPU (`flash.pallas_gpu.choose_tiling`; the layout is the same pattern at them).
      scale: softmax scale, default 1 / sqrt(d).
      plan: the implementation to run (`kernels.plan(..., BLOCK_SPARSE)`, a layer's `kernel_plan`);
        without one, planned here from `impl`, `platform` and `interpret`, as in `flash_attention`.
      dropout_rate, dropout_seed: attention dropout, as in `flash_attention`.
    """
    b, nq, _, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    mask = (mask or Mask()).resolved(b, nq, k.shape[1])
    dropout_seed = check_dropout(dropout_rate, dropout_seed)
    if plan is None:
        plan = dispatch.plan(impl, dispatch.call_target(platform, interpret), BLOCK_SPARSE,
                             dropout_active=dropout_rate > 0, dtype=jnp.dtype(q.dtype).name, causal=mask.causal)
    dispatch.check_plan(BLOCK_SPARSE, plan, dropout_rate, causal=mask.causal)
    static = BlockSparseStatic(scale, block if mask.block is None else mask.block, dropout_rate, plan.interpret)
    return plan.implementation.run(q, k, v, AttentionInputs(mask, dropout_seed), static)
