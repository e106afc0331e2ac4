"""S6, Mamba's selective SSM (lra_jax/attention/recurrent/selective.py): the parallel scan against the step-by-step
recurrence written from the paper's equations, the convolution, the causal form, the initialisation.
The contract is tests/attention/test_attention_contract.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol
from lra_jax.attention import registry
from lra_jax.attention.recurrent import selective
from lra_jax.kernels.selective_scan import reference
from lra_jax.errors import ConfigError

DIM, N = 16, 24


def build(**settings):
    return registry.build("s6", dim=DIM, num_heads=1, rngs=nnx.Rngs(0), **{"state_size": 4, "chunk": 7, **settings})


def tokens(seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((2, N, DIM)), jnp.float32)


def test_the_depthwise_convolution_is_the_sum_it_names():
    rng = np.random.default_rng(0)
    x, kernel = rng.standard_normal((1, 10, 3)), rng.standard_normal((4, 3))
    causal = np.asarray(selective.causal_depthwise_conv(jnp.asarray(x), jnp.asarray(kernel)))
    anti = np.asarray(selective.causal_depthwise_conv(jnp.asarray(x), jnp.asarray(kernel), reverse=True))
    for t in range(10):
        assert np.allclose(causal[0, t], sum(kernel[j] * x[0, t - j] for j in range(4) if t - j >= 0), atol=1e-5)
        assert np.allclose(anti[0, t], sum(kernel[j] * x[0, t + j] for j in range(4) if t + j < 10), atol=1e-5)


def reference_direction(ssm: selective.SelectiveSSM, x: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Algorithm 2 of the paper, one step at a time in float64, for one direction of the layer."""
    conv = np.asarray(selective.causal_depthwise_conv(jnp.asarray(x), ssm.conv_kernel[...], reverse=ssm.reverse),
                      np.float64) + np.asarray(ssm.conv_bias[...])
    x = conv / (1 + np.exp(-conv)) * real  # SiLU, zero on padding
    projected = x @ np.asarray(ssm.x_proj.kernel[...], np.float64)
    low_rank, b, c = np.split(projected, [ssm.dt_rank, ssm.dt_rank + ssm.state_size], axis=-1)
    dt = np.log1p(np.exp(low_rank @ np.asarray(ssm.dt_weight[...], np.float64) + np.asarray(ssm.dt_bias[...])))
    a = -np.exp(np.asarray(ssm.a_log[...], np.float64))
    y = np.zeros_like(x)
    h = np.zeros((x.shape[0], x.shape[2], ssm.state_size))
    for t in (range(x.shape[1] - 1, -1, -1) if ssm.reverse else range(x.shape[1])):
        h = np.exp(dt[:, t, :, None] * a) * h + (dt[:, t] * x[:, t])[..., None] * b[:, t, None, :]
        y[:, t] = np.einsum("bes,bs->be", h, c[:, t]) + np.asarray(ssm.d[...]) * x[:, t]
    return y


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.slow
def test_the_layer_is_the_papers_recurrence_step_by_step(bidirectional):
    layer = build(bidirectional=bidirectional)
    u = tokens()
    mask = jnp.arange(N)[None, :] < jnp.array([[N - 5], [N]])
    real = np.asarray(mask[..., None], np.float64)
    x, z = np.split(np.asarray(layer.in_proj(u), np.float64), 2, axis=-1)
    y = sum(reference_direction(d, x * real, real) for d in layer.ssms)
    expected = (y * z / (1 + np.exp(-z))) @ np.asarray(layer.out_proj.kernel[...], np.float64)
    expected *= real
    actual = layer(u, mask, deterministic=True)
    assert_close(actual, expected, reassociation_tol(N * 4 * DIM, depth=4))
    sequential = layer.mix(u, mask, form=reference.recurrent)
    assert_close(sequential * real, expected, reassociation_tol(N * 4 * DIM, depth=4))


def test_the_initialisation_is_the_papers():
    layer = build(state_size=8, expand=2, dt_min=0.01, dt_max=0.05)
    ssm = layer.ssms[0]
    assert np.allclose(-np.exp(ssm.a_log[...]), -np.arange(1, 9)[None, :].repeat(2 * DIM, 0))  # S4D-Real
    dt = np.asarray(jax.nn.softplus(ssm.dt_bias[...]))
    assert 0.01 - 1e-6 <= dt.min() and dt.max() <= 0.05 + 1e-6
    assert np.array_equal(np.asarray(ssm.d[...]), np.ones(2 * DIM))
    assert ssm.dt_rank == 1 and layer.in_proj.kernel.shape == (DIM, 4 * DIM)  # ceil(16 / 16), E = 2 d


def test_bad_settings_are_one_line():
    with pytest.raises(ConfigError, match="dt_min <= dt_max"):
        build(dt_min=0.1, dt_max=0.01)
    with pytest.raises(ConfigError, match="state_size, expand, conv_kernel and chunk >= 1"):
        build(expand=0)
