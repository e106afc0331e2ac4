"""Gated linear attention with a matrix state, in its chunked form: GLA (Yang et al. 2024) and Mamba-2's
state-space duality, SSD (Dao and Gu 2024), token mixers beside the attention variants.

Both run, per head, the recurrence of a [d_k, d_v] state with a decay per key dimension,

    S_t = diag(g_t) S_{t-1} + k_tᵀ v_t,    y_t = q_t S_t,    g_t ∈ (0, 1]^{d_k}                     (1)

(GLA: a gate per key dimension; SSD: one scalar a_t per head, g_t = a_t 1). Unrolled,
y_t = Σ_{s<=t} (q_t ⊙ exp(b_t - b_s)) · k_s v_s with b_t = Σ_{i<=t} log g_i: an attention whose weights
decay with distance, the duality the SSD paper is named after. The gated-scan kernel op computes it in
chunks of C steps (GLA paper, Sec. 3.3; SSD paper, Sec. 6; `lra_jax.kernels.gated_scan`): inside a chunk
the weighted sum directly ([C, C] per key dimension), across chunks the state S carried by a scan: O(n C
d_k + n d_k d_v) work in O(C² d_k + (n / C) d_k d_v) memory; its XLA form (`gated_scan.reference.chunked`)
on CPU and TPU, its Pallas Triton kernel on GPU. `gated_scan.reference.recurrent` is (1) step by step: the
reference the tests hold both to, at every chunk size.

Bidirectional (LRA): the backward direction is (1) run from the end with the current step left out,
y_t += Σ_{s>t} (q_t ⊙ exp(b'_t - b'_s)) · k_s v_s, so that a token's own term is counted once. Padding:
k and v are zeroed and the log-gates set to 0 on padded steps, so appended padding adds nothing, decays
nothing, and the backward state reaches the last real token as zero.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from lra_jax.attention.core import BidirectionalMixer, SSMParam, TokenMask, Tokens, matmul_flops, zero_padding
from lra_jax.attention.registry import register
from lra_jax.attention.recurrent.selective import causal_depthwise_conv, inverse_softplus
from lra_jax.errors import ConfigError
from lra_jax.kernels.gated_scan import reference
from lra_jax.kernels.gated_scan.api import GATED_SCAN, gated_scan
from lra_jax.kernels.gated_scan.api import kernel_limit as gated_scan_kernel_limit

Heads = Float[Array, "b n h d"]
ScanForm = Callable[..., Heads]  # form(q, k, v, log_g, *, chunk, strict=False) -> y, (1) over [b n h d] heads


def bidirectional_gla(q: Heads, k: Heads, v: Heads, log_g: Heads, *, chunk: int, bidirectional: bool,
                      form: ScanForm = reference.chunked) -> Heads:
    """The forward direction of (1), plus the strict backward one when `bidirectional`, each computed by
    `form` (the gated-scan op, its chunked XLA form or the step-by-step `recurrent` reference)."""
    y = form(q, k, v, log_g, chunk=chunk)
    if bidirectional:
        flip = lambda x: jnp.flip(x, axis=1)
        # reversed, the padding comes first: zero inputs and zero log-gates there change nothing
        y = y + flip(form(*(flip(x) for x in (q, k, v, log_g)), chunk=chunk, strict=True))
    return y


def _chunked_flops(batch, n, heads, dk, dv, chunk, directions, scalar_decay=False):
    """Per direction: the chunk's weights (4 FLOPs per pair and key dimension: the decay b_t - b_s, two
    multiplies and the sum; with one decay per head, q · k and 2 FLOPs per pair for the decay), their
    product with v, the state's read and update (multiply-adds)."""
    c = min(chunk, n)
    weights = 2 * dk + 2 if scalar_decay else 4 * dk
    intra = batch * heads * n * c * (weights + 2 * dv)
    state = 2 * matmul_flops(batch * heads * n, dk, dv)
    return directions * (intra + state)


