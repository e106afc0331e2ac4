"""Synthesizer attention (Tay et al. 2021, "Synthesizer: Rethinking Self-Attention
for Transformer Models", eq. 1-5): attention weights synthesised without token-token
dot products.

Per head, with G(X) = X W_v the values and logits B [n, n]:

    dense (eq. 1-2):              B_i = W2 relu(W1 x_i + b1) + b2,  W2 producing max_len logits,
    random (eq. 4):               B = R,  R [max_len, max_len] learned (or fixed),
    factorized random (eq. 5):    B = R1 R2^T,  R1, R2 [max_len, k],
    mixture (Sec. 3.3):           B + mix * Q K^T / sqrt(d),

    Y = softmax(B over the real keys) G(X),  then the output projection W^O.

Each mode uses the first n rows/columns of its max_len-sized logits. Cost: O(n^2 d)
time and O(n^2) memory for dense (O(n d max_len) parameters via W2 [d, max_len]),
O(n^2) for random (O(max_len^2) parameters per head), O(n^2 k) time for factorized
(O(max_len k) parameters per head). The mixture adds the dot-product term's O(n^2 d).

Kernels (impl="pallas", or "auto" on a GPU or TPU): the dense and factorized logits are dot
products too, B_ij = a_i . c_j with

    dense:       a_i = [relu(W1 x_i + b1), 1],  c_j = [W2[:, j], b2[j]]
    factorized:  a_i = R1[i],                   c_j = R2[j]
    mixture:     append sqrt(mix) q_i / d^(1/4) to a_i and sqrt(mix) k_j / d^(1/4) to c_j

so the layer is softmax attention over queries a, keys c and values G(X) at scale 1, and runs
softmax's flash kernels (Triton on GPU; splash, or our Mosaic kernel with attention dropout, on TPU)
with the same dropout mask, in O(n) memory. The random mode's R is no product: it runs XLA.

Padding: the synthetic logits of padded key columns get the mask value in every
mode, so padded values get zero weight; dense logits of a real query depend only on
that query's own token; appended padding only adds masked columns. Real outputs are
therefore invariant to padded content and appended padding; lengths are limited to
`max_len` (one logit column per position).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from lra_jax.attention.core import (
    Attention,
    TokenMask,
    Tokens,
    matmul_flops,
    merge_heads,
    split_heads,
    zero_padding,
)
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError
from lra_jax.kernels.flash.api import FLASH, flash_attention
from lra_jax.kernels.masking import Mask
from lra_jax.kernels.operands import padded_head_dim

MODES = ("dense", "random", "factorized_random")


def every_example(per_head: Float[Array, "h n e"], batch: int) -> Float[Array, "b n h e"]:
    """Per-head rows shared by every example, laid out as queries or keys [batch, n, h, e]."""
    h, n, e = per_head.shape
    return jnp.broadcast_to(jnp.swapaxes(per_head, 0, 1)[None], (batch, n, h, e))


class FixedRandom(nnx.Variable):
    """A non-trainable random synthetic matrix (`random_trainable=False`): state, not a Param."""


@register("synthesizer")
class SynthesizerAttention(Attention):
    """Synthesizer attention in one of the paper's modes, optionally mixed with dot-product logits.

    Args:
      dim: model width.
      num_heads: number of heads.
      mode: "dense" (logits from each token alone), "random" (a learned per-head
        [max_len, max_len] matrix) or "factorized_random" (R1 R2^T of rank `factor`).
      mix: weight of dot-product logits q.k/sqrt(d) added to the synthetic ones
        (the paper's mixture with the synthetic weight fixed to 1, its scale being
        learned anyway). 0 is the pure synthesizer, which then has no query/key
        projections; mix=1 with zero synthetic logits is exactly softmax attention.
      random_trainable: whether the random matrices (random modes) are trained
        (the paper's "R" vs fixed "Fixed Random").
      factor: rank k of the factorized random mode.
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention`; `max_len` is required.

    Raises:
      ConfigError: on an unknown mode, mix < 0, factor < 1 or a missing max_len.
    """

    kernel_op = FLASH  # Triton on GPU; on TPU splash, or our Mosaic kernel where dropout is on
    supports_causal = True  # causal=True masks keys j > i, as the paper does for language modelling
    kernel_serves_causal = True  # a causal Mask in the flash kernels

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Value and output projections and the weighted values (2 n n d), plus the mode's logits: dense W1 x
        (2 n d d) and W2 relu(.) ([n, d_h] x [d_h, n] per head, 2 n n d); factorized R1 R2^T (2 h n n k, once
        for the batch); random none; with mix > 0 the q, k projections and q.k (4 n d d + 2 n n d)."""
        flops = 2 * matmul_flops(batch * n, dim, dim) + matmul_flops(batch * n, n, dim)
        if settings["mode"] == "dense":
            flops += matmul_flops(batch * n, dim, dim) + matmul_flops(batch * n, dim, n)
        elif settings["mode"] == "factorized_random":
            flops += matmul_flops(num_heads * n, settings["factor"], n)
        if settings["mix"]:
            flops += 2 * matmul_flops(batch * n, dim, dim) + matmul_flops(batch * n, dim, n)
        return flops

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mode: str = "dense",
        mix: float = 0.0,
        random_trainable: bool = True,
        factor: int = 8,
        rngs: nnx.Rngs,
        **common,
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if mode not in MODES:
            raise ConfigError(f"unknown synthesizer mode {mode!r}; choose one of {', '.join(MODES)}")
        if self.max_len is None:
            raise ConfigError(
                "synthesizer produces one logit per key position and needs the longest length: "
                "pass max_len (the model sets it from the task's max_len)"
            )
        if mix < 0:
            raise ConfigError(f"synthesizer mix must be >= 0, got {mix}")
        if factor < 1:
            raise ConfigError(f"synthesizer factor must be >= 1, got {factor}")
        self.mode, self.mix, self.factor, self.random_trainable = mode, float(mix), factor, random_trainable
        h, d, m = num_heads, self.head_dim, self.max_len
        if mix == 0:  # pure synthesizer: no token-token dot products, so no query/key projections
            self.query = self.key = None
        kind = nnx.Param if random_trainable else FixedRandom
        dense, random = mode == "dense", mode == "random"
        factorized = mode == "factorized_random"
        std = factor**-0.25  # entries of R1 R2^T then have unit variance
        # W1, b1 (per-head blocks of d), W2 [h, d, max_len], b2 [h, max_len]; None outside their mode.
        self.dense_in = nnx.Linear(dim, dim, dtype=self.dtype, rngs=rngs) if dense else None
        self.dense_out = nnx.Param(nnx.initializers.normal(stddev=d**-0.5)(rngs.params(), (h, d, m))) if dense else None
        self.dense_bias = nnx.Param(jnp.zeros((h, m))) if dense else None
        self.random = kind(jax.random.normal(rngs.params(), (h, m, m))) if random else None
        self.factor_a = kind(std * jax.random.normal(rngs.params(), (h, m, factor))) if factorized else None
        self.factor_b = kind(std * jax.random.normal(rngs.params(), (h, m, factor))) if factorized else None

    def kernel_limits(self, platform: str) -> str | None:
        if self.mode == "random":
            return "the random synthesizer's logits are a learned n x n matrix, not a product a kernel forms"
        return None

    def check_length(self, n: int) -> None:
        if n > self.max_len:
            raise ConfigError(
                f"synthesizer was built for sequences of at most max_len={self.max_len} tokens "
                f"but got {n}; build it with a larger max_len"
            )

    def dense_hidden(self, x: Float[Array, "b n d"]) -> Float[Array, "b n h dh"]:
        """relu(W1 x_i + b1) per head: the dense mode's hidden layer (eq. 1)."""
        return jax.nn.relu(split_heads(self.dense_in(x), self.num_heads))

    def synthetic_logits(self, x: Float[Array, "b n d"]) -> Float[Array, "b h n n"] | Float[Array, "h n n"]:
        """The mode's logits for a length-n input (before masking); [h n n] in the random modes."""
        n = x.shape[1]
        self.check_length(n)
        if self.mode == "dense":
            hidden = self.dense_hidden(x)
            w2 = self.dense_out[...][:, :, :n].astype(x.dtype)
            return jnp.einsum("bnhd,hdm->bhnm", hidden, w2) + self.dense_bias[...][None, :, None, :n].astype(x.dtype)
        if self.mode == "random":
            return self.random[...][:, :n, :n].astype(x.dtype)
        a = self.factor_a[...][:, :n].astype(x.dtype)
        b = self.factor_b[...][:, :n].astype(x.dtype)
        return jnp.einsum("hnk,hmk->hnm", a, b)

    def logit_factors(self, x: Float[Array, "b n d"]) -> tuple[Float[Array, "b n h e"], Float[Array, "b n h e"]]:
        """(a, c) with a_i . c_j the logit of query i and key j (the mixture's dot products included), per
        head: the queries and keys of the kernel path (dense and factorized modes; module docstring)."""
        b, n, _ = x.shape
        self.check_length(n)
        if self.mode == "dense":
            hidden = self.dense_hidden(x)
            a = jnp.concatenate([hidden, jnp.ones((*hidden.shape[:-1], 1), x.dtype)], axis=-1)
            columns = jnp.concatenate([self.dense_out[...][:, :, :n], self.dense_bias[...][:, None, :n]], axis=1)
            c = every_example(jnp.swapaxes(columns, 1, 2).astype(x.dtype), b)  # W2[:, j], b2[j]
        else:
            a = every_example(self.factor_a[...][:, :n].astype(x.dtype), b)
            c = every_example(self.factor_b[...][:, :n].astype(x.dtype), b)
        if self.mix:
            root = (self.mix / self.head_dim**0.5) ** 0.5  # root^2 q.k = mix q.k / sqrt(d)
            a = jnp.concatenate([a, root * split_heads(self.query(x), self.num_heads)], axis=-1)
            c = jnp.concatenate([c, root * split_heads(self.key(x), self.num_heads)], axis=-1)
        return a, c

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        v = split_heads(self.value(x), self.num_heads)
        plan = self.kernel_plan(deterministic)
        if plan.uses_pallas:
            a, c = self.logit_factors(x)
            width = padded_head_dim(max(a.shape[-1], v.shape[-1]))  # zero columns change no product
            pad = lambda t: jnp.pad(t, [(0, 0)] * 3 + [(0, width - t.shape[-1])])  # noqa: E731
            out = flash_attention(pad(a), pad(c), pad(v), Mask(key_mask=mask, causal=self.causal), scale=1.0, plan=plan,
                                  **self.kernel_dropout(plan, rngs))[..., : self.head_dim]
        else:
            logits = self.synthetic_logits(x).astype(jnp.float32)
            if self.mix:
                q = split_heads(self.query(x), self.num_heads)
                k = split_heads(self.key(x), self.num_heads)
                dots = jnp.einsum("bnhd,bmhd->bhnm", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
                logits = logits + self.mix * dots.astype(jnp.float32)
            logits = jnp.broadcast_to(logits, (x.shape[0], *logits.shape[-3:]))
            out = self.weighted_values(logits, v, mask, deterministic=deterministic, rngs=rngs)
        return zero_padding(self.out(merge_heads(out.astype(x.dtype))), mask)
