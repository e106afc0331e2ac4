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

`strided`, `longformer` and `bigbird` are described in their class docstrings.

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

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float

from lra_jax.attention.core import (
    Attention,
    masked_softmax,
    matmul_flops,
    merge_heads,
    split_heads,
    zero_padding,
)
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError
from lra_jax.kernels import MOSAIC_BLOCK_SPARSE, SPLASH, TRITON
from lra_jax.kernels.block_sparse import block_sparse_attention
from lra_jax.kernels.flash import flash_attention


def _pad_to(x: Array, length: int) -> Array:
    """Pads axis 1 of x with zeros (False for a mask) up to `length`."""
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def _blocks(x: Array, num_blocks: int, block: int) -> Array:
    """[b, num_blocks * block, ...] -> [b, num_blocks, block, ...]."""
    return x.reshape(x.shape[0], num_blocks, block, *x.shape[2:])


def _three_blocks(x: Array, num_blocks: int, block: int) -> Array:
    """[b, num_blocks * block, ...] -> [b, num_blocks, 3 * block, ...]: previous, own and next block.

    One block of padding goes on each side, so the first and last blocks see it as
    their missing neighbour; the caller masks it out. A single block (window >= n)
    has no neighbours and keeps only its own keys: [b, 1, block, ...].
    """
    if num_blocks == 1:
        return x[:, None]
    pad = [(0, 0), (block, block)] + [(0, 0)] * (x.ndim - 2)
    x = _blocks(jnp.pad(x, pad), num_blocks + 2, block)
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)


def band_mask(block: int, window: int, num_keys: int) -> Bool[Array, "q k"]:
    """[B, num_keys] mask: query i of a block may see key j of its neighbourhood iff |i - j| <= window.

    The neighbourhood is [previous, own, next] block (num_keys = 3B) or, for a
    single block, the block itself (num_keys = B).
    """
    query = jnp.arange(block)[:, None] + (num_keys - block) // 2  # position among the keys
    key = jnp.arange(num_keys)[None, :]
    return jnp.abs(query - key) <= window


