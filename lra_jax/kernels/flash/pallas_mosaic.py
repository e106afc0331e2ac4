"""FlashAttention-2 for TPU with attention dropout: our own Pallas Mosaic kernel, forward and backward.

Splash attention (`pallas_tpu`) has no attention dropout, and every full-scale LRA config
trains with it; this kernel draws the counter-based mask of `lra_jax.kernels.dropout`
tile by tile, in the forward pass and again in both backward kernels, so the same seed
drops the same weights here, in the Triton kernel and in the XLA reference.

Forward (Dao 2023, FlashAttention-2, Alg. 1), per query block i over key blocks j:

    s = scale q_i k_j^T (masked keys -> MASK_VALUE),  m' = max(m, rowmax s),
    p = exp(s - m'),  l' = e^{m - m'} l + rowsum p,  acc' = e^{m - m'} acc + (p * z / (1 - r)) v_j,
    out_i = acc / l,  lse_i = m + log l,

with z the keep mask of the tile (`dropout.keep` at unpadded positions). Backward (Alg. 2),
D = rowsum(dO * O) (computed outside, O(n d)), P = exp(s - lse):

    dV_j = sum_i (P * z / (1 - r))^T dO_i,   dP = (dO_i v_j^T) * z / (1 - r),
    dS = P * (dP - D),   dQ_i = scale sum_j dS k_j,   dK_j = scale sum_i dS^T q_i.

dQ has its own kernel (grid over query blocks, keys innermost) and dK/dV theirs (grid over
key blocks, queries innermost), so no kernel needs atomics. The hash runs in int32 (wrapping
multiplies, logical shifts, an unsigned compare by flipping the sign bit): the bits of the
uint32 definition, tested equal (`keep_int32` vs `dropout.keep`).

The same kernels serve block-sparse attention (`Sparsity`, `Pattern`; as the Triton kernel's
`rule` and layouts): the tile's pairs are masked by the element rule of `lra_jax.kernels.masking`
(band, segments, global codes) and, for a block matrix finer than the tile, by its rows
(`Pattern.block_bits`); and the grid's last axis walks the tiles listed for the program's row
(`Pattern.layout`: per query tile [count, key tiles...]; the dK/dV kernel `layout_t`), read from
scalar-prefetched lists by the index maps. A step past the row's count maps to the block already
in VMEM (no copy) and computes nothing (`pl.when`), so empty tiles cost only the grid step, and the
grid is only as long as the longest row (`Sparsity.query_visits`, `key_visits`).

Shapes: q [b, h, nq, d], k, v [b, h, nk, d] (nq, nk multiples of the blocks; heads major, the
layout TPU tiles want), key_info int32 [b, 1, nk] (codes: 0 padding, 1 real, 2 global) or
[b, 2, nk] (codes and segment ids, with a rule), heads int32 [b, h] (`dropout.head_bits` of the
global b * H + h, bit-cast). Runs anywhere with interpret=True.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Bool, Float, Int

from lra_jax.kernels import dropout, masking, sharding
from lra_jax.kernels.masking import MASK_VALUE
from lra_jax.kernels.operands import pad_axis, zero_rows

BLOCK = 128  # queries and keys per block: the TPU's lane width
RESIDENT = (512, 256, 128)  # the blocks a dense kernel may keep in VMEM, largest first (`resident_block`)
_NO_ROW = 1e30  # lse of a row without real keys: every p of it is exp(-huge) = 0


def _i32(value: int) -> int:
    """The int32 with the bits of uint32 `value`."""
    return value - 2**32 if value >= 2**31 else value


def _fmix32(x: Int[Array, "..."]) -> Int[Array, "..."]:
    """`dropout._fmix32` on int32 bits: wrapping multiplies, logical shifts."""
    x = x ^ lax.shift_right_logical(x, jnp.int32(16))
    x = x * jnp.int32(_i32(0x85EBCA6B))
    x = x ^ lax.shift_right_logical(x, jnp.int32(13))
    x = x * jnp.int32(_i32(0xC2B2AE35))
    return x ^ lax.shift_right_logical(x, jnp.int32(16))


def keep_int32(head: Int[Array, "..."], q_pos: Int[Array, "q 1"], k_pos: Int[Array, "1 k"],
               rate: float) -> Bool[Array, "q k"]:
    """`dropout.keep` for one head (its `head_bits` as int32) in int32 arithmetic: the same bits."""
    row = _fmix32(head ^ (q_pos * jnp.int32(_i32(dropout._ROW))))
    bits = _fmix32(row + k_pos * jnp.int32(_i32(dropout._COLUMN)))
    flip = jnp.int32(-(2**31))  # x ^ flip orders int32 as uint32 orders x
    return (bits ^ flip) >= jnp.int32(_i32(dropout.threshold(rate)) ^ -(2**31))


def head_state(seed: Array, batch: int, heads: int, batch_offset: Array | int = 0) -> Int[Array, "b h"]:
    """`dropout.head_bits` of heads (batch_offset + b) * heads + h, as int32 [b, h]."""
    index = (jnp.arange(batch)[:, None] + batch_offset) * heads + jnp.arange(heads)[None, :]
    return lax.bitcast_convert_type(dropout.head_bits(jnp.asarray(seed, jnp.uint32).reshape(-1)[0], index),
                                    jnp.int32)


@dataclasses.dataclass(frozen=True)
class Sparsity:
    """The static part of a block-sparse pattern (None/0 fields: dense, as flash attention).

    rule: `masking.MaskRule` applied to every tile (band, segments, global codes); needs `Pattern.query_info`
      and a second row (segment ids) in the key info.
    mask_block: B of an element-level block mask finer than the kernel block (BigBird's 64 in 128-blocks:
      `Pattern.block_bits`); 0 without one.
    query_visits, key_visits: grid steps per query tile over its listed key tiles (`Pattern.layout`) and
      per key tile over its listed query tiles (`Pattern.layout_t`): the largest count there can be;
      None: every tile (dense).
    """

    rule: masking.MaskRule | None = None
    mask_block: int = 0
    query_visits: int | None = None
    key_visits: int | None = None


class Pattern(NamedTuple):
    """The arrays of a block-sparse pattern, at the padded lengths (None where `Sparsity` needs none)."""

    query_info: Int[Array, "q 2"] | None = None  # per query: code (`KeyCode.GLOBAL`: a global query) and segment id
    block_bits: Int[Array, "qt r k"] | None = None  # [tile, a, j] = block_mask[tile * r + a, j // B]
    layout: Int[Array, "qt*(kt+1)"] | None = None  # per query tile [count, key tiles...] (`layout.compact`)
    layout_t: Int[Array, "kt*(qt+1)"] | None = None  # per key tile [count, query tiles...]


DENSE = Sparsity()


def _visited(layout_ref, row, step, width: int):
    """The tile that `row` visits at `step` of its list; past its count the last one listed (the index
    maps then ask for the block already in VMEM: no copy), tile 0 for an empty row."""
    start = row * width
    last = jnp.maximum(layout_ref[start] - 1, 0)
    return layout_ref[start + 1 + jnp.minimum(step, last)]


def _tiles(heads_ref, layout_ref, sparse: bool, width: int, keys_outer: bool):
    """(query tile, key tile), whether this step visits a listed pair (bool; None when dense) and the
    dropout state of the program's head. Program ids are read here, outside any `pl.when`."""
    b, h, outer, step = (pl.program_id(axis) for axis in range(4))
    head = heads_ref[b, h]
    if not sparse:
        return ((step, outer) if keys_outer else (outer, step)), None, head
    inner = _visited(layout_ref, outer, step, width)
    active = step < layout_ref[outer * width]
    return ((inner, outer) if keys_outer else (outer, inner)), active, head


