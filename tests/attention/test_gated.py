"""GLA and SSD (lra_jax/attention/recurrent/gated.py): the chunked form (lra_jax/kernels/gated_scan/reference.py)
against the recurrence at every chunk size, the bidirectional form as the sum it names, SSD as Mamba-2's
scalar-decay recurrence written out, the causal forms. The Pallas kernel is
tests/kernels/test_gated_scan_kernel.py. The contract is tests/attention/test_attention_contract.py."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, slow_except
from lra_jax.attention import registry
from lra_jax.attention.recurrent import gated, selective
from lra_jax.errors import ConfigError
from lra_jax.kernels.gated_scan import reference

DIM, N = 16, 24


def heads(seed, shape, scale=1.0):
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def gla_inputs(n=N, dk=4, dv=6):
    q, k, v = heads(0, (2, n, 3, dk)), heads(1, (2, n, 3, dk)), heads(2, (2, n, 3, dv))
    log_g = -jnp.abs(heads(3, (2, n, 3, dk), 0.5))  # gates in (0, 1]
    return q, k, v, log_g


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("chunk", slow_except([1, 4, 8, 24], keep={4}))
def test_the_chunked_form_is_the_recurrence(chunk, strict):
    q, k, v, log_g = gla_inputs()
    chunked = reference.chunked(q, k, v, log_g, chunk=chunk, strict=strict)
    recurrent = reference.recurrent(q, k, v, log_g, strict=strict)
    assert_close(chunked, recurrent, reassociation_tol(N * 4, depth=4))


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("chunk", slow_except([1, 8, 24], keep={8}))
def test_one_decay_per_head_is_the_same_decay_on_every_key_dimension(chunk, strict):
    """log g [b n h 1] (SSD) takes the [C, C] path; broadcast to [b n h d_k] it takes the general one."""
    q, k, v, log_g = gla_inputs()
    scalar = log_g[..., :1]
    assert_close(reference.chunked(q, k, v, scalar, chunk=chunk, strict=strict),
                 reference.chunked(q, k, v, jnp.broadcast_to(scalar, log_g.shape), chunk=chunk, strict=strict),
                 reassociation_tol(N * 4, depth=4))
    assert_close(reference.chunked(q, k, v, scalar, chunk=chunk, strict=strict),
                 reference.recurrent(q, k, v, scalar, strict=strict), reassociation_tol(N * 4, depth=4))


def test_the_unrolled_sum_is_the_recurrence():
    """y_t = Σ_{s<=t} (q_t ⊙ exp(b_t - b_s)) · k_s v_s, written out in float64."""
    q, k, v, log_g = (np.asarray(x, np.float64) for x in gla_inputs(n=10))
    b = np.cumsum(log_g, axis=1)
    expected = np.zeros(v.shape)
    for t in range(10):
        for s in range(t + 1):
            weight = np.einsum("bhj,bhj->bh", q[:, t] * np.exp(b[:, t] - b[:, s]), k[:, s])
            expected[:, t] += weight[..., None] * v[:, s]
    assert_close(reference.recurrent(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, log_g))), expected,
                 reassociation_tol(40, depth=3))


@pytest.mark.slow
def test_the_bidirectional_form_adds_the_strict_backward_sum():
    q, k, v, log_g = gla_inputs(n=10)
    both = gated.bidirectional_gla(q, k, v, log_g, chunk=4, bidirectional=True)
    forward = reference.recurrent(q, k, v, log_g)
    flip = lambda x: jnp.flip(x, axis=1)
    backward = flip(reference.recurrent(flip(q), flip(k), flip(v), flip(log_g), strict=True))
    assert_close(both, forward + backward, reassociation_tol(40, depth=4))
    # the backward sum leaves each token's own term out: a sequence of one token is the forward form alone
    one = tuple(x[:, :1] for x in (q, k, v, log_g))
    assert_close(gated.bidirectional_gla(*one, chunk=4, bidirectional=True), reference.recurrent(*one), 1e-6)


@pytest.mark.parametrize("name, settings", [("gla", dict(chunk=5, gate_rank=4)),
                                            ("ssd", dict(state_size=4, head_size=8, chunk=5)),
                                            ("ssd", dict(state_size=4, head_size=8, chunk=7, bidirectional=False))])
@pytest.mark.slow
def test_the_layers_compute_the_same_in_either_form(name, settings):
    layer = registry.build(name, dim=DIM, num_heads=2, rngs=nnx.Rngs(0), **settings)
    x = heads(4, (2, N, DIM))
    mask = jnp.arange(N)[None, :] < jnp.array([[N - 6], [N]])
    assert_close(layer.mix(x, mask), layer.mix(x, mask, form=reference.recurrent), reassociation_tol(N * 8, depth=6))


@pytest.mark.slow
def test_ssd_is_mamba2s_scalar_decay_recurrence():
    """S_t = exp(Δ_t A_h) S_{t-1} + B_tᵀ (Δ_t x_t), y_t = C_t S_t + D_h x_t per head, step by step in float64."""
    layer = registry.build("ssd", dim=DIM, num_heads=2, rngs=nnx.Rngs(0), state_size=4, head_size=8, chunk=5,
                           bidirectional=False)
    u = heads(5, (1, N, DIM))
    mask = jnp.ones((1, N), bool)
    inner = 2 * DIM
    z, xbc, dt = np.split(np.asarray(layer.in_proj(u), np.float64), [inner, 2 * inner + 8], axis=-1)
    conv = np.asarray(selective.causal_depthwise_conv(jnp.asarray(xbc), layer.conv_kernel_weights[...]), np.float64)
    xbc = conv + np.asarray(layer.conv_bias[...])
    xbc = xbc / (1 + np.exp(-xbc))
    x, b, c = np.split(xbc, [inner, inner + 4], axis=-1)
    dt = np.log1p(np.exp(dt + np.asarray(layer.dt_bias[...])))
    a = -np.exp(np.asarray(layer.a_log[...], np.float64))
    x = x.reshape(1, N, 4, 8)
    state = np.zeros((4, 4, 8))  # [heads, N, P]
    y = np.zeros_like(x)
    for t in range(N):
        state = np.exp(dt[0, t] * a)[:, None, None] * state + b[0, t][None, :, None] * (dt[0, t][:, None] * x[0, t])[:, None]
        y[0, t] = np.einsum("s,hsp->hp", c[0, t], state) + np.asarray(layer.d[...])[:, None] * x[0, t]
    expected = y.reshape(1, N, inner) * (z / (1 + np.exp(-z)))
    assert_close(layer.mix(u, mask), expected, reassociation_tol(N * 8, depth=6))


def test_bad_settings_are_one_line():
    with pytest.raises(ConfigError, match="even width per head"):
        registry.build("gla", dim=6, num_heads=2, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="head_size dividing"):
        registry.build("ssd", dim=DIM, num_heads=2, rngs=nnx.Rngs(0), head_size=5)