class GatedScanMixer(BidirectionalMixer):
    """Base of the layers that compute (1) with the gated-scan kernel op: the Triton kernel on a GPU target,
    XLA elsewhere (`lra_jax.kernels.gated_scan`); the op runs one direction, so the causal form
    (bidirectional=False) takes the kernel too. A subclass gives `scan_widths`."""

    kernel_op = GATED_SCAN  # Triton only (none for TPU)
    kernel_serves_causal = True

    def scan_widths(self) -> tuple[int, int, bool]:
        """(d_k, d_v, one decay per head) of the layer's scan."""
        raise NotImplementedError

    def kernel_limits(self, platform: str) -> str | None:
        """The kernel keeps the [d_k, d_v] state (and GLA's [C, C, d_k] decays) on chip: too wide runs XLA."""
        if platform != "gpu":
            return None
        dk, dv, scalar_decay = self.scan_widths()
        return gated_scan_kernel_limit(dk, dv, self.chunk, scalar_decay)

    def scan_form(self) -> ScanForm:
        """(1) as this layer's plan computes it (no dropout: one plan for training and evaluation)."""
        return functools.partial(gated_scan, plan=self.kernel_plan(deterministic=True))


@register("gla")
class GLA(GatedScanMixer):
    """Gated linear attention (Yang, Wang, Shen, Panda, Kim 2024, "Gated Linear Attention Transformers with
    Hardware-Efficient Training", arXiv:2312.06635), bidirectional.

    Per head, q = x W_q (scaled by d_k^-½), k = x W_k, v = x W_v with d_k = d_v / 2 (the paper's halved key
    dimension), and a gate from a rank-16 bottleneck (eq. 5): g_t = sigmoid(x W_1 W_2 + b)^{1/τ}, τ = 16, so
    log g_t = log sigmoid(·) / τ. The state follows (1); the output is o_t = LN_h(y_t) ⊙ SiLU(x W_r), then W_o
    (Sec. 4.1), LN_h normalising each head of each token apart.

    Args:
      dim: model width d; num_heads: h, with d_v = d / h per head and d_k = d_v / 2.
      chunk: C, the chunk size of the chunked form.
      gate_rank: the gate's bottleneck (16); temperature: τ (16).
      bidirectional: add the backward direction (LRA); False gives the causal layer.
    """

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """The projections q, k (d -> d / 2 each), v, r, o (d -> d), the gate's bottleneck, and the chunked form."""
        tokens, dv = batch * n, dim // num_heads
        rank = settings["gate_rank"]
        projections = 2 * matmul_flops(tokens, dim, dim // 2) + 3 * matmul_flops(tokens, dim, dim)
        gate = matmul_flops(tokens, dim, rank) + matmul_flops(tokens, rank, dim // 2)
        directions = cls.directions_of(settings)
        return projections + gate + _chunked_flops(batch, n, num_heads, dv // 2, dv, settings["chunk"], directions)

    def __init__(self, dim: int, num_heads: int, *, chunk: int = 16, gate_rank: int = 16, temperature: float = 16.0,
                 bidirectional: bool = True, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, bidirectional=bidirectional, rngs=rngs, **common)
        head = dim // num_heads
        if head % 2:
            raise ConfigError(f"gla needs an even width per head (d_k = d_v / 2), got {dim} / {num_heads} = {head}")
        if chunk < 1 or gate_rank < 1 or temperature <= 0:
            raise ConfigError(f"gla needs chunk >= 1, gate_rank >= 1 and temperature > 0, got chunk={chunk}, "
                              f"gate_rank={gate_rank}, temperature={temperature}")
        self.chunk, self.gate_rank, self.temperature = chunk, gate_rank, temperature
        linear = lambda i, o, bias=False: nnx.Linear(i, o, use_bias=bias, dtype=self.dtype, rngs=rngs)
        self.query, self.key, self.value = linear(dim, dim // 2), linear(dim, dim // 2), linear(dim, dim)
        self.gate_down, self.gate_up = linear(dim, gate_rank), linear(gate_rank, dim // 2, bias=True)
        self.output_gate, self.out = linear(dim, dim), linear(dim, dim)
        self.norm_scale = nnx.Param(jnp.ones((dim,)))  # the per-head norm's scale, per channel

    def heads(self, x: Float[Array, "b n e"]) -> Heads:
        return x.reshape(*x.shape[:2], self.num_heads, -1)

    def scan_widths(self) -> tuple[int, int, bool]:
        head = self.dim // self.num_heads
        return head // 2, head, False

    def mix(self, x: Tokens, mask: TokenMask, form: ScanForm | None = None) -> Float[Array, "b n d"]:
        """y of (1) over the heads, [b n d] in float32, before the norm and the output gate; `form` computes
        (1) (default: the layer's plan of the gated-scan op)."""
        real = mask[:, :, None, None]
        q = self.heads(self.query(x)).astype(jnp.float32) * (self.dim // self.num_heads // 2) ** -0.5
        k = jnp.where(real, self.heads(self.key(x)).astype(jnp.float32), 0.0)
        v = jnp.where(real, self.heads(self.value(x)).astype(jnp.float32), 0.0)
        log_g = jax.nn.log_sigmoid(self.gate_up(self.gate_down(x)).astype(jnp.float32)) / self.temperature
        log_g = jnp.where(real, self.heads(log_g), 0.0)
        y = bidirectional_gla(q, k, v, log_g, chunk=self.chunk, bidirectional=self.bidirectional,
                              form=form or self.scan_form())
        return y.reshape(*x.shape[:2], self.dim)

    def head_norm(self, y: Float[Array, "b n d"]) -> Float[Array, "b n d"]:
        """Each token's heads normalised apart (mean 0, variance 1 over d_v), then scaled per channel."""
        heads = self.heads(y)
        mean = heads.mean(-1, keepdims=True)
        variance = ((heads - mean) ** 2).mean(-1, keepdims=True)
        return ((heads - mean) * jax.lax.rsqrt(variance + 1e-5)).reshape(y.shape) * self.norm_scale[...]

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        y = self.head_norm(self.mix(x, mask)) * jax.nn.silu(self.output_gate(x).astype(jnp.float32))
        return zero_padding(self.out(y.astype(x.dtype)), mask)


@register("ssd")
class SSD(GatedScanMixer):
    """Mamba-2's block with the state-space dual layer, SSD (Dao and Gu 2024, "Transformers are SSMs:
    Generalized Models and Efficient Algorithms Through Structured State Space Duality", arXiv:2405.21060),
    bidirectional.

    The block (Sec. 7): [z, x, B, C, Δ] = in_proj(u) with x of width E = expand · d in heads of size P,
    B and C of size N (one group, shared by the heads), Δ one per head; x, B and C go through a causal
    depthwise convolution and SiLU (one convolution, causal, which the backward direction reads too). Per head, with a scalar A_h = -exp(A_log_h) (A_h in [-16, -1] at
    initialisation) and Δ_t = softplus(Δ_raw + b_Δ):
        S_t = exp(Δ_t A_h) S_{t-1} + B_tᵀ (Δ_t x_t),   y_t = C_t S_t + D_h x_t,
    which is (1) with q = C, k = B, v = Δ x and log g = Δ A (a scalar decay per head, eq. 16). The output is
    RMSNorm(y ⊙ SiLU(z)) then out_proj. A_log and D are `SSMParam`s (no weight decay).

    Args:
      dim: model width d; num_heads: accepted for the contract (the heads are E / head_size).
      state_size: N (64 in the paper; 16 here by default, LRA's widths are small).
      expand: E = expand · d; head_size: P; conv_kernel: the convolution's length (4).
      chunk: C, the chunk size of the chunked form.
      dt_min, dt_max: the range of the initial Δ (log-uniform).
      bidirectional: add the backward direction (LRA); False gives the causal layer.
    """

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """in_proj and out_proj, the convolution over x, B, C (a multiply-add per tap) and the chunked form
        with d_k = N, d_v = P over E / P heads."""
        inner, state, head = settings["expand"] * dim, settings["state_size"], settings["head_size"]
        tokens, heads = batch * n, inner // head
        width = inner + 2 * state
        projections = matmul_flops(tokens, dim, inner + width + heads) + matmul_flops(tokens, inner, dim)
        directions = cls.directions_of(settings)
        return (projections + 2 * tokens * width * settings["conv_kernel"]
                + _chunked_flops(batch, n, heads, state, head, settings["chunk"], directions, scalar_decay=True))

    def __init__(self, dim: int, num_heads: int, *, state_size: int = 16, expand: int = 2, head_size: int = 16,
                 conv_kernel: int = 4, chunk: int = 64, dt_min: float = 1e-3, dt_max: float = 1e-1,
                 bidirectional: bool = True, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, bidirectional=bidirectional, rngs=rngs, **common)
        inner = expand * dim
        if min(state_size, expand, head_size, conv_kernel, chunk) < 1 or inner % head_size:
            raise ConfigError(f"ssd needs state_size, expand, head_size, conv_kernel and chunk >= 1 with head_size "
                              f"dividing expand * dim, got head_size={head_size}, expand * dim={inner}")
        if not 0 < dt_min <= dt_max:
            raise ConfigError(f"ssd needs 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.state_size, self.expand, self.head_size, self.conv_kernel, self.chunk = (state_size, expand, head_size,
                                                                                      conv_kernel, chunk)
        self.dt_min, self.dt_max = dt_min, dt_max
        heads = inner // head_size
        width = inner + 2 * state_size
        self.in_proj = nnx.Linear(dim, inner + width + heads, use_bias=False, dtype=self.dtype, rngs=rngs)
        conv_key, a_key, dt_key = jax.random.split(rngs.params(), 3)
        bound = 1.0 / math.sqrt(conv_kernel)
        self.conv_kernel_weights = nnx.Param(jax.random.uniform(conv_key, (conv_kernel, width), minval=-bound,
                                                                maxval=bound))
        self.conv_bias = nnx.Param(jnp.zeros((width,)))
        self.a_log = SSMParam(jnp.log(jax.random.uniform(a_key, (heads,), minval=1.0, maxval=16.0)))
        dt = jnp.exp(jax.random.uniform(dt_key, (heads,), minval=math.log(dt_min), maxval=math.log(dt_max)))
        self.dt_bias = nnx.Param(inverse_softplus(jnp.maximum(dt, 1e-4)))
        self.d = SSMParam(jnp.ones((heads,)))
        self.norm = nnx.RMSNorm(inner, dtype=jnp.float32, rngs=rngs)
        self.out_proj = nnx.Linear(inner, dim, use_bias=False, dtype=self.dtype, rngs=rngs)

    def scan_widths(self) -> tuple[int, int, bool]:
        return self.state_size, self.head_size, True

    def mix(self, u: Tokens, mask: TokenMask, form: ScanForm | None = None) -> Float[Array, "b n e"]:
        """y ⊙ SiLU(z) [b n E] in float32, before the norm; `form` computes (1) (default: the layer's plan of
        the gated-scan op)."""
        inner, n_state = self.expand * self.dim, self.state_size
        real = mask[..., None].astype(jnp.float32)
        z, xbc, dt = jnp.split(self.in_proj(u).astype(jnp.float32), [inner, 2 * inner + 2 * n_state], axis=-1)
        xbc = jax.nn.silu(causal_depthwise_conv(xbc * real, self.conv_kernel_weights[...]) + self.conv_bias[...])
        x, b, c = jnp.split(xbc * real, [inner, inner + n_state], axis=-1)
        dt = jax.nn.softplus(dt + self.dt_bias[...])  # [b n H]
        heads = dt.shape[-1]
        x = x.reshape(*x.shape[:2], heads, self.head_size)
        log_g = jnp.where(real[..., None] > 0, (dt * -jnp.exp(self.a_log[...]))[..., None], 0.0)  # [b n H 1]
        shared = lambda m: jnp.broadcast_to(m[:, :, None, :], (*m.shape[:2], heads, n_state))
        y = bidirectional_gla(shared(c), shared(b), dt[..., None] * x, log_g, chunk=self.chunk,
                              bidirectional=self.bidirectional, form=form or self.scan_form())
        y = y + self.d[...][:, None] * x
        return y.reshape(*y.shape[:2], inner) * jax.nn.silu(z)

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        return zero_padding(self.out_proj(self.norm(self.mix(x, mask)).astype(x.dtype)), mask)
