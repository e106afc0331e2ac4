"""The attention contract and what every variant shares.

The contract, which every registered variant meets and `tests/attention/test_attention_contract.py`
checks for each of them (this docstring is where the code points to it):

  * A variant is an `nnx.Module` built by
    `registry.build(name, dim=..., num_heads=..., rngs=..., **settings)` with

        __call__(x: f[b n d], mask: bool[b n], *, deterministic: bool, rngs=None) -> f[b n d]

    where `mask` is True on real tokens.
  * Padding: outputs at real positions do not depend on the content of padded positions nor on
    how much padding follows; outputs at padded positions are zero. A variant tied to a fixed
    length (Linformer's projections, MLP-Mixer's and gMLP's token weights) meets the content
    part only, and its docstring says why the length part cannot hold.
  * Nothing is NaN or Inf, even on a row that is all padding.
  * Exact limits are proven by tests where a variant has one: a local window covering the
    sequence, Longformer/BigBird with every token global, Reformer with one bucket, Routing with
    one cluster, Linformer with k = n and identity projections all equal full softmax attention;
    Performer and Taylor approach it as features grow or logits shrink.
  * jit, grad, vmap and bfloat16 work. Random features, hashes and centroids come from explicit
    keys or non-trainable state, never from a fixed PRNGKey(0).
  * The defects of the original LRA code that this rules out: strided "local" attention,
    Reformer multiplying by sqrt(d) instead of dividing, Performer/Linformer/Linear ignoring
    padding, Longformer without a global token (and, in `models/heads.py`, mean pooling over padding).

`TokenMixer` checks the settings every variant accepts. `Attention` adds the
shared pieces: query/key/value/output projections (Vaswani et al. 2017, eq. 2:
MultiHead(Q, K, V) = Concat(head_1..head_h) W^O), the head split, attention
dropout and the padding of the output; a variant implements only
`attend(q, k, v, mask)` on per-head tensors [b n h d]. Token mixers without
queries and keys (MLP-Mixer, FNet, ...) subclass `TokenMixer` and implement
`__call__` with the same signature.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from lra_jax import kernels
from lra_jax.attention import registry
from lra_jax.attention.dropout import Dropout
from lra_jax.attention.weighted_values import NO_SEED, softmax_values
from lra_jax.errors import ConfigError
from lra_jax.kernels import IMPLS
from lra_jax.kernels.dropout import seed_from_key as kernel_dropout_seed
from lra_jax.kernels.masking import MASK_VALUE  # one logit for masked pairs, kernels and variants alike

# MASK_VALUE is finite, so a row with every key masked gives a uniform (not NaN)
# softmax, and far below any real logit, so it gets zero weight otherwise.

# The contract's types: tokens [b n d] and their mask [b n] (True on real tokens).
Tokens = Float[Array, "b n d"]
TokenMask = Bool[Array, "b n"]



def split_heads(x: Float[Array, "b n hd"], num_heads: int) -> Float[Array, "b n h d"]:
    """[b, n, h*d] -> [b, n, h, d]."""
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)


def merge_heads(x: Float[Array, "b n h d"]) -> Float[Array, "b n hd"]:
    """[b, n, h, d] -> [b, n, h*d]."""
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def zero_padding(x: Float[Array, "b n ..."], mask: Bool[Array, "b n"]) -> Float[Array, "b n ..."]:
    """Sets x to zero at padded positions (mask False), whatever x holds there (NaN included)."""
    mask = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
    return jnp.where(mask, x, jnp.zeros((), x.dtype))


def matmul_flops(rows: float, inner: float, cols: float) -> float:
    """FLOPs of an [rows, inner] x [inner, cols] product: 2 per multiply-add (`lra_jax/measure/flops.py`)."""
    return 2.0 * rows * inner * cols


def complex_matmul_flops(rows: float, inner: float, cols: float) -> float:
    """FLOPs of a complex [rows, inner] x [inner, cols] product: 8 per complex multiply-add (4 real
    multiplies and 4 adds); XLA's cost analysis counts 2, as for a real product."""
    return 4 * matmul_flops(rows, inner, cols)


