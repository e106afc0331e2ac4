"""softmax(S) V with attention dropout, and a backward pass written out so no weight array is stored twice.

For logits S [..., q, k] (masked pairs already at MASK_VALUE), values V [..., k, d], keep mask
M (`kernels.dropout.keep_like`: the mask `Dropout` and the kernels draw) and rate r:

    m = max_k S,   E = exp(S - m),   l = sum_k E,   lse = m + log l
    O = ((M * E) V) / ((1 - r) l)                                   (forward)
    dV = (M * E)^T (dO / ((1 - r) l))
    dS = P * (M * G / (1 - r) - c + dlse),   P = E / l,  G = dO V^T,  c = rowsum(dO * O)

c = sum_k P~ G is the FlashAttention identity (Dao et al. 2022): the row sum over k is an [q, d]
product instead of a pass over [q, k]. Autodiff of softmax -> dropout -> matmul writes P, the
dropped P~, their gradients and the row sum of dP * P. Here the forward writes M * E (normalised on
the [q, d] output), the backward G and dS, P is recomputed from the logits and the mask from its
hash; where a compiler cannot fuse the hash into the neighbouring products (XLA:CPU's XNNPACK
fusions), E and the masked G are arrays of their own as well. On this CPU (`python -m
lra_jax.tools.bench`) the softmax train step at 1K lost its dropout cost (+15% -> 0%) and at 2K both
steps got faster (10.1 / 13.3 s at dropout 0 / 0.1, from 14.5 / 18.4). Everything is float32
inside; O and dV come back in V's dtype, dS in S's. The backward keeps S and M * E, two [q, k]
arrays, where autodiff kept P and the mask: a compiler can recompute softmax's S from one matmul,
but not additive's tanh scores (18.4 GiB instead of 11.9 per TPU v3 core at 4K, Table 2).
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
    total = jnp.sum(e, axis=-1)
    kept = _kept(e, seed, rate).astype(values.dtype)
    scale = 1.0 / ((1.0 - rate) * total)  # [..., q]; total >= 1 (the row's maximum contributes exp(0))
    out = jnp.einsum("...qk,...kd->...qd", kept, values, preferred_element_type=jnp.float32) * scale[..., None]
    lse = m + jnp.log(total)
    return (out.astype(values.dtype), lse), (logits, values, seed, kept, m, scale, out)


def _backward(rate, residuals, cotangents):
    logits, values, seed, kept, m, scale, out = residuals
    d_out, d_lse = cotangents
    d_out32 = d_out.astype(jnp.float32)
    d_values = jnp.einsum("...qk,...qd->...kd", kept, (d_out32 * scale[..., None]).astype(values.dtype),
                          preferred_element_type=jnp.float32).astype(values.dtype)
    g = jnp.einsum("...qd,...kd->...qk", d_out, values, preferred_element_type=jnp.float32)
    c = jnp.sum(d_out32 * out, axis=-1) - d_lse  # [..., q]
    p = jnp.exp(logits.astype(jnp.float32) - m[..., None]) * ((1.0 - rate) * scale[..., None])  # not exp(S - lse):
    # lse rounds to m where |m| >> log l (a row without real keys: m = MASK_VALUE)
    d_logits = p * (_kept(g, seed, rate) * (1.0 / (1.0 - rate)) - c[..., None])
    return d_logits.astype(logits.dtype), d_values, None


_softmax_values.defvjp(lambda logits, values, seed, rate: _forward(logits, values, seed, rate), _backward)
