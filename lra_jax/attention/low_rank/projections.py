"""Low-rank attention: Linformer and Nystromformer.

Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity").

Eq. 7 of the paper projects keys and values along the sequence axis down to k
rows with learned matrices E, F (n x k here, applied as E^T K, F^T V):

    head = softmax(Q (E^T K)^T / sqrt(d)) (F^T V),

costing O(n * k) time and memory. E and F are shared across heads (the paper's
"headwise sharing"); `share_kv=True` also ties F = E ("key-value sharing").

Padding: keys and values are zeroed at padded positions *before* the
projection, so padded content contributes nothing, and appended padding only
meets further rows of E and F with zeros: real outputs are unchanged by either.
What cannot hold is independence of the length itself beyond `max_len`: E and F
have one row per position, so the layer is built for sequences of at most
`max_len` tokens (a shorter input uses the first n rows). The original LRA
Linformer ignored the padding mask altogether, so padded tokens were mixed into
every projected key and value.

Nystromformer (Xiong et al. 2021, "Nystromformer: A Nystrom-Based Algorithm for Approximating
Self-Attention", eq. 14 with the pseudo-inverse of eq. 15). With m landmarks Q~, K~ (segment
means of the queries and keys),

    S^ V = softmax(Q K~^T / sqrt(d)) Z* softmax(Q~ K^T / sqrt(d)) V,   Z* ~ pinv(softmax(Q~ K~^T / sqrt(d))),

where Z* comes from the iterative Moore-Penrose method the paper uses (Razavi et al. 2014):

    Z_0 = A^T / (|A|_1 |A|_inf),   Z_{j+1} = Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))) / 4.

The product is evaluated right to left, so the cost is O(n m d + m^3) time and O(n m) memory.
The official code also adds a depthwise convolution over the values (one kernel per head,
shared by its channels; kernel size 35 in the authors' LRA configs, mlpen/Nystromformer
LRA/code/lra_config.py): `conv_kernel` here, 0 to leave it out.

Landmarks and padding. The paper splits the n tokens into m equal segments, so a segment's
members, and with them every landmark, change when padding is appended. Here the segment size
is fixed by the longest length, ceil(max_len / m), and a length-n input has ceil(n / size) <= m
segments; landmarks are means over the *real* tokens of a segment. Appended padding therefore
only adds empty segments, and padded content never enters a mean. An empty segment's landmark
is excluded from all three kernels: its column gets zero weight in the first two softmaxes,
its row of the third is zeroed, and its row and column of A are replaced by those of the
identity, so that A is block diagonal with an identity block. The iteration acts on the blocks
separately and the normaliser |A|_1 |A|_inf is unchanged (A's real block is row stochastic and
its largest column sum is >= 1), so the real landmarks get exactly the pseudo-inverse they
would get alone. The norms are taken per example and head (the official code takes one max
over the whole batch, which couples the examples of a batch). The values are zeroed at padded
positions before the convolution, so padded content does not leak through it either.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float

from lra_jax.attention.mixing.convolution import shifted_sum
from lra_jax.attention.core import Attention, masked_softmax, matmul_flops, zero_padding
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError


@register("linformer")
class LinformerAttention(Attention):
    """Linformer attention: keys and values projected along the length to `k` rows.

    Args:
      dim: model width.
      num_heads: number of heads.
      k: projected length (the paper's k; 256 is its main setting and the LRA one).
      share_kv: use one projection for keys and values (F = E).
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention`; `max_len` is required (rows of E, F).

    Raises:
      ConfigError: if max_len is not given, or k < 1.
    """

    cost_exponent = 1.0  # n * k

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """E^T K and F^T V ([k, n] x [n, d]), then q (E^T K)^T and p (F^T V): 4 products of 2 n k d."""
        return cls.projection_flops(batch, n, dim) + 4 * 2.0 * batch * n * settings["k"] * dim

    def __init__(
        self, dim: int, num_heads: int, *, k: int = 256, share_kv: bool = False, rngs: nnx.Rngs, **common
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if self.max_len is None:
            raise ConfigError(
                "linformer projects along the sequence axis and needs the longest length: "
                "pass max_len (the model sets it from the task's max_len)"
            )
        if k < 1:
            raise ConfigError(f"linformer projected length must be >= 1, got k={k}")
        self.k = k
        self.share_kv = share_kv
        # LeCun normal over the length axis: each projected row sums max_len positions.
        init = nnx.initializers.normal(stddev=self.max_len**-0.5)
        self.e = nnx.Param(init(rngs.params(), (self.max_len, k)))
        self.f = None if share_kv else nnx.Param(init(rngs.params(), (self.max_len, k)))

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        n = q.shape[1]
        if n > self.max_len:
            raise ConfigError(
                f"linformer was built for sequences of at most max_len={self.max_len} tokens "
                f"but got {n}; build it with a larger max_len"
            )
        e = self.e[...][:n].astype(k.dtype)
        f = e if self.f is None else self.f[...][:n].astype(v.dtype)
        k_proj = jnp.einsum("np,bnhd->bphd", e, zero_padding(k, mask))
        v_proj = jnp.einsum("np,bnhd->bphd", f, zero_padding(v, mask))
        logits = jnp.einsum("bnhd,bphd->bhnp", q, k_proj) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)  # every projected key is real
        probs = self.drop(probs, deterministic=deterministic, rngs=rngs)
        return jnp.einsum("bhnp,bphd->bnhd", probs.astype(v.dtype), v_proj)


# --------------------------------------------------------------------------- Nystromformer


def segment_means(
    x: Float[Array, "b n h d"], mask: Bool[Array, "b n"], size: int
) -> tuple[Float[Array, "b s h d"], Bool[Array, "b s"]]:
    """Means over the real tokens of consecutive segments of `size` positions, and which are non-empty.

    The last segment may be cut short by the end of the input; an empty segment's mean is 0.
    """
    b, n = mask.shape
    segments = -(-n // size)
    pad = segments * size - n
    x = jnp.pad(zero_padding(x.astype(jnp.float32), mask), ((0, 0), (0, pad), (0, 0), (0, 0)))
    counts = jnp.pad(mask, ((0, 0), (0, pad))).reshape(b, segments, size).sum(axis=-1)
    sums = x.reshape(b, segments, size, *x.shape[2:]).sum(axis=2)
    return sums / jnp.maximum(counts, 1)[:, :, None, None].astype(jnp.float32), counts > 0


def iterative_pinv(a: Float[Array, "... m m"], iterations: int) -> Float[Array, "... m m"]:
    """Moore-Penrose pseudo-inverse by the paper's iteration (eq. 15), from Z_0 = A^T / (|A|_1 |A|_inf)."""
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    norm_1 = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)  # largest column sum
    norm_inf = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)  # largest row sum
    z = jnp.swapaxes(a, -1, -2) / (norm_1 * norm_inf)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def nystrom_kernels(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    segment: int,
    iterations: int,
) -> tuple[Float[Array, "b h n s"], Float[Array, "b h s s"], Float[Array, "b h s n"]]:
    """The three factors of eq. 14: softmax(Q K~^T), pinv(softmax(Q~ K~^T)), softmax(Q~ K^T), in float32.

    Empty segments (no real token) are excluded as the module docstring explains.
    """
    scale = q.shape[-1] ** -0.25  # 1/sqrt(d) on the logits, split between queries and keys
    q, k = q.astype(jnp.float32) * scale, k.astype(jnp.float32) * scale
    q_landmarks, real_landmarks = segment_means(q, mask, segment)
    k_landmarks, _ = segment_means(k, mask, segment)
    columns = real_landmarks[:, None, None, :]
    rows = real_landmarks[:, None, :, None]

    first = masked_softmax(jnp.einsum("bnhd,bshd->bhns", q, k_landmarks), columns)
    middle = masked_softmax(jnp.einsum("bshd,bthd->bhst", q_landmarks, k_landmarks), columns)
    eye = jnp.eye(middle.shape[-1], dtype=middle.dtype)
    middle = jnp.where(rows & columns, middle, eye)  # identity block for the empty segments
    last = masked_softmax(jnp.einsum("bshd,bnhd->bhsn", q_landmarks, k), mask[:, None, None, :])
    last = jnp.where(rows, last, 0.0)
    return first, iterative_pinv(middle, iterations), last


@register("nystromformer")
class NystromAttention(Attention):
    """Nystromformer attention with segment-mean landmarks (see module docstring).

    Args:
      dim: model width.
      num_heads: number of heads.
      num_landmarks: m, the most landmarks a length-`max_len` input gets (64 here; the authors' LRA
        configs try 32 to 256). Segments hold ceil(max_len / m) positions; an input longer than
        `max_len` gets proportionally more landmarks.
      pinv_iterations: iterations of the pseudo-inverse (6, the paper's choice).
      conv_kernel: width of the depthwise convolution over the values added to the output
        (35 as in the authors' LRA configs; 0 turns it off).
      rngs: parameter initialisation keys.
      **common: shared settings of `Attention`; `max_len` is required (it fixes the segment size).
        Attention dropout applies to softmax(Q K~^T), the weights of the queries over the landmarks.

    Raises:
      ConfigError: if max_len is not given, or a setting is out of range.
    """

    cost_exponent = 1.0  # n * m landmarks

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Projections; with s = ceil(n / segment) landmarks (segment = ceil(max_len / m)), the three kernels of eq. 14
        (Q K~^T, Q~ K~^T, Q~ K^T: 2 n s d + 2 s s d + 2 s n d), the pseudo-inverse (4 [s, s] products per
        iteration and head, eq. 15), the products right to left (2 s n d + 2 s s d + 2 n s d), and the depthwise
        convolution of the values, k multiply-adds per channel and position (2 n d k)."""
        segment = -(-settings["max_len"] // settings["num_landmarks"])
        landmarks = -(-n // segment)
        kernels_and_products = 2 * (2 * matmul_flops(batch * n, dim, landmarks)
                                    + matmul_flops(batch * landmarks, dim, landmarks))
        pinv = settings["pinv_iterations"] * 4 * matmul_flops(batch * num_heads * landmarks, landmarks, landmarks)
        convolution = matmul_flops(batch * n * dim, settings["conv_kernel"], 1)
        return cls.projection_flops(batch, n, dim) + kernels_and_products + pinv + convolution

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        num_landmarks: int = 64,
        pinv_iterations: int = 6,
        conv_kernel: int = 35,
        **common,
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if self.max_len is None:
            raise ConfigError(
                "nystromformer fixes its landmark segments from the longest length: "
                "pass max_len (the model sets it from the task's max_len)"
            )
        if num_landmarks < 1 or pinv_iterations < 0 or conv_kernel < 0:
            raise ConfigError(
                "nystromformer needs num_landmarks >= 1, pinv_iterations >= 0 and conv_kernel >= 0, got "
                f"num_landmarks={num_landmarks}, pinv_iterations={pinv_iterations}, conv_kernel={conv_kernel}"
            )
        self.num_landmarks = num_landmarks
        self.pinv_iterations = pinv_iterations
        self.segment = -(-self.max_len // num_landmarks)
        self.conv_kernel = conv_kernel
        init = nnx.initializers.normal(stddev=conv_kernel**-0.5) if conv_kernel else None
        # One kernel per head over the values, shared by the head's channels (None: no convolution).
        self.conv = nnx.Param(init(rngs.params(), (num_heads, conv_kernel))) if conv_kernel else None

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        first, middle, last = nystrom_kernels(q, k, mask, self.segment, self.pinv_iterations)
        first = self.drop(first, deterministic=deterministic, rngs=rngs)
        v32 = zero_padding(v.astype(jnp.float32), mask)
        landmark_values = jnp.einsum("bhtn,bnhd->bthd", last, v32)  # right to left: O(n m) memory
        landmark_values = jnp.einsum("bhst,bthd->bshd", middle, landmark_values)
        out = jnp.einsum("bhns,bshd->bnhd", first, landmark_values)
        if self.conv is not None:
            out = out + shifted_sum(v32, self.conv[...].astype(jnp.float32)[None, None])
        return out.astype(v.dtype)
