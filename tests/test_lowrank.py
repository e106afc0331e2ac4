"""Linformer: its exact limit (k = n, identity projections), padding invariance and its length limit."""

import jax
import numpy as np
import pytest
from flax import nnx

from lra_jax.attention import registry
from lra_jax.attention.softmax import softmax_attention
from lra_jax.errors import ConfigError

DIM, HEADS = 16, 2


def linformer(max_len, k, seed=0, **settings):
    return registry.build("linformer", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), max_len=max_len, k=k, **settings)


def inputs(n, lengths, seed=0):
    """x [b n d] with noise at padded positions and the mask [b n] of the given lengths."""
    x = np.random.default_rng(seed).standard_normal((len(lengths), n, DIM)).astype(np.float32)
    return x, np.arange(n)[None, :] < np.asarray(lengths)[:, None]


def real(out, mask):
    return np.where(mask[..., None], np.asarray(out), 0.0)


def apply(model, x, mask):
    return jax.jit(lambda x, mask: model(x, mask, deterministic=True))(x, mask)


@pytest.mark.parametrize("share_kv", [False, True])
def test_identity_projections_with_k_equal_n_are_full_attention(share_kv):
    n = 8
    layer = linformer(max_len=n, k=n, share_kv=share_kv)
    layer.e[...] = np.eye(n, dtype=np.float32)
    if not share_kv:
        layer.f[...] = np.eye(n, dtype=np.float32)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, n, HEADS, DIM // HEADS)).astype(np.float32) for _ in range(3))
    mask = np.ones((2, n), bool)
    got = layer.attend(q, k, v, mask, deterministic=True, rngs=None)
    np.testing.assert_allclose(np.asarray(got), np.asarray(softmax_attention(q, k, v, mask)), atol=1e-5, rtol=1e-5)
    # The whole layer then equals the softmax layer built from the same seed (same q/k/v/out projections).
    full = registry.build("softmax", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    x, _ = inputs(n, [n, n])
    np.testing.assert_allclose(np.asarray(apply(layer, x, mask)), np.asarray(apply(full, x, mask)), atol=1e-5)


def test_random_projections_differ_from_full_attention():
    n = 8
    layer = linformer(max_len=n, k=4)
    full = registry.build("softmax", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    x, mask = inputs(n, [n])
    assert np.abs(np.asarray(apply(layer, x, mask)) - np.asarray(apply(full, x, mask))).max() > 1e-3


@pytest.mark.parametrize("share_kv", [False, True])
def test_appended_padding_and_padded_content_change_nothing(share_kv):
    n, extra = 10, 14
    layer = linformer(max_len=n + extra + 8, k=6, share_kv=share_kv)
    x, mask = inputs(n, [n, 7, 3])
    out = real(apply(layer, x, mask), mask)

    noise = 100.0 * np.random.default_rng(5).standard_normal((3, n + extra, DIM)).astype(np.float32)
    x_long = np.concatenate([x, np.zeros((3, extra, DIM), np.float32)], axis=1)
    x_long = np.where(np.pad(mask, [(0, 0), (0, extra)])[..., None], x_long, noise)
    mask_long = np.pad(mask, [(0, 0), (0, extra)])
    out_long = apply(layer, x_long, mask_long)
    np.testing.assert_allclose(real(out_long[:, :n], mask), out, atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(out_long)[~mask_long], 0.0)


def test_projections_are_shared_across_heads_and_scaled_by_max_len():
    layer = linformer(max_len=512, k=64)
    assert layer.e.shape == layer.f.shape == (512, 64)
    assert abs(float(np.std(np.asarray(layer.e[...]))) * np.sqrt(512) - 1.0) < 0.05
    assert linformer(max_len=512, k=64, share_kv=True).f is None


def test_input_longer_than_max_len_is_a_config_error():
    layer = linformer(max_len=8, k=4)
    x, mask = inputs(9, [9])
    with pytest.raises(ConfigError, match="max_len=8"):
        layer(x, mask, deterministic=True)


def test_missing_max_len_or_bad_k_is_a_config_error():
    with pytest.raises(ConfigError, match="max_len"):
        registry.build("linformer", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="k=0"):
        linformer(max_len=8, k=0)
