"""Chunked gated linear attention (GLA, SSD): the op's table (`GATED_SCAN`) and `gated_scan(..., impl=)`.

The implementations, in `GATED_SCAN` (`lra_jax.kernels.dispatch`): "xla", the chunked scan of `reference`;
"pallas-triton", the kernel of `pallas_gpu` (one program per (batch, head) carrying the [d_k, d_v] state
over the chunks on chip, forward and backward) for a GPU target (interpreted on CPU). There is no TPU
kernel: XLA's chunked form is already batched matmuls on the MXU over [C, C] and [C, d_k] x [d_k, d_v]
tiles inside one scan, so a TPU target plans XLA. Any length: both pad the steps at the end with steps
that add and decay nothing. Shapes: q, k [b, n, h, d_k], v [b, n, h, d_v], log g [b, n, h, d_k] (a gate
per key dimension) or [b, n, h, 1] (one decay per head) -> y [b, n, h, d_v] in float32.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Float

from lra_jax.kernels import dispatch, sharding, tiling
from lra_jax.kernels.dispatch import TRITON, XLA, Implementation, KernelOp, KernelPlan
from lra_jax.kernels.gated_scan import pallas_gpu, reference
from lra_jax.kernels.operands import kernel_block, pad_axis, padded_head_dim, round_up


def kernel_limit(dk: int, dv: int, chunk: int, scalar_decay: bool) -> str | None:
    """Why the kernel cannot run key width d_k and value width d_v on the target GPU (its state [d_k, d_v]
    and, for a gate per key dimension, the [C, C, d_k] decays stay on chip), or None."""
    try:
        pallas_gpu.choose_tilings(kernel_block(chunk, chunk), padded_head_dim(dk), padded_head_dim(dv), scalar_decay)
    except tiling.TilingError as error:
        return str(error)
    return None


@dataclasses.dataclass(frozen=True)
class ScanStatic:
    """The static settings of a call: the chunk (the kernel's at most, a power of two >= 16), whether
    the current step is left out (`strict`), interpreter."""

    chunk: int
    strict: bool = False
    interpret: bool = False


def _xla(q, k, v, log_g, static: ScanStatic):
    return reference.chunked(q, k, v, log_g, chunk=static.chunk, strict=static.strict)


def _triton(q, k, v, log_g, static: ScanStatic):
    n, dk, dv = q.shape[1], q.shape[3], v.shape[3]
    dk_pad, dv_pad = padded_head_dim(dk), padded_head_dim(dv)
    scalar_decay = log_g.shape[-1] == 1
    tiles = pallas_gpu.choose_tilings(kernel_block(n, static.chunk), dk_pad, dv_pad, scalar_decay)
    n_pad = round_up(n, max(t.block_q for t in tiles))  # both chunks are powers of two: the larger divides n_pad
    qp, kp = (pad_axis(pad_axis(x, 1, n_pad), 3, dk_pad) for x in (q, k))
    vp = pad_axis(pad_axis(v, 1, n_pad), 3, dv_pad)
    gp = pad_axis(log_g[..., 0] if scalar_decay else pad_axis(log_g, 3, dk_pad), 1, n_pad)
    kernel_static = pallas_gpu.KernelStatic(tuple(tiles), static.strict, static.interpret)
    triton = lambda q, k, v, log_g: pallas_gpu.gated_scan(q, k, v, log_g, kernel_static)  # noqa: E731
    return sharding.over_batch(triton)(qp, kp, vp, gp)[:, :n, :, :dv]


GATED_SCAN = KernelOp("gated_scan", (
    Implementation(XLA, _xla, dropout=False),
    Implementation(TRITON, _triton, backend="triton", platforms=("cpu", "gpu"), dropout=False),
))


def gated_scan(
    q: Float[Array, "b n h dk"],
    k: Float[Array, "b n h dk"],
    v: Float[Array, "b n h dv"],
    log_g: Float[Array, "b n h dk"] | Float[Array, "b n h 1"],
    *,
    chunk: int,
    strict: bool = False,
    impl: str = "auto",
    interpret: bool = False,
    platform: str | None = None,
    plan: KernelPlan | None = None,
) -> Float[Array, "b n h dv"]:
    """y_t = q_t S_t with S_t = diag(g_t) S_{t-1} + k_tᵀ v_t per head (strict: y_t = q_t diag(g_t) S_{t-1}).

    Args:
      q, k: queries and keys [b, n, h, d_k]; v: values [b, n, h, d_v].
      log_g: the log-gates, <= 0: [b, n, h, d_k] (GLA) or [b, n, h, 1] (one decay per head, SSD).
      chunk: steps per chunk (the XLA form's; the kernel's at most, rounded to a power of two >= 16 and
        lowered where the target GPU needs it, `pallas_gpu.choose_tilings`). The result does not depend on it
        beyond float32 rounding.
      strict: leave the current step out (the backward direction of a bidirectional layer).
      plan: the implementation to run (`kernels.plan(..., GATED_SCAN)`, a layer's `kernel_plan`); without
        one, planned here from `impl`, `platform` and `interpret`, as in `flash_attention`.
    """
    if log_g.shape[-1] not in (1, k.shape[-1]) or log_g.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"log_g must be [b, n, h, d_k] or [b, n, h, 1] for keys {k.shape}, got {log_g.shape}")
    if plan is None:
        plan = dispatch.plan(impl, dispatch.call_target(platform, interpret), GATED_SCAN,
                             dtype=jnp.dtype(v.dtype).name)
    dispatch.check_plan(GATED_SCAN, plan)
    return plan.implementation.run(q, k, v, log_g, ScanStatic(chunk, strict, plan.interpret))
