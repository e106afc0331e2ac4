"""Sparse attention patterns: sliding window (local), strided (Sparse Transformer), Longformer, BigBird.

None of them forms an n x n matrix: each cuts the (padded) sequence into blocks
and scores every query against a fixed number of key blocks, so time and memory
grow as O(n * block * const) instead of O(n^2). Padded keys are masked inside
every softmax, so real outputs do not depend on padding.

Local attention (Parmar et al. 2018, "Image Transformer", local 1D attention;
Beltagy et al. 2020, "Longformer", sec. 3.1 sliding window): query i attends to
the real keys j within a radius w,

    head_i = sum_{j : |i - j| <= w, mask_j} softmax_j(q_i . k_j / sqrt(d)) v_j,

which costs O(n * w) time and memory instead of O(n^2).

The computation never forms an n x n matrix. The sequence is padded to a
multiple of a block size B = min(w, n) (at least 1), cut into n / B blocks, and
each query block scores the 3B keys of the previous, its own and the next block
with a fixed B x 3B band mask |i - j| <= w; since B >= w, those 3B keys hold
every key of the window. Scores take n * 3B floats.

The LRA code (lra_benchmarks/models/local) calls "local attention" something
else: it cuts the sequence into fixed blocks (50 tokens) and attends only inside
each block, so a token at a block edge sees no neighbour on one side and two
adjacent tokens in different blocks never see each other. Here every token sees
the same symmetric window, wherever it sits.

With causal=True (next-token pretraining) query i sees the keys i - w .. i only: the band
mask is cut at j <= i.

`strided` is described in its class docstring; `longformer` and `bigbird` (a window plus global
tokens, and BigBird's random blocks) live in `sparse_global.py`, on the blocking helpers here.

Kernels: with impl="pallas" (or "auto" on a GPU or TPU) the four variants run
the block-sparse kernel of `lra_jax.kernels.block_sparse`: on GPU our Triton
kernel (the FlashAttention online softmax over a block layout), on TPU jax's
splash attention with the pattern as its mask (see the api docstring for how
each pattern maps onto them): the same function, never materialising even the
blocked scores. The Triton kernel applies attention dropout itself
(`lra_jax.kernels.dropout`); splash has none, so on TPU training with dropout > 0
runs our Mosaic flash kernel over the same pattern (`block_sparse/pallas_mosaic.py`,
recorded as "pallas-mosaic-block-sparse"). The merged single-head strided pattern
uses XLA, as does BigBird with a block size that is not a power of two >= 16 on GPU,
or on TPU in training one that neither divides 128 nor is a multiple of it.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float

from lra_jax.attention.core import Attention, masked_softmax
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError
from lra_jax.kernels.block_sparse.api import BLOCK_SPARSE, block_sparse_attention
from lra_jax.kernels.masking import Mask


def pad_to(x: Array, length: int) -> Array:
    """Pads axis 1 of x with zeros (False for a mask) up to `length`."""
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def split_blocks(x: Array, num_blocks: int, block: int) -> Array:
    """[b, num_blocks * block, ...] -> [b, num_blocks, block, ...]."""
    return x.reshape(x.shape[0], num_blocks, block, *x.shape[2:])


def three_blocks(x: Array, num_blocks: int, block: int) -> Array:
    """[b, num_blocks * block, ...] -> [b, num_blocks, 3 * block, ...]: previous, own and next block.

    One block of padding goes on each side, so the first and last blocks see it as
    their missing neighbour; the caller masks it out. A single block (window >= n)
    has no neighbours and keeps only its own keys: [b, 1, block, ...].
    """
    if num_blocks == 1:
        return x[:, None]
    pad = [(0, 0), (block, block)] + [(0, 0)] * (x.ndim - 2)
    x = split_blocks(jnp.pad(x, pad), num_blocks + 2, block)
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)


def band_mask(block: int, window: int, num_keys: int, causal: bool = False) -> Bool[Array, "q k"]:
    """[B, num_keys] mask: query i of a block may see key j of its neighbourhood iff |i - j| <= window
    (and, causal, j <= i).

    The neighbourhood is [previous, own, next] block (num_keys = 3B) or, for a
    single block, the block itself (num_keys = B).
    """
    query = jnp.arange(block)[:, None] + (num_keys - block) // 2  # position among the keys
    key = jnp.arange(num_keys)[None, :]
    return (jnp.abs(query - key) <= window) & ((key <= query) if causal else True)


def local_logits(
    q: Float[Array, "b n h d"], k: Float[Array, "b n h d"], mask: Bool[Array, "b n"], window: int,
    causal: bool = False,
) -> tuple[Float[Array, "b c h q k"], Bool[Array, "b c 1 q k"], int, int]:
    """Blocked sliding-window logits q.k / sqrt(d) and the keys each query may see (causal: j <= i too).

    Returns:
      The logits [b, c, h, B, 3B] of the c blocks of B queries over their 3B keys
      ([b, 1, h, n, n] when window >= n), the mask of allowed keys (band and real
      keys) [b, c, 1, B, 3B], the block size B and the padded length c * B.
    """
    n = q.shape[1]
    block = max(1, min(window, n))
    num_blocks = -(-n // block)
    padded = num_blocks * block
    q_blocks = split_blocks(pad_to(q, padded), num_blocks, block)  # [b c B h d]
    k_blocks = three_blocks(pad_to(k, padded), num_blocks, block)  # [b c 3B h d]
    key_mask = three_blocks(pad_to(mask, padded), num_blocks, block)  # [b c 3B]; pads are False
    logits = jnp.einsum("bcqhd,bckhd->bchqk", q_blocks, k_blocks) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    allowed = band_mask(block, window, k_blocks.shape[2], causal) & key_mask[:, :, None, None, :]
    return logits, allowed, block, padded


def local_weights(
    q: Float[Array, "b n h d"], k: Float[Array, "b n h d"], mask: Bool[Array, "b n"], window: int,
    causal: bool = False,
) -> tuple[Float[Array, "b c h q k"], int, int]:
    """Blocked sliding-window softmax weights over the real keys (causal: j <= i), in float32.

    Returns:
      The weights [b, c, h, B, 3B] of the c blocks of B queries over their 3B keys
      ([b, 1, h, n, n] when window >= n), the block size B and the padded length c * B.
    """
    logits, allowed, block, padded = local_logits(q, k, mask, window, causal)
    return masked_softmax(logits, allowed), block, padded


@register("local")
class LocalAttention(Attention):
    """Sliding-window attention: each token attends to the real tokens within `window` positions.

    Args:
      dim: model width.
      num_heads: number of heads.
      window: radius w; query i sees keys i - w .. i + w (2w + 1 tokens). The
        default 128 gives a 257-token window: at LRA lengths (1K-4K) that is 4-16x
        fewer scores than full attention while still spanning several of the
        original 50-token LRA blocks; w >= n is exactly full attention.
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention` (max_len, dropout_rate, dtype, impl).
    """

    kernel_op = BLOCK_SPARSE  # Triton on GPU; on TPU splash, or our Mosaic kernel where dropout is on
    cost_exponent = 1.0  # n * (2w + 1) scores
    supports_causal = True  # causal=True: keys i - w .. i
    kernel_serves_causal = True  # the band and causality in one Mask

    @staticmethod
    def bandsplit_blocks(n: int, window: int) -> tuple[int, int]:
        """(padded length c B, keys per query block) of `local_logits` at length n: blocks of
        B = min(w, n) queries against 3B keys (B when one block holds everything)."""
        block = max(1, min(window, n))
        num_blocks = -(-n // block)
        return num_blocks * block, (3 if num_blocks > 1 else 1) * block

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Projections, then q.k and p v of every block of B queries over its 3B keys: 2 x 2 (c B) 3B d.
        The XLA path computes whole [B, 3B] blocks, 3B / (2w + 1) ~ 1.5x the band's scores."""
        padded, keys = cls.bandsplit_blocks(n, settings["window"])
        return cls.projection_flops(batch, n, dim) + cls.attention_flops(batch * padded, keys, dim)

    def __init__(self, dim: int, num_heads: int, *, window: int = 128, rngs: nnx.Rngs, **common):
        if window < 0:
            raise ConfigError(f"local attention window must be >= 0, got window={window}")
        super().__init__(dim, num_heads, rngs=rngs, **common)
        self.window = window

    def mixing_pairs(self, n: int) -> Bool[np.ndarray, "n n"]:
        """|i - j| <= w."""
        position = np.arange(n)
        return np.abs(position[:, None] - position[None, :]) <= self.window

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        plan = self.kernel_plan(deterministic)
        if plan.uses_pallas:
            return block_sparse_attention(q, k, v, Mask(key_mask=mask, window=self.window, causal=self.causal),
                                          plan=plan, **self.kernel_dropout(plan, rngs))
        b, n, h, d = v.shape
        probs, block, padded = local_weights(q, k, mask, self.window, self.causal)
        probs = self.drop(probs, deterministic=deterministic, rngs=rngs)
        v_pad = jnp.pad(v, [(0, 0), (0, padded - n), (0, 0), (0, 0)])
        v_blocks = three_blocks(v_pad, padded // block, block)  # [b c 3B h d]
        out = jnp.einsum("bchqk,bckhd->bcqhd", probs.astype(v.dtype), v_blocks)
        return out.reshape(b, padded, h, d)[:, :n]


@register("strided")
class StridedAttention(Attention):
    """Sparse Transformer fixed/strided factorised attention, bidirectional (Child et al. 2019).

    Child et al. ("Generating Long Sequences with Sparse Transformers", sec. 4.2)
    factorise full attention into two patterns of stride l whose composition
    reaches every position in two steps. Here, bidirectionally, with the key sets

        A_local(i)   = { j : floor(j / l) = floor(i / l) }   (the l positions of i's block)
        A_strided(i) = { j : j = i (mod l) }                  (every l-th position, n / l of them)

    and each head computing softmax_{j in A(i), mask_j}(q_i . k_j / sqrt(d)) v_j.
    The first h // 2 heads use A_local, the other heads A_strided (the paper's
    "multi-head" integration, sec. 4.3). With a single head (h = 1) that head
    uses the union A_local(i) u A_strided(i) in one softmax (the paper's
    "merged" integration), with i itself counted once.

    The sequence is padded to a multiple of l and reshaped to [n / l, l]: local
    heads attend along the within-block axis, strided heads along the block axis.
    Scores take n * l (local) or n * n / l (strided) floats: O(n * (l + n / l)),
    O(n^1.5) at l = sqrt(n). The LRA code's "sparse transformer" built the same
    pattern as a dense n x n mask, at full O(n^2) cost.

    A stride l > n is clamped to n: the pattern restricted to positions < n is the
    same (every token in one block; A_strided(i) = {i}), so outputs do not change.

    With causal=True both sets keep j <= i only: the paper's own, autoregressive, pattern.

    Args:
      dim: model width.
      num_heads: number of heads.
      stride: block length and stride l. The default 128 is near sqrt(n) at the
        LRA lengths (1K-16K: sqrt is 32-128), keeping both parts small.
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention` (max_len, dropout_rate, dtype, impl).
    """

    kernel_op = BLOCK_SPARSE  # Triton on GPU; on TPU splash, or our Mosaic kernel where dropout is on
    cost_exponent = 1.5  # n * (l + n / l) scores: n^1.5 at the paper's l = sqrt(n)
    supports_causal = True  # causal=True: j <= i in both sets, as in the paper (XLA path)

    @classmethod
    def settings_at_length(cls, n: int) -> dict:
        return dict(stride=math.isqrt(n))

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Projections, then q.k and p v over the padded length c l: a local head's query against the l keys
        of its block, a strided head's against the c keys of its residue, 2 x 2 (c l) (l h_local + c h_strided) d_h
        with h_local = h // 2; a single head (merged) does both, h_local = h_strided = 1."""
        stride = max(1, min(settings["stride"], n))
        num_blocks = -(-n // stride)
        local_heads = num_heads // 2 if num_heads > 1 else 1
        strided_heads = num_heads - num_heads // 2
        keys_times_heads = stride * local_heads + num_blocks * strided_heads
        return cls.projection_flops(batch, n, dim) + cls.attention_flops(
            batch * num_blocks * stride, keys_times_heads, dim // num_heads)

    def __init__(self, dim: int, num_heads: int, *, stride: int = 128, rngs: nnx.Rngs, **common):
        if stride < 1:
            raise ConfigError(f"strided attention stride must be >= 1, got stride={stride}")
        super().__init__(dim, num_heads, rngs=rngs, **common)
        self.stride = stride

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        b, n, h, d = v.shape
        stride = max(1, min(self.stride, n))
        num_blocks = -(-n // stride)
        padded = num_blocks * stride
        plan = self.kernel_plan(deterministic)
        if plan.uses_pallas:
            return self._attend_kernel(q, k, v, mask, stride, num_blocks, plan, rngs)
        grid = lambda x: split_blocks(pad_to(x, padded), num_blocks, stride)  # noqa: E731  [b c l ...]
        q, k, v, key_mask = grid(q), grid(k), grid(v), grid(mask)
        scale = jnp.sqrt(d).astype(q.dtype)
        # Local: within block c, query offset q, key offset k.
        local_logits_ = lambda heads: jnp.einsum(  # noqa: E731
            "bcqhd,bckhd->bchqk", q[..., heads, :], k[..., heads, :]) / scale
        earlier = (lambda m: m & np.tri(m.shape[-1], dtype=bool)) if self.causal else (lambda m: m)  # noqa: E731
        local_mask = earlier(key_mask[:, :, None, None, :])  # [b c 1 1|q l]: key offset <= query offset
        # Strided: at offset r, query block q, key block k.
        strided_logits_ = lambda heads: jnp.einsum(  # noqa: E731
            "bqrhd,bkrhd->brhqk", q[..., heads, :], k[..., heads, :]) / scale
        strided_mask = earlier(jnp.swapaxes(key_mask, 1, 2)[:, :, None, None, :])  # [b r 1 1|q c]: block <= query's
        drop = lambda p: self.drop(p, deterministic=deterministic, rngs=rngs).astype(v.dtype)  # noqa: E731

        if h == 1:  # merged: one softmax over the union, the query's own block not repeated
            strided = jnp.transpose(strided_logits_(slice(None)), (0, 3, 2, 1, 4))  # [b c h r k]
            blocks = jnp.arange(num_blocks)
            # [c k]: the other blocks (causal: the earlier ones); the own block is in the local part
            other_block = (blocks[None, :] < blocks[:, None]) if self.causal else (blocks[None, :] != blocks[:, None])
            union_mask = jnp.concatenate(
                [
                    jnp.broadcast_to(local_mask, (b, num_blocks, 1, stride, stride)),
                    jnp.swapaxes(key_mask, 1, 2)[:, None, None, :, :] & other_block[None, :, None, None, :],
                ],
                axis=-1,
            )  # [b c 1 r l+c]
            probs = drop(masked_softmax(jnp.concatenate([local_logits_(slice(None)), strided], -1), union_mask))
            out = jnp.einsum("bchqk,bckhd->bcqhd", probs[..., :stride], v) + jnp.einsum(
                "bchrk,bkrhd->bcrhd", probs[..., stride:], v
            )
        else:
            local_heads, strided_heads = slice(0, h // 2), slice(h // 2, h)
            local_probs = drop(masked_softmax(local_logits_(local_heads), local_mask))
            local_out = jnp.einsum("bchqk,bckhd->bcqhd", local_probs, v[..., local_heads, :])
            strided_probs = drop(masked_softmax(strided_logits_(strided_heads), strided_mask))
            strided_out = jnp.einsum("brhqk,bkrhd->bqrhd", strided_probs, v[..., strided_heads, :])
            out = jnp.concatenate([local_out, strided_out], axis=3)
        return out.reshape(b, padded, h, d)[:, :n]

    def mixing_pairs(self, n: int) -> Bool[np.ndarray, "n n"]:
        """j in i's block of l or j = i (mod l), l clamped to n: the union of the local and the strided heads
        (or of the merged head's sets), which the output projection mixes."""
        stride = max(1, min(self.stride, n))
        position = np.arange(n)
        same_block = position[:, None] // stride == position[None, :] // stride
        return same_block | (position[:, None] % stride == position[None, :] % stride)

    def kernel_limits(self, platform: str) -> str | None:
        if self.num_heads == 1:
            return "the merged single-head strided pattern (num_heads=1) is not in the kernels"
        return None

    def _attend_kernel(self, q, k, v, mask, stride: int, num_blocks: int, plan, rngs):
        """Both head groups as segment attention: blocks i // l, and i mod l in a permuted order."""
        n, h = q.shape[1], q.shape[2]
        def attend(q, k, v, mask, segments):
            return block_sparse_attention(q, k, v, Mask(key_mask=mask, query_segments=segments, key_segments=segments),
                                          plan=plan, **self.kernel_dropout(plan, rngs))

        local_heads, strided_heads = slice(0, h // 2), slice(h // 2, h)
        local_out = attend(q[..., local_heads, :], k[..., local_heads, :], v[..., local_heads, :], mask,
                           np.arange(n) // stride)
        # Order positions by (i mod l, i // l): each residue class becomes one contiguous segment.
        padded = num_blocks * stride
        order = np.arange(padded).reshape(num_blocks, stride).T.reshape(-1)  # numpy: a static pattern
        strided = [pad_to(x, padded)[:, order] for x in (q[..., strided_heads, :], k[..., strided_heads, :],
                                                          v[..., strided_heads, :], mask)]
        strided_out = attend(*strided, order % stride)
        strided_out = strided_out[:, np.argsort(order)][:, :n]
        return jnp.concatenate([local_out, strided_out.astype(local_out.dtype)], axis=2)
