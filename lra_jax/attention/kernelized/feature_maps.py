"""Kernelized attention: softmax's exp(q.k) replaced by a feature map, linear in n.

All three variants here write attention as a kernel phi(q)^T phi(k) and reorder the product
(Katharopoulos et al. 2020, eq. 4-6) so that no n x n matrix is ever formed:

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / phi(q_i)^T sum_j phi(k_j)
          = [phi(Q) (phi(K)^T V)]_i / [phi(Q) (phi(K)^T 1)]_i,

computed once, by `kernel_attention`, for both. With m features per head (m = d for the
Linear Transformer) the cost is O(n m d) time and O(n m + m d) memory per head, instead of
softmax attention's O(n^2 d) time and O(n^2) memory.

* Performer, FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers",
  Lemma 1, positive random features; Sec. 2.4, orthogonal random features):

      phi(x) = exp(w_r^T x - |x|^2 / 2) / sqrt(m),  r = 1..m,   x = q / d^{1/4} (same for k),

  with w_r ~ N(0, I_d), so that E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d)), the softmax kernel.
  The rows of W are drawn in blocks of d mutually orthogonal directions (QR of a Gaussian
  matrix), each row rescaled by the norm of an independent Gaussian d-vector, so every row is
  still marginally N(0, I_d) (unbiased) while orthogonality lowers the variance.
  The estimate converges to softmax attention as m grows.
* Linear Transformer (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 4-6 with
  eq. 7's feature map): phi(x) = elu(x) + 1, non-causal, normaliser kept.
* Taylor (Li, Su, Duan & Zheng 2020, "Linear Attention Mechanism: An Efficient Attention for
  Semantic Segmentation", arXiv:2007.14902, eq. 7-11): the first-order Taylor expansion
  exp(x) ~ 1 + x of the softmax kernel, made non-negative by L2-normalising queries and keys:

      sim(q_i, k_j) = 1 + s q^_i . k^_j >= 0,   q^ = q / |q|,  k^ = k / |k|,  0 < s <= 1,
      out_i = (sum_j v_j + s q^_i^T sum_j k^_j v_j^T) / (N_real + s q^_i^T sum_j k^_j),

  i.e. `kernel_attention` with phi(x) = [1, sqrt(s) x^] (m = d + 1 features). `s` (`scale`,
  default 1 as in the paper) is a fixed temperature; softmax(s q^.k^) and the Taylor weights
  differ by O(s^2) as s -> 0, the limit the tests check.

Padding. The original LRA code for Performer and Linear Transformer ignored the padding mask,
so padded keys entered every sum above and outputs depended on how much padding followed.
Here phi(k_j) is zeroed at padded keys before the sums, and Performer's key stabilisers (below)
are maxima over real keys only, so padded content can neither enter the sums nor push the real
keys' features into underflow or overflow. A row with no real key has S = z = 0; its output is
defined as 0 (`core.divide_or_zero`), never NaN. No epsilon is added to the normaliser: an
epsilon biases the ratio whenever phi(q_i)^T z is small, which for Performer's rescaled
features happens at any input scale.

Numerics (Performer). With log-features a_ir = log phi_r(q_i) and b_jr = log phi_r(k_j),

    out_i = sum_r e^{a_ir} S_r / sum_r e^{a_ir} z_r,   S_r = sum_j e^{b_jr} v_j,  z_r = sum_j e^{b_jr}.

For any constants c_r and per-query t_i, replacing b_jr by b_jr - c_r and a_ir by
a_ir + c_r - t_i leaves the ratio unchanged. `favor_attention` takes c_r = max over real keys
of b_jr (so every z_r >= 1 where a real key exists) and t_i = max_r (a_ir + c_r), so some
feature of every query weighs exactly 1 against a z_r >= 1: the normaliser is >= 1 and nothing
under- or overflows, whatever the norms of q and k. Both stabilisers pass through
`stop_gradient` (the function does not depend on them). Everything is in float32 and cast
back to the input dtype.

Causal form (Linear Transformer and Taylor, `causal=True`; Katharopoulos et al. 2020, eq. 8-9):
the sums run over the real keys j <= i only, S_i = sum_{j<=i} phi(k_j) v_j^T and z_i likewise.
`causal_kernel_attention` computes them in chunks of c positions: a running S and z carried across
chunks (the recurrent view) plus the c x c masked products within a chunk, so memory is
O(n/c m d + n c) per head rather than the O(n m d) of a prefix sum at every position. Performer
has no causal form here: its key stabiliser c_r is a maximum over all real keys, and a maximum over
the keys j <= i would have to be carried and rescaled chunk to chunk (a later, larger key makes the
earlier features underflow otherwise). The fused kernels are non-causal: a causal layer runs XLA.

Dropout. These variants never form attention weights, so `dropout_rate` (accepted by the base
class) is unused: there is nothing to drop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from lra_jax.attention.core import Attention, causal_pairs, divide_or_zero, matmul_flops, stream_key, unit_vectors
from lra_jax.attention.registry import register
from lra_jax import kernels
from lra_jax.errors import ConfigError
from lra_jax.kernels.linear.api import LINEAR
from lra_jax.kernels.linear.api import linear_attention as fused_linear_attention
from lra_jax.kernels.masking import Mask
from lra_jax.kernels.linear.api import kernel_limit as linear_kernel_limit

def kernel_attention(
    phi_q: Float[Array, "b n h m"],
    phi_k: Float[Array, "b n h m"],
    v: Float[Array, "b n h d"],
) -> Float[Array, "b n h d"]:
    """phi(Q) (phi(K)^T V) / phi(Q) phi(K)^T 1, never forming the n x n kernel matrix.

    Args:
      phi_q: query features, with phi(q_i)^T phi(k_j) >= 0.
      phi_k: key features, zero at padded keys.
      v: values.

    Returns:
      The kernel-weighted average of the values for every query, in float32; 0 for a query
      whose normaliser is 0 (no real key).
    """
    phi_q, phi_k, v = (t.astype(jnp.float32) for t in (phi_q, phi_k, v))
    kv = jnp.einsum("bnhm,bnhd->bhmd", phi_k, v)  # S = sum_j phi(k_j) v_j^T
    z = jnp.sum(phi_k, axis=1)  # z = sum_j phi(k_j), [b h m]
    numerator = jnp.einsum("bnhm,bhmd->bnhd", phi_q, kv)
    normaliser = jnp.einsum("bnhm,bhm->bnh", phi_q, z)
    return divide_or_zero(numerator, normaliser[..., None])


def causal_kernel_attention(
    phi_q: Float[Array, "b n h m"],
    phi_k: Float[Array, "b n h m"],
    v: Float[Array, "b n h d"],
    chunk: int = 64,
) -> Float[Array, "b n h d"]:
    """out_i = phi(q_i)^T S_i / phi(q_i)^T z_i, S_i = sum_{j<=i} phi(k_j) v_j^T, z_i = sum_{j<=i} phi(k_j).

    In chunks of `chunk` positions: the sums over earlier chunks (an exclusive prefix sum of each
    chunk's phi(K)^T V and phi(K)^T 1) plus, within the chunk, phi(Q) phi(K)^T masked to j <= i.
    Features as `kernel_attention` (phi(q)^T phi(k) >= 0, phi = 0 at padded keys); float32; 0 for a
    query with no real key at or before it.
    """
    phi_q, phi_k, v = (t.astype(jnp.float32) for t in (phi_q, phi_k, v))
    b, n, h, m = phi_q.shape
    c = min(chunk, n)
    pad = (-n) % c
    if pad:  # zero features at the end: they enter no sum, and their outputs are cut off below
        phi_q, phi_k, v = (jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))) for t in (phi_q, phi_k, v))
    groups = (n + pad) // c
    phi_q, phi_k, v = (t.reshape(b, groups, c, h, t.shape[-1]) for t in (phi_q, phi_k, v))

    def before(per_chunk):  # the sum over the chunks before each one (0 for the first)
        return jnp.cumsum(jnp.concatenate([jnp.zeros_like(per_chunk[:, :1]), per_chunk[:, :-1]], axis=1), axis=1)

    kv = before(jnp.einsum("bgchm,bgchd->bghmd", phi_k, v))
    z = before(jnp.sum(phi_k, axis=2))  # [b g h m]
    weights = jnp.einsum("bgihm,bgjhm->bghij", phi_q, phi_k)
    weights = jnp.where(causal_pairs(c, c), weights, 0.0)
    numerator = jnp.einsum("bgchm,bghmd->bgchd", phi_q, kv) + jnp.einsum("bghij,bgjhd->bgihd", weights, v)
    normaliser = jnp.einsum("bgchm,bghm->bgch", phi_q, z) + jnp.swapaxes(jnp.sum(weights, axis=-1), 2, 3)
    out = divide_or_zero(numerator, normaliser[..., None])
    return out.reshape(b, groups * c, h, -1)[:, :n]


# ----------------------------------------------------------------------------- Performer


class RandomFeatures(nnx.Variable):
    """Non-trainable random projections: the optimiser trains only `nnx.Param`; checkpoints keep them."""


def orthogonal_random_features(key: PRNGKeyArray, num_features: int, dim: int) -> Float[Array, "m d"]:
    """W for FAVOR+: ceil(m / d) blocks of d orthogonal rows, each row of norm ~ chi_d.

    Each block is Q^T from the QR decomposition of a d x d Gaussian matrix, with the signs of
    diag(R) folded into Q so that Q is Haar distributed; the last block is truncated to m rows.
    Each row is then rescaled by the norm of an independent N(0, I_d) vector, which makes
    every row marginally N(0, I_d) while rows of one block stay orthogonal.
    """
    num_blocks = -(-num_features // dim)
    # One flat draw, reshaped: XLA:CPU compiles rank-3 random draws ~10x slower than 1-D ones.
    gaussian = jax.random.normal(key, (num_blocks * dim * dim + num_features * dim,), jnp.float32)
    blocks = gaussian[: num_blocks * dim * dim].reshape(num_blocks, dim, dim)
    norms = jnp.linalg.norm(gaussian[num_blocks * dim * dim :].reshape(num_features, dim), axis=-1)
    q, r = jnp.linalg.qr(blocks)
    q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
    directions = jnp.swapaxes(q, -1, -2).reshape(num_blocks * dim, dim)[:num_features]
    return directions * norms[:, None]


def favor_log_features(x: Float[Array, "b n h d"], w: Float[Array, "m d"]) -> Float[Array, "b n h m"]:
    """log(sqrt(m) phi(x)) = w_r^T x' - |x'|^2 / 2 with x' = x / d^{1/4} (Lemma 1), in float32."""
    x = x.astype(jnp.float32) * x.shape[-1] ** -0.25
    projections = jnp.einsum("bnhd,md->bnhm", x, w.astype(jnp.float32))
    return projections - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)


