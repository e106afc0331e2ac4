"""Pallas chunked gated linear attention, forward and backward (GPU, Triton backend).

Per head, the recurrence of `reference` (eq. 1): S_t = diag(g_t) S_{t-1} + k_tᵀ v_t, y_t = q_t S_t (strict:
y_t = q_t diag(g_t) S_{t-1}). One program per (batch, head) walks the chunks of C steps in order, the
[d_k, d_v] state S in float32 on chip. Per chunk, with b the cumulative log-gate inside it and `last`
its value at the chunk's last step (every exponent <= 0):

    W_ts = Σ_j q_tj k_sj exp(b_tj - b_sj)   (s <= t; s < t when strict; [C, C])
    y    = W v + (q ⊙ exp(b)) S
    S   <- exp(last) ⊙ S + (k ⊙ exp(last - b))ᵀ v.

A gate per key dimension (GLA) forms the [C, C, d_k] decays on chip; one decay per head (SSD) makes
W = (q kᵀ) ⊙ exp(b_t - b_s), a [C, C] dot.

Backward (custom_vjp, nothing stored but the inputs): with dW = dy vᵀ on the pairs and E_tsj = exp(b_tj - b_sj),
    dq = Σ_s dW_ts E_ts k_s + (dy Sᵀ) ⊙ exp(b)                 chunks in order, S recomputed (kernel 1)
    dk = Σ_t dW_ts E_ts q_t + (v dSᵀ) ⊙ exp(last - b)            chunks in reverse, carrying dS (kernel 2)
    dv = Wᵀ dy + (k ⊙ exp(last - b)) dS,    dS <- exp(last) ⊙ dS + (q ⊙ exp(b))ᵀ dy,
and, since y depends on the log-gates only through q ⊙ exp(b) and k ⊙ exp(-b) with b the cumulative sum
over the whole sequence, d log g_t = Σ_{t' >= t} (q ⊙ dq - k ⊙ dk)_t' (summed over d_k for a scalar decay),
a reverse cumulative sum that kernel 2 carries across chunks (reading kernel 1's dq). Kernel 2 forms its
[C, C] tiles key-major (Wᵀ = (k qᵀ) ⊙ Eᵀ and dWᵀ = v dyᵀ, the decays indexed [s, t]), so that they enter
its dots as they stand: no [C, C] transpose, fewer registers.

Shapes: q, k [b, n, h, d_k], v [b, n, h, d_v], log g [b, n, h, d_k] or [b, n, h] (one decay per head);
n a multiple of the chunks, d_k and d_v powers of two >= 16 (the api pads with steps and columns that
add and decay nothing). y is float32; the gradients take their input's dtype. Backend: GPU via Triton;
`interpret=True` anywhere. Each kernel's chunk, warps and pipeline stages are chosen for the target GPU's
shared memory and for the registers ptxas needs, as fitted to its counts (`choose_tilings`, REGISTER_FIT).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from lra_jax.kernels import tiling
from lra_jax.kernels.matmul import dot


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """One chunk's inputs in float32 and its decays.

    q, k [C, d_k], v [C, d_v]; b [C, d_k] (or [C, 1], one decay per head): the cumulative log-gate inside the
    chunk; last [1, d_k] (or [1, 1]): its value at the last step; state_decay [d_k, 1] (or [1, 1]):
    exp(last) as it scales S's rows; pair_decay [C, C, d_k] (or [C, C]): exp(b_t - b_s) on the pairs
    (s <= t, s < t when strict), 0 elsewhere.
    """

    q: jax.Array
    k: jax.Array
    v: jax.Array
    b: jax.Array
    last: jax.Array
    state_decay: jax.Array
    pair_decay: jax.Array

    @property
    def scalar_decay(self) -> bool:
        return self.pair_decay.ndim == 2


def _read(ref, rows):
    """Rows of a [n, d] or [n] ref, in float32."""
    return (ref[rows] if len(ref.shape) == 1 else ref[rows, :]).astype(jnp.float32)


def _write(ref, rows, value):
    """Writes rows of a [n, d] or [n] ref in its dtype."""
    if len(ref.shape) == 1:
        ref[rows] = value.astype(ref.dtype)
    else:
        ref[rows, :] = value.astype(ref.dtype)


def _load(q_ref, k_ref, v_ref, g_ref, rows, strict: bool, keys_first: bool = False) -> _Chunk:
    """The chunk's rows and decays; `keys_first`: `pair_decay` indexed [s, t] (key, query), which the dk/dv
    kernel takes so that its [C, C] tiles are dot operands as they stand, without a transpose."""
    q, k, v, log_g = (_read(ref, rows) for ref in (q_ref, k_ref, v_ref, g_ref))  # log g [C, d_k], or [C]
    c = q.shape[0]
    row, col = jnp.arange(c)[:, None], jnp.arange(c)[None, :]
    t, s = (col, row) if keys_first else (row, col)
    pairs = s < t if strict else s <= t
    cumulative = jnp.cumsum(log_g, axis=0)
    total = jnp.sum(log_g, axis=0)
    # b_t - b_s over the pairs, indexed [t, s] or (keys_first) [s, t]
    exponent = lambda b: b[None] - b[:, None] if keys_first else b[:, None] - b[None]  # noqa: E731
    if log_g.ndim == 1:
        b = cumulative[:, None]
        last, state_decay = jnp.full((1, 1), total), jnp.full((1, 1), jnp.exp(total))
        pair_decay = jnp.exp(jnp.where(pairs, exponent(cumulative), -jnp.inf))
    else:
        b = cumulative
        last, state_decay = total[None, :], jnp.exp(total)[:, None]
        pair_decay = jnp.exp(jnp.where(pairs[:, :, None], exponent(b), -jnp.inf))
    return _Chunk(q, k, v, b, last, state_decay, pair_decay)


def _weights(a, b, pair_decay):
    """[C, C]: Σ_j a_rj b_cj decay_rcj (decay_rc with one decay per head) on the pairs, 0 elsewhere. With
    (a, b) = (q, k) and the decays indexed [t, s] it is W; with (k, q) and [s, t], Wᵀ."""
    if pair_decay.ndim == 2:
        return dot(a, b, trans_b=True) * pair_decay
    return jnp.sum(a[:, None, :] * b[None, :, :] * pair_decay, axis=2)


def _apply(dw, x, pair_decay):
    """[C, d_k]: Σ_c dw_rc decay_rc ⊙ x_c, a [C, C] cotangent of the weights taken to the rows' side: dq from
    (dW, k) with the decays indexed [t, s], dk from (dWᵀ, q) with them indexed [s, t]."""
    if pair_decay.ndim == 2:
        return dot(dw * pair_decay, x)
    return jnp.sum(dw[:, :, None] * x[None, :, :] * pair_decay, axis=1)


def _next_state(chunk: _Chunk, state):
    """S after the chunk: exp(last) ⊙ S + (k ⊙ exp(last - b))ᵀ v."""
    return chunk.state_decay * state + dot(chunk.k * jnp.exp(chunk.last - chunk.b), chunk.v, trans_a=True)


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, y_ref, *, chunk, num_chunks, strict):
    def body(c, state):
        rows = pl.ds(c * chunk, chunk)
        ch = _load(q_ref, k_ref, v_ref, g_ref, rows, strict)
        y = dot(_weights(ch.q, ch.k, ch.pair_decay), ch.v) + dot(ch.q * jnp.exp(ch.b), state)
        _write(y_ref, rows, y)
        return _next_state(ch, state)

    lax.fori_loop(0, num_chunks, body, jnp.zeros((q_ref.shape[1], v_ref.shape[1]), jnp.float32))


def _dq_kernel(q_ref, k_ref, v_ref, g_ref, dy_ref, dq_ref, *, chunk, num_chunks, strict):
    """Kernel 1: chunks in order, S recomputed: dq = Σ_s dW_ts E_ts k_s + (dy Sᵀ) ⊙ exp(b)."""
    def body(c, state):
        rows = pl.ds(c * chunk, chunk)
        ch = _load(q_ref, k_ref, v_ref, g_ref, rows, strict)
        dy = _read(dy_ref, rows)
        dq = _apply(dot(dy, ch.v, trans_b=True), ch.k, ch.pair_decay) + dot(dy, state, trans_b=True) * jnp.exp(ch.b)
        _write(dq_ref, rows, dq)
        return _next_state(ch, state)

    lax.fori_loop(0, num_chunks, body, jnp.zeros((q_ref.shape[1], v_ref.shape[1]), jnp.float32))


def _dkv_kernel(q_ref, k_ref, v_ref, g_ref, dy_ref, dq_ref, dk_ref, dv_ref, dg_ref, *, chunk, num_chunks, strict):
    """Kernel 2: chunks in reverse, carrying dS and the log-gates' gradient summed over later chunks."""
    def body(i, carry):
        d_state, d_gate_later = carry
        rows = pl.ds((num_chunks - 1 - i) * chunk, chunk)
        ch = _load(q_ref, k_ref, v_ref, g_ref, rows, strict, keys_first=True)  # decays [s, t]: no transposes
        dy = _read(dy_ref, rows)
        key_decay = jnp.exp(ch.last - ch.b)  # [C, d_k|1]
        dv = dot(_weights(ch.k, ch.q, ch.pair_decay), dy) + dot(ch.k * key_decay, d_state)  # Wᵀ dy + ...
        _write(dv_ref, rows, dv)
        dw_t = dot(ch.v, dy, trans_b=True)  # dWᵀ [s, t]
        d_state_in = dot(ch.q * jnp.exp(ch.b), dy, trans_a=True)
        dk = _apply(dw_t, ch.q, ch.pair_decay) + dot(ch.v, d_state, trans_b=True) * key_decay
        _write(dk_ref, rows, dk)
        dq = _read(dq_ref, rows)
        d_cumulative = ch.q * dq - ch.k * dk  # dL/db_t over the whole sequence's cumulative log-gate
        if ch.scalar_decay:
            d_cumulative = jnp.sum(d_cumulative, axis=1)
        chunk_total = jnp.sum(d_cumulative, axis=0)
        # Σ_{t' >= t} inside the chunk (Triton has only forward cumulative sums), then the later chunks'
        d_gate = chunk_total - jnp.cumsum(d_cumulative, axis=0) + d_cumulative + d_gate_later
        _write(dg_ref, rows, d_gate)
        return ch.state_decay * d_state + d_state_in, d_gate_later + chunk_total

    dk_width, dv_width = q_ref.shape[1], v_ref.shape[1]
    gate_width = () if len(g_ref.shape) == 1 else (dk_width,)
    lax.fori_loop(0, num_chunks, body, (jnp.zeros((dk_width, dv_width), jnp.float32),
                                        jnp.zeros(gate_width, jnp.float32)))


