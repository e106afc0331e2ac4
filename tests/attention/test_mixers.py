"""Attention-free mixers (MLP-Mixer, FNet, gMLP) against references written here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import F32_EPS, assert_close, reassociation_tol, slow_except, x_and_mask
from lra_jax.attention import registry
from lra_jax.errors import ConfigError

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)

DIM, HEADS, MAX_LEN = 16, 2, 20


def build(name, seed=0, max_len=MAX_LEN, **settings):
    return registry.build(name, dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), max_len=max_len, **settings)


def apply(model, x, mask):
    return np.asarray(jax.jit(lambda x, mask: model(x, mask, deterministic=True))(x, mask))


def gelu(x):
    return np.asarray(jax.nn.gelu(jnp.asarray(x)))


def test_mixer_equals_dense_token_mlp():
    layer = build("mixer", hidden=12)
    n = 14
    x, mask = x_and_mask(n, [n, 9, 1], DIM)
    w1, w2 = np.asarray(layer.w1[...]), np.asarray(layer.w2[...])
    layer.b1[...] = np.linspace(-1, 1, 12, dtype=np.float32)  # non-zero biases exercise their slicing
    layer.b2[...] = np.linspace(-1, 1, MAX_LEN, dtype=np.float32)
    b1, b2 = np.asarray(layer.b1[...]), np.asarray(layer.b2[...])
    want = np.zeros_like(x)
    for row in range(x.shape[0]):
        xr = np.where(mask[row][:, None], x[row], 0.0)  # [n d]
        for c in range(DIM):  # one MLP along the length per channel
            hidden = gelu(w1[:, :n] @ xr[:, c] + b1)
            want[row, :, c] = w2[:n] @ hidden + b2[:n]
        want[row] = np.where(mask[row][:, None], want[row], 0.0)
    assert_close(apply(layer, x, mask), want, TOL)


@pytest.mark.parametrize("name", slow_except(["mixer", "gmlp"], keep={"mixer"}))
def test_fixed_length_mixers_ignore_padding_and_appended_padding(name):
    layer = build(name)
    x, mask = x_and_mask(12, [12, 7, 3], DIM)
    out = apply(layer, x, mask)
    x_other = np.where(mask[..., None], x, 100.0)
    assert_close(apply(layer, x_other, mask), out, TOL)
    x_long = np.concatenate([x, np.full((3, 8, DIM), -5.0, np.float32)], axis=1)
    mask_long = np.concatenate([mask, np.zeros((3, 8), bool)], axis=1)
    assert_close(apply(layer, x_long, mask_long)[:, :12], out, TOL)


@pytest.mark.parametrize("name", slow_except(["mixer", "gmlp"], keep={"mixer"}))
def test_fixed_length_mixers_reject_sequences_longer_than_max_len(name):
    layer = build(name, max_len=8)
    x, mask = x_and_mask(9, [9], DIM)
    with pytest.raises(ConfigError, match="max_len=8"):
        layer(x, mask, deterministic=True)
    with pytest.raises(ConfigError, match="max_len"):
        build(name, max_len=None)


def test_fnet_is_the_real_part_of_a_2d_fft_of_the_zero_padded_input():
    layer = build("fnet", out_proj=False)
    n = 12
    x, mask = x_and_mask(n, [n, 8, 0], DIM)
    padded = np.where(mask[..., None], x, 0.0)
    want = np.where(mask[..., None], np.fft.fft2(padded.astype(np.float64), axes=(1, 2)).real, 0.0)
    # FFT round-off grows as log2(N) eps of the transform's scale (Cooley-Tukey), N = n * DIM points.
    assert_close(apply(layer, x, mask), want, 8 * np.log2(n * DIM) * F32_EPS)
    assert len(jax.tree.leaves(nnx.state(layer, nnx.Param))) == 0  # the paper's parameter-free sublayer


def test_fnet_output_projection_follows_the_transform():
    layer = build("fnet")
    x, mask = x_and_mask(10, [10, 4], DIM)
    mixed = np.fft.fft2(np.where(mask[..., None], x, 0.0).astype(np.float64), axes=(1, 2)).real
    want = mixed @ np.asarray(layer.out.kernel[...]) + np.asarray(layer.out.bias[...])
    # The FFT's log2(N) eps, then the projection's sums of DIM terms.
    assert_close(apply(layer, x, mask), np.where(mask[..., None], want, 0.0), 8 * (np.log2(10 * DIM) + DIM) * F32_EPS)


def test_fnet_depends_on_padded_length_so_is_marked_length_variant():
    assert registry.get("fnet").length_invariant is False
    layer = build("fnet")
    x, mask = x_and_mask(8, [6], DIM)
    x_long = np.concatenate([x, np.zeros((1, 4, DIM), np.float32)], axis=1)
    mask_long = np.concatenate([mask, np.zeros((1, 4), bool)], axis=1)
    assert np.abs(apply(layer, x_long, mask_long)[:, :8] - apply(layer, x, mask)).max() > 1e-2


@pytest.mark.slow
def test_gmlp_equals_reference_and_uses_the_leading_block_of_spatial_weights():
    layer = build("gmlp", expansion=2)
    n = 9
    assert layer.spatial_weights(n).shape == (n, n)
    np.testing.assert_array_equal(np.asarray(layer.spatial_weights(n)), np.asarray(layer.spatial[...])[:n, :n])
    # Paper init: near-zero spatial weights, unit bias.
    assert np.abs(np.asarray(layer.spatial[...])).max() <= 1e-3
    np.testing.assert_array_equal(np.asarray(layer.spatial_bias[...]), 1.0)
    rng = np.random.default_rng(3)
    layer.spatial[...] = rng.standard_normal((MAX_LEN, MAX_LEN)).astype(np.float32)
    layer.spatial_bias[...] = rng.standard_normal(MAX_LEN).astype(np.float32)
    x, mask = x_and_mask(n, [n, 5], DIM)
    ws, bs = np.asarray(layer.spatial[...]), np.asarray(layer.spatial_bias[...])
    w_in, b_in = np.asarray(layer.proj_in.kernel[...]), np.asarray(layer.proj_in.bias[...])
    w_out, b_out = np.asarray(layer.proj_out.kernel[...]), np.asarray(layer.proj_out.bias[...])
    scale, offset = np.asarray(layer.norm.scale[...]), np.asarray(layer.norm.bias[...])
    m = mask[..., None]
    u = gelu(np.where(m, x, 0.0) @ w_in + b_in)
    z1, z2 = u[..., :DIM], u[..., DIM:]
    mu, var = z2.mean(-1, keepdims=True), z2.var(-1, keepdims=True)
    z2 = np.where(m, (z2 - mu) / np.sqrt(var + 1e-6) * scale + offset, 0.0)
    gate = np.einsum("mn,bnc->bmc", ws[:n, :n], z2) + bs[:n, None]
    want = np.where(m, (z1 * gate) @ w_out + b_out, 0.0)
    assert_close(apply(layer, x, mask), want, TOL)
