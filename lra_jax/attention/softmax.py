"""Full softmax attention (Vaswani et al. 2017, eq. 1): the reference for every variant.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d)) V,  padded keys masked out.

O(n^2) time and memory in the sequence length n with impl="xla", where the softmax, the
attention dropout and the product with V run through `weighted_values.softmax_values`
(a hand-written backward: two n x n arrays each way instead of autodiff's six). With
impl="pallas" (or "auto" on a GPU or TPU) `attend` runs a FlashAttention kernel
of `lra_jax.kernels.flash` (Dao et al. 2022; Triton on GPU, on TPU jax's splash
attention, or our Mosaic kernel where dropout is on): the same function in O(n) memory,
dropping the same weights.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float

from lra_jax.attention.core import Attention, masked_softmax
from lra_jax.attention.registry import register
from lra_jax.kernels.flash.api import FLASH, flash_attention
from lra_jax.kernels.masking import Mask


def attention_weights(
    q: Float[Array, "b q h d"], k: Float[Array, "b k h d"], key_mask: Bool[Array, "b k"]
) -> Float[Array, "b h q k"]:
    """softmax(q k^T / sqrt(d)) over the real keys, in float32."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    return masked_softmax(logits, key_mask[:, None, None, :])


def softmax_attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    key_mask: Bool[Array, "b k"],
) -> Float[Array, "b q h d"]:
    """Full attention of every query over the real keys (no dropout): the test reference."""
    return jnp.einsum("bhqk,bkhd->bqhd", attention_weights(q, k, key_mask).astype(v.dtype), v)


@register("softmax")
class SoftmaxAttention(Attention):
    """Full scaled dot-product attention over all real tokens; impl="pallas" runs the flash kernel."""

    kernel_op = FLASH  # Triton on GPU; on TPU splash, or our Mosaic kernel where dropout is on
    supports_causal = True  # causal=True masks keys j > i
    kernel_serves_causal = True  # a causal Mask: the kernels visit only the key blocks up to the diagonal
    # cost_exponent 2 (the default): q k^T and p v are [n, d] x [d, n] and [n, n] x [n, d] per example.

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        return cls.projection_flops(batch, n, dim) + 2 * 2.0 * batch * n * n * dim

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        plan = self.kernel_plan(deterministic)
        if plan.uses_pallas:
            return flash_attention(q, k, v, Mask(key_mask=mask, causal=self.causal), plan=plan,
                                   **self.kernel_dropout(plan, rngs))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        return self.weighted_values(logits, v, mask, deterministic=deterministic, rngs=rngs)