def _when(active, body):
    """body() where `active` (always when None: dense)."""
    if active is None:
        body()
    else:
        pl.when(active)(body)


def _block_mask_tile(bits: Int[Array, "r k"], bq: int, block: int) -> Bool[Array, "q k"]:
    """The element-level block mask of one tile: query rows a B.. (a + 1) B - 1 take row a of `bits`."""
    rows = lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
    ok = jnp.zeros((bq, bits.shape[1]), bool)
    for a in range(bits.shape[0]):
        ok = ok | ((rows >= a * block) & (rows < (a + 1) * block) & (bits[a:a + 1, :] != 0))
    return ok


def _allowed(refs, sparsity: Sparsity, qi, ki, bq: int, bk: int) -> Bool[Array, "q k"]:
    """The pairs of tile (qi, ki) that may interact: `masking.pairs_allowed` on the tile (key padding
    alone when dense), and the element-level block mask."""
    keys = refs.keys[...]  # [1 or 2, bk]: code, segment id
    if sparsity.rule is None:
        ok = keys[0:1, :] > 0
    else:
        query = refs.query[...]  # [bq, 2]: code, segment id
        q_pos = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
        k_pos = ki * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        ok = masking.pairs_allowed(q_pos, k_pos, keys[0:1, :], query[:, 0:1], query[:, 1:2], keys[1:2, :],
                                   sparsity.rule)
    if sparsity.mask_block:
        ok = ok & _block_mask_tile(refs.bits[...], bq, sparsity.mask_block)
    return ok


