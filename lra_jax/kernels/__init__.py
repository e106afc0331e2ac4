"""Pallas kernels for the attention hot path, each beside its pure-jnp reference.

    flash/         dense softmax attention, blockwise online softmax (FlashAttention)
    block_sparse/  the same online softmax over a block layout (local, strided, Longformer, BigBird)
    linear/        fused non-causal kernelized attention (Performer, Linear Transformer)

Every package has `reference.py` (pure jnp, the test oracle), one file per
backend (`pallas_gpu.py`: Pallas Triton; `pallas_tpu.py`: Pallas Mosaic, jax's
splash attention) and `api.py`, whose entry point takes `impl="auto"|"xla"|"pallas"`.

Which kernel runs is decided for a *target platform*, by default the platform
jax runs on (`jax.default_backend()`):

    impl      gpu                 tpu                     cpu
    "xla"     XLA                 XLA                     XLA
    "pallas"  Pallas Triton       Pallas Mosaic (splash)  Pallas Triton, interpreted
    "auto"    Pallas Triton       Pallas Mosaic (splash)  XLA

A kernel that does not exist for the target (linear attention on TPU) is XLA.
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

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import jax

IMPLS = ("auto", "xla", "pallas")
PLATFORMS = ("cpu", "gpu", "tpu")

# Names of the kernels, as runs record them.
XLA, TRITON, SPLASH = "xla", "pallas-triton", "pallas-mosaic-splash"
MOSAIC_FLASH = "pallas-mosaic-flash"  # our TPU kernel with attention dropout (flash/pallas_mosaic.py)
MOSAIC_BLOCK_SPARSE = "pallas-mosaic-block-sparse"  # that kernel over a block layout (block_sparse/pallas_mosaic.py)


@dataclasses.dataclass(frozen=True)
class Target:
    """The platform kernels are chosen for, and whether Pallas kernels run in the interpreter."""

    platform: str  # "cpu" | "gpu" | "tpu"
    interpret: bool
    shared_memory: int | None = None  # the target GPU's shared memory per block; None: `tiling.shared_memory()`


_TARGET: contextvars.ContextVar[Target | None] = contextvars.ContextVar("lra_jax_kernel_target", default=None)


def platform_of(name: str) -> str:
    """jax backend or export platform name -> "cpu" | "gpu" | "tpu"."""
    name = name.lower()
    if name in ("gpu", "cuda", "rocm"):
        return "gpu"
    if name in PLATFORMS:
        return name
    raise ValueError(f"unknown platform {name!r}; choose one of cpu, cuda (gpu), rocm, tpu")


def current_target() -> Target:
    """The target set by `target_platform`, else the platform jax runs on (CPU: interpreted)."""
    target = _TARGET.get()
    if target is not None:
        return target
    platform = platform_of(jax.default_backend())
    return Target(platform, interpret=platform == "cpu")


@contextlib.contextmanager
def target_platform(platform: str, *, interpret: bool = False, shared_memory: int | None = None):
    """Chooses kernels for `platform` ("cpu", "gpu"/"cuda", "tpu") in what is built or traced inside.

    interpret=True runs the chosen Pallas kernels in the interpreter (tests on CPU);
    interpret=False lowers them for the real platform (`jax.export` with platforms=[...]).
    shared_memory: the target GPU's shared memory per block in bytes, from which the Triton kernels'
    blocks are chosen (`lra_jax.kernels.tiling`); None: an enclosing target's for the same platform,
    else the local GPU's, else the H100's.
    """
    platform = platform_of(platform)
    outer = _TARGET.get()
    if shared_memory is None and outer is not None and outer.platform == platform:
        shared_memory = outer.shared_memory
    token = _TARGET.set(Target(platform, interpret, shared_memory))
    try:
        yield _TARGET.get()
    finally:
        _TARGET.reset(token)


def resolve_impl(impl: str, interpret: bool = False, platform: str | None = None) -> str:
    """"auto" -> "pallas" on GPU/TPU (or when interpreting), "xla" on CPU; checks the name."""
    if impl not in IMPLS:
        raise ValueError(f"unknown kernel impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if impl == "auto":
        platform = current_target().platform if platform is None else platform_of(platform)
        return "pallas" if interpret or platform in ("gpu", "tpu") else "xla"
    return impl


def pallas_backend(platform: str | None = None) -> str:
    """The Pallas backend of a target: "mosaic" on TPU, "triton" elsewhere (interpreted off GPU)."""
    platform = current_target().platform if platform is None else platform_of(platform)
    return "mosaic" if platform == "tpu" else "triton"


def pallas_available() -> bool:
    """True where the compiled GPU (Triton) kernels can run: a GPU backend."""
    return jax.default_backend() == "gpu"


def tpu_available() -> bool:
    """True where the compiled TPU (Mosaic) kernels can run: a TPU backend."""
    return jax.default_backend() == "tpu"


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """What one attention layer runs: `kernel` ("xla", "pallas-triton", ...), on which platform,
    interpreted or not, whether the kernel applies the attention dropout, and why not a kernel
    where the impl asked for one (None otherwise)."""

    kernel: str
    platform: str
    interpret: bool = False
    reason: str | None = None
    dropout: bool = False

    @property
    def uses_pallas(self) -> bool:
        return self.kernel != XLA


def plan(impl: str, target: Target, kernels: dict[str, str], *, dropout_active: bool = False,
         dropout_backends: frozenset[str] = frozenset(), unsupported: str | None = None,
         dropout_kernels: dict[str, str] | None = None) -> KernelPlan:
    """The kernel of one layer on `target`.

    Args:
      impl: "auto" | "xla" | "pallas" (the config's choice).
      target: the platform the layer is built for (`current_target()` at build time).
      kernels: the variant's kernel per Pallas backend, e.g. {"triton": TRITON, "mosaic": SPLASH};
        a backend missing here has no kernel for this variant.
      dropout_active: attention dropout in this call.
      dropout_backends: the backends whose kernel for this variant applies attention dropout
        (the Triton flash and block-sparse kernels; splash has none).
      unsupported: why the variant's kernel cannot serve its settings on this target, or None.
      dropout_kernels: the kernel a backend runs instead of `kernels[backend]` when dropout is active
        (on TPU: {"mosaic": MOSAIC_FLASH}, since splash has no dropout).
    """
    if resolve_impl(impl, platform=target.platform) == XLA:
        return KernelPlan(XLA, target.platform)
    backend = pallas_backend(target.platform)
    if backend not in kernels:
        return KernelPlan(XLA, target.platform, reason=f"no {backend} kernel for this variant on {target.platform}")
    if dropout_active and backend not in dropout_backends:
        return KernelPlan(XLA, target.platform, reason=f"attention dropout is not in the {backend} kernel")
    if unsupported:
        return KernelPlan(XLA, target.platform, reason=unsupported)
    name = (dropout_kernels or {}).get(backend, kernels[backend]) if dropout_active else kernels[backend]
    return KernelPlan(name, target.platform, interpret=target.interpret, dropout=dropout_active)
