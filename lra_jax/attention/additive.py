"""Additive (Bahdanau) and general bilinear (Luong) attention over the shared projections.

Bahdanau attention (Bahdanau et al. 2015, "Neural Machine Translation by Jointly
Learning to Align and Translate", eq. 6; the "concat" score of Luong et al.), per head:

    e_ij = v^T tanh(q_i + k_j),   q = W_q x, k = W_k x, v in R^d per head,
    out_i = sum_j softmax_j(e_ij) v_j   over the real keys j.

The tanh tensor is [n, n, d] per head; it is never built for the whole sequence:
queries go through in chunks of `query_chunk` (a `lax.map`, each chunk recomputed
in the backward pass), so it costs O(n^2 d) time but at most O(chunk n d) memory
for it, beside the O(n^2) logits every full-attention variant holds.

Luong "general" attention (Luong et al. 2015, "Effective Approaches to
Attention-based Neural Machine Translation", eq. 8, general score), per head:

    e_ij = q_i^T W_a k_j / sqrt(d),   W_a [d, d] per head,

O(n^2 d + n d^2) time. Scaled by 1/sqrt(d) like dot-product attention (the paper
has no scale; it keeps logits of order one as d grows). It is softmax attention
over the keys W_a k_j, so it runs the same flash kernels (O(n) memory, dropout
inside the kernel) where softmax does, and XLA's O(n^2) form elsewhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from lra_jax import kernels
from lra_jax.attention.core import Attention, matmul_flops
from lra_jax.attention.registry import register
from lra_jax.attention.softmax import SoftmaxAttention
from lra_jax.errors import ConfigError


def additive_logits(
    q: Float[Array, "b n h d"], k: Float[Array, "b m h d"], v: Float[Array, "h d"], chunk: int
) -> Float[Array, "b h n m"]:
    """e_ij = v_h^T tanh(q_i + k_j), computed `chunk` queries at a time.

    The queries are zero-padded up to a multiple of `chunk`; the padded rows'
    logits are dropped. Per chunk the tanh tensor is laid out [b, h, chunk, d, m]:
    the keys are the minor axis, so the tanh is vectorised over keys and the sum
    over d accumulates whole rows; XLA fuses it with the tanh, so the tensor is not
    written to memory (forward, and its recomputation in the backward pass).
    Measured on one CPU core, grad of one layer's logits: at b=8, n=2048, h=4,
    d=64 this layout with chunk 1 takes 26 s, against 45 s for a stored
    [b, chunk, m, h, d] tensor contracted by an einsum (chunk 8) and 71 s for a
    d-minor fused sum (chunk 8); at b=16, n=1024, h=2, d=16, 1.1 s against 3.9 s
    and 1.8 s. Larger chunks were slower on CPU at every size tried.
    """
    b, n, h, d = q.shape
    chunk = max(1, min(chunk, n))
    num_chunks = -(-n // chunk)
    q = jnp.pad(q, ((0, 0), (0, num_chunks * chunk - n), (0, 0), (0, 0)))
    q_chunks = q.reshape(b, num_chunks, chunk, h, d).transpose(1, 0, 3, 2, 4)  # [c b h q d]
    k_by_dim = k.transpose(0, 2, 3, 1)[:, :, None]  # [b h 1 d m]
    v_by_dim = v[:, None, :, None]  # [h 1 d 1]

    @jax.checkpoint
    def scores(q_chunk: Float[Array, "b h q d"]) -> Float[Array, "b h q m"]:
        hidden = jnp.tanh(q_chunk[..., None] + k_by_dim)  # [b h q d m], fused into the sum
        return jnp.sum(hidden * v_by_dim, axis=-2, dtype=jnp.float32).astype(q_chunk.dtype)

    logits = jax.lax.map(scores, q_chunks)  # [c b h q m]
    logits = logits.transpose(1, 2, 0, 3, 4).reshape(b, h, num_chunks * chunk, k.shape[1])
    return logits[:, :, :n]


def default_query_chunk() -> int:
    """1 on CPU (fastest there, see additive_logits); 64 on GPU/TPU, where one query per
    sequential step would leave the device idle (not measured here: no accelerator). The platform
    is the one the layer is built for (`kernels.current_target`: jax's, or the target a deviceless
    compile names), not necessarily the one this process runs on."""
    return 1 if kernels.current_target().platform == "cpu" else 64


@register("additive")
class AdditiveAttention(Attention):
    """Bahdanau (additive, "concat") attention: v^T tanh(q_i + k_j) per head.

    Padded keys are masked out of the softmax; outputs at padded queries are zeroed
    by `Attention`, so neither padded content nor appended padding reaches a real output.

    Args:
      dim: model width.
      num_heads: number of heads.
      query_chunk: queries per chunk of the tanh tensor (clamped to n); memory of
        that tensor is O(query_chunk * n * d). None: default_query_chunk() for the
        backend the layer is built on.
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention`.

    Raises:
      ConfigError: if query_chunk < 1.
    """

    supports_causal = True  # causal=True masks keys j > i in the softmax

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Projections, the score vector's dot product with tanh(q_i + k_j) for every pair (2 n n d; the add and the
        tanh are elementwise, not counted; queries padded to whole chunks) and the weighted values (2 n n d)."""
        chunk = max(1, min(settings["query_chunk"], n))
        padded_queries = -(-n // chunk) * chunk
        return (cls.projection_flops(batch, n, dim) + matmul_flops(batch * padded_queries, dim, n)
                + matmul_flops(batch * n, n, dim))

    def __init__(self, dim: int, num_heads: int, *, query_chunk: int | None = None, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if query_chunk is not None and query_chunk < 1:
            raise ConfigError(f"additive attention needs query_chunk >= 1, got {query_chunk}")
        self.query_chunk = query_chunk or default_query_chunk()
        init = nnx.initializers.normal(stddev=self.head_dim**-0.5)
        self.score_vector = nnx.Param(init(rngs.params(), (num_heads, self.head_dim)))

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        logits = additive_logits(q, k, self.score_vector[...].astype(q.dtype),
                                 self.query_chunk)
        return self.weighted_values(logits, v, mask, deterministic=deterministic, rngs=rngs)


@register("luong")
class LuongAttention(SoftmaxAttention):
    """Luong "general" attention: q_i^T W_a k_j / sqrt(d) with a learned W_a per head, softmax
    attention over the keys W_a k_j (its kernels included).

    W_a starts at the identity, so at initialisation the layer equals softmax
    attention built from the same seed (the projections are created first, from
    the same keys); training moves it away. Padded keys are masked out.

    Args:
      dim: model width.
      num_heads: number of heads.
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention`.
    """

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Softmax attention's (projections, 2 x 2 n n d) and W_a k_j per head ([n, d_h] x [d_h, d_h]: 2 n d d_h)."""
        return (cls.projection_flops(batch, n, dim) + matmul_flops(batch * n, dim // num_heads, dim)
                + cls.attention_flops(batch * n, n, dim))

    def __init__(self, dim: int, num_heads: int, *, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        self.bilinear = nnx.Param(jnp.broadcast_to(jnp.eye(self.head_dim), (num_heads, self.head_dim, self.head_dim)))

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        wk = jnp.einsum("hde,bmhe->bmhd", self.bilinear[...].astype(k.dtype), k)
        return super().attend(q, wk, v, mask, deterministic=deterministic, rngs=rngs)
