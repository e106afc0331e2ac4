"""The block-sparse patterns on our TPU flash kernel with attention dropout (`kernels/block_sparse/pallas_mosaic.py`),
in the Pallas interpreter against the XLA reference (same seed, same mask), and compiled by libtpu for v5e."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, build_small, reassociation_tol, slow_except

from lra_jax import kernels
from lra_jax.kernels.block_sparse.api import block_sparse_attention
from lra_jax.kernels.block_sparse import pallas_mosaic
from lra_jax.kernels.block_sparse.operands import BlockSparseStatic
from lra_jax.kernels.masking import Mask
from lra_jax.kernels.operands import AttentionInputs
from lra_jax.measure import accelerators

SEED = np.array([2024], np.uint32)
N = 300  # pads to 384: three 128-tiles, the last one partly padding
# Each pattern as the variants use it, small: the band is not tile aligned, the segments and the
# block matrix's 64-blocks cut tiles, global keys sit in the first tile. The last query tile (blocks
# 4 and 5) lists no key tile: its rows see nothing.
BLOCKS = (np.random.default_rng(2).random((5, 5)) < 0.3) | np.eye(5, dtype=bool)
BLOCKS[4] = False
PATTERNS = {
    "window": dict(window=40),
    "segments": dict(query_segments=np.arange(N) // 100, key_segments=np.arange(N) // 100),
    "globals": dict(window=20, global_keys=np.arange(N) < 3, global_queries=np.arange(N) < 2),
    "block_mask": dict(block=64, block_mask=BLOCKS),
}


def _call(q, k, v, mask, pattern, rate, impl):
    """The api on TPU (impl="pallas") or XLA; without dropout the api would run splash, so the kernel is called."""
    seed = SEED if rate else None
    mask = Mask(key_mask=jnp.asarray(mask), **pattern)
    if impl == "xla" or rate:
        platform = "tpu" if impl == "pallas" else None
        return block_sparse_attention(q, k, v, mask, impl=impl, platform=platform, interpret=True,
                                      dropout_rate=rate, dropout_seed=seed)
    inputs = AttentionInputs(mask.resolved(q.shape[0], q.shape[1], k.shape[1]), np.zeros(1, np.uint32))
    static = BlockSparseStatic(q.shape[-1] ** -0.5, mask.block or 64, interpret=True)
    return pallas_mosaic.attention(q, k, v, inputs, static)


@pytest.mark.parametrize("name,rate,dtype", [
    ("window", 0.1, jnp.float32), ("window", 0.0, jnp.float32), ("segments", 0.1, jnp.float32),
    ("segments", 0.0, jnp.float32), ("globals", 0.1, jnp.float32), ("globals", 0.0, jnp.float32),
    ("block_mask", 0.1, jnp.float32), ("block_mask", 0.0, jnp.float32), ("block_mask", 0.1, jnp.bfloat16)])
@pytest.mark.slow
def test_forward_and_gradients_match_the_reference(name, rate, dtype):
    """Ragged lengths (300 of 384, 170, and a row of padding only): output and d(q, k, v) equal the
    reference's, padded query rows are 0, nothing is NaN."""
    rng = np.random.default_rng(0)
    lengths = (N, 170, 0)
    q, k, v = (jnp.asarray(rng.standard_normal((3, N, 1, 32)), dtype) for _ in range(3))
    mask = np.arange(N)[None, :] < np.asarray(lengths)[:, None]
    weights = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def run(impl):
        def loss(q, k, v):
            out = _call(q, k, v, mask, PATTERNS[name], rate, impl)
            return (out.astype(jnp.float32) * weights).sum(), out
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    (out, grads), (want, want_grads) = run("pallas"), run("xla")
    tol = reassociation_tol(N, depth=4) if dtype == jnp.float32 else 2e-2
    assert_close(out, want, tol, "out")
    assert not np.any(np.asarray(out, np.float32)[1, 170:]) and not np.any(np.asarray(out, np.float32)[2])
    for axis, got, ref in zip("qkv", grads, want_grads):
        assert np.all(np.isfinite(np.asarray(got, np.float32))), f"d{axis}"
        assert_close(np.asarray(got, np.float32), np.asarray(ref, np.float32), 4 * tol, f"d{axis}")


def test_the_grid_walks_only_the_tiles_a_band_can_reach():
    """A window of 16 at 1024 tokens: each 128-tile sees at most 3 of the 8 key tiles, known when tracing;
    traced settings (BigBird's random blocks) give every tile."""
    codes_of = lambda key_mask, segments: Mask(  # noqa: E731
        key_mask=key_mask, window=16, query_segments=segments, key_segments=segments).codes(1024)
    assert pallas_mosaic.static_visits(1024, 1024, 1024, lambda m: codes_of(m, None)) == (3, 3)
    segments = np.arange(1024) // 128  # tile-aligned segments: one tile each
    assert pallas_mosaic.static_visits(1024, 1024, 1024, lambda m: codes_of(m, segments)) == (1, 1)
    traced = jax.jit(lambda s: jnp.asarray(pallas_mosaic.static_visits(
        1024, 1024, 1024, lambda m: codes_of(m, s))))(jnp.asarray(segments))
    np.testing.assert_array_equal(traced, [8, 8])


@pytest.mark.parametrize("name", slow_except(["local", "strided", "longformer", "bigbird"], keep={"local"}))
def test_sparse_layers_train_on_the_mosaic_kernel_on_tpu(name):
    with kernels.target_platform("tpu", interpret=True):
        layer = build_small(name, dim=16, num_heads=2, dropout_rate=0.1, impl="auto", max_len=64)
    assert layer.kernel_plan(deterministic=False).kernel == kernels.MOSAIC_BLOCK_SPARSE
    assert layer.kernel_plan(deterministic=True).kernel == kernels.SPLASH


@pytest.mark.slow
def test_compiles_forward_and_backward_with_dropout_for_v5e():
    """libtpu's Mosaic compiler accepts the block-sparse kernels (scalar-prefetched layouts in the index maps,
    the element rule, BigBird's 64-blocks inside 128-tiles, the int32 hash), both passes."""
    reason = accelerators.available()["tpu"]
    if reason:
        pytest.skip(f"compiling for TPU needs libtpu: {reason}")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from lra_jax import compat

    target = accelerators.get("tpu-v5e:1x1")
    mesh = Mesh(np.array(target.devices[:1]), ("data",))
    rows, whole = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    n = 1000
    qkv = jax.ShapeDtypeStruct((2, n, 4, 64), jnp.bfloat16, sharding=rows)
    mask = jax.ShapeDtypeStruct((2, n), bool, sharding=rows)
    blocks = jax.ShapeDtypeStruct((16, 16), bool, sharding=whole)
    seed = jax.ShapeDtypeStruct((1,), jnp.uint32, sharding=whole)

    def loss(q, k, v, m, block_mask, s):
        return block_sparse_attention(q, k, v, Mask(key_mask=m, window=100, global_keys=np.arange(n) < 2, block_mask=block_mask, block=64), impl="pallas", dropout_rate=0.1,
                                      dropout_seed=s).astype(jnp.float32).sum()

    with kernels.target_platform("tpu"), compat.abstract_mesh(mesh):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(qkv, qkv, qkv, mask, blocks, seed).compile()
    assert compiled.as_text().count("tpu_custom_call") >= 3, "forward, dq and dk/dv kernels"
