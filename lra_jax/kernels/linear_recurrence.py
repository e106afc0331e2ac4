"""The linear recurrence h_t = a_t ⊙ h_{t-1} + b_t from h = 0, by a parallel associative scan (Blelloch 1990;
the operator (a1, b1) • (a2, b2) = (a1 a2, a2 b1 + b2), Smith et al. 2023, Sec. 2.2): O(n) work at O(log n)
depth. The S4D-family layers (`lra_jax.attention.recurrent.diagonal`) and the selective scan's XLA form
(`selective_scan.reference`) run it; `sequential_scan` is the step-by-step form the tests hold it to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array


def linear_scan(a: Array, b: Array, *, reverse: bool = False) -> Array:
    """h_t = a_t ⊙ h_{t-1} + b_t from h = 0 along axis 1 of b [b n ...] (from the end when `reverse`), by an
    associative scan; `a` is one transition for every step ([...], time-invariant) or one per step ([b n ...])."""
    def combine(left, right):
        a_left, b_left = left
        a_right, b_right = right
        return a_left * a_right, a_right * b_left + b_right

    powers = jnp.broadcast_to(a, b.shape)
    return jax.lax.associative_scan(combine, (powers, b), axis=1, reverse=reverse)[1]


def sequential_scan(a: Array, b: Array, *, reverse: bool = False) -> Array:
    """The same recurrence one step at a time (`lax.scan`): the reference of `linear_scan`."""
    def step(h, a_and_b):
        a_t, b_t = a_and_b
        h = a_t * h + b_t
        return h, h

    a = jnp.broadcast_to(a, b.shape)
    steps = (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1))
    _, states = jax.lax.scan(step, jnp.zeros(b.shape[:1] + b.shape[2:], b.dtype), steps, reverse=reverse)
    return jnp.swapaxes(states, 0, 1)
