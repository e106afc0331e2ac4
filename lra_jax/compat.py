"""Where the supported jax versions (0.10.2 through 0.12.x) differ, in one place.

- Lowering Triton kernels without a GPU. jax 0.10 lowers them for compute capability 9.0
  when no GPU is present; jax 0.12 refuses unless the target GPU is named by an abstract device
  in the context mesh. `gpu_target(kind)` names it on every version (0.10 ignores it).
"""

from __future__ import annotations

import contextlib

import jax
from jax.sharding import AbstractDevice, AbstractMesh

# The GPU a Triton kernel is lowered for when none is present (jax 0.10's own fallback: sm_90).
DEFAULT_GPU_KIND = "NVIDIA H100"
GPU_PLATFORMS = ("cuda", "rocm", "gpu")


def has_local_gpu() -> bool:
    try:
        return bool(jax.local_devices(backend="gpu"))
    except RuntimeError:
        return False


@contextlib.contextmanager
def gpu_target(device_kind: str = DEFAULT_GPU_KIND):
    """Lowers the Triton kernels traced inside for `device_kind` ("NVIDIA H100", "NVIDIA A100", ...)
    when this machine has no GPU; with a GPU present, for that GPU."""
    if has_local_gpu():
        yield
        return
    mesh = AbstractMesh((1,), ("gpu_target",),
                        abstract_device=AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu"))
    with jax.sharding.use_abstract_mesh(mesh):
        yield


def lowering_target(platform: str, gpu_kind: str = DEFAULT_GPU_KIND):
    """The context to lower for `platform` in: `gpu_target` for a GPU, nothing for TPU and CPU."""
    return gpu_target(gpu_kind) if platform in GPU_PLATFORMS else contextlib.nullcontext()

