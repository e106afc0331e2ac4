"""Linformer: its exact limit (k = n, identity projections), padding invariance and its length limit.
Nystromformer: its exact limit (one token per landmark), landmarks, pseudo-inverse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, qkv_and_mask, real, reassociation_tol, slow_except, x_and_mask
from lra_jax.attention import registry
from lra_jax.attention.low_rank.projections import iterative_pinv, segment_means
from lra_jax.attention.softmax import softmax_attention
from lra_jax.errors import ConfigError

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)

DIM, HEADS = 16, 2


def linformer(max_len, k, seed=0, **settings):
    return registry.build("linformer", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), max_len=max_len, k=k, **settings)


def apply(model, x, mask):
    return jax.jit(lambda x, mask: model(x, mask, deterministic=True))(x, mask)


@pytest.mark.parametrize("share_kv", slow_except([False, True], keep={False}))
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
    assert_close(np.asarray(got), np.asarray(softmax_attention(q, k, v, mask)), TOL)
    # The whole layer then equals the softmax layer built from the same seed (same q/k/v/out projections).
    full = registry.build("softmax", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    x, _ = x_and_mask(n, [n, n], DIM)
    assert_close(np.asarray(apply(layer, x, mask)), np.asarray(apply(full, x, mask)), TOL)


@pytest.mark.slow
def test_random_projections_differ_from_full_attention():
    n = 8
    layer = linformer(max_len=n, k=4)
    full = registry.build("softmax", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    x, mask = x_and_mask(n, [n], DIM)
    assert np.abs(np.asarray(apply(layer, x, mask)) - np.asarray(apply(full, x, mask))).max() > 1e-3


@pytest.mark.parametrize("share_kv", [False, True])
@pytest.mark.slow
def test_appended_padding_and_padded_content_change_nothing(share_kv):
    n, extra = 10, 14
    layer = linformer(max_len=n + extra + 8, k=6, share_kv=share_kv)
    x, mask = x_and_mask(n, [n, 7, 3], DIM)
    out = real(apply(layer, x, mask), mask)

    noise = 100.0 * np.random.default_rng(5).standard_normal((3, n + extra, DIM)).astype(np.float32)
    x_long = np.concatenate([x, np.zeros((3, extra, DIM), np.float32)], axis=1)
    x_long = np.where(np.pad(mask, [(0, 0), (0, extra)])[..., None], x_long, noise)
    mask_long = np.pad(mask, [(0, 0), (0, extra)])
    out_long = apply(layer, x_long, mask_long)
    assert_close(real(out_long[:, :n], mask), out, TOL)
    np.testing.assert_array_equal(np.asarray(out_long)[~mask_long], 0.0)


def test_projections_are_shared_across_heads_and_scaled_by_max_len():
    layer = linformer(max_len=512, k=64)
    assert layer.e.shape == layer.f.shape == (512, 64)
    assert abs(float(np.std(np.asarray(layer.e[...]))) * np.sqrt(512) - 1.0) < 0.05
    assert linformer(max_len=512, k=64, share_kv=True).f is None


def test_input_longer_than_max_len_is_a_config_error():
    layer = linformer(max_len=8, k=4)
    x, mask = x_and_mask(9, [9], DIM)
    with pytest.raises(ConfigError, match="max_len=8"):
        layer(x, mask, deterministic=True)


def test_missing_max_len_or_bad_k_is_a_config_error():
    with pytest.raises(ConfigError, match="max_len"):
        registry.build("linformer", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="k=0"):
        linformer(max_len=8, k=0)


# --------------------------------------------------------------------------- Nystromformer


def nystromformer(max_len, num_landmarks, **settings):
    return registry.build("nystromformer", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0), max_len=max_len,
                          num_landmarks=num_landmarks, **settings)


def attend(layer):
    return jax.jit(lambda q, k, v, mask: layer.attend(q, k, v, mask, deterministic=True, rngs=None))


def test_nystromformer_with_one_token_per_landmark_is_full_attention():
    """num_landmarks = max_len = n: Q~ = Q, K~ = K and S^ = A pinv(A) A = A, up to the iterative pinv."""
    n = 12
    q, k, v, mask = qkv_and_mask(n, [n, 7, 1], HEADS, DIM // HEADS, seed=1)  # padded tokens are empty segments, excluded
    ref = np.asarray(softmax_attention(q, k, v, mask))
    real_rows = np.asarray(mask)

    def max_error(iterations):
        layer = nystromformer(n, n, conv_kernel=0, pinv_iterations=iterations)
        return np.abs(np.asarray(attend(layer)(q, k, v, mask)) - ref)[real_rows].max()

    # Measured max |error| on real rows (jax 0.10.2, CPU; cond(A) ~ 200): 6 iterations (the default)
    # 2.8e-2, 10: 2.4e-3, 15: 5.7e-6, 20: 3.1e-6 (float32 round-off). The softmax outputs are O(0.5).
    assert max_error(20) < 2e-5
    assert 1e-3 < max_error(6) < 0.1


@pytest.mark.slow
def test_iterative_pinv_matches_numpy_and_fewer_landmarks_differ_from_softmax():
    rng = np.random.default_rng(2)
    a = jax.nn.softmax(jnp.asarray(rng.standard_normal((3, 6, 6)), jnp.float32), axis=-1)
    z = np.asarray(jax.jit(lambda a: iterative_pinv(a, 20))(a))
    # Converged by 10 of the 20 iterations (7e-6 of the largest entry, 20); what is left is float32
    # round-off of 20 rounds of 6-term matrix products. 6 iterations are still off by 7.
    assert_close(z, np.linalg.pinv(np.asarray(a, np.float64)), reassociation_tol(6, depth=20))

    n = 16
    q, k, v, mask = qkv_and_mask(n, [n, 9], HEADS, DIM // HEADS, seed=1)
    out = attend(nystromformer(n, 4, conv_kernel=0))(q, k, v, mask)
    assert np.abs(np.asarray(out) - np.asarray(softmax_attention(q, k, v, mask))).max() > 1e-2


@pytest.mark.slow
def test_landmarks_are_means_over_fixed_segments_of_real_tokens():
    x = jnp.asarray(np.arange(1.0, 11.0, dtype=np.float32).reshape(1, 10, 1, 1))
    mask = jnp.asarray(np.arange(10)[None, :] < 5)  # segments of 3: {1,2,3}, {4,5 | pad}, {pad}, {pad}
    means, real_segments = segment_means(x, mask, 3)
    np.testing.assert_allclose(np.asarray(means)[0, :, 0, 0], [2.0, 4.5, 0.0, 0.0])  # exact: small integers
    np.testing.assert_array_equal(np.asarray(real_segments)[0], [True, True, False, False])
    # The segment size comes from max_len (here ceil(32 / 8) = 4), not from the input length.
    assert nystromformer(32, 8).segment == 4


@pytest.mark.slow
def test_nystromformer_value_convolution_ignores_padding():
    n = 16
    layer = nystromformer(n + 8, 6, conv_kernel=5)
    q, k, v, mask = qkv_and_mask(n, [n, 9, 4], HEADS, DIM // HEADS, seed=1)
    out = attend(layer)(q, k, v, mask)
    pads = ~mask[:, :, None, None]
    out_wild = attend(layer)(jnp.where(pads, 1e3, q), jnp.where(pads, -1e3, k), jnp.where(pads, 1e3, v), mask)
    real_rows = np.asarray(mask)
    assert_close(np.asarray(out_wild)[real_rows], np.asarray(out)[real_rows], TOL)
    without_conv = attend(nystromformer(n + 8, 6, conv_kernel=0))(q, k, v, mask)
    assert np.abs(np.asarray(out) - np.asarray(without_conv)).max() > 1e-3  # the convolution is used


def test_nystromformer_settings_and_errors():
    defaults = registry.settings_of("nystromformer")
    assert (defaults["num_landmarks"], defaults["pinv_iterations"], defaults["conv_kernel"]) == (64, 6, 35)
    with pytest.raises(ConfigError, match="max_len"):
        registry.build("nystromformer", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="num_landmarks=0"):
        nystromformer(8, 0)
