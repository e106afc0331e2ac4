"""Dense softmax attention with key padding, choosing the kernel: `flash_attention(..., impl=)`.

impl="pallas" runs a FlashAttention kernel (Dao et al. 2022, Alg. 1/2; O(n)
memory): `pallas_gpu` (Triton) for a GPU target, jax's splash attention
(`pallas_tpu`, Mosaic) for a TPU target; impl="xla" the jnp reference (an
explicit n x n matrix); impl="auto" the kernel on GPU/TPU and XLA on CPU. The
target is `platform`, by default `lra_jax.kernels.current_target()`. Attention
dropout (`dropout_rate`, `dropout_seed`) runs in the Triton kernel and the
reference, with the same mask (`lra_jax.kernels.dropout`); splash has none, so on TPU a call with
dropout runs our own Mosaic kernel (`pallas_mosaic`, recorded as "pallas-mosaic-flash") and one
without runs splash. Shapes: q [b, nq, h, d],
k, v [b, nk, h, d] -> [b, nq, h, d] in q's dtype.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Bool, Float

from lra_jax.kernels import dropout, pallas_backend, resolve_impl, sharding
from lra_jax.kernels.flash import pallas_gpu, pallas_mosaic, pallas_tpu, reference


def masks_from(
    nq: int, nk: int, batch: int, key_mask=None, query_mask=None, lengths=None
) -> tuple[Bool[Array, "b k"], Bool[Array, "b q"]]:
    """Key and query masks from explicit masks or per-sequence `lengths` (True = real token).

    With `lengths` both are prefixes of that length; without anything every token is
    real; a key mask alone with nq == nk also serves as the query mask (self-attention).
    """
    if lengths is not None:
        lengths = jnp.asarray(lengths)
        key_mask = jnp.arange(nk)[None, :] < lengths[:, None] if key_mask is None else key_mask
        query_mask = jnp.arange(nq)[None, :] < lengths[:, None] if query_mask is None else query_mask
    if key_mask is None:
        key_mask = jnp.ones((batch, nk), bool)
    if query_mask is None:
        query_mask = key_mask if nq == nk else jnp.ones((batch, nq), bool)
    return jnp.asarray(key_mask, bool), jnp.asarray(query_mask, bool)


def check_dropout(rate: float, seed: Array | None) -> Array:
    """The seed a call passes on: `seed` as uint32 [1] when rate > 0 (required), zeros otherwise."""
    dropout.threshold(rate)  # checks 0 <= rate < 1
    if rate == 0.0:
        return jnp.zeros((1,), jnp.uint32)
    if seed is None:
        raise ValueError(f"attention dropout at rate {rate} needs a dropout_seed (dropout.seed_from_key(key))")
    return jnp.asarray(seed, jnp.uint32).reshape(1)


def kernel_block(n: int, block: int) -> int:
    """A power-of-two block >= 16 (Triton's smallest dot), no larger than needed for n."""
    return max(16, min(pl.next_power_of_2(block), pl.next_power_of_2(n)))


def pad_axis(x: Array, axis: int, size: int, value=0) -> Array:
    """Pads `axis` of x at the end up to `size`."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def padded_head_dim(d: int) -> int:
    """Head dims are padded with zeros to a power of two >= 16 (zeros change no logit)."""
    return max(16, pl.next_power_of_2(d))


def flash_attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    *,
    key_mask: Bool[Array, "b k"] | None = None,
    query_mask: Bool[Array, "b q"] | None = None,
    lengths: Array | None = None,
    scale: float | None = None,
    impl: str = "auto",
    block_q: int = 64,
    block_k: int = 64,
    interpret: bool = False,
    platform: str | None = None,
    dropout_rate: float = 0.0,
    dropout_seed: Array | None = None,
) -> Float[Array, "b q h d"]:
    """softmax(scale q k^T) v over the real keys; padded query rows and rows without keys are 0.

    Args:
      q, k, v: queries [b, nq, h, d], keys and values [b, nk, h, d] (float32 or bfloat16).
      key_mask, query_mask: True on real tokens; or `lengths` [b] for prefix padding.
      scale: softmax scale, default 1 / sqrt(d).
      impl: "auto" | "xla" | "pallas".
      block_q, block_k: the largest kernel blocks (rounded to powers of two >= 16); smaller ones are
        used where these would not fit the target GPU (`pallas_gpu.choose_dense_tiling`).
      interpret: run the Pallas kernel in the interpreter (CPU tests).
      platform: "gpu" (Triton) or "tpu" (splash); default: the current kernel target.
      dropout_rate, dropout_seed: attention dropout rate and its uint32 seed [1]
        (`dropout.seed_from_key`); on TPU they select `pallas_mosaic` instead of splash.
    """
    b, nq, _, d = q.shape
    nk = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    key_mask, query_mask = masks_from(nq, nk, b, key_mask, query_mask, lengths)
    dropout_seed = check_dropout(dropout_rate, dropout_seed)
    if resolve_impl(impl, interpret, platform) == "xla":
        return reference.attention(q, k, v, key_mask, query_mask, scale, dropout_rate, dropout_seed)
    if pallas_backend(platform) == "mosaic":
        if dropout_rate > 0.0:
            return mosaic_flash(q, k, v, key_mask.astype(jnp.int32)[:, None, :], query_mask, scale, dropout_rate,
                                dropout_seed, interpret)
        nq_pad, nk_pad = (-(-x // pallas_tpu.BLOCK) * pallas_tpu.BLOCK for x in (nq, nk))
        splash = lambda q, k, v, q_ids, k_ids: pallas_tpu.attention(  # noqa: E731
            q, k, v, q_ids, k_ids, pallas_tpu.full_mask(nq_pad, nk_pad), scale, interpret)
        out = sharding.over_batch(splash)(
            pad_axis(q, 1, nq_pad), pad_axis(k, 1, nk_pad), pad_axis(v, 1, nk_pad),
            pallas_tpu.segment_ids(pad_axis(query_mask, 1, nq_pad, False)),
            pallas_tpu.segment_ids(pad_axis(key_mask, 1, nk_pad, False)))[:, :nq]
        keep = query_mask & key_mask.any(1, keepdims=True)  # a row with no real key is 0, as in the reference
        return jnp.where(keep[:, :, None, None], out, jnp.zeros((), out.dtype))

    d_pad = padded_head_dim(d)
    tiles = pallas_gpu.choose_dense_tiling(kernel_block(nq, block_q), kernel_block(nk, block_k), d_pad)
    block_q, block_k = tiles.block_q, tiles.block_k
    nq_pad, nk_pad = -(-nq // block_q) * block_q, -(-nk // block_k) * block_k
    qp = pad_axis(pad_axis(q, 1, nq_pad), 3, d_pad)
    kp = pad_axis(pad_axis(k, 1, nk_pad), 3, d_pad)
    vp = pad_axis(pad_axis(v.astype(q.dtype), 1, nk_pad), 3, d_pad)
    key_code = pad_axis(key_mask.astype(jnp.int32), 1, nk_pad)

    def triton(q, k, v, key_code, seed, first_row):
        zeros_q, zeros_k = jnp.zeros((nq_pad,), jnp.int32), jnp.zeros((nk_pad,), jnp.int32)
        return pallas_gpu.attention(q, k, v, key_code, zeros_q, zeros_q, zeros_k,
                                    pallas_gpu.dropout_state(seed, first_row), None, None, scale, None, tiles,
                                    dropout_rate, interpret)

    out = sharding.over_batch(triton, first_row=True)(qp, kp, vp, key_code, seed=dropout_seed)[:, :nq, :, :d]
    return jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))


def mosaic_flash(q, k, v, key_info, query_mask, scale: float, rate: float, seed, interpret: bool, *,
                 padded: tuple[int, int] | None = None, pattern: pallas_mosaic.Pattern = pallas_mosaic.Pattern(),
                 sparsity: pallas_mosaic.Sparsity = pallas_mosaic.DENSE):
    """`pallas_mosaic.attention` (TPU, with dropout) on [b, n, h, d]: padded to its block (or to `padded`
    (nq, nk), the lengths a block-sparse `pattern` was built for), heads major, run per device on its rows
    of the batch with the dropout heads of the *global* batch rows. key_info int32 [b, r, nk] (row 0 the
    key codes); padded query rows are 0."""
    b, nq, h, _ = q.shape
    nk = k.shape[1]
    block = pallas_mosaic.BLOCK
    nq_pad, nk_pad = padded or (-(-x // block) * block for x in (nq, nk))
    heads = pallas_mosaic.head_state(seed, b, h)  # global rows: a sharded run draws one device's mask
    major = lambda x, n: pad_axis(x, 1, n).transpose(0, 2, 1, 3)  # noqa: E731  [b, n, h, d] -> [b, h, n, d]
    resident = pallas_mosaic.resident_block(nq_pad, nk_pad) if sparsity == pallas_mosaic.DENSE else block
    kernel = lambda q, k, v, key_info, heads, pattern: pallas_mosaic.attention(  # noqa: E731
        q, k, v, key_info, heads, scale, rate, resident, block, interpret, pattern, sparsity)
    out = sharding.over_batch(kernel)(major(q, nq_pad), major(k, nk_pad), major(v, nk_pad),
                                      pad_axis(key_info, 2, nk_pad), heads, pattern=pattern)
    out = out.transpose(0, 2, 1, 3)[:, :nq]
    return jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))
