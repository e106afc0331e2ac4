"""Routing attention: exact limit, a dense cluster reference, the online k-means state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import assert_close, qkv_and_mask, real, reassociation_tol

from lra_jax.attention import registry
from lra_jax.attention.learned_patterns.clustering import Centroids
from lra_jax.attention.softmax import softmax_attention
from lra_jax.config import task_defaults as base
from lra_jax.config.settings import from_config
from lra_jax.errors import ConfigError
from lra_jax.models.classifier import build_model
from lra_jax.training.steps import make_train_step
from lra_jax.training.train_state import TrainState

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)
# Gradients chain the backward pass's as many reductions again.
GRAD_TOL = reassociation_tol(40, depth=16)

HEADS, HEAD_DIM = 2, 8


def routing(num_clusters, window, decay=0.999, seed=0, **common):
    return registry.build("routing", dim=HEADS * HEAD_DIM, num_heads=HEADS, rngs=nnx.Rngs(seed),
                          num_clusters=num_clusters, window=window, decay=decay, **common)


def jitted_attend(layer, deterministic=True):
    return jax.jit(lambda q, k, v, mask: layer.attend(q, k, v, mask, deterministic=deterministic, rngs=None))


def unit(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def dense_cluster_reference(q, k, v, mask, centroids, window):
    """In float64, loop by loop: cluster c's top-w queries attend (masked softmax) to its top-w keys."""
    b, n, h, d = q.shape
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    mu = unit(centroids.astype(np.float64))
    out = np.zeros((b, n, h, d))
    for i in range(b):
        for j in range(h):
            total, count = np.zeros((n, d)), np.zeros(n)
            q_scores = np.where(mask[i][:, None], unit(q64[i, :, j]) @ mu[j].T, -1e30).T  # [c n]
            k_scores = np.where(mask[i][:, None], unit(k64[i, :, j]) @ mu[j].T, -1e30).T
            for c in range(mu.shape[1]):
                rows = np.argsort(-q_scores[c], kind="stable")[:window]
                cols = np.argsort(-k_scores[c], kind="stable")[:window]
                logits = q64[i, rows, j] @ k64[i, cols, j].T / np.sqrt(d)
                logits = np.where(mask[i, cols][None], logits, -1e300)
                p = np.exp(logits - logits.max(-1, keepdims=True))
                total[rows] += (p / p.sum(-1, keepdims=True)) @ v64[i, cols, j]
                count[rows] += 1
            out[i, :, j] = np.where(count[:, None] > 0, total / np.maximum(count, 1)[:, None], v64[i, :, j])
    return out


