"""Diagonal linear recurrences computed by a parallel scan: LRU and S5, token mixers beside S4D.

Both run, per state dimension p, the linear time-invariant recurrence

    h_t = a ⊙ h_{t-1} + b_t,    h_0 = 0,                                          (1)

with a complex diagonal transition a and inputs b_t = B̄ u_t, and read out y_t = Re(C h_t) + D ⊙ u_t.
(1) is computed by `lra_jax.kernels.linear_recurrence.linear_scan`, a parallel associative scan over the
length: O(n) work and O(log n) depth; its `sequential_scan` is the step-by-step reference the tests hold it to.

LRA classifies whole sequences, so the layers are bidirectional: a second recurrence runs from the
end towards the start over the same inputs, read out by its own C', as S4D does with its backward kernel:

    y_t = Re(C h_t + C' g_t) + D ⊙ u_t,    g_t = a ⊙ g_{t+1} + b_t.

Padding: padded positions of u are zeroed first, so b_t = 0 there; the backward recurrence therefore
carries a zero state through any appended padding and starts, in effect, at the row's last real token.
Outputs at real positions depend neither on the padding's content nor on its length, and outputs at
padded positions are zeroed. `bidirectional=False` is the causal form (next-token pretraining).

The layer around the recurrence is S4D's block (`ssm.SSMBlock`): GELU, dropout, then a GLU projection.
The recurrence runs in float32 / complex64 whatever the layer's dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Complex, Float

from lra_jax.attention.core import SSMParam, matmul_flops
from lra_jax.attention.registry import register
from lra_jax.attention.recurrent.ssm import SSMBlock, scan_flops
from lra_jax.errors import ConfigError
from lra_jax.kernels.linear_recurrence import linear_scan


def input_map(u: Float[Array, "b n d"], b: Float[Array, "p d 2"]) -> Complex[Array, "b n p"]:
    """B u for a complex B (its real and imaginary parts in the last axis) and a real u: two real products."""
    return jax.lax.complex(jnp.einsum("bnd,pd->bnp", u, b[..., 0]), jnp.einsum("bnd,pd->bnp", u, b[..., 1]))


def readout(h: Complex[Array, "b n p"], c: Float[Array, "d p 2"]) -> Float[Array, "b n d"]:
    """Re(C h) = Re C Re h - Im C Im h: two real products, the imaginary part never formed."""
    return jnp.einsum("bnp,dp->bnd", h.real, c[..., 0]) - jnp.einsum("bnp,dp->bnd", h.imag, c[..., 1])


def bidirectional_readout(a, b, c: Float[Array, "k d p 2"], scan=linear_scan) -> Float[Array, "b n d"]:
    """Re(C h_t) (+ Re(C' g_t) with a second readout, the backward recurrence): [b n d], float32."""
    y = readout(scan(a, b), c[0])
    if c.shape[0] == 2:
        y = y + readout(scan(a, b, reverse=True), c[1])
    return y


def _complex(pair: Float[Array, "... 2"]) -> Complex[Array, "..."]:
    return jax.lax.complex(pair[..., 0], pair[..., 1])


def _block_flops(batch, n, dim, settings, states: int) -> float:
    """The block's output projection (d -> 2d with the GLU, else d -> d), the input map B u and each
    direction's readout Re(C h), two real products each (`input_map`, `readout`), and each direction's
    scan over `states` complex states (`scan_flops`)."""
    directions = SSMBlock.directions_of(settings)
    projection = matmul_flops(batch * n, dim, 2 * dim if settings["glu"] else dim)
    products = (1 + directions) * 2 * matmul_flops(batch * n, dim, states)
    return projection + products + directions * scan_flops(batch, n, states, complex_values=True)


@register("lru")
class LRU(SSMBlock):
    """Linear Recurrent Unit (Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long
    Sequences", arXiv:2303.06349), bidirectional.

    Per state j of N:  λ_j = exp(-exp(ν_j) + i exp(θ_j)),   h_t = λ ⊙ h_{t-1} + γ ⊙ (B u_t),
    y_t = Re(C h_t) + D ⊙ u_t  (eq. 7 of the paper), with the normalisation γ_j = sqrt(1 - |λ_j|²)
    (Sec. 3.3) trained as log γ, initialised from λ.

    Ring initialisation (Lemma 3.2): |λ| uniform on the ring [r_min, r_max] in the complex plane,
    arg λ uniform in [0, max_phase]:  log ν = log(-½ log(U (r_max² - r_min²) + r_min²)),  log θ = log(max_phase U').
    B and C complex Gaussian, each real and imaginary part of variance 1/(2 fan-in) (dim for B, N for C),
    D ~ N(0, 1). ν, θ and log γ are `SSMParam`s (their own rate, no weight decay).

    Args:
      dim: model width d.
      num_heads: accepted for the common contract; unused.
      state_size: N, complex states.
      r_min, r_max: the ring's radii, 0 <= r_min < r_max < 1.
      max_phase: the largest initial phase, in (0, 2π].
      bidirectional: add the backward recurrence (LRA); False gives the causal layer.
      glu: the block's output projection d -> 2d with a GLU (else d -> d).
    """

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        return _block_flops(batch, n, dim, settings, settings["state_size"])

    def __init__(self, dim: int, num_heads: int, *, state_size: int = 64, r_min: float = 0.0, r_max: float = 0.99,
                 max_phase: float = 2 * math.pi, bidirectional: bool = True, glu: bool = True, rngs: nnx.Rngs,
                 **common):
        if state_size < 1:
            raise ConfigError(f"lru needs state_size >= 1, got {state_size}")
        if not 0 <= r_min < r_max < 1:
            raise ConfigError(f"lru needs 0 <= r_min < r_max < 1, got r_min={r_min}, r_max={r_max}")
        if not 0 < max_phase <= 2 * math.pi:
            raise ConfigError(f"lru needs 0 < max_phase <= 2π, got {max_phase}")
        super().__init__(dim, num_heads, bidirectional=bidirectional, glu=glu, rngs=rngs, **common)
        self.state_size, self.r_min, self.r_max, self.max_phase = state_size, r_min, r_max, max_phase
        radius_u, phase_u = jax.random.uniform(rngs.params(), (2, state_size))
        nu = -0.5 * jnp.log(radius_u * (r_max**2 - r_min**2) + r_min**2)  # |λ| = exp(-ν) on the ring
        self.log_nu = SSMParam(jnp.log(nu))  # ν = exp(log ν) > 0 keeps |λ| = exp(-ν) < 1 throughout training
        self.log_theta = SSMParam(jnp.log(max_phase * phase_u))
        self.log_gamma = SSMParam(0.5 * jnp.log(1.0 - jnp.exp(-2.0 * nu)))  # γ = sqrt(1 - |λ|²)
        b_key, c_key, d_key = jax.random.split(rngs.params(), 3)
        self.b = nnx.Param(jax.random.normal(b_key, (state_size, dim, 2)) / math.sqrt(2 * dim))  # B, (re, im)
        self.c = nnx.Param(jax.random.normal(c_key, (self.directions, dim, state_size, 2)) / math.sqrt(2 * state_size))
        self.d = nnx.Param(jax.random.normal(d_key, (dim,)))
        self.build_output(rngs)

    def transition(self) -> Complex[Array, "p"]:
        """λ = exp(-ν + iθ), ν = exp(log ν), θ = exp(log θ)."""
        return jnp.exp(jax.lax.complex(-jnp.exp(self.log_nu[...]), jnp.exp(self.log_theta[...])))

    def ssm(self, u: Float[Array, "b n d"], scan=linear_scan) -> Float[Array, "b n d"]:
        u = u.astype(jnp.float32)
        inputs = jnp.exp(self.log_gamma[...]) * input_map(u, self.b[...])  # γ ⊙ (B u)
        return bidirectional_readout(self.transition(), inputs, self.c[...], scan) + self.d[...] * u


def hippo_n(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The eigenvalues Λ [size] and unitary eigenvectors V [size, size] of HiPPO-N, the normal part of
    HiPPO-LegS (Gu et al. 2022; Smith et al. 2023, Sec. 4.1, eq. 11):

        A_LegS[n, k] = -sqrt((2n+1)(2k+1)) for n > k,  -(n+1) for n = k,  0 for n < k;
        A_N = A_LegS + P Pᵀ,  P_n = sqrt(n + ½),

    so A_N = -½ I + S with S skew-symmetric: Λ = -½ + i ω, ω the eigenvalues of the Hermitian -i S."""
    n = np.arange(size)
    p = np.sqrt(n + 0.5)
    legs = -np.where(n[:, None] > n[None, :], np.sqrt(np.outer(2 * n + 1, 2 * n + 1)), 0.0) - np.diag(n + 1.0)
    normal = legs + np.outer(p, p)
    skew = normal + 0.5 * np.eye(size)
    omega, vectors = np.linalg.eigh(-1j * skew)
    return -0.5 + 1j * omega, vectors


@register("s5")
class S5(SSMBlock):
    """S5, the simplified state-space layer (Smith, Warrington, Linderman 2023, "Simplified State Space
    Layers for Sequence Modeling", arXiv:2208.04933): one multi-input multi-output diagonal SSM over all d
    channels, bidirectional, computed by a parallel scan.

    Continuous: x' = Λ x + B̃ u, y = C̃ x + D u, with Λ the HiPPO-N eigenvalues (`hippo_n`) of each of
    `blocks` blocks of size P/J on the diagonal (Sec. 4.1: a block-diagonal initialisation), B̃ = V⁻¹ B and
    C̃ = C V for the eigenvectors V. Per state a step Δ_p = exp(log Δ_p), log Δ ~ U[log dt_min, log dt_max].
    Zero-order hold (eq. 6):  Λ̄ = exp(Λ Δ),  B̄ = Λ⁻¹ (Λ̄ - I) B̃;  x_k = Λ̄ x_{k-1} + B̄ u_k (eq. 7).
    Conjugate symmetry (Sec. 4.3): of each block's P/J eigenvalues, which come in conjugate pairs, the P/(2J)
    with ω > 0 are kept and the readout is 2 Re(C̃ x). B ~ lecun normal (real), C complex lecun normal,
    D ~ N(0, 1). Λ (its real and imaginary parts) and log Δ are `SSMParam`s; B̃ and C̃ are ordinary weights.

    Args:
      dim: model width d (the SSM's input and output size H).
      num_heads: accepted for the common contract; unused.
      state_size: P, the latent size before conjugate symmetry (P/2 complex states are stored).
      blocks: J, the HiPPO-N blocks on the diagonal of Λ; P/J must be even.
      dt_min, dt_max: the range of the initial steps Δ (log-uniform).
      bidirectional: add the backward recurrence (LRA); False gives the causal layer.
      glu: the block's output projection d -> 2d with a GLU (else d -> d).
    """

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        return _block_flops(batch, n, dim, settings, settings["state_size"] // 2)

    def __init__(self, dim: int, num_heads: int, *, state_size: int = 64, blocks: int = 1, dt_min: float = 1e-3,
                 dt_max: float = 1e-1, bidirectional: bool = True, glu: bool = True, rngs: nnx.Rngs, **common):
        if blocks < 1 or state_size < 2 * blocks or state_size % blocks or (state_size // blocks) % 2:
            raise ConfigError(f"s5 needs blocks >= 1 and state_size / blocks a positive even number (conjugate "
                              f"pairs), got state_size={state_size}, blocks={blocks}")
        if not 0 < dt_min <= dt_max:
            raise ConfigError(f"s5 needs 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        super().__init__(dim, num_heads, bidirectional=bidirectional, glu=glu, rngs=rngs, **common)
        self.state_size, self.blocks, self.dt_min, self.dt_max = state_size, blocks, dt_min, dt_max
        eigenvalues, vectors = hippo_n(state_size // blocks)
        kept = eigenvalues.imag > 0  # one of each conjugate pair
        eigenvalues, vectors = eigenvalues[kept], vectors[:, kept]  # [P/2J], [P/J, P/2J]
        modes = state_size // 2
        self.lambda_re_im = SSMParam(jnp.asarray(np.tile(np.stack([eigenvalues.real, eigenvalues.imag], -1),
                                                         (blocks, 1)), jnp.float32))  # [P/2, 2]
        dt_key, b_key, c_key, d_key = jax.random.split(rngs.params(), 4)
        self.log_dt = SSMParam(jax.random.uniform(dt_key, (modes,), minval=math.log(dt_min), maxval=math.log(dt_max)))
        block_size = state_size // blocks
        b = jax.random.normal(b_key, (blocks, block_size, dim)) / math.sqrt(dim)  # lecun normal, fan-in d
        c = jax.random.normal(c_key, (self.directions, dim, blocks, block_size, 2)) / math.sqrt(2 * block_size)
        v = jnp.asarray(vectors, jnp.complex64)
        b_tilde = jnp.einsum("qp,jqd->jpd", v.conj(), b.astype(jnp.complex64)).reshape(modes, dim)  # V⁻¹ = Vᴴ
        c_tilde = jnp.einsum("kdjq,qp->kdjp", _complex(c), v).reshape(self.directions, dim, modes)
        self.b = nnx.Param(jnp.stack([b_tilde.real, b_tilde.imag], -1))
        self.c = nnx.Param(jnp.stack([c_tilde.real, c_tilde.imag], -1))
        self.d = nnx.Param(jax.random.normal(d_key, (dim,)))
        self.build_output(rngs)

    def discretized(self) -> tuple[Complex[Array, "p"], Complex[Array, "p d"]]:
        """(Λ̄, B̄) by zero-order hold."""
        lam = _complex(self.lambda_re_im[...])
        lam_bar = jnp.exp(lam * jnp.exp(self.log_dt[...]))
        return lam_bar, ((lam_bar - 1.0) / lam)[:, None] * _complex(self.b[...])

    def ssm(self, u: Float[Array, "b n d"], scan=linear_scan) -> Float[Array, "b n d"]:
        u = u.astype(jnp.float32)
        lam_bar, b_bar = self.discretized()
        inputs = input_map(u, jnp.stack([b_bar.real, b_bar.imag], -1))
        return 2.0 * bidirectional_readout(lam_bar, inputs, self.c[...], scan) + self.d[...] * u