KERNELS = ("forward", "dq", "dkv")  # gated_scan_fwd, gated_scan_bwd_dq, gated_scan_bwd_dkv: one tiling each
WARPS = (4, 8)  # tried in order; 8 only with a gate per key dimension (below)

# The registers per thread ptxas needs for a kernel at chunk C, widths d_k and d_v and T = 32 x warps threads:
#     a + (b C d_k + c C d_v + e C² + f d_k d_v + g C² d_k) / T      (g: the [C, C, d_k] decays of a gate per key dim)
# by (kernel, one decay per head). Fitted to ptxas 12.9 for sm_90a (H100) on the kernels compiled by XLA:GPU through
# Triton (jax 0.12): per kernel, the least `.maxnreg` at which ptxas did not spill, over C in {16, 32, 64} (per-key
# gate: 16, 32), d_k in {16, 32, 64}, d_v in {16, 32, 64} (per-key gate: to 128), 4 warps (per-key gate: 8 too),
# float32 and some bfloat16 (the PTX XLA compiled, run through ptxas with a `.maxnreg` cap, bisected). It is the
# least upper envelope of those counts with non-negative weights (a linear program), and above 255 wherever ptxas
# spilled at its default of 255; so it grows with every width and shrinks with more warps. With one decay per head
# 8 warps saved ptxas few registers (the SSD dk/dv kernel at C = 64 needed 241 at 8 warps and spilled 96 bytes at
# 4), so those kernels keep 4 warps and take smaller chunks instead. tests/kernels/test_gated_scan_kernel.py
# holds the counts the planner's choices rest on.
REGISTER_FIT = {
    ("forward", True): (75, 3.5, 9.38, 1.42, 0.0, 0.0),
    ("forward", False): (56, 13.17, 0.0, 0.0, 0.67, 1.15),
    ("dq", True): (124, 0.0, 12.0, 0.0, 0.0, 0.0),
    ("dq", False): (118, 0.0, 5.38, 1.67, 0.0, 0.72),
    ("dkv", True): (137, 10.02, 3.94, 0.14, 1.97, 0.0),
    ("dkv", False): (220, 0.0, 0.87, 1.55, 1.2, 0.19),
}
# Registers kept free below a thread's 255 on top of the fit: ptxas inside XLA (nvJitLink) allocates a few more
# than the ptxas binary the fit was measured with (184 bytes spilled against 160 for the same kernel), and shapes
# between the measured ones may need more than the envelope says.
REGISTER_MARGIN = 12


