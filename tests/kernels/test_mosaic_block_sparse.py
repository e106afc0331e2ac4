"""The block-sparse patterns on our TPU flash kernel with attention dropout (`kernels/block_sparse/pallas_mosaic.py`):
the tiles its grid walks, the layers that plan it, and compiled by libtpu for v5e. Against the XLA reference
(every pattern over several 128-tiles, dropout, bfloat16) it is held by the block-sparse contract in
test_kernels.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import build_small, slow_except

from lra_jax import kernels
from lra_jax.kernels.block_sparse.api import block_sparse_attention
from lra_jax.kernels.block_sparse import pallas_mosaic
from lra_jax.kernels.masking import Mask
from lra_jax.measure import accelerators

SEED = np.array([2024], np.uint32)
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
