"""Sparse attention with global tokens: Longformer and BigBird (the sparse family, with `sparse.py`).

Both add to a sliding window (`sparse.LocalAttention`'s blocks, helpers from `sparse.py`) tokens
that see, and are seen by, every token; BigBird also adds random key blocks per query block.
Kernels: as the other sparse variants, the block-sparse kernel of `lra_jax.kernels.block_sparse`
(Longformer's global query rows, with their own projections, run the flash kernel); see the
module docstring of `sparse.py` and the class docstrings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool

from lra_jax.attention.core import Attention, masked_softmax, matmul_flops, merge_heads, split_heads, zero_padding
from lra_jax.attention.registry import register
from lra_jax.attention.sparse.windows import LocalAttention, local_logits, pad_to, split_blocks, three_blocks
from lra_jax.errors import ConfigError
from lra_jax.kernels.block_sparse.api import BLOCK_SPARSE, block_sparse_attention
from lra_jax.kernels.flash.api import FLASH, flash_attention
from lra_jax.kernels.masking import Mask


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

    kernel_op = BLOCK_SPARSE  # Triton on GPU; on TPU splash, or our Mosaic kernel where dropout is on
    cost_exponent = 1.0  # window band + a fixed number of global tokens

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """`local`'s band with the k global keys added to every block's keys, 2 x 2 (c B) (3B + k) d; with k > 0 also
        the global projections (K_g, V_g of all n tokens, Q_g of the k global ones) and the k global rows
        against all n keys, 2 x 2 k n d."""
        num_global = min(settings["num_global"], n)
        padded, keys = LocalAttention.bandsplit_blocks(n, settings["window"])
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

    def mixing_pairs(self, n: int) -> Bool[np.ndarray, "n n"]:
        """|i - j| <= w, or i or j among the first k positions (global)."""
        position = np.arange(n)
        window = np.abs(position[:, None] - position[None, :]) <= self.window
        return window | (position[:, None] < self.num_global) | (position[None, :] < self.num_global)

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
            out = block_sparse_attention(q, k, v, Mask(key_mask=mask, window=self.window,
                                                       global_keys=np.arange(n) < num_global),
                                         plan=plan, **self.kernel_dropout(plan, rngs))
            if not num_global:
                return out
            global_out = flash_attention(q_global, k_global, v_global.astype(v.dtype),
                                         Mask(key_mask=mask, query_mask=mask[:, :num_global]),
                                         plan=self.kernel_plan(deterministic, FLASH),
                                         **self.kernel_dropout(plan, rngs))
            return jnp.concatenate([global_out.astype(out.dtype), out[:, num_global:]], axis=1)

        # Every row: its window and the global keys, in one softmax.
        logits, allowed, block, padded = local_logits(q, k, mask, self.window)
        num_blocks = padded // block
        q_blocks = split_blocks(pad_to(q, padded), num_blocks, block)  # [b c B h d]
        v_blocks = three_blocks(pad_to(v, padded), num_blocks, block)  # [b c 3B h d] ([b 1 n h d] if w >= n)
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

    kernel_op = BLOCK_SPARSE  # Triton on GPU; on TPU splash, or our Mosaic kernel where dropout is on
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

    def mixing_pairs(self, n: int) -> Bool[np.ndarray, "n n"]:
        """`block_mask` (window, global and random blocks) at the positions of its blocks."""
        position = np.arange(n) // self.block
        blocks = np.asarray(self.block_mask(-(-n // self.block)))
        return blocks[position[:, None], position[None, :]]

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
            return block_sparse_attention(q, k, v, Mask(key_mask=mask, block_mask=self.block_mask(num_blocks),
                                                        block=block), plan=plan, **self.kernel_dropout(plan, rngs))
        q, k, v, mask = (pad_to(x, padded) for x in (q, k, v, mask))
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
        q_blocks = split_blocks(q, num_blocks, block)[:, num_global:]  # [b c B h d]
        offsets = jnp.array([-1, 0, 1] if num_blocks > 1 else [0])  # as three_blocks
        window_block = rows[:, None] + offsets  # [c w]; blocks off the ends come back as masked padding
        window_mask = three_blocks(mask, num_blocks, block)[:, num_global:] & jnp.repeat(
            window_block >= num_global, block, axis=1  # a global neighbour is counted with the globals
        )
        chosen = layout[num_global:num_blocks]  # [c r]
        chosen_ok = (chosen >= 0) & (chosen < num_blocks)  # blocks past this call's length: none
        chosen = jnp.clip(chosen, 0, num_blocks - 1)
        gather = lambda x: split_blocks(x, num_blocks, block)[:, chosen].reshape(  # noqa: E731
            b, num_blocks - num_global, chosen.shape[1] * block, *x.shape[2:])  # [b c rB ...]
        random_mask = gather(mask) & jnp.repeat(chosen_ok, block, axis=1)
        window_k, window_v = (three_blocks(x, num_blocks, block)[:, num_global:] for x in (k, v))  # [b c wB h d]
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