def fft_flops(length: int, count: float, *, real: bool = False) -> float:
    """FLOPs of `count` FFTs of `length` points by the usual convention: 5 N log2 N for a complex
    transform, half that for a real one (rfft, irfft)."""
    return (2.5 if real else 5.0) * count * length * math.log2(max(length, 1))


def masked_softmax(logits: Float[Array, "... k"], key_mask: Bool[Array, "... k"]) -> Float[Array, "... k"]:
    """Softmax over the last axis in float32, giving masked keys zero weight.

    A row whose keys are all masked gets uniform weights (finite, never NaN);
    callers zero such rows' outputs.
    """
    logits = jnp.where(key_mask, logits.astype(jnp.float32), MASK_VALUE)
    return jax.nn.softmax(logits, axis=-1)


def causal_pairs(queries: int, keys: int) -> Bool[Array, "q k"]:
    """True where key j <= query i: the pairs a causal layer may mix."""
    return jnp.arange(keys)[None, :] <= jnp.arange(queries)[:, None]


def causal_variants() -> list[str]:
    """The registered variants that take causal=True."""
    return [name for name in registry.names() if getattr(registry.get(name), "supports_causal", False)]


def causal_forms() -> dict[str, str]:
    """Each registered variant that can be causal -> the setting that makes it so."""
    forms = {name: getattr(registry.get(name), "causal_form", lambda: None)() for name in registry.names()}
    return {name: form for name, form in forms.items() if form}


def stream_key(rngs: nnx.Rngs, stream: str, fallback: str, purpose: str) -> PRNGKeyArray:
    """A key from `rngs`' `stream`, else its "default" stream, else its `fallback` stream.

    Variants that draw randomness (hash rotations, random features, Gumbel noise) give it
    its own stream name so a caller can seed it apart; `fallback` is "params" at init and
    "dropout" in training. `purpose` names what the key is for in the error.
    """
    for name in (stream, "default", fallback):
        if name in rngs:
            return rngs[name]()
    raise ValueError(f"{purpose} needs an nnx.Rngs with a '{stream}', 'default' or '{fallback}' stream")


def divide_or_zero(numerator: Float[Array, "..."], denominator: Float[Array, "..."]) -> Float[Array, "..."]:
    """numerator / denominator where denominator != 0, else 0; finite values and gradients.

    For ratios whose denominator is exactly zero only when there is nothing to average
    (a row without real keys). Unlike `/ (denominator + eps)`, it never biases a
    small denominator: the result is exact at any scale.
    """
    nonzero = denominator != 0
    return jnp.where(nonzero, numerator / jnp.where(nonzero, denominator, 1), 0)


def unit_vectors(x: Float[Array, "... d"]) -> Float[Array, "... d"]:
    """x / |x| over the last axis in float32, exact at any scale; 0 stays 0 (finite gradient).

    x is first divided by max|x_i| (x / |x| is invariant to that factor), so |x|^2 neither
    underflows nor overflows and no epsilon is needed.
    """
    x = x.astype(jnp.float32)
    largest = jax.lax.stop_gradient(jnp.max(jnp.abs(x), axis=-1, keepdims=True))
    x = x / jnp.where(largest > 0, largest, 1.0)
    squared = jnp.sum(x * x, axis=-1, keepdims=True)  # in [1, d], or 0 for a zero vector
    return x * jax.lax.rsqrt(jnp.where(squared > 0, squared, 1.0))


class SSMParam(nnx.Param):
    """A state-space parameter (S4D's A and log step size): the trainer gives these
    their own rate (`optimizer.ssm_learning_rate`) and no weight decay (Gu et al. 2022), the rest as configured."""


