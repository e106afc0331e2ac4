"""The attention contract (the `lra_jax.attention.core` docstring), checked for every registered variant
and every TPU kernel.

A new variant joins this suite by registering; `helpers.SMALL` may give it small
settings so that the checks exercise its approximation (a window smaller than n,
fewer features than n) rather than a degenerate limit. A variant with a TPU
kernel also runs every check as "<name>@tpu": built for a TPU target with
impl="pallas", its kernel (jax's splash attention) runs in the Pallas interpreter.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import REPRESENTATIVE, SMALL, assert_close, build_small, real, reassociation_tol, slow_except
from lra_jax import kernels
from lra_jax.attention import registry
from lra_jax.errors import ConfigError

DIM, HEADS, N, EXTRA = 32, 4, 24, 8
# Two float32 runs of one layer that may sum in another order (padding changed, jit vs eager,
# vmap, a longer array): sums of at most N + EXTRA = DIM = 32 terms, chained through up to 8
# reductions (projections, scores, normaliser, weighted sum, a few Sinkhorn or pinv steps).
# 3e-5 of the output scale; leaked padding (noise x100) or a dropped row moves outputs by O(1).
TOL = reassociation_tol(N + EXTRA, depth=8)

def variant(name):
    """"local@tpu" -> "local"."""
    return name.split("@")[0]


def build(name, *, dtype=jnp.float32, dropout_rate=0.0, seed=0):
    if "@" in name:  # the variant's kernel for that platform, interpreted
        with kernels.target_platform(name.split("@")[1], interpret=True):
            return build_small(variant(name), dim=DIM, num_heads=HEADS, seed=seed, max_len=N + EXTRA,
                               dropout_rate=dropout_rate, dtype=dtype, impl="pallas")
    return build_small(name, dim=DIM, num_heads=HEADS, seed=seed, max_len=N + EXTRA, dropout_rate=dropout_rate,
                       dtype=dtype)


def noise(seed, shape, scale=1.0):
    """Gaussian test data from numpy (jax.random would compile anew for every shape)."""
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def inputs(seed=0, n=N):
    """Three rows: ragged padding, no padding, mostly padding; padded positions hold noise."""
    x = noise(seed, (3, n, DIM))
    lengths = jnp.array([n - 7, n, 5])
    mask = jnp.arange(n)[None, :] < lengths[:, None]
    return x, mask


@nnx.jit
def forward(model, x, mask):
    """The deterministic forward pass, compiled once per variant and shape (eager runs op by op)."""
    return model(x, mask, deterministic=True)


TPU_KERNELS = [f"{name}@tpu" for name in registry.names() if "mosaic" in registry.get(name).kernel_backends()]
# The fast tier (`pytest -m "not slow"`) checks the contract on one variant of each kind
# (`helpers.REPRESENTATIVE`); the full suite on them all.
every_variant = pytest.mark.every_variant("name")


@pytest.fixture(params=slow_except(registry.names() + TPU_KERNELS, keep=set(REPRESENTATIVE)))
def name(request):
    return request.param


@every_variant
def test_shape_dtype_and_zero_padding(name):
    x, mask = inputs()
    out = forward(build(name), x, mask)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(np.asarray(out)[~np.asarray(mask)], 0.0)


@every_variant
def test_padding_content_does_not_leak(name):
    x, mask = inputs()
    x_other = jnp.where(mask[..., None], x, noise(7, x.shape, scale=100.0))
    model = build(name)
    out = forward(model, x, mask)
    out_other = forward(model, x_other, mask)
    assert_close(real(out_other, mask), real(out, mask), TOL)


@every_variant
def test_appended_padding_does_not_change_real_outputs(name):
    if not registry.get(variant(name)).length_invariant:
        pytest.skip(f"{name} depends on the padded length by construction (see its docstring)")
    x, mask = inputs()
    model = build(name)
    out = forward(model, x, mask)
    tail = noise(3, (x.shape[0], EXTRA, DIM))
    x_long = jnp.concatenate([x, tail], axis=1)
    mask_long = jnp.concatenate([mask, jnp.zeros((x.shape[0], EXTRA), bool)], axis=1)
    out_long = forward(model, x_long, mask_long)[:, :N]
    assert_close(real(out_long, mask), real(out, mask), TOL)


def test_all_padding_row_is_finite_with_finite_gradients(name):
    x, mask = inputs()
    mask = mask.at[0].set(False)
    model = build(name)
    out = forward(model, x, mask)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(np.asarray(out[0]), 0.0)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x, mask, deterministic=True) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    for leaf in jax.tree.leaves(grads):
        assert np.isfinite(np.asarray(leaf)).all()
    assert any(np.abs(np.asarray(leaf)).sum() > 0 for leaf in jax.tree.leaves(grads[0]))


@every_variant
def test_jit_matches_eager(name):
    x, mask = inputs()
    model = build(name)
    eager = model(x, mask, deterministic=True)
    jitted = forward(model, x, mask)
    assert_close(np.asarray(jitted), np.asarray(eager), TOL)


@every_variant
def test_vmap_over_an_extra_batch_axis(name):
    x, mask = inputs()
    model = build(name)
    out = forward(model, x, mask)
    graphdef, state = nnx.split(model)
    mapped = jax.vmap(lambda x, m: nnx.merge(graphdef, state)(x, m, deterministic=True))(x[None], mask[None])
    assert_close(np.asarray(mapped[0]), np.asarray(out), TOL)


@every_variant
def test_bfloat16_runs_and_stays_close_to_float32(name):
    x, mask = inputs()
    out32 = np.asarray(forward(build(name), x, mask))
    out16 = forward(build(name, dtype=jnp.bfloat16), x.astype(jnp.bfloat16), mask)
    assert out16.dtype == jnp.bfloat16
    out16 = np.asarray(out16.astype(jnp.float32))
    assert np.isfinite(out16).all()
    # bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4%); the projections, scores,
    # softmax and weighted sums of one layer compound it to a few steps. 5% of the output scale
    # (~13 steps) passes a sound bfloat16 path and fails a lost scale, an overflow or a float32
    # mask value cast to -inf.
    token_error = np.abs(out16 - out32).max(axis=-1)[np.asarray(mask)]
    far = token_error > 0.05 * np.abs(out32).max()
    if registry.get(variant(name)).data_dependent_pattern:
        # A rounding can move a token to another hash bucket or cluster, which changes its output
        # entirely and, by shifting the sorted chunks, its neighbours' too (8 of 46 tokens here;
        # which ones depends on the seed). A systematic error moves every token: most must agree.
        assert far.mean() < 0.5, (far.sum(), far.size, token_error.max())
    else:
        assert not far.any(), (far.sum(), token_error.max())


@every_variant
def test_training_mode_uses_the_given_key_and_respects_padding(name):
    op = registry.get(variant(name)).kernel_op
    if "@" in name and not any(kernel.dropout for kernel in op.kernels("mosaic")):
        pytest.skip("no TPU kernel of this op has dropout: training mode on TPU runs the XLA form, checked above")
    x, mask = inputs()
    model = build(name, dropout_rate=0.3)
    if "@" in name:  # trains on our Mosaic kernel with its dropout (kernels/flash/pallas_mosaic.py)
        plan = model.kernel_plan(deterministic=False)
        assert plan.uses_pallas and plan.implementation.backend == "mosaic" and plan.implementation.dropout, plan
    out_a = model(x, mask, deterministic=False, rngs=nnx.Rngs(1))
    x_other = jnp.where(mask[..., None], x, 50.0)
    out_b = model(x_other, mask, deterministic=False, rngs=nnx.Rngs(1))
    assert np.isfinite(np.asarray(out_a)).all()
    assert_close(real(out_b, mask), real(out_a, mask), TOL)
    np.testing.assert_array_equal(np.asarray(out_a)[~np.asarray(mask)], 0.0)


def test_every_variant_refuses_a_dropout_rate_outside_zero_to_one():
    """One message for all, those without attention weights to drop (FNet, GLA, S6, ...) included."""
    for name in registry.names():
        for rate in (-0.1, 1.0):
            with pytest.raises(ConfigError, match=rf"attention dropout_rate must be in \[0, 1\), got {rate}"):
                build(name, dropout_rate=rate)


@every_variant
def test_every_setting_is_read_back_from_the_built_layer(name):
    """Run records (results.json, bench JSON) read each setting back from the layer: none may be lost."""
    given = SMALL.get(variant(name), {})
    settings = registry.layer_settings(build(name, dtype=jnp.bfloat16))
    assert settings.keys() == {"name", *registry.settings_of(variant(name))}
    assert settings["name"] == variant(name) and settings["dtype"] == "bfloat16" and settings["max_len"] == N + EXTRA
    for key, value in given.items():
        assert settings[key] == value, key
    assert all(value is not None for value in settings.values()), settings