def registers(kernel: str, block: int, dk: int, dv: int, scalar_decay: bool, num_warps: int) -> float:
    """The fitted registers per thread ptxas needs for `kernel` at chunk `block` (REGISTER_FIT)."""
    a, b, c, e, f, g = REGISTER_FIT[kernel, scalar_decay]
    tiles = b * block * dk + c * block * dv + e * block * block + f * dk * dv + g * block * block * dk
    return a + tiles / (32 * num_warps)


def live_elements(kernel: str, block: int, dk: int, dv: int, scalar_decay: bool, num_warps: int) -> float:
    """`registers` plus the margin as `tiling.choose`'s bound counts them: elements per program that, over the
    32 x num_warps threads and with `tiling.SCALAR_REGISTERS`, give those registers."""
    fitted = registers(kernel, block, dk, dv, scalar_decay, num_warps) + REGISTER_MARGIN
    return (fitted - tiling.SCALAR_REGISTERS) * 32 * num_warps


def shared_memory_bytes(kernel: str, block: int, dk: int, dv: int, num_stages: int) -> int:
    """An upper bound of a kernel's shared memory, 4 bytes an element: the dot operands held across a chunk
    (S or dS [d_k, d_v], W and dW [C, C], the decayed q and k [C, d_k]) and `num_stages` copies of the
    chunk's loaded rows (q, k, log g [C, d_k], v [C, d_v]; the backward kernels also dy [C, d_v] and dq [C, d_k])."""
    held = dk * dv + 2 * block * block + 2 * block * dk
    rows = block * ((3 * dk + dv) if kernel == "forward" else (4 * dk + 2 * dv))
    return 4 * (held + num_stages * rows)


