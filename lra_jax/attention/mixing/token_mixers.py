"""Attention-free token mixers: MLP-Mixer, FNet and gMLP.

None of these has queries or keys: each mixes the sequence with a fixed-shape
operator, so they subclass `TokenMixer` and implement `__call__` directly. All
three zero the padded rows *before* mixing, so padded content never reaches a
real position; the output is zeroed again at padded positions.

MLP-Mixer (Tolstikhin et al. 2021, "MLP-Mixer: An all-MLP Architecture for Vision",
eq. 1, token-mixing MLP), applied per channel c along the length:

    Y[:, c] = W2 gelu(W1 X[:, c] + b1) + b2,   W1 [hidden, max_len], W2 [max_len, hidden],

with the first n columns of W1 and rows of W2 for a length-n input. O(n * hidden * d).

FNet (Lee-Thorp et al. 2021, "FNet: Mixing Tokens with Fourier Transforms", eq. 3):

    Y = Re(FFT_seq(FFT_hidden(X))),

O(n d log(n d)) time and O(n d) memory, no parameters in the paper (see `FNet`).

gMLP spatial gating unit (Liu et al. 2021, "Pay Attention to MLPs", eq. 2-3):

    Z = gelu(X W_in),  Z = [Z1, Z2],  s(Z) = Z1 * (W_s LayerNorm(Z2) + b),  Y = s(Z) W_out,

with W_s [max_len, max_len] sliced to [:n, :n]. O(n^2 d) time, O(n^2 + n d) memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from lra_jax.attention.core import TokenMask, TokenMixer, Tokens, fft_flops, matmul_flops, zero_padding
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError


def _require_max_len(layer: TokenMixer, what: str) -> int:
    if layer.max_len is None:
        raise ConfigError(
            f"{layer.variant_name} {what} and needs the longest length: "
            "pass max_len (the model sets it from the task's max_len)"
        )
    return layer.max_len


def _check_length(layer: TokenMixer, n: int) -> None:
    if n > layer.max_len:
        raise ConfigError(
            f"{layer.variant_name} was built for sequences of at most max_len={layer.max_len} tokens "
            f"but got {n}; build it with a larger max_len"
        )


@register("mixer")
class MLPMixer(TokenMixer):
    """MLP-Mixer token mixing: one MLP along the length, shared by every channel.

    Padding: padded rows are zeroed before the MLP, so padded content and appended
    padding only ever meet further columns of W1 with zeros: the hidden units
    W1 X + b1 are unchanged, and a real output row i reads only row i of W2 and b2.
    Real outputs are therefore invariant to both (`length_invariant` holds). The
    layer is tied to lengths <= `max_len` (one weight column per position).
    There are no attention weights, so `dropout_rate` is unused.

    Args:
      dim: model width.
      num_heads: accepted for the common contract; unused.
      hidden: width of the token-mixing MLP (the paper's D_S).
      rngs: parameter initialisation keys.
      **common: shared settings of `TokenMixer`; `max_len` is required.

    Raises:
      ConfigError: if max_len is not given, or hidden < 1.
    """

    cost_exponent = 1.0  # n * hidden

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """W1 X and W2 gelu(.) per example ([hidden, n] x [n, d], [n, hidden] x [hidden, d]): 2 x 2 hidden n d."""
        return 2 * matmul_flops(batch * settings["hidden"], n, dim)

    def __init__(self, dim: int, num_heads: int, *, hidden: int = 256, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        max_len = _require_max_len(self, "mixes along the sequence axis")
        if hidden < 1:
            raise ConfigError(f"mixer hidden width must be >= 1, got hidden={hidden}")
        self.hidden = hidden
        self.w1 = nnx.Param(nnx.initializers.normal(stddev=max_len**-0.5)(rngs.params(), (hidden, max_len)))
        self.b1 = nnx.Param(jnp.zeros((hidden,)))
        self.w2 = nnx.Param(nnx.initializers.normal(stddev=hidden**-0.5)(rngs.params(), (max_len, hidden)))
        self.b2 = nnx.Param(jnp.zeros((max_len,)))

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        n = x.shape[1]
        _check_length(self, n)
        dt = x.dtype
        x = zero_padding(x, mask)
        h = jnp.einsum("kn,bnd->bkd", self.w1[...][:, :n].astype(dt), x) + self.b1[...].astype(dt)[:, None]
        y = jnp.einsum("nk,bkd->bnd", self.w2[...][:n].astype(dt), jax.nn.gelu(h)) + self.b2[...][:n].astype(dt)[:, None]
        return zero_padding(y, mask)


@register("fnet")
class FNet(TokenMixer):
    """FNet Fourier mixing: the real part of a 2-D DFT over (length, hidden).

    Padding: padded rows are zeroed first, so their content never reaches a real
    output. Appended padding, however, changes the transform itself: the DFT over
    a length-N axis has frequencies 2 pi k / N, so the same real tokens followed by
    more zeros give different real outputs. `length_invariant` is therefore False
    (the model's padded length is fixed by the task, so training and evaluation
    see the same N).

    The paper's Fourier sublayer has no parameters. With `out_proj=True` (default)
    an output projection W^O follows, as in multi-head attention (Vaswani et al.
    2017, eq. 2), so that the sublayer has parameters to train (the contract's
    gradient check needs some); `out_proj=False` gives the paper's sublayer. The
    FFT runs in float32 / complex64 whatever the computation dtype. No attention
    weights, so `dropout_rate` is unused.

    Args:
      dim: model width.
      num_heads: accepted for the common contract; unused.
      out_proj: apply a learned [d, d] output projection after the transform.
      rngs: parameter initialisation keys.
      **common: shared settings of `TokenMixer`.
    """

    length_invariant = False
    cost_exponent = 1.0  # n log n

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """No matmul but the optional output projection (2 n d d): the two complex FFTs are counted by the
        5 N log2 N convention (`core.fft_flops`), n transforms of d points and d of n, 5 n d log2(n d)."""
        transforms = fft_flops(dim, batch * n) + fft_flops(n, batch * dim)
        return transforms + (matmul_flops(batch * n, dim, dim) if settings["out_proj"] else 0.0)

    def __init__(self, dim: int, num_heads: int, *, out_proj: bool = True, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        self.out_proj = out_proj
        self.out = nnx.Linear(dim, dim, dtype=self.dtype, rngs=rngs) if out_proj else None

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        z = zero_padding(x, mask).astype(jnp.float32)
        y = jnp.real(jnp.fft.fft(jnp.fft.fft(z, axis=-1), axis=-2)).astype(x.dtype)
        if self.out is not None:
            y = self.out(y)
        return zero_padding(y, mask)


@register("gmlp")
class GatedMLP(TokenMixer):
    """gMLP spatial gating unit, used as the token mixer of our pre-LN block.

    U = gelu(X W_in) has `expansion * d` channels, split into halves Z1, Z2; Z2 is
    layer-normalised, its padded rows zeroed, and mixed along the length by
    W_s [:n, :n] + b (W_s initialised near zero and b to ones, as the paper
    prescribes, so the unit starts close to an ordinary channel MLP); the gate
    multiplies Z1 and W_out maps back to d.

    Padding: W_s only ever meets padded rows of Z2 after they are zeroed, so
    padded content contributes nothing; appended padding adds columns of W_s that
    multiply those zeros, and a real row i reads only row i of W_s and b: real
    outputs are invariant to both (`length_invariant` holds). Lengths are limited
    to `max_len`. No attention weights, so `dropout_rate` is unused.

    Args:
      dim: model width.
      num_heads: accepted for the common contract; unused.
      expansion: channels of U as a multiple of d (Z1 and Z2 get half each).
      rngs: parameter initialisation keys.
      **common: shared settings of `TokenMixer`; `max_len` is required.

    Raises:
      ConfigError: if max_len is not given, or expansion * dim is not a positive even number.
    """

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """With e = expansion d channels: X W_in (2 n d e), W_s Z2 ([n, n] x [n, e / 2]) and the gated
        output projection (2 n (e / 2) d)."""
        width = settings["expansion"] * dim
        return (matmul_flops(batch * n, dim, width) + matmul_flops(batch * n, n, width // 2)
                + matmul_flops(batch * n, width // 2, dim))

    def __init__(self, dim: int, num_heads: int, *, expansion: int = 2, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        max_len = _require_max_len(self, "mixes along the sequence axis")
        width = expansion * dim
        if width < 2 or width % 2:
            raise ConfigError(f"gmlp needs expansion * dim even and >= 2, got {expansion} * {dim}")
        self.expansion = expansion
        self.proj_in = nnx.Linear(dim, width, dtype=self.dtype, rngs=rngs)
        self.norm = nnx.LayerNorm(width // 2, dtype=self.dtype, rngs=rngs)
        eps = 1e-3  # "near-zero" initial spatial weights (paper, Sec. 2.1)
        self.spatial = nnx.Param(jax.random.uniform(rngs.params(), (max_len, max_len), minval=-eps, maxval=eps))
        self.spatial_bias = nnx.Param(jnp.ones((max_len,)))
        self.proj_out = nnx.Linear(width // 2, dim, dtype=self.dtype, rngs=rngs)

    def spatial_weights(self, n: int) -> Float[Array, "n n"]:
        """The [n, n] block of W_s used for a length-n input."""
        _check_length(self, n)
        return self.spatial[...][:n, :n]

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        n = x.shape[1]
        dt = x.dtype
        u = jax.nn.gelu(self.proj_in(zero_padding(x, mask)))
        z1, z2 = jnp.split(u, 2, axis=-1)
        z2 = zero_padding(self.norm(z2), mask)
        gate = jnp.einsum("mn,bnc->bmc", self.spatial_weights(n).astype(dt), z2)
        gate = gate + self.spatial_bias[...][:n].astype(dt)[:, None]
        return zero_padding(self.proj_out(z1 * gate), mask)
