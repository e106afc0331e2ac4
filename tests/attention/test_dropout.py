"""Counter-based dropout everywhere (lra_jax/attention/dropout.py over lra_jax/kernels/dropout.py).

The kernels' own mask (`keep`, `head_bits`, `apply`) is tested in tests/kernels/test_kernels.py; here:
the generic mask of any shape is that mask on [b, h, q, k], keeps 1 - rate and is independent
across examples, rows, columns and calls; the layer is unbiased, keyed by its rngs, and the XLA
softmax path drops exactly the weights the Triton kernel drops. Every tolerance is a number of
standard errors of a binomial or mean estimate, so it holds on any machine.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra_jax import kernels
from lra_jax.attention import registry
from lra_jax.attention.dropout import Dropout
from lra_jax.kernels import dropout as counter_mask

SEED = np.array([2024], np.uint32)


def agreement(rate: float) -> float:
    """P(two independent keep bits agree) = (1 - r)^2 + r^2."""
    return (1 - rate) ** 2 + rate**2


@pytest.mark.slow
def test_mask_of_any_shape_is_the_kernels_mask_on_attention_weights():
    probs = jnp.asarray(np.random.default_rng(0).random((2, 3, 40, 24)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(counter_mask.drop(probs, SEED, 0.3)),
                                  np.asarray(counter_mask.apply(probs, SEED, 0.3)))
    # Leading axes flatten row-major into heads: [b, c, h, q, k] is [b * c * h, q, k].
    five = np.asarray(counter_mask.keep_like(SEED, (2, 3, 4, 8, 16), 0.3))
    three = np.asarray(counter_mask.keep_like(SEED, (24, 8, 16), 0.3))
    np.testing.assert_array_equal(five.reshape(24, 8, 16), three)
    one = np.asarray(counter_mask.keep_like(SEED, (16,), 0.3))
    np.testing.assert_array_equal(one, np.asarray(counter_mask.keep_like(SEED, (1, 16), 0.3))[0])
    assert np.asarray(counter_mask.keep_like(SEED, (), 0.0)).shape == ()


def test_activation_mask_keeps_one_minus_rate_independently_across_examples_rows_columns():
    rate = 0.1
    kept = np.asarray(counter_mask.keep_like(SEED, (8, 256, 256), rate))  # [b, n, d] activations
    # 524288 draws: the kept fraction's standard error is 0.0004; 0.003 is 7 of them.
    assert abs(kept.mean() - (1 - rate)) < 0.003
    same = agreement(rate)  # 0.82 for independent bits; 1 for a repeated example, row or column
    # Each comparison below has >= 65280 pairs: standard error <= 0.0015; 0.01 is 6.5 of them.
    for a in range(8):
        for b in range(a):
            assert abs((kept[a] == kept[b]).mean() - same) < 0.01, (a, b)
    assert abs((kept[:, 1:] == kept[:, :-1]).mean() - same) < 0.01  # neighbouring positions
    assert abs((kept[:, :, 1:] == kept[:, :, :-1]).mean() - same) < 0.01  # neighbouring features
    assert abs((kept[:, :, :128] == kept[:, :, 128:]).mean() - same) < 0.01  # far features
    # Every example keeps about 1 - rate of its entries (none all-kept or all-dropped).
    per_example = kept.reshape(8, -1).mean(1)
    assert (np.abs(per_example - (1 - rate)) < 0.005).all(), per_example  # 65536 draws: 8.5 standard errors


def test_layer_is_keyed_by_its_rngs_and_draws_a_new_mask_per_call():
    x = jnp.ones((4, 64, 32), jnp.float32)
    layer = Dropout(0.25)
    np.testing.assert_array_equal(np.asarray(layer(x, deterministic=True)), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(Dropout(0.0)(x, deterministic=False)), np.asarray(x))
    draw = lambda rngs: np.asarray(layer(x, deterministic=False, rngs=rngs)) != 0  # noqa: E731
    first = draw(nnx.Rngs(dropout=7))
    np.testing.assert_array_equal(first, draw(nnx.Rngs(dropout=7)))  # same key, same mask (a resumed step)
    np.testing.assert_array_equal(first, draw(nnx.Rngs(7)))  # the default stream where there is no "dropout"
    rngs = nnx.Rngs(dropout=7)
    a, b = draw(rngs), draw(rngs)  # two calls (two layers, or two sites): two masks
    np.testing.assert_array_equal(a, first)
    # 8192 entries: the agreement's standard error is 0.0045; 0.03 is 6.6 of them.
    assert abs((a == b).mean() - agreement(0.25)) < 0.03
    steps = [draw(nnx.Rngs(dropout=jax.random.fold_in(jax.random.key(0), step))) for step in range(3)]
    assert abs((steps[0] == steps[1]).mean() - agreement(0.25)) < 0.03  # the trainer's fold_in(key, step)
    assert abs((steps[1] == steps[2]).mean() - agreement(0.25)) < 0.03
    kept = np.asarray(layer(x, deterministic=False, rngs=nnx.Rngs(dropout=1)))
    assert set(np.unique(kept)) <= {0.0, np.float32(1 / 0.75)}
    with pytest.raises(ValueError, match="needs rngs"):
        layer(x, deterministic=False)
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        Dropout(1.0)


@pytest.mark.slow
def test_layer_is_unbiased_over_keys():
    """E[dropout(x)] = x: the mean over 400 keys is within 5 standard errors of x, entry by entry."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 16)), jnp.float32)
    layer = Dropout(0.5)
    runs = np.asarray(jax.vmap(lambda key: layer(x, deterministic=False, rngs=nnx.Rngs(dropout=key)))(
        jax.random.split(jax.random.key(3), 400)))
    spread = runs.std(0) / np.sqrt(len(runs))
    assert (np.abs(runs.mean(0) - np.asarray(x)) < 5 * spread + 1e-6).mean() > 0.99


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dtype_is_kept(dtype):
    x = jnp.ones((2, 8, 16), dtype)
    assert Dropout(0.1)(x, deterministic=False, rngs=nnx.Rngs(0)).dtype == dtype


