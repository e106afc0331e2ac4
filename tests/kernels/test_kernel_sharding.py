"""Kernels (Mosaic and Triton) under a data-parallel mesh run per device on their rows of the batch
(`kernels.sharding`)."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import REPO, child_xla_flags

from lra_jax import compat
from lra_jax.kernels import sharding
from lra_jax.kernels.flash.api import flash_attention
from lra_jax.kernels.masking import Mask
from lra_jax.measure import accelerators

FOUR_DEVICES = r"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from helpers import assert_close, qkv_and_mask, reassociation_tol
from lra_jax import compat
from lra_jax.kernels.block_sparse.api import block_sparse_attention
from lra_jax.kernels.flash.api import flash_attention
from lra_jax.kernels.linear.api import linear_attention
from lra_jax.kernels.masking import Mask
assert jax.device_count() == 4
mesh = Mesh(np.array(jax.devices()), ("data",))
q, k, v, mask = qkv_and_mask(256, [256, 200, 130, 1, 256, 77, 256, 9], heads=2, head_dim=16)
cases = {
    "flash": lambda q, k, v, m, impl: flash_attention(q, k, v, Mask(key_mask=m), impl=impl, platform="tpu", interpret=True),
    "bigbird": lambda q, k, v, m, impl: block_sparse_attention(
        q, k, v, Mask(key_mask=m, block_mask=jnp.eye(2, dtype=bool) | (jnp.arange(2)[None, :] == 0), block=128),
        impl=impl, platform="tpu", interpret=True),
}
seed = np.array([7], np.uint32)  # dropout in our TPU kernel: sharded, each device draws its global rows' mask
cases["flash-dropout"] = lambda q, k, v, m, impl: flash_attention(
    q, k, v, Mask(key_mask=m), impl=impl, platform="tpu", interpret=True, dropout_rate=0.2, dropout_seed=seed)
cases["local-dropout"] = lambda q, k, v, m, impl: block_sparse_attention(  # the same kernel over a band
    q, k, v, Mask(key_mask=m, window=40), impl=impl, platform="tpu", interpret=True, dropout_rate=0.2, dropout_seed=seed)
# the Triton kernels too: XLA would gather the whole batch onto every GPU; with dropout, each device
# offsets its batch index by its first row, so that the mask is the whole batch's
half = lambda *xs: [x[:, :128] for x in xs]  # the interpreted Triton kernels are slow: 128 tokens
cases["flash-gpu-dropout"] = lambda q, k, v, m, impl: flash_attention(
    *half(q, k, v), Mask(key_mask=m[:, :128]), impl=impl, platform="gpu", interpret=True, dropout_rate=0.2, dropout_seed=seed)
cases["local-gpu-dropout"] = lambda q, k, v, m, impl: block_sparse_attention(
    *half(q, k, v), Mask(key_mask=m[:, :128], window=40), impl=impl, platform="gpu", interpret=True, dropout_rate=0.2, dropout_seed=seed)
cases["linear-gpu"] = lambda q, k, v, m, impl: linear_attention(
    *half(q, k, v), Mask(key_mask=m[:, :128]), impl=impl, platform="gpu", interpret=True)
rows = NamedSharding(mesh, PartitionSpec("data"))
for name, fn in cases.items():
    want = fn(q, k, v, mask, "xla")
    step = jax.jit(lambda q, k, v, m: fn(q, k, v, m, "pallas"))
    with compat.abstract_mesh(mesh):
        text = step.lower(*(jax.device_put(x, rows) for x in (q, k, v, mask))).as_text()
        got = step(*(jax.device_put(x, rows) for x in (q, k, v, mask)))
    assert "shard_map" in text or "sdy.manual_computation" in text or "Sharding = \"{manual" in text, name
    assert_close(got, want, reassociation_tol(256, depth=3), name)
print("kernels ran per device")
"""


@pytest.mark.slow
def test_kernel_calls_run_per_device_under_a_four_device_mesh():
    env = dict(os.environ, XLA_FLAGS=child_xla_flags("--xla_force_host_platform_device_count=4"), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", FOUR_DEVICES], cwd=os.path.join(REPO, "tests"), env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kernels ran per device" in done.stdout


def test_without_a_mesh_the_kernel_is_called_as_it_is():
    assert sharding.batch_devices() == 1
    calls = []
    assert sharding.over_batch(lambda x: calls.append(x.shape) or x)(np.zeros((4, 2))).shape == (4, 2)
    assert calls == [(4, 2)]


@pytest.mark.slow
def test_splash_compiles_on_a_four_chip_tpu_slice():
    """XLA refuses to partition a Mosaic call; per device, the slice compiles it."""
    reason = accelerators.available()["tpu"]
    if reason:
        pytest.skip(f"compiling for a TPU slice needs libtpu: {reason}")
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from lra_jax import kernels

    target = accelerators.get("tpu-v5e:2x2")
    mesh = Mesh(np.array(target.devices), ("data",))
    qkv = jax.ShapeDtypeStruct((8, 1024, 4, 64), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("data")))
    mask = jax.ShapeDtypeStruct((8, 1024), bool, sharding=NamedSharding(mesh, PartitionSpec("data")))
    with kernels.target_platform("tpu"), compat.abstract_mesh(mesh):
        compiled = jax.jit(lambda q, k, v, m: flash_attention(q, k, v, Mask(key_mask=m), impl="pallas")).lower(
            qkv, qkv, qkv, mask).compile()
    assert "tpu_custom_call" in compiled.as_text()


@pytest.mark.slow
def test_the_triton_kernel_compiles_per_gpu_on_a_two_gpu_host():
    """XLA:GPU accepts a Triton call over several GPUs but gathers the batch onto each; per device,
    no all-gather is left in the compiled module."""
    reason = accelerators.available()["cuda"]
    if reason:
        pytest.skip(f"compiling for GPUs needs XLA:GPU: {reason}")
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from lra_jax import kernels
    from lra_jax.research.compilation import compile_step
    from lra_jax.research.compilation.lowering import KERNEL_CALLS

    target = accelerators.get("h100x2")
    mesh = Mesh(np.array(target.devices), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    qkv = jax.ShapeDtypeStruct((4, 256, 2, 32), jnp.bfloat16, sharding=rows)
    mask = jax.ShapeDtypeStruct((4, 256), bool, sharding=rows)
    seed = np.array([3], np.uint32)
    step = jax.jit(lambda q, k, v, m: flash_attention(q, k, v, Mask(key_mask=m), impl="pallas", dropout_rate=0.1,
                                                      dropout_seed=seed))
    with kernels.target_platform("gpu", shared_memory=target.shared_memory), compat.abstract_mesh(mesh):
        text = step.lower(qkv, qkv, qkv, mask).compile(compiler_options=compile_step.compiler_options(target)).as_text()
    assert KERNEL_CALLS["gpu"] in text
    assert "all-gather" not in text
