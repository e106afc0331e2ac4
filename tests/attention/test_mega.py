"""Mega (lra_jax/attention/recurrent/mega.py): the moving average's convolution against its recurrence, Mega-chunk at
one chunk against full attention, chunks kept apart, the causal form. The contract is
tests/attention/test_attention_contract.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol
from lra_jax.attention import registry
from lra_jax.attention.recurrent import mega
from lra_jax.errors import ConfigError

DIM, N = 16, 24


def build(**settings):
    return registry.build("mega", dim=DIM, num_heads=1, rngs=nnx.Rngs(0), max_len=32,
                          **{"ema_dim": 4, "shared_dim": 8, **settings})


def noise(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def test_the_moving_average_is_its_recurrence_both_ways():
    layer = build()
    x = noise(0, (2, N, DIM))
    alpha, delta = jax.nn.sigmoid(layer.alpha_logit[...]), jax.nn.sigmoid(layer.delta_logit[...])
    beta, eta = layer.beta[...], layer.eta[...]
    forward = mega.ema_recurrence(x, alpha[0], delta[0], beta[0], eta[0])
    backward = jnp.flip(mega.ema_recurrence(jnp.flip(x, 1), alpha[1], delta[1], beta[1], eta[1]), 1)
    # the backward kernel covers the positions strictly after t: the reversed recurrence, shifted by one
    backward = jnp.concatenate([backward[:, 1:], jnp.zeros_like(backward[:, :1])], axis=1)
    tol = reassociation_tol(2 * N, depth=4)
    assert_close(layer.moving_average(x), forward + backward, tol)
    causal = build(bidirectional=False)
    assert_close(causal.moving_average(x), mega.ema_recurrence(
        x, jax.nn.sigmoid(causal.alpha_logit[0]), jax.nn.sigmoid(causal.delta_logit[0]), causal.beta[0],
        causal.eta[0]), tol)


def test_mega_chunk_at_one_chunk_is_full_attention():
    x = noise(1, (2, N, DIM))
    mask = jnp.arange(N)[None, :] < jnp.array([[N - 5], [N]])
    full, one_chunk = build(chunk=0), build(chunk=N)
    assert_close(one_chunk(x, mask, deterministic=True), full(x, mask, deterministic=True), 1e-6)
    several = build(chunk=8)
    assert not np.allclose(several(x, mask, deterministic=True), full(x, mask, deterministic=True))


def test_chunks_are_blocks_of_the_sequence_each_attending_to_its_own_keys():
    layer = build(chunk=8)
    q, k = noise(2, (1, 20, 8)), noise(3, (1, 20, 8))
    mask = jnp.arange(20)[None, :] < 18
    blocks = layer.blocks(mask)
    assert blocks.shape == (1, 3, 8) and not blocks[0, 2, 2:].any()  # 20 positions padded to 3 blocks of 8
    weights = np.asarray(layer.attention_weights(layer.blocks(q), layer.blocks(k), blocks))
    assert weights.shape == (1, 3, 8, 8)  # a query's weights cover its own block only
    assert np.allclose(weights.sum(-1), 1.0, atol=1e-6) and np.all(weights[0, 2, :, 2:] == 0)


def test_bad_settings_are_one_line():
    with pytest.raises(ConfigError, match="needs max_len"):
        registry.build("mega", dim=DIM, num_heads=1, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="chunk >= 0"):
        build(chunk=-1)
    with pytest.raises(ConfigError, match="built for max_len=32"):
        build()(noise(6, (1, 40, DIM)), jnp.ones((1, 40), bool), deterministic=True)
