"""The attention contract (DESIGN.md), checked for every registered variant.

A new variant joins this suite by registering; `SETTINGS` may give it small
settings so that the checks exercise its approximation (a window smaller than n,
fewer features than n) rather than a degenerate limit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra_jax.attention import registry

DIM, HEADS, N, EXTRA = 32, 4, 24, 8

# Per-variant settings for the contract checks (defaults otherwise).
SETTINGS = {
    "local": dict(window=3),
    "linformer": dict(k=8),
    "performer": dict(num_features=16),
}


def build(name, *, dtype=jnp.float32, dropout_rate=0.0, seed=0):
    return registry.build(
        name,
        dim=DIM,
        num_heads=HEADS,
        rngs=nnx.Rngs(seed),
        max_len=N + EXTRA,
        dropout_rate=dropout_rate,
        dtype=dtype,
        **SETTINGS.get(name, {}),
    )


def inputs(seed=0, n=N):
    """Two rows: one with ragged padding, one with none; padded positions hold noise."""
    x = jax.random.normal(jax.random.key(seed), (3, n, DIM))
    lengths = jnp.array([n - 7, n, 5])
    mask = jnp.arange(n)[None, :] < lengths[:, None]
    return x, mask


def real(out, mask):
    return np.asarray(jnp.where(mask[..., None], out, 0.0))


@pytest.fixture(params=registry.names())
def name(request):
    return request.param


def test_shape_dtype_and_zero_padding(name):
    x, mask = inputs()
    out = build(name)(x, mask, deterministic=True)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(np.asarray(out)[~np.asarray(mask)], 0.0)


def test_padding_content_does_not_leak(name):
    x, mask = inputs()
    noise = 100.0 * jax.random.normal(jax.random.key(7), x.shape)
    x_other = jnp.where(mask[..., None], x, noise)
    model = build(name)
    out = model(x, mask, deterministic=True)
    out_other = model(x_other, mask, deterministic=True)
    np.testing.assert_allclose(real(out_other, mask), real(out, mask), atol=1e-5, rtol=1e-4)


def test_appended_padding_does_not_change_real_outputs(name):
    x, mask = inputs()
    model = build(name)
    out = model(x, mask, deterministic=True)
    tail = jax.random.normal(jax.random.key(3), (x.shape[0], EXTRA, DIM))
    x_long = jnp.concatenate([x, tail], axis=1)
    mask_long = jnp.concatenate([mask, jnp.zeros((x.shape[0], EXTRA), bool)], axis=1)
    out_long = model(x_long, mask_long, deterministic=True)[:, :N]
    np.testing.assert_allclose(real(out_long, mask), real(out, mask), atol=1e-5, rtol=1e-4)


def test_all_padding_row_is_finite_with_finite_gradients(name):
    x, mask = inputs()
    mask = mask.at[0].set(False)
    model = build(name)
    out = model(x, mask, deterministic=True)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(np.asarray(out[0]), 0.0)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x, mask, deterministic=True) ** 2)

    grads = jax.grad(loss, argnums=(0, 1))(params, x)
    for leaf in jax.tree.leaves(grads):
        assert np.isfinite(np.asarray(leaf)).all()
    assert any(np.abs(np.asarray(leaf)).sum() > 0 for leaf in jax.tree.leaves(grads[0]))


def test_jit_matches_eager(name):
    x, mask = inputs()
    model = build(name)
    eager = model(x, mask, deterministic=True)
    jitted = nnx.jit(lambda m, x, mask: m(x, mask, deterministic=True))(model, x, mask)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), atol=1e-5, rtol=1e-4)


def test_vmap_over_an_extra_batch_axis(name):
    x, mask = inputs()
    model = build(name)
    out = model(x, mask, deterministic=True)
    graphdef, state = nnx.split(model)
    mapped = jax.vmap(lambda x, m: nnx.merge(graphdef, state)(x, m, deterministic=True))(x[None], mask[None])
    np.testing.assert_allclose(np.asarray(mapped[0]), np.asarray(out), atol=1e-5, rtol=1e-4)


def test_bfloat16_runs_and_stays_close_to_float32(name):
    x, mask = inputs()
    out32 = build(name)(x, mask, deterministic=True)
    out16 = build(name, dtype=jnp.bfloat16)(x.astype(jnp.bfloat16), mask, deterministic=True)
    assert out16.dtype == jnp.bfloat16
    out16 = np.asarray(out16.astype(jnp.float32))
    assert np.isfinite(out16).all()
    scale = np.abs(np.asarray(out32)).max()
    assert np.abs(out16 - np.asarray(out32)).max() < 0.05 * scale + 1e-2


def test_training_mode_uses_the_given_key_and_respects_padding(name):
    x, mask = inputs()
    model = build(name, dropout_rate=0.3)
    out_a = model(x, mask, deterministic=False, rngs=nnx.Rngs(1))
    x_other = jnp.where(mask[..., None], x, 50.0)
    out_b = model(x_other, mask, deterministic=False, rngs=nnx.Rngs(1))
    assert np.isfinite(np.asarray(out_a)).all()
    np.testing.assert_allclose(real(out_b, mask), real(out_a, mask), atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(out_a)[~np.asarray(mask)], 0.0)
