"""Lightweight and dynamic convolutions (Wu et al. 2019, "Pay Less Attention with Lightweight
and Dynamic Convolutions", eq. 2-3 and Sec. 3), used as token mixers in place of attention.

LightConv (eq. 2): the d channels are split into H heads; head h has one kernel W_h of width k,
softmax-normalised over its width and shared by all d / H channels of the head:

    LightConv(X, W, i, c) = sum_{j=1..k} softmax(W_{h(c)})_j X_{i + j - ceil((k+1)/2), c},

a centred (non-causal) kernel, offsets -(k // 2) .. k - 1 - k // 2. DynamicConv (eq. 3)
predicts the kernel at every position i from the input there, W(i) = reshape(W^Q X_i) with
W^Q in R^{(H k) x d}, softmax-normalised over the width in the same way.

The module follows the paper's Sec. 3 block: a linear input projection d -> 2d with a GLU
(`glu=True`; `glu=False` uses a d -> d projection), the convolution, and a d -> d output
projection. Weight dropout ("DropConnect", Sec. 3): during training every entry of the
normalised kernel, separately per example and position, is dropped with probability
`dropout_rate` and the rest divided by 1 - p; never at evaluation.

Both are computed as a sum of k shifted copies of the input (`shifted_sum`), O(n k d) time and
O(n (d + H k)) memory, never an n x n matrix.

Padding. Padded rows of the convolution's input are zeroed first, so padded content never
reaches a real position, and a padded position inside a kernel's span contributes zero, exactly
as the zeros beyond either end of the sequence do (the paper's zero padding). The kernel is
*not* renormalised over the real positions it covers: a token next to padding or the sequence
end sees the same weights as elsewhere, with part of their mass on zeros; this keeps one
behaviour at both kinds of border. Appended padding therefore changes nothing at real
positions (`length_invariant` holds), and outputs at padded positions are zeroed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float

from lra_jax.attention.core import TokenMask, TokenMixer, Tokens, matmul_flops, merge_heads, split_heads, zero_padding
from lra_jax.attention.dropout import Dropout
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError


def shifted_sum(x: Float[Array, "b n h d"], weights: Float[Array, "#b #n h k"]) -> Float[Array, "b n h d"]:
    """out_i = sum_j weights_{i, j} x_{i + j - k // 2}, with zeros beyond both ends (a centred convolution).

    `weights` may broadcast over the batch and the positions (a static kernel) or vary with them
    (a dynamic kernel). Cost O(n k d) time and O(n (d + k)) memory, in the backward pass too:
    the k shifts are slices of one padded copy of x, and the gradient (`_shifted_sum_bwd`) is
    written as shifted sums as well instead of keeping the k products that autodiff would save.
    """
    dtype = jnp.result_type(x, weights)
    weights = jnp.broadcast_to(weights, (*x.shape[:3], weights.shape[-1]))
    return _shifted_sum(x.astype(dtype), weights.astype(dtype))


def _pad_length(x: Float[Array, "b n h d"], width: int) -> Float[Array, "b m h d"]:
    left = width // 2
    return jnp.pad(x, ((0, 0), (left, width - 1 - left), (0, 0), (0, 0)))


@jax.custom_vjp
def _shifted_sum(x: Float[Array, "b n h d"], weights: Float[Array, "b n h k"]) -> Float[Array, "b n h d"]:
    n, width = x.shape[1], weights.shape[-1]
    padded = _pad_length(x, width)
    out = jnp.zeros_like(x)
    for j in range(width):
        out = out + weights[..., j, None] * padded[:, j : j + n]
    return out


def _shifted_sum_fwd(x, weights):
    return _shifted_sum(x, weights), (x, weights)


def _shifted_sum_bwd(residuals, grad):
    """d/dw_{i,j} = g_i . x_{i+j-k//2};  d/dx_m = sum_j w_{m-j+k//2, j} g_{m-j+k//2} (a shifted sum of w_j g).

    d/dx is summed like the forward, over slices of one padded copy of g and of w (tap j read at
    offset k - 1 - j): XLA:CPU fuses that into one pass. Padding each product w_j g apart made it sum
    k padded arrays in a transposed fusion that took half of a Nystromformer train step."""
    x, weights = residuals
    n, width = x.shape[1], weights.shape[-1]
    padded = _pad_length(x, width)
    # One tap at a time (lax.map): a Python loop here lets XLA build all k products [b n h d k] at once.
    def tap(j):
        return jnp.sum(grad * jax.lax.dynamic_slice_in_dim(padded, j, n, axis=1), axis=-1)

    grad_weights = jnp.moveaxis(jax.lax.map(tap, jnp.arange(width)), 0, -1)
    left = width // 2
    reversed_pad = ((0, 0), (width - 1 - left, left), (0, 0), (0, 0))  # the forward's padding, mirrored
    grad_padded, weights_padded = jnp.pad(grad, reversed_pad), jnp.pad(weights, reversed_pad)
    grad_x = jnp.zeros_like(x)
    for offset in range(width):  # position m + offset of the padded arrays is m - j + k//2 for tap j
        j = width - 1 - offset
        grad_x = grad_x + weights_padded[:, offset : offset + n, :, j, None] * grad_padded[:, offset : offset + n]
    return grad_x, grad_weights


_shifted_sum.defvjp(_shifted_sum_fwd, _shifted_sum_bwd)


class _Convolution(TokenMixer):
    """Input projection (+ GLU), a per-head softmax-normalised convolution, output projection.

    Subclasses give `kernel_logits`, the unnormalised kernel for every position.
    """

    cost_exponent = 1.0  # n * kernel_size

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """The input projection (d -> 2d with the GLU, else d -> d), the output projection, and the convolution:
        k multiply-adds per channel and position (2 n d k, a banded matmul, counted as one)."""
        width_in = 2 * dim if settings["glu"] else dim
        return (matmul_flops(batch * n, dim, width_in) + matmul_flops(batch * n, dim, dim)
                + matmul_flops(batch * n * dim, settings["kernel_size"], 1))

    def __init__(self, dim: int, num_heads: int, *, rngs: nnx.Rngs, kernel_size: int, glu: bool, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if kernel_size < 1:
            raise ConfigError(f"{self.variant_name} needs kernel_size >= 1, got {kernel_size}")
        self.kernel_size = kernel_size
        self.glu = glu
        self.proj_in = nnx.Linear(dim, 2 * dim if glu else dim, dtype=self.dtype, rngs=rngs)
        self.proj_out = nnx.Linear(dim, dim, dtype=self.dtype, rngs=rngs)
        self.weight_dropout = Dropout(self.dropout_rate)

    def mixing_pairs(self, n: int) -> Bool[np.ndarray, "n n"]:
        """The kernel's span: offsets j - i from -(k // 2) to k - 1 - k // 2."""
        offset = np.arange(n)[None, :] - np.arange(n)[:, None]
        left = self.kernel_size // 2
        return (offset >= -left) & (offset <= self.kernel_size - 1 - left)

    def kernel_logits(self, x: Float[Array, "b n d"]) -> Float[Array, "#b #n h k"]:
        raise NotImplementedError

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        x = self.proj_in(x)
        if self.glu:
            x = jax.nn.glu(x, axis=-1)
        x = zero_padding(x, mask)
        kernel = jax.nn.softmax(self.kernel_logits(x).astype(jnp.float32), axis=-1)
        kernel = jnp.broadcast_to(kernel, (*mask.shape, self.num_heads, self.kernel_size))
        kernel = self.weight_dropout(kernel, deterministic=deterministic, rngs=rngs)
        y = shifted_sum(split_heads(x, self.num_heads), kernel.astype(x.dtype))
        return zero_padding(self.proj_out(merge_heads(y)), mask)


@register("lightweight_conv")
class LightweightConv(_Convolution):
    """LightConv: one softmax-normalised kernel per head, shared by its channels (see module docstring).

    Args:
      dim: model width.
      num_heads: H, heads of the convolution (channels per head: dim / H).
      kernel_size: k, the kernel width; 31 is the paper's widest (its encoders use
        3, 7, 15, 31, 31, 31, 31 from bottom to top; LRA has no official setting).
      glu: GLU after the input projection (the paper's block).
      rngs: parameter initialisation keys.
      **common: shared settings of `TokenMixer`; `dropout_rate` is the weight dropout.
    """

    def __init__(
        self, dim: int, num_heads: int, *, rngs: nnx.Rngs, kernel_size: int = 31, glu: bool = True, **common
    ):
        super().__init__(dim, num_heads, rngs=rngs, kernel_size=kernel_size, glu=glu, **common)
        init = nnx.initializers.xavier_uniform()
        self.kernel = nnx.Param(init(rngs.params(), (num_heads, kernel_size)))

    def kernel_logits(self, x):
        return self.kernel[...][None, None]


@register("dynamic_conv")
class DynamicConv(_Convolution):
    """DynamicConv: the kernel of every position predicted from the input there (see module docstring).

    Args:
      dim: model width.
      num_heads: H, heads of the convolution (channels per head: dim / H).
      kernel_size: k, the kernel width (31, as `lightweight_conv`).
      glu: GLU after the input projection (the paper's block).
      rngs: parameter initialisation keys.
      **common: shared settings of `TokenMixer`; `dropout_rate` is the weight dropout.
    """

    def __init__(
        self, dim: int, num_heads: int, *, rngs: nnx.Rngs, kernel_size: int = 31, glu: bool = True, **common
    ):
        super().__init__(dim, num_heads, rngs=rngs, kernel_size=kernel_size, glu=glu, **common)
        # W^Q of eq. 3, without a bias as in the paper's f(X_i) = W^Q X_i.
        self.predict = nnx.Linear(dim, num_heads * kernel_size, use_bias=False, dtype=self.dtype, rngs=rngs)

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """`lightweight_conv`'s, plus the kernel prediction W^Q X ([n, d] x [d, H k])."""
        prediction = matmul_flops(batch * n, dim, num_heads * settings["kernel_size"])
        return super().forward_flops(batch, n, dim, num_heads, settings) + prediction

    def kernel_logits(self, x):
        return self.predict(x).reshape(*x.shape[:2], self.num_heads, self.kernel_size)
