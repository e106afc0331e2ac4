"""Synthesizer (dense, random, factorized random, mixed) against references written here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, slow_except, x_and_mask
from lra_jax import kernels
from lra_jax.attention import registry
from lra_jax.attention.synthesized.synthesizer import FixedRandom
from lra_jax.errors import ConfigError

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)

DIM, HEADS, MAX_LEN = 16, 2, 20
HEAD_DIM = DIM // HEADS
MODES = ["dense", "random", "factorized_random"]


def build(seed=0, name="synthesizer", **settings):
    return registry.build(name, dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), max_len=MAX_LEN, **settings)


def apply(model, x, mask):
    return np.asarray(jax.jit(lambda x, mask: model(x, mask, deterministic=True))(x, mask))


def linear(layer, x):
    return x @ np.asarray(layer.kernel[...], np.float64) + np.asarray(layer.bias[...], np.float64)


def heads(x):
    return x.reshape(*x.shape[:2], HEADS, HEAD_DIM)


def reference(layer, x, mask, mode, mix=0.0):
    """Synthetic logits written out per mode, padded keys excluded, float64."""
    x = x.astype(np.float64)
    n = x.shape[1]
    if mode == "dense":
        hidden = np.maximum(heads(linear(layer.dense_in, x)), 0.0)
        w2, b2 = np.asarray(layer.dense_out[...], np.float64), np.asarray(layer.dense_bias[...], np.float64)
        logits = np.einsum("bnhd,hdm->bhnm", hidden, w2[:, :, :n]) + b2[None, :, None, :n]
    elif mode == "random":
        logits = np.broadcast_to(np.asarray(layer.random[...], np.float64)[None, :, :n, :n], (x.shape[0], HEADS, n, n))
    else:
        r1, r2 = np.asarray(layer.factor_a[...], np.float64), np.asarray(layer.factor_b[...], np.float64)
        logits = np.broadcast_to((r1[:, :n] @ r2[:, :n].transpose(0, 2, 1))[None], (x.shape[0], HEADS, n, n))
    if mix:
        q, k = heads(linear(layer.query, x)), heads(linear(layer.key, x))
        logits = logits + mix * np.einsum("bnhd,bmhd->bhnm", q, k) / np.sqrt(HEAD_DIM)
    logits = np.where(mask[:, None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    out = np.einsum("bhnm,bmhd->bnhd", w, heads(linear(layer.value, x))).reshape(x.shape)
    return np.where(mask[..., None], linear(layer.out, out), 0.0)


@pytest.mark.parametrize("mix", [0.0, 0.5])
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_equals_reference_with_padding(mode, mix):
    layer = build(mode=mode, mix=mix)
    if mode == "dense":  # non-zero b2 exercises its slicing
        layer.dense_bias[...] = np.random.default_rng(5).standard_normal((HEADS, MAX_LEN)).astype(np.float32)
    n = 12
    x, mask = x_and_mask(n, [n, 7, 1], DIM)
    assert_close(apply(layer, x, mask), reference(layer, x, mask, mode, mix), TOL)


@pytest.mark.parametrize("mode", slow_except(MODES, keep={"dense"}))
def test_padded_content_and_appended_padding_change_nothing(mode):
    layer = build(mode=mode)
    x, mask = x_and_mask(10, [10, 6, 2], DIM)
    out = apply(layer, x, mask)
    assert_close(apply(layer, np.where(mask[..., None], x, 100.0), mask), out, TOL)
    x_long = np.concatenate([x, np.full((3, 6, DIM), 3.0, np.float32)], axis=1)
    mask_long = np.concatenate([mask, np.zeros((3, 6), bool)], axis=1)
    assert_close(apply(layer, x_long, mask_long)[:, :10], out, TOL)


@pytest.mark.parametrize("mode", slow_except(MODES, keep={"dense"}))
def test_mixed_with_zero_synthetic_logits_is_softmax_attention(mode):
    layer, softmax = build(seed=4, mode=mode, mix=1.0), build(seed=4, name="softmax")
    for p in (layer.dense_out, layer.dense_bias, layer.random, layer.factor_a):
        if p is not None:
            p[...] = np.zeros_like(np.asarray(p[...]))
    x, mask = x_and_mask(9, [9, 4], DIM)
    assert_close(apply(layer, x, mask), apply(softmax, x, mask), TOL)
    assert np.abs(apply(build(seed=4, mode=mode), x, mask) - apply(softmax, x, mask)).max() > 1e-3


def loss_and_grads(layer, x, mask, dropout_seed):
    """sum(out * w) of a training call (dropout on) and its gradient in every parameter."""
    w = np.random.default_rng(9).standard_normal(x.shape).astype(np.float32)
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def loss(params):
        layer = nnx.merge(graphdef, params, rest)
        return jnp.sum(layer(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=dropout_seed)) * w)

    value, grads = jax.value_and_grad(loss)(params)
    return float(value), jax.tree.leaves(grads)


@pytest.mark.parametrize("platform, interpret", [
    pytest.param("gpu", True, id="gpu"), pytest.param("tpu", True, id="tpu"),
    pytest.param("gpu", False, id="gpu-compiled", marks=pytest.mark.skipif(
        not kernels.pallas_available(), reason="the compiled Triton kernel needs a GPU"))])
@pytest.mark.parametrize("mix", [0.0, 0.5])
@pytest.mark.parametrize("mode", ["dense", "factorized_random"])
@pytest.mark.slow
def test_kernels_compute_the_xla_layer_with_its_dropout(mode, mix, platform, interpret):
    """The flash kernels over queries a and keys c (module docstring) give the XLA layer's loss and
    gradients in training, so they also drop the same weights; Triton (gpu: interpreted here, compiled
    on a GPU), and on tpu our Mosaic kernel (dropout on), interpreted. A wrong logit term or mask moves
    the loss by O(0.1). Full float32 matmul precision: a GPU's default TF32 differs by ~1e-3."""
    x, mask = x_and_mask(MAX_LEN, [MAX_LEN, 11, 1], DIM)
    settings = dict(mode=mode, mix=mix, dropout_rate=0.3)
    with kernels.target_platform(platform, interpret=interpret):
        on_kernel = build(seed=3, impl="pallas", **settings)
        assert on_kernel.kernel_plan(deterministic=False).dropout
        on_xla = build(seed=3, impl="xla", **settings)
    for layer in (on_kernel, on_xla):  # non-zero b2: its column of c is exercised
        if mode == "dense":
            layer.dense_bias[...] = np.random.default_rng(5).standard_normal((HEADS, MAX_LEN)).astype(np.float32)
    with jax.default_matmul_precision("float32"):
        with kernels.target_platform(platform, interpret=interpret):
            kernel_loss, kernel_grads = loss_and_grads(on_kernel, x, mask, 2)
        xla_loss, xla_grads = loss_and_grads(on_xla, x, mask, 2)
    evaluation = float(np.sum(apply(on_xla, x, mask) * np.random.default_rng(9).standard_normal(x.shape)))
    assert abs(xla_loss - evaluation) > 0.1  # dropout acted
    assert_close(kernel_loss, xla_loss, TOL)
    assert len(kernel_grads) == len(xla_grads)
    flat = lambda leaves: np.concatenate([np.ravel(leaf) for leaf in leaves])  # noqa: E731  one scale: some are ~0
    assert_close(flat(kernel_grads), flat(xla_grads), TOL)