def local_logits(
    q: Float[Array, "b n h d"], k: Float[Array, "b n h d"], mask: Bool[Array, "b n"], window: int
) -> tuple[Float[Array, "b c h q k"], Bool[Array, "b c 1 q k"], int, int]:
    """Blocked sliding-window logits q.k / sqrt(d) and the keys each query may see.

    Returns:
      The logits [b, c, h, B, 3B] of the c blocks of B queries over their 3B keys
      ([b, 1, h, n, n] when window >= n), the mask of allowed keys (band and real
      keys) [b, c, 1, B, 3B], the block size B and the padded length c * B.
    """
    n = q.shape[1]
    block = max(1, min(window, n))
    num_blocks = -(-n // block)
    padded = num_blocks * block
    q_blocks = _blocks(_pad_to(q, padded), num_blocks, block)  # [b c B h d]
    k_blocks = _three_blocks(_pad_to(k, padded), num_blocks, block)  # [b c 3B h d]
    key_mask = _three_blocks(_pad_to(mask, padded), num_blocks, block)  # [b c 3B]; pads are False
    logits = jnp.einsum("bcqhd,bckhd->bchqk", q_blocks, k_blocks) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    allowed = band_mask(block, window, k_blocks.shape[2]) & key_mask[:, :, None, None, :]
    return logits, allowed, block, padded


def local_weights(
    q: Float[Array, "b n h d"], k: Float[Array, "b n h d"], mask: Bool[Array, "b n"], window: int
) -> tuple[Float[Array, "b c h q k"], int, int]:
    """Blocked sliding-window softmax weights over the real keys, in float32.

    Returns:
      The weights [b, c, h, B, 3B] of the c blocks of B queries over their 3B keys
      ([b, 1, h, n, n] when window >= n), the block size B and the padded length c * B.
    """
    logits, allowed, block, padded = local_logits(q, k, mask, window)
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

    kernel_names = {"triton": TRITON, "mosaic": SPLASH}  # lra_jax.kernels.block_sparse
    kernel_dropout_backends = frozenset({"triton", "mosaic"})
    kernel_dropout_names = {"mosaic": MOSAIC_BLOCK_SPARSE}  # splash has no dropout: our Mosaic kernel trains
    cost_exponent = 1.0  # n * (2w + 1) scores

    @staticmethod
    def band_blocks(n: int, window: int) -> tuple[int, int]:
        """(padded length c B, keys per query block) of `local_logits` at length n: blocks of
        B = min(w, n) queries against 3B keys (B when one block holds everything)."""
        block = max(1, min(window, n))
        num_blocks = -(-n // block)
        return num_blocks * block, (3 if num_blocks > 1 else 1) * block

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Projections, then q.k and p v of every block of B queries over its 3B keys: 2 x 2 (c B) 3B d.
        The XLA path computes whole [B, 3B] blocks, 3B / (2w + 1) ~ 1.5x the band's scores."""
        padded, keys = cls.band_blocks(n, settings["window"])
        return cls.projection_flops(batch, n, dim) + cls.attention_flops(batch * padded, keys, dim)

    def __init__(self, dim: int, num_heads: int, *, window: int = 128, rngs: nnx.Rngs, **common):
        if window < 0:
            raise ConfigError(f"local attention window must be >= 0, got window={window}")
        super().__init__(dim, num_heads, rngs=rngs, **common)
        self.window = window

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        plan = self.kernel_plan(deterministic)
        if plan.uses_pallas:
            return block_sparse_attention(q, k, v, key_mask=mask, window=self.window, impl="pallas",
                                          interpret=plan.interpret, platform=plan.platform,
                                          **self.kernel_dropout(plan, rngs))
        b, n, h, d = v.shape
        probs, block, padded = local_weights(q, k, mask, self.window)
        probs = self.drop(probs, deterministic=deterministic, rngs=rngs)
        v_pad = jnp.pad(v, [(0, 0), (0, padded - n), (0, 0), (0, 0)])
        v_blocks = _three_blocks(v_pad, padded // block, block)  # [b c 3B h d]
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

    Args:
      dim: model width.
      num_heads: number of heads.
      stride: block length and stride l. The default 128 is near sqrt(n) at the
        LRA lengths (1K-16K: sqrt is 32-128), keeping both parts small.
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention` (max_len, dropout_rate, dtype, impl).
    """

    kernel_names = {"triton": TRITON, "mosaic": SPLASH}  # lra_jax.kernels.block_sparse
    kernel_dropout_backends = frozenset({"triton", "mosaic"})
    kernel_dropout_names = {"mosaic": MOSAIC_BLOCK_SPARSE}  # splash has no dropout: our Mosaic kernel trains
    cost_exponent = 1.5  # n * (l + n / l) scores: n^1.5 at the paper's l = sqrt(n)

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
        grid = lambda x: _blocks(_pad_to(x, padded), num_blocks, stride)  # noqa: E731  [b c l ...]
        q, k, v, key_mask = grid(q), grid(k), grid(v), grid(mask)
        scale = jnp.sqrt(d).astype(q.dtype)
        # Local: within block c, query offset q, key offset k.
        local_logits_ = lambda heads: jnp.einsum(  # noqa: E731
            "bcqhd,bckhd->bchqk", q[..., heads, :], k[..., heads, :]) / scale
        local_mask = key_mask[:, :, None, None, :]  # [b c 1 1 l]
        # Strided: at offset r, query block q, key block k.
        strided_logits_ = lambda heads: jnp.einsum(  # noqa: E731
            "bqrhd,bkrhd->brhqk", q[..., heads, :], k[..., heads, :]) / scale
        strided_mask = jnp.swapaxes(key_mask, 1, 2)[:, :, None, None, :]  # [b r 1 1 c]
        drop = lambda p: self.drop(p, deterministic=deterministic, rngs=rngs).astype(v.dtype)  # noqa: E731

        if h == 1:  # merged: one softmax over the union, the query's own block not repeated
            strided = jnp.transpose(strided_logits_(slice(None)), (0, 3, 2, 1, 4))  # [b c h r k]
            other_block = jnp.arange(num_blocks)[:, None] != jnp.arange(num_blocks)[None, :]  # [c k]
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

    def kernel_limits(self, platform: str) -> str | None:
        if self.num_heads == 1:
            return "the merged single-head strided pattern (num_heads=1) is not in the kernels"
        return None

    def _attend_kernel(self, q, k, v, mask, stride: int, num_blocks: int, plan, rngs):
        """Both head groups as segment attention: blocks i // l, and i mod l in a permuted order."""
        n, h = q.shape[1], q.shape[2]
        def attend(q, k, v, mask, segments):
            return block_sparse_attention(q, k, v, key_mask=mask, query_segments=segments,
                                          key_segments=segments, impl="pallas", interpret=plan.interpret,
                                          platform=plan.platform, **self.kernel_dropout(plan, rngs))

        local_heads, strided_heads = slice(0, h // 2), slice(h // 2, h)
        local_out = attend(q[..., local_heads, :], k[..., local_heads, :], v[..., local_heads, :], mask,
                           np.arange(n) // stride)
        # Order positions by (i mod l, i // l): each residue class becomes one contiguous segment.
        padded = num_blocks * stride
        order = np.arange(padded).reshape(num_blocks, stride).T.reshape(-1)  # numpy: a static pattern
        strided = [_pad_to(x, padded)[:, order] for x in (q[..., strided_heads, :], k[..., strided_heads, :],
                                                          v[..., strided_heads, :], mask)]
        strided_out = attend(*strided, order % stride)
        strided_out = strided_out[:, np.argsort(order)][:, :n]
        return jnp.concatenate([local_out, strided_out.astype(local_out.dtype)], axis=2)


@register("longformer")
class LongformerAttention(Attention):
    """Longformer: sliding window plus global tokens with their own projections (Beltagy et al. 2020).

    Sec. 3.1 of "Longformer: The Long-Document Transformer": every token attends to
    a window of radius w and to the k global tokens; the global tokens attend to
    every token. Here the first k positions are global (the encoder prepends a
    CLS token at position 0, so k = 1 makes CLS global; the LRA code had no global
    token at all). Global attention uses separate projections Q_g, K_g, V_g, as in
    the paper:

        i <  k:  out_i = sum_{j real} softmax_j(Q_g x_i . K_g x_j / sqrt(d)) V_g x_j
        i >= k:  out_i = sum_{j in W(i) u G, j real} softmax_j(q_i . k_j / sqrt(d)) v_j,
                 W(i) = {j : |i - j| <= w},  G = {0, .., k - 1},

    one softmax per row, a global key inside the window counted once. Global
    positions that are padding (a sequence shorter than k) are masked like any
    padded key. With k >= n and Q_g, K_g, V_g equal to Q, K, V this is full
    softmax attention.

    Cost: the window as in `local` (n * 3B scores, B = min(w, n)), plus n * k
    scores of every query against the global keys and k * n of the global queries
    against every key: O(n * (w + k)).

    Args:
      dim: model width.
      num_heads: number of heads.
      window: radius w of the sliding window (default 128, as `local`).
      num_global: number k of global tokens, the first k positions (default 1: CLS).
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention` (max_len, dropout_rate, dtype, impl).
    """

    kernel_names = {"triton": TRITON, "mosaic": SPLASH}  # lra_jax.kernels.block_sparse
    kernel_dropout_backends = frozenset({"triton", "mosaic"})
    kernel_dropout_names = {"mosaic": MOSAIC_BLOCK_SPARSE}  # splash has no dropout: our Mosaic kernel trains
    cost_exponent = 1.0  # window band + a fixed number of global tokens

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """`local`'s band with the k global keys added to every block's keys, 2 x 2 (c B) (3B + k) d; with k > 0 also
        the global projections (K_g, V_g of all n tokens, Q_g of the k global ones) and the k global rows
        against all n keys, 2 x 2 k n d."""
        num_global = min(settings["num_global"], n)
        padded, keys = LocalAttention.band_blocks(n, settings["window"])
        flops = cls.projection_flops(batch, n, dim) + cls.attention_flops(batch * padded, keys + num_global, dim)
        if num_global:
            global_projections = 2 * matmul_flops(batch * n, dim, dim) + matmul_flops(batch * num_global, dim, dim)
            flops += global_projections + cls.attention_flops(batch * num_global, n, dim)
        return flops

    def __init__(
        self, dim: int, num_heads: int, *, window: int = 128, num_global: int = 1, rngs: nnx.Rngs, **common
    ):
        if window < 0:
            raise ConfigError(f"longformer window must be >= 0, got window={window}")
        if num_global < 0:
            raise ConfigError(f"longformer num_global must be >= 0, got num_global={num_global}")
        super().__init__(dim, num_heads, rngs=rngs, **common)
        self.window = window
        self.num_global = num_global
        linear = lambda: nnx.Linear(dim, dim, dtype=self.dtype, rngs=rngs)  # noqa: E731
        self.query_global, self.key_global, self.value_global = linear(), linear(), linear()

    def __call__(self, x, mask, *, deterministic: bool, rngs: nnx.Rngs | None = None):
        heads = lambda y: split_heads(y, self.num_heads)  # noqa: E731
        num_global = min(self.num_global, x.shape[1])
        global_qkv = (
            heads(self.query_global(x[:, :num_global])),
            heads(self.key_global(x)),
            heads(self.value_global(x)),
        )
        out = self.attend(
            heads(self.query(x)), heads(self.key(x)), heads(self.value(x)), mask,
            deterministic=deterministic, rngs=rngs, global_qkv=global_qkv,
        )
        return zero_padding(self.out(merge_heads(out.astype(x.dtype))), mask)

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None, global_qkv=None):
        """As `Attention.attend`; `global_qkv` = (Q_g x [b k h d], K_g x, V_g x [b n h d]).

        Without `global_qkv` the global rows use q, k, v (the shared-projection limit).
        """
        b, n, h, d = v.shape
        num_global = min(self.num_global, n)
        q_global, k_global, v_global = global_qkv if global_qkv is not None else (q[:, :num_global], k, v)
        drop = lambda p: self.drop(p, deterministic=deterministic, rngs=rngs).astype(v.dtype)  # noqa: E731
        scale = jnp.sqrt(d).astype(q.dtype)
        plan = self.kernel_plan(deterministic)
        if plan.uses_pallas:
            out = block_sparse_attention(q, k, v, key_mask=mask, window=self.window,
                                         global_keys=np.arange(n) < num_global, impl="pallas",
                                         interpret=plan.interpret, platform=plan.platform,
                                         **self.kernel_dropout(plan, rngs))
            if not num_global:
                return out
            global_out = flash_attention(q_global, k_global, v_global.astype(v.dtype), key_mask=mask,
                                         query_mask=mask[:, :num_global], impl="pallas",
                                         interpret=plan.interpret, platform=plan.platform,
                                         **self.kernel_dropout(plan, rngs))
            return jnp.concatenate([global_out.astype(out.dtype), out[:, num_global:]], axis=1)

        # Every row: its window and the global keys, in one softmax.
        logits, allowed, block, padded = local_logits(q, k, mask, self.window)
        num_blocks = padded // block
        q_blocks = _blocks(_pad_to(q, padded), num_blocks, block)  # [b c B h d]
        v_blocks = _three_blocks(_pad_to(v, padded), num_blocks, block)  # [b c 3B h d] ([b 1 n h d] if w >= n)
        num_window = v_blocks.shape[2]
        if num_global:
            to_global = jnp.einsum("bcqhd,bkhd->bchqk", q_blocks, k[:, :num_global]) / scale  # [b c h B k]
            position = jnp.arange(padded).reshape(num_blocks, block)
            outside = jnp.abs(position[:, :, None] - jnp.arange(num_global)) > self.window  # [c B k]
            global_allowed = outside[None, :, None] & mask[:, None, None, None, :num_global]  # [b c 1 B k]
            logits = jnp.concatenate([logits, to_global], axis=-1)
            allowed = jnp.concatenate([jnp.broadcast_to(allowed, global_allowed.shape[:-1] + (num_window,)),
                                       global_allowed], axis=-1)
        probs = drop(masked_softmax(logits, allowed))
        out = jnp.einsum("bchqk,bckhd->bcqhd", probs[..., :num_window], v_blocks)
        if num_global:
            out += jnp.einsum("bchqk,bkhd->bcqhd", probs[..., num_window:], v[:, :num_global])
        out = out.reshape(b, padded, h, d)[:, :n]
        if not num_global:
            return out

        # Global rows: every real key, with the global projections.
        global_logits = jnp.einsum("bqhd,bkhd->bhqk", q_global, k_global) / scale  # [b h k n]
        global_probs = drop(masked_softmax(global_logits, mask[:, None, None, :]))
        global_out = jnp.einsum("bhqk,bkhd->bqhd", global_probs, v_global.astype(v.dtype))
        return jnp.concatenate([global_out.astype(out.dtype), out[:, num_global:]], axis=1)


class RandomLayout(nnx.Variable):
    """Non-trainable state: BigBird's random key blocks per query block (int32, -1 = none)."""


def random_layout(
    key: Array, num_blocks: int, num_global_blocks: int, num_random_blocks: int
) -> Array:
    """[num_blocks, num_random_blocks] distinct random key blocks per query block, from `key`.

    Each query block c draws, without replacement, among the blocks outside its
    window (|c - c'| > 1) and outside the global blocks; where fewer such blocks
    exist the remaining entries are -1 (no block), so no key is ever counted
    twice. Global query blocks attend to everything and get -1 throughout.
    """
    query = jnp.arange(num_blocks)[:, None]
    candidate = jnp.arange(num_blocks)[None, :]
    excluded = (jnp.abs(query - candidate) <= 1) | (candidate < num_global_blocks) | (query < num_global_blocks)
    scores = jnp.where(excluded, 2.0, jax.random.uniform(key, (num_blocks, num_blocks)))  # excluded sort last
    take = min(num_random_blocks, num_blocks)
    order = jnp.argsort(scores, axis=1)[:, :take].astype(jnp.int32)
    layout = jnp.where(jnp.take_along_axis(excluded, order, axis=1), -1, order)
    return jnp.pad(layout, [(0, 0), (0, num_random_blocks - take)], constant_values=-1)


@register("bigbird")
class BigBirdAttention(Attention):
    """BigBird block-sparse attention, ITC form (Zaheer et al. 2020, "Big Bird", sec. 2 and app. D).

    The (padded) sequence is cut into blocks of B tokens. Query block c attends to

        key blocks {c - 1, c, c + 1}            (window: 3 blocks)
                 u {0, .., g - 1}               (global blocks)
                 u R(c), |R(c)| = r             (random blocks)

    in one softmax over the real keys, each key counted once; the g global query
    blocks attend to every key. The random layout R is drawn once at init from
    the init key (`rngs`), for the ceil(max_len / B) blocks of `max_len`, among
    the blocks outside the window and the globals (fewer than r where too few
    exist), and stored as non-trainable `RandomLayout` state: it is fixed for the
    model's life and saved with it. A call on n < max_len uses the layout of its
    first ceil(n / B) query blocks and masks random key blocks past the padded
    length; those hold only padding, so real outputs do not change when padding
    is appended. With g >= the number of blocks this is full softmax attention.

    Cost: n * (3 + g + r) * B scores for the other blocks, plus g * B * n for the
    global blocks: O(n * B * (3 + g + r)).

    Block size: B = min(block, max_len), fixed at init so that the layout is
    defined in the same blocks at every call. For max_len <= block there is a
    single block, which is global when g >= 1: full attention, as a short input
    should get. (Clamping B to each call's n instead would change the blocks,
    and the layout's meaning, with the amount of padding.)

    Args:
      dim: model width.
      num_heads: number of heads.
      block: block size B (default 64, as the paper's ITC runs).
      num_global_blocks: g, the first g blocks are global (default 1, which holds CLS).
      num_random_blocks: r random key blocks per query block (default 3, as the paper).
      rngs: parameter initialisation keys; also draw the random layout.
      **common: shared settings of `Attention`; max_len is required.
    """

    kernel_names = {"triton": TRITON, "mosaic": SPLASH}  # lra_jax.kernels.block_sparse
    kernel_dropout_backends = frozenset({"triton", "mosaic"})
    kernel_dropout_names = {"mosaic": MOSAIC_BLOCK_SPARSE}  # splash has no dropout: our Mosaic kernel trains
    cost_exponent = 1.0  # a fixed number of key blocks per query block

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Over the c blocks of B (padded length c B): the g global query blocks against all c B keys, the other
        c - g blocks against 3B window, g B global and r B random keys, 2 x 2 (c - g) B (3B + g B + r B) d.
        Window keys are counted where a window block is global too, as the XLA path scores (and masks) them."""
        block = max(1, min(settings["block"], settings["max_len"]))
        num_blocks = -(-n // block)
        global_rows = min(settings["num_global_blocks"], num_blocks) * block
        padded = num_blocks * block
        flops = cls.projection_flops(batch, n, dim) + cls.attention_flops(batch * global_rows, padded, dim)
        if global_rows < padded:
            window = (3 if num_blocks > 1 else 1) * block
            keys = window + global_rows + settings["num_random_blocks"] * block
            flops += cls.attention_flops(batch * (padded - global_rows), keys, dim)
        return flops

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        block: int = 64,
        num_global_blocks: int = 1,
        num_random_blocks: int = 3,
        rngs: nnx.Rngs,
        **common,
    ):
        if block < 1:
            raise ConfigError(f"bigbird block must be >= 1, got block={block}")
        if num_global_blocks < 0 or num_random_blocks < 0:
            raise ConfigError(
                f"bigbird num_global_blocks and num_random_blocks must be >= 0, got "
                f"{num_global_blocks} and {num_random_blocks}"
            )
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if self.max_len is None:
            raise ConfigError(
                "bigbird draws its random block layout for a fixed longest sequence: pass max_len "
                "(the encoder passes the task's max_len)"
            )
        self.block = max(1, min(block, self.max_len))
        self.num_global_blocks = num_global_blocks
        self.num_random_blocks = num_random_blocks
        num_blocks = -(-self.max_len // self.block)
        self.random_blocks = RandomLayout(
            random_layout(rngs.params(), num_blocks, num_global_blocks, num_random_blocks)
        )

    def kernel_limits(self, platform: str) -> str | None:
        if platform != "tpu" and (self.block < 16 or self.block & (self.block - 1)):
            return f"the Triton kernel needs a power-of-two block >= 16, got block={self.block}"
        if platform == "tpu" and self.dropout_rate > 0 and 128 % self.block and self.block % 128:
            return f"the TPU dropout kernel needs a block dividing 128 or a multiple of it, got block={self.block}"
        return None

    def block_mask(self, num_blocks: int) -> Bool[Array, "c c"]:
        """[C, C] key blocks of each query block: all for global rows, else window, global and random."""
        block_ids = jnp.arange(num_blocks)
        num_global = min(self.num_global_blocks, num_blocks)
        chosen = self.random_blocks[...][:num_blocks]  # [C r]
        random = ((chosen[:, :, None] == block_ids) & (chosen[:, :, None] >= 0)).any(1)
        near = jnp.abs(block_ids[:, None] - block_ids[None, :]) <= 1
        return near | random | (block_ids[None, :] < num_global) | (block_ids[:, None] < num_global)

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        b, n, h, d = v.shape
        block = self.block
        layout = self.random_blocks[...]
        num_blocks = -(-n // block)
        if num_blocks > layout.shape[0]:
            raise ConfigError(
                f"bigbird got a sequence of {n} tokens but was built for max_len={self.max_len}; "
                "build it with a larger max_len"
            )
        padded = num_blocks * block
        num_global = min(self.num_global_blocks, num_blocks)
        plan = self.kernel_plan(deterministic)
        if plan.uses_pallas:
            return block_sparse_attention(q, k, v, key_mask=mask, block_mask=self.block_mask(num_blocks),
                                          block=block, impl="pallas", interpret=plan.interpret,
                                          platform=plan.platform, **self.kernel_dropout(plan, rngs))
        q, k, v, mask = (_pad_to(x, padded) for x in (q, k, v, mask))
        drop = lambda p: self.drop(p, deterministic=deterministic, rngs=rngs).astype(v.dtype)  # noqa: E731
        scale = jnp.sqrt(d).astype(q.dtype)

        # Global query blocks: every real key.
        global_rows = num_global * block
        logits = jnp.einsum("bqhd,bkhd->bhqk", q[:, :global_rows], k) / scale
        probs = drop(masked_softmax(logits, mask[:, None, None, :]))
        global_out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        if num_global == num_blocks:
            return global_out[:, :n]

        # The other query blocks c = g .. C - 1: window, global and random key blocks.
        rows = jnp.arange(num_global, num_blocks)
        q_blocks = _blocks(q, num_blocks, block)[:, num_global:]  # [b c B h d]
        offsets = jnp.array([-1, 0, 1] if num_blocks > 1 else [0])  # as _three_blocks
        window_block = rows[:, None] + offsets  # [c w]; blocks off the ends come back as masked padding
        window_mask = _three_blocks(mask, num_blocks, block)[:, num_global:] & jnp.repeat(
            window_block >= num_global, block, axis=1  # a global neighbour is counted with the globals
        )
        chosen = layout[num_global:num_blocks]  # [c r]
        chosen_ok = (chosen >= 0) & (chosen < num_blocks)  # blocks past this call's length: none
        chosen = jnp.clip(chosen, 0, num_blocks - 1)
        gather = lambda x: _blocks(x, num_blocks, block)[:, chosen].reshape(  # noqa: E731
            b, num_blocks - num_global, chosen.shape[1] * block, *x.shape[2:])  # [b c rB ...]
        random_mask = gather(mask) & jnp.repeat(chosen_ok, block, axis=1)
        window_k, window_v = (_three_blocks(x, num_blocks, block)[:, num_global:] for x in (k, v))  # [b c wB h d]
        random_k, random_v = gather(k), gather(v)  # [b c rB h d]
        global_k, global_v = k[:, :global_rows], v[:, :global_rows]  # [b gB h d], the same for every block
        logits = jnp.concatenate(
            [
                jnp.einsum("bcqhd,bckhd->bchqk", q_blocks, window_k),
                jnp.einsum("bcqhd,bkhd->bchqk", q_blocks, global_k),
                jnp.einsum("bcqhd,bckhd->bchqk", q_blocks, random_k),
            ],
            axis=-1,
        ) / scale
        global_mask = jnp.broadcast_to(mask[:, None, :global_rows], (b, num_blocks - num_global, global_rows))
        key_mask = jnp.concatenate([window_mask, global_mask, random_mask], axis=-1)
        probs = drop(masked_softmax(logits, key_mask[:, :, None, None, :]))
        split = (window_k.shape[2], window_k.shape[2] + global_rows)
        out = (
            jnp.einsum("bchqk,bckhd->bcqhd", probs[..., : split[0]], window_v)
            + jnp.einsum("bchqk,bkhd->bcqhd", probs[..., split[0] : split[1]], global_v)
            + jnp.einsum("bchqk,bckhd->bcqhd", probs[..., split[1] :], random_v)
        )
        out = out.reshape(b, padded - global_rows, h, d)
        return jnp.concatenate([global_out, out], axis=1)[:, :n]
