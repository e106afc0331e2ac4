"""Pallas kernels for blockwise online-softmax attention, forward and backward (GPU, Triton backend).

FlashAttention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient
Exact Attention with IO-Awareness", Algorithm 1 forward, Algorithm 2 backward;
the loop order of FlashAttention-2, Dao 2023): each program owns one block of
B_q queries, streams key/value blocks of B_k through on-chip memory and keeps
the running row maximum m, the running normaliser l and the unnormalised output

    m' = max(m, rowmax(S)),  P = exp(S - m'),  l' = e^{m - m'} l + rowsum(P),
    O' = e^{m - m'} O + P V,           S = scale * Q K^T (masked),

so no n x n matrix is ever materialised. The forward saves the log-sum-exp
L = m + log l per row; the backward recomputes P = exp(S - L) block by block:
one kernel per key block accumulates dV = P^T dO and dK = scale * dS^T Q over
its query blocks, one kernel per query block accumulates dQ = scale * dS K,
with dS = P * (dO V^T - D) and D = rowsum(dO * O) (computed by XLA).

Attention dropout at rate r (static; 0 compiles none of it) uses the mask of
`lra_jax.kernels.dropout`, drawn tile by tile from the seed and the tile's
coordinates in the forward pass and drawn again in the backward pass: with
Z = P * keep / (1 - r) the forward accumulates Z V (l stays the sum of P), and
the backward uses dV = Z^T dO and dS = P * (dP - D) with dP = (dO V^T) * keep / (1 - r);
D = rowsum(dO * O) is unchanged, since rowsum(dP * P) = rowsum(dO * O).

The same kernels serve block-sparse attention: with a `layout` (per query block
[count, key block indices...], and its transpose per key block) the loops visit
only the listed blocks, and the element rule of `lra_jax.kernels.masking`
masks pairs inside a visited block (band edges, segments, global tokens).

Shapes: q [b, nq, h, d], k, v [b, nk, h, d], nq % B_q == 0, nk % B_k == 0, d a
power of two >= 16 (the api pads); accumulation is float32 whatever the input
dtype (float32 or bfloat16). Masked logits are a finite -1e30 and masked
probabilities are zeroed explicitly; a row with no allowed key keeps l = 0 and
outputs 0 with L = 0: no 0/0 and no -inf - -inf.

Backend: GPU through Triton (`plgpu.CompilerParams`, passed explicitly because
jax 0.10 otherwise lowers `pl.pallas_call` with Mosaic GPU); blocks, warps and stages
are chosen for the target GPU's shared memory and registers (`choose_tiling`,
`lra_jax.kernels.tiling`). Runs anywhere with
`interpret=True`. Not TPU: the lse/code blocks are not (8, 128)-tiled.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxtyping import Array, Int, UInt32

from lra_jax.kernels import dropout, masking, tiling
from lra_jax.kernels.matmul import dot as _dot


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["key_code", "query_code", "q_seg", "k_seg", "seed", "layout", "layout_t"],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class KernelInputs:
    """The arrays of one call besides q, k, v, on the padded, block-aligned lengths.

    key_code: int32 [b, nk], `masking.KeyCode` per key. query_code: int32 [nq] (`KeyCode.GLOBAL`
    marks a global query). q_seg, k_seg: int32 [nq], [nk] segment ids. seed: uint32 [2],
    `dropout_state`: the dropout seed and the first row's index in the whole batch (unused at rate 0).
    layout, layout_t: None (dense) or int32 [nq / B_q, W], [nk / B_k, W']: per query (key) block
    [count, block indices...] (`lra_jax.kernels.block_sparse.layout`).
    """

    key_code: Int[Array, "b k"]
    query_code: Int[Array, "q"]
    q_seg: Int[Array, "q"]
    k_seg: Int[Array, "k"]
    seed: UInt32[Array, "2"]
    layout: Int[Array, "qb w"] | None = None
    layout_t: Int[Array, "kb w"] | None = None

    @classmethod
    def dense(cls, key_code: Int[Array, "b k"], nq: int, seed: UInt32[Array, "2"]) -> KernelInputs:
        """Key padding only: no global queries, one segment, no layout."""
        zeros = lambda n: jnp.zeros((n,), jnp.int32)  # noqa: E731
        return cls(key_code, zeros(nq), zeros(nq), zeros(key_code.shape[1]), seed)


@dataclasses.dataclass(frozen=True)
class KernelStatic:
    """What the kernels are compiled for: the softmax scale, the blocks, warps and stages (`choose_tiling`),
    the element rule (None: key padding only), the attention dropout rate and the interpreter."""

    scale: float
    tiles: tiling.Tiling
    rule: masking.MaskRule | None = None
    dropout_rate: float = 0.0
    interpret: bool = False


def _scores(q, k, q_pos, k_pos, key_code, query_code, q_seg, k_seg, scale, rule):
    """Masked scaled logits [B_q, B_k] (float32) and the allowed-pair mask."""
    ok = masking.allowed(q_pos, k_pos, key_code, query_code, q_seg, k_seg, rule)
    s = _dot(q, k, trans_b=True) * scale
    return jnp.where(ok, s, masking.MASK_VALUE), ok


def _head(seed_ref, rate):
    """The dropout hash state of this program's (batch, head), its batch index offset by the call's
    first row in the whole batch (`seed_ref` = [seed, first row]); None without dropout."""
    if rate == 0.0:
        return None
    u32 = lambda x: jnp.asarray(x, jnp.uint32)  # noqa: E731
    batch = seed_ref[1] + u32(pl.program_id(1))
    return dropout.head_bits(seed_ref[0], batch * u32(pl.num_programs(2)) + u32(pl.program_id(2)))


def _dropped(x, head, q_pos, k_pos, rate, kept=None):
    """Tile `x` [B_q, B_k] times keep / (1 - rate) (`x` itself without dropout); `kept`: the tile's
    mask if already drawn."""
    if rate == 0.0:
        return x
    kept = dropout.keep(head, q_pos, k_pos, rate) if kept is None else kept
    return jnp.where(kept, x * (1.0 / (1.0 - rate)), 0.0)


def _fwd_kernel(layout_ref, q_ref, k_ref, v_ref, key_code_ref, query_code_ref, q_seg_ref, k_seg_ref, seed_ref,
                o_ref, lse_ref, *, scale, rule, block_k, num_k_blocks, sparse, rate):
    block_q, d = q_ref.shape
    q_start = pl.program_id(0) * block_q
    q = q_ref[...]
    q_pos = q_start + jnp.arange(block_q)
    query_code, q_seg = query_code_ref[...], q_seg_ref[...]
    head = _head(seed_ref, rate)

    def body(t, carry):
        acc, m, l = carry
        j = layout_ref[t + 1] if sparse else t
        keys = pl.ds(j * block_k, block_k)
        k, v = k_ref[keys, :], v_ref[keys, :]
        k_pos = j * block_k + jnp.arange(block_k)
        s, ok = _scores(q, k, q_pos, k_pos, key_code_ref[keys], query_code, q_seg, k_seg_ref[keys], scale, rule)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.where(ok, jnp.exp(s - m_new[:, None]), 0.0)
        alpha = jnp.exp(m - m_new)
        l = alpha * l + jnp.sum(p, axis=1)
        acc = alpha[:, None] * acc + _dot(_dropped(p, head, q_pos, k_pos, rate).astype(v.dtype), v)
        return acc, m_new, l

    init = (jnp.zeros((block_q, d), jnp.float32), jnp.full((block_q,), masking.MASK_VALUE, jnp.float32),
            jnp.zeros((block_q,), jnp.float32))
    trips = layout_ref[0] if sparse else num_k_blocks
    acc, m, l = lax.fori_loop(0, trips, body, init)
    seen = l > 0.0
    l_safe = jnp.where(seen, l, 1.0)
    o_ref[...] = jnp.where(seen[:, None], acc / l_safe[:, None], 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), 0.0)


def _dq_kernel(layout_ref, q_ref, k_ref, v_ref, key_code_ref, query_code_ref, q_seg_ref, k_seg_ref, seed_ref,
               do_ref, lse_ref, delta_ref, dq_ref, *, scale, rule, block_k, num_k_blocks, sparse, rate):
    block_q, d = q_ref.shape
    q_start = pl.program_id(0) * block_q
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    q_pos = q_start + jnp.arange(block_q)
    query_code, q_seg = query_code_ref[...], q_seg_ref[...]
    head = _head(seed_ref, rate)

    def body(t, dq):
        j = layout_ref[t + 1] if sparse else t
        keys = pl.ds(j * block_k, block_k)
        k, v = k_ref[keys, :], v_ref[keys, :]
        k_pos = j * block_k + jnp.arange(block_k)
        s, ok = _scores(q, k, q_pos, k_pos, key_code_ref[keys], query_code, q_seg, k_seg_ref[keys], scale, rule)
        p = jnp.where(ok, jnp.exp(s - lse[:, None]), 0.0)
        dp = _dropped(_dot(do, v, trans_b=True), head, q_pos, k_pos, rate)
        ds = p * (dp - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    trips = layout_ref[0] if sparse else num_k_blocks
    dq = lax.fori_loop(0, trips, body, jnp.zeros((block_q, d), jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(layout_ref, q_ref, k_ref, v_ref, key_code_ref, query_code_ref, q_seg_ref, k_seg_ref, seed_ref,
                do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, scale, rule, block_q, num_q_blocks, sparse, rate):
    block_k, d = k_ref.shape
    k_start = pl.program_id(0) * block_k
    k, v = k_ref[...], v_ref[...]
    k_pos = k_start + jnp.arange(block_k)
    key_code, k_seg = key_code_ref[...], k_seg_ref[...]
    head = _head(seed_ref, rate)

    def body(t, carry):
        dk, dv = carry
        i = layout_ref[t + 1] if sparse else t
        rows = pl.ds(i * block_q, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        lse, delta = lse_ref[rows], delta_ref[rows]
        q_pos = i * block_q + jnp.arange(block_q)
        s, ok = _scores(q, k, q_pos, k_pos, key_code, query_code_ref[rows], q_seg_ref[rows], k_seg, scale, rule)
        p = jnp.where(ok, jnp.exp(s - lse[:, None]), 0.0)
        kept = dropout.keep(head, q_pos, k_pos, rate) if rate else None  # drawn once for dV and dP
        dv = dv + _dot(_dropped(p, head, q_pos, k_pos, rate, kept).astype(do.dtype), do, trans_a=True)
        dp = _dropped(_dot(do, v, trans_b=True), head, q_pos, k_pos, rate, kept)
        ds = p * (dp - delta[:, None])
        dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True)
        return dk, dv

    trips = layout_ref[0] if sparse else num_q_blocks
    zeros = jnp.zeros((block_k, d), jnp.float32)
    dk, dv = lax.fori_loop(0, trips, body, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


NUM_WARPS = 4  # 8 warps did not lower the registers per thread here (ptxas: both spill at 64 x 64, d = 64)


def shared_memory_bytes(block_q: int, block_k: int, d: int, num_stages: int) -> int:
    """An upper bound of the shared memory each of the three kernels requests (the largest), at 4 bytes an
    element whatever the input dtype: the tiles its loop loads (`num_stages` copies: K and V with their
    key codes and segment ids in the forward and dQ kernels; Q, dO and four row vectors in the dK/dV
    kernel), the loop-invariant dot operands (Q; Q and dO; K and V) and a [B_q, B_k] conversion tile
    per dot of P or dS (one forward, one dQ, two dK/dV)."""
    forward = 4 * (block_q * d + num_stages * 2 * block_k * d + block_q * block_k) + num_stages * 8 * block_k
    dq = 4 * (2 * block_q * d + num_stages * 2 * block_k * d + block_q * block_k) + num_stages * 8 * block_k
    dkv = 4 * (2 * block_k * d + num_stages * 2 * block_q * d + 2 * block_q * block_k) + num_stages * 16 * block_q
    return max(forward, dq, dkv)


def live_elements(block_q: int, block_k: int, d: int) -> int:
    """Tile elements the backward kernels keep live per program (the forward keeps fewer): the
    accumulators and loop-invariant operands of the block a kernel owns, the operands of the block it
    streams and the [B_q, B_k] score tiles. The weights (5, 4, 3) are fitted to ptxas's register counts
    of the dK/dV kernel on A100 (-v, head dims 16-64, blocks 16-64, dropout on and off): above 191
    elements per thread (255 registers less the scalars) it spilled, at or below it did not."""
    dkv = 5 * block_k * d + 4 * block_q * d + 3 * block_q * block_k
    dq = 5 * block_q * d + 4 * block_k * d + 3 * block_q * block_k
    return max(dkv, dq)


def choose_tiling(block_q: int, block_k: int, d: int) -> tiling.Tiling:
    """The blocks and stages for head dim `d` (padded) on the target GPU, at most the requested blocks,
    within the shared memory and the register bound (no spill)."""
    return tiling.choose("flash attention", lambda bq, bk, stages: shared_memory_bytes(bq, bk, d, stages),
                         block_q, block_k, limit=tiling.shared_memory(), num_warps=NUM_WARPS,
                         live_elements=lambda bq, bk: live_elements(bq, bk, d))


# The dense kernel's blocks (B_q, B_k) by padded head dim on GPUs with Hopper's shared memory (H100, H200),
# timed there (`python -m lra_jax.tools.tiling_sweep`, experiments/results/tilings-gpu-NVIDIA_H200.json):
# ptxas spills a few registers at these blocks, which costs less than the register bound's smaller ones.
HOPPER_BLOCKS = {64: (64, 64), 128: (64, 32)}


def choose_dense_tiling(block_q: int, block_k: int, d: int) -> tiling.Tiling:
    """`choose_tiling` for the dense (softmax) kernel, except where HOPPER_BLOCKS has a measured choice
    for `d` and the target has Hopper's shared memory: then those blocks (at most the requested), within
    the shared memory only. Block-sparse calls need square blocks and keep `choose_tiling`."""
    measured = HOPPER_BLOCKS.get(d)
    if measured is None or tiling.shared_memory() < tiling.SHARED_MEMORY_PER_BLOCK["9.0"]:
        return choose_tiling(block_q, block_k, d)
    return tiling.choose("flash attention", lambda bq, bk, stages: shared_memory_bytes(bq, bk, d, stages),
                         min(block_q, measured[0]), min(block_k, measured[1]), limit=tiling.shared_memory(),
                         num_warps=NUM_WARPS)


def _forward(q, k, v, inputs: KernelInputs, static: KernelStatic):
    key_code, query_code, q_seg, k_seg, seed, layout = (inputs.key_code, inputs.query_code, inputs.q_seg,
                                                        inputs.k_seg, inputs.seed, inputs.layout)
    scale, rule, tiles, rate, interpret = static.scale, static.rule, static.tiles, static.dropout_rate, static.interpret
    block_q, block_k = tiles.block_q, tiles.block_k
    b, nq, h, d = q.shape
    nk = k.shape[1]
    sparse = layout is not None
    if layout is None:
        layout = jnp.zeros((nq // block_q, 1), jnp.int32)
    kernel = functools.partial(_fwd_kernel, scale=scale, rule=rule, block_k=block_k,
                               num_k_blocks=nk // block_k, sparse=sparse, rate=rate)
    q_block = pl.BlockSpec((None, block_q, None, d), lambda i, bb, hh: (bb, i, hh, 0))
    kv_full = pl.BlockSpec((None, nk, None, d), lambda i, bb, hh: (bb, 0, hh, 0))
    return pl.pallas_call(
        kernel,
        grid=(nq // block_q, b, h),
        in_specs=[
            pl.BlockSpec((None, layout.shape[1]), lambda i, bb, hh: (i, 0)),
            q_block, kv_full, kv_full,
            pl.BlockSpec((None, nk), lambda i, bb, hh: (bb, 0)),
            pl.BlockSpec((block_q,), lambda i, bb, hh: (i,)),
            pl.BlockSpec((block_q,), lambda i, bb, hh: (i,)),
            pl.BlockSpec((nk,), lambda i, bb, hh: (0,)),
            pl.BlockSpec((2,), lambda i, bb, hh: (0,)),
        ],
        out_specs=[q_block, pl.BlockSpec((None, None, block_q), lambda i, bb, hh: (bb, hh, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, nq), jnp.float32)],
        compiler_params=tiles.compiler_params(),
        interpret=interpret,
        name="flash_fwd" if not sparse else "block_sparse_fwd",
    )(layout, q, k, v, key_code, query_code, q_seg, k_seg, seed)


def _backward(q, k, v, inputs: KernelInputs, o, lse, do, static: KernelStatic):
    key_code, query_code, q_seg, k_seg, seed, layout, layout_t = (
        inputs.key_code, inputs.query_code, inputs.q_seg, inputs.k_seg, inputs.seed, inputs.layout, inputs.layout_t)
    scale, rule, tiles, rate, interpret = static.scale, static.rule, static.tiles, static.dropout_rate, static.interpret
    block_q, block_k = tiles.block_q, tiles.block_k
    b, nq, h, d = q.shape
    nk = k.shape[1]
    sparse = layout is not None
    if layout is None:
        layout = jnp.zeros((nq // block_q, 1), jnp.int32)
        layout_t = jnp.zeros((nk // block_k, 1), jnp.int32)
    delta = jnp.einsum("bqhd,bqhd->bhq", o.astype(jnp.float32), do.astype(jnp.float32))
    common = {"scale": scale, "rule": rule, "sparse": sparse, "rate": rate}
    seed_spec = pl.BlockSpec((2,), lambda i, bb, hh: (0,))

    q_block = pl.BlockSpec((None, block_q, None, d), lambda i, bb, hh: (bb, i, hh, 0))
    kv_full = pl.BlockSpec((None, nk, None, d), lambda i, bb, hh: (bb, 0, hh, 0))
    row_block = pl.BlockSpec((None, None, block_q), lambda i, bb, hh: (bb, hh, i))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, block_k=block_k, num_k_blocks=nk // block_k, **common),
        grid=(nq // block_q, b, h),
        in_specs=[
            pl.BlockSpec((None, layout.shape[1]), lambda i, bb, hh: (i, 0)),
            q_block, kv_full, kv_full,
            pl.BlockSpec((None, nk), lambda i, bb, hh: (bb, 0)),
            pl.BlockSpec((block_q,), lambda i, bb, hh: (i,)),
            pl.BlockSpec((block_q,), lambda i, bb, hh: (i,)),
            pl.BlockSpec((nk,), lambda i, bb, hh: (0,)),
            seed_spec, q_block, row_block, row_block,
        ],
        out_specs=q_block,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=tiles.compiler_params(),
        interpret=interpret,
        name="flash_bwd_dq",
    )(layout, q, k, v, key_code, query_code, q_seg, k_seg, seed, do, lse, delta)

    k_block = pl.BlockSpec((None, block_k, None, d), lambda j, bb, hh: (bb, j, hh, 0))
    q_full = pl.BlockSpec((None, nq, None, d), lambda j, bb, hh: (bb, 0, hh, 0))
    row_full = pl.BlockSpec((None, None, nq), lambda j, bb, hh: (bb, hh, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=block_q, num_q_blocks=nq // block_q, **common),
        grid=(nk // block_k, b, h),
        in_specs=[
            pl.BlockSpec((None, layout_t.shape[1]), lambda j, bb, hh: (j, 0)),
            q_full, k_block, k_block,
            pl.BlockSpec((None, block_k), lambda j, bb, hh: (bb, j)),
            pl.BlockSpec((nq,), lambda j, bb, hh: (0,)),
            pl.BlockSpec((nq,), lambda j, bb, hh: (0,)),
            pl.BlockSpec((block_k,), lambda j, bb, hh: (j,)),
            seed_spec, q_full, row_full, row_full,
        ],
        out_specs=[k_block, k_block],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=tiles.compiler_params(),
        interpret=interpret,
        name="flash_bwd_dkv",
    )(layout_t, q, k, v, key_code, query_code, q_seg, k_seg, seed, do, lse, delta)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attention(q, k, v, inputs: KernelInputs, static: KernelStatic):
    """Blockwise attention [b, nq, h, d] on padded, block-aligned inputs (see module docstring).

    Args:
      q, k, v: [b, nq, h, d], [b, nk, h, d], [b, nk, h, d]; float32 or bfloat16; differentiable.
      inputs: the codes, segments, dropout seed and layouts (`KernelInputs`).
      static: scale, tiles (blocks B_q, B_k: powers of two >= 16), rule, dropout rate, interpreter.
    """
    return _forward(q, k, v, inputs, static)[0]


def _attention_fwd(q, k, v, inputs: KernelInputs, static: KernelStatic):
    o, lse = _forward(q, k, v, inputs, static)
    return o, (q, k, v, inputs, o, lse)


def _attention_bwd(static: KernelStatic, residuals, do):
    q, k, v, inputs, o, lse = residuals
    dq, dk, dv = _backward(q, k, v, inputs, o, lse, do, static)
    return dq, dk, dv, None


attention.defvjp(_attention_fwd, _attention_bwd)


def dropout_state(seed, first_row=0):
    """The kernel's `seed` argument, uint32 [2]: the dropout seed ([1], or None without dropout) and the
    index in the whole batch of the call's first row (`sharding.over_batch(first_row=True)`)."""
    seed = jnp.zeros((1,), jnp.uint32) if seed is None else jnp.asarray(seed, jnp.uint32).reshape(1)
    return jnp.concatenate([seed, jnp.asarray(first_row, jnp.uint32).reshape(1)])
