"""Block-sparse attention with attention dropout on TPU: our Mosaic flash kernel driven by a block layout.

Splash attention (`pallas_tpu`) has no attention dropout, so the sparse variants train on the
Mosaic kernel of `lra_jax.kernels.flash.pallas_mosaic` (FlashAttention-2, Dao 2023, Alg. 1/2,
with the counter-based mask of `lra_jax.kernels.dropout`), run over the listed blocks only, as
the block-sparse FlashAttention of Dao et al. 2022 (sec. 3.3):

    out_i = sum_{j : allowed(i, j)} softmax_j(scale q_i . k_j) z_ij / (1 - r) v_j,

allowed(i, j) the element rule of `lra_jax.kernels.masking` (key padding, band |i - j| <= w,
equal segments, global codes) and BigBird's block matrix, exactly the pairs of `reference`.
The kernel's 128 x 128 tiles visited are the tile pairs of `layout.from_rule` intersected with
the block matrix (pooled to tiles): each query tile walks the key tiles scalar-prefetched in its
row of the layout (and each key tile, in the dK/dV kernel, the query tiles of the transposed
layout); a grid step past a row's count neither copies nor computes. The grid's step axis is as
long as the longest row: known when tracing for the band, segments and global tokens given as
numpy (local, strided, Longformer), else every tile (BigBird's global rows visit every tile anyway).

A block matrix at a block B finer than the tile (BigBird's 64) also masks elementwise
(`Pattern.block_bits`); B must divide the tile or be a multiple of it.
Shapes: q [b, nq, h, d], k, v [b, nk, h, d] -> [b, nq, h, d].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from lra_jax.kernels import masking
from lra_jax.kernels.block_sparse import layout as layouts
from lra_jax.kernels.block_sparse.static import BlockSparseStatic
from lra_jax.kernels.flash import pallas_mosaic as flash
from lra_jax.kernels.operands import AttentionInputs, pad_axis

TILE = flash.BLOCK


def _padded_length(n: int, block_mask_block: int | None) -> int:
    unit = TILE if block_mask_block is None else max(TILE, block_mask_block)
    return -(-n // unit) * unit


def tiles_visited(nq_pad: int, nk_pad: int, codes: masking.Codes, block_mask, block: int) -> Bool[Array, "qt kt"]:
    """The tile pairs holding an allowed pair: `layout.from_rule` at the kernel's tile, intersected with
    the block matrix any of whose blocks in a tile pair is on."""
    rule, key_code, query_code, q_seg, k_seg = _padded(codes, nq_pad, nk_pad)
    dense = layouts.from_rule(nq_pad, nk_pad, TILE, TILE, rule, query_code, key_code, q_seg, k_seg)
    if block_mask is not None:
        if block <= TILE:
            r = TILE // block
            pooled = block_mask.reshape(nq_pad // TILE, r, nk_pad // TILE, r).any((1, 3))
        else:
            r = block // TILE
            pooled = jnp.repeat(jnp.repeat(block_mask, r, axis=0), r, axis=1)
        dense &= pooled
    return dense


def _padded(codes: masking.Codes, nq_pad: int, nk_pad: int) -> masking.Codes:
    """The codes at the padded lengths: padded keys are padding (code 0), padded queries have no globals."""
    return masking.Codes(codes.rule, pad_axis(codes.key_code, 1, nk_pad), pad_axis(codes.query_code, 0, nq_pad),
                         pad_axis(codes.q_seg, 0, nq_pad), pad_axis(codes.k_seg, 0, nk_pad))


def _kernel_rule(rule: masking.MaskRule) -> masking.MaskRule | None:
    """The rule the kernel applies per tile; None when it restricts nothing beyond key padding."""
    return rule if rule.restricts else None


def static_visits(nq_pad: int, nk_pad: int, nk: int, codes_of) -> tuple[int, int]:
    """(most key tiles a query tile visits, most query tiles a key tile visits), with every key real:
    a bound known when tracing if the pattern's settings are numpy, else every tile. `codes_of(key_mask)`
    gives the codes; a block matrix (model state, traced) only removes tiles and is not consulted."""
    everything = (nk_pad // TILE, nq_pad // TILE)
    with jax.ensure_compile_time_eval():
        codes = codes_of(jnp.ones((1, nk), bool))
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(codes)):
            return everything
        dense = tiles_visited(nq_pad, nk_pad, codes, None, TILE)
        return int(dense.sum(1).max()), int(dense.sum(0).max())


def _block_bits(block_mask: Bool[Array, "qb kb"], block: int, nq_pad: int, nk_pad: int) -> Int[Array, "qt r k"]:
    """[tile, a, j] = block_mask[tile * r + a, j // B]: the block matrix rows of each query tile, per key."""
    expanded = jnp.repeat(block_mask.astype(jnp.int32), block, axis=1)  # [nq_pad / B, nk_pad]
    return expanded.reshape(nq_pad // TILE, TILE // block, nk_pad)


def attention(
    q: Float[Array, "b q h d"],
    k: Float[Array, "b k h d"],
    v: Float[Array, "b k h d"],
    inputs: AttentionInputs,
    static: BlockSparseStatic,
) -> Float[Array, "b q h d"]:
    """The pattern of `inputs` (padding, segments, global tokens, block matrix at `static.block`) with
    attention dropout at `static.dropout_rate` from the uint32 `inputs.dropout_seed` [1]; padded query
    rows are 0. The grid's length comes from the pattern's settings where they are known when tracing
    (`static_visits`)."""
    nq, nk = q.shape[1], k.shape[1]
    codes = inputs.codes(nq)
    block_mask, block = inputs.mask.block_mask, static.block
    if block_mask is not None and TILE % block and block % TILE:
        raise ValueError(f"the TPU kernel needs a block matrix whose block divides {TILE} or is a multiple of it,"
                         f" got block={block}: use impl='xla'")
    mask_block = None if block_mask is None else block
    nq_pad, nk_pad = _padded_length(nq, mask_block), _padded_length(nk, mask_block)
    if block_mask is not None:
        qb, kb = nq_pad // block, nk_pad // block
        block_mask = jnp.asarray(block_mask, bool)[:qb, :kb]
        block_mask = jnp.pad(block_mask, [(0, qb - block_mask.shape[0]), (0, kb - block_mask.shape[1])])
    dense = tiles_visited(nq_pad, nk_pad, codes, block_mask, block)
    query_visits, key_visits = static_visits(nq_pad, nk_pad, nk,
                                             lambda key_mask: inputs.codes(nq, key_mask))
    rule = _kernel_rule(codes.rule)
    sparsity = flash.Sparsity(rule=rule, mask_block=block if block_mask is not None and block < TILE else 0,
                              query_visits=query_visits, key_visits=key_visits)
    padded = _padded(codes, nq_pad, nk_pad)
    key_info = codes.key_code[:, None, :]
    if rule is not None:
        key_info = jnp.stack([codes.key_code, jnp.broadcast_to(codes.k_seg, codes.key_code.shape)], axis=1)
    pattern = flash.Pattern(
        query_info=None if rule is None else jnp.stack([padded.query_code, padded.q_seg], axis=1),
        block_bits=_block_bits(block_mask, block, nq_pad, nk_pad) if sparsity.mask_block else None,
        layout=layouts.compact(dense)[:, :nk_pad // TILE + 1].reshape(-1),
        layout_t=layouts.compact(dense.T)[:, :nq_pad // TILE + 1].reshape(-1))
    return flash.run_padded(q, k, v, key_info, inputs.query_mask, static.scale, static.dropout_rate,
                            inputs.dropout_seed, static.interpret, padded=(nq_pad, nk_pad), pattern=pattern,
                            sparsity=sparsity)
