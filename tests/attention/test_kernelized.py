"""Performer (FAVOR+) and Linear Transformer: the math beyond the shared contract suite."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, qkv_and_mask, reassociation_tol
from lra_jax.attention import registry
from lra_jax.attention.kernelized.feature_maps import (
    RandomFeatures,
    favor_attention,
    favor_log_features,
    linear_attention,
    orthogonal_random_features,
    taylor_attention,
)
from lra_jax.attention.softmax import softmax_attention
from lra_jax.errors import ConfigError

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)
# Gradients chain the backward pass's as many reductions again.
GRAD_TOL = reassociation_tol(40, depth=16)

B, N, H, D = 2, 32, 2, 16


def normal(seed, shape):
    """Standard normal draws; drawn flat because XLA:CPU compiles high-rank draws slowly."""
    return jax.random.normal(jax.random.key(seed), (int(np.prod(shape)),)).reshape(shape)


def qkv(seed=0, scale=0.5):
    """Small-logit queries/keys (scaled by `scale`), unit values, ragged padding (row 0 has 9 pads)."""
    q, k, v = normal(seed, (3, B, N, H, D))
    q, k = scale * q, scale * k
    mask = jnp.arange(N)[None, :] < jnp.array([N - 9, N])[:, None]
    return q, k, v, mask


def mean_abs_error_on_real(out, ref, mask):
    diff = np.abs(np.asarray(out) - np.asarray(ref))
    return float(diff[np.asarray(mask)].mean())


# ----------------------------------------------------------------------------- Performer


def test_performer_approaches_softmax_as_features_grow():
    q, k, v, mask = qkv()
    ref = softmax_attention(q, k, v, mask)
    attend = jax.jit(favor_attention)
    # Blocks of W are independent, so the first m rows of a 4096-row W are a valid m-feature W.
    draws = [orthogonal_random_features(jax.random.key(100 + s), 4096, D) for s in range(4)]
    errors = {
        m: np.mean([mean_abs_error_on_real(attend(q, k, v, mask, w[:m]), ref, mask) for w in draws])
        for m in (16, 256, 4096)
    }
    # Measured (jax 0.10.2, CPU): {16: 0.073, 256: 0.020, 4096: 0.0057}, about 1/sqrt(m);
    # for scale, the mean |softmax output| at real positions is 0.146.
    assert errors[16] > errors[256] > errors[4096], errors
    assert errors[4096] < 0.012, errors
    assert errors[16] > 2 * errors[4096], errors


@pytest.mark.slow
def test_positive_random_features_are_unbiased_for_the_softmax_kernel():
    d, m, draws = D, 64, 1000
    q, k = 0.5 * normal(1, (2, 1, 4, 1, d))

    def estimate(key):  # phi(q_i) . phi(k_j) for one draw of W, no stabilisers
        w = orthogonal_random_features(key, m, d)
        phi_q = jnp.exp(favor_log_features(q, w)) / jnp.sqrt(m)
        phi_k = jnp.exp(favor_log_features(k, w)) / jnp.sqrt(m)
        return jnp.einsum("bihm,bjhm->ij", phi_q, phi_k)

    keys = jax.random.split(jax.random.key(2), draws)
    mean = jax.jit(lambda keys: jax.lax.map(estimate, keys))(keys).mean(axis=0)
    exact = jnp.exp(jnp.einsum("bihd,bjhd->ij", q, k) / jnp.sqrt(d))
    # Measured max relative deviation: 0.013 (1000 draws x 64 features); rows all of norm
    # sqrt(d) instead of chi_d norms would be biased: 0.11.
    np.testing.assert_allclose(np.asarray(mean), np.asarray(exact), rtol=0.05)


@pytest.mark.slow
def test_random_feature_rows_are_orthogonal_within_each_block():
    d, m = D, 40  # blocks of 16, 16 and a truncated block of 8 rows
    w = np.asarray(orthogonal_random_features(jax.random.key(3), m, d), np.float64)
    assert w.shape == (m, d)
    norms = np.linalg.norm(w, axis=1)
    unit = w / norms[:, None]
    for start in range(0, m, d):
        block = unit[start : start + d]
        # Rows of a float32 QR are orthogonal to float32 round-off (sums of d terms); unrelated rows are ~0.3.
        np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=reassociation_tol(d, depth=8))
    # Different blocks are independent draws, not orthogonal to one another.
    assert np.abs(unit[:d] @ unit[d : 2 * d].T).max() > 0.3
    # Row norms are chi_d distributed (not all sqrt(d)): E|w|^2 = d.
    assert norms.std() > 0.1
    big = np.asarray(orthogonal_random_features(jax.random.key(4), 64 * d, d))
    # The mean of 1024 chi^2_d draws has a standard error of sqrt(2d / 1024) = 1.1% of d: 5% is 4.5 of them.
    np.testing.assert_allclose((big**2).sum(axis=1).mean(), d, rtol=0.05)


@pytest.mark.slow
def test_extreme_padded_keys_do_not_disturb_performer():
    q, k, v, mask = qkv()
    w = orthogonal_random_features(jax.random.key(5), 64, D)
    pads = ~mask[:, :, None, None]
    k_wild = jnp.where(pads, 1e3 * normal(6, k.shape), k)
    v_wild = jnp.where(pads, 1e3, v)
    attend = jax.jit(favor_attention)
    out = attend(q, k, v, mask, w)
    out_wild = attend(q, k_wild, v_wild, mask, w)
    real = np.asarray(mask)
    assert_close(np.asarray(out_wild)[real], np.asarray(out)[real], TOL)

    def loss(q, k, v):
        return jnp.sum(jnp.where(mask[:, :, None, None], favor_attention(q, k, v, mask, w), 0.0) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k_wild, v_wild)
    for g in grads:
        assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_array_equal(np.asarray(grads[1])[~real], 0.0)  # padded keys get no gradient


@pytest.mark.slow
def test_performer_stabilisers_cancel_in_values_and_gradients():
    """favor_attention == the unstabilised estimate, written densely (n x n) here, with its gradients."""
    q, k, v, mask = qkv(seed=2)
    w = orthogonal_random_features(jax.random.key(7), 64, D)

    def dense(q, k, v):
        phi_q = jnp.exp(favor_log_features(q, w))
        phi_k = jnp.exp(favor_log_features(k, w))
        scores = jnp.einsum("bqhm,bkhm->bhqk", phi_q, phi_k)
        scores = jnp.where(mask[:, None, None, :], scores, 0.0)
        return jnp.einsum("bhqk,bkhd->bqhd", scores / scores.sum(axis=-1, keepdims=True), v)

    def on_real(fn):
        return lambda q, k, v: jnp.sum(jnp.where(mask[:, :, None, None], fn(q, k, v), 0.0) ** 2)

    fast = lambda q, k, v: favor_attention(q, k, v, mask, w)  # noqa: E731
    assert_close(np.asarray(fast(q, k, v)), np.asarray(dense(q, k, v)), TOL)
    g_fast = jax.jit(jax.grad(on_real(fast), argnums=(0, 1, 2)))(q, k, v)
    g_dense = jax.jit(jax.grad(on_real(dense), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g_fast, g_dense):
        assert_close(np.asarray(a), np.asarray(b), GRAD_TOL)


def favor_estimator_float64(q, k, v, mask, w):
    """The FAVOR+ estimator phi(q_i).sum_j phi(k_j) v_j / phi(q_i).sum_j phi(k_j) over real keys,
    from the same features w, in float64 and log space (exact at any norm). Also returns the
    largest |log-feature|, which sets the float32 round-off of the exponents."""
    q, k, v, w = (np.asarray(t, np.float64) for t in (q, k, v, w))

    def log_features(x):
        x = x * x.shape[-1] ** -0.25
        return np.einsum("bnhd,md->bnhm", x, w) - 0.5 * np.sum(x * x, axis=-1, keepdims=True)

    a, b = log_features(q), log_features(k)
    pair = a[:, :, None] + b[:, None, :]  # log(phi_r(q_i) phi_r(k_j)): [b q k h m]
    top = pair.max(axis=-1)
    log_weight = top + np.log(np.exp(pair - top[..., None]).sum(axis=-1))  # [b q k h]
    log_weight = np.where(np.asarray(mask)[:, None, :, None], log_weight, -np.inf)
    weight = np.exp(log_weight - log_weight.max(axis=2, keepdims=True))
    weight /= weight.sum(axis=2, keepdims=True)
    return np.einsum("bqkh,bkhd->bqhd", weight, v), max(np.abs(a).max(), np.abs(b).max())


@pytest.mark.parametrize("std", [0.5, 2.0, 8.0])
@pytest.mark.slow
def test_performer_is_the_favor_estimator_at_any_norm(std):
    """No bias as |q|, |k| grow: the only error is float32 round-off of the exponents, which is
    eps32 x |log-feature| relative (measured: 0.06-0.14 of that bound at std 0.5-16; an epsilon
    added to the normaliser gave errors of 0.2 at std 2)."""
    n = 50
    q, k, v = normal(11, (3, B, n, H, D))
    q, k, v = std * q, std * k, 2.0 * v
    mask = jnp.arange(n)[None, :] < jnp.array([n - 9, n])[:, None]
    w = orthogonal_random_features(jax.random.key(12), 64, D)
    out = np.asarray(jax.jit(favor_attention)(q, k, v, mask, w))
    exact, log_magnitude = favor_estimator_float64(q, k, v, mask, w)
    real = np.asarray(mask)
    bound = 4 * np.finfo(np.float32).eps * log_magnitude * np.abs(np.asarray(v)).max()
    assert np.abs(out - exact)[real].max() < bound

    no_keys = jnp.zeros_like(mask)
    empty = np.asarray(jax.jit(favor_attention)(q, k, v, no_keys, w))
    np.testing.assert_array_equal(empty, 0.0)


def build_performer(seed=0, **settings):
    return registry.build("performer", dim=32, num_heads=4, rngs=nnx.Rngs(seed), num_features=16, **settings)


def test_performer_features_are_non_trainable_state_from_the_init_key():
    model = build_performer(seed=0)
    assert registry.settings_of("performer")["num_features"] == 256
    assert registry.settings_of("performer")["redraw"] is False
    assert isinstance(model.features, RandomFeatures) and not isinstance(model.features, nnx.Param)
    assert model.features[...].shape == (16, 8)
    assert jax.tree.leaves(nnx.state(model, RandomFeatures))
    param_shapes = [leaf.shape for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))]
    assert (16, 8) not in param_shapes
    same = build_performer(seed=0).features[...]
    other = build_performer(seed=1).features[...]
    np.testing.assert_array_equal(np.asarray(same), np.asarray(model.features[...]))
    assert np.abs(np.asarray(other) - np.asarray(same)).max() > 0.1


@pytest.mark.slow
def test_redraw_draws_fresh_features_in_training_only():
    x = normal(0, (2, 12, 32))
    mask = jnp.arange(12)[None, :] < jnp.array([9, 12])[:, None]
    model = build_performer(redraw=True)
    train_a = model(x, mask, deterministic=False, rngs=nnx.Rngs(1))
    train_a_again = model(x, mask, deterministic=False, rngs=nnx.Rngs(1))
    train_b = model(x, mask, deterministic=False, rngs=nnx.Rngs(2))
    stored = np.asarray(model.features[...])
    eval_1 = model(x, mask, deterministic=True)
    eval_2 = model(x, mask, deterministic=True)

    assert np.abs(np.asarray(train_a) - np.asarray(train_b)).max() > 1e-4
    np.testing.assert_array_equal(np.asarray(train_a), np.asarray(train_a_again))  # the key decides
    np.testing.assert_array_equal(np.asarray(eval_1), np.asarray(eval_2))
    np.testing.assert_array_equal(np.asarray(model.features[...]), stored)  # training left W alone
    assert np.abs(np.asarray(eval_1) - np.asarray(train_a)).max() > 1e-4
    # Evaluation uses the stored W: the same as the same model built without redraw.
    fixed = build_performer(redraw=False)
    assert_close(np.asarray(fixed(x, mask, deterministic=True)), np.asarray(eval_1), TOL)
    assert_close(np.asarray(fixed(x, mask, deterministic=False, rngs=nnx.Rngs(1))), np.asarray(eval_1), TOL)
    with pytest.raises(ValueError, match="rngs"):
        model(x, mask, deterministic=False)


# ----------------------------------------------------------------------- Linear Transformer


@pytest.mark.slow
def test_linear_attention_equals_a_dense_reference():
    q, k, v, mask = qkv(seed=4, scale=1.0)
    mask = mask.at[1, 20:].set(False).at[1, 3].set(False)  # a hole inside a row too

    phi = lambda x: jnp.where(x > 0, x + 1.0, jnp.exp(x))  # elu(x) + 1  # noqa: E731
    scores = jnp.einsum("bqhd,bkhd->bhqk", phi(q), phi(k))  # n x n, fine in a test
    scores = jnp.where(mask[:, None, None, :], scores, 0.0)
    weights = scores / scores.sum(axis=-1, keepdims=True)
    dense = jnp.einsum("bhqk,bkhd->bqhd", weights, v)

    out = linear_attention(q, k, v, mask)
    assert_close(np.asarray(out), np.asarray(dense), TOL)
    # Not softmax attention: the reference is not trivially something else.
    assert np.abs(np.asarray(out) - np.asarray(softmax_attention(q, k, v, mask))).max() > 1e-2


# ----------------------------------------------------------------------------------- Taylor


def dense_taylor(q, k, v, mask, scale):
    """The quadratic form: weights (1 + scale q^.k^) over the real keys, normalised per query."""
    q, k = (np.asarray(x) / np.linalg.norm(np.asarray(x), axis=-1, keepdims=True) for x in (q, k))
    sim = 1.0 + scale * np.einsum("bqhd,bkhd->bhqk", q, k)
    sim = np.where(np.asarray(mask)[:, None, None, :], sim, 0.0)
    return np.einsum("bhqk,bkhd->bqhd", sim / sim.sum(-1, keepdims=True), np.asarray(v))


@pytest.mark.parametrize("scale", [1.0, 0.3])
@pytest.mark.slow
def test_taylor_equals_its_dense_quadratic_form(scale):
    q, k, v, mask = map(jnp.asarray, qkv_and_mask(N, [N - 9, N], H, D, seed=8))
    mask = mask.at[1, 5].set(False)  # a hole inside a row too
    out = jax.jit(lambda q, k, v, m: taylor_attention(q, k, v, m, scale=scale))(q, k, v, mask)
    real = np.asarray(mask)
    assert_close(np.asarray(out)[real], dense_taylor(q, k, v, mask, scale)[real], TOL)
    # Padded keys are excluded: wild padded content changes nothing.
    pads = ~mask[:, :, None, None]
    out_wild = taylor_attention(jnp.where(pads, 1e3, q), jnp.where(pads, -1e3, k), jnp.where(pads, 1e3, v), mask,
                                scale=scale)
    assert_close(np.asarray(out_wild)[real], np.asarray(out)[real], TOL)


def test_taylor_approaches_softmax_as_logits_shrink_with_error_of_order_eps_squared():
    """softmax(eps q^.k^) vs normalised (1 + eps q^.k^): they differ by O(eps^2)."""
    q, k, v, mask = map(jnp.asarray, qkv_and_mask(N, [N - 9, N], H, D, seed=9))
    q_unit, k_unit = (x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    d = q.shape[-1]

    @jax.jit
    def error(eps):
        # softmax_attention divides the logits by sqrt(d): scale q^ by eps sqrt(d) to get eps q^.k^.
        ref = softmax_attention(eps * jnp.sqrt(d) * q_unit, k_unit, v, mask)
        return jnp.max(jnp.where(mask[:, :, None, None], jnp.abs(taylor_attention(q, k, v, mask, scale=eps) - ref), 0))

    errors = {eps: float(error(eps)) for eps in (0.4, 0.2, 0.1, 0.05)}
    # Measured max error on real positions (jax 0.10.2, CPU): {0.4: 5.1e-3, 0.2: 1.3e-3, 0.1: 3.2e-4,
    # 0.05: 8.1e-5}: each halving of eps divides the error by 3.95-4.0 (second order).
    for big, small in ((0.4, 0.2), (0.2, 0.1), (0.1, 0.05)):
        assert 3.0 < errors[big] / errors[small] < 5.0, errors
    assert errors[0.05] < 2e-4, errors


def test_taylor_all_padding_row_is_zero_and_bad_scale_is_a_config_error():
    q, k, v, mask = map(jnp.asarray, qkv_and_mask(N, [N - 9, N], H, D, seed=10))
    mask = mask.at[0].set(False)
    out = np.asarray(jax.jit(taylor_attention)(q, k, v, mask))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0], 0.0)
    assert registry.settings_of("taylor")["scale"] == 1.0
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match="scale"):
            registry.build("taylor", dim=32, num_heads=4, rngs=nnx.Rngs(0), scale=bad)
