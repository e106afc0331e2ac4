"""Every kernel implementation against its pure-jnp reference, forward and gradient.

One parametrisation (`CASES`) names each kernel call; `test_matches_reference`
runs it with impl="pallas" for each platform's kernel (the Triton kernels for
"gpu", jax's splash attention for "tpu"; interpret=True on CPU, compiled on the
matching accelerator in `test_compiled_matches_reference`) and impl="xla" (the
reference) and compares outputs and the gradients of a random projection of them
with respect to q, k, v; the "-dropout" cases drop attention weights, in the Triton
kernel and in the reference with the same mask. Shapes stay small (n <= 128, blocks of 16/32; splash
pads to its 128 block, so none of these lengths is a multiple of its block) so
the file runs in about two minutes on two CPU cores in interpret mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, slow_except
from lra_jax.attention import registry
from lra_jax import kernels
from lra_jax.kernels import dropout, masking, pallas_available, tpu_available
from lra_jax.kernels.block_sparse import layout as layouts
from lra_jax.kernels.block_sparse.api import BLOCK_SPARSE, block_sparse_attention
from lra_jax.kernels.flash.api import FLASH, flash_attention
from lra_jax.kernels.flash.reference import masked_attention
from lra_jax.kernels.linear import linear_attention
from lra_jax.kernels.masking import Mask

needs_gpu = pytest.mark.skipif(not pallas_available(), reason="compiled Pallas kernels need a GPU")
needs_tpu = pytest.mark.skipif(not tpu_available(), reason="compiled Mosaic kernels need a TPU")
DROPOUT_SEED = np.array([2024], np.uint32)


def inputs(b, n, h, d, lengths, dtype=np.float32, seed=0):
    """q, k, v [b n h d] (numpy, so no compile per shape) and a prefix mask [b n]."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, n, h, d)).astype(dtype) for _ in range(3))
    return q, k, v, np.arange(n)[None, :] < np.asarray(lengths)[:, None]


def _band(n, w):
    return np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= w


# name -> (kernel call (q, k, v, mask, impl, interpret) -> out, b, n, h, d, lengths)
CASES = {
    "flash": (lambda q, k, v, m, **kw: flash_attention(q, k, v, Mask(key_mask=m), block_q=32, block_k=32, **kw),
              2, 96, 2, 32, [96, 37]),
    "flash-odd": (lambda q, k, v, m, **kw: flash_attention(q, k, v, Mask(key_mask=m), block_q=16, block_k=32, **kw),
                  2, 50, 1, 24, [50, 1]),
    "flash-scale": (lambda q, k, v, m, **kw: flash_attention(q, k, v, Mask(key_mask=m), scale=0.3, block_q=32,
                                                             block_k=16, **kw), 1, 64, 2, 64, [60]),
    "local": (lambda q, k, v, m, **kw: block_sparse_attention(q, k, v, Mask(key_mask=m, window=9), block=16, **kw),
              2, 80, 2, 16, [80, 45]),
    "local-globals": (lambda q, k, v, m, **kw: block_sparse_attention(
        q, k, v, Mask(key_mask=m, window=5, global_queries=np.arange(96) < 2, global_keys=np.arange(96) < 3),
        block=32, **kw), 2, 96, 2, 16, [96, 70]),
    "segments": (lambda q, k, v, m, **kw: block_sparse_attention(
        q, k, v, Mask(key_mask=m, query_segments=np.arange(64) // 12, key_segments=np.arange(64) // 12), block=16,
        **kw), 2, 64, 2, 16, [64, 30]),
    "block-mask": (lambda q, k, v, m, **kw: block_sparse_attention(
        q, k, v, Mask(key_mask=m, block_mask=np.eye(4, dtype=bool) | (np.arange(4)[None, :] == 0)
        | (np.arange(4)[:, None] == 3), block=16), **kw), 2, 64, 2, 32, [64, 20]),
    "linear": (lambda q, k, v, m, **kw: linear_attention(q, k, v, Mask(key_mask=m), block=32, **kw),
               2, 80, 2, 16, [80, 33]),
    "flash-dropout": (lambda q, k, v, m, **kw: flash_attention(
        q, k, v, Mask(key_mask=m), block_q=32, block_k=16, dropout_rate=0.25, dropout_seed=DROPOUT_SEED, **kw),
        2, 80, 2, 32, [80, 41]),
    "local-globals-dropout": (lambda q, k, v, m, **kw: block_sparse_attention(
        q, k, v, Mask(key_mask=m, window=5, global_queries=np.arange(96) < 2, global_keys=np.arange(96) < 3),
        block=32, dropout_rate=0.4, dropout_seed=DROPOUT_SEED, **kw), 2, 96, 2, 16, [96, 70]),
    # The library's own blocks at head dims 64 and 128 (the measured Hopper blocks where the target has
    # Hopper's shared memory, as on this CPU: `flash.pallas_gpu.choose_dense_tiling`), B_q != B_k at 128.
    "flash-d64-dropout": (lambda q, k, v, m, **kw: flash_attention(
        q, k, v, Mask(key_mask=m), dropout_rate=0.2, dropout_seed=DROPOUT_SEED, **kw), 2, 160, 1, 64, [160, 77]),
    "flash-d128-dropout": (lambda q, k, v, m, **kw: flash_attention(
        q, k, v, Mask(key_mask=m), dropout_rate=0.2, dropout_seed=DROPOUT_SEED, **kw), 2, 160, 1, 100, [160, 77]),
    # A causal mask: the kernels over the causal block layout (key blocks up to the diagonal only).
    "flash-causal": (lambda q, k, v, m, **kw: flash_attention(
        q, k, v, Mask(key_mask=m, causal=True), block_q=16, block_k=16, **kw), 2, 80, 2, 16, [80, 41]),
    "local-causal": (lambda q, k, v, m, **kw: block_sparse_attention(
        q, k, v, Mask(key_mask=m, window=9, causal=True), block=16, **kw), 2, 80, 2, 16, [80, 45]),
    "flash-causal-dropout": (lambda q, k, v, m, **kw: flash_attention(
        q, k, v, Mask(key_mask=m, causal=True), block_q=16, block_k=16, dropout_rate=0.25,
        dropout_seed=DROPOUT_SEED, **kw), 2, 64, 1, 16, [64, 30]),
}


# The TPU path has no linear kernel (linear attention on TPU is the XLA form), and splash no dropout.
TPU_CASES = [case for case in CASES if case != "linear" and not case.endswith("-dropout")]


def _run(case, impl, interpret, dtype=np.float32, platform="gpu"):
    """(output, grads of <out, r> w.r.t. q, k, v) of one case, jitted."""
    fn, b, n, h, d, lengths = CASES[case]
    q, k, v, mask = inputs(b, n, h, d, lengths, dtype)
    r = np.random.default_rng(1).standard_normal((b, n, h, d)).astype(np.float32)
    call = lambda q, k, v: fn(q, k, v, mask, impl=impl, interpret=interpret, platform=platform)
    loss = lambda q, k, v: jnp.sum(call(q, k, v).astype(jnp.float32) * r)
    out, grads = jax.jit(lambda q, k, v: (call(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))(q, k, v)
    return np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in grads], mask


def _compare(case, interpret, platform="gpu"):
    out, grads, mask = _run(case, "pallas", interpret, platform=platform)
    ref_out, ref_grads, _ = _run(case, "xla", False)
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)
    # The kernel sums over key blocks (online softmax) where the reference sums all n keys at once:
    # float32 sums of <= n terms, ~4 chained forward (scores, max, normaliser, weighted sum) and
    # ~8 with the backward pass, against each array's largest entry. A wrong mask or scale is O(1).
    n = CASES[case][2]
    assert_close(out, ref_out, reassociation_tol(n, depth=4))
    for name, g, ref in zip("qkv", grads, ref_grads):
        assert_close(g, ref, reassociation_tol(n, depth=8), err_msg=f"d{name}")
    assert (out[~mask] == 0).all()  # padded query rows are exactly zero


