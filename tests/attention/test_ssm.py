"""S4D (lra_jax/attention/recurrent/ssm.py): the FFT convolution equals the SSM's own recurrence, the
S4D-Lin initialisation, and the optimizer's separate group for the state-space parameters.

The shared contract (padding, all-padding rows, jit/grad/vmap/bfloat16) runs in
tests/attention/test_attention_contract.py like for every variant, and the cost in tests/attention/test_cost.py.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from helpers import slow_except

from lra_jax.attention import registry
from lra_jax.attention.core import SSMParam
from lra_jax.config.settings import optimizer_from_config
from lra_jax.errors import ConfigError
from lra_jax.training import optimizer

DIM, N = 6, 16


def build(**settings):
    return registry.build("s4d", dim=DIM, num_heads=1, rngs=nnx.Rngs(0), **settings)


def recurrence(layer, u):
    """y by running each channel's discretised SSM step by step (lax.scan over time), in float32.

    x_t = A_bar x_{t-1} + B_bar u_t,  y_t = 2 Re(C x_t): forward over t for C, and backward
    over the positions after t for C' (bidirectional), plus D u_t.
    """
    dt = jnp.exp(layer.log_dt[...])[:, None]
    a = -jnp.exp(layer.log_a_real[...]) + 1j * layer.a_imag[...]
    a_bar, b_bar = jnp.exp(dt * a), (jnp.exp(dt * a) - 1) / a
    c = layer.c[...][..., 0] + 1j * layer.c[...][..., 1]  # [k h m]

    def run(c_k, u):  # u [n h] -> y [n h]
        def step(x, u_t):
            x = a_bar * x + b_bar * u_t[:, None]
            return x, 2 * jnp.real(jnp.sum(c_k * x, axis=-1))

        return jax.lax.scan(step, jnp.zeros_like(a_bar), u)[1]

    def one(u):
        y = run(c[0], u)
        if c.shape[0] == 2:  # backward SSM on the reversed sequence, shifted by one: sees s > t only
            backward = jnp.flip(run(c[1], jnp.flip(u, 0)), 0)
            y = y + jnp.concatenate([backward[1:], jnp.zeros_like(backward[:1])], 0)
        return y + layer.d[...] * u

    return jax.jit(jax.vmap(one))(u)


def long_kernel_layer(bidirectional=True):
    """Small steps (dt = 1e-3): the kernel barely decays over N steps, so a circular convolution
    over n points (wrapping the tail onto the head) would be far off. B_bar ~ dt, so C is scaled
    by 1/dt to give kernel entries of order one, comparable to D u."""
    layer = build(state_size=8, dt_min=1e-3, dt_max=1e-3, bidirectional=bidirectional)
    layer.c[...] = layer.c[...] * 1e3
    return layer


@pytest.mark.parametrize("bidirectional", slow_except([True, False], keep={False}))
def test_the_layer_convolution_equals_the_recurrence(bidirectional):
    """By FFT (bidirectional) or by the parallel scan (causal), against the SSM run step by step."""
    layer = long_kernel_layer(bidirectional)
    u = jnp.asarray(np.random.default_rng(0).standard_normal((2, N, DIM)), jnp.float32)
    expected = np.asarray(recurrence(layer, u))
    got = np.asarray(layer.ssm(u))
    # float32 FFT of length 2N: error ~ 1e-6 of the largest term; 1e-4 of max|y| leaves a wide margin
    np.testing.assert_allclose(got, expected, atol=1e-4 * np.abs(expected).max(), rtol=0)
    # and the convolution part is not negligible next to D u (it is what the check is about)
    assert np.abs(expected - np.asarray(layer.d[...] * u)).max() > 0.1 * np.abs(expected).max()


@pytest.mark.parametrize("length", slow_except([1, 7, 16, 50], keep={7}))
def test_factored_vandermonde_kernel_matches_the_plain_product(length):
    """The kernel's factored powers (l = qR + r) against K_l = 2 Re sum_m C_m B_bar_m A_bar_m^l in float64."""
    layer = build(state_size=8)
    got = np.asarray(layer.kernel(length))
    dt = np.exp(np.asarray(layer.log_dt[...], np.float64))[:, None]
    a = -np.exp(np.asarray(layer.log_a_real[...], np.float64)) + 1j * np.asarray(layer.a_imag[...], np.float64)
    c = np.asarray(layer.c[...], np.float64)
    weights = (c[..., 0] + 1j * c[..., 1]) * (np.exp(dt * a) - 1) / a
    expected = 2 * np.real(np.einsum("khm,hml->khl", weights, np.exp((dt * a)[..., None] * np.arange(length))))
    # float32 exp/products of O(1) terms summed over 4 modes: ~1e-6 relative; 1e-5 of the largest entry
    np.testing.assert_allclose(got, expected, atol=1e-5 * np.abs(expected).max(), rtol=0)


