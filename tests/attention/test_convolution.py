"""Lightweight and dynamic convolutions: a numpy loop reference, weight dropout (cost: tests/attention/test_cost.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, x_and_mask
from lra_jax.attention import registry
from lra_jax.attention.mixing.convolution import shifted_sum

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)
# Gradients chain the backward pass's as many reductions again.
GRAD_TOL = reassociation_tol(40, depth=16)

DIM, HEADS = 16, 4
VARIANTS = ["lightweight_conv", "dynamic_conv"]


def build(name, seed=0, **settings):
    return registry.build(name, dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), **settings)


@nnx.jit
def forward(model, x, mask):
    return model(x, mask, deterministic=True)


@nnx.jit
def train(model, x, mask, key):
    return model(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=key))


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference(model, x, mask):
    """The layer written as plain loops over positions, heads and kernel taps (float64)."""
    def p(param):
        return np.asarray(param[...], np.float64)

    x, mask = np.asarray(x, np.float64), np.asarray(mask)
    b, n, _ = x.shape
    u = x @ p(model.proj_in.kernel) + p(model.proj_in.bias)
    if model.glu:
        u = u[..., :DIM] / (1.0 + np.exp(-u[..., DIM:]))  # GLU: a * sigmoid(gate)
    u = np.where(mask[..., None], u, 0.0)
    k, per_head = model.kernel_size, DIM // HEADS
    out = np.zeros((b, n, DIM))
    for bi in range(b):
        for i in range(n):
            if model.variant_name == "dynamic_conv":
                kernel = softmax((u[bi, i] @ p(model.predict.kernel)).reshape(HEADS, k))
            else:
                kernel = softmax(p(model.kernel))
            for h in range(HEADS):
                channels = slice(h * per_head, (h + 1) * per_head)
                for j in range(k):
                    src = i + j - k // 2  # centred: offsets -(k // 2) .. k - 1 - k // 2
                    if 0 <= src < n:  # beyond either end: zero
                        out[bi, i, channels] += kernel[h, j] * u[bi, src, channels]
    y = out @ p(model.proj_out.kernel) + p(model.proj_out.bias)
    return np.where(mask[..., None], y, 0.0)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("kernel_size, glu", [(5, True), (4, False)])
def test_matches_a_direct_loop_reference_with_ragged_padding(name, kernel_size, glu):
    model = build(name, kernel_size=kernel_size, glu=glu)
    x, mask = map(jnp.asarray, x_and_mask(9, [9, 6, 2], DIM))
    mask = mask.at[0, 4].set(False)  # a hole inside a row too
    out = np.asarray(forward(model, x, mask))
    assert_close(out, reference(model, x, mask), TOL)


def test_dynamic_kernels_vary_with_position_and_lightweight_ones_do_not():
    x, _ = map(jnp.asarray, x_and_mask(6, [6], DIM))
    for name, varies in (("lightweight_conv", False), ("dynamic_conv", True)):
        model = build(name, kernel_size=3)
        u = jax.nn.glu(model.proj_in(x), axis=-1)
        kernel = np.asarray(jnp.broadcast_to(model.kernel_logits(u), (1, 6, HEADS, 3)))
        assert (np.abs(kernel - kernel[:, :1]).max() > 1e-3) == varies, name


def test_shifted_sum_gradients_match_autodiff_of_the_plain_sum():
    """The hand-written backward pass (linear memory) against autodiff of the textbook formula."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 7, 3, 4)), jnp.float32)

    def plain(x, w):
        n, k = x.shape[1], w.shape[-1]
        padded = jnp.pad(x, ((0, 0), (k // 2, k - 1 - k // 2), (0, 0), (0, 0)))
        return sum(w[..., j, None] * padded[:, j : j + n] for j in range(k))

    for shape in [(2, 7, 3, 4), (1, 1, 3, 5)]:  # per-position (dynamic) and broadcast (static) kernels
        w = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        grads = [jax.jit(jax.grad(lambda x, w, f=f: jnp.sum(jnp.sin(f(x, w))), argnums=(0, 1)))(x, w)
                 for f in (shifted_sum, plain)]
        for got, want in zip(*grads):
            assert_close(np.asarray(got), np.asarray(want), GRAD_TOL)


@pytest.mark.parametrize("name", VARIANTS)
def test_weight_dropout_only_in_training_and_keyed_by_the_given_rngs(name):
    x, mask = map(jnp.asarray, x_and_mask(12, [12, 8], DIM))
    model = build(name, kernel_size=5, dropout_rate=0.5)
    a, a_again, b = (np.asarray(train(model, x, mask, jax.random.key(s))) for s in (1, 1, 2))
    evaluation = np.asarray(forward(model, x, mask))
    np.testing.assert_array_equal(a, a_again)  # the key decides
    assert np.abs(a - b).max() > 1e-3
    assert np.abs(a - evaluation).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(forward(model, x, mask)), evaluation)  # evaluation: no dropout
    np.testing.assert_array_equal(a[~np.asarray(mask)], 0.0)


def test_defaults_and_bad_kernel_size():
    for name in VARIANTS:
        settings = registry.settings_of(name)
        assert (settings["kernel_size"], settings["glu"]) == (31, True)
    with pytest.raises(Exception, match="kernel_size"):
        build("dynamic_conv", kernel_size=0)