# The fast tier interprets each kernel (flash, block-sparse, linear) on one small case; the full suite on all.
@pytest.mark.parametrize("case", slow_except(CASES, keep={"flash-odd", "local", "linear"}))
def test_matches_reference(case):
    _compare(case, interpret=True)


@pytest.mark.parametrize("case", TPU_CASES)
@pytest.mark.slow
def test_tpu_kernel_matches_reference(case):
    _compare(case, interpret=True, platform="tpu")


@needs_gpu
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_matches_reference(case):
    # jax's default precision runs float32 dots as TF32 on Ampere and Hopper, in the Triton kernels and
    # in XLA's reference alike (on an H100 every case then differs by up to ~1e-3 of its scale: TF32's
    # 10-bit mantissa, not a kernel error). Both sides at full float32 precision, the float32
    # tolerance holds and a wrong mask or index still shows.
    with jax.default_matmul_precision("float32"):
        _compare(case, interpret=False)


@needs_tpu
@pytest.mark.parametrize("case", TPU_CASES)
def test_compiled_tpu_kernel_matches_reference(case):
    _compare(case, interpret=False, platform="tpu")


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


@pytest.mark.parametrize("case,platform", [("flash", "gpu"), ("flash", "tpu"), ("local-globals", "tpu"),
                                           ("block-mask", "tpu")])
@pytest.mark.slow
def test_bf16_kernel_within_bf16_tolerance(case, platform):
    out, grads, _ = _run(case, "pallas", True, dtype=jnp.bfloat16, platform=platform)
    ref_out, ref_grads, _ = _run(case, "xla", False, dtype=np.float32)
    # bfloat16 inputs and outputs carry a rounding error of 2^-8 of their scale each, with float32
    # accumulation inside; a few of them compound forward (4 x 2^-7 = 3%) and twice as many
    # backward, against each array's largest entry. A float32 path broken by bf16 (a -inf mask
    # value, a lost scale) is off by O(1).
    bf16_eps = float(jnp.finfo(jnp.bfloat16).eps)  # 2^-7
    assert_close(out, ref_out, 4 * bf16_eps)
    for g, ref in zip(grads, ref_grads):
        assert_close(g, ref, 8 * bf16_eps)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@pytest.mark.slow
def test_all_padding_rows_are_zero_and_finite(platform):
    """A sequence of length 0 and a real query with no real key: zero output, finite gradients."""
    q, k, v, mask = inputs(2, 32, 1, 16, [0, 12])
    query_mask = np.ones_like(mask)  # every query real, even where no key is
    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) ** 2)
    for fn in (
        lambda q, k, v: flash_attention(q, k, v, Mask(key_mask=mask, query_mask=query_mask), block_q=16, block_k=16,
                                        impl="pallas", interpret=True, platform=platform),
        lambda q, k, v: block_sparse_attention(q, k, v, Mask(key_mask=mask, query_mask=query_mask, window=3), block=16,
                                               impl="pallas", interpret=True, platform=platform),
    ):
        out, grads = jax.jit(lambda q, k, v, fn=fn: (fn(q, k, v), jax.grad(loss(fn), (0, 1, 2))(q, k, v)))(q, k, v)
        out = np.asarray(out)
        assert np.isfinite(out).all() and all(np.isfinite(np.asarray(g)).all() for g in grads)
        assert (out[0] == 0).all()  # no real key anywhere in sequence 0


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
