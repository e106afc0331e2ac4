"""Pallas fused non-causal kernelized attention, forward and backward (GPU, Triton backend).

Linear Transformer / Performer attention (Katharopoulos et al. 2020, eq. 6;
Choromanski et al. 2021): one program per (batch, head) streams the key blocks
once to accumulate S = sum_j m_j phi(k_j) v_j^T [m, d] and z = sum_j m_j phi(k_j)
[m] in float32 on chip, then streams the query blocks to write
out_i = phi(q_i)^T S / phi(q_i)^T z (0 where that normaliser is 0: no real key; no
epsilon, which would bias small normalisers). The feature map (elu + 1, or the
identity for features computed outside, e.g. FAVOR+) is applied in the kernel,
so phi(q), phi(k) never reach memory; the XLA form writes them and S, then
reads them back (two einsums).

Backward (custom_vjp, recomputing S and z): with g_i = dL/dout_i,
    a_i = g_i / den_i,  c_i = -(g_i . out_i) / den_i  (both 0 where den_i = 0),
    dphi(q_i) = S a_i + c_i z,  dS = sum_i phi(q_i) a_i^T,  dz = sum_i c_i phi(q_i),
    dphi(k_j) = m_j (dS v_j + dz),  dv_j = m_j dS^T phi(k_j),
chained through the feature map; one program per (batch, head), three passes.

Shapes: q, k [b, n, h, m], v [b, n, h, d], n a multiple of the block, m and d
powers of two >= 16 (the api pads; padded feature columns are zeroed in the
kernel via `num_features`). Backend: GPU via Triton; `interpret=True` anywhere. Rows per loop
step and pipeline stages are chosen for the target GPU's shared memory (`choose_tilings`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from lra_jax.kernels import tiling
from lra_jax.kernels.matmul import dot as _dot


def _phi(x, feature_map, num_features):
    """phi(x) [B, m] in float32, zero on padded feature columns, and dphi/dx."""
    x = x.astype(jnp.float32)
    real = (jnp.arange(x.shape[1]) < num_features)[None, :]
    if feature_map == "elu":
        phi, dphi = jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0))), jnp.where(x > 0, 1.0, jnp.exp(
            jnp.minimum(x, 0.0)))
    else:
        phi, dphi = x, jnp.ones_like(x)
    return jnp.where(real, phi, 0.0), jnp.where(real, dphi, 0.0)


def _sums(k_ref, v_ref, mask_ref, block, num_blocks, feature_map, num_features):
    """S [m, d] and z [1, m] over the real keys."""
    m, d = k_ref.shape[1], v_ref.shape[1]

    def body(t, carry):
        s, z = carry
        rows = pl.ds(t * block, block)
        phi_k, _ = _phi(k_ref[rows, :], feature_map, num_features)
        phi_k = jnp.where(mask_ref[rows][:, None] > 0, phi_k, 0.0)
        v = v_ref[rows, :].astype(jnp.float32)
        return s + _dot(phi_k, v, trans_a=True), z + jnp.sum(phi_k, axis=0)[None, :]

    return lax.fori_loop(0, num_blocks, body, (jnp.zeros((m, d), jnp.float32), jnp.zeros((1, m), jnp.float32)))


def _fwd_kernel(q_ref, k_ref, v_ref, mask_ref, o_ref, *, block, num_blocks, feature_map, num_features):
    s, z = _sums(k_ref, v_ref, mask_ref, block, num_blocks, feature_map, num_features)

    def body(t, _):
        rows = pl.ds(t * block, block)
        phi_q, _ = _phi(q_ref[rows, :], feature_map, num_features)
        den = jnp.sum(phi_q * z, axis=1)
        inv = jnp.where(den != 0, 1.0 / jnp.where(den != 0, den, 1.0), 0.0)
        o_ref[rows, :] = (_dot(phi_q, s) * inv[:, None]).astype(o_ref.dtype)
        return 0

    lax.fori_loop(0, num_blocks, body, 0)


def _bwd_kernel(q_ref, k_ref, v_ref, mask_ref, g_ref, dq_ref, dk_ref, dv_ref, *, block, num_blocks, feature_map,
                num_features):
    s, z = _sums(k_ref, v_ref, mask_ref, block, num_blocks, feature_map, num_features)
    m, d = s.shape

    def query_pass(t, carry):
        ds, dz = carry
        rows = pl.ds(t * block, block)
        phi_q, dphi_q = _phi(q_ref[rows, :], feature_map, num_features)
        g = g_ref[rows, :].astype(jnp.float32)
        den = jnp.sum(phi_q * z, axis=1)
        inv = jnp.where(den != 0, 1.0 / jnp.where(den != 0, den, 1.0), 0.0)
        out = _dot(phi_q, s) * inv[:, None]
        a = g * inv[:, None]
        c = -jnp.sum(g * out, axis=1) * inv
        dphi = _dot(a, s, trans_b=True) + c[:, None] * z
        dq_ref[rows, :] = (dphi * dphi_q).astype(dq_ref.dtype)
        return ds + _dot(phi_q, a, trans_a=True), dz + jnp.sum(c[:, None] * phi_q, axis=0)[None, :]

    ds, dz = lax.fori_loop(0, num_blocks, query_pass,
                           (jnp.zeros((m, d), jnp.float32), jnp.zeros((1, m), jnp.float32)))

    def key_pass(t, _):
        rows = pl.ds(t * block, block)
        phi_k, dphi_k = _phi(k_ref[rows, :], feature_map, num_features)
        real = mask_ref[rows][:, None] > 0
        v = v_ref[rows, :].astype(jnp.float32)
        dphi = _dot(v, ds, trans_b=True) + dz
        dk_ref[rows, :] = jnp.where(real, dphi * dphi_k, 0.0).astype(dk_ref.dtype)
        dv_ref[rows, :] = jnp.where(real, _dot(phi_k, ds), 0.0).astype(dv_ref.dtype)
        return 0

    lax.fori_loop(0, num_blocks, key_pass, 0)


def forward_bytes(block: int, m: int, d: int, num_stages: int) -> int:
    """An upper bound of the forward kernel's shared memory, at 4 bytes an element (it computes in
    float32): S [m, d] as a dot operand, and `num_stages` copies of a loop's rows of phi(q) or phi(k)
    [B, m] and of v [B, d]."""
    return 4 * (m * d + num_stages * block * (m + d))


def backward_bytes(block: int, m: int, d: int, num_stages: int) -> int:
    """An upper bound of the backward kernel's shared memory: S and dS [m, d] (two dot operands held
    across a pass) and `num_stages` copies of a loop's rows [B, m] and [B, d]. On A100 the compiler asks for
    2md + sBm + (s-1)Bd floats exactly (m = 256, d = 16 or 64, B = 16-64, s = 1-3)."""
    return 4 * (2 * m * d + num_stages * block * (m + d))


def choose_tilings(block: int, m: int, d: int) -> tuple[tiling.Tiling, tiling.Tiling]:
    """(forward, backward) tilings for features m and value width d (padded) on the target GPU, rows per
    loop step at most `block`; the backward needs more (two [m, d] matrices), so its block may be smaller.
    Raises `tiling.TilingError` where even 16 rows do not fit (S alone is m x d floats)."""
    limit = tiling.shared_memory()
    return tuple(tiling.choose(name, lambda bq, bk, stages, f=f: f(bq, m, d, stages), block, block, limit=limit)
                 for name, f in (("linear attention forward", forward_bytes),
                                 ("linear attention backward", backward_bytes)))


def _specs(b, n, h, m, d):
    full = lambda width: pl.BlockSpec((None, n, None, width), lambda bb, hh: (bb, 0, hh, 0))
    return full(m), full(d), pl.BlockSpec((None, n), lambda bb, hh: (bb, 0))


def _forward(q, k, v, key_code, tiles, feature_map, num_features, interpret):
    b, n, h, m = q.shape
    d = v.shape[-1]
    fm, fd, fmask = _specs(b, n, h, m, d)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, block=tiles.block_q, num_blocks=n // tiles.block_q, feature_map=feature_map,
                          num_features=num_features),
        grid=(b, h),
        in_specs=[fm, fm, fd, fmask],
        out_specs=fd,
        out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype),
        compiler_params=tiles.compiler_params(),
        interpret=interpret,
        name="linear_attention_fwd",
    )(q, k, v, key_code)


@dataclasses.dataclass(frozen=True)
class KernelStatic:
    """What the kernels are compiled for: the (forward, backward) `tiling.Tiling`s (`choose_tilings`, whose
    blocks divide n), the feature map ("elu" | "identity"), the unpadded feature count and the interpreter."""

    tiles: tuple[tiling.Tiling, tiling.Tiling]
    feature_map: str
    num_features: int
    interpret: bool = False


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attention(q, k, v, key_code, static: KernelStatic):
    """Fused kernelized attention [b, n, h, d]; key_code int32 [b, n] (> 0 on real keys), the call's only
    input besides q, k, v."""
    return _forward(q, k, v, key_code, static.tiles[0], static.feature_map, static.num_features, static.interpret)


def _attention_fwd(q, k, v, key_code, static: KernelStatic):
    out = _forward(q, k, v, key_code, static.tiles[0], static.feature_map, static.num_features, static.interpret)
    return out, (q, k, v, key_code)


def _attention_bwd(static: KernelStatic, residuals, g):
    tiles, feature_map, num_features, interpret = static.tiles, static.feature_map, static.num_features, static.interpret
    q, k, v, key_code = residuals
    b, n, h, m = q.shape
    d = v.shape[-1]
    block = tiles[1].block_q
    fm, fd, fmask = _specs(b, n, h, m, d)
    dq, dk, dv = pl.pallas_call(
        functools.partial(_bwd_kernel, block=block, num_blocks=n // block, feature_map=feature_map,
                          num_features=num_features),
        grid=(b, h),
        in_specs=[fm, fm, fd, fmask, fd],
        out_specs=[fm, fm, fd],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=tiles[1].compiler_params(),
        interpret=interpret,
        name="linear_attention_bwd",
    )(q, k, v, key_code, g)
    return dq, dk, dv, None


attention.defvjp(_attention_fwd, _attention_bwd)
