"""The attention contract (the `lra_jax.attention.core` docstring), checked for every registered variant
and every TPU kernel.

A new variant joins this suite by registering; `SETTINGS` may give it small
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

from lra_jax import kernels
from lra_jax.attention import registry

DIM, HEADS, N, EXTRA = 32, 4, 24, 8

# Per-variant settings for the contract checks (defaults otherwise).
SETTINGS = {
    "local": dict(window=3),
    "linformer": dict(k=8),
    "performer": dict(num_features=16),
    "strided": dict(stride=4),
    "longformer": dict(window=3, num_global=2),
    "bigbird": dict(block=4, num_random_blocks=2),
    "reformer": dict(chunk_size=4, num_buckets=2, num_hashes=2),
    "routing": dict(num_clusters=3, window=12),
    "sinkhorn": dict(block=4),
    "nystromformer": dict(num_landmarks=8, conv_kernel=3),
    "taylor": dict(scale=1.0),
    "lightweight_conv": dict(kernel_size=5),
    "dynamic_conv": dict(kernel_size=5),
    "s4d": dict(state_size=8),
}


def variant(name):
    """"local@tpu" -> "local"."""
    return name.split("@")[0]


def build(name, *, dtype=jnp.float32, dropout_rate=0.0, seed=0):
    if "@" in name:  # the variant's kernel for that platform, interpreted
        with kernels.target_platform(name.split("@")[1], interpret=True):
            return registry.build(variant(name), dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), max_len=N + EXTRA,
                                  dropout_rate=dropout_rate, dtype=dtype, impl="pallas",
                                  **SETTINGS.get(variant(name), {}))
    return registry.build(
        name,
        dim=DIM,
        num_heads=HEADS,
        rngs=nnx.Rngs(seed),
        max_len=N + EXTRA,
        dropout_rate=dropout_rate,
        dtype=dtype,
        **SETTINGS.get(name, {}),
    )


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


def real(out, mask):
    return np.asarray(jnp.where(mask[..., None], out, 0.0))


TPU_KERNELS = [f"{name}@tpu" for name in registry.names() if "mosaic" in registry.get(name).kernel_names]


@pytest.fixture(params=registry.names() + TPU_KERNELS)
def name(request):
    return request.param


def test_shape_dtype_and_zero_padding(name):
    x, mask = inputs()
    out = forward(build(name), x, mask)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(np.asarray(out)[~np.asarray(mask)], 0.0)


def test_padding_content_does_not_leak(name):
    x, mask = inputs()
    x_other = jnp.where(mask[..., None], x, noise(7, x.shape, scale=100.0))
    model = build(name)
    out = forward(model, x, mask)
    out_other = forward(model, x_other, mask)
    np.testing.assert_allclose(real(out_other, mask), real(out, mask), atol=1e-5, rtol=1e-4)


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
    np.testing.assert_allclose(real(out_long, mask), real(out, mask), atol=1e-5, rtol=1e-4)


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


def test_jit_matches_eager(name):
    x, mask = inputs()
    model = build(name)
    eager = model(x, mask, deterministic=True)
    jitted = forward(model, x, mask)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), atol=1e-5, rtol=1e-4)


def test_vmap_over_an_extra_batch_axis(name):
    x, mask = inputs()
    model = build(name)
    out = forward(model, x, mask)
    graphdef, state = nnx.split(model)
    mapped = jax.vmap(lambda x, m: nnx.merge(graphdef, state)(x, m, deterministic=True))(x[None], mask[None])
    np.testing.assert_allclose(np.asarray(mapped[0]), np.asarray(out), atol=1e-5, rtol=1e-4)


def test_bfloat16_runs_and_stays_close_to_float32(name):
    x, mask = inputs()
    out32 = forward(build(name), x, mask)
    out16 = forward(build(name, dtype=jnp.bfloat16), x.astype(jnp.bfloat16), mask)
    assert out16.dtype == jnp.bfloat16
    out16 = np.asarray(out16.astype(jnp.float32))
    assert np.isfinite(out16).all()
    scale = np.abs(np.asarray(out32)).max()
    assert np.abs(out16 - np.asarray(out32)).max() < 0.05 * scale + 1e-2


def test_training_mode_uses_the_given_key_and_respects_padding(name):
    if "@" in name:
        pytest.skip("attention dropout is not in the kernels: training mode runs the XLA form, checked above")
    x, mask = inputs()
    model = build(name, dropout_rate=0.3)
    out_a = model(x, mask, deterministic=False, rngs=nnx.Rngs(1))
    x_other = jnp.where(mask[..., None], x, 50.0)
    out_b = model(x_other, mask, deterministic=False, rngs=nnx.Rngs(1))
    assert np.isfinite(np.asarray(out_a)).all()
    np.testing.assert_allclose(real(out_b, mask), real(out_a, mask), atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(out_a)[~np.asarray(mask)], 0.0)


def test_every_setting_is_read_back_from_the_built_layer(name):
    """Run records (results.json, bench JSON) read each setting back from the layer: none may be lost."""
    given = SETTINGS.get(variant(name), {})
    settings = registry.layer_settings(build(name, dtype=jnp.bfloat16))
    assert settings.keys() == {"name", *registry.settings_of(variant(name))}
    assert settings["name"] == variant(name) and settings["dtype"] == "bfloat16" and settings["max_len"] == N + EXTRA
    for key, value in given.items():
        assert settings[key] == value, key
    assert all(value is not None for value in settings.values()), settings
