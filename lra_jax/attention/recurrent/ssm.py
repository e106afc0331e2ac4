"""S4D, a diagonal state-space layer (Gu, Gupta, Goel, Ré 2022, "On the Parameterization and
Initialization of Diagonal State Space Models", arXiv:2206.11893), as a token mixer: the
state-space yardstick next to the attention variants. Not attention: no queries, keys or weights.

Every channel h of the d = H channels is its own single-input single-output SSM

    x'(t) = A x(t) + B u(t),    y(t) = C x(t) + D u(t),

with a diagonal complex A = diag(A_0 .. A_{N/2-1}). The state is N-dimensional; its modes come in
conjugate pairs, so N/2 complex modes are stored and the real kernel is twice the real part.

Parameters, per channel (S4D-Lin):
    A_n = -exp(a_n) + i b_n,   a_n = log(1/2), b_n = pi n at initialisation  (A_n = -1/2 + i pi n),
    Delta = exp(log_dt),       log_dt ~ U[log dt_min, log dt_max]  (dt in [1e-3, 1e-1] by default),
    C_n ~ complex normal (unit variance), B_n = 1 (B only ever appears as B * C, so it is folded into
    C, as in the paper's own minimal S4D), D ~ N(0, 1).

Discretisation by zero-order hold:
    A_bar = exp(Delta A),   B_bar = (exp(Delta A) - 1) / A * B.

The convolution kernel is a Vandermonde product, O(n N) per channel for length n:
    K_l = 2 Re( sum_n C_n B_bar_n A_bar_n^l ),   l = 0 .. n-1,
and y = K * u + D u, computed by FFT over 2n points, so the linear convolution never wraps around.

Causal form (`bidirectional=False`): the same sum y_t = sum_{s <= t} K_{t-s} u_s + D u_t by its recurrence,
x_t = A_bar x_{t-1} + u_t and y_t = 2 Re(C B_bar x_t) + D u_t, an exact parallel scan (`diagonal_scan`).
An FFT's rounding reaches every output from every input (about 1e-7 of the largest derivative in float32),
so its output at t would depend, slightly, on later inputs; the scan reads only the inputs s <= t. It
holds [b n H N/2] complex states, N/2 times the FFT's memory.

Bidirectional (LRA): a second kernel K' (its own C', the same A and Delta, as in the authors' code)
runs backwards in time over the positions strictly after t:
    y_t = sum_{s <= t} K_{t-s} u_s + sum_{s > t} K'_{s-t-1} u_s + D u_t.

The layer (the paper's S4D block) is then
    out = GLU(W gelu(y) + b)     (W: d -> 2d, GLU(a, g) = a * sigmoid(g); glu=True, the paper's choice)
    out = W gelu(y) + b          (W: d -> d; glu=False),
with dropout on gelu(y) in training (`dropout_rate`).

Optimisation: A (its log real part and imaginary part) and log Delta are `SSMParam`s: the trainer
gives them a peak rate of min(`config.optimizer.ssm_max_learning_rate`, the main peak) and no
weight decay, as the paper does (its LRA runs cap it at 0.001). C, D and the projection are ordinary parameters.

Padding: padded positions of u are zeroed before the convolution, so their content never reaches
a real position; a real position's output depends only on kernel entries at lags < n, which do not
depend on how long the padded sequence is. Appended padding therefore changes nothing at real
positions (`length_invariant` holds), and outputs at padded positions are zero.

Precision: the kernel and the FFT convolution always run in float32 / complex64; a bfloat16 layer
casts to the computation dtype only after the convolution and D term.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Complex, Float

from lra_jax.attention.core import (
    BidirectionalMixer,
    SSMParam,
    TokenMask,
    Tokens,
    complex_matmul_flops,
    fft_flops,
    matmul_flops,
    zero_padding,
)
from lra_jax.attention.dropout import Dropout
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError
from lra_jax.kernels.linear_recurrence import linear_scan


def zoh(log_dt: Float[Array, "h"], log_a_real: Float[Array, "h m"], a_imag: Float[Array, "h m"],
        c: Complex[Array, "k h m"]) -> tuple[Complex[Array, "h m"], Complex[Array, "k h m"]]:
    """(dt A, C B_bar) of the zero-order hold: A_m = -exp(log_a_real) + i a_imag, dt = exp(log_dt),
    B_bar = (exp(dt A) - 1) / A; complex64."""
    dt = jnp.exp(log_dt.astype(jnp.float32))[:, None]
    a = -jnp.exp(log_a_real.astype(jnp.float32)) + 1j * a_imag.astype(jnp.float32)
    dta = a * dt
    return dta, c * ((jnp.exp(dta) - 1.0) / a)


def zoh_kernel(log_dt: Float[Array, "h"], log_a_real: Float[Array, "h m"], a_imag: Float[Array, "h m"],
               c: Complex[Array, "k h m"], length: int) -> Float[Array, "k h n"]:
    """K_l = 2 Re(sum_m C_m (exp(dt A_m) - 1) / A_m exp(dt A_m l)) for l < length: one kernel per C.

    A_m = -exp(log_a_real) + i a_imag, dt = exp(log_dt); float32 / complex64 throughout.
    The Vandermonde product is factored: with l = q R + r (R = ceil(sqrt(length))),
    A_bar^l = A_bar^{qR} A_bar^r, so K is one matmul of [k h m Q] by [h m R] powers (each power taken
    directly as exp(dt A l), not by repeated products). Time O(k h m n), as the plain product; memory
    O(k h n + h m sqrt(n)) instead of the [h m n] Vandermonde matrix, in the backward pass too.
    """
    dta, weights = zoh(log_dt, log_a_real, a_imag, c)  # [h m], C B_bar [k h m]
    inner_size = math.isqrt(max(length - 1, 0)) + 1  # R = ceil(sqrt(length))
    outer_size = -(-length // inner_size)  # Q = ceil(length / R)
    inner = jnp.exp(dta[..., None] * jnp.arange(inner_size, dtype=jnp.float32))  # A_bar^r, [h m R]
    outer = weights[..., None] * jnp.exp(dta[..., None] * (inner_size * jnp.arange(outer_size, dtype=jnp.float32)))
    kernel = 2.0 * jnp.real(jnp.einsum("khmq,hmr->khqr", outer, inner))  # [k h Q R]
    return kernel.reshape(*kernel.shape[:2], -1)[..., :length]


def fft_convolution(u: Float[Array, "b n h"], kernel: Float[Array, "k h n"]) -> Float[Array, "b n h"]:
    """Linear (not circular) convolution along the length by FFT over 2n points, in float32.

    kernel[0] is causal: y_t += sum_{s <= t} kernel[0]_{t-s} u_s. A second kernel (bidirectional)
    is anti-causal and skips the current position: y_t += sum_{s > t} kernel[1]_{s-t-1} u_s.
    """
    n = u.shape[1]
    full = jnp.pad(kernel[0], ((0, 0), (0, n)))  # lags 0 .. n-1, then zeros: [h 2n]
    if kernel.shape[0] == 2:  # lag -(j+1) lives at index 2n - (j+1) of the 2n-point kernel
        full = full + jnp.pad(jnp.flip(kernel[1], axis=-1), ((0, 0), (n, 0)))
    u_f = jnp.fft.rfft(u.astype(jnp.float32), n=2 * n, axis=1)  # [b n+1 h]
    k_f = jnp.fft.rfft(full, n=2 * n, axis=-1).T  # [n+1 h]
    return jnp.fft.irfft(u_f * k_f, n=2 * n, axis=1)[:, :n]


def diagonal_scan(u: Float[Array, "b n h"], transition: Array, weights: Array) -> Float[Array, "b n h"]:
    """y_t = Re(sum_m w_m x_{t,m}) with x_t = a ⊙ x_{t-1} + u_t (u_t fed to each of the m modes), from x = 0:
    the causal convolution of kernel K_l = Re(sum_m w_m a_m^l), by an exact parallel scan (`linear_scan`).

    `transition` a and `weights` w are [h m], real or complex; u is float32. y_t reads u_s for s <= t only,
    so its derivative with respect to a later input is exactly zero. Memory: [b n h m] states.
    """
    states = jnp.broadcast_to(u[..., None], (*u.shape, transition.shape[-1])).astype(transition.dtype)
    return jnp.real(jnp.einsum("bnhm,hm->bnh", linear_scan(transition, states), weights))


def scan_flops(batch: int, n: int, width: int, *, complex_values: bool) -> float:
    """FLOPs of one scan (`linear_scan`) over [batch, n, width] states: a multiply-add per state and step
    (8 FLOPs complex, 2 real), as the recurrence does it step by step; the parallel scan does a small
    multiple of that work, at log depth (XLA's count of it: tests/measure/test_flops.py)."""
    return (8.0 if complex_values else 2.0) * batch * n * width


class SSMBlock(BidirectionalMixer):
    """The block around a state-space mixer (S4D, S5, LRU): out = GLU(W gelu(ssm(u)) + b), or W gelu(ssm(u)) + b
    without the GLU, with dropout on gelu(ssm(u)) in training; `ssm` maps the zero-padded input [b n d] to
    y [b n d] in float32. Bidirectional by default (LRA); `bidirectional=False` is the causal form.

    Args:
      bidirectional: the subclass adds its backward direction (`directions` is 2), else 1.
      glu: output projection d -> 2d followed by a GLU (the S4D paper's); False: a d -> d projection.
      **common: shared settings of `TokenMixer`; `dropout_rate` is the dropout on gelu(y).
    """

    def __init__(self, dim: int, num_heads: int, *, bidirectional: bool = True, glu: bool = True, rngs: nnx.Rngs,
                 **common):
        super().__init__(dim, num_heads, bidirectional=bidirectional, rngs=rngs, **common)
        self.glu = glu
        self.activation_dropout = Dropout(self.dropout_rate)

    def build_output(self, rngs: nnx.Rngs) -> None:
        """The output projection, drawn last by each subclass so that its parameters' draws keep their order."""
        self.out = nnx.Linear(self.dim, 2 * self.dim if self.glu else self.dim, dtype=self.dtype, rngs=rngs)

    def ssm(self, u: Float[Array, "b n d"]) -> Float[Array, "b n d"]:
        raise NotImplementedError

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        y = jax.nn.gelu(self.ssm(zero_padding(x, mask)))
        y = self.activation_dropout(y, deterministic=deterministic, rngs=rngs).astype(x.dtype)
        y = self.out(y)
        if self.glu:
            value, gate = jnp.split(y, 2, axis=-1)
            y = value * jax.nn.sigmoid(gate)
        return zero_padding(y, mask)


@register("s4d")
class S4D(SSMBlock):
    """Bidirectional S4D-Lin layer: per-channel diagonal SSM kernels, FFT convolution, GELU, GLU.

    Args:
      dim: model width d (= the number of SSM channels H).
      num_heads: accepted for the common contract; unused (every channel is its own SSM).
      state_size: the state size N of each channel's SSM (N/2 complex modes); even, >= 2.
      dt_min, dt_max: the range of the initial step sizes Delta (log-uniform).
      bidirectional: add the backward kernel (LRA); False gives a causal layer.
      glu: output projection d -> 2d followed by a GLU (the paper's); False: a d -> d projection.
      rngs: parameter initialisation keys; `rngs.params` for the weights.
      **common: shared settings of `TokenMixer`; `dropout_rate` is the dropout on gelu(y).

    Raises:
      ConfigError: on an odd or too small state size or an empty or non-positive step range.
    """

    cost_exponent = 1.0  # O(n N) Vandermonde kernel + O(n log n) FFT convolution; causal: O(n N) scan

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """The output projection (d -> 2d with the GLU, else d -> d). Bidirectional: the Vandermonde kernel, one
        complex [Q, N/2] x [N/2, R] product per kernel and channel (Q R >= n, R = ceil(sqrt(n)); 8 FLOPs per
        complex multiply-add, `core.complex_matmul_flops`), once for the batch; and the FFT convolution, real
        transforms of 2n points by the 2.5 N log2 N convention (`core.fft_flops`): rfft of u and irfft per example
        and channel, rfft of the kernel. Causal: the scan over N/2 complex modes per channel (`scan_flops`) and
        its readout, a complex multiply-add per mode, position and channel."""
        projection = matmul_flops(batch * n, dim, 2 * dim if settings["glu"] else dim)
        modes = settings["state_size"] // 2
        if not settings["bidirectional"]:
            return (projection + scan_flops(batch, n, dim * modes, complex_values=True)
                    + complex_matmul_flops(batch * n * dim, modes, 1))
        inner = math.isqrt(max(n - 1, 0)) + 1
        outer = -(-n // inner)
        vandermonde = complex_matmul_flops(2 * dim * outer, modes, inner)
        convolution = fft_flops(2 * n, 2 * batch * dim + dim, real=True)
        return projection + vandermonde + convolution

    def __init__(self, dim: int, num_heads: int, *, state_size: int = 64, dt_min: float = 1e-3,
                 dt_max: float = 1e-1, bidirectional: bool = True, glu: bool = True, rngs: nnx.Rngs,
                 **common):
        super().__init__(dim, num_heads, bidirectional=bidirectional, glu=glu, rngs=rngs, **common)
        if state_size < 2 or state_size % 2:
            raise ConfigError(f"s4d needs an even state_size >= 2 (N/2 conjugate pairs), got {state_size}")
        if not 0 < dt_min <= dt_max:
            raise ConfigError(f"s4d needs 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.state_size, self.dt_min, self.dt_max = state_size, dt_min, dt_max
        modes, kernels = state_size // 2, self.directions
        self.log_dt = SSMParam(jax.random.uniform(rngs.params(), (dim,), minval=math.log(dt_min),
                                                  maxval=math.log(dt_max)))
        self.log_a_real = SSMParam(jnp.full((dim, modes), math.log(0.5)))  # Re A = -1/2
        self.a_imag = SSMParam(jnp.broadcast_to(jnp.pi * jnp.arange(modes, dtype=jnp.float32), (dim, modes)))
        # complex standard normal: real and imaginary parts N(0, 1/2); [kernels, H, N/2, (re, im)]
        self.c = nnx.Param(jax.random.normal(rngs.params(), (kernels, dim, modes, 2)) * np.sqrt(0.5))
        self.d = nnx.Param(jax.random.normal(rngs.params(), (dim,)))
        self.build_output(rngs)

    def kernel(self, length: int) -> Float[Array, "k h n"]:
        """The SSM convolution kernels (forward, then backward if bidirectional) for `length` steps."""
        c = self.c[...]
        return zoh_kernel(self.log_dt[...], self.log_a_real[...], self.a_imag[...],
                          jax.lax.complex(c[..., 0], c[..., 1]), length)

    def ssm(self, u: Float[Array, "b n d"]) -> Float[Array, "b n d"]:
        """y = K * u + D u in float32, before the activation (by FFT; causal: by its scan); u's padded rows
        must already be zero."""
        u = u.astype(jnp.float32)
        if self.bidirectional:
            y = fft_convolution(u, self.kernel(u.shape[1]))
        else:
            c = self.c[...]
            dta, weights = zoh(self.log_dt[...], self.log_a_real[...], self.a_imag[...],
                               jax.lax.complex(c[..., 0], c[..., 1]))
            y = diagonal_scan(u, jnp.exp(dta), 2.0 * weights[0])
        return y + self.d[...] * u