def favor_attention(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n h d"],
    v: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    w: Float[Array, "m d"],
    plan: kernels.KernelPlan | None = None,
) -> Float[Array, "b n h d"]:
    """FAVOR+ estimate of softmax(q k^T / sqrt(d)) v over the real keys, with random features w.

    Padded keys get phi = 0. The per-feature key stabilisers c_r and per-query stabilisers t_i
    of the module docstring cancel exactly in the ratio (the 1/sqrt(m) of phi cancels too), so
    the result is the FAVOR+ estimator itself, to float32 round-off at any norm of q and k.
    With a `plan` that uses a Pallas kernel, the two reductions and the read-out run in the
    fused linear kernel (`lra_jax.kernels.linear`, features given, no epsilon either).
    """
    key_mask = mask[:, :, None, None]
    log_k = jnp.where(key_mask, favor_log_features(k, w), -jnp.inf)  # padded keys: exp(-inf) = 0
    key_max = jnp.max(log_k, axis=1, keepdims=True)  # c_r per (b, h, r): [b 1 h m]
    key_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(key_max), key_max, 0.0))  # no real key: 0
    phi_k = jnp.exp(log_k - key_max)

    log_q = favor_log_features(q, w) + key_max
    phi_q = jnp.exp(log_q - jax.lax.stop_gradient(jnp.max(log_q, axis=-1, keepdims=True)))
    if plan is not None and plan.uses_pallas:
        return fused_linear_attention(phi_q, phi_k, v, Mask(key_mask=mask), feature_map="identity",
                                      plan=plan).astype(v.dtype)
    return kernel_attention(phi_q, phi_k, v).astype(v.dtype)


