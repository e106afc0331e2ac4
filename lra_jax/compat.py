"""Where the supported jax versions (0.10.2 through 0.12.x) differ, in one place.

- Compiling for compile-only devices (`lra_jax.measure.accelerators`): `abstract_mesh(mesh)` makes the
  target's mesh the context mesh, so that Triton kernels are lowered for the target's GPU.
- Cost analysis of a GPU executable: unimplemented for XLA:GPU; `hlo_cost_analysis` runs XLA's HLO
  cost analysis on the compiled module itself (a private jaxlib entry point, on every supported version).
- Lowering Triton kernels without a GPU. jax 0.10 lowers them for compute capability 9.0
  when no GPU is present; jax 0.12 refuses unless the target GPU is named by an abstract device
  in the context mesh. `gpu_target(kind)` names it on every version (0.10 ignores it).
"""

from __future__ import annotations

import contextlib

import jax
from jax._src.lib import xla_client  # private jaxlib module: hlo_cost_analysis reads XLA's cost analysis through it
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



def abstract_mesh(mesh):
    """`mesh`'s abstract mesh as the context mesh of what is traced inside: the target GPU for Triton
    lowering (`gpu_target`) and the batch axis over which kernels run per device (`kernels.sharding`)."""
    use = getattr(jax.sharding, "use_abstract_mesh", None)
    return use(mesh.abstract_mesh) if use is not None else contextlib.nullcontext()


def hlo_cost_analysis(compiled) -> dict:
    """XLA's HLO cost analysis ("flops", "bytes accessed", ...) of a compiled executable's optimized
    module, through the CPU client; {} where jaxlib does not offer it."""
    try:
        module = compiled.runtime_executable().hlo_modules()[0]
        return dict(xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module))
    except Exception:  # noqa: BLE001 - private API: absent or changed means no figure, not a failure
        return {}