@pytest.mark.slow
def test_circular_wrap_would_be_caught():
    """The recurrence check can fail: an n-point (circular) FFT convolution does not pass it."""
    layer = long_kernel_layer()
    u = jnp.asarray(np.random.default_rng(1).standard_normal((1, N, DIM)), jnp.float32)
    kernel = layer.kernel(N)
    full = kernel[0] + jnp.flip(kernel[1], -1)  # lags 0..n-1 and -n..-1 folded onto n points (mod n)
    circular = jnp.fft.irfft(jnp.fft.rfft(u, axis=1) * jnp.fft.rfft(full, axis=-1).T, n=N, axis=1)
    wrapped = np.asarray(circular + layer.d[...] * u)
    expected = np.asarray(recurrence(layer, u))
    assert np.abs(wrapped - expected).max() > 1e-2 * np.abs(expected).max()


def test_s4d_lin_initialisation():
    layer = build(state_size=8, dt_min=1e-3, dt_max=1e-1)
    a = -np.exp(np.asarray(layer.log_a_real[...])) + 1j * np.asarray(layer.a_imag[...])
    np.testing.assert_allclose(a, np.broadcast_to(-0.5 + 1j * np.pi * np.arange(4), (DIM, 4)), rtol=1e-6)
    dt = np.exp(np.asarray(layer.log_dt[...]))
    assert dt.shape == (DIM,) and (dt >= 1e-3 * (1 - 1e-6)).all() and (dt <= 1e-1 * (1 + 1e-6)).all()
    assert np.unique(dt).size == DIM  # drawn per channel
    assert layer.c[...].shape == (2, DIM, 4, 2)  # forward and backward C, N/2 complex modes
    ssm = {name for name in ("log_dt", "log_a_real", "a_imag", "c", "d") if isinstance(getattr(layer, name), SSMParam)}
    assert ssm == {"log_dt", "log_a_real", "a_imag"}


@pytest.mark.parametrize("settings, problem", [
    (dict(state_size=7), "even state_size"),
    (dict(state_size=0), "even state_size"),
    (dict(dt_min=0.1, dt_max=0.01), "dt_min <= dt_max"),
])
def test_bad_settings_are_refused(settings, problem):
    with pytest.raises(ConfigError, match=problem):
        build(**settings)


def test_bfloat16_layer_keeps_the_convolution_in_float32():
    layer = build(state_size=8, dtype=jnp.bfloat16)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, N, DIM)), jnp.bfloat16)
    module = jax.jit(lambda x: layer(x, jnp.ones(x.shape[:2], bool), deterministic=True)).lower(x).as_text()
    ffts = [line for line in module.splitlines() if "stablehlo.fft" in line]
    assert len(ffts) >= 3 and all("bf16" not in line and "f32" in line for line in ffts), ffts


def optimizer_config(**optimizer):
    c = ml_collections.ConfigDict(dict(num_train_steps=10, optimizer=dict(
        schedule="rsqrt", learning_rate=0.5, warmup_steps=1, weight_decay=0.5, b1=0.9, b2=0.98, eps=1e-9,
        grad_clip_norm=0.0, skip_nonfinite_updates=0, **optimizer)))
    return c


