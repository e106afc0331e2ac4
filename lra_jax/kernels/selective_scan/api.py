"""Mamba's selective scan (S6): the op's table (`SELECTIVE_SCAN`) and `selective_scan(..., impl=)`.

The implementations, in `SELECTIVE_SCAN` (`lra_jax.kernels.dispatch`): "xla", the chunked scan of `reference`;
"pallas-triton", the kernel of `pallas_gpu` (one program per (batch, block of channels) carrying their
[E_blk, N] states over the steps on chip, forward and backward; E_blk = 32 for N <= 16, fewer for more
states, `STATE_TILE`) for a GPU target (interpreted on CPU). There
is no TPU kernel: a step-by-step loop is what the TPU's vector units do worst, and XLA's chunked form keeps
its parallel scan in vector registers too. Any length and width: the kernel's call pads steps (Δ = 0),
channels (Δ = 0, A = 0) and state dimensions (A = 0, B = C = 0) that change nothing.
Shapes: Δ, x [b, n, E]; A [E, N]; B, C [b, n, N] -> y [b, n, E] in float32.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Float

from lra_jax.kernels import dispatch, sharding
from lra_jax.kernels.dispatch import TRITON, XLA, Implementation, KernelOp, KernelPlan
from lra_jax.kernels.operands import pad_axis, padded_head_dim, round_up
from lra_jax.kernels.selective_scan import pallas_gpu, reference

# A program's [channels, N] tiles hold at most this many elements (channels per program = STATE_TILE / N, at
# most 32): the kernels carry up to six of them, a few registers per thread each at 4 warps, whatever N is.
STATE_TILE = 512


@dataclasses.dataclass(frozen=True)
class ScanStatic:
    """The static settings of a call: the XLA form's chunk, the interpreter."""

    chunk: int
    interpret: bool = False


def _xla(dt, a, x, b, c, static: ScanStatic):
    return reference.chunked(dt, a, x, b, c, chunk=static.chunk)


def _triton(dt, a, x, b, c, static: ScanStatic):
    n, inner, width = x.shape[1], x.shape[2], a.shape[1]
    width_pad = padded_head_dim(width)
    channels = min(32, pl.next_power_of_2(inner), max(1, STATE_TILE // width_pad))
    n_pad, inner_pad = round_up(n, pallas_gpu.CHUNK), round_up(inner, channels)
    dt, x = (pad_axis(pad_axis(v, 1, n_pad), 2, inner_pad) for v in (dt, x))
    b, c = (pad_axis(pad_axis(v, 1, n_pad), 2, width_pad) for v in (b, c))
    a = pad_axis(pad_axis(a, 0, inner_pad), 1, width_pad)
    kernel_static = pallas_gpu.KernelStatic(channels=channels, interpret=static.interpret)
    triton = lambda dt, x, b, c, a: pallas_gpu.selective_scan(dt, a, x, b, c, kernel_static)  # noqa: E731
    return sharding.over_batch(triton)(dt, x, b, c, a=a)[:, :n, :inner]


SELECTIVE_SCAN = KernelOp("selective_scan", (
    Implementation(XLA, _xla, dropout=False),
    Implementation(TRITON, _triton, backend="triton", platforms=("cpu", "gpu"), dropout=False),
))


def selective_scan(
    dt: Float[Array, "b n e"],
    a: Float[Array, "e s"],
    x: Float[Array, "b n e"],
    b: Float[Array, "b n s"],
    c: Float[Array, "b n s"],
    *,
    chunk: int,
    impl: str = "auto",
    interpret: bool = False,
    platform: str | None = None,
    plan: KernelPlan | None = None,
) -> Float[Array, "b n e"]:
    """y_t = C_t · h_t with h_t = exp(Δ_t A) ⊙ h_{t-1} + (Δ_t x_t) B_t per channel, from h_{-1} = 0.

    Args:
      dt: Δ > 0 [b, n, E]; a: A < 0 [E, N]; x: the inputs [b, n, E]; b, c: B and C [b, n, N].
      chunk: the XLA form's steps per chunk (`reference.chunked`); the result does not depend on it beyond
        float32 rounding.
      plan: the implementation to run (a layer's `kernel_plan`); without one, planned here from `impl`,
        `platform` and `interpret`, as in `flash_attention`.
    """
    if plan is None:
        plan = dispatch.plan(impl, dispatch.call_target(platform, interpret), SELECTIVE_SCAN,
                             dtype=jnp.dtype(x.dtype).name)
    dispatch.check_plan(SELECTIVE_SCAN, plan)
    return plan.implementation.run(dt, a, x, b, c, ScanStatic(chunk, plan.interpret))