class TokenMixer(nnx.Module):
    """Base of every variant: the settings all of them accept, checked once.

    Variants without queries and keys (MLP-Mixer, FNet, gMLP, convolutions)
    subclass this directly and implement `__call__` with the contract's signature.

    Args:
      dim: model width d_model (= num_heads * head_dim).
      num_heads: number of heads h.
      rngs: parameter initialisation keys.
      max_len: longest sequence the model is built for (fixed-length variants need it).
      dropout_rate: dropout on attention weights, where a variant has them.
      dtype: computation dtype (parameters stay float32).
      impl: kernel choice, "xla" | "pallas" | "auto" (see lra_jax/kernels).
      causal: position i mixes positions <= i only (next-token pretraining); only a variant with
        `supports_causal` takes it, the others refuse it.

    Class attributes:
      length_invariant: False for a variant whose real outputs change when padding
        is appended (e.g. an FFT over the padded length); its docstring must say why.
        The contract suite skips only that one check for it.
      kernel_op: the kernel op the variant's `attend` runs where its plan says so
        (`lra_jax.kernels.flash.api.FLASH`, `block_sparse.api.BLOCK_SPARSE`, `linear.api.LINEAR`,
        `gated_scan.api.GATED_SCAN`): the op's table says which kernels exist per backend and which
        take the attention dropout (`**self.kernel_dropout(plan, rngs)`); `kernel_limits` says which settings they cannot
        serve. None (the default): no kernel; the variant refuses impl="pallas" and treats
        "auto" as "xla".
      kernel_serves_causal: True where `kernel_op` computes the layer's causal form too: the gated scan
        (it runs one direction), and the attention ops given a causal `kernels.masking.Mask` (softmax,
        local, synthesizer); otherwise a causal layer runs XLA (linear attention's kernel is not causal;
        strided's kernel attends in a permuted order).
      cost_exponent: e such that the compiled forward and backward passes' FLOPs and
        temporary memory grow as n^e (log factors aside) when the layer is built for
        length n with `settings_at_length(n)`. 2, the default, is full attention's; a
        sub-quadratic variant declares less. `tests/attention/test_cost.py` holds every variant to it.
      forward_flops(batch, n, dim, num_heads, settings): the forward pass's matmul FLOPs of the
        layer (`lra_jax/measure/flops.py`), or None where the variant does not count them; next to
        `cost_exponent` in each variant, tested against XLA's count in `tests/measure/test_flops.py`.
      data_dependent_pattern: True where the keys a query sees are chosen from the
        activations (hash buckets, clusters), so a rounding difference such as
        bfloat16's can move a token to another bucket and change its output entirely.
      supports_causal: True where the variant has a causal form that changes nothing else it computes:
        a weight for every (query, key) pair with the pairs j > i masked, or kernelized sums taken
        over the keys j <= i only.

    Each layer declares which outputs may depend on which inputs (`mixing_pairs`, `dependency_pattern`):
    `tests/attention/test_patterns.py` holds every registered variant's declaration to its Jacobian.

    The layer is built for the kernel target current at build time
    (`lra_jax.kernels.current_target()`: the platform jax runs on, or the one set by
    `kernels.target_platform`, e.g. by the lowering tool); `kernel_plan` says which
    kernel a call runs there, and why not a kernel where one was asked for.
    """

    length_invariant = True
    kernel_op: kernels.KernelOp | None = None
    kernel_serves_causal = False
    uses_attention_dropout = True  # False where no attention weights are formed (nothing to drop)
    cost_exponent = 2.0
    data_dependent_pattern = False
    supports_causal = False

    @classmethod
    def causal_form(cls) -> str | None:
        """The setting that makes the layer causal ("causal=True" where `supports_causal`), or None."""
        return "causal=True" if cls.supports_causal else None

    @classmethod
    def settings_at_length(cls, n: int) -> dict:
        """Settings that must scale with the length n for `cost_exponent` to hold (none by default)."""
        del n
        return {}

    @classmethod
    def forward_flops(cls, batch: int, n: int, dim: int, num_heads: int, settings: dict) -> float | None:
        """Matmul FLOPs of one forward call on [batch, n, dim] (see `lra_jax/measure/flops.py`); None: not counted."""
        del batch, n, dim, num_heads, settings
        return None

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        max_len: int | None = None,
        dropout_rate: float = 0.0,
        dtype: jnp.dtype = jnp.float32,
        impl: str = "xla",
        causal: bool = False,
    ):
        if causal and not self.supports_causal:
            forms = ", ".join(f"{name} ({form})" for name, form in causal_forms().items())
            raise ConfigError(f"attention variant {getattr(self, 'variant_name', type(self).__name__)} has no causal "
                              f"form; causal layers are {forms}")
        if dim % num_heads:
            raise ConfigError(f"model width {dim} is not divisible by num_heads={num_heads}")
        if not 0.0 <= dropout_rate < 1.0:  # also where the variant has no weights to drop and ignores it
            raise ConfigError(f"attention dropout_rate must be in [0, 1), got {dropout_rate}")
        if impl not in IMPLS:
            raise ConfigError(f"unknown attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
        if impl == "pallas" and self.kernel_op is None:
            raise ConfigError(
                f"attention variant {type(self).__name__} has no Pallas kernel; "
                "set config.attention.impl='xla' (or 'auto')"
            )
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.max_len = max_len
        self.dtype = dtype
        self.dropout_rate = dropout_rate
        self.impl = impl
        self.causal = causal
        self.target = kernels.current_target()

    def kernel_limits(self, platform: str) -> str | None:
        """Why this layer's settings keep its kernel from running on `platform`, or None."""
        return None

    def mixing_pairs(self, n: int) -> Bool[np.ndarray, "n n"]:
        """[n, n] True where output i may read input j at length n, padding and causality aside: every pair
        here; a variant with a window, a stride, global tokens or random blocks says which. Where
        `data_dependent_pattern`, the input picks a subset of these pairs (its hash buckets, clusters)."""
        return np.ones((n, n), bool)

    def dependency_pattern(self, mask: Bool[np.ndarray, "n"]) -> Bool[np.ndarray, "n n"]:
        """[n, n] True where output i may depend on input j of one sequence whose real tokens are `mask`:
        `mixing_pairs`, cut to j <= i in the causal form, between real positions only (padded outputs are
        zero, and no real output reads a padded input). Outside it dy_i/dx_j is exactly zero; inside it is
        nonzero for almost every pair, unless `data_dependent_pattern` makes it an upper bound."""
        mask = np.asarray(mask, bool)
        pattern = self.mixing_pairs(len(mask)) & mask[:, None] & mask[None, :]
        return pattern & np.tri(len(mask), dtype=bool) if self.causal else pattern

    @classmethod
    def kernel_backends(cls) -> frozenset[str]:
        """The Pallas backends ("triton": GPU, "mosaic": TPU) the variant has a kernel on."""
        return frozenset() if cls.kernel_op is None else cls.kernel_op.backends

    def kernel_plan(self, deterministic: bool, op: kernels.KernelOp | None = None) -> kernels.KernelPlan:
        """The kernel a call runs (training: deterministic=False) on the layer's target: an implementation
        of `kernel_op`, or of `op` for a second op the layer also calls (Longformer's global rows)."""
        op = op or self.kernel_op
        if op is None:
            return kernels.KernelPlan(kernels.NO_KERNEL.xla, self.target.platform)
        unsupported = (f"causal=True: the {op.name} kernels do not compute this variant's causal form"
                       if self.causal and not self.kernel_serves_causal else None)
        return kernels.plan(self.impl, self.target, op,
                            dropout_active=self.uses_attention_dropout and self.dropout_rate > 0 and not deterministic,
                            dtype=jnp.dtype(self.dtype).name, causal=self.causal,
                            unsupported=unsupported or self.kernel_limits(self.target.platform))

    def kernel_dropout(self, plan: kernels.KernelPlan, rngs: nnx.Rngs | None) -> dict:
        """Keyword arguments that give a kernel call its attention dropout ({} where the plan has none);
        each call draws its own key from `rngs`' "dropout" stream (else its "default" one, as nnx.Dropout)."""
        if not plan.dropout:
            return {}
        if rngs is None:
            raise ValueError("attention dropout in training needs rngs (an nnx.Rngs with a 'dropout' stream)")
        key = stream_key(rngs, "dropout", "dropout", "attention dropout")
        return {"dropout_rate": self.dropout_rate, "dropout_seed": kernel_dropout_seed(key)}


class BidirectionalMixer(TokenMixer):
    """Base of the mixers that read the sequence in both directions by default (state spaces, gated
    recurrences, long convolutions): LRA classifies whole sequences. `bidirectional=False` drops the
    backward direction and is the causal form (next-token pretraining); `causal` follows from it.
    Linear in n and without attention weights unless a subclass says otherwise.
    """

    uses_attention_dropout = False
    cost_exponent = 1.0

    @classmethod
    def causal_form(cls) -> str:
        """Causal without the backward direction (its causal=True is refused: one setting, one meaning)."""
        return "bidirectional=False"

    @staticmethod
    def directions_of(settings: dict) -> int:
        """2 for a bidirectional layer's `settings`, else 1."""
        return 2 if settings["bidirectional"] else 1

    def __init__(self, dim: int, num_heads: int, *, bidirectional: bool = True, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        self.bidirectional = bidirectional
        self.causal = not bidirectional
        self.directions = 2 if bidirectional else 1


class Attention(TokenMixer):
    """Multi-head attention with shared q/k/v/out projections; subclasses implement `attend`.

    Takes the settings of `TokenMixer`.
    """

    @staticmethod
    def projection_flops(batch: int, n: int, dim: int) -> float:
        """The q, k, v and output projections: 4 [batch n, dim] x [dim, dim] products."""
        return 4 * matmul_flops(batch * n, dim, dim)

    @staticmethod
    def attention_flops(queries: float, keys: float, dim: int) -> float:
        """q.k scores and the weighted sum of the values for `queries` query rows (batch included),
        each against `keys` keys, over heads of total width `dim`: 2 products of 2 queries keys dim."""
        return 2 * matmul_flops(queries, dim, keys)

    def __init__(self, dim: int, num_heads: int, *, rngs: nnx.Rngs, **common):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        linear = lambda: nnx.Linear(dim, dim, dtype=self.dtype, rngs=rngs)  # noqa: E731
        self.query, self.key, self.value, self.out = linear(), linear(), linear(), linear()
        self.attention_dropout = Dropout(self.dropout_rate)  # the kernels' mask on [b h q k] weights

    def __call__(self, x: Tokens, mask: TokenMask, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Tokens:
        q = split_heads(self.query(x), self.num_heads)
        k = split_heads(self.key(x), self.num_heads)
        v = split_heads(self.value(x), self.num_heads)
        out = self.attend(q, k, v, mask, deterministic=deterministic, rngs=rngs)
        return zero_padding(self.out(merge_heads(out.astype(x.dtype))), mask)

    def attend(
        self,
        q: Float[Array, "b n h d"],
        k: Float[Array, "b n h d"],
        v: Float[Array, "b n h d"],
        mask: Bool[Array, "b n"],
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> Float[Array, "b n h d"]:
        """Mixes values across positions; `mask` is True on real tokens."""
        raise NotImplementedError

    def drop(self, weights: Array, *, deterministic: bool, rngs: nnx.Rngs | None) -> Array:
        """Attention dropout on weights (identity when deterministic): `attention.dropout.Dropout`, whose
        mask on [b, h, q, k] weights is exactly the kernels' (`kernels.dropout.apply`)."""
        return self.attention_dropout(weights, deterministic=deterministic, rngs=rngs)

    def weighted_values(
        self,
        logits: Float[Array, "b h q k"],
        v: Float[Array, "b k h d"],
        key_mask: Bool[Array, "b k"],
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> Float[Array, "b q h d"]:
        """drop(masked_softmax(logits)) v, with the mask of `drop` (the kernels'), through
        `weighted_values.softmax_values`: the softmax, dropout and product of full attention in
        two [q, k] arrays forward and backward instead of autodiff's six. A causal layer also masks
        the pairs of query i and key j > i."""
        allowed = key_mask[:, None, None, :]
        if self.causal:
            allowed = allowed & causal_pairs(logits.shape[-2], logits.shape[-1])
        logits = jnp.where(allowed, logits.astype(jnp.float32), MASK_VALUE)
        out, _ = softmax_values(logits, jnp.swapaxes(v, 1, 2), *self.dropout_seed(deterministic, rngs))
        return jnp.swapaxes(out, 1, 2)

    def dropout_seed(self, deterministic: bool, rngs: nnx.Rngs | None) -> tuple[Array, float]:
        """(seed, rate) of this call's attention dropout; (NO_SEED, 0.0) where nothing is dropped."""
        if deterministic or self.dropout_rate == 0:
            return NO_SEED, 0.0
        return self.attention_dropout.seed(rngs), self.dropout_rate
