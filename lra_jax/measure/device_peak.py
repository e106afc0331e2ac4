"""The peaks a train step can reach on this device: a matmul of the step's dtype, and memory
streaming, timed here and now.

    peak = 2 n^3 / (fastest of `repeats` [n, n] x [n, n] products)
    bandwidth = 2 S / (fastest of `repeats` in-place scalings of an S-byte array)   (read + write)

Measured in the same process and under the same load as the step it is compared with, so a
utilisation (model FLOPs per second / peak, `lra_jax/measure/flops.py`) is not skewed by other jobs
sharing the machine. On accelerators the vendor's dense figure (`lra_jax.measure.accelerators` chips)
is given beside it.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from lra_jax.measure import accelerators

# jax's device_kind -> the chip key of `accelerators` (TPU v5e and v6e call themselves "lite").
_KINDS = {"TPU v3": "v3", "TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5p": "v5p",
          "TPU v5": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def _on_cpu() -> bool:
    return jax.devices()[0].platform == "cpu"


def measured_matmul_peak(dtype: str, n: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of the fastest of `repeats` jitted [n, n] x [n, n] products in `dtype` on device 0.

    n defaults to 2048 on a CPU (~0.1 s a product) and 8192 on an accelerator, where a 2048 product
    (~40 us on an H200) is as short as the launch and the wait for it: an H200 read 97 TFLOP/s
    against its 494 (TF32) that way, and steps then showed over 100% of the "peak".
    """
    n = n or (2048 if _on_cpu() else 8192)
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.dtype(dtype))
    product = jax.jit(jnp.matmul)
    product(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


def measured_memory_bandwidth(megabytes: int | None = None, repeats: int = 5) -> float:
    """Bytes/s of the fastest of `repeats` jitted in-place scalings of a float32 array of `megabytes`
    MiB on device 0 (donated, so no fresh memory is touched): each reads and writes it once.
    1 GiB on a CPU, 4 GiB on an accelerator (1 GiB took ~0.7 ms on an H200, launch included)."""
    megabytes = megabytes or (1024 if _on_cpu() else 4096)
    n = megabytes * 2**20 // 4
    scale = jax.jit(lambda x: x * 1.5, donate_argnums=0)
    x = scale(jnp.ones((n,), jnp.float32)).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x = scale(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * 4 * n / best


def vendor_peak(device_kind: str, dtype: str) -> float | None:
    """The published dense FLOP/s of one device of `device_kind` in `dtype`, or None (CPUs, unknown chips)."""
    if device_kind in _KINDS:
        return accelerators.TPU_CHIPS[_KINDS[device_kind]].peak_flops.get(dtype)
    for key, kind in accelerators.GPU_KINDS.items():
        if device_kind.startswith(kind):
            return accelerators.GPU_CHIPS[key].peak_flops.get(dtype)
    return None