def with_random_bilinear(layer):
    """Luong's W_a starts at the identity (softmax's logits): a random one makes the kernel path
    use the transformed keys. Other variants are returned as they are."""
    if hasattr(layer, "bilinear"):
        w = np.random.default_rng(1).standard_normal(layer.bilinear.shape)
        layer.bilinear[...] = jnp.asarray(w / np.sqrt(w.shape[-1]), jnp.float32)
    return layer


@pytest.mark.parametrize("interpret", [True, pytest.param(False, id="compiled", marks=pytest.mark.skipif(
    not kernels.pallas_available(), reason="the compiled Triton kernel needs a GPU"))])
@pytest.mark.parametrize("name", ["softmax", "luong", "synthesizer"])
@pytest.mark.slow
def test_xla_attention_drops_the_weights_the_triton_kernel_drops(name, interpret):
    """Same layer, same rngs: impl="xla" and the Triton flash kernel (interpreted here, compiled on a
    GPU) agree in training, so the two paths draw one mask. A different mask would move outputs by
    O(0.1), not 1e-5. Both at full float32 matmul precision: a GPU's default TF32 differs by ~1e-3."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 40, 32)), jnp.float32)
    mask = jnp.arange(40)[None, :] < jnp.array([[40], [23]])
    with kernels.target_platform("gpu", interpret=interpret), jax.default_matmul_precision("float32"):
        on_kernel = with_random_bilinear(registry.build(name, dim=32, num_heads=2, rngs=nnx.Rngs(0), max_len=40,
                                                        dropout_rate=0.3, impl="pallas"))
        assert on_kernel.kernel_plan(deterministic=False).dropout
        kernel_out = np.asarray(on_kernel(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=5)))
    on_xla = with_random_bilinear(registry.build(name, dim=32, num_heads=2, rngs=nnx.Rngs(0), max_len=40,
                                                 dropout_rate=0.3, impl="xla"))
    with jax.default_matmul_precision("float32"):
        xla_out = np.asarray(on_xla(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=5)))
    evaluation = np.asarray(on_xla(x, mask, deterministic=True))
    assert np.abs(xla_out - evaluation).max() > 0.1  # dropout acted
    np.testing.assert_allclose(xla_out, kernel_out, atol=1e-5)  # float32 online vs direct softmax
