"""The kernel target: the platform kernels are chosen for, and whether Pallas kernels are interpreted.

By default the platform jax runs on (`jax.default_backend()`; CPU: interpreted);
`target_platform("tpu")` changes it for what is built and traced inside (the lowering tool
lowers a CUDA or TPU train step on a CPU that way; tests run the TPU kernels in the Pallas
interpreter with `target_platform("tpu", interpret=True)`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import jax

IMPLS = ("auto", "xla", "pallas")
PLATFORMS = ("cpu", "gpu", "tpu")


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
