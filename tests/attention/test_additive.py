"""Bahdanau (additive) and Luong (general) attention against dense references written here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, x_and_mask
from lra_jax.attention import registry
from lra_jax.attention.additive import additive_logits

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)
# Gradients chain the backward pass's as many reductions again.
GRAD_TOL = reassociation_tol(40, depth=16)

DIM, HEADS = 16, 2
HEAD_DIM = DIM // HEADS


def build(name, seed=0, **settings):
    return registry.build(name, dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), **settings)


def apply(model, x, mask):
    return np.asarray(jax.jit(lambda x, mask: model(x, mask, deterministic=True))(x, mask))


def linear(layer, x):
    return x @ np.asarray(layer.kernel[...]) + np.asarray(layer.bias[...])


def softmax_over_real_keys(logits, mask):
    """[b h n m] logits -> weights, padded keys excluded (float64 reference)."""
    logits = np.where(mask[:, None, None, :], logits, -np.inf)
    logits = logits - logits.max(-1, keepdims=True)
    w = np.exp(logits)
    return w / w.sum(-1, keepdims=True)


def reference(layer, x, mask, logits_fn):
    """Dense multi-head attention on real rows (rows with at least one real key)."""
    x = x.astype(np.float64)
    q, k, v = (linear(p, x).reshape(*x.shape[:2], HEADS, HEAD_DIM) for p in (layer.query, layer.key, layer.value))
    w = softmax_over_real_keys(logits_fn(q, k), mask)
    out = np.einsum("bhnm,bmhd->bnhd", w, v).reshape(x.shape)
    return np.where(mask[..., None], linear(layer.out, out), 0.0)


def dense_additive(v_vec):
    """e_ij = v^T tanh(q_i + k_j), the whole [b n m h d] tensor at once."""
    return lambda q, k: np.einsum("bnmhd,hd->bhnm", np.tanh(q[:, :, None] + k[:, None]), v_vec)


@pytest.mark.parametrize("chunk", [1, 4, 5, 13, 64])  # n = 13: 4 and 5 leave a ragged last chunk; 64 is clamped
def test_additive_equals_dense_reference_for_any_chunk(chunk):
    layer = build("additive", query_chunk=chunk)
    n = 13
    x, mask = x_and_mask(n, [n, 6, 1], DIM)
    want = reference(layer, x, mask, dense_additive(np.asarray(layer.score_vector[...], np.float64)))
    assert_close(apply(layer, x, mask), want, TOL)


@pytest.mark.parametrize("chunk", [3, 4, 12])  # divides n = 12 and one that does not
def test_chunked_logits_equal_unchunked(chunk):
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((2, 12, HEADS, HEAD_DIM)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((HEADS, HEAD_DIM)).astype(np.float32)
    want = dense_additive(v)(q, k)
    assert_close(np.asarray(jax.jit(additive_logits, static_argnums=3)(q, k, v, chunk)), want, TOL)
    grad = jax.jit(jax.grad(lambda q: jnp.sum(additive_logits(q, k, v, chunk) ** 2)))(q)
    grad_full = jax.jit(jax.grad(lambda q: jnp.sum(additive_logits(q, k, v, 12) ** 2)))(q)
    assert_close(np.asarray(grad), np.asarray(grad_full), GRAD_TOL)


@pytest.mark.slow
def test_additive_temp_memory_stays_far_below_the_full_tanh_tensor():
    n, dim = 2048, 64  # one head of width 64: the full tanh tensor is n * n * 64 floats = 1 GiB

    def temp_bytes(chunk, grad=False):
        layer = registry.build("additive", dim=dim, num_heads=1, rngs=nnx.Rngs(0), query_chunk=chunk)
        graphdef, state = nnx.split(layer)
        x = jax.ShapeDtypeStruct((1, n, dim), jnp.float32)
        mask = jax.ShapeDtypeStruct((1, n), bool)

        def f(state, x, mask):
            return jnp.sum(nnx.merge(graphdef, state)(x, mask, deterministic=True))

        fn = jax.grad(f) if grad else f
        return jax.jit(fn).lower(state, x, mask).compile().memory_analysis().temp_size_in_bytes

    full_tanh = n * n * dim * 4
    for chunk in (1, 8, n):  # chunked, and one chunk: XLA fuses the tanh into the sum over d either way
        assert temp_bytes(chunk) < full_tanh / 8, chunk
    assert temp_bytes(1, grad=True) < full_tanh / 4  # the backward pass recomputes chunks instead of storing them


def test_luong_equals_dense_bilinear_reference():
    layer = build("luong")
    w_a = np.random.default_rng(2).standard_normal((HEADS, HEAD_DIM, HEAD_DIM)).astype(np.float32)
    layer.bilinear[...] = w_a
    x, mask = x_and_mask(11, [11, 4, 1], DIM)

    def logits(q, k):
        return np.einsum("bnhd,hde,bmhe->bhnm", q, w_a, k) / np.sqrt(HEAD_DIM)

    assert_close(apply(layer, x, mask), reference(layer, x, mask, logits), TOL)


def test_luong_starts_as_softmax_attention():
    x, mask = x_and_mask(9, [9, 5], DIM)
    luong, softmax = build("luong", seed=3), build("softmax", seed=3)
    assert_close(apply(luong, x, mask), apply(softmax, x, mask), TOL)
    luong.bilinear[...] = 2.0 * np.asarray(luong.bilinear[...])
    assert np.abs(apply(luong, x, mask) - apply(softmax, x, mask)).max() > 1e-3


def test_the_default_chunk_follows_the_platform_the_layer_is_built_for():
    """A deviceless compile for a TPU or GPU builds the layer that platform would run (64 queries a
    chunk), not the host CPU's (one query a chunk, 4097 sequential steps at 4K)."""
    from lra_jax import kernels

    assert build("additive").query_chunk == 1  # this CPU
    for platform in ("tpu", "cuda"):
        with kernels.target_platform(platform):
            assert build("additive").query_chunk == 64
    assert build("additive", query_chunk=8).query_chunk == 8
