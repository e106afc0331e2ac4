"""Pure-jnp chunked gated linear attention: the XLA form of the gated scan and the oracle for its kernel.

Per head, a [d_k, d_v] state with a decay per key dimension (GLA, Yang et al. 2024, Sec. 3.3; Mamba-2's
SSD, Dao and Gu 2024, Sec. 6, where the decay is one scalar per head):

    S_t = diag(g_t) S_{t-1} + k_tᵀ v_t,    y_t = q_t S_t    (strict: y_t = q_t diag(g_t) S_{t-1})      (1)

Unrolled, y_t = Σ_{s<=t} (q_t ⊙ exp(b_t - b_s)) · k_s v_s with b_t = Σ_{i<=t} log g_i (s < t when strict).
In chunks of C steps: inside a chunk that weighted sum directly ([C, C] weights, per key dimension
unless the decay is a scalar), across chunks the state S carried by a scan; every exponent is <= 0
(b_t - b_s for s <= t, `last - b_s` for the state update), so nothing overflows. O(n C d_k + n d_k d_v)
work in O(C² d_k + (n / C) d_k d_v) memory. Shapes: q, k [b n h d_k], v [b n h d_v], log g [b n h d_k]
(GLA) or [b n h 1] (SSD), log g <= 0; y [b n h d_v] in float32. `recurrent` is (1) step by step: the
oracle the chunked form and the kernel are held to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

Heads = Float[Array, "b n h d"]


def pad_steps(x: Heads, n: int) -> Heads:
    """x [b m h d] padded at the end to n steps with zeros: steps that add nothing (k = v = 0) and decay
    nothing (log g = 0), so the real steps' outputs of (1) do not change."""
    return jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, 0)))


def recurrent(q: Heads, k: Heads, v: Heads, log_g: Heads, *, chunk: int | None = None, strict: bool = False) -> Heads:
    """(1) one step at a time in float32 (`chunk` unused); `strict`: y_t = q_t diag(g_t) S_{t-1}, the current
    step left out."""
    def step(state, inputs):
        q_t, k_t, v_t, g_t = inputs
        decayed = jnp.exp(g_t)[..., None] * state  # [b h dk dv]
        new = decayed + k_t[..., None] * v_t[..., None, :]
        y = jnp.einsum("bhk,bhkv->bhv", q_t, decayed if strict else new)
        return new, y

    b, _, h, dk = k.shape
    inputs = tuple(jnp.swapaxes(x.astype(jnp.float32), 0, 1) for x in (q, k, v, log_g))
    _, y = jax.lax.scan(step, jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32), inputs)
    return jnp.swapaxes(y, 0, 1)


def chunked(q: Heads, k: Heads, v: Heads, log_g: Heads, *, chunk: int, strict: bool = False) -> Heads:
    """(1) in chunks of `chunk` steps, in float32, any length (padded to a multiple of `chunk` inside).
    `log_g` [b n h 1] is one decay per head (SSD), which makes the weights inside a chunk a [C, C] matrix per
    head rather than [C, C, d_k]."""
    b, n, h, dk = k.shape
    scalar_decay = log_g.shape[-1] == 1
    dv = v.shape[-1]
    c = max(1, min(chunk, n))
    padded = -(-n // c) * c
    split = lambda x: jnp.moveaxis(pad_steps(x.astype(jnp.float32), padded).reshape(b, padded // c, c, h, -1), 1, 0)
    q, k, v, log_g = (split(x) for x in (q, k, v, log_g))  # [m b c h .]
    cumulative = jnp.cumsum(log_g, axis=2)  # b_t within the chunk, [m b c h dk|1]
    pairs = jnp.tril(jnp.ones((c, c), bool), -1 if strict else 0)  # s < t, or s <= t

    @jax.checkpoint  # the backward pass recomputes a chunk's [C, C, d_k] weights rather than keep every chunk's
    def one_chunk(state, chunk_inputs):
        q_c, k_c, v_c, b_c = chunk_inputs
        # inside the chunk: Σ_s Σ_j q_tj k_sj exp(b_tj - b_sj) v_s, the exponent <= 0 wherever s <= t
        decay = jnp.where(pairs[:, :, None, None], b_c[:, :, None] - b_c[:, None, :], -jnp.inf)  # [b t s h dk|1]
        if scalar_decay:  # one decay per head: the [t, s] weights are q k^T scaled, no [C, C, d_k] tensor
            weights = jnp.einsum("bthj,bshj->bhts", q_c, k_c) * jnp.exp(jnp.moveaxis(decay[..., 0], 3, 1))
        else:
            weights = jnp.einsum("bthj,bshj,btshj->bhts", q_c, k_c, jnp.exp(decay))
        y = jnp.einsum("bhts,bshv->bthv", weights, v_c)
        y = y + jnp.einsum("bthj,bhjv->bthv", q_c * jnp.exp(b_c), state)  # the state from earlier chunks
        last = b_c[:, -1:]  # the chunk's whole decay
        state = (jnp.exp(last[:, 0])[..., None] * state
                 + jnp.einsum("bshj,bshv->bhjv", k_c * jnp.exp(last - b_c), v_c))
        return state, y

    _, y = jax.lax.scan(one_chunk, jnp.zeros((b, h, dk, dv), jnp.float32), (q, k, v, cumulative))
    return jnp.moveaxis(y, 0, 1).reshape(b, padded, h, dv)[:, :n]
