"""The scale-exact helpers of attention/core.py: no epsilon, so no bias at any input scale."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_jax.attention.core import divide_or_zero, unit_vectors
from lra_jax.attention.kernelized.feature_maps import linear_attention, taylor_attention


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1.0, 1e8, 1e30])
def test_unit_vectors_are_exact_at_any_scale(scale):
    x = np.array([[3.0, -4.0, 0.0], [1e-3, 0.0, 0.0]], np.float32)
    unit = np.asarray(unit_vectors(jnp.asarray(x * np.float32(scale))))
    expected = x / np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    np.testing.assert_allclose(unit, expected, rtol=4 * np.finfo(np.float32).eps)


def test_zero_vector_stays_zero_with_finite_gradients():
    grad = jax.grad(lambda x: jnp.sum(unit_vectors(x) * jnp.arange(3.0)))(jnp.zeros(3))
    np.testing.assert_array_equal(np.asarray(unit_vectors(jnp.zeros((2, 3)))), 0.0)
    assert np.isfinite(np.asarray(grad)).all()


def test_divide_or_zero_is_exact_for_tiny_denominators_and_zero_for_none():
    num, den = jnp.array([3e-30, 1.0, 5.0]), jnp.array([1e-30, 0.0, 2.0])
    np.testing.assert_allclose(np.asarray(divide_or_zero(num, den)), [3.0, 0.0, 2.5], rtol=1e-6)
    num, den = jnp.array([3e-15, 1.0, 5.0]), jnp.array([1e-15, 0.0, 2.0])  # -n/d^2 stays finite
    grads = jax.grad(lambda n, d: divide_or_zero(n, d).sum(), argnums=(0, 1))(num, den)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


@pytest.mark.slow
def test_linear_attention_is_unbiased_when_its_features_are_tiny():
    """elu(x) + 1 = e^x for x < 0: queries near -30 give features ~1e-13, where an epsilon of
    1e-6 in the normaliser would pull every output towards 0."""
    key_q, key_k, key_v = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(key_q, (1, 8, 1, 4)) - 30.0
    k, v = jax.random.normal(key_k, (1, 8, 1, 4)), jax.random.normal(key_v, (1, 8, 1, 4))
    mask = jnp.ones((1, 8), bool)
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(x))  # noqa: E731
    scores = np.einsum("bqhd,bkhd->bhqk", phi(np.asarray(q, np.float64)), phi(np.asarray(k, np.float64)))
    dense = np.einsum("bhqk,bkhd->bqhd", scores / scores.sum(-1, keepdims=True), np.asarray(v, np.float64))
    np.testing.assert_allclose(np.asarray(linear_attention(q, k, v, mask)), dense, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_taylor_does_not_depend_on_the_norms_of_queries_and_keys():
    q, k, v = jax.random.normal(jax.random.key(1), (3, 1, 8, 2, 4))
    mask = jnp.arange(8)[None, :] < 6
    out = np.asarray(taylor_attention(q, k, v, mask))
    for scale in (1e-20, 1e20):
        np.testing.assert_allclose(np.asarray(taylor_attention(scale * q, scale * k, v, mask)), out,
                                   rtol=1e-5, atol=1e-6)