@register("performer")
class PerformerAttention(Attention):

    """Performer attention with FAVOR+ positive orthogonal random features (see module docstring).

    The feature matrix W [num_features, head_dim] is shared by all heads, drawn at init from
    `rngs` (stream "features", falling back to the default, then the params stream) and
    stored as `RandomFeatures` state: not trained, saved in checkpoints.

    Args:
      dim, num_heads, rngs, **common: as `Attention` (dropout_rate is unused: no attention weights).
      num_features: number of random features m. Cost is O(n m d); the softmax estimate's
        error falls as m grows (256 is the default of the authors' FAVOR+ code, used by LRA).
      redraw: if True, every training call (deterministic=False) draws a fresh W from the
        `rngs` given to `__call__` (stream "features", falling back to the default, then the
        dropout stream), so the model does not overfit one draw; the stored W is left as is
        and used whenever deterministic=True (evaluation is reproducible).
    """

    kernel_op = LINEAR  # identity features; Triton only (none for TPU)
    uses_attention_dropout = False
    cost_exponent = 1.0  # n * m * d

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """q W^T and k W^T ([n, d/h] x [d/h, m] per head), phi(K)^T V and phi(Q) S ([n, m] x [m, d/h]).
        W is not trained, so its backward is one product, not two: 3x this overcounts by 4 B n d m."""
        return cls.projection_flops(batch, n, dim) + 4 * 2.0 * batch * n * settings["num_features"] * dim

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        num_features: int = 256,
        redraw: bool = False,
        **common,
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if num_features < 1:
            raise ConfigError(f"performer needs num_features >= 1, got {num_features}")
        self.num_features = num_features
        self.redraw = redraw
        self.features = RandomFeatures(
            orthogonal_random_features(stream_key(rngs, "features", "params", "drawing Performer random features"), num_features, self.head_dim)
        )

    def kernel_limits(self, platform: str) -> str | None:
        """The fused kernel holds S [m, d] in shared memory: too many features for the GPU run XLA."""
        return linear_kernel_limit(self.num_features, self.head_dim) if platform == "gpu" else None

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        w = self.features[...]
        if self.redraw and not deterministic:
            if rngs is None:
                raise ValueError("performer with redraw=True needs `rngs` when deterministic=False")
            key = stream_key(rngs, "features", "dropout", "drawing Performer random features")
            w = orthogonal_random_features(key, self.num_features, self.head_dim)
        return favor_attention(q, k, v, mask, w, self.kernel_plan(deterministic))


