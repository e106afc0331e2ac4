"""Hyena (Poli et al. 2023, "Hyena Hierarchy: Towards Larger Convolutional Language Models",
arXiv:2302.10866), a token mixer: long convolutions with implicitly parameterised filters, interleaved
with data-controlled gates.

The operator of order N (Sec. 3.1, eq. 7): from N + 1 projections (v, x_1 .. x_N) of the input, each
through a short depthwise convolution,

    z^1 = v,    z^{i+1} = x_i ⊙ (h_i * z^i),    y = out_proj(z^{N+1}),

where each h_i is a long filter with a value per lag and channel, generated (Sec. 3.3, eq. 8) as

    h_t = window(t) · FFN(PE(t)),   PE(t) = [t / L, cos(2π k t / L), sin(2π k t / L)]_{k=1..K},
    window(t) = exp(-α |t|) + bias,

an MLP with sine activations over a positional encoding, L = `max_len`, α spread from slow to fast decay
across the channels. The convolution is computed by FFT over 2n points (`ssm.fft_convolution`): linear,
never circular, O(n log n).

Bidirectional (LRA): each filter has a causal part (lags 0 .. n-1) and an anti-causal part (lags -1 ..
-(n-1), a second set of FFN outputs), so every position mixes the whole sequence. Padded positions of every
projection are zeroed before each convolution, and the filter at a lag does not depend on the sequence's
length, so appended padding changes nothing at real positions.

`bidirectional=False` is the causal form. One FFT over the sequence would let every output read every input
through its rounding (derivatives of ~1e-7 of the largest in float32 towards later inputs), so the causal
convolution is computed in blocks that never mix a later input into an earlier output (`causal_convolution`):
exactly causal, O(n log² n).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from lra_jax.attention.core import BidirectionalMixer, TokenMask, Tokens, fft_flops, matmul_flops, zero_padding
from lra_jax.attention.registry import register
from lra_jax.attention.recurrent.selective import causal_depthwise_conv
from lra_jax.attention.recurrent.ssm import fft_convolution
from lra_jax.errors import ConfigError


def direct_convolution(u: Float[Array, "b n h"], kernel: Float[Array, "k h n"]) -> Float[Array, "b n h"]:
    """The sums `ssm.fft_convolution` computes, term by term (O(n²)): the reference of the FFT form."""
    n = u.shape[1]
    lag = jnp.arange(n)[:, None] - jnp.arange(n)[None, :]  # t - s
    weights = jnp.where(lag >= 0, kernel[0][:, jnp.clip(lag, 0, n - 1)], 0.0)  # [h t s]
    if kernel.shape[0] == 2:
        weights = weights + jnp.where(lag < 0, kernel[1][:, jnp.clip(-lag - 1, 0, n - 1)], 0.0)
    return jnp.einsum("hts,bsh->bth", weights, u)


CAUSAL_BLOCK = 16  # the diagonal blocks of `causal_convolution`, summed directly


def causal_blocks(n: int, block: int = CAUSAL_BLOCK) -> tuple[int, int]:
    """(diagonal block B, padded length B · 2^levels >= n) of `causal_convolution` at length n."""
    base = max(1, min(block, n))
    return base, base * 2 ** math.ceil(math.log2(-(-n // base)))


def causal_convolution(u: Float[Array, "b n h"], kernel: Float[Array, "1 h n"], block: int = CAUSAL_BLOCK
                       ) -> Float[Array, "b n h"]:
    """y_t = sum_{s <= t} kernel_{t-s} u_s in float32, with no path from a later input to an earlier output.

    The lower triangle of the Toeplitz matrix is cut into squares, as in an online ("relaxed") convolution:
    lower-triangular diagonal blocks of `block` positions, summed directly, and at each size S = block, 2 block, ..
    the squares that map input block 2k of S positions to output block 2k + 1. Every square is the same Toeplitz
    block of lags 1 .. 2S - 1, applied by an FFT of 2S points to the earlier block alone, so the rounding of a
    transform stays among inputs that all precede its outputs: dy_t / du_s is exactly zero for s > t.
    Time O(n log² n) (log2(n / block) sizes of O(n log n) transforms); memory O(n) per size.
    """
    b, n, h = u.shape
    base, padded = causal_blocks(n, block)
    u = jnp.pad(u.astype(jnp.float32), ((0, 0), (0, padded - n), (0, 0)))
    kernel = jnp.pad(kernel[0].astype(jnp.float32), ((0, 0), (0, padded - n)))  # lags >= n reach outputs >= n only
    lag = jnp.arange(base)[:, None] - jnp.arange(base)[None, :]
    diagonal = jnp.where(lag >= 0, kernel[:, jnp.clip(lag, 0, base - 1)], 0.0)  # [h t s], zero above the diagonal
    y = jnp.einsum("hts,bcsh->bcth", diagonal, u.reshape(b, padded // base, base, h)).reshape(b, padded, h)
    size = base
    while size < padded:
        earlier = u.reshape(b, padded // (2 * size), 2, size, h)[:, :, 0]  # input blocks 2k, [b K S h]
        # output t' of block 2k + 1 reads input s' of block 2k at lag S + t' - s' = 1 + (S - 1 + t' - s'):
        # entry S - 1 + t' of the linear convolution with lags 1 .. 2S - 1, which 2S points hold unwrapped
        lags = jnp.fft.rfft(kernel[:, 1 : 2 * size], n=2 * size, axis=-1).T  # [S+1 h]
        square = jnp.fft.irfft(jnp.fft.rfft(earlier, n=2 * size, axis=2) * lags, n=2 * size, axis=2)
        later = square[:, :, size - 1 : 2 * size - 1]
        y = y + jnp.stack([jnp.zeros_like(later), later], axis=2).reshape(b, padded, h)
        size *= 2
    return y[:, :n]


class ImplicitFilter(nnx.Module):
    """The long filters of eq. 8: [k, channels, n] for lags 0 .. n-1 (k = 2 with the anti-causal part)."""

    def __init__(self, channels: int, directions: int, max_len: int, *, features: int, hidden: int,
                 frequency: float, rngs: nnx.Rngs):
        self.channels, self.directions, self.max_len, self.features, self.frequency = (channels, directions, max_len,
                                                                                       features, frequency)
        self.layers = nnx.List([nnx.Linear(1 + 2 * features, hidden, rngs=rngs), nnx.Linear(hidden, hidden, rngs=rngs),
                                nnx.Linear(hidden, directions * channels, rngs=rngs)])
        self.bias = nnx.Param(jnp.zeros((channels,)))

    def decay(self) -> Float[Array, "h"]:
        """-α per channel, slow to fast: the window falls to 1e-2 within L .. L / 10 lags."""
        return jnp.linspace(math.log(1e-2) / self.max_len, 10 * math.log(1e-2) / self.max_len, self.channels)

    def __call__(self, n: int) -> Float[Array, "k h n"]:
        t = jnp.arange(n, dtype=jnp.float32)[:, None]
        k = jnp.arange(1, self.features + 1, dtype=jnp.float32)[None, :]
        angle = 2 * math.pi * k * t / self.max_len
        h = jnp.concatenate([t / self.max_len, jnp.cos(angle), jnp.sin(angle)], axis=-1)  # PE(t), [n 1+2K]
        for layer in self.layers[:-1]:
            h = jnp.sin(self.frequency * layer(h))
        h = self.layers[-1](h).reshape(n, self.directions, self.channels)
        lags = t + jnp.arange(self.directions, dtype=jnp.float32)  # the anti-causal part starts at lag -1
        window = jnp.exp(self.decay()[None, None, :] * lags[:, :, None]) + self.bias[...]  # [n k h]
        return jnp.transpose(h * window, (1, 2, 0))


@register("hyena")
class Hyena(BidirectionalMixer):
    """The Hyena operator of order `order`, bidirectional: see the module docstring.

    Args:
      dim: model width d; num_heads: accepted for the contract; unused.
      max_len: L, the longest sequence (the positional encoding's period).
      order: N, the number of long convolutions and gates (2 in the paper).
      short_kernel: the short depthwise convolution's length (3).
      filter_features: K, the positional encoding's frequencies; filter_hidden: the filter MLP's width;
      filter_frequency: the sine activation's frequency.
      bidirectional: the anti-causal part of the filters (LRA); False gives the causal layer.
    """

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """The projections in ((N + 1) d) and out, the short convolution (a multiply-add per tap), the filter
        MLP (per lag), the gates, and per order the long convolution. Bidirectional: rfft of the input and the
        filter and irfft over 2n points (`core.fft_flops`) and the product of the transforms (a complex multiply,
        6 FLOPs). Causal (`causal_convolution`, over the padded length P): the diagonal blocks' products, and at
        each size S the same three transforms over 2S points for the P / 2S squares, and their products."""
        order, tokens = settings["order"], batch * n
        width = (order + 1) * dim
        hidden, features = settings["filter_hidden"], settings["filter_features"]
        directions = cls.directions_of(settings)
        mlp = matmul_flops(n, 1 + 2 * features, hidden) + matmul_flops(n, hidden, hidden) + matmul_flops(
            n, hidden, directions * order * dim)
        if directions == 2:
            convolution = order * (fft_flops(2 * n, 2 * batch * dim + dim, real=True) + 6 * batch * (n + 1) * dim)
        else:
            base, padded = causal_blocks(n)
            convolution, size = matmul_flops(batch * padded, base, dim), base
            while size < padded:
                squares = padded // (2 * size)
                convolution += (fft_flops(2 * size, 2 * batch * dim * squares + dim, real=True)
                                + 6 * batch * squares * (size + 1) * dim)
                size *= 2
            convolution *= order
        return (matmul_flops(tokens, dim, width) + matmul_flops(tokens, dim, dim) + 2 * tokens * width *
                settings["short_kernel"] + mlp + convolution + order * tokens * dim)

    def __init__(self, dim: int, num_heads: int, *, order: int = 2, short_kernel: int = 3, filter_features: int = 8,
                 filter_hidden: int = 64, filter_frequency: float = 1.0, bidirectional: bool = True,
                 rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, bidirectional=bidirectional, rngs=rngs, **common)
        if self.max_len is None:
            raise ConfigError("hyena needs max_len (its filters' positional encoding has period max_len)")
        if min(order, short_kernel, filter_features, filter_hidden) < 1:
            raise ConfigError(f"hyena needs order, short_kernel, filter_features and filter_hidden >= 1, got "
                              f"order={order}, short_kernel={short_kernel}, filter_features={filter_features}, "
                              f"filter_hidden={filter_hidden}")
        self.order, self.short_kernel, self.filter_features = order, short_kernel, filter_features
        self.filter_hidden, self.filter_frequency = filter_hidden, filter_frequency
        width = (order + 1) * dim
        self.in_proj = nnx.Linear(dim, width, dtype=self.dtype, rngs=rngs)
        bound = 1.0 / math.sqrt(short_kernel)
        self.short_filter = nnx.Param(jax.random.uniform(rngs.params(), (short_kernel, width), minval=-bound,
                                                         maxval=bound))
        self.filters = ImplicitFilter(order * dim, self.directions, self.max_len, features=filter_features,
                                      hidden=filter_hidden, frequency=filter_frequency, rngs=rngs)
        self.out_proj = nnx.Linear(dim, dim, dtype=self.dtype, rngs=rngs)

    def mix(self, x: Tokens, mask: TokenMask, convolve=None) -> Float[Array, "b n d"]:
        """z^{N+1} [b n d] in float32; `convolve` is the long convolution: by default `ssm.fft_convolution`, and
        `causal_convolution` in the causal form (`direct_convolution` in tests)."""
        convolve = convolve or (fft_convolution if self.bidirectional else causal_convolution)
        real = mask[..., None].astype(jnp.float32)
        projections = causal_depthwise_conv(self.in_proj(x).astype(jnp.float32) * real, self.short_filter[...])
        v, *gates = jnp.split(projections * real, self.order + 1, axis=-1)
        filters = self.filters(x.shape[1]).reshape(-1, self.order, self.dim, x.shape[1])  # [k N d n]
        z = v
        for i, gate in enumerate(gates):
            z = gate * convolve(z * real, filters[:, i])
        return z

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        return zero_padding(self.out_proj(self.mix(x, mask).astype(x.dtype)), mask)