def _choose(kernel: str, chunk: int, dk: int, dv: int, scalar_decay: bool, limit: int) -> tiling.Tiling:
    """The largest chunk (then the most stages) within the shared memory and the register fit, at 4 warps or,
    with a gate per key dimension, 8 where 4 allow only a smaller chunk or none."""
    best, error = None, None
    for num_warps in WARPS[:1] if scalar_decay else WARPS:
        try:
            elements = lambda block, _, warps=num_warps: live_elements(  # noqa: E731
                kernel, block, dk, dv, scalar_decay, warps)
            found = tiling.choose(
                f"gated scan {kernel}", lambda block, _, stages: shared_memory_bytes(kernel, block, dk, dv, stages),
                chunk, chunk, limit=limit, num_warps=num_warps, live_elements=elements)
        except tiling.TilingError as refused:
            error = error or refused
            continue
        if best is None or found.block_q > best.block_q:
            best = found
    if best is None:
        raise error
    return best


def choose_tilings(chunk: int, dk: int, dv: int, scalar_decay: bool) -> tuple[tiling.Tiling, ...]:
    """The (forward, dq, dk/dv) kernels' tilings (KERNELS) for d_k and d_v (padded) on the target GPU, chunks of
    at most `chunk` steps (`block_q`), each kernel its own. Raises `tiling.TilingError` where even 16-step chunks
    do not fit one of them."""
    limit = tiling.shared_memory()
    return tuple(_choose(kernel, chunk, dk, dv, scalar_decay, limit) for kernel in KERNELS)