# ----------------------------------------------------------------------- Linear Transformer


def elu_features(x: Float[Array, "b n h d"]) -> Float[Array, "b n h d"]:
    """phi(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020, eq. 7), in float32.

    Written as x + 1 for x > 0 and e^x otherwise: `elu(x) + 1` rounds expm1(x) + 1 and loses
    e^x's relative precision for x < 0 (all of it below about -17, where it gives exactly 0).
    """
    x = x.astype(jnp.float32)
    return jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))


def linear_attention(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n h d"],
    v: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    plan: kernels.KernelPlan | None = None,
    causal: bool = False,
) -> Float[Array, "b n h d"]:
    """Linear attention (eq. 6; causal: eq. 9, keys j <= i) over the real keys; padded keys get phi = 0.

    With a `plan` that uses a Pallas kernel (non-causal only), the fused linear kernel computes the
    same (elu + 1 features applied inside it, `lra_jax.kernels.linear`).
    """
    if plan is not None and plan.uses_pallas:
        return fused_linear_attention(q, k, v, Mask(key_mask=mask), feature_map="elu", plan=plan)
    phi_k = jnp.where(mask[:, :, None, None], elu_features(k), 0.0)
    attend = causal_kernel_attention if causal else kernel_attention
    return attend(elu_features(q), phi_k, v).astype(v.dtype)


