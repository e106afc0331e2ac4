"""Local (sliding-window) attention against full attention and a dense band reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, qkv_and_mask, real, reassociation_tol, slow_except
from lra_jax.attention import registry
from lra_jax.attention.softmax import softmax_attention
from lra_jax.errors import ConfigError

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)
# Gradients chain the backward pass's as many reductions again.
GRAD_TOL = reassociation_tol(40, depth=16)

HEADS, HEAD_DIM = 2, 8


def local(window):
    return registry.build("local", dim=HEADS * HEAD_DIM, num_heads=HEADS, rngs=nnx.Rngs(0), window=window)


def windowed(window):
    """Jitted local `attend(q, k, v, mask)` (one compile instead of many eager ops)."""
    layer = local(window)
    return jax.jit(lambda q, k, v, mask: layer.attend(q, k, v, mask, deterministic=True, rngs=None))


def dense_band_reference(q, k, v, mask, window):
    """In float64: an explicit n x n band |i - j| <= window and the key mask, then a masked softmax."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    pos = np.arange(q.shape[1])
    allowed = (np.abs(pos[:, None] - pos[None, :]) <= window)[None, None] & mask[:, None, None, :]  # [b 1 n n]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(allowed, logits, -1e300)  # finite: an all-masked (padded) row stays finite
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", probs, v)


@pytest.mark.parametrize("n, window", slow_except([(10, 10), (10, 25), (7, 6), (1, 3)], keep={(10, 10)}))
def test_window_covering_the_sequence_is_full_attention(n, window):
    q, k, v, mask = qkv_and_mask(n, [n, max(1, n - 3), 1], HEADS, HEAD_DIM)
    out = windowed(window)(q, k, v, mask)
    full = softmax_attention(q, k, v, mask)
    assert_close(real(out, mask), real(full, mask), TOL)


