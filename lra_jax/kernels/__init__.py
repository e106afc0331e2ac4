"""Pallas kernels for the attention hot path, each beside its pure-jnp reference.

    flash/         dense softmax attention, blockwise online softmax (FlashAttention)
    block_sparse/  the same online softmax over a block layout (local, strided, Longformer, BigBird)
    linear/        fused non-causal kernelized attention (Performer, Linear Transformer)
    gated_scan/    chunked gated linear attention, a decayed matrix state carried over chunks (GLA, SSD)

Every package has `reference.py` (pure jnp, the test oracle), one file per
backend (`pallas_gpu.py`: Pallas Triton; `pallas_tpu.py`: Pallas Mosaic, jax's
splash attention) and `api.py`: the op's table of implementations (`dispatch.KernelOp`)
and its entry point, which takes `impl="auto"|"xla"|"pallas"` or a `plan`.
Beside them: `target` (the platform kernels are built for), `dispatch` (the tables and
`plan`, the one place a kernel is chosen), `masking` (the typed mask rule and key codes),
`operands` (masks, dropout seed and padding every op prepares), `dropout`, `sharding`, `tiling`.

Which kernel runs is decided once (`dispatch.plan`) for a *target platform*, by default
the platform jax runs on (`jax.default_backend()`); `auto` is a Pallas kernel on GPU and TPU and XLA
on CPU, and a kernel that does not exist for the target is XLA. The table of what each op runs for each
impl and platform is generated from the ops' declarations into docs/kernels.md
(`lra_jax.research.reports.kernel_table`).
`target_platform("tpu")` changes the target for what is built and traced inside
it: the lowering tool (`python -m lra_jax.tools.lower`) lowers a CUDA or TPU
train step on a CPU that way, and `target_platform("tpu", interpret=True)` runs
the TPU kernels in the Pallas interpreter (CPU tests).

Backends: the GPU kernels use the backend-neutral `pl` API lowered through
Triton (`jax.experimental.pallas.triton.CompilerParams`: in jax 0.10 a bare
`pl.pallas_call` on GPU means Mosaic GPU). The TPU path is jax's splash
attention (block-sparse flash attention over static or dynamic masks with
segment ids), the kernel MaxText runs on TPU. Splash has no attention dropout, so
attention with dropout runs our own Mosaic kernel (`flash/pallas_mosaic.py`): dense softmax
recorded as MOSAIC_FLASH, the block-sparse patterns (local, strided, Longformer, BigBird) over
their block layout as MOSAIC_BLOCK_SPARSE (`block_sparse/pallas_mosaic.py`).
"""

from lra_jax.kernels import sharding, tiling
from lra_jax.kernels.dispatch import (
    MOSAIC_BLOCK_SPARSE,
    MOSAIC_FLASH,
    NO_KERNEL,
    SPLASH,
    TRITON,
    XLA,
    Implementation,
    KernelOp,
    KernelPlan,
    plan,
)
from lra_jax.kernels.target import (
    IMPLS,
    PLATFORMS,
    Target,
    current_target,
    pallas_available,
    pallas_backend,
    platform_of,
    resolve_impl,
    target_platform,
    tpu_available,
)

__all__ = [
    "IMPLS", "MOSAIC_BLOCK_SPARSE", "MOSAIC_FLASH", "NO_KERNEL", "PLATFORMS", "SPLASH", "TRITON", "XLA", "Implementation",
    "KernelOp", "KernelPlan", "Target", "current_target", "pallas_available", "pallas_backend", "plan",
    "platform_of", "resolve_impl", "sharding", "target_platform", "tiling", "tpu_available",
]