@register("linear")
class LinearAttention(Attention):
    """Linear Transformer attention, phi(x) = elu(x) + 1 (see module docstring).

    Args: as `Attention`; dropout_rate is unused (no attention weights are formed).
    """

    kernel_op = LINEAR  # Triton only (none for TPU)
    uses_attention_dropout = False
    cost_exponent = 1.0  # n * d^2
    supports_causal = True  # causal=True: sums over keys j <= i (`causal_kernel_attention`, XLA)

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """phi(K)^T V and phi(Q) S per head ([d/h, n] x [n, d/h], [n, d/h] x [d/h, d/h])."""
        return cls.projection_flops(batch, n, dim) + 2 * 2.0 * batch * n * dim * (dim // num_heads)

    def kernel_limits(self, platform: str) -> str | None:
        """The fused kernel holds S [d, d] in shared memory: too wide a head for the GPU runs XLA."""
        return linear_kernel_limit(self.head_dim, self.head_dim) if platform == "gpu" else None

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        return linear_attention(q, k, v, mask, self.kernel_plan(deterministic), causal=self.causal)


# ----------------------------------------------------------------------------------- Taylor


def taylor_features(x: Float[Array, "b n h d"], scale: float) -> Float[Array, "b n h m"]:
    """phi(x) = [1, sqrt(scale) x / |x|] (m = d + 1), so phi(q)^T phi(k) = 1 + scale q^.k^; float32.

    A zero vector maps to [1, 0, ..., 0] (its direction is undefined).
    """
    unit = unit_vectors(x)
    return jnp.concatenate([jnp.ones_like(unit[..., :1]), jnp.sqrt(jnp.float32(scale)) * unit], axis=-1)


def taylor_attention(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n h d"],
    v: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    *,
    scale: float = 1.0,
    causal: bool = False,
) -> Float[Array, "b n h d"]:
    """out_i = sum_j (1 + scale q^_i.k^_j) v_j / sum_j (1 + scale q^_i.k^_j) over the real keys j
    (causal: j <= i).

    Computed in linear form (module docstring); padded keys get phi = 0, so they enter neither sum.
    """
    phi_k = jnp.where(mask[:, :, None, None], taylor_features(k, scale), 0.0)
    attend = causal_kernel_attention if causal else kernel_attention
    return attend(taylor_features(q, scale), phi_k, v).astype(v.dtype)


@register("taylor")
class TaylorAttention(Attention):
    """First-order Taylor linear attention, sim = 1 + scale q^.k^ (see module docstring).

    Args:
      dim, num_heads, rngs, **common: as `Attention` (dropout_rate is unused: no attention weights).
      scale: fixed temperature s on q^.k^, in (0, 1] so that every similarity is >= 0
        (1, the paper's form, by default).

    Raises:
      ConfigError: if scale is not in (0, 1].
    """

    cost_exponent = 1.0  # n * d^2
    supports_causal = True  # causal=True: sums over keys j <= i (`causal_kernel_attention`)

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """With m = d_h + 1 features per head: phi(K)^T V ([m, n] x [n, d_h]), phi(Q) S ([n, m] x [m, d_h]) and the
        normaliser phi(Q) z ([n, m] x [m]): 2 x 2 n m d + 2 n m h."""
        features = dim // num_heads + 1
        return (cls.projection_flops(batch, n, dim) + 2 * matmul_flops(batch * n, features, dim)
                + matmul_flops(batch * n * num_heads, features, 1))

    def __init__(self, dim: int, num_heads: int, *, rngs: nnx.Rngs, scale: float = 1.0, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if not 0.0 < scale <= 1.0:
            raise ConfigError(f"taylor needs 0 < scale <= 1 (so that 1 + scale q.k >= 0), got scale={scale}")
        self.scale = float(scale)

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        return taylor_attention(q, k, v, mask, scale=self.scale, causal=self.causal)
