"""Low-rank attention: Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity").

Eq. 7 of the paper projects keys and values along the sequence axis down to k
rows with learned matrices E, F (n x k here, applied as E^T K, F^T V):

    head = softmax(Q (E^T K)^T / sqrt(d)) (F^T V),

costing O(n * k) time and memory. E and F are shared across heads (the paper's
"headwise sharing"); `share_kv=True` also ties F = E ("key-value sharing").

Padding: keys and values are zeroed at padded positions *before* the
projection, so padded content contributes nothing, and appended padding only
meets further rows of E and F with zeros: real outputs are unchanged by either.
What cannot hold is independence of the length itself beyond `max_len`: E and F
have one row per position, so the layer is built for sequences of at most
`max_len` tokens (a shorter input uses the first n rows). The original LRA
Linformer ignored the padding mask altogether, so padded tokens were mixed into
every projected key and value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lra_jax.attention.core import Attention, zero_padding
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError


@register("linformer")
class LinformerAttention(Attention):
    """Linformer attention: keys and values projected along the length to `k` rows.

    Args:
      dim: model width.
      num_heads: number of heads.
      k: projected length (the paper's k; 256 is its main setting and the LRA one).
      share_kv: use one projection for keys and values (F = E).
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention`; `max_len` is required (rows of E, F).

    Raises:
      ConfigError: if max_len is not given, or k < 1.
    """

    def __init__(
        self, dim: int, num_heads: int, *, k: int = 256, share_kv: bool = False, rngs: nnx.Rngs, **common
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if self.max_len is None:
            raise ConfigError(
                "linformer projects along the sequence axis and needs the longest length: "
                "pass max_len (the model sets it from the task's max_len)"
            )
        if k < 1:
            raise ConfigError(f"linformer projected length must be >= 1, got k={k}")
        self.k = k
        self.share_kv = share_kv
        # LeCun normal over the length axis: each projected row sums max_len positions.
        init = nnx.initializers.normal(stddev=self.max_len**-0.5)
        self.e = nnx.Param(init(rngs.params(), (self.max_len, k)))
        self.f = None if share_kv else nnx.Param(init(rngs.params(), (self.max_len, k)))

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        n = q.shape[1]
        if n > self.max_len:
            raise ConfigError(
                f"linformer was built for sequences of at most max_len={self.max_len} tokens "
                f"but got {n}; build it with a larger max_len"
            )
        e = self.e[...][:n].astype(k.dtype)
        f = e if self.f is None else self.f[...][:n].astype(v.dtype)
        k_proj = jnp.einsum("np,bnhd->bphd", e, zero_padding(k, mask))
        v_proj = jnp.einsum("np,bnhd->bphd", f, zero_padding(v, mask))
        logits = jnp.einsum("bnhd,bphd->bhnp", q, k_proj) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)  # every projected key is real
        probs = self.drop(probs, deterministic=deterministic, rngs=rngs)
        return jnp.einsum("bhnp,bphd->bnhd", probs.astype(v.dtype), v_proj)
