"""Pure-jnp selective scan (Mamba's S6; Gu and Dao 2023, Algorithm 2): the XLA form of the op and the oracle
its kernel is held to.

Per inner channel e, a state h [N] with a decay per state dimension that depends on the step:

    h_t = exp(Δ_t A) ⊙ h_{t-1} + (Δ_t x_t) B_t,    y_t = C_t · h_t                               (1)

Shapes: Δ, x [b n E] (Δ > 0), A [E N] (< 0), B, C [b n N] (shared by the channels); y [b n E] in float32.
`recurrent` is (1) one step at a time; `chunked` runs it in chunks of C steps, a parallel scan inside each
chunk (`linear_recurrence.linear_scan`) over its [b C E N] states, which are read out there and never kept,
the state carried from chunk to chunk, and each chunk recomputed in the backward pass: memory
O(n E + (n / C) E N), not O(n E N).
Padded steps (Δ = 0, x = 0) leave the state as it is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from lra_jax.kernels.linear_recurrence import linear_scan

Channels = Float[Array, "b n e"]
States = Float[Array, "b n s"]


def recurrent(dt: Channels, a: Float[Array, "e s"], x: Channels, b: States, c: States, *,
              chunk: int | None = None) -> Channels:
    """(1) one step at a time in float32 (`chunk` unused)."""
    def step(h, inputs):
        dt_t, x_t, b_t, c_t = inputs
        h = jnp.exp(dt_t[..., None] * a) * h + (dt_t * x_t)[..., None] * b_t[:, None, :]
        return h, jnp.einsum("bes,bs->be", h, c_t)

    inputs = tuple(jnp.swapaxes(v.astype(jnp.float32), 0, 1) for v in (dt, x, b, c))
    _, y = jax.lax.scan(step, jnp.zeros((x.shape[0], x.shape[2], a.shape[-1]), jnp.float32), inputs)
    return jnp.swapaxes(y, 0, 1)


def chunked(dt: Channels, a: Float[Array, "e s"], x: Channels, b: States, c: States, *, chunk: int) -> Channels:
    """(1) in chunks of `chunk` steps (module docstring), any length, in float32."""
    batch, n, inner = x.shape
    chunk = max(1, min(chunk, n))
    extra = -n % chunk  # appended steps with Δ = 0 and x = 0: h unchanged, y discarded
    split = lambda v: jnp.moveaxis(  # noqa: E731
        jnp.pad(v.astype(jnp.float32), ((0, 0), (0, extra), (0, 0))).reshape(batch, -1, chunk, v.shape[-1]), 1, 0)

    @jax.checkpoint
    def one_chunk(h, inputs):
        dt_c, x_c, b_c, c_c = inputs
        decay = jnp.exp(dt_c[..., None] * a)  # [b C e s]
        u = (dt_c * x_c)[..., None] * b_c[:, :, None, :]
        u = u.at[:, 0].add(decay[:, 0] * h)  # the state carried in enters at the chunk's first step
        states = linear_scan(decay, u)
        return states[:, -1], jnp.einsum("bces,bcs->bce", states, c_c)

    _, y = jax.lax.scan(one_chunk, jnp.zeros((batch, inner, a.shape[-1]), jnp.float32),
                        tuple(split(v) for v in (dt, x, b, c)))
    return jnp.moveaxis(y, 0, 1).reshape(batch, -1, inner)[:, :n]
