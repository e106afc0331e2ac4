"""The attention kernel ops: each op's contract (`kernel_contract.KernelContract`: every implementation against
the op's XLA form, forward and gradient, padding, bfloat16) over its cases, and what is particular to one op:
the references against float64 softmax, masks and their composition, block layouts, the dropout hash, the
variants with impl="pallas" against impl="xla".

The cases stay small (n <= 160, blocks of 16/32, no length a multiple of splash's 128-block) so that the
Triton kernels run quickly in interpret mode; the "tiles" cases are sized for the Mosaic kernels' 128-tiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, slow_except
from kernel_contract import DROPOUT_SEED, KernelContract, attention_case
from lra_jax.attention import registry
from lra_jax import kernels
from lra_jax.kernels import dropout, masking
from lra_jax.kernels.block_sparse import layout as layouts
from lra_jax.kernels.block_sparse.api import BLOCK_SPARSE, block_sparse_attention
from lra_jax.kernels.flash.api import FLASH, flash_attention
from lra_jax.kernels.flash.reference import masked_attention
from lra_jax.kernels.linear.api import LINEAR, linear_attention
from lra_jax.kernels.masking import Mask


def inputs(b, n, h, d, lengths, dtype=np.float32, seed=0):
    """q, k, v [b n h d] (numpy, so no compile per shape) and a prefix mask [b n]."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, n, h, d)).astype(dtype) for _ in range(3))
    return q, k, v, np.arange(n)[None, :] < np.asarray(lengths)[:, None]


def _band(n, w):
    return np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= w


class TestFlash(KernelContract):
    op = FLASH
    cases = {
        "flash": attention_case(flash_attention, 2, 96, 2, 32, [96, 37], block_q=32, block_k=32),
        "flash-odd": attention_case(flash_attention, 2, 50, 1, 24, [50, 1], block_q=16, block_k=32, fast=True),
        "flash-scale": attention_case(flash_attention, 1, 64, 2, 64, [60], scale=0.3, block_q=32, block_k=16),
        "flash-dropout": attention_case(flash_attention, 2, 80, 2, 32, [80, 41], dropout_rate=0.25, block_q=32,
                                        block_k=16),
        # The library's own blocks at head dims 64 and 128 (the measured Hopper blocks where the target has
        # Hopper's shared memory, as on this CPU: `flash.pallas_gpu.choose_dense_tiling`), B_q != B_k at 128.
        "flash-d64-dropout": attention_case(flash_attention, 2, 160, 1, 64, [160, 77], dropout_rate=0.2),
        "flash-d128-dropout": attention_case(flash_attention, 2, 160, 1, 100, [160, 77], dropout_rate=0.2),
        # A causal mask: the kernels over the causal block layout (key blocks up to the diagonal only).
        "flash-causal": attention_case(flash_attention, 2, 80, 2, 16, [80, 41], causal=True, block_q=16, block_k=16),
        "flash-causal-dropout": attention_case(flash_attention, 2, 64, 1, 16, [64, 30], causal=True,
                                               dropout_rate=0.25, block_q=16, block_k=16),
        # A sequence of padding only, and real queries without a real key: 0 and finite, forward and backward.
        "no-real-key": attention_case(flash_attention, 2, 32, 1, 16, [0, 12], every_query_real=True, block_q=16,
                                      block_k=16),
        # Several of Mosaic's 128-tiles: 130 tokens pad to 256, the second row's keys end in the first tile.
        "tiles": attention_case(flash_attention, 2, 130, 1, 16, [130, 77], backends=("mosaic",)),
        "tiles-dropout": attention_case(flash_attention, 2, 130, 1, 16, [130, 77], dropout_rate=0.1,
                                        backends=("mosaic",)),
    }
    bfloat16_cases = ("flash", "tiles-dropout")