@pytest.mark.slow
def test_window_covering_the_sequence_matches_the_softmax_module():
    dim, n = HEADS * HEAD_DIM, 12
    x = np.random.default_rng(1).standard_normal((2, n, dim)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.array([[n], [5]])
    full = registry.build("softmax", dim=dim, num_heads=HEADS, rngs=nnx.Rngs(3))
    sliding = registry.build("local", dim=dim, num_heads=HEADS, rngs=nnx.Rngs(3), window=n)
    assert_close(np.asarray(sliding(x, mask, deterministic=True)), np.asarray(full(x, mask, deterministic=True)), TOL)


@pytest.mark.parametrize(
    "n, window",
    slow_except([
        (12, 0),  # each token sees only itself
        (12, 1),
        (12, 3),  # n a multiple of the block size
        (13, 2),  # n not a multiple: a short last block
        (11, 3),
        (9, 4),  # two blocks, the second one short
        (17, 5),
        (15, 7),  # window reaching into both neighbouring blocks
    ], keep={(12, 3)}),
)
def test_small_window_matches_a_dense_band_reference(n, window):
    q, k, v, mask = qkv_and_mask(n, [n, n - 4, 2, 1], HEADS, HEAD_DIM, seed=n + window)
    out = real(windowed(window)(q, k, v, mask), mask)
    assert_close(out, real(dense_band_reference(q, k, v, mask, window), mask), TOL)
    # The window does restrict: full attention (window n) gives a different result.
    assert np.abs(out - real(dense_band_reference(q, k, v, mask, n), mask)).max() > 1e-3


@pytest.mark.slow
def test_gradient_matches_dense_masked_attention():
    n, window = 10, 3
    q, k, v, mask = qkv_and_mask(n, [n, 6], HEADS, HEAD_DIM)
    pos = np.arange(n)
    band_and_keys = (np.abs(pos[:, None] - pos[None, :]) <= window)[None] & mask[:, None, :]  # [b n n]
    layer = local(window)

    def loss(q, k, v, sliding):
        if sliding:
            out = layer.attend(q, k, v, mask, deterministic=True, rngs=None)
        else:  # full attention, each query row restricted by its band (a per-query key mask)
            logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM)
            probs = jax.nn.softmax(jnp.where(band_and_keys[:, None], logits, -1e30), axis=-1)
            out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        return jnp.sum(jnp.where(mask[:, :, None, None], out, 0.0) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    for got, want in zip(grad(q, k, v, True), grad(q, k, v, False)):
        assert_close(np.asarray(got), np.asarray(want), GRAD_TOL)


def test_negative_window_is_a_config_error():
    with pytest.raises(ConfigError, match="window"):
        local(-1)


# --- strided, longformer, bigbird -------------------------------------------------------------


def build(name, *, heads=HEADS, seed=0, **settings):
    return registry.build(name, dim=heads * HEAD_DIM, num_heads=heads, rngs=nnx.Rngs(seed), **settings)


def jitted_attend(layer):
    return jax.jit(lambda q, k, v, mask: layer.attend(q, k, v, mask, deterministic=True, rngs=None))


def dense_reference(q, k, v, mask, pattern):
    """In float64: the explicit [h|1, n, n] pattern and the key mask, then a masked softmax."""
    allowed = np.asarray(pattern, bool)[None] & mask[:, None, None, :]  # [b h n n]
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(allowed, logits, -1e300)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", probs, v)


def full_pattern(n):
    return np.ones((1, n, n), bool)


def strided_pattern(n, stride, heads):
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    same_block, same_offset = i // stride == j // stride, i % stride == j % stride
    if heads == 1:
        return (same_block | same_offset)[None]
    return np.stack([same_block] * (heads // 2) + [same_offset] * (heads - heads // 2))


@pytest.mark.parametrize(
    "n, stride, heads",
    # ragged, 4 heads, 1 head, l > n, odd heads
    slow_except([(13, 4, 2), (10, 3, 4), (11, 3, 1), (7, 16, 2), (6, 6, 3)], keep={(13, 4, 2)}),
)
def test_strided_matches_a_dense_pattern_reference(n, stride, heads):
    q, k, v, mask = qkv_and_mask(n, [n, n - 3, 1], heads, HEAD_DIM, seed=n + stride)
    out = real(jitted_attend(build("strided", heads=heads, stride=stride))(q, k, v, mask), mask)
    want = real(dense_reference(q, k, v, mask, strided_pattern(n, stride, heads)), mask)
    assert_close(out, want, TOL)
    if stride < n:  # the pattern does restrict
        assert np.abs(out - real(dense_reference(q, k, v, mask, full_pattern(n)), mask)).max() > 1e-3


def test_strided_rejects_a_zero_stride():
    with pytest.raises(ConfigError, match="stride"):
        build("strided", stride=0)


def longformer_reference(q, k, v, mask, window, num_global, q_g, k_g, v_g):
    n = q.shape[1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    ordinary = dense_reference(q, k, v, mask, ((np.abs(i - j) <= window) | (j < num_global))[None])
    q_full = np.zeros_like(q)
    q_full[:, :num_global] = q_g
    global_rows = dense_reference(q_full, k_g, v_g, mask, full_pattern(n))
    return np.where((np.arange(n) < num_global)[None, :, None, None], global_rows, ordinary)


@pytest.mark.parametrize(
    "n, window, num_global",
    slow_except([(12, 2, 1), (13, 3, 2), (10, 1, 0), (9, 2, 12), (11, 20, 1), (16, 0, 3)], keep={(12, 2, 1)}),
)
def test_longformer_matches_a_dense_reference_with_separate_global_projections(n, window, num_global):
    q, k, v, mask = qkv_and_mask(n, [n, n - 4, 2], HEADS, HEAD_DIM, seed=n + window)
    g = min(num_global, n)
    rng = np.random.default_rng(n)
    q_g = rng.standard_normal((3, g, HEADS, HEAD_DIM)).astype(np.float32)
    k_g, v_g = (rng.standard_normal(q.shape).astype(np.float32) for _ in range(2))
    layer = build("longformer", window=window, num_global=num_global)
    attend = jax.jit(lambda *a: layer.attend(*a[:4], deterministic=True, rngs=None, global_qkv=a[4:]))
    out = real(attend(q, k, v, mask, q_g, k_g, v_g), mask)
    want = real(longformer_reference(q, k, v, mask, window, g, q_g, k_g, v_g), mask)
    assert_close(out, want, TOL)


def test_longformer_with_every_token_global_and_tied_projections_is_softmax():
    dim, n = HEADS * HEAD_DIM, 12
    x = np.random.default_rng(1).standard_normal((2, n, dim)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.array([[n], [5]])
    full = build("softmax", seed=3)
    longformer = build("longformer", seed=3, window=2, num_global=n)
    for tied, own in (("query", "query_global"), ("key", "key_global"), ("value", "value_global")):
        assert not np.allclose(getattr(longformer, tied).kernel[...], getattr(longformer, own).kernel[...])
        getattr(longformer, own).kernel[...] = getattr(longformer, tied).kernel[...]
        getattr(longformer, own).bias[...] = getattr(longformer, tied).bias[...]
    forward = nnx.jit(lambda model, x, mask: model(x, mask, deterministic=True))
    assert_close(np.asarray(forward(longformer, x, mask)), np.asarray(forward(full, x, mask)), TOL)


def test_longformer_global_projections_are_trained_parameters():
    params = nnx.state(build("longformer"), nnx.Param)
    assert {"query_global", "key_global", "value_global"} <= set(params.keys())


def bigbird_pattern(n, block, num_global_blocks, layout):
    num_blocks = -(-n // block)
    g = min(num_global_blocks, num_blocks)
    qc, kc = np.arange(n)[:, None] // block, np.arange(n)[None, :] // block
    random = np.zeros((n, n), bool)
    for r in range(layout.shape[1]):
        random |= layout[np.minimum(qc, len(layout) - 1), r] == kc
    return ((qc < g) | (np.abs(qc - kc) <= 1) | (kc < g) | random)[None]


@pytest.mark.parametrize(
    "n, block, num_global_blocks, num_random_blocks, max_len",
    [
        (24, 4, 1, 2, 24),
        (30, 3, 2, 1, 48),  # n < max_len: random blocks past the length are masked
        (16, 4, 0, 2, 16),  # no global blocks
        (17, 5, 1, 0, 20),  # no random blocks, a short last block
        (12, 2, 1, 20, 12),  # more random blocks asked for than exist: each key once
    ],
)
@pytest.mark.slow
def test_bigbird_matches_a_dense_reference_of_its_layout(n, block, num_global_blocks, num_random_blocks, max_len):
    q, k, v, mask = qkv_and_mask(n, [n, n - 5, 1], HEADS, HEAD_DIM, seed=n + block)
    layer = build("bigbird", block=block, num_global_blocks=num_global_blocks,
                  num_random_blocks=num_random_blocks, max_len=max_len)
    out = real(jitted_attend(layer)(q, k, v, mask), mask)
    layout = np.asarray(layer.random_blocks[...])
    pattern = bigbird_pattern(n, layer.block, num_global_blocks, layout)
    want = real(dense_reference(q, k, v, mask, pattern), mask)
    assert_close(out, want, TOL)
    if not pattern.all():
        assert np.abs(out - real(dense_reference(q, k, v, mask, full_pattern(n)), mask)).max() > 1e-3


def test_bigbird_with_every_block_global_is_softmax():
    dim, n = HEADS * HEAD_DIM, 12
    x = np.random.default_rng(1).standard_normal((2, n, dim)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.array([[n], [5]])
    full = build("softmax", seed=3)
    bigbird = build("bigbird", seed=3, block=3, num_global_blocks=4, max_len=n)
    forward = nnx.jit(lambda model, x, mask: model(x, mask, deterministic=True))
    assert_close(np.asarray(forward(bigbird, x, mask)), np.asarray(forward(full, x, mask)), TOL)


def test_bigbird_random_layout_comes_from_the_init_key_and_is_not_trained():
    def layout(seed):
        return np.asarray(build("bigbird", seed=seed, block=4, max_len=128)
                          .random_blocks[...])

    a, b, a_again = layout(0), layout(1), layout(0)
    np.testing.assert_array_equal(a, a_again)
    assert (a != b).any()
    model = build("bigbird", block=4, max_len=128)
    assert not isinstance(model.random_blocks, nnx.Param)
    assert "random_blocks" not in nnx.state(model, nnx.Param)
    assert "random_blocks" in nnx.state(model, nnx.Not(nnx.Param))
    # 32 blocks, 3 random each, outside the window and the global block, no repeats; the global block gets none.
    assert a.shape == (32, 3) and (a[0] == -1).all()
    for c, row in enumerate(a[1:], start=1):
        assert len(set(row)) == 3 and all(abs(r - c) > 1 and r >= 1 for r in row), (c, row)


@pytest.mark.slow
def test_bigbird_needs_max_len_and_refuses_longer_inputs():
    with pytest.raises(ConfigError, match="max_len"):
        build("bigbird")
    layer = build("bigbird", block=4, max_len=8)
    q, k, v, mask = qkv_and_mask(12, [12], HEADS, HEAD_DIM)
    with pytest.raises(ConfigError, match="max_len"):
        layer.attend(q, k, v, mask, deterministic=True, rngs=None)


@pytest.mark.parametrize(
    "name, settings",
    slow_except([
        ("strided", dict(stride=5)),
        ("longformer", dict(window=3, num_global=2)),
        ("bigbird", dict(block=4, num_global_blocks=1, num_random_blocks=2, max_len=40)),
    ], keep={"strided"}),
)
def test_appended_padding_does_not_change_real_outputs_of_the_sparse_pattern(name, settings):
    """As the contract suite, but with settings small enough that the pattern is sparse at n = 20."""
    n, extra = 20, 13
    q, k, v, mask = qkv_and_mask(n + extra, [n, 11], HEADS, HEAD_DIM, seed=5)
    attend = jitted_attend(build(name, **settings))
    short = real(attend(q[:, :n], k[:, :n], v[:, :n], mask[:, :n]), mask[:, :n])
    long = real(attend(q, k, v, mask)[:, :n], mask[:, :n])
    assert_close(long, short, TOL)