def test_one_cluster_holding_every_token_is_softmax_forward_and_gradient(n=9):
    q, k, v, mask = qkv_and_mask(n, [n, n - 4, 1], HEADS, HEAD_DIM)
    layer = routing(1, n)
    assert_close(real(jitted_attend(layer)(q, k, v, mask), mask), real(softmax_attention(q, k, v, mask), mask), TOL)

    def loss(q, k, v, full):
        out = softmax_attention(q, k, v, mask) if full else layer.attend(q, k, v, mask, deterministic=True, rngs=None)
        return jnp.sum(jnp.where(mask[:, :, None, None], out, 0.0) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    for got, want in zip(grad(q, k, v, False), grad(q, k, v, True)):
        assert_close(np.asarray(got), np.asarray(want), GRAD_TOL)


@pytest.mark.parametrize("n, clusters, window", [(12, 3, 4), (13, 2, 5), (10, 4, 4)])
@pytest.mark.slow
def test_small_clusters_match_a_dense_cluster_reference(n, clusters, window):
    q, k, v, mask = qkv_and_mask(n, [n, n - 4, 2], HEADS, HEAD_DIM, seed=n + clusters)
    layer = routing(clusters, window)
    out = real(jitted_attend(layer)(q, k, v, mask), mask)
    want = real(dense_cluster_reference(q, k, v, mask, np.asarray(layer.centroids[...]), window), mask)
    assert_close(out, want, TOL)
    # The clusters do restrict: full attention differs.
    assert np.abs(out - real(softmax_attention(q, k, v, mask), mask)).max() > 1e-2


def numpy_ema(centroids, q, k, mask, decay):
    """The online k-means step in numpy: nearest centroid by cosine, mean of the real members, EMA."""
    mu_hat = unit(centroids.astype(np.float64))
    new = centroids.astype(np.float64).copy()
    for j in range(centroids.shape[0]):
        members = np.concatenate([unit(q[:, :, j][mask]), unit(k[:, :, j][mask])]).astype(np.float64)
        nearest = np.argmax(members @ mu_hat[j].T, axis=-1)
        for c in range(centroids.shape[1]):
            if (nearest == c).any():
                new[j, c] = decay * centroids[j, c] + (1 - decay) * members[nearest == c].mean(0)
    return new


@pytest.mark.slow
def test_training_moves_centroids_by_the_ema_of_real_tokens_only():
    q, k, v, mask = qkv_and_mask(6, [6, 3], HEADS, HEAD_DIM, seed=4)
    layer = routing(3, 2, decay=0.9)
    before = np.asarray(layer.centroids[...])
    assert isinstance(layer.centroids, Centroids) and not isinstance(layer.centroids, nnx.Param)

    jitted_attend(layer, deterministic=True)(q, k, v, mask)
    np.testing.assert_array_equal(np.asarray(layer.centroids[...]), before)  # eval: no update

    @nnx.jit
    def train(layer, q, k, v, mask):
        return layer.attend(q, k, v, mask, deterministic=False, rngs=None)

    train(layer, q, k, v, mask)
    after = np.asarray(layer.centroids[...])
    assert_close(after, numpy_ema(before, q, k, mask, 0.9), TOL)
    # Counting padded tokens would give a different update, so the check above can tell.
    assert np.abs(after - numpy_ema(before, q, k, np.ones_like(mask), 0.9)).max() > 1e-3

    # Padded content changes nothing.
    layer2 = routing(3, 2, decay=0.9)
    junk = np.where(mask[:, :, None, None], q, 100.0).astype(np.float32)
    train(layer2, junk, np.where(mask[:, :, None, None], k, -7.0).astype(np.float32), v, mask)
    assert_close(np.asarray(layer2.centroids[...]), after, TOL)


@pytest.mark.slow
def test_a_trainer_style_jit_step_carries_the_updated_centroids():
    """As steps.make_train_step: split, merge inside jax.jit, split the non-Param state back out."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 10, HEADS * HEAD_DIM)), jnp.float32)
    mask = jnp.arange(10)[None, :] < jnp.array([[10], [6]])
    layer = routing(2, 5, decay=0.5)
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def step(params, rest, x, train):
        model = nnx.merge(graphdef, params, rest)
        out = model(x, mask, deterministic=not train, rngs=nnx.Rngs(0))
        return out, nnx.split(model, nnx.Param, ...)[2]

    step = jax.jit(step, static_argnums=3)
    _, rest_eval = step(params, rest, x, False)
    np.testing.assert_array_equal(np.asarray(rest_eval["centroids"][...]), np.asarray(rest["centroids"][...]))
    _, rest_train = step(params, rest, x, True)
    moved = np.asarray(rest_train["centroids"][...])
    assert np.abs(moved - np.asarray(rest["centroids"][...])).max() > 1e-2
    # The same as updating in place with nnx.jit.
    nnx.jit(lambda m, x: m(x, mask, deterministic=False, rngs=nnx.Rngs(0)))(layer, x)
    assert_close(np.asarray(layer.centroids[...]), moved, TOL)


def small_model(scan_layers):
    config = base.get_config("listops,mini", attention={"name": "routing", "num_clusters": 2, "window": 6})
    config.max_len = 12
    config.model.update(num_layers=2, num_heads=2, emb_dim=16, mlp_dim=32, scan_layers=scan_layers)
    model = build_model(from_config(config), vocab_size=18, num_classes=10, rngs=nnx.Rngs(0))
    tokens = np.random.default_rng(0).integers(1, 18, size=(2, 12)) * (np.arange(12) < 9)
    return model, jnp.asarray(tokens, jnp.int32)


def layer_centroids(model):
    """[layers h c d] centroids of every layer (scanned layers hold them stacked)."""
    blocks = model.encoder.blocks
    if isinstance(blocks, nnx.List):
        return np.stack([np.asarray(block.attention.centroids[...]) for block in blocks])
    return np.asarray(blocks.attention.centroids[...])


@pytest.mark.slow
def test_scanned_encoder_training_step_updates_every_layers_centroids():
    """A jitted value_and_grad step that merges the model (as the trainer does) carries new centroids
    out of the encoder's lax.scan over layers (the Python loop of layers is covered by
    test_the_trainers_step_carries_centroids)."""
    model, tokens = small_model(scan_layers=True)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def train_step(params, rest, tokens):
        def loss(params):
            # copy=True: merging the jit-level `rest` inside grad without it, flax 0.12 refuses to
            # mutate its variables (TraceContextError); see test_the_trainers_step_carries_centroids.
            model = nnx.merge(graphdef, params, rest, copy=True)
            logits = model(tokens, deterministic=False, rngs=nnx.Rngs(1))
            return jnp.sum(logits ** 2), nnx.split(model, nnx.Param, ...)[2]
        return jax.grad(loss, has_aux=True)(params)

    grads, new_rest = train_step(params, rest, tokens)
    before = layer_centroids(model)
    nnx.update(model, new_rest)
    after = layer_centroids(model)
    assert after.shape == (2, 2, 2, 8)  # [layers h c d]
    for layer in range(2):
        assert np.abs(after[layer] - before[layer]).max() > 1e-5  # every layer moved
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


@pytest.mark.slow
def test_the_trainers_step_carries_centroids():
    model, tokens = small_model(scan_layers=False)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.sgd(0.01)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rest=rest, opt_state=tx.init(params))
    before = layer_centroids(model)
    step = make_train_step(graphdef, tx, jax.random.key(0))
    state, _ = step(state, {"inputs": tokens, "label": jnp.array([1, 2], jnp.int32)})
    nnx.update(model, state.rest)
    assert np.abs(layer_centroids(model) - before).max() > 1e-5


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="num_clusters"):
        routing(0, 4)
    with pytest.raises(ConfigError, match="decay"):
        routing(2, 4, decay=1.5)
    with pytest.raises(ConfigError, match="max_len"):
        registry.build("routing", dim=16, num_heads=2, rngs=nnx.Rngs(0))
    assert routing(4, None, max_len=30).window == 8  # ceil(30 / 4)
