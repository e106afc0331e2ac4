"""Pallas selective scan (Mamba's S6), forward and backward (GPU, Triton backend).

The recurrence of `reference` (eq. 1), per channel e: h_t = exp(Δ_t A) ⊙ h_t-1 + u_t B_t with u = Δ x, and
y_t = C_t · h_t. The decay differs per channel and per state dimension, so there is no [C, C] matmul form
(Mamba-2's scalar decay is what gives SSD one): one program per (batch, block of channels) walks the steps
in order with its [E_blk, N] states in float32 on chip, as Mamba's own kernel does, and writes only y.

Backward (custom_vjp, nothing stored but the inputs), with b_t = Σ_{i<=t} Δ_i A the cumulative log-decay,
y depends on b only through C_t e^{b_t} and B_t e^{-b_t}, so the log-decay's gradient is a reverse sum
G_t = Σ_{t'>=t} (P - Q)_t' of P_t = C_t ⊙ dy_t h_t and Q_t = B_t ⊙ u_t dh_t (per channel and state):

    kernel 1, steps in order, h recomputed:  dC_t = Σ_e dy_t h_t,   p_t = Σ_s A ⊙ P_t,
                                             per chunk of T steps Σ P_t and Σ P_t λ_t
    kernel 2, steps in reverse, carrying     dh_t = exp(Δ_t+1 A) ⊙ dh_t+1 + dy_t C_t,
      dh, R and G after the chunk:           du_t = dh_t · B_t,  dB_t = Σ_e u_t dh_t,
                                             dΔ_t = R_t + x_t du_t with R_t = Σ_{t'>=t} (p - q)_t' = A · G_t,
                                             dx_t = Δ_t du_t,   dA = Σ_t Δ_t G_t

where q_t = Σ_s A ⊙ Q_t and λ_t = Σ of Δ over the chunk's steps up to t. dA is summed per chunk j as
D_j G_after + Σ_t (P - Q)_t λ_t (D_j: the chunk's Δ, G_after: G past the chunk), so no sum runs over the
whole sequence's Δ, whose size would cost float32 digits. Partial dB and dC per block of channels, and dA per
batch row, are summed by XLA. G, a sum of differences P - Q that autodiff forms as one product
exp(Δ_t A) h_t-1 dh_t, keeps fewer float32 digits where the decays are strong: at n = 1024 with Δ up to 0.1 and
A down to -16, dA's largest error was 8e-6 of its largest entry, against 2.5e-7 for autodiff of the XLA form
(float64 reference; dΔ, dx, dB and dC within 2.2e-7).

Shapes: Δ, x [b, n, E]; A [E, N]; B, C [b, n, N]; n a multiple of the chunk, E a multiple of the channel
block, N a power of two >= 16 (the api pads with steps, channels and states that change nothing). y is
float32; the gradients take their input's dtype. Backend: GPU via Triton; `interpret=True` anywhere.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

CHUNK = 16  # T: the steps over which kernel 1 sums P for dA (module docstring); the api pads n to a multiple


@dataclasses.dataclass(frozen=True)
class KernelStatic:
    """What the kernels are compiled for: channels per program, warps, the interpreter."""

    channels: int = 32
    num_warps: int = 4
    interpret: bool = False


def _row(ref, t):
    """Step t of a [n, w] ref, [w] in float32."""
    return ref[t, :].astype(jnp.float32)


def _step_inputs(dt_ref, x_ref, b_ref, c_ref, t):
    return _row(dt_ref, t), _row(x_ref, t), _row(b_ref, t), _row(c_ref, t)


def _advance(h, a, dt, x, b):
    """h_t from h_t-1 [E_blk, N]."""
    return jnp.exp(dt[:, None] * a) * h + (dt * x)[:, None] * b[None, :]


def _forward_kernel(dt_ref, x_ref, b_ref, c_ref, a_ref, y_ref, *, n):
    a = a_ref[...].astype(jnp.float32)

    def step(t, h):
        dt, x, b, c = _step_inputs(dt_ref, x_ref, b_ref, c_ref, t)
        h = _advance(h, a, dt, x, b)
        y_ref[t, :] = jnp.sum(h * c[None, :], axis=1)
        return h

    lax.fori_loop(0, n, step, jnp.zeros(a.shape, jnp.float32))


def _states_kernel(dt_ref, x_ref, b_ref, c_ref, a_ref, dy_ref, dc_ref, p_ref, sp_ref, lp_ref, *, num_chunks):
    """Kernel 1: steps in order, h recomputed: dC (this block's channels), p, and per chunk Σ P and Σ P λ."""
    a = a_ref[...].astype(jnp.float32)
    zeros = jnp.zeros(a.shape, jnp.float32)

    def one_chunk(j, h):
        def step(i, carry):
            h, sum_p, weighted_p, lam = carry
            t = j * CHUNK + i
            dt, x, b, c = _step_inputs(dt_ref, x_ref, b_ref, c_ref, t)
            h = _advance(h, a, dt, x, b)
            lam = lam + dt
            dy_h = _row(dy_ref, t)[:, None] * h
            dc_ref[t, :] = jnp.sum(dy_h, axis=0)
            p = c[None, :] * dy_h
            p_ref[t, :] = jnp.sum(p * a, axis=1)
            return h, sum_p + p, weighted_p + p * lam[:, None], lam

        h, sum_p, weighted_p, _ = lax.fori_loop(0, CHUNK, step, (h, zeros, zeros, jnp.zeros(a.shape[:1], jnp.float32)))
        sp_ref[j] = sum_p
        lp_ref[j] = weighted_p
        return h

    lax.fori_loop(0, num_chunks, one_chunk, zeros)


def _reverse_kernel(dt_ref, x_ref, b_ref, c_ref, a_ref, dy_ref, p_ref, sp_ref, lp_ref,
                    ddt_ref, dx_ref, db_ref, da_ref, *, num_chunks):
    """Kernel 2: steps in reverse, carrying dh, R = A · G and G after the chunk; dΔ, dx, dB, dA."""
    a = a_ref[...].astype(jnp.float32)
    zeros = jnp.zeros(a.shape, jnp.float32)

    def one_chunk(jj, carry):
        j = num_chunks - 1 - jj
        dh, decay_next, g_after, r, da = carry
        total = jnp.sum(dt_ref[pl.ds(j * CHUNK, CHUNK), :].astype(jnp.float32), axis=0)  # D_j [E_blk]

        def step(ii, carry):
            dh, decay_next, sum_q, weighted_q, lam, r = carry
            t = j * CHUNK + CHUNK - 1 - ii
            dt, x, b, c = _step_inputs(dt_ref, x_ref, b_ref, c_ref, t)
            dh = decay_next * dh + _row(dy_ref, t)[:, None] * c[None, :]
            u = dt * x
            du = jnp.sum(dh * b[None, :], axis=1)
            q = b[None, :] * u[:, None] * dh
            r = r + _row(p_ref, t) - jnp.sum(q * a, axis=1)
            ddt_ref[t, :] = (r + x * du).astype(ddt_ref.dtype)
            dx_ref[t, :] = (dt * du).astype(dx_ref.dtype)
            db_ref[t, :] = jnp.sum(dh * u[:, None], axis=0)
            return dh, jnp.exp(dt[:, None] * a), sum_q + q, weighted_q + q * lam[:, None], lam - dt, r

        dh, decay_next, sum_q, weighted_q, _, r = lax.fori_loop(
            0, CHUNK, step, (dh, decay_next, zeros, zeros, total, r))
        da = da + total[:, None] * g_after + lp_ref[j] - weighted_q
        return dh, decay_next, g_after + sp_ref[j] - sum_q, r, da

    init = (zeros, zeros, zeros, jnp.zeros(a.shape[:1], jnp.float32), zeros)
    *_, da = lax.fori_loop(0, num_chunks, one_chunk, init)
    da_ref[...] = da


def _call(kernel, name, static: KernelStatic, inputs, outputs, **params):
    """One program per (batch row, block of channels); `inputs` and `outputs` are (kind, array or shape)
    pairs, the kind naming the block: "channels" [n, E_blk], "states" [n, N], "A" [E_blk, N], "partial"
    [n, N] of the block's own slot, "chunks" [n / T, E_blk, N], "per_row" [E_blk, N] of the batch row."""
    dt = inputs[0][1]
    batch, n, inner = dt.shape
    width, e = inputs[4][1].shape[-1], static.channels
    specs = {
        "channels": pl.BlockSpec((None, n, e), lambda i, k: (i, 0, k)),
        "states": pl.BlockSpec((None, n, width), lambda i, k: (i, 0, 0)),
        "A": pl.BlockSpec((e, width), lambda i, k: (k, 0)),
        "partial": pl.BlockSpec((None, n, None, width), lambda i, k: (i, 0, k, 0)),
        "chunks": pl.BlockSpec((None, n // CHUNK, e, width), lambda i, k: (i, 0, k, 0)),
        "per_row": pl.BlockSpec((None, e, width), lambda i, k: (i, k, 0)),
    }
    return pl.pallas_call(
        functools.partial(kernel, **params),
        grid=(batch, inner // e),
        in_specs=[specs[kind] for kind, _ in inputs],
        out_specs=[specs[kind] for kind, _ in outputs],
        out_shape=[shape for _, shape in outputs],
        compiler_params=plgpu.CompilerParams(num_warps=static.num_warps, num_stages=1),
        interpret=static.interpret,
        name=name,
    )(*(array for _, array in inputs))


def _inputs(dt, a, x, b, c):
    return [("channels", dt), ("channels", x), ("states", b), ("states", c), ("A", a)]


def _forward(dt, a, x, b, c, static: KernelStatic):
    (y,) = _call(_forward_kernel, "selective_scan_fwd", static, _inputs(dt, a, x, b, c),
                 [("channels", jax.ShapeDtypeStruct(x.shape, jnp.float32))], n=x.shape[1])
    return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def selective_scan(dt, a, x, b, c, static: KernelStatic):
    """y [b, n, E] in float32 (module docstring)."""
    return _forward(dt, a, x, b, c, static)


def _selective_scan_fwd(dt, a, x, b, c, static: KernelStatic):
    return _forward(dt, a, x, b, c, static), (dt, a, x, b, c)


def _selective_scan_bwd(static: KernelStatic, residuals, dy):
    dt, a, x, b, c = residuals
    batch, n, inner = x.shape
    blocks, width = inner // static.channels, a.shape[-1]
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    inputs = _inputs(dt, a, x, b, c) + [("channels", dy)]
    num_chunks = n // CHUNK
    dc, p, sum_p, weighted_p = _call(
        _states_kernel, "selective_scan_bwd_states", static, inputs,
        [("partial", f32(batch, n, blocks, width)), ("channels", f32(batch, n, inner)),
         ("chunks", f32(batch, num_chunks, inner, width)), ("chunks", f32(batch, num_chunks, inner, width))],
        num_chunks=num_chunks)
    ddt, dx, db, da = _call(
        _reverse_kernel, "selective_scan_bwd_reverse", static,
        inputs + [("channels", p), ("chunks", sum_p), ("chunks", weighted_p)],
        [("channels", jax.ShapeDtypeStruct(dt.shape, dt.dtype)), ("channels", jax.ShapeDtypeStruct(x.shape, x.dtype)),
         ("partial", f32(batch, n, blocks, width)), ("per_row", f32(batch, inner, width))],
        num_chunks=num_chunks)
    return (ddt, jnp.sum(da, axis=0).astype(a.dtype), dx, jnp.sum(db, axis=2).astype(b.dtype),
            jnp.sum(dc, axis=2).astype(c.dtype))


selective_scan.defvjp(_selective_scan_fwd, _selective_scan_bwd)