class _Refs(NamedTuple):
    """A kernel's input refs: q, k, v, the key info, then the pattern's (None where absent), then the rest."""

    q: object
    k: object
    v: object
    keys: object
    query: object
    bits: object
    rest: tuple


def _unpack(refs, sparsity: Sparsity) -> _Refs:
    q, k, v, keys, *rest = refs
    query = rest.pop(0) if sparsity.rule is not None else None
    bits = rest.pop(0) if sparsity.mask_block else None
    return _Refs(q, k, v, keys, query, bits, tuple(rest))


def _tile_keep(head, qi, ki, bq, bk, rate):
    q_pos = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
    k_pos = ki * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
    return keep_int32(head, q_pos, k_pos, rate)


def _logits(q, k, ok, scale):
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    return jnp.where(ok, s, MASK_VALUE)


def _forward_kernel(heads_ref, layout_ref, *refs, scale, rate, bq, bk, sparsity, width):
    refs = _unpack(refs, sparsity)
    o_ref, lse_ref, m_sc, l_sc, acc_sc = refs.rest
    sparse = sparsity.query_visits is not None
    (qi, ki), active, head = _tiles(heads_ref, layout_ref, sparse, width, keys_outer=False)
    step = pl.program_id(3)

    @pl.when(step == 0)
    def _():
        m_sc[...] = jnp.full(m_sc.shape, MASK_VALUE, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def accumulate():
        ok = _allowed(refs, sparsity, qi, ki, bq, bk)
        s = _logits(refs.q[...], refs.k[...], ok, scale)
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.where(ok, jnp.exp(s - m_new), 0.0)
        l_sc[...] = alpha * l_sc[...] + p.sum(axis=1, keepdims=True)
        m_sc[...] = m_new
        if rate > 0.0:
            p = jnp.where(_tile_keep(head, qi, ki, bq, bk, rate), p * (1.0 / (1.0 - rate)), 0.0)
        v = refs.v[...]
        acc_sc[...] = alpha * acc_sc[...] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)

    _when(active, accumulate)

    @pl.when(step == pl.num_programs(3) - 1)
    def _():
        total = l_sc[...]
        has_keys = total > 0.0
        o_ref[...] = (acc_sc[...] / jnp.where(has_keys, total, 1.0)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(has_keys, m_sc[...] + jnp.log(jnp.where(has_keys, total, 1.0)), _NO_ROW)


def _probs(head, refs, sparsity, qi, ki, q, k, lse, scale, rate, bq, bk):
    """P and its dropped form P * z / (1 - r) of one tile."""
    ok = _allowed(refs, sparsity, qi, ki, bq, bk)
    p = jnp.where(ok, jnp.exp(_logits(q, k, ok, scale) - lse), 0.0)
    if rate == 0.0:
        return p, p, None
    kept = _tile_keep(head, qi, ki, bq, bk, rate)
    return p, jnp.where(kept, p * (1.0 / (1.0 - rate)), 0.0), kept


def _dscores(p, kept, do, v, di, rate):
    dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    if kept is not None:
        dp = jnp.where(kept, dp * (1.0 / (1.0 - rate)), 0.0)
    return p * (dp - di)


def _dq_kernel(heads_ref, layout_ref, *refs, scale, rate, bq, bk, sparsity, width):
    refs = _unpack(refs, sparsity)
    do_ref, lse_ref, di_ref, dq_ref, dq_sc = refs.rest
    sparse = sparsity.query_visits is not None
    (qi, ki), active, head = _tiles(heads_ref, layout_ref, sparse, width, keys_outer=False)
    step = pl.program_id(3)

    @pl.when(step == 0)
    def _():
        dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

    def accumulate():
        q, k = refs.q[...], refs.k[...]
        p, _, kept = _probs(head, refs, sparsity, qi, ki, q, k, lse_ref[...], scale, rate, bq, bk)
        ds = _dscores(p, kept, do_ref[...], refs.v[...], di_ref[...], rate)
        dq_sc[...] += jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    _when(active, accumulate)

    @pl.when(step == pl.num_programs(3) - 1)
    def _():
        dq_ref[...] = (dq_sc[...] * scale).astype(dq_ref.dtype)


def _dkv_kernel(heads_ref, layout_ref, *refs, scale, rate, bq, bk, sparsity, width):
    refs = _unpack(refs, sparsity)
    do_ref, lse_ref, di_ref, dk_ref, dv_ref, dk_sc, dv_sc = refs.rest
    sparse = sparsity.key_visits is not None
    (qi, ki), active, head = _tiles(heads_ref, layout_ref, sparse, width, keys_outer=True)
    step = pl.program_id(3)

    @pl.when(step == 0)
    def _():
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

    def accumulate():
        q, k, do = refs.q[...], refs.k[...], do_ref[...]
        p, p_dropped, kept = _probs(head, refs, sparsity, qi, ki, q, k, lse_ref[...], scale, rate, bq, bk)
        transposed = (((0,), (0,)), ((), ()))  # contract the query axis: x^T y
        dv_sc[...] += lax.dot_general(p_dropped.astype(do.dtype), do, transposed, preferred_element_type=jnp.float32)
        ds = _dscores(p, kept, do, refs.v[...], di_ref[...], rate)
        dk_sc[...] += lax.dot_general(ds.astype(q.dtype), q, transposed, preferred_element_type=jnp.float32)

    _when(active, accumulate)

    @pl.when(step == pl.num_programs(3) - 1)
    def _():
        dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _params(interpret: bool) -> dict:
    if interpret:
        return {"interpret": True}
    return {"compiler_params": pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))}


