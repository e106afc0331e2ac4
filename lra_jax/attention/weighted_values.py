"""softmax(S) V with attention dropout, and a backward pass written out so no weight array is stored twice.

For logits S [..., q, k] (masked pairs already at MASK_VALUE), values V [..., k, d], keep mask
M (`kernels.dropout.keep_like`: the mask `Dropout` and the kernels draw) and rate r:

    m = max_k S,   l = sum_k exp(S - m),   P = exp(S - m) / l,   lse = m + log l
    O = (M * P) V / (1 - r)                                         (forward)
    dV = (M * P)^T dO / (1 - r)
    dS = (M * P) * G - P * c = P * (M * G - c),   G = dO V^T / (1 - r),  c = rowsum(dO * O) - dlse

rowsum(dO * O) = sum_k (M * P) G is the FlashAttention identity (Dao et al. 2022): the row sum over
k is an [q, d] product instead of a pass over [q, k]. Autodiff of softmax -> dropout -> matmul keeps
P and the mask, and writes the dropped P~, their gradients and the row sum of dP * P. Here P, in the
logits' dtype, is the only [q, k] array kept for the backward; M * P is drawn again from the hash
there. On XLA:CPU the hash cannot join a matmul's fusion, so M * P is an array of its own each way,
but written as (M * P) * G - P * c, dS is the epilogue of the product G (no masked copy of G), and
with 1 / (1 - r) on dO no scalar is broadcast to [q, k]. Everything is float32 inside; O and dV come
back in V's dtype, dS in S's (M * P, in V's dtype, is the matmul operand and the epilogue's factor).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, UInt32

from lra_jax.kernels import dropout as counter_mask

# The seed argument where nothing is dropped (rate 0); numpy, so importing this module starts no XLA
# backend (a multi-host run must call jax.distributed.initialize first).
NO_SEED = np.zeros((1,), np.uint32)


def softmax_values(
    logits: Float[Array, "... q k"],
    values: Float[Array, "... k d"],
    seed: UInt32[Array, "1"] = NO_SEED,
    rate: float = 0.0,
) -> tuple[Float[Array, "... q d"], Float[Array, "... q"]]:
    """(dropout_r(softmax(logits)) values, logsumexp(logits)): the weighted values in `values`' dtype
    and the float32 log-normaliser of each row. `rate` is static; `seed` is `Dropout.seed`'s."""
    counter_mask.threshold(rate)  # refuses a rate outside [0, 1)
    return _softmax_values(logits, values, seed, float(rate))


def _kept(e: Array, seed: Array, rate: float) -> Array:
    """e with the dropped entries zeroed (not rescaled: 1 / (1 - r) goes on the [q, d] side)."""
    if rate == 0:
        return e
    return jnp.where(counter_mask.keep_like(seed, e.shape, rate), e, jnp.zeros((), e.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _softmax_values(logits, values, seed, rate):
    return _forward(logits, values, seed, rate)[0]


def _forward(logits, values, seed, rate):
    s = logits.astype(jnp.float32)
    m = jnp.max(s, axis=-1)
    e = jnp.exp(s - m[..., None])
    total = jnp.sum(e, axis=-1)  # >= 1: the row's maximum contributes exp(0)
    probs = (e / total[..., None]).astype(logits.dtype)  # the backward's only [q, k] residual
    kept = _kept(probs, seed, rate).astype(values.dtype)
    out = jnp.einsum("...qk,...kd->...qd", kept, values, preferred_element_type=jnp.float32) / (1.0 - rate)
    lse = m + jnp.log(total)
    return (out.astype(values.dtype), lse), (probs, values, seed, out)


def _backward(rate, residuals, cotangents):
    probs, values, seed, out = residuals
    d_out, d_lse = cotangents
    # M * P again, from the hash, under a seed tied to dO by a term that is 0 for finite dO (XLA does
    # not fold 0 * x for floats). Untied, XLA merges it with the forward's M * P or computes it as soon
    # as P exists, and keeps a second [q, k] array per layer from the forward to the backward (at
    # n = 4096, batch 8: 2 GiB a layer; `tests/attention/test_weighted_values.py` checks the step's memory).
    # The tie reads dO's first element: raveling dO is a relayout on TPU, a loop per layer at 4K.
    late_seed = seed + (0 * d_out[(0,) * d_out.ndim]).astype(seed.dtype)
    kept = _kept(probs, late_seed, rate).astype(values.dtype)
    d_out32 = d_out.astype(jnp.float32)
    # 1 / (1 - r) on the [q, d] side: dO / (1 - r) gives both dV and G / (1 - r).
    d_scaled = (d_out32 / (1.0 - rate)).astype(values.dtype)
    d_values = jnp.einsum("...qk,...qd->...kd", kept, d_scaled,
                          preferred_element_type=jnp.float32).astype(values.dtype)
    g = jnp.einsum("...qd,...kd->...qk", d_scaled, values, preferred_element_type=jnp.float32)
    c = jnp.sum(d_out32 * out, axis=-1) - d_lse  # [..., q]
    d_logits = kept.astype(jnp.float32) * g - probs.astype(jnp.float32) * c[..., None]  # P * (M * G - c)
    return d_logits.astype(probs.dtype), d_values, None


_softmax_values.defvjp(lambda logits, values, seed, rate: _forward(logits, values, seed, rate), _backward)
