"""Mamba's selective state space (S6; Gu and Dao 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces", arXiv:2312.00752), a token mixer: the whole Mamba block in place of attention.

The block (Fig. 3 of the paper), on the inner width E = expand · d:

    x, z = in_proj(u)                       (d -> 2E, no bias)
    x = SiLU(conv(x))                       (depthwise convolution over `conv_kernel` steps, causal)
    y = SSM(x) ⊙ SiLU(z),   out = out_proj(y)   (E -> d, no bias)

The selective SSM (Algorithm 2): per step t, from x_t,
    Δ_t = softplus(W_Δ (W_r x_t) + b_Δ)   [E]     (a rank-R bottleneck, R = ceil(d / 16))
    B_t = W_B x_t,  C_t = W_C x_t         [N]
    Ā_t = exp(Δ_t A),   B̄_t x_t = Δ_t B_t x_t   (zero-order hold for A; Mamba's simplified B)       (4)
    h_t = Ā_t ⊙ h_{t-1} + B̄_t x_t   [E, N],    y_t = C_t h_t + D ⊙ x_t                            (2a, 2b)
with A = -exp(A_log) real and diagonal, initialised S4D-Real (A_n = -(n + 1)); D = 1; b_Δ the inverse
softplus of Δ_0 = exp(U[log dt_min, log dt_max]) (at least 1e-4); W_Δ uniform in ±R^-½.
A_log and D are `SSMParam`s (no weight decay, the state-space rate).

The scan is the selective-scan kernel op (`lra_jax.kernels.selective_scan`): on a GPU target its Pallas
Triton kernel, one program per block of channels walking the steps with their [E_blk, N] states on chip
(forward and backward, nothing stored but the inputs); elsewhere its XLA form, in chunks of C steps with a
parallel scan inside each chunk, each chunk recomputed in the backward pass: memory O(n E + (n / C) E N)
instead of O(n E N).

Bidirectional (LRA): a second SSM with its own convolution, projections, A and D runs from the end
(its convolution anti-causal), and the two outputs are summed before the gate, in the style of
bidirectional Mamba encoders. The padded inputs are zeroed before each convolution and after it, so
the backward SSM carries a zero state through appended padding and its convolution sees zeros there.
`bidirectional=False` is the causal form.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from lra_jax.attention.recurrent import diagonal
from lra_jax.attention.core import BidirectionalMixer, SSMParam, TokenMask, Tokens, matmul_flops, zero_padding
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError
from lra_jax.kernels.selective_scan.api import SELECTIVE_SCAN, selective_scan

ScanForm = Callable[..., Float[Array, "b n e"]]  # form(Δ, A, x, B, C, *, chunk) -> y, one direction from the start


def inverse_softplus(y: Array) -> Array:
    """x with softplus(x) = y, for y > 0: y + log(1 - exp(-y))."""
    return y + jnp.log(-jnp.expm1(-y))


def causal_depthwise_conv(x: Float[Array, "b n e"], kernel: Float[Array, "k e"], *, reverse: bool = False):
    """y_t = Σ_j kernel[j] x_{t-j} (x_{t+j} when `reverse`), zeros before the start (after the end)."""
    k = kernel.shape[0]
    padded = jnp.pad(x, ((0, 0), (0, k - 1) if reverse else (k - 1, 0), (0, 0)))
    n = x.shape[1]
    if reverse:
        return sum(kernel[j] * padded[:, j:j + n] for j in range(k))
    return sum(kernel[j] * padded[:, k - 1 - j:k - 1 - j + n] for j in range(k))


class SelectiveSSM(nnx.Module):
    """One direction of S6: the convolution, the input-dependent Δ, B, C and the scan, on [b n E]."""

    def __init__(self, inner: int, state_size: int, dt_rank: int, conv_kernel: int, dt_min: float, dt_max: float,
                 *, chunk: int, reverse: bool, rngs: nnx.Rngs):
        self.reverse, self.state_size, self.dt_rank, self.chunk = reverse, state_size, dt_rank, chunk
        conv_key, dt_key, bias_key = jax.random.split(rngs.params(), 3)
        bound = 1.0 / math.sqrt(conv_kernel)  # a depthwise convolution's fan-in
        self.conv_kernel = nnx.Param(jax.random.uniform(conv_key, (conv_kernel, inner), minval=-bound, maxval=bound))
        self.conv_bias = nnx.Param(jnp.zeros((inner,)))
        self.x_proj = nnx.Linear(inner, dt_rank + 2 * state_size, use_bias=False, rngs=rngs)
        scale = dt_rank**-0.5
        self.dt_weight = nnx.Param(jax.random.uniform(dt_key, (dt_rank, inner), minval=-scale, maxval=scale))
        dt = jnp.exp(jax.random.uniform(bias_key, (inner,), minval=math.log(dt_min), maxval=math.log(dt_max)))
        self.dt_bias = nnx.Param(inverse_softplus(jnp.maximum(dt, 1e-4)))
        self.a_log = SSMParam(jnp.log(jnp.broadcast_to(jnp.arange(1, state_size + 1, dtype=jnp.float32),
                                                       (inner, state_size))))
        self.d = SSMParam(jnp.ones((inner,)))

    def __call__(self, x: Float[Array, "b n e"], real: Float[Array, "b n 1"], form: ScanForm) -> Float[Array, "b n e"]:
        """The SSM output y [b n E] in float32, x's padded rows zero (`real`: 1 on real tokens); `form` computes
        the scan from the start (the backward direction flips its inputs and its output around it)."""
        x = causal_depthwise_conv(x, self.conv_kernel[...], reverse=self.reverse) + self.conv_bias[...]
        x = jax.nn.silu(x) * real
        low_rank, b, c = jnp.split(self.x_proj(x), [self.dt_rank, self.dt_rank + self.state_size], axis=-1)
        dt = jax.nn.softplus(low_rank @ self.dt_weight[...] + self.dt_bias[...])  # [b n E]
        flip = (lambda v: jnp.flip(v, axis=1)) if self.reverse else (lambda v: v)
        y = flip(form(flip(dt), -jnp.exp(self.a_log[...]), flip(x), flip(b), flip(c), chunk=self.chunk))
        return y + self.d[...] * x


@register("s6")
class S6(BidirectionalMixer):
    """Mamba's block with the selective SSM (S6), bidirectional: see the module docstring. The scan is the
    selective-scan op's Triton kernel on a GPU target, XLA elsewhere; it runs one direction, so the causal
    form (bidirectional=False) takes the kernel too.

    Args:
      dim: model width d.
      num_heads: accepted for the common contract; unused.
      state_size: N, the state per inner channel (16 in the paper).
      expand: E = expand · d, the inner width (2 in the paper).
      conv_kernel: the depthwise convolution's length (4 in the paper).
      dt_rank: R, the rank of Δ's projection; 0 means ceil(d / 16), the paper's.
      dt_min, dt_max: the range of the initial Δ (log-uniform).
      chunk: C, the steps the XLA form scans at once (`lra_jax.kernels.selective_scan.reference.chunked`).
      bidirectional: add the backward SSM (LRA); False gives the causal layer.
    """

    kernel_op = SELECTIVE_SCAN  # Triton only (none for TPU)
    kernel_serves_causal = True

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """The projections in and out; per direction x_proj and Δ's up-projection, the convolution (a
        multiply-add per tap), per state Δ A and (Δ x) B (a multiply each), the scan (`diagonal.scan_flops`)
        and the readout C h (a multiply-add)."""
        inner, state = settings["expand"] * dim, settings["state_size"]
        rank = settings["dt_rank"] or math.ceil(dim / 16)
        directions = cls.directions_of(settings)
        tokens = batch * n
        per_direction = (matmul_flops(tokens, inner, rank + 2 * state) + matmul_flops(tokens, rank, inner)
                         + 2 * tokens * inner * settings["conv_kernel"] + 4 * tokens * inner * state
                         + diagonal.scan_flops(batch, n, inner * state, complex_values=False))
        return matmul_flops(tokens, dim, 2 * inner) + matmul_flops(tokens, inner, dim) + directions * per_direction

    def __init__(self, dim: int, num_heads: int, *, state_size: int = 16, expand: int = 2, conv_kernel: int = 4,
                 dt_rank: int = 0, dt_min: float = 1e-3, dt_max: float = 1e-1, chunk: int = 16,
                 bidirectional: bool = True, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, bidirectional=bidirectional, rngs=rngs, **common)
        if min(state_size, expand, conv_kernel, chunk) < 1 or dt_rank < 0:
            raise ConfigError(f"s6 needs state_size, expand, conv_kernel and chunk >= 1 and dt_rank >= 0, got "
                              f"state_size={state_size}, expand={expand}, conv_kernel={conv_kernel}, chunk={chunk}, "
                              f"dt_rank={dt_rank}")
        if not 0 < dt_min <= dt_max:
            raise ConfigError(f"s6 needs 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.state_size, self.expand, self.conv_kernel, self.dt_min, self.dt_max = (state_size, expand, conv_kernel,
                                                                                   dt_min, dt_max)
        self.dt_rank, self.chunk = dt_rank, chunk
        inner, rank = expand * dim, dt_rank or math.ceil(dim / 16)
        self.in_proj = nnx.Linear(dim, 2 * inner, use_bias=False, dtype=self.dtype, rngs=rngs)
        self.ssms = nnx.List([SelectiveSSM(inner, state_size, rank, conv_kernel, dt_min, dt_max, chunk=chunk,
                                           reverse=reverse, rngs=rngs) for reverse in (False, True)[:self.directions]])
        self.out_proj = nnx.Linear(inner, dim, use_bias=False, dtype=self.dtype, rngs=rngs)

    def mix(self, u: Float[Array, "b n d"], mask: TokenMask, form: ScanForm | None = None) -> Float[Array, "b n d"]:
        """The block's output before the padding is zeroed; `form` computes each direction's scan (default: the
        layer's plan of the selective-scan op)."""
        form = form or functools.partial(selective_scan, plan=self.kernel_plan(deterministic=True))
        real = mask[..., None].astype(jnp.float32)
        x, z = jnp.split(self.in_proj(u).astype(jnp.float32), 2, axis=-1)
        x = x * real  # the convolutions see zeros on padding
        y = sum(ssm(x, real, form) for ssm in self.ssms)
        return self.out_proj((y * jax.nn.silu(z)).astype(u.dtype))

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        return zero_padding(self.mix(x, mask), mask)
