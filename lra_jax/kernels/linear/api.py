"""Non-causal kernelized attention, choosing the kernel: `linear_attention(..., impl=)`.

impl="pallas" runs the fused kernel of `pallas_gpu` (feature map, the two
reductions and the normalisation in one pass per (batch, head)) for a GPU target;
there is no TPU kernel (XLA's two einsums are already matmuls on the MXU), so a
TPU target runs the reference; impl="xla" the two-einsum reference; "auto" the
kernel on GPU. Whether the kernel beats XLA's
two einsums has not been measured yet (no GPU where it was written): see
`python -m lra_jax.tools.kernel_bench`. Shapes: q, k [b, n, h, m], v [b, n, h, d]
-> [b, n, h, d] in v's dtype.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from lra_jax.kernels import pallas_backend, resolve_impl, sharding, tiling
from lra_jax.kernels.flash.api import (
    kernel_block,
    masks_from,
    pad_axis,
    padded_head_dim,
)
from lra_jax.kernels.linear import pallas_gpu, reference

FEATURE_MAPS = ("elu", "identity")


def kernel_limit(m: int, d: int) -> str | None:
    """Why the fused kernel cannot run m features and value width d on the target GPU (its shared
    memory holds S and dS, [m, d] each, whatever the block), or None."""
    try:
        pallas_gpu.choose_tilings(16, padded_head_dim(m), padded_head_dim(d))
    except tiling.TilingError as error:
        return str(error)
    return None


def linear_attention(
    q: Float[Array, "b n h m"],
    k: Float[Array, "b n h m"],
    v: Float[Array, "b n h d"],
    *,
    key_mask: Bool[Array, "b n"] | None = None,
    query_mask: Bool[Array, "b n"] | None = None,
    lengths: Array | None = None,
    feature_map: str = "elu",
    impl: str = "auto",
    block: int = 64,
    interpret: bool = False,
    platform: str | None = None,
) -> Float[Array, "b n h d"]:
    """phi(q_i)^T S / phi(q_i)^T z over the real keys; padded query rows and rows without keys are 0.

    Args:
      q, k: queries and keys [b, n, h, m]: inputs of `feature_map`.
      v: values [b, n, h, d].
      key_mask, query_mask, lengths: padding, as in `flash_attention`.
      feature_map: "elu" (elu(x) + 1, Linear Transformer) or "identity" (q, k are
        already features, e.g. FAVOR+ positive random features).
      impl: "auto" | "xla" | "pallas". block: the most rows per loop step (fewer where the target GPU's
        shared memory needs it, `pallas_gpu.choose_tilings`). interpret: Pallas interpreter.
      platform: the kernel target (default `lra_jax.kernels.current_target()`); there is no TPU
        kernel, so on "tpu" this is the XLA form.
    """
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"unknown feature_map {feature_map!r}; choose one of {', '.join(FEATURE_MAPS)}")
    b, n, _, m = q.shape
    d = v.shape[-1]
    key_mask, query_mask = masks_from(n, n, b, key_mask, query_mask, lengths)
    if resolve_impl(impl, interpret, platform) == "xla" or pallas_backend(platform) == "mosaic":
        return reference.attention(q, k, v, key_mask, query_mask, feature_map)
    m_pad, d_pad = padded_head_dim(m), padded_head_dim(d)
    tiles = pallas_gpu.choose_tilings(kernel_block(n, block), m_pad, d_pad)
    block = max(t.block_q for t in tiles)  # both blocks are powers of two: the larger divides n_pad
    n_pad = -(-n // block) * block
    qp, kp = (pad_axis(pad_axis(x, 1, n_pad), 3, m_pad) for x in (q, k))
    vp = pad_axis(pad_axis(v, 1, n_pad), 3, d_pad)
    key_code = pad_axis(key_mask.astype(jnp.int32), 1, n_pad)
    triton = lambda q, k, v, key_code: pallas_gpu.attention(  # noqa: E731
        q, k, v, key_code, tiles, feature_map, m, interpret)
    out = sharding.over_batch(triton)(qp, kp, vp, key_code)[:, :n, :, :d]
    return jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))
