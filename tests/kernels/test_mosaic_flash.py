"""Our TPU flash kernel with attention dropout (`kernels/flash/pallas_mosaic.py`): its int32 hash against the
dropout mask, its dropped weights against the Triton kernel's, and compiled by libtpu for v5e. Against the XLA
reference it is held by the flash contract in test_kernels.py (several 128-tiles, dropout, bfloat16)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close

from lra_jax import kernels
from lra_jax.kernels import dropout
from lra_jax.kernels.flash.api import flash_attention
from lra_jax.kernels.flash import pallas_mosaic
from lra_jax.kernels.masking import Mask
from lra_jax.measure import accelerators

SEED = np.array([2024], np.uint32)


def test_int32_hash_draws_the_bits_of_the_uint32_mask():
    """Mosaic gets int32 arithmetic; the mask must still be `dropout.keep`'s, bit for bit."""
    heads = dropout.head_bits(jnp.uint32(7), jnp.arange(6))
    q_pos, k_pos = np.array([0, 1, 127, 128, 999, 4095, 16383]), np.arange(0, 16384, 61)
    for rate in (0.1, 0.5, 0.9):
        want = dropout.keep(heads, q_pos, k_pos, rate)
        got = jax.vmap(lambda h: pallas_mosaic.keep_int32(h, jnp.asarray(q_pos)[:, None], jnp.asarray(k_pos)[None, :],
                                                          rate))(jax.lax.bitcast_convert_type(heads, jnp.int32))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert abs(float(1 - want.mean()) - rate) < 0.02  # the mask is not trivially all kept


def _qkv(dtype, lengths=(130, 77), n=130, h=1, d=16):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((len(lengths), n, h, d)), dtype) for _ in range(3))
    return q, k, v, np.arange(n)[None, :] < np.asarray(lengths)[:, None]


@pytest.mark.slow
def test_same_seed_drops_the_same_weights_as_the_triton_kernel():
    """The TPU kernel and the Triton kernel (both interpreted) agree with dropout on; with a value
    matrix of one-hot rows the output is the dropped weight matrix itself, so this compares masks."""
    n = 40
    q, k, _, mask = _qkv(jnp.float32, lengths=(n, 29), n=n, h=1, d=n)
    v = jnp.broadcast_to(jnp.eye(n)[None, :, None, :], (2, n, 1, n)).astype(jnp.float32)
    q, k = q * 0, k * 0  # uniform weights 1 / length: the output is the mask / (length * (1 - rate))
    common = dict(impl="pallas", interpret=True, dropout_rate=0.3, dropout_seed=SEED)
    tpu = flash_attention(q, k, v, Mask(key_mask=mask), platform="tpu", **common)
    gpu = flash_attention(q, k, v, Mask(key_mask=mask), platform="gpu", block_q=16, block_k=16, **common)
    kept = np.asarray(tpu)[:, :, 0, :] > 0
    want = np.asarray(dropout.keep_like(SEED, (2, 1, n, n), 0.3))[:, 0] & mask[:, None, :] & mask[:, :, None]
    np.testing.assert_array_equal(kept, want)
    assert_close(tpu, gpu, 1e-6)


@pytest.mark.slow
def test_a_row_without_real_keys_is_zero_and_finite():
    q, k, v, mask = _qkv(jnp.float32, lengths=(0, 5), n=8, h=1, d=8)
    fn = lambda q, k, v: flash_attention(q, k, v, Mask(key_mask=mask, query_mask=np.ones_like(mask)), impl="pallas",  # noqa: E731
                                         platform="tpu", interpret=True, dropout_rate=0.1, dropout_seed=SEED)
    out = fn(q, k, v)
    grads = jax.grad(lambda *x: fn(*x).sum(), argnums=(0, 1, 2))(q, k, v)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(g)) for g in grads)
    assert not np.any(np.asarray(out)[0])


def test_softmax_layer_trains_on_the_mosaic_flash_kernel_on_tpu():
    from flax import nnx

    from lra_jax.attention import registry

    with kernels.target_platform("tpu", interpret=True):
        layer = registry.build("softmax", dim=16, num_heads=2, rngs=nnx.Rngs(0), dropout_rate=0.1, impl="auto")
    assert layer.kernel_plan(deterministic=False).kernel == kernels.MOSAIC_FLASH
    assert layer.kernel_plan(deterministic=True).kernel == kernels.SPLASH


@pytest.mark.slow
def test_compiles_forward_and_backward_with_dropout_for_v5e():
    """libtpu's Mosaic compiler accepts the kernel (int32 hash, blocks, scalar prefetch), both passes."""
    reason = accelerators.available()["tpu"]
    if reason:
        pytest.skip(f"compiling for TPU needs libtpu: {reason}")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from lra_jax import compat

    target = accelerators.get("tpu-v5e:1x1")
    mesh = Mesh(np.array(target.devices[:1]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    qkv = jax.ShapeDtypeStruct((2, 1000, 4, 64), jnp.bfloat16, sharding=rows)
    mask = jax.ShapeDtypeStruct((2, 1000), bool, sharding=rows)
    seed = jax.ShapeDtypeStruct((1,), jnp.uint32, sharding=NamedSharding(mesh, PartitionSpec()))

    def loss(q, k, v, m, s):
        return flash_attention(q, k, v, Mask(key_mask=m), impl="pallas", dropout_rate=0.1,
                               dropout_seed=s).astype(jnp.float32).sum()

    with kernels.target_platform("tpu"), compat.abstract_mesh(mesh):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(qkv, qkv, qkv, mask, seed).compile()
    text = compiled.as_text()
    assert text.count("tpu_custom_call") >= 3, "forward, dq and dk/dv kernels"
    # Each call carries its cost estimate, so XLA's count holds the kernels' matmuls: 2 + 3 + 4 per
    # 128 x 128 tile pair (the 1,000 tokens padded to 1,024), 2 FLOPs per multiply-add.
    from lra_jax.research.compilation import compile_step

    assert compile_step.unestimated_calls(text, "tpu_custom_call") == 0
    cost = compile_step.cost_of(compiled)
    assert cost["flops"] >= 2 * (2 + 3 + 4) * 2 * 4 * 1024 * 1024 * 64
