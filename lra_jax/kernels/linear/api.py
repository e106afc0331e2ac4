"""Non-causal kernelized attention: the op's table (`LINEAR`) and `linear_attention(..., impl=)`.

The implementations, in `LINEAR` (`lra_jax.kernels.dispatch`): "xla", the two-einsum
reference; "pallas-triton", the fused kernel of `pallas_gpu` (feature map, the two reductions
and the normalisation in one pass per (batch, head)) for a GPU target (interpreted on CPU). There
is no TPU kernel (XLA's two einsums are already matmuls on the MXU), so a TPU target plans XLA.
Whether the kernel beats XLA's two einsums: `python -m lra_jax.tools.kernel_bench`.
Shapes: q, k [b, n, h, m], v [b, n, h, d] -> [b, n, h, d] in v's dtype.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from lra_jax.kernels import dispatch, sharding, tiling
from lra_jax.kernels.dispatch import TRITON, XLA, Implementation, KernelOp, KernelPlan
from lra_jax.kernels.linear import pallas_gpu, reference
from lra_jax.kernels.masking import Mask
from lra_jax.kernels.operands import kernel_block, pad_axis, padded_head_dim, round_up, zero_rows

FEATURE_MAPS = ("elu", "identity")


def kernel_limit(m: int, d: int) -> str | None:
    """Why the fused kernel cannot run m features and value width d on the target GPU (its shared
    memory holds S and dS, [m, d] each, whatever the block), or None."""
    try:
        pallas_gpu.choose_tilings(16, padded_head_dim(m), padded_head_dim(d))
    except tiling.TilingError as error:
        return str(error)
    return None


@dataclasses.dataclass(frozen=True)
class LinearInputs:
    """The arrays of a call besides q, k, v: the masks (True on real tokens)."""

    key_mask: Bool[Array, "b n"]
    query_mask: Bool[Array, "b n"]


@dataclasses.dataclass(frozen=True)
class LinearStatic:
    """The static settings of a call: feature map, the most rows per loop step, interpreter."""

    feature_map: str = "elu"
    block: int = 64
    interpret: bool = False


def _xla(q, k, v, inputs: LinearInputs, static: LinearStatic):
    return reference.attention(q, k, v, inputs.key_mask, inputs.query_mask, static.feature_map)


def _triton(q, k, v, inputs: LinearInputs, static: LinearStatic):
    n, m, d = q.shape[1], q.shape[3], v.shape[3]
    m_pad, d_pad = padded_head_dim(m), padded_head_dim(d)
    tiles = pallas_gpu.choose_tilings(kernel_block(n, static.block), m_pad, d_pad)
    n_pad = round_up(n, max(t.block_q for t in tiles))  # both blocks are powers of two: the larger divides n_pad
    qp, kp = (pad_axis(pad_axis(x, 1, n_pad), 3, m_pad) for x in (q, k))
    vp = pad_axis(pad_axis(v, 1, n_pad), 3, d_pad)
    key_code = pad_axis(inputs.key_mask.astype(jnp.int32), 1, n_pad)
    kernel_static = pallas_gpu.KernelStatic(tuple(tiles), static.feature_map, m, static.interpret)
    triton = lambda q, k, v, key_code: pallas_gpu.attention(q, k, v, key_code, kernel_static)  # noqa: E731
    out = sharding.over_batch(triton)(qp, kp, vp, key_code)
    return zero_rows(out[:, :n, :, :d], inputs.query_mask)


LINEAR = KernelOp("linear", (
    Implementation(XLA, _xla, dropout=False),
    Implementation(TRITON, _triton, backend="triton", platforms=("cpu", "gpu"), dropout=False),
))


def linear_attention(
    q: Float[Array, "b n h m"],
    k: Float[Array, "b n h m"],
    v: Float[Array, "b n h d"],
    mask: Mask | None = None,
    *,
    feature_map: str = "elu",
    impl: str = "auto",
    block: int = 64,
    interpret: bool = False,
    platform: str | None = None,
    plan: KernelPlan | None = None,
) -> Float[Array, "b n h d"]:
    """phi(q_i)^T S / phi(q_i)^T z over the real keys; padded query rows and rows without keys are 0.

    Args:
      q, k: queries and keys [b, n, h, m]: inputs of `feature_map`.
      v: values [b, n, h, d].
      mask: padding (`masking.Mask`; None: every token real). The kernel is not causal and has no pattern:
        a mask with either is refused (the causal Linear Transformer is `causal_kernel_attention`, XLA).
      feature_map: "elu" (elu(x) + 1, Linear Transformer) or "identity" (q, k are
        already features, e.g. FAVOR+ positive random features).
      block: the most rows per loop step (fewer where the target GPU's shared memory needs it,
        `pallas_gpu.choose_tilings`).
      plan: the implementation to run (`kernels.plan(..., LINEAR)`, a layer's `kernel_plan`); without
        one, planned here from `impl`, `platform` and `interpret`, as in `flash_attention`.
    """
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"unknown feature_map {feature_map!r}; choose one of {', '.join(FEATURE_MAPS)}")
    b, n = q.shape[:2]
    mask = (mask or Mask()).resolved(b, n, n)
    if mask.causal or mask.pattern:
        raise ValueError("linear_attention takes a padding mask only (no causal form, no pattern)")
    key_mask, query_mask = mask.key_mask, mask.query_mask
    if plan is None:
        plan = dispatch.plan(impl, dispatch.call_target(platform, interpret), LINEAR, dtype=jnp.dtype(v.dtype).name)
    dispatch.check_plan(LINEAR, plan)
    return plan.implementation.run(q, k, v, LinearInputs(key_mask, query_mask),
                                   LinearStatic(feature_map, block, plan.interpret))