def test_random_mode_runs_xla_where_kernels_run():
    with kernels.target_platform("gpu", interpret=True):
        plan = build(mode="random", impl="auto").kernel_plan(deterministic=True)
    assert plan.kernel == kernels.XLA and "random" in plan.reason


def test_pure_synthesizer_has_no_query_key_projections():
    assert build(mix=0.0).query is None and build(mix=0.0).key is None
    assert build(mix=0.5).query is not None


def test_factorized_random_is_a_rank_k_product():
    layer = build(mode="factorized_random", factor=3)
    assert layer.factor_a[...].shape == layer.factor_b[...].shape == (HEADS, MAX_LEN, 3)
    x = np.zeros((1, 7, DIM), np.float32)
    r = np.asarray(layer.synthetic_logits(x))
    assert r.shape == (HEADS, 7, 7)
    want = np.einsum("hnk,hmk->hnm", np.asarray(layer.factor_a[...])[:, :7], np.asarray(layer.factor_b[...])[:, :7])
    assert_close(r, want, TOL)
    assert all(np.linalg.matrix_rank(r[h]) == 3 for h in range(HEADS))


@pytest.mark.parametrize("mode", ["random", "factorized_random"])
def test_random_matrices_are_state_but_not_params_when_fixed(mode):
    trained = build(mode=mode)
    fixed = build(mode=mode, random_trainable=False)
    name = "random" if mode == "random" else "factor_a"
    assert isinstance(getattr(trained, name), nnx.Param)
    assert isinstance(getattr(fixed, name), FixedRandom) and not isinstance(getattr(fixed, name), nnx.Param)
    n_params = lambda m: sum(a.size for a in jax.tree.leaves(nnx.state(m, nnx.Param)))
    assert n_params(trained) > n_params(fixed)


def test_bad_settings_and_lengths_are_rejected():
    with pytest.raises(ConfigError, match="dense, random, factorized_random"):
        build(mode="dense_random")
    with pytest.raises(ConfigError, match="max_len"):
        registry.build("synthesizer", dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0))
    x, mask = x_and_mask(MAX_LEN + 1, [3], DIM)
    with pytest.raises(ConfigError, match=f"max_len={MAX_LEN}"):
        build()(x, mask, deterministic=True)
