"""Hyena (lra_jax/attention/recurrent/hyena.py): the FFT and the causal convolutions against the direct sum, the implicit
filters, the causal form. The contract is tests/attention/test_attention_contract.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, slow_except
from lra_jax.attention import registry
from lra_jax.attention.recurrent import hyena
from lra_jax.attention.recurrent.ssm import fft_convolution
from lra_jax.errors import ConfigError

DIM, N = 16, 24


def build(**settings):
    return registry.build("hyena", dim=DIM, num_heads=1, rngs=nnx.Rngs(0), max_len=32,
                          **{"filter_features": 4, "filter_hidden": 16, **settings})


def noise(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.mark.parametrize("directions", slow_except([1, 2], keep={1}))
def test_the_fft_convolution_is_the_direct_sum(directions):
    u, kernel = noise(0, (2, N, 5)), noise(1, (directions, 5, N))
    assert_close(fft_convolution(u, kernel), hyena.direct_convolution(u, kernel), reassociation_tol(2 * N, depth=3))
    t, s = 10, 13  # one term written out: lag t - s = -3 reads the anti-causal filter at index 2
    one = jnp.zeros((1, N, 5)).at[0, s].set(1.0)
    expected = kernel[1, :, s - t - 1] if directions == 2 else jnp.zeros(5)
    assert_close(hyena.direct_convolution(one, kernel)[0, t], expected, 1e-6)


@pytest.mark.parametrize("n, block", slow_except([(37, 4), (16, 16), (64, 8)], keep={37}))
def test_the_causal_convolution_is_the_direct_sum_and_never_reads_ahead(n, block):
    """Several sizes of squares (37 = 4 · 8 + 5: three, the last blocks padded), none (one diagonal block)."""
    u, kernel = noise(3, (2, n, 5)), noise(4, (1, 5, n))
    assert_close(hyena.causal_convolution(u, kernel, block), hyena.direct_convolution(u, kernel),
                 reassociation_tol(2 * n, depth=3))
    jacobian = jax.jacrev(lambda u: hyena.causal_convolution(u, kernel, block)[0])(u)[:, :, 0]  # [t h s h]
    later = np.triu(np.ones((n, n), bool), 1)
    assert np.all(np.asarray(jacobian).transpose(0, 2, 1, 3)[later] == 0)  # exactly, not approximately
    assert np.all(np.abs(np.asarray(jacobian).transpose(0, 2, 1, 3)[~later]).sum(-1).sum(-1) > 0)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.slow
def test_the_layer_computes_the_same_with_either_convolution(bidirectional):
    layer = build(bidirectional=bidirectional)
    x = noise(2, (2, N, DIM))
    mask = jnp.arange(N)[None, :] < jnp.array([[N - 5], [N]])
    assert_close(layer.mix(x, mask), layer.mix(x, mask, convolve=hyena.direct_convolution),
                 reassociation_tol(2 * N, depth=6))


def test_the_filters_at_a_lag_do_not_depend_on_the_length_and_decay():
    filters = build().filters
    short, long = filters(N), filters(2 * N)
    assert np.array_equal(short, long[..., :N])
    window = np.exp(np.asarray(filters.decay())[None, :] * np.arange(N)[:, None])
    assert window[-1].max() < 1 and np.all(np.diff(window, axis=0) < 0)  # every channel decays with the lag


def test_bad_settings_are_one_line():
    with pytest.raises(ConfigError, match="needs max_len"):
        registry.build("hyena", dim=DIM, num_heads=1, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="order, short_kernel"):
        build(order=0)
