"""FlashAttention-2 for TPU with attention dropout: our own Pallas Mosaic kernel, forward and backward.

Splash attention (`pallas_tpu`) has no attention dropout, and every full-scale LRA config
trains with it; this kernel draws the counter-based mask of `lra_jax.kernels.dropout`
tile by tile, in the forward pass and again in both backward kernels, so the same seed
drops the same weights here, in the Triton kernel and in the XLA reference.

Forward (Dao 2023, FlashAttention-2, Alg. 1), per query block i over key blocks j:

    s = scale q_i k_j^T (masked keys -> MASK_VALUE),  m' = max(m, rowmax s),
    p = exp(s - m'),  l' = e^{m - m'} l + rowsum p,  acc' = e^{m - m'} acc + (p * z / (1 - r)) v_j,
    out_i = acc / l,  lse_i = m + log l,

with z the keep mask of the tile (`dropout.keep` at unpadded positions). Backward (Alg. 2),
D = rowsum(dO * O) (computed outside, O(n d)), P = exp(s - lse):

    dV_j = sum_i (P * z / (1 - r))^T dO_i,   dP = (dO_i v_j^T) * z / (1 - r),
    dS = P * (dP - D),   dQ_i = scale sum_j dS k_j,   dK_j = scale sum_i dS^T q_i.

dQ has its own kernel (grid over query blocks, keys innermost) and dK/dV theirs (grid over
key blocks, queries innermost), so no kernel needs atomics. The hash runs in int32 (wrapping
multiplies, logical shifts, an unsigned compare by flipping the sign bit): the bits of the
uint32 definition, tested equal (`keep_int32` vs `dropout.keep`).

Shapes: q [b, h, nq, d], k, v [b, h, nk, d] (nq, nk multiples of the blocks; heads major, the
layout TPU tiles want), key_mask int32 [b, 1, nk] (1 = real), heads int32 [b, h]
(`dropout.head_bits` of the global b * H + h, bit-cast). Runs anywhere with interpret=True.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Bool, Float, Int

from lra_jax.kernels import dropout
from lra_jax.kernels.masking import MASK_VALUE

BLOCK = 128  # queries and keys per block: the TPU's lane width
_NO_ROW = 1e30  # lse of a row without real keys: every p of it is exp(-huge) = 0


def _i32(value: int) -> int:
    """The int32 with the bits of uint32 `value`."""
    return value - 2**32 if value >= 2**31 else value


def _fmix32(x: Int[Array, "..."]) -> Int[Array, "..."]:
    """`dropout._fmix32` on int32 bits: wrapping multiplies, logical shifts."""
    x = x ^ lax.shift_right_logical(x, jnp.int32(16))
    x = x * jnp.int32(_i32(0x85EBCA6B))
    x = x ^ lax.shift_right_logical(x, jnp.int32(13))
    x = x * jnp.int32(_i32(0xC2B2AE35))
    return x ^ lax.shift_right_logical(x, jnp.int32(16))


def keep_int32(head: Int[Array, "..."], q_pos: Int[Array, "q 1"], k_pos: Int[Array, "1 k"],
               rate: float) -> Bool[Array, "q k"]:
    """`dropout.keep` for one head (its `head_bits` as int32) in int32 arithmetic: the same bits."""
    row = _fmix32(head ^ (q_pos * jnp.int32(_i32(dropout._ROW))))
    bits = _fmix32(row + k_pos * jnp.int32(_i32(dropout._COLUMN)))
    flip = jnp.int32(-(2**31))  # x ^ flip orders int32 as uint32 orders x
    return (bits ^ flip) >= jnp.int32(_i32(dropout.threshold(rate)) ^ -(2**31))


def head_state(seed: Array, batch: int, heads: int, batch_offset: Array | int = 0) -> Int[Array, "b h"]:
    """`dropout.head_bits` of heads (batch_offset + b) * heads + h, as int32 [b, h]."""
    index = (jnp.arange(batch)[:, None] + batch_offset) * heads + jnp.arange(heads)[None, :]
    return lax.bitcast_convert_type(dropout.head_bits(jnp.asarray(seed, jnp.uint32).reshape(-1)[0], index),
                                    jnp.int32)


def _tile_keep(heads_ref, b, h, qi, ki, bq, bk, rate):
    q_pos = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
    k_pos = ki * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
    return keep_int32(heads_ref[b, h], q_pos, k_pos, rate)


def _logits(q, k, key_ref, scale):
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    valid = key_ref[...] != 0  # [1, bk]
    return jnp.where(valid, s, MASK_VALUE), valid


def _forward_kernel(heads_ref, q_ref, k_ref, v_ref, key_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc, *,
                    scale, rate, bq, bk):
    b, h, qi, ki = (pl.program_id(axis) for axis in range(4))

    @pl.when(ki == 0)
    def _():
        m_sc[...] = jnp.full(m_sc.shape, MASK_VALUE, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    s, valid = _logits(q_ref[...], k_ref[...], key_ref, scale)
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.where(valid, jnp.exp(s - m_new), 0.0)
    l_sc[...] = alpha * l_sc[...] + p.sum(axis=1, keepdims=True)
    m_sc[...] = m_new
    if rate > 0.0:
        p = jnp.where(_tile_keep(heads_ref, b, h, qi, ki, bq, bk, rate), p * (1.0 / (1.0 - rate)), 0.0)
    v = v_ref[...]
    acc_sc[...] = alpha * acc_sc[...] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)

    @pl.when(ki == pl.num_programs(3) - 1)
    def _():
        total = l_sc[...]
        has_keys = total > 0.0
        o_ref[...] = (acc_sc[...] / jnp.where(has_keys, total, 1.0)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(has_keys, m_sc[...] + jnp.log(jnp.where(has_keys, total, 1.0)), _NO_ROW)


def _probs(heads_ref, b, h, qi, ki, q, k, key_ref, lse, scale, rate, bq, bk):
    """P and its dropped form P * z / (1 - r) of one tile."""
    s, valid = _logits(q, k, key_ref, scale)
    p = jnp.where(valid, jnp.exp(s - lse), 0.0)
    if rate == 0.0:
        return p, p, None
    kept = _tile_keep(heads_ref, b, h, qi, ki, bq, bk, rate)
    return p, jnp.where(kept, p * (1.0 / (1.0 - rate)), 0.0), kept


def _dscores(p, kept, do, v, di, rate):
    dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    if kept is not None:
        dp = jnp.where(kept, dp * (1.0 / (1.0 - rate)), 0.0)
    return p * (dp - di)


def _dq_kernel(heads_ref, q_ref, k_ref, v_ref, key_ref, do_ref, lse_ref, di_ref, dq_ref, dq_sc, *,
               scale, rate, bq, bk):
    b, h, qi, ki = (pl.program_id(axis) for axis in range(4))

    @pl.when(ki == 0)
    def _():
        dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

    q, k = q_ref[...], k_ref[...]
    p, _, kept = _probs(heads_ref, b, h, qi, ki, q, k, key_ref, lse_ref[...], scale, rate, bq, bk)
    ds = _dscores(p, kept, do_ref[...], v_ref[...], di_ref[...], rate)
    dq_sc[...] += jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    @pl.when(ki == pl.num_programs(3) - 1)
    def _():
        dq_ref[...] = (dq_sc[...] * scale).astype(dq_ref.dtype)


def _dkv_kernel(heads_ref, q_ref, k_ref, v_ref, key_ref, do_ref, lse_ref, di_ref, dk_ref, dv_ref, dk_sc, dv_sc, *,
                scale, rate, bq, bk):
    b, h, ki, qi = (pl.program_id(axis) for axis in range(4))

    @pl.when(qi == 0)
    def _():
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

    q, k, do = q_ref[...], k_ref[...], do_ref[...]
    p, p_dropped, kept = _probs(heads_ref, b, h, qi, ki, q, k, key_ref, lse_ref[...], scale, rate, bq, bk)
    transposed = (((0,), (0,)), ((), ()))  # contract the query axis: x^T y
    dv_sc[...] += lax.dot_general(p_dropped.astype(do.dtype), do, transposed, preferred_element_type=jnp.float32)
    ds = _dscores(p, kept, do, v_ref[...], di_ref[...], rate)
    dk_sc[...] += lax.dot_general(ds.astype(q.dtype), q, transposed, preferred_element_type=jnp.float32)

    @pl.when(qi == pl.num_programs(3) - 1)
    def _():
        dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _params(interpret: bool) -> dict:
    if interpret:
        return {"interpret": True}
    return {"compiler_params": pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))}


def _specs(d: int, bq: int, bk: int, keys_outer: bool):
    """BlockSpecs of q-like, k-like, key-mask and row-stat ([b, h, n, 1]) operands for a grid
    (b, h, qi, ki), or (b, h, ki, qi) when `keys_outer` (the dK/dV kernel)."""
    def order(fn):
        return (lambda b, h, j, i, heads: fn(b, h, i, j)) if keys_outer else (
            lambda b, h, i, j, heads: fn(b, h, i, j))
    q_spec = pl.BlockSpec((None, None, bq, d), order(lambda b, h, i, j: (b, h, i, 0)))
    k_spec = pl.BlockSpec((None, None, bk, d), order(lambda b, h, i, j: (b, h, j, 0)))
    key_spec = pl.BlockSpec((None, 1, bk), order(lambda b, h, i, j: (b, 0, j)))
    row_spec = pl.BlockSpec((None, None, bq, 1), order(lambda b, h, i, j: (b, h, i, 0)))
    return q_spec, k_spec, key_spec, row_spec


def _forward(q, k, v, key_mask, heads, scale, rate, block_q, block_k, interpret):
    b, h, nq, d = q.shape
    nk = k.shape[2]
    q_spec, k_spec, key_spec, row_spec = _specs(d, block_q, block_k, keys_outer=False)
    kernel = functools.partial(_forward_kernel, scale=scale, rate=rate, bq=block_q, bk=block_k)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(b, h, nq // block_q, nk // block_k),
            in_specs=[q_spec, k_spec, k_spec, key_spec], out_specs=[q_spec, row_spec],
            scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32), pltpu.VMEM((block_q, 1), jnp.float32),
                            pltpu.VMEM((block_q, d), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, nq, 1), jnp.float32)],
        name="lra_flash_fwd", **_params(interpret),
    )(heads, q, k, v.astype(q.dtype), key_mask)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def attention(
    q: Float[Array, "b h q d"],
    k: Float[Array, "b h k d"],
    v: Float[Array, "b h k d"],
    key_mask: Int[Array, "b 1 k"],
    heads: Int[Array, "b h"],
    scale: float,
    rate: float,
    block_q: int = BLOCK,
    block_k: int = BLOCK,
    interpret: bool = False,
) -> Float[Array, "b h q d"]:
    """softmax(scale q k^T) over the real keys (key_mask 1), dropped at `rate` with the mask of
    `heads` (`head_state`), times v; rows without real keys are 0. Differentiable in q, k, v."""
    return _forward(q, k, v, key_mask, heads, scale, rate, block_q, block_k, interpret)[0]


def _attention_fwd(q, k, v, key_mask, heads, scale, rate, block_q, block_k, interpret):
    out, lse = _forward(q, k, v, key_mask, heads, scale, rate, block_q, block_k, interpret)
    return out, (q, k, v, key_mask, heads, out, lse)


def _attention_bwd(scale, rate, block_q, block_k, interpret, res, dout):
    q, k, v, key_mask, heads, out, lse = res
    b, h, nq, d = q.shape
    nk = k.shape[2]
    v_dtype, v = v.dtype, v.astype(q.dtype)
    dout = dout.astype(q.dtype)
    di = (dout.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1, keepdims=True)  # D [b, h, nq, 1]
    common = dict(scale=scale, rate=rate, bq=block_q, bk=block_k)

    q_spec, k_spec, key_spec, row_spec = _specs(d, block_q, block_k, keys_outer=False)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, **common),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(b, h, nq // block_q, nk // block_k),
            in_specs=[q_spec, k_spec, k_spec, key_spec, q_spec, row_spec, row_spec], out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((block_q, d), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), name="lra_flash_dq", **_params(interpret),
    )(heads, q, k, v, key_mask, dout, lse, di)

    q_spec, k_spec, key_spec, row_spec = _specs(d, block_q, block_k, keys_outer=True)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, **common),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(b, h, nk // block_k, nq // block_q),
            in_specs=[q_spec, k_spec, k_spec, key_spec, q_spec, row_spec, row_spec], out_specs=[k_spec, k_spec],
            scratch_shapes=[pltpu.VMEM((block_k, d), jnp.float32), pltpu.VMEM((block_k, d), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(k.shape, v_dtype)],
        name="lra_flash_dkv", **_params(interpret),
    )(heads, q, k, v, key_mask, dout, lse, di)
    return dq, dk, dv, None, None


attention.defvjp(_attention_fwd, _attention_bwd)