def two_updates(config, grads_scale):
    layer = build(state_size=4)
    _, params, _ = nnx.split(layer, nnx.Param, ...)
    tx = optimizer.make_optimizer(optimizer_from_config(config))
    state = tx.init(params)
    grads = jax.tree.map(lambda p: grads_scale * jnp.ones_like(p), params)
    for _ in range(2):  # the schedule's rate is 0 at step 0
        updates, state = tx.update(grads, state, params)
    return params, updates


@pytest.mark.slow
def test_ssm_parameters_get_their_rate_and_no_weight_decay():
    config = optimizer_config(ssm_max_learning_rate=0.01)  # main peak 0.5: the cap decides
    params, updates = two_updates(config, grads_scale=0.0)  # zero gradients: only weight decay moves
    decayed = -0.5 * 0.5 * params["d"][...]  # -lr(1) * wd * p; lr(1) = 0.5 / sqrt(1)
    np.testing.assert_allclose(np.asarray(updates["d"][...]), np.asarray(decayed), rtol=1e-5)
    for name in ("log_dt", "log_a_real", "a_imag"):
        np.testing.assert_array_equal(np.asarray(updates[name][...]), 0.0)

    params, updates = two_updates(config, grads_scale=1.0)
    # Adam's step for a constant gradient is lr * ~1: the SSM rate, not the main one
    step = np.abs(np.asarray(updates["log_dt"][...]))
    np.testing.assert_allclose(step, 0.01, rtol=1e-3)


@pytest.mark.parametrize("schedule, warmup, rate, expected_peak", [
    ("rsqrt", 200, 0.05, 0.001),  # main peak 0.05 / sqrt(200) = 0.0035: capped
    ("rsqrt", 200, 0.01, 0.01 / np.sqrt(200)),  # main peak 0.0007 < cap: the SSM follows it
    ("cosine", 10, 0.004, 0.001),
    ("cosine", 10, 0.0005, 0.0005),  # the paper's Path-X
])
def test_ssm_peak_rate_is_the_smaller_of_the_cap_and_the_main_peak(schedule, warmup, rate, expected_peak):
    config = optimizer_config(ssm_max_learning_rate=0.001)
    config.optimizer.update(schedule=schedule, warmup_steps=warmup, learning_rate=rate)
    opt = optimizer_from_config(config)
    peak = optimizer.make_schedule(opt, optimizer.ssm_learning_rate(opt))(warmup)
    np.testing.assert_allclose(float(peak), expected_peak, rtol=1e-5)


def test_s4d_config_ssm_rate_follows_a_learning_rate_override():
    from lra_jax.research.sweeps import sweep_plan

    def ssm_peak(*overrides):
        config = sweep_plan.train_config(["--config=configs/s4d.py:listops,mini", *overrides])
        opt = optimizer_from_config(config)
        return float(optimizer.make_schedule(opt, optimizer.ssm_learning_rate(opt))(opt.warmup_steps))

    assert ssm_peak() == pytest.approx(0.001, rel=1e-5)  # main peak 0.05 / sqrt(200) = 0.0035
    assert ssm_peak("--config.optimizer.learning_rate=0.005") == pytest.approx(0.005 / np.sqrt(200), rel=1e-5)


@pytest.mark.slow
def test_without_ssm_rate_every_parameter_is_alike():
    params, updates = two_updates(optimizer_config(), grads_scale=0.0)
    np.testing.assert_allclose(np.asarray(updates["log_dt"][...]), np.asarray(-0.25 * params["log_dt"][...]), rtol=1e-5)


@pytest.mark.slow
def test_parameter_groups_follow_the_layers_inside_a_model():
    from lra_jax.models.encoder import Encoder
    from lra_jax.models.model_settings import ModelSettings

    shape = ModelSettings(num_layers=2, num_heads=1, emb_dim=8, mlp_dim=0, scan_layers=True)
    model = Encoder(vocab_size=5, max_len=8, model=shape, attention=dict(name="s4d", state_size=4), rngs=nnx.Rngs(0))
    _, params, _ = nnx.split(model, nnx.Param, ...)
    groups = jax.tree.leaves(optimizer.parameter_groups(params))
    assert groups.count("ssm") == 3 and groups.count("default") > 3
    assert not hasattr(model.blocks, "mlp") or model.blocks.mlp is None  # mlp_dim=0: no feed-forward sublayer
