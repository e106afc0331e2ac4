"""The time of one kernel's jitted forward + backward, for the kernel benchmarks (`kernel_bench`,
`tiling_sweep`): the median over repeats after one untimed call, and XLA's temporaries.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp


def time_fwd_bwd(fn, q, k, v, mask, repeats: int) -> dict:
    """Median seconds of one jitted forward + backward, and XLA's temp memory."""
    r = jnp.ones(q.shape[:-1] + (v.shape[-1],), jnp.float32)
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, mask).astype(jnp.float32) * r)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    compiled = step.lower(q, k, v).compile()
    memory = compiled.memory_analysis()
    jax.block_until_ready(compiled(q, k, v))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(q, k, v))
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times),
            "temp_bytes": getattr(memory, "temp_size_in_bytes", None) if memory is not None else None}
