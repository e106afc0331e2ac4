"""Attention dropout whose mask is a function of coordinates: kernels regenerate it, references match it.

Dropout on attention weights (Vaswani et al. 2017, Sec. 5.4) keeps each weight with
probability 1 - r and rescales it:

    P~[b, h, i, j] = P[b, h, i, j] * keep[b, h, i, j] / (1 - r),
    keep = bits(seed, b * H + h, i, j) >= r * 2^32,

where `bits` is a counter-based hash (murmur3's 32-bit finaliser, fmix32, applied
per head, per query row and per element), so any element's bit comes from its
coordinates alone: a kernel draws the mask tile by tile in the forward pass and
draws the same tiles again in the backward pass instead of storing n x n bits (the
way FlashAttention-2 uses Philox). `i` and `j` are positions in the unpadded
sequence, so padding appended at the end changes no kept pair. Everything is
uint32 arithmetic (wrapping multiplies, logical shifts), on CPU, GPU and in
Triton alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, PRNGKeyArray, UInt32

_ROW = 0x9E3779B1  # odd constants: i -> i * c is a bijection mod 2^32
_COLUMN = 0x85EBCA77
_HEAD = 0xC2B2AE3D


def _fmix32(x: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    """murmur3's finaliser: a bijection of uint32 whose every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def threshold(rate: float) -> int:
    """The uint32 below which a weight is dropped: round(rate * 2^32), for a static 0 <= rate < 1."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"attention dropout rate must be in [0, 1), got {rate}")
    return min(round(rate * 2**32), 2**32 - 1)


def seed_from_key(key: PRNGKeyArray) -> UInt32[Array, "1"]:
    """A uint32 seed [1] drawn from a jax key (what the kernels take)."""
    return jax.random.bits(key, (1,), jnp.uint32)


def _u32(x) -> UInt32[Array, "..."]:
    return jnp.asarray(x).astype(jnp.uint32)


def head_bits(seed: UInt32[Array, ""], batch_head: Array) -> UInt32[Array, "..."]:
    """The hash state of heads `batch_head` (b * H + h, any shape) under `seed`."""
    return _fmix32(_u32(seed) ^ _fmix32(_u32(batch_head) * jnp.uint32(_HEAD) + jnp.uint32(1)))


def keep(head: UInt32[Array, "..."], q_pos: Array, k_pos: Array, rate: float) -> Bool[Array, "... q k"]:
    """The keep mask [..., q, k] of heads with state `head` (`head_bits`) at query positions
    `q_pos` [q] and key positions `k_pos` [k]."""
    row = _fmix32(head[..., None] ^ (_u32(q_pos) * jnp.uint32(_ROW)))  # [..., q]
    bits = _fmix32(row[..., :, None] + _u32(k_pos)[None, :] * jnp.uint32(_COLUMN))  # [..., q, k]
    return bits >= jnp.uint32(threshold(rate))


def apply(
    probs: Array,
    seed: UInt32[Array, "1"],
    rate: float,
) -> Array:
    """`probs` [b, h, q, k] with the mask of `keep` applied and the kept weights scaled by 1 / (1 - rate)."""
    b, h, nq, nk = probs.shape
    batch_head = jnp.arange(b)[:, None] * h + jnp.arange(h)[None, :]
    kept = keep(head_bits(seed[0], batch_head), jnp.arange(nq), jnp.arange(nk), rate)
    return jnp.where(kept, probs * (1.0 / (1.0 - rate)), jnp.zeros((), probs.dtype))


def keep_like(seed: UInt32[Array, "1"], shape: tuple[int, ...], rate: float) -> Bool[Array, "..."]:
    """The keep mask of an array of any `shape` [..., r, c]: `keep` with the leading axes,
    flattened in row-major order, as the heads, and the last two axes as rows and columns.

    For attention weights [b, h, q, k] this is exactly `apply`'s mask (head b * H + h), so the
    XLA path and the kernels drop the same weights; for activations [b, n, d] the heads are the
    examples, the rows the positions, the columns the features. A 1-d shape is one row.
    """
    shape = tuple(shape)
    if len(shape) < 2:
        return keep_like(seed, (1, *shape) if shape else (1, 1), rate).reshape(shape)
    heads = 1
    for size in shape[:-2]:
        heads *= size
    kept = keep(head_bits(seed[0], jnp.arange(heads)), jnp.arange(shape[-2]), jnp.arange(shape[-1]), rate)
    return kept.reshape(shape)


def drop(x: Array, seed: UInt32[Array, "1"], rate: float) -> Array:
    """x with the mask of `keep_like` applied and kept entries scaled by 1 / (1 - rate), any shape
    (inverted dropout, Srivastava et al. 2014: E[drop(x)] = x). For [b, h, q, k] it equals `apply`."""
    kept = keep_like(seed, x.shape, rate)
    return jnp.where(kept, x * (1.0 / (1.0 - rate)), jnp.zeros((), x.dtype))
