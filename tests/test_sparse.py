"""Local (sliding-window) attention against full attention and a dense band reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra_jax.attention import registry
from lra_jax.attention.softmax import softmax_attention
from lra_jax.errors import ConfigError

HEADS, HEAD_DIM = 2, 8


def qkv_and_mask(n, lengths, seed=0):
    """Per-head q, k, v [b n h d] and a ragged key mask [b n]; numpy, so no compile per shape."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((len(lengths), n, HEADS, HEAD_DIM)).astype(np.float32) for _ in range(3))
    mask = np.arange(n)[None, :] < np.asarray(lengths)[:, None]
    return q, k, v, mask


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


def real(x, mask):
    """Outputs at real query positions (padded queries are zeroed by the layer, not by attend)."""
    return np.where(mask[:, :, None, None], np.asarray(x), 0.0)


@pytest.mark.parametrize("n, window", [(10, 10), (10, 25), (7, 6), (1, 3)])
def test_window_covering_the_sequence_is_full_attention(n, window):
    q, k, v, mask = qkv_and_mask(n, [n, max(1, n - 3), 1])
    out = windowed(window)(q, k, v, mask)
    full = softmax_attention(q, k, v, mask)
    np.testing.assert_allclose(real(out, mask), real(full, mask), atol=1e-5, rtol=1e-5)


def test_window_covering_the_sequence_matches_the_softmax_module():
    dim, n = HEADS * HEAD_DIM, 12
    x = np.random.default_rng(1).standard_normal((2, n, dim)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.array([[n], [5]])
    full = registry.build("softmax", dim=dim, num_heads=HEADS, rngs=nnx.Rngs(3))
    sliding = registry.build("local", dim=dim, num_heads=HEADS, rngs=nnx.Rngs(3), window=n)
    np.testing.assert_allclose(
        np.asarray(sliding(x, mask, deterministic=True)), np.asarray(full(x, mask, deterministic=True)), atol=1e-5
    )


@pytest.mark.parametrize(
    "n, window",
    [
        (12, 0),  # each token sees only itself
        (12, 1),
        (12, 3),  # n a multiple of the block size
        (13, 2),  # n not a multiple: a short last block
        (11, 3),
        (9, 4),  # two blocks, the second one short
        (17, 5),
        (15, 7),  # window reaching into both neighbouring blocks
    ],
)
def test_small_window_matches_a_dense_band_reference(n, window):
    q, k, v, mask = qkv_and_mask(n, [n, n - 4, 2, 1], seed=n + window)
    out = real(windowed(window)(q, k, v, mask), mask)
    np.testing.assert_allclose(out, real(dense_band_reference(q, k, v, mask, window), mask), atol=1e-5, rtol=1e-5)
    # The window does restrict: full attention (window n) gives a different result.
    assert np.abs(out - real(dense_band_reference(q, k, v, mask, n), mask)).max() > 1e-3


def test_gradient_matches_dense_masked_attention():
    n, window = 10, 3
    q, k, v, mask = qkv_and_mask(n, [n, 6])
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
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-4)


def test_negative_window_is_a_config_error():
    with pytest.raises(ConfigError, match="window"):
        local(-1)


def temp_bytes(fn, n):
    """XLA's temporary buffer bytes for fn(q, k, v, mask) at length n (one sequence, one head)."""
    q = k = v = jax.ShapeDtypeStruct((1, n, 1, HEAD_DIM), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, n), jnp.bool_)
    return jax.jit(fn).lower(q, k, v, mask).compile().memory_analysis().temp_size_in_bytes


def test_memory_grows_linearly_not_quadratically():
    layer = local(16)
    sliding = lambda q, k, v, mask: layer.attend(q, k, v, mask, deterministic=True, rngs=None)  # noqa: E731
    short, long = 1024, 4096  # 4x longer
    local_growth = temp_bytes(sliding, long) / temp_bytes(sliding, short)
    full_growth = temp_bytes(softmax_attention, long) / temp_bytes(softmax_attention, short)
    assert full_growth > 12, full_growth  # quadratic: ~16x
    assert local_growth < 6, local_growth  # linear: ~4x
    # In absolute terms too, nothing near the n x n score matrix (64 MiB at n = 4096) is built.
    assert temp_bytes(sliding, long) < long * long * 4 / 16
