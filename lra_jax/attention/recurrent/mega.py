"""Mega (Ma et al. 2023, "Mega: Moving Average Equipped Gated Attention", arXiv:2209.10655): single-head
gated attention over a multi-dimensional damped exponential moving average, a token mixer.

Moving average (Sec. 3.1, eq. 3), each channel j of d expanded to h dimensions:
    u_t = β_j x_{t,j},   s_t = α ⊙ u_t + (1 - α ⊙ δ) ⊙ s_{t-1},   EMA(x)_{t,j} = η_jᵀ s_t,
with α, δ = sigmoid(·) ∈ (0, 1)^h per channel. Unrolled it is a convolution with the kernel
K_{k,j} = Σ_h η_{j,h} α_{j,h} β_{j,h} (1 - α_{j,h} δ_{j,h})^k, computed by FFT over 2n points
(`ssm.fft_convolution`). Bidirectional (LRA): a second set of parameters gives the anti-causal kernel over
the positions strictly after t, as S4D's backward kernel. The causal form runs eq. 3 itself, by an exact
parallel scan (`ssm.diagonal_scan`): an FFT's rounding would let every output read later inputs, slightly.

Gated attention (Sec. 3.2, eqs. 6-13), X' = EMA(X):
    Z = SiLU(X' W_z + b_z)  [n z],   Q = κ_q ⊙ Z + μ_q,   K = κ_k ⊙ Z + μ_k,   V = SiLU(X W_v + b_v)  [n v],
    O = softmax(Q Kᵀ / √z + b_rel) V,    γ = SiLU(X' W_γ + b_γ)  [n v],    φ = sigmoid(X' W_φ + b_φ)  [n d],
    Ĥ = SiLU(X' W_h + (γ ⊙ O) U_h + b_h),    Y = φ ⊙ Ĥ + (1 - φ) ⊙ X,
with b_rel a learned bias per relative offset (the paper's simple relative positions). The encoder adds
its residual, so the layer returns Y - X = φ ⊙ (Ĥ - X).

Mega-chunk (Sec. 3.5): with `chunk` = c > 0 the attention sees only keys in the query's chunk of c
positions (the moving average still crosses chunks), O(n c) instead of O(n²); `chunk` = 0 attends to the
whole sequence. Padding: inputs zeroed before the moving average, padded keys masked; the kernel and the
relative bias at an offset do not depend on the length, so appended padding changes nothing at real
positions. `bidirectional=False` is the causal form: no backward kernel, and no query attends to a later key.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float

from lra_jax.attention.core import (
    BidirectionalMixer,
    TokenMask,
    Tokens,
    fft_flops,
    masked_softmax,
    matmul_flops,
    zero_padding,
)
from lra_jax.attention.dropout import Dropout
from lra_jax.attention.registry import register
from lra_jax.attention.recurrent.ssm import diagonal_scan, fft_convolution, scan_flops
from lra_jax.errors import ConfigError


def ema_kernel(alpha: Float[Array, "k d h"], delta: Float[Array, "k d h"], beta: Float[Array, "k d h"],
               eta: Float[Array, "k d h"], length: int) -> Float[Array, "k d n"]:
    """K_{t,j} = Σ_h η α β (1 - α δ)^t for t < length, α and δ already in (0, 1)."""
    decay = jnp.log1p(-alpha * delta)  # log(1 - α δ) < 0
    powers = jnp.exp(decay[..., None] * jnp.arange(length, dtype=jnp.float32))  # [k d h n]
    return jnp.einsum("kdh,kdhn->kdn", eta * alpha * beta, powers)


def ema_recurrence(x: Float[Array, "b n d"], alpha, delta, beta, eta) -> Float[Array, "b n d"]:
    """eq. 3 step by step for one direction's parameters [d h]: the reference of the convolution."""
    def step(s, x_t):
        s = alpha * beta * x_t[..., None] + (1 - alpha * delta) * s
        return s, jnp.einsum("bdh,dh->bd", s, eta)

    _, y = jax.lax.scan(step, jnp.zeros((x.shape[0], *alpha.shape)), jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(y, 0, 1)


@register("mega")
class Mega(BidirectionalMixer):
    """Mega's moving-average gated attention, bidirectional: see the module docstring.

    Args:
      dim: model width d; num_heads: accepted for the contract (the attention has one head).
      max_len: the longest sequence (the relative bias has 2 max_len - 1 offsets).
      ema_dim: h, the moving average's dimensions per channel (16 in the paper).
      shared_dim: z, the width of the shared representation Z and of queries and keys.
      expansion: v = expansion · d, the width of values.
      chunk: Mega-chunk's chunk size c; 0 attends to the whole sequence.
      bidirectional: add the anti-causal moving average (LRA); False gives the causal layer (the attention
        then masks later keys too).
      **common: shared settings of `TokenMixer`; `dropout_rate` drops attention weights.
    """

    uses_attention_dropout = True  # its attention weights take the dropout
    cost_exponent = 2.0  # whole-sequence attention (Mega-chunk's `chunk` makes it n·c)

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """The projections (W_z, W_v, W_γ, W_φ, W_h, U_h), the moving average (bidirectional: its kernel and
        FFT convolution; causal: its scan), and the attention's two products over each query's keys."""
        tokens = batch * n
        z, v, h = settings["shared_dim"], settings["expansion"] * dim, settings["ema_dim"]
        keys = min(settings["chunk"] or n, n)
        directions = cls.directions_of(settings)
        projections = (matmul_flops(tokens, dim, z) + 2 * matmul_flops(tokens, dim, v)
                       + 2 * matmul_flops(tokens, dim, dim) + matmul_flops(tokens, v, dim))
        if directions == 2:  # the kernel (a multiply-add per dimension and lag) and the FFT convolution
            ema = 2 * directions * dim * h * n + fft_flops(2 * n, 2 * batch * dim + dim, real=True)
        else:  # the scan over h real states per channel (`scan_flops`) and its readout
            ema = scan_flops(batch, n, dim * h, complex_values=False) + matmul_flops(tokens * dim, h, 1)
        attention = matmul_flops(tokens, z, keys) + matmul_flops(tokens, keys, v)
        return projections + ema + attention

    def __init__(self, dim: int, num_heads: int, *, ema_dim: int = 16, shared_dim: int = 64, expansion: int = 2,
                 chunk: int = 0, bidirectional: bool = True, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, bidirectional=bidirectional, rngs=rngs, **common)
        if self.max_len is None:
            raise ConfigError("mega needs max_len (its relative position bias has one entry per offset)")
        if min(ema_dim, shared_dim, expansion) < 1 or chunk < 0:
            raise ConfigError(f"mega needs ema_dim, shared_dim and expansion >= 1 and chunk >= 0, got "
                              f"ema_dim={ema_dim}, shared_dim={shared_dim}, expansion={expansion}, chunk={chunk}")
        self.ema_dim, self.shared_dim, self.expansion, self.chunk = ema_dim, shared_dim, expansion, chunk
        directions, v = self.directions, expansion * dim
        keys = jax.random.split(rngs.params(), 5)
        # α, δ as logits; β ~ N(0, 1) with alternating signs kept from the paper's init; η ~ N(0, 1/h)
        self.alpha_logit = nnx.Param(jax.random.normal(keys[0], (directions, dim, ema_dim)) * 0.2)
        self.delta_logit = nnx.Param(jax.random.normal(keys[1], (directions, dim, ema_dim)) * 0.2)
        self.beta = nnx.Param(jax.random.normal(keys[2], (directions, dim, ema_dim)) * 0.02
                              + jnp.where(jnp.arange(ema_dim) % 2 == 0, 1.0, -1.0))
        self.eta = nnx.Param(jax.random.normal(keys[3], (directions, dim, ema_dim)) / math.sqrt(ema_dim))
        self.relative_bias = nnx.Param(jax.random.normal(keys[4], (2 * self.max_len - 1,)) * 0.02)
        linear = lambda i, o: nnx.Linear(i, o, dtype=self.dtype, rngs=rngs)
        self.to_z, self.to_v, self.to_gamma = linear(dim, shared_dim), linear(dim, v), linear(dim, v)
        self.to_phi, self.to_h, self.from_o = linear(dim, dim), linear(dim, dim), linear(v, dim)
        self.qk_scale = nnx.Param(jnp.ones((2, shared_dim)) + 0.02 * jax.random.normal(rngs.params(), (2, shared_dim)))
        self.qk_offset = nnx.Param(jnp.zeros((2, shared_dim)))
        self.attention_dropout = Dropout(self.dropout_rate)

    def kernel(self, length: int) -> Float[Array, "k d n"]:
        return ema_kernel(jax.nn.sigmoid(self.alpha_logit[...]), jax.nn.sigmoid(self.delta_logit[...]),
                          self.beta[...], self.eta[...], length)

    def moving_average(self, x: Float[Array, "b n d"]) -> Float[Array, "b n d"]:
        """EMA(x) in float32: both directions by FFT when bidirectional, else eq. 3 by its scan; x's padded rows
        must be zero."""
        x = x.astype(jnp.float32)
        if self.bidirectional:
            return fft_convolution(x, self.kernel(x.shape[1]))
        alpha, delta = jax.nn.sigmoid(self.alpha_logit[0]), jax.nn.sigmoid(self.delta_logit[0])
        return diagonal_scan(x, 1.0 - alpha * delta, self.eta[0] * alpha * self.beta[0])

    def attention_weights(self, q: Float[Array, "b m c z"], k: Float[Array, "b m c z"],
                          mask: Bool[Array, "b m c"]) -> Float[Array, "b m c c"]:
        """softmax(Q Kᵀ / √z + b_rel) within each of the m blocks of c positions (one block of n without
        chunking), over the real keys, and not the later ones in the causal form."""
        c = q.shape[2]
        logits = jnp.einsum("bmqz,bmkz->bmqk", q, k) / math.sqrt(self.shared_dim)
        offsets = jnp.arange(c)[:, None] - jnp.arange(c)[None, :]
        logits = logits + self.relative_bias[...][offsets + self.max_len - 1]
        allowed = jnp.broadcast_to(mask[:, :, None, :], logits.shape)
        if self.causal:
            allowed = allowed & (offsets >= 0)
        return masked_softmax(logits, allowed)

    def blocks(self, x: Float[Array, "b n ..."]) -> Float[Array, "b m c ..."]:
        """x in blocks of `chunk` positions (the length padded up to a multiple), or one block of n."""
        n = x.shape[1]
        c = self.chunk or n
        x = jnp.pad(x, ((0, 0), (0, -n % c)) + ((0, 0),) * (x.ndim - 2))
        return x.reshape(x.shape[0], -1, c, *x.shape[2:])

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        x = zero_padding(x, mask)
        shifted = jax.nn.silu(self.moving_average(x)).astype(x.dtype)  # X', SiLU as in the authors' code
        z = jax.nn.silu(self.to_z(shifted))
        q = z * self.qk_scale[0] + self.qk_offset[0]
        k = z * self.qk_scale[1] + self.qk_offset[1]
        v = jax.nn.silu(self.to_v(x))
        n = x.shape[1]
        if n > self.max_len:
            raise ConfigError(f"mega was built for max_len={self.max_len} and got {n} tokens")
        weights = self.attention_weights(self.blocks(q.astype(jnp.float32)), self.blocks(k.astype(jnp.float32)),
                                         self.blocks(mask))
        weights = self.attention_dropout(weights, deterministic=deterministic, rngs=rngs)
        o = jnp.einsum("bmqk,bmkv->bmqv", weights.astype(x.dtype), self.blocks(v))
        o = o.reshape(o.shape[0], -1, o.shape[-1])[:, :n]
        gamma = jax.nn.silu(self.to_gamma(shifted))
        phi = jax.nn.sigmoid(self.to_phi(shifted))
        h = jax.nn.silu(self.to_h(shifted) + self.from_o(gamma * o))
        return zero_padding(phi * (h - x), mask)
