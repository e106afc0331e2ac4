"""Softmax attention on TPU: jax's splash attention (Pallas Mosaic), with key padding as segment ids.

Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`, the TPU
kernel of MaxText) is FlashAttention (Dao et al. 2022) for TPU: the online
softmax over blocks of 128 queries and keys, a mask that says which blocks are
empty, full or partial (empty blocks are skipped), and segment ids that confine
attention to equal ids. We use a well-kept kernel rather than a home-made one.

How our contract maps onto it:
  * key padding -> segment ids: a real query has id s >= 0 and sees the real keys
    of id s; padding (ours and the block-multiple padding added here) has id -1,
    so a padded query sees only padded keys. No real output ever reads a padded
    key, and no row is ever empty when its query is padding too (it sees itself).
  * the pattern -> the splash mask (static: full, band, band + global rows and
    columns; or a dynamic boolean mask for layouts known only at run time).
  * lengths -> padded to a multiple of the 128-wide block (LRA's 1000, 2000 and
    4000 are not); the api zeroes outputs at padded positions.
  * scale -> q is scaled before the kernel (splash computes q k^T unscaled).
  * heads -> one single-head kernel mapped over batch and heads (jax.vmap), so a
    mask, static or dynamic, is stored once, not per head.

Shapes: q [b, nq, h, d], k, v [b, nk, h, d] with nq, nk multiples of BLOCK;
segment ids int32 [b, nq], [b, nk]. Runs anywhere with `interpret=True`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

# Splash's block: 128 queries x 128 keys (the TPU's lane width), forward and backward.
BLOCK = 128
PAD_SEGMENT = -1


def block_sizes(block: int = BLOCK) -> splash.BlockSizes:
    """The same block for the forward and both backward kernels (dq, dk/dv)."""
    return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                             block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)


def full_mask(nq: int, nk: int) -> splash_mask.Mask:
    """Every (query, key) pair: dense attention, padding left to the segment ids."""
    return splash_mask.FullMask((nq, nk))


def segment_ids(real: jax.Array, segments: jax.Array | None = None) -> jax.Array:
    """int32 [b, n]: `segments` (default 0) on real tokens, PAD_SEGMENT on padding."""
    ids = jnp.zeros(real.shape, jnp.int32) if segments is None else jnp.broadcast_to(
        jnp.asarray(segments, jnp.int32), real.shape)
    return jnp.where(real, ids, PAD_SEGMENT)


def attention(q, k, v, q_segments, k_segments, mask, scale: float, interpret: bool):
    """Splash attention [b, nq, h, d] in q's dtype.

    Args:
      q, k, v: [b, nq, h, d], [b, nk, h, d], [b, nk, h, d]; nq, nk multiples of BLOCK.
      q_segments, k_segments: int32 [b, nq], [b, nk] (see `segment_ids`).
      mask: a static splash mask of shape (nq, nk), or a dynamic bool array [nq, nk].
      scale: softmax scale. interpret: run in the Pallas interpreter.
    """
    if isinstance(mask, splash_mask.Mask):
        mask = splash_mask.MultiHeadMask([mask])
    else:
        mask = jnp.asarray(mask, bool)[None]
    kernel = splash.make_splash_mha(mask, block_sizes=block_sizes(), head_shards=1, q_seq_shards=1,
                                    interpret=interpret)
    if not isinstance(mask, splash_mask.Mask):
        kernel = _dynamic_flag_static(kernel)
    q = (q.astype(jnp.float32) * scale).astype(q.dtype)

    def one_head(q, k, v, ids):  # q [nq, d], k, v [nk, d]
        return kernel(q[None], k[None], v[None].astype(q.dtype), segment_ids=ids)[0]

    def one_sequence(q, k, v, q_ids, k_ids):  # [n, h, d]
        ids = splash.SegmentIds(q=q_ids, kv=k_ids)
        return jax.vmap(one_head, in_axes=(1, 1, 1, None), out_axes=1)(q, k, v, ids)

    return jax.vmap(one_sequence)(q, k, v, q_segments, k_segments)


def _dynamic_flag_static(kernel: splash.SplashAttentionKernel) -> splash.SplashAttentionKernel:
    """Keeps `is_dynamic_mask` a Python bool: `make_splash_mha` (jax 0.10 through 0.12 at least) turns
    every MaskInfo field into an array, so under jit the kernel's `if mask_info.is_dynamic_mask` meets a
    tracer. A no-op for a jax whose flag is already a bool."""
    infos = [info if info is None or isinstance(info.is_dynamic_mask, bool) else info._replace(is_dynamic_mask=True)
             for info in (kernel.fwd_mask_info, kernel.dq_mask_info, kernel.dkv_mask_info)]
    return splash.SplashAttentionKernel(*infos, **kernel.kwargs)


class BandWithGlobals(splash_mask.Mask):
    """Static mask |i - j| <= window, or query i global, or key j global (Longformer's pattern).

    window None means no band (only the global rows and columns); global_q / global_k
    are numpy bool [nq] / [nk].
    """

    def __init__(self, shape: tuple[int, int], window: int | None, global_q: np.ndarray, global_k: np.ndarray):
        self._shape = tuple(shape)
        self.window = window
        self.global_q = np.asarray(global_q, bool)
        self.global_k = np.asarray(global_k, bool)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def __getitem__(self, idx) -> np.ndarray:
        rows, cols = (np.arange(self._shape[axis])[part] for axis, part in enumerate(idx))
        near = np.zeros((rows.size, cols.size), bool)
        if self.window is not None:
            near = np.abs(rows[:, None] - cols[None, :]) <= self.window
        return near | self.global_q[rows][:, None] | self.global_k[cols][None, :]

    def __eq__(self, other: object):
        return (isinstance(other, BandWithGlobals) and self._shape == other._shape and self.window == other.window
                and np.array_equal(self.global_q, other.global_q) and np.array_equal(self.global_k, other.global_k))

    def __hash__(self):
        return hash((BandWithGlobals, self._shape, self.window, self.global_q.tobytes(), self.global_k.tobytes()))
