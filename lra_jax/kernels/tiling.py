"""Block sizes, warps and pipeline stages of the Triton kernels, chosen to fit the target GPU.

A Triton kernel keeps in shared memory the operands of its dots and the tiles its loops prefetch
(`num_stages` copies of each tile loaded in a software-pipelined loop). One that asks for more than
the GPU's shared memory per block (with opt-in) does not compile ("Shared memory size limit
exceeded"), and one whose live tiles need more than 255 registers per thread spills to local memory.
Each kernel states an upper bound of the shared memory it requests and of the float32 tile elements
it keeps live per thread, as a function of its blocks (`shared_memory_bytes` / `live_elements` in its
`pallas_gpu.py`); tests/kernels/test_tiling.py checks the shared-memory bound against what XLA:GPU's Triton
compilation requests for H100 and A100. `choose` takes the largest blocks, then the most stages, whose
bounds fit the target GPU: no trial compilation, the same choice wherever the step is traced.

The target GPU's shared memory (`shared_memory()`): the figure given to
`kernels.target_platform(..., shared_memory=)` (the compile command passes its target's, from
`lra_jax.measure.accelerators`), else the local GPU's by compute capability, else the H100's (the GPU the
Triton kernels are lowered for when there is none, `lra_jax.compat`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
from jax.experimental.pallas import triton as plgpu

from lra_jax.kernels.target import current_target

# Shared memory per thread block with opt-in, bytes, by compute capability (CUDA C++ Programming
# Guide, "Technical Specifications per Compute Capability"); accelerators.py's H100 and A100 agree.
SHARED_MEMORY_PER_BLOCK = {
    "7.0": 96 * 1024, "7.5": 64 * 1024, "8.0": 163 * 1024, "8.6": 99 * 1024, "8.7": 163 * 1024,
    "8.9": 99 * 1024, "9.0": 227 * 1024, "10.0": 227 * 1024, "12.0": 99 * 1024,
}
DEFAULT_COMPUTE_CAPABILITY = "9.0"  # H100, as `compat.DEFAULT_GPU_KIND`
MIN_BLOCK = 16  # Triton's smallest dot
MAX_REGISTERS = 255  # 32-bit registers per thread (every GPU since compute capability 3.5)
# Registers per thread allowed for addresses, indices, loop state and row statistics besides the tiles
# a kernel's `live_elements` counts; with those weights, fitted to ptxas's counts (flash_attention's).
SCALAR_REGISTERS = 64
STAGES = (2, 1)  # preferred first: two stages overlap the next tile's load with this one's math


@dataclasses.dataclass(frozen=True)
class Tiling:
    """One kernel's launch choice and the bounds it was chosen by."""

    block_q: int
    block_k: int
    num_warps: int
    num_stages: int
    shared_memory: int  # the kernel's bound of the bytes it requests at these blocks and stages

    def compiler_params(self):
        return plgpu.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


class TilingError(ValueError):
    """No blocks let the kernel fit the GPU: the caller runs the XLA form instead (impl='xla')."""


def local_compute_capability() -> str | None:
    """"9.0" for an H100 attached here, None without a CUDA GPU."""
    try:
        devices = jax.local_devices(backend="gpu")
    except RuntimeError:
        return None
    capability = getattr(devices[0], "compute_capability", None) if devices else None
    return str(capability) if capability else None


def shared_memory() -> int:
    """Bytes of shared memory per block of the GPU the kernels are built for (module docstring)."""
    given = current_target().shared_memory
    if given:
        return given
    capability = local_compute_capability() or DEFAULT_COMPUTE_CAPABILITY
    return SHARED_MEMORY_PER_BLOCK.get(capability, SHARED_MEMORY_PER_BLOCK[DEFAULT_COMPUTE_CAPABILITY])


def candidates(block_q: int, block_k: int) -> list[tuple[int, int]]:
    """(block_q, block_k) from the requested blocks down to 16, halving the larger (both when equal)."""
    found = [(block_q, block_k)]
    while max(block_q, block_k) > MIN_BLOCK:
        if block_q == block_k:
            block_q, block_k = max(block_q // 2, MIN_BLOCK), max(block_k // 2, MIN_BLOCK)
        elif block_q > block_k:
            block_q //= 2
        else:
            block_k //= 2
        found.append((block_q, block_k))
    return found


def choose(
    kernel: str,
    shared_memory_bytes: Callable[[int, int, int], int],
    block_q: int,
    block_k: int,
    *,
    limit: int,
    num_warps: int = 4,
    live_elements: Callable[[int, int], int] | None = None,
) -> Tiling:
    """The largest blocks (<= the requested, powers of two) and then the most stages whose bounds fit.

    Args:
      kernel: its name, for the error message.
      shared_memory_bytes: (block_q, block_k, num_stages) -> the kernel's bound of its request.
      block_q, block_k: the requested blocks (powers of two >= 16); a one-block kernel passes its
        block twice and ignores the second.
      limit: the GPU's shared memory per block (`shared_memory()`).
      num_warps: warps per program; the register bound is shared by their 32 * num_warps threads.
      live_elements: (block_q, block_k) -> float32 tile elements the kernel keeps live at once
        (accumulators and dot operands); None: no register bound.

    Raises TilingError when not even 16 x 16 blocks at one stage fit; its message names the bound that
    refused them (the registers, the shared memory or both) with the figures.
    """
    threads = 32 * num_warps
    registers = lambda bq, bk: live_elements(bq, bk) / threads + SCALAR_REGISTERS  # noqa: E731
    for bq, bk in candidates(block_q, block_k):
        if live_elements is not None and registers(bq, bk) > MAX_REGISTERS:
            continue
        for stages in STAGES:
            needed = shared_memory_bytes(bq, bk, stages)
            if needed <= limit:
                return Tiling(bq, bk, num_warps, stages, needed)
    refused = []
    if live_elements is not None and registers(MIN_BLOCK, MIN_BLOCK) > MAX_REGISTERS:
        refused.append(f"an estimated {registers(MIN_BLOCK, MIN_BLOCK):,.0f} registers per thread ({num_warps} warps; "
                       f"a thread has {MAX_REGISTERS}, beyond which ptxas spills to local memory)")
    smallest = shared_memory_bytes(MIN_BLOCK, MIN_BLOCK, 1)
    at = f"{MIN_BLOCK}-row blocks"
    if smallest > limit:
        refused.append(f"{smallest:,} bytes of shared memory (this GPU has {limit:,} per block)")
        at += " and one stage"
    raise TilingError(f"the {kernel} Triton kernel needs {' and '.join(refused)} even at {at}: use impl='xla'")
