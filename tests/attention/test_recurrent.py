"""LRU and S5 (lra_jax/attention/recurrent/diagonal.py): the layers with the parallel scan against the step-by-step one
(the scans themselves: tests/kernels/test_linear_recurrence.py), the papers' initialisations, the causal form. The contract (padding, finiteness, jit/grad/vmap/bfloat16) is
tests/attention/test_attention_contract.py, which every registered variant goes through."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, slow_except
from lra_jax.attention import registry
from lra_jax.attention.recurrent import diagonal
from lra_jax.attention.core import SSMParam
from lra_jax.errors import ConfigError
from lra_jax.kernels.linear_recurrence import sequential_scan

DIM, N = 16, 40


def build(name, **settings):
    return registry.build(name, dim=DIM, num_heads=1, rngs=nnx.Rngs(0), **settings)


def assert_complex_close(actual, desired, tol):
    """`assert_close` on the real and the imaginary parts together."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    assert_close(np.stack([actual.real, actual.imag]), np.stack([desired.real, desired.imag]), tol)


def tokens(seed=0, n=N):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((2, n, DIM)), jnp.float32)


@pytest.mark.parametrize("name, settings", [("lru", dict(state_size=8, r_min=0.5)), ("s5", dict(state_size=8, blocks=2)),
                                            ("lru", dict(state_size=4, bidirectional=False)),
                                            ("s5", dict(state_size=4, bidirectional=False))])
@pytest.mark.slow
def test_the_layer_computes_the_same_with_either_scan(name, settings):
    layer = build(name, **settings)
    u = tokens()
    assert_close(layer.ssm(u), layer.ssm(u, scan=sequential_scan), reassociation_tol(N, depth=4))


def test_lru_ring_initialisation():
    layer = build("lru", state_size=512, r_min=0.4, r_max=0.9, max_phase=math.pi / 4)
    lam = np.asarray(layer.transition())
    radius = np.abs(lam)
    assert radius.min() >= 0.4 - 1e-6 and radius.max() <= 0.9 + 1e-6
    # uniform on the ring: |λ|² is uniform on [r_min², r_max²]
    assert abs(np.mean(radius**2) - (0.4**2 + 0.9**2) / 2) < 0.02
    phase = np.angle(lam)
    assert phase.min() >= 0 and phase.max() <= math.pi / 4 + 1e-6
    assert_close(np.exp(np.asarray(layer.log_gamma[...])), np.sqrt(1 - radius**2), 1e-5)


def test_hippo_n_is_the_normal_part_of_hippo_legs():
    size = 8
    eigenvalues, vectors = diagonal.hippo_n(size)
    n = np.arange(size)
    legs = np.array([[-math.sqrt((2 * i + 1) * (2 * k + 1)) if i > k else -(i + 1.0) if i == k else 0.0
                      for k in n] for i in n])
    normal = legs + np.outer(np.sqrt(n + 0.5), np.sqrt(n + 0.5))
    assert np.allclose(eigenvalues.real, -0.5)
    assert np.allclose(vectors.conj().T @ vectors, np.eye(size), atol=1e-12)
    assert np.allclose(vectors @ np.diag(eigenvalues) @ vectors.conj().T, normal, atol=1e-10)
    assert np.allclose(np.sort(eigenvalues.imag), -np.sort(eigenvalues.imag)[::-1])  # conjugate pairs


@pytest.mark.slow
def test_s5_keeps_one_of_each_pair_per_block_and_discretizes_by_zero_order_hold():
    layer = build("s5", state_size=8, blocks=2, dt_min=0.01, dt_max=0.1)
    lam = np.asarray(layer.lambda_re_im[...] @ np.array([1, 1j]))
    block, _ = diagonal.hippo_n(4)
    assert np.allclose(lam, np.tile(block[block.imag > 0], 2))
    lam_bar, b_bar = layer.discretized()
    dt = np.exp(np.asarray(layer.log_dt[...]))
    assert 0.01 - 1e-6 <= dt.min() and dt.max() <= 0.1 + 1e-6
    assert_complex_close(lam_bar, np.exp(lam * dt), 1e-5)
    # B̄ = (Λ̄ - 1)/Λ B̃ = ∫_0^Δ exp(Λ s) ds B̃
    integral = np.array([np.trapezoid(np.exp(l * np.linspace(0, d, 2001)), dx=d / 2000) for l, d in zip(lam, dt)])
    b_tilde = np.asarray(layer.b[...] @ np.array([1, 1j]))
    assert_complex_close(b_bar, integral[:, None] * b_tilde, 1e-5)


@pytest.mark.parametrize("name, settings, message", [
    ("lru", dict(r_min=0.9, r_max=0.5), "r_min < r_max"), ("lru", dict(max_phase=7.0), "max_phase"),
    ("s5", dict(state_size=6, blocks=2), "even"), ("s5", dict(state_size=0), "positive even"),
    ("s5", dict(state_size=-4), "positive even"), ("s5", dict(blocks=0), "blocks >= 1"), ("s5", dict(dt_min=0.1, dt_max=0.01), "dt_min <= dt_max")])
def test_bad_settings_are_one_line(name, settings, message):
    with pytest.raises(ConfigError, match=message):
        build(name, **settings)


@pytest.mark.parametrize("name", slow_except(["lru", "s5"], keep={"lru"}))
def test_the_recurrence_parameters_take_the_state_space_rate(name):
    paths = jax.tree_util.tree_flatten_with_path(nnx.state(build(name, state_size=8), SSMParam))[0]
    expected = {"lru": {"log_nu", "log_theta", "log_gamma"}, "s5": {"lambda_re_im", "log_dt"}}[name]
    assert {path[0].key for path, _ in paths} == expected