@dataclasses.dataclass(frozen=True)
class KernelStatic:
    """What the kernels are compiled for: the (forward, dq, dk/dv) `tiling.Tiling`s (`choose_tilings`; each
    `block_q` is that kernel's chunk and divides n), whether the current step is left out, and the interpreter."""

    tiles: tuple[tiling.Tiling, tiling.Tiling, tiling.Tiling]
    strict: bool = False
    interpret: bool = False


def _specs(q, v, log_g):
    """Each program's whole sequence of one (batch, head): [n, d] blocks, log g [n, d_k] or [n]."""
    n = q.shape[1]
    rows = lambda width: pl.BlockSpec((None, n, None, width), lambda bb, hh: (bb, 0, hh, 0))  # noqa: E731
    gate = (pl.BlockSpec((None, n, None), lambda bb, hh: (bb, 0, hh)) if log_g.ndim == 3
            else rows(log_g.shape[-1]))
    return rows(q.shape[-1]), rows(v.shape[-1]), gate


def _call(kernel, name, tile, static, q, v, log_g, inputs, outputs):
    fq, fv, fg = _specs(q, v, log_g)
    spec_of = {"q": fq, "v": fv, "g": fg}
    chunk = tile.block_q
    return pl.pallas_call(
        functools.partial(kernel, chunk=chunk, num_chunks=q.shape[1] // chunk, strict=static.strict),
        grid=q.shape[0:1] + q.shape[2:3],
        in_specs=[spec_of[kind] for kind, _ in inputs],
        out_specs=[spec_of[kind] for kind, _ in outputs],
        out_shape=[shape for _, shape in outputs],
        compiler_params=tile.compiler_params(),
        interpret=static.interpret,
        name=name,
    )(*(array for _, array in inputs))


def _forward(q, k, v, log_g, static: KernelStatic):
    (y,) = _call(_forward_kernel, "gated_scan_fwd", static.tiles[0], static, q, v, log_g,
                 [("q", q), ("q", k), ("v", v), ("g", log_g)],
                 [("v", jax.ShapeDtypeStruct(v.shape, jnp.float32))])
    return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def gated_scan(q, k, v, log_g, static: KernelStatic):
    """y [b, n, h, d_v] in float32 (module docstring)."""
    return _forward(q, k, v, log_g, static)


def _gated_scan_fwd(q, k, v, log_g, static: KernelStatic):
    return _forward(q, k, v, log_g, static), (q, k, v, log_g)


def _gated_scan_bwd(static: KernelStatic, residuals, dy):
    q, k, v, log_g = residuals
    like = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    inputs = [("q", q), ("q", k), ("v", v), ("g", log_g), ("v", dy)]
    # dq in float32: kernel 2 reads it back for the log-gates' gradient
    (dq,) = _call(_dq_kernel, "gated_scan_bwd_dq", static.tiles[1], static, q, v, log_g, inputs,
                  [("q", jax.ShapeDtypeStruct(q.shape, jnp.float32))])
    dk, dv, dg = _call(_dkv_kernel, "gated_scan_bwd_dkv", static.tiles[2], static, q, v, log_g,
                       inputs + [("q", dq)], [("q", like(k)), ("v", like(v)), ("g", like(log_g))])
    return dq.astype(q.dtype), dk, dv, dg


gated_scan.defvjp(_gated_scan_fwd, _gated_scan_bwd)