N_TILES = 300  # pads to 384: three 128-tiles, the last one partly padding
# Mosaic's block matrix at its 64-blocks, inside 128-tiles; the last query tile (blocks 4 and 5) lists
# no key block: its rows see nothing.
TILE_BLOCKS = (np.random.default_rng(2).random((5, 5)) < 0.3) | np.eye(5, dtype=bool)
TILE_BLOCKS[4] = False


def _tiles(pattern: dict, **settings):
    """A block-sparse pattern over three 128-tiles, as the variants use it: a band that is not tile aligned,
    segments and 64-blocks that cut tiles, global keys in the first tile; a row of padding only."""
    return attention_case(block_sparse_attention, 3, N_TILES, 1, 32, [N_TILES, 170, 0], pattern=pattern,
                          dropout_rate=0.1, backends=("mosaic",), **settings)


class TestBlockSparse(KernelContract):
    op = BLOCK_SPARSE
    cases = {
        "local": attention_case(block_sparse_attention, 2, 80, 2, 16, [80, 45], pattern=dict(window=9), block=16,
                                fast=True),
        "local-globals": attention_case(block_sparse_attention, 2, 96, 2, 16, [96, 70], block=32, pattern=dict(
            window=5, global_queries=np.arange(96) < 2, global_keys=np.arange(96) < 3)),
        "segments": attention_case(block_sparse_attention, 2, 64, 2, 16, [64, 30], block=16, pattern=dict(
            query_segments=np.arange(64) // 12, key_segments=np.arange(64) // 12)),
        "block-mask": attention_case(block_sparse_attention, 2, 64, 2, 32, [64, 20], pattern=dict(
            block=16, block_mask=np.eye(4, dtype=bool) | (np.arange(4)[None, :] == 0) | (np.arange(4)[:, None] == 3))),
        "local-globals-dropout": attention_case(block_sparse_attention, 2, 96, 2, 16, [96, 70], block=32,
                                                dropout_rate=0.4, pattern=dict(
            window=5, global_queries=np.arange(96) < 2, global_keys=np.arange(96) < 3)),
        "local-causal": attention_case(block_sparse_attention, 2, 80, 2, 16, [80, 45], pattern=dict(window=9),
                                       causal=True, block=16),
        "no-real-key": attention_case(block_sparse_attention, 2, 32, 1, 16, [0, 12], every_query_real=True,
                                      pattern=dict(window=3), block=16),
        "tiles-window": _tiles(dict(window=40)),
        "tiles-segments": _tiles(dict(query_segments=np.arange(N_TILES) // 100, key_segments=np.arange(N_TILES) // 100)),
        "tiles-globals": _tiles(dict(window=20, global_keys=np.arange(N_TILES) < 3,
                                     global_queries=np.arange(N_TILES) < 2)),
        "tiles-block-mask": _tiles(dict(block=64, block_mask=TILE_BLOCKS)),
    }
    bfloat16_cases = ("local-globals", "block-mask", "tiles-block-mask")


class TestLinear(KernelContract):
    op = LINEAR
    cases = {
        "linear": attention_case(linear_attention, 2, 80, 2, 16, [80, 33], block=32, fast=True),
        "no-real-key": attention_case(linear_attention, 2, 32, 1, 16, [0, 12], every_query_real=True, block=16),
    }


def test_flash_reference_is_softmax_attention():
    """The flash reference (and so the kernel) equals a float64 numpy softmax over real keys."""
    q, k, v, mask = inputs(2, 20, 1, 8, [20, 7])
    out = np.asarray(flash_attention(q, k, v, Mask(key_mask=mask), impl="xla"))
    logits = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k) / np.sqrt(8)
    logits = np.where(mask[:, None, None], logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.einsum("bhqk,bkhd->bqhd", probs / probs.sum(-1, keepdims=True), v) * mask[:, :, None, None]
    assert_close(out, want, reassociation_tol(20, depth=4))  # float32 against float64, 20 keys


def test_a_causal_mask_is_softmax_over_the_earlier_real_keys():
    """The causal flash op (the block-sparse reference over the causal rule) equals a float64 numpy softmax
    over the real keys j <= i, and the Triton kernel over the causal layout equals it too."""
    q, k, v, mask = inputs(2, 40, 1, 8, [40, 17])
    allowed = mask[:, None, None, :] & np.tril(np.ones((40, 40), bool))[None, None]
    logits = np.where(allowed, np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k) / np.sqrt(8), -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.einsum("bhqk,bkhd->bqhd", probs / probs.sum(-1, keepdims=True), v) * mask[:, :, None, None]
    causal = Mask(key_mask=mask, causal=True)
    for impl in ("xla", "pallas"):
        out = np.asarray(flash_attention(q, k, v, causal, impl=impl, interpret=True, platform="gpu", block_q=16,
                                         block_k=16))
        assert_close(out, want, reassociation_tol(40, depth=4), err_msg=impl)


def test_the_causal_layout_skips_the_blocks_after_the_diagonal():
    """At 4 blocks a side: the 10 block pairs on and below the diagonal, none above (half the work at length)."""
    rule = masking.MaskRule(causal=True)
    zeros, code = jnp.zeros(64, jnp.int32), jnp.ones((1, 64), jnp.int32)
    dense = np.asarray(layouts.from_rule(64, 64, 16, 16, rule, zeros + 1, code, zeros, zeros))
    np.testing.assert_array_equal(dense, np.tril(np.ones((4, 4), bool)))
    band = np.asarray(layouts.from_rule(64, 64, 16, 16, masking.MaskRule(window=3, causal=True), zeros + 1, code,
                                        zeros, zeros))
    np.testing.assert_array_equal(band, np.eye(4, dtype=bool) | np.eye(4, k=-1, dtype=bool))


def test_masks_compose_with_and():
    """`&` intersects padding, bands (the narrower), causality and block matrices; segments or global tokens
    on both sides, or block matrices of two sizes, are refused."""
    a = Mask(key_mask=np.array([[True, True, False]]), window=4)
    b = Mask(key_mask=np.array([[True, False, True]]), window=2, causal=True, global_keys=np.array([True, False, False]))
    both = a & b
    np.testing.assert_array_equal(both.key_mask, [[True, False, False]])
    assert both.window == 2 and both.causal and both.rule == masking.MaskRule(2, False, True, True)
    with pytest.raises(ValueError, match="global keys"):
        both & b
    with pytest.raises(ValueError, match="block sizes 16 and 32"):
        Mask(block_mask=np.ones((2, 2), bool), block=16) & Mask(block_mask=np.ones((1, 1), bool), block=32)
    with pytest.raises(ValueError, match="block size"):
        Mask(block_mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="block_sparse_attention"):
        flash_attention(*inputs(1, 16, 1, 8, [16])[:3], Mask(window=2))
    with pytest.raises(ValueError, match="padding mask only"):
        linear_attention(*inputs(1, 16, 1, 8, [16])[:3], Mask(causal=True))


def test_a_causal_mask_plans_no_splash_on_tpu():
    """Splash is not used for a causal mask here: on TPU it runs our Mosaic kernel over the causal layout."""
    target = kernels.Target("tpu", interpret=True)
    assert kernels.plan("pallas", target, FLASH).kernel == kernels.SPLASH
    assert kernels.plan("pallas", target, FLASH, causal=True).kernel == kernels.MOSAIC_FLASH
    assert kernels.plan("pallas", target, BLOCK_SPARSE, causal=True).kernel == kernels.MOSAIC_BLOCK_SPARSE


@pytest.mark.slow
def test_block_sparse_reference_is_a_masked_softmax():
    """The block-sparse reference with a band equals dense attention under an explicit band mask."""
    q, k, v, mask = inputs(1, 40, 1, 8, [40])
    out = block_sparse_attention(q, k, v, Mask(key_mask=mask, window=3), impl="xla")
    want = masked_attention(q, k, v, jnp.asarray(_band(40, 3))[None, None], 1 / np.sqrt(8))
    assert_close(np.asarray(out), np.asarray(want), reassociation_tol(40, depth=4))  # blockwise vs dense, 40 keys


def test_layout_lists_blocks_and_its_transpose():
    dense = jnp.asarray([[True, False, True], [False, False, False], [True, True, True]])
    rows = np.asarray(layouts.compact(dense))
    assert rows.shape == (3, 4)  # count + 3 indices, a power of two wide
    assert list(rows[0, :3]) == [2, 0, 2] and rows[1, 0] == 0 and list(rows[2, :4]) == [3, 0, 1, 2]
    cols = np.asarray(layouts.compact(dense.T))
    assert list(cols[1, :2]) == [1, 2]


def test_band_layout_skips_far_blocks():
    """A window of 3 with blocks of 16 visits only the neighbouring blocks."""
    code = jnp.ones((1, 64), jnp.int32)
    zeros = jnp.zeros((64,), jnp.int32)
    dense = np.asarray(layouts.from_rule(64, 64, 16, 16, masking.MaskRule(window=3), zeros + 1, code, zeros, zeros))
    np.testing.assert_array_equal(dense, np.abs(np.arange(4)[:, None] - np.arange(4)[None, :]) <= 1)


# The variants with impl="pallas" (interpreted here) against the same variant with impl="xla".
VARIANTS = {
    "softmax": {},
    "local": {"window": 5},
    "strided": {"stride": 8},
    "longformer": {"window": 4, "num_global": 2},
    "bigbird": {"block": 16, "num_random_blocks": 1, "max_len": 64},
    "performer": {"num_features": 24},
    "linear": {},
}


@pytest.mark.parametrize("name", slow_except(VARIANTS, keep={"softmax"}))
def test_variant_pallas_matches_xla(name):
    dim, heads, n = 32, 2, 40
    x = np.random.default_rng(2).standard_normal((2, n, dim)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.array([[n], [23]])
    outs = []
    for impl in ("xla", "pallas"):
        layer = registry.build(name, dim=dim, num_heads=heads, rngs=nnx.Rngs(0), impl=impl, **VARIANTS[name])
        graph, state = nnx.split(layer)
        run = jax.jit(lambda state, x, mask, graph=graph: nnx.merge(graph, state)(x, mask, deterministic=True))
        outs.append(np.asarray(run(state, x, mask)))
    assert_close(outs[1], outs[0], reassociation_tol(n, depth=6))  # kernel vs XLA: a layer's sums, reordered


@pytest.mark.parametrize("scale", slow_except([1e-12, 1e12], keep={1e-12}))
def test_linear_kernel_normaliser_has_no_epsilon_bias(scale):
    """Features scaled by s cancel in the ratio: the output is the same at any s (an epsilon added
    to a normaliser of size s^2 would pull small-s outputs towards 0)."""
    q, k, v, mask = inputs(1, 40, 1, 16, [30])
    q, k = np.abs(q) + 0.1, np.abs(k) + 0.1  # positive features, as FAVOR+ gives
    call = lambda s: np.asarray(linear_attention(q * s, k * s, v, Mask(key_mask=mask), feature_map="identity", block=16,  # noqa: E731
                                                 impl="pallas", interpret=True))
    # float32 rounding of sums of 40 positive terms: a relative 1e-5 is well above it.
    np.testing.assert_allclose(call(scale), call(1.0), rtol=1e-5, atol=1e-6)


def test_dropout_mask_keeps_one_minus_rate_and_is_a_function_of_coordinates():
    n = 256
    heads = dropout.head_bits(DROPOUT_SEED[0], jnp.arange(6))  # three batch rows of two heads
    kept = np.asarray(dropout.keep(heads, jnp.arange(n), jnp.arange(n), 0.3))  # [6, n, n]
    # 6 * 256^2 draws: the kept fraction's standard error is 0.0007; 0.01 is 14 of them.
    assert abs(kept.mean() - 0.7) < 0.01
    for a in range(6):  # every head draws its own mask: agreement is 0.7^2 + 0.3^2 = 0.58, not 1
        for b in range(a):
            assert abs((kept[a] == kept[b]).mean() - 0.58) < 0.02
    # Rows and columns are not copies of one another (a weak hash would repeat them).
    assert abs((kept[0, 1:] == kept[0, :-1]).mean() - 0.58) < 0.02
    assert abs((kept[0, :, 1:] == kept[0, :, :-1]).mean() - 0.58) < 0.02
    # A tile drawn on its own (as the kernels draw blocks) is that tile of the whole mask.
    tile = dropout.keep(heads[4], jnp.arange(96, 128), jnp.arange(32, 48), 0.3)
    np.testing.assert_array_equal(np.asarray(tile), kept[4, 96:128, 32:48])
    other_seed = dropout.keep(dropout.head_bits(DROPOUT_SEED[0] + 1, jnp.arange(6)), jnp.arange(n),
                              jnp.arange(n), 0.3)
    assert abs((np.asarray(other_seed) == kept).mean() - 0.58) < 0.01
    assert np.asarray(dropout.keep(heads, jnp.arange(4), jnp.arange(4), 0.0)).all()  # rate 0 keeps all
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        dropout.threshold(1.0)


@pytest.mark.slow
def test_dropout_is_unbiased_over_seeds():
    """E[dropped attention] = attention: the mean over many seeds converges to the output without dropout."""
    q, k, v, mask = inputs(1, 48, 1, 16, [40])
    exact = np.asarray(flash_attention(q, k, v, Mask(key_mask=mask), impl="xla"))
    seeds = np.arange(400, dtype=np.uint32)[:, None]
    runs = jax.vmap(lambda s: flash_attention(q, k, v, Mask(key_mask=mask), impl="xla", dropout_rate=0.5,
                                              dropout_seed=s))(seeds)
    mean = np.asarray(runs).mean(0)
    spread = np.asarray(runs).std(0) / np.sqrt(len(seeds))  # standard error of that mean, per entry
    assert (np.abs(mean - exact) < 5 * spread + 1e-6).mean() > 0.99


@pytest.mark.slow
def test_softmax_and_local_train_with_the_triton_kernel_and_its_dropout():
    """In training with attention dropout the GPU kernel runs (not the XLA form) and applies it:
    deterministic for a key, different for another, blind to padding content, padded rows zero."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 40, 32)), jnp.float32)
    mask = jnp.arange(40)[None, :] < jnp.array([[40], [23]])
    for name in ("softmax", "local"):
        with kernels.target_platform("gpu", interpret=True):
            layer = registry.build(name, dim=32, num_heads=2, rngs=nnx.Rngs(0), max_len=40, dropout_rate=0.3,
                                   impl="pallas", **({"window": 5} if name == "local" else {}))
        plan = layer.kernel_plan(deterministic=False)
        assert plan.kernel == kernels.TRITON and plan.dropout, plan
        with kernels.target_platform("tpu", interpret=True):
            on_tpu = registry.build(name, dim=32, num_heads=2, rngs=nnx.Rngs(0), max_len=40, dropout_rate=0.3,
                                    impl="pallas")
        # our TPU kernel takes the dropout (kernels/flash/pallas_mosaic.py), over the band for local
        want = kernels.MOSAIC_FLASH if name == "softmax" else kernels.MOSAIC_BLOCK_SPARSE
        assert on_tpu.kernel_plan(deterministic=False).kernel == want
        train = lambda x, seed: np.asarray(layer(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=seed)))  # noqa: E731
        a, again, other = train(x, 1), train(x, 1), train(x, 2)
        evaluation = np.asarray(layer(x, mask, deterministic=True))
        np.testing.assert_array_equal(a, again)
        assert np.abs(a - other).max() > 0.1 and np.abs(a - evaluation).max() > 0.1
        assert np.isfinite(a).all() and (a[~np.asarray(mask)] == 0).all()
        x_other = jnp.where(mask[..., None], x, 100.0)
        np.testing.assert_allclose(train(x_other, 1)[np.asarray(mask)], a[np.asarray(mask)], atol=1e-5)
