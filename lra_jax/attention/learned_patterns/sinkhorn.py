"""Sparse Sinkhorn attention: blocks attend to themselves and to a learned soft sorting of blocks.

Tay et al. 2020, "Sparse Sinkhorn Attention" (ICML), sec. 3. The sequence is cut into n_B
blocks of B tokens. A sorting network scores every pair of blocks from block summaries,

    R = F(psi(X)),  psi = per-block pooling (eq. 3),  R in R^{n_B x n_B},

and the Gumbel-Sinkhorn operator (sec. 3.2, eq. 5-7) turns R into a soft permutation:

    S^0(R) = exp((R + eps) / tau),  eps ~ Gumbel in training only,
    S^k(R) = F_c(F_r(S^{k-1}(R))),  F_r, F_c row and column normalisation,

run in log space. The sorted key and value blocks are K_s = S K, V_s = S V (mixing whole
blocks), and each query block attends, in one softmax, to its own block and to its sorted block
(sec. 3.3, "local + sorted" attention):

    out_i = softmax([q_i K_{c(i)}^T, q_i K_{s,c(i)}^T] / sqrt(d)) [V_{c(i)}; V_{s,c(i)}].

Scores take n * 2B floats plus n_B^2 for the sorting matrix: no n x n matrix.

Choices here:

* Summaries are per head: psi = the masked mean of the block's keys (padded keys excluded; a
  fully padded block has summary 0), and F is one linear map per head, head_dim -> max blocks
  (the LRA code also sorts per head, from the block sum of the keys, with a linear map to
  `max_num_blocks` columns). The sorting layer's column count is fixed by max_len, so the
  layer needs max_len (the encoder passes it).
* Padding. Blocks with no real token are cut out of the sorting matrix: R is masked to -1e30
  between a real and a padded block and set to the identity among padded blocks, so Sinkhorn
  normalises the real-block sub-matrix on its own (exactly: exp(-1e30) = 0) and a padded
  block maps to itself. Keys and values are zeroed at padded tokens before the mixing, and a
  sorted key slot is attended only if it carries weight from some real token. Padded keys are
  never attended; a fully padded block (and an all-padding row) stays finite. Appended padding
  only adds padded blocks, which the masking decouples, so real outputs do not change: the
  variant is length-invariant (in training the Gumbel draw has the padded shape, so the noise
  itself differs with the padded length, as dropout's does).
* Defaults: `block` 50 and sort from the key sums come from the LRA code
  (lra_benchmarks/models/sinkhorn_transformer, block_size=50); `sinkhorn_iterations` 5 and
  `temperature` 1.0 (the LRA operator defaults to temperature 1.0 and a single iteration, and its
  default sort activation is a plain row softmax; 5 log-space iterations bring rows and columns
  close to 1, the operator the paper describes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from lra_jax.attention.core import MASK_VALUE, Attention, masked_softmax, matmul_flops, stream_key
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError


# Rounds up to this count are unrolled, so that the TPU compiler's cost model (`tools.compile`), which
# models a compiled loop's body once, sees every one; more rounds run as one compiled loop, since XLA's
# compile time grows faster than the unrolled count (10, 20, 30, 50 rounds of a small matrix compiled in
# 1.5, 3.6, 7.8, 22.7 s on one core here).
UNROLLED_ROUNDS = 10


def log_sinkhorn(log_alpha: Float[Array, "... i j"], iterations: int) -> Float[Array, "... i j"]:
    """`iterations` rounds of row then column normalisation of exp(log_alpha), in log space (eq. 6-7).

    Unrolled up to `UNROLLED_ROUNDS` rounds (the configs take 5), a `lax.fori_loop` above."""

    def normalise(_, x):
        x = x - jax.nn.logsumexp(x, axis=-1, keepdims=True)
        return x - jax.nn.logsumexp(x, axis=-2, keepdims=True)

    log_alpha = log_alpha.astype(jnp.float32)
    if iterations > UNROLLED_ROUNDS:
        return jax.lax.fori_loop(0, iterations, normalise, log_alpha)
    for i in range(iterations):
        log_alpha = normalise(i, log_alpha)
    return log_alpha


def block_mask(mask: Bool[Array, "b n"], block: int) -> tuple[Bool[Array, "b c w"], Bool[Array, "b c"]]:
    """The token mask cut into blocks [b, c, B] (padded to c * B) and whether each block has a real token."""
    b, n = mask.shape
    num_blocks = -(-n // block)
    tokens = jnp.pad(mask, [(0, 0), (0, num_blocks * block - n)]).reshape(b, num_blocks, block)
    return tokens, jnp.any(tokens, axis=-1)


def sort_matrix(
    logits: Float[Array, "b h c c"],
    real_blocks: Bool[Array, "b c"],
    *,
    temperature: float,
    iterations: int,
    noise_key: PRNGKeyArray | None = None,
) -> Float[Array, "b h c c"]:
    """Gumbel-Sinkhorn soft permutation over the real blocks; padded blocks map to themselves.

    Args:
      logits: sorting logits R [b, h, c, c]; row i scores the key blocks for query block i.
      real_blocks: True for blocks holding at least one real token.
      temperature: tau; low values push the result towards a hard permutation.
      iterations: Sinkhorn iterations.
      noise_key: if given, Gumbel noise from this key is added to R (training).

    Returns:
      exp(log_sinkhorn((R + eps) / tau)) with rows and columns of padded blocks decoupled.
    """
    logits = logits.astype(jnp.float32)
    if noise_key is not None:
        flat = jax.random.gumbel(noise_key, (logits.size,), jnp.float32)  # flat: rank-4 draws compile slowly
        logits = logits + flat.reshape(logits.shape)
    logits = logits / temperature
    both_real = real_blocks[:, None, :, None] & real_blocks[:, None, None, :]
    c = logits.shape[-1]
    padded_self = ~real_blocks[:, None, :, None] & jnp.eye(c, dtype=bool)
    logits = jnp.where(both_real, logits, jnp.where(padded_self, 0.0, MASK_VALUE))
    return jnp.exp(log_sinkhorn(logits, iterations))


def sinkhorn_attention(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n h d"],
    v: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    permutation: Float[Array, "b h c c"],
    block: int,
    drop=None,
) -> Float[Array, "b n h d"]:
    """Each query block attends to its own block and to its sorted block sum_j P_ij (K_j, V_j).

    Args:
      q, k, v: per-head queries, keys and values.
      mask: True on real tokens.
      permutation: soft permutation P over the c = ceil(n / block) blocks (from `sort_matrix`).
      block: block length B.
      drop: optional dropout on the [b c h B 2B] attention weights.
    """
    b, n, h, d = v.shape
    tokens, _ = block_mask(mask, block)
    c = tokens.shape[1]
    padded = c * block

    def blocks(x):  # [b n h d] -> [b c B h d], zero at padded tokens
        x = jnp.where(mask[:, :, None, None], x, jnp.zeros((), x.dtype))
        return jnp.pad(x, [(0, 0), (0, padded - n), (0, 0), (0, 0)]).reshape(b, c, block, h, d)

    q_b, k_b, v_b = blocks(q), blocks(k), blocks(v)
    p = permutation.astype(jnp.float32)
    sorted_k, sorted_v = (
        jnp.einsum("bhij,bjwhd->biwhd", p, x.astype(jnp.float32)).astype(x.dtype) for x in (k_b, v_b)
    )
    weight = jnp.einsum("bhij,bjw->bihw", p, tokens.astype(jnp.float32))  # real weight of each slot
    key_mask = jnp.concatenate(
        [jnp.broadcast_to(tokens[:, :, None, :], (b, c, h, block)), weight > 0], axis=-1
    )  # [b c h 2B]
    keys = jnp.concatenate([k_b, sorted_k], axis=2)  # [b c 2B h d]
    values = jnp.concatenate([v_b, sorted_v], axis=2)
    logits = jnp.einsum("bcqhd,bckhd->bchqk", q_b, keys) / jnp.sqrt(d).astype(q.dtype)
    probs = masked_softmax(logits, key_mask[:, :, :, None, :])
    if drop is not None:
        probs = drop(probs)
    out = jnp.einsum("bchqk,bckhd->bcqhd", probs.astype(v.dtype), values)
    return out.reshape(b, padded, h, d)[:, :n]


@register("sinkhorn")
class SinkhornAttention(Attention):
    """Sparse Sinkhorn attention (see module docstring).

    Args:
      dim, num_heads, rngs, **common: as `Attention`; max_len is required (it fixes the number
        of sorting columns, ceil(max_len / block)).
      block: block length B (LRA code: 50).
      sinkhorn_iterations: log-space Sinkhorn iterations (default 5; LRA code 1).
      temperature: tau of the Gumbel-Sinkhorn operator (default 1.0, as the LRA code).
    """

    cost_exponent = 1.0  # n * 2b scores; the (n / b)^2 sorting matrix stays smaller while n < b^3

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Over c blocks of B (padded length c B): projections, the sorting logits ([c, d_h] x [d_h, c] per head),
        the sorted keys and values S K, S V ([c, c] x [c, B d_h] per head, and S's real weight of each key slot,
        [c, c] x [c, B]), then q.k and p v of every query over its block's B and its sorted block's B keys,
        2 x 2 (c B) 2B d. The Sinkhorn iterations are elementwise, not counted."""
        block = max(1, min(settings["block"], settings["max_len"]))
        num_blocks = -(-n // block)
        sorting = (matmul_flops(batch * num_blocks, dim, num_blocks)
                   + 2 * matmul_flops(batch * num_blocks, num_blocks, block * dim)
                   + matmul_flops(batch * num_blocks, num_blocks, block * num_heads))
        return (cls.projection_flops(batch, n, dim) + sorting
                + cls.attention_flops(batch * num_blocks * block, 2 * block, dim))

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        block: int = 50,
        sinkhorn_iterations: int = 5,
        temperature: float = 1.0,
        **common,
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if block < 1:
            raise ConfigError(f"sinkhorn block must be >= 1, got block={block}")
        if sinkhorn_iterations < 0 or temperature <= 0:
            raise ConfigError(
                f"sinkhorn needs sinkhorn_iterations >= 0 and temperature > 0, got "
                f"{sinkhorn_iterations} and {temperature}"
            )
        if self.max_len is None:
            raise ConfigError(
                "sinkhorn's sorting network has one output per block of the longest sequence: pass "
                "max_len (the encoder passes the task's max_len)"
            )
        self.block = max(1, min(block, self.max_len))
        self.max_blocks = -(-self.max_len // self.block)
        self.sinkhorn_iterations, self.temperature = sinkhorn_iterations, temperature
        init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.sort_kernel = nnx.Param(init(rngs.params(), (num_heads, self.head_dim, self.max_blocks)))
        self.sort_bias = nnx.Param(jnp.zeros((num_heads, self.max_blocks)))

    def sort_logits(self, k: Float[Array, "b n h d"], mask: Bool[Array, "b n"]) -> Float[Array, "b h c c"]:
        """R[i, j] = F(masked mean of block i's keys)_j, for the c blocks of this input."""
        b, n, h, d = k.shape
        tokens, _ = block_mask(mask, self.block)
        c = tokens.shape[1]
        if c > self.max_blocks:
            raise ConfigError(
                f"sinkhorn got {n} tokens ({c} blocks) but was built for max_len={self.max_len} "
                f"({self.max_blocks} blocks); build it with a larger max_len"
            )
        k = jnp.where(mask[:, :, None, None], k.astype(jnp.float32), 0.0)
        k = jnp.pad(k, [(0, 0), (0, c * self.block - n), (0, 0), (0, 0)]).reshape(b, c, self.block, h, d)
        count = jnp.maximum(jnp.sum(tokens, axis=-1), 1)[:, :, None, None]
        summary = jnp.sum(k, axis=2) / count  # [b c h d]
        kernel = self.sort_kernel[...][..., :c].astype(jnp.float32)
        return jnp.einsum("bihd,hdj->bhij", summary, kernel) + self.sort_bias[...][None, :, None, :c]

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        noise_key = None
        if not deterministic:
            if rngs is None:
                raise ValueError("sinkhorn needs `rngs` (for the Gumbel noise) when deterministic=False")
            noise_key = stream_key(rngs, "sinkhorn", "dropout", "sinkhorn training")
        _, real_blocks = block_mask(mask, self.block)
        permutation = sort_matrix(
            self.sort_logits(k, mask), real_blocks, temperature=self.temperature,
            iterations=self.sinkhorn_iterations, noise_key=noise_key,
        )
        drop = lambda p: self.drop(p, deterministic=deterministic, rngs=rngs)
        return sinkhorn_attention(q, k, v, mask, permutation, self.block, drop=drop)