class _Specs(NamedTuple):
    q: pl.BlockSpec  # [b, h, nq, d] operands (q, dO, out, dQ)
    k: pl.BlockSpec  # [b, h, nk, d] operands (k, v, dK, dV)
    row: pl.BlockSpec  # [b, h, nq, 1] row statistics (lse, D)
    inputs: list  # q, k, v, key info and the pattern's inputs


def _specs(d: int, bq: int, bk: int, key_rows: int, sparsity: Sparsity, keys_outer: bool, width: int) -> _Specs:
    """BlockSpecs for a grid (b, h, query tile, step) or, when `keys_outer` (the dK/dV kernel),
    (b, h, key tile, step); the step walks the tiles of the other axis, or the listed ones when sparse."""
    sparse = (sparsity.key_visits if keys_outer else sparsity.query_visits) is not None

    def order(fn):
        def index_map(b, h, outer, step, heads_ref, layout_ref):
            inner = _visited(layout_ref, outer, step, width) if sparse else step
            i, j = (inner, outer) if keys_outer else (outer, inner)
            return fn(b, h, i, j)
        return index_map

    q_spec = pl.BlockSpec((None, None, bq, d), order(lambda b, h, i, j: (b, h, i, 0)))
    k_spec = pl.BlockSpec((None, None, bk, d), order(lambda b, h, i, j: (b, h, j, 0)))
    inputs = [q_spec, k_spec, k_spec, pl.BlockSpec((None, key_rows, bk), order(lambda b, h, i, j: (b, 0, j)))]
    if sparsity.rule is not None:
        inputs.append(pl.BlockSpec((bq, 2), order(lambda b, h, i, j: (i, 0))))
    if sparsity.mask_block:
        inputs.append(pl.BlockSpec((None, bq // sparsity.mask_block, bk), order(lambda b, h, i, j: (i, 0, j))))
    return _Specs(q_spec, k_spec, pl.BlockSpec((None, None, bq, 1), order(lambda b, h, i, j: (b, h, i, 0))), inputs)


def _pattern_inputs(pattern: Pattern, sparsity: Sparsity) -> list:
    return ([pattern.query_info] if sparsity.rule is not None else []) + (
        [pattern.block_bits] if sparsity.mask_block else [])


def _layout(pattern: Pattern, visits: int | None, cols: int, transposed: bool):
    """(flattened layout, its row width, grid steps per row) of the query tiles (or, transposed, key tiles)
    over `cols` tiles of the other axis; dense: a placeholder, every tile."""
    if visits is None:
        return jnp.zeros((1,), jnp.int32), 1, cols
    return (pattern.layout_t if transposed else pattern.layout), cols + 1, visits


# Per tile of bq queries x bk keys, the matmul FLOPs of each kernel: forward q k^T and p v; dQ q k^T,
# dO v^T and dS k; dK/dV q k^T, dO v^T, p^T dO and dS^T q. Each recomputes exp of the tile once.
_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}


def _cost(part: str, tiles: int, rows: int, bq: int, bk: int, d: int, itemsize: int) -> pl.CostEstimate:
    """What one call computes and moves, for the TPU compiler's cost model (which models no Mosaic call
    without it): `tiles` grid steps of bq x bk (the grid's length, empty steps of a sparse row included:
    an upper bound), `rows` = b * h * n of the outer axis. Bytes: the outer axis's blocks once (q, out
    or dO, dQ, or k, v, dK, dV) and the inner axis's two blocks per tile (k, v, or q, dO), plus the f32
    row statistics (lse, D)."""
    inner = bk if part != "dkv" else bq
    outer_blocks = {"fwd": 2, "dq": 3, "dkv": 4}[part]
    statistics = 4 * (rows if part == "fwd" else 2 * (rows if part == "dq" else tiles * bq))
    return pl.CostEstimate(flops=2 * _MATMULS[part] * tiles * bq * bk * d, transcendentals=tiles * bq * bk,
                           bytes_accessed=itemsize * d * (outer_blocks * rows + 2 * tiles * inner) + statistics)


def resident_block(nq: int, nk: int) -> int:
    """The dense kernels' resident block for padded lengths nq, nk: the largest of `RESIDENT` dividing both.

    A program keeps its block (queries in the forward and dQ kernels, keys in dK/dV) in VMEM while
    128-row blocks of the other side stream from HBM, so the other side is read n / resident times:
    a tile does 4 * resident * 128 * d FLOPs per 2 * 128 * d elements read, 256 FLOP per byte in f32 at
    512, above a v5e's 240 (197 TF/s over 819 GB/s), where 128 leaves the kernel bound by HBM."""
    return next(block for block in RESIDENT if nq % block == 0 and nk % block == 0)


def _kernel_name(part: str, sparsity: Sparsity) -> str:
    return f"lra_{'flash' if sparsity == DENSE else 'block_sparse'}_{part}"


def _forward(q, k, v, inputs: MosaicInputs, static: MosaicStatic):
    key_info, heads, pattern = inputs.key_info, inputs.heads, inputs.pattern
    scale, rate, interpret, sparsity = static.scale, static.rate, static.interpret, static.sparsity
    block_q, block_k = static.resident, static.streamed
    b, h, nq, d = q.shape
    nk = k.shape[2]
    layout, width, steps = _layout(pattern, sparsity.query_visits, nk // block_k, False)
    specs = _specs(d, block_q, block_k, key_info.shape[1], sparsity, keys_outer=False, width=width)
    kernel = functools.partial(_forward_kernel, scale=scale, rate=rate, bq=block_q, bk=block_k, sparsity=sparsity,
                               width=width)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, h, nq // block_q, steps),
            in_specs=specs.inputs, out_specs=[specs.q, specs.row],
            scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32), pltpu.VMEM((block_q, 1), jnp.float32),
                            pltpu.VMEM((block_q, d), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, nq, 1), jnp.float32)],
        name=_kernel_name("fwd", sparsity), **_params(interpret),
        cost_estimate=_cost("fwd", b * h * (nq // block_q) * steps, b * h * nq, block_q, block_k, d, q.dtype.itemsize),
    )(heads, layout, q, k, v.astype(q.dtype), key_info, *_pattern_inputs(pattern, sparsity))


@functools.partial(jax.tree_util.register_dataclass, data_fields=["key_info", "heads", "pattern"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class MosaicInputs:
    """The arrays of one call besides q, k, v.

    key_info: int32 [b, r, nk]: row 0 the key codes (`masking.KeyCode`), row 1 (with a `Sparsity.rule`)
    the key segment ids. heads: int32 [b, h], the dropout state of each head (`head_state`).
    pattern: the block-sparse pattern's arrays (`Pattern()` when dense).
    """

    key_info: Int[Array, "b r k"]
    heads: Int[Array, "b h"]
    pattern: Pattern = Pattern()


@dataclasses.dataclass(frozen=True)
class MosaicStatic:
    """What the kernels are compiled for: softmax scale, dropout rate, resident rows (the rows a program
    keeps in VMEM: queries in the forward and dQ kernels, keys in dK/dV; `resident_block`), streamed rows
    (the other side, per grid step; a sparse pattern's tiles are `BLOCK` x `BLOCK`), the interpreter and
    the static part of the pattern (`DENSE`: key padding only)."""

    scale: float
    rate: float = 0.0
    resident: int = BLOCK
    streamed: int = BLOCK
    interpret: bool = False
    sparsity: Sparsity = DENSE


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attention(q: Float[Array, "b h q d"], k: Float[Array, "b h k d"], v: Float[Array, "b h k d"],
              inputs: MosaicInputs, static: MosaicStatic) -> Float[Array, "b h q d"]:
    """softmax(scale q k^T) over the allowed pairs, dropped at `static.rate` with the mask of `inputs.heads`,
    times v; rows without an allowed key are 0. Differentiable in q, k, v."""
    return _forward(q, k, v, inputs, static)[0]


def _attention_fwd(q, k, v, inputs: MosaicInputs, static: MosaicStatic):
    out, lse = _forward(q, k, v, inputs, static)
    return out, (q, k, v, inputs, out, lse)


def _attention_bwd(static: MosaicStatic, res, dout):
    scale, rate, interpret, sparsity = static.scale, static.rate, static.interpret, static.sparsity
    block_q, block_k = static.resident, static.streamed  # dQ keeps block_q queries, dK/dV block_q keys
    q, k, v, inputs, out, lse = res
    key_info, heads, pattern = inputs.key_info, inputs.heads, inputs.pattern
    b, h, nq, d = q.shape
    nk = k.shape[2]
    v_dtype, v = v.dtype, v.astype(q.dtype)
    dout = dout.astype(q.dtype)
    di = (dout.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1, keepdims=True)  # D [b, h, nq, 1]
    common = dict(scale=scale, rate=rate, bq=block_q, bk=block_k, sparsity=sparsity)
    extra = _pattern_inputs(pattern, sparsity)

    layout, width, steps = _layout(pattern, sparsity.query_visits, nk // block_k, False)
    specs = _specs(d, block_q, block_k, key_info.shape[1], sparsity, keys_outer=False, width=width)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, width=width, **common),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, h, nq // block_q, steps),
            in_specs=specs.inputs + [specs.q, specs.row, specs.row], out_specs=specs.q,
            scratch_shapes=[pltpu.VMEM((block_q, d), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), name=_kernel_name("dq", sparsity), **_params(interpret),
        cost_estimate=_cost("dq", b * h * (nq // block_q) * steps, b * h * nq, block_q, block_k, d, q.dtype.itemsize),
    )(heads, layout, q, k, v, key_info, *extra, dout, lse, di)

    bq, bk = block_k, block_q  # the dK/dV kernel keeps its key block in VMEM: the resident size
    layout, width, steps = _layout(pattern, sparsity.key_visits, nq // bq, True)
    specs = _specs(d, bq, bk, key_info.shape[1], sparsity, keys_outer=True, width=width)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, width=width, **dict(common, bq=bq, bk=bk)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, h, nk // bk, steps),
            in_specs=specs.inputs + [specs.q, specs.row, specs.row], out_specs=[specs.k, specs.k],
            scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32), pltpu.VMEM((bk, d), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(k.shape, v_dtype)],
        name=_kernel_name("dkv", sparsity), **_params(interpret),
        cost_estimate=_cost("dkv", b * h * (nk // bk) * steps, b * h * nk, bq, bk, d, q.dtype.itemsize),
    )(heads, layout, q, k, v, key_info, *extra, dout, lse, di)
    return dq, dk, dv, None


attention.defvjp(_attention_fwd, _attention_bwd)


def run_padded(q, k, v, key_info, query_mask, scale: float, rate: float, seed, interpret: bool, *,
               padded: tuple[int, int] | None = None, pattern: Pattern = Pattern(), sparsity: Sparsity = DENSE):
    """`attention` (TPU, with dropout) on [b, n, h, d]: padded to its block (or to `padded`
    (nq, nk), the lengths a block-sparse `pattern` was built for), heads major, run per device on its rows
    of the batch with the dropout heads of the *global* batch rows. key_info int32 [b, r, nk] (row 0 the
    key codes); padded query rows are 0."""
    b, nq, h, _ = q.shape
    nk = k.shape[1]
    block = BLOCK
    nq_pad, nk_pad = padded or (-(-x // block) * block for x in (nq, nk))
    heads = head_state(seed, b, h)  # global rows: a sharded run draws one device's mask
    major = lambda x, n: pad_axis(x, 1, n).transpose(0, 2, 1, 3)  # noqa: E731  [b, n, h, d] -> [b, h, n, d]
    resident = resident_block(nq_pad, nk_pad) if sparsity == DENSE else block
    static = MosaicStatic(scale, rate, resident, block, interpret, sparsity)
    kernel = lambda q, k, v, key_info, heads, pattern: attention(  # noqa: E731
        q, k, v, MosaicInputs(key_info, heads, pattern), static)
    out = sharding.over_batch(kernel)(major(q, nq_pad), major(k, nk_pad), major(v, nk_pad),
                                      pad_axis(key_info, 2, nk_pad), heads, pattern=pattern)
    out = out.transpose(0, 2, 1, 3)[:, :nq]
    return zero_rows(out, query_mask)
