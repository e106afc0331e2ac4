"""The accelerators a step can be compiled for from any machine, by name, with their published specs.

    tpu-v5e:2x2   a TPU slice: compile-only devices from libtpu (the `[tpu]` extra), one per chip
                  (per TensorCore on v2/v3), through `jax.experimental.topologies.get_topology_desc`
    h100, h200,   one GPU: XLA:GPU compiling through Triton and ptxas to cubin for the GPU described
    a100          by its target config (the `[cuda]` extra; jax itself runs on the CPU)
    h100x8        a host of 8 such GPUs (any count: a100x4, ...), the batch split over them

Neither needs the hardware. The compilers enforce what the hardware would (HBM on TPU, shared
memory and registers on GPU) and report the memory of a compiled step (`memory_analysis()`);
`fits` compares it with the device's memory. Specs are the vendors' published figures (peak
dense matmul FLOP/s by dtype, HBM bandwidth and size, per device as jax counts devices).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.util
import os
import re
from typing import Any

from jax.experimental import topologies

from lra_jax.errors import LraError
from lra_jax.measure.units import GIB


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published figures for one jax device of a kind: HBM bytes, HBM bytes/s, dense FLOP/s by dtype."""

    name: str
    memory_bytes: int
    bandwidth: float
    peak_flops: dict[str, float]


# TPU figures per jax device: a v2/v3 chip is two devices (TensorCores), later chips one.
# Google Cloud TPU system architecture pages: v3 123 TF/s bf16 and 32 GiB per chip (2 cores), v4 275
# TF/s and 32 GiB, v5e 197 TF/s and 16 GiB, v5p 459 TF/s and 95 GiB, v6e 918 TF/s and 32 GiB.
# "float32" is the rate of a float32 matmul at jax's default precision, which on TPU rounds the
# inputs to bf16 and runs one MXU pass: the bf16 peak (Precision.HIGHEST would take 6 passes).
TPU_CHIPS = {
    "v3": Chip("TPU v3 core", 16 * GIB, 450e9, {"bfloat16": 61.5e12, "float32": 61.5e12}),
    "v4": Chip("TPU v4", 32 * GIB, 1228e9, {"bfloat16": 275e12, "float32": 275e12}),
    "v5e": Chip("TPU v5e", 16 * GIB, 819e9, {"bfloat16": 197e12, "float32": 197e12}),
    "v5p": Chip("TPU v5p", 95 * GIB, 2765e9, {"bfloat16": 459e12, "float32": 459e12}),
    "v6e": Chip("TPU v6e", 32 * GIB, 1640e9, {"bfloat16": 918e12, "float32": 918e12}),
}

# NVIDIA datasheets (SXM, dense): H100 989 TF/s bf16, 67 TF/s fp32 (494 TF/s tf32), 3.35 TB/s, 80 GB;
# H200 the H100's compute with 4.8 TB/s and 141 GB (150,109,880,320 bytes as CUDA counted them on one);
# A100 312 TF/s bf16, 19.5 TF/s fp32 (156 TF/s tf32), 2.04 TB/s, 80 GB. "float32" is the TF32 figure:
# jax's default precision runs float32 matmuls on the tensor cores in TF32 on Ampere and Hopper.
GPU_CHIPS = {
    "h100": Chip("NVIDIA H100 80GB HBM3", 84_942_979_072, 3.35e12, {"bfloat16": 989e12, "float32": 494e12}),
    "h200": Chip("NVIDIA H200", 150_109_880_320, 4.8e12, {"bfloat16": 989e12, "float32": 494e12}),
    "a100": Chip("NVIDIA A100-SXM4-80GB", 85_100_068_864, 2.04e12, {"bfloat16": 312e12, "float32": 156e12}),
}
# jax's name for the GPU, from which its Triton lowering takes the compute capability (`compat.gpu_target`).
GPU_KINDS = {"h100": "NVIDIA H100", "h200": "NVIDIA H200", "a100": "NVIDIA A100"}

# XLA:GPU target configs (stream_executor.GpuTargetConfigProto), the fields the compiler reads, with
# the values of the devices (as the openxla/xla target-config specs for h100_sxm and a100_sxm_80 list them).
_H100_DEVICE_INFO = dict(
    threads_per_block_limit=1024, threads_per_warp=32, shared_memory_per_block=49152,
    shared_memory_per_core=233472, threads_per_core_limit=2048, core_count=132, fpus_per_core=128,
    block_dim_limit_x=2147483647, block_dim_limit_y=65535, block_dim_limit_z=65535,
    memory_bandwidth=3352320000000, l2_cache_size=52428800, clock_rate_ghz=1.98,
    device_memory_size=84942979072, shared_memory_per_block_optin=232448,
    cuda_compute_capability=(9, "ACCELERATED_FEATURES"), registers_per_core_limit=65536,
    registers_per_block_limit=65536, thread_dim_limit_x=1024, thread_dim_limit_y=1024,
    thread_dim_limit_z=64)
_GPU_DEVICE_INFO = {
    "h100": _H100_DEVICE_INFO,
    # The H100's die with more and faster memory and a larger L2, as an H200 reported them to CUDA.
    "h200": dict(_H100_DEVICE_INFO, memory_bandwidth=4800000000000, l2_cache_size=62914560,
                 device_memory_size=150109880320),
    "a100": dict(threads_per_block_limit=1024, threads_per_warp=32, shared_memory_per_block=49152,
                 shared_memory_per_core=167936, threads_per_core_limit=2048, core_count=108, fpus_per_core=64,
                 block_dim_limit_x=2147483647, block_dim_limit_y=65535, block_dim_limit_z=65535,
                 memory_bandwidth=2039040000000, l2_cache_size=41943040, clock_rate_ghz=1.41,
                 device_memory_size=85100068864, shared_memory_per_block_optin=166912,
                 cuda_compute_capability=(8, "NONE"), registers_per_core_limit=65536,
                 registers_per_block_limit=65536, thread_dim_limit_x=1024, thread_dim_limit_y=1024,
                 thread_dim_limit_z=64),
}


def gpu_target_config(name: str) -> str:
    """The GpuTargetConfigProto text of GPU `name` ("h100", "h200", "a100")."""
    lines = []
    for key, value in _GPU_DEVICE_INFO[name].items():
        if key == "cuda_compute_capability":
            major, extension = value
            lines.append(f"  cuda_compute_capability {{ major: {major} feature_extension: {extension} }}")
        else:
            lines.append(f"  {key}: {value}")
    return ("gpu_device_info {\n" + "\n".join(lines) + "\n}\nplatform_name: \"CUDA\"\n"
            "dnn_version_info { major: 8 minor: 9 patch: 4 }\n"
            f"device_description_str: \"{GPU_CHIPS[name].name}\"\n")


@dataclasses.dataclass(frozen=True)
class Target:
    """A named compile target: its platform, jax's compile-only devices, and the chip's figures."""

    name: str
    platform: str  # "tpu" | "cuda"
    chip: Chip
    devices: tuple[Any, ...]
    gpu_kind: str | None = None  # for the Triton lowering (`compat.gpu_target`)

    @property
    def memory_per_device(self) -> int:
        return self.chip.memory_bytes

    @property
    def shared_memory(self) -> int | None:
        """A GPU's shared memory per thread block with opt-in (bytes), for the Triton kernels' blocks
        (`lra_jax.kernels.tiling`); None on TPU."""
        for name, kind in GPU_KINDS.items():
            if kind == self.gpu_kind:
                return _GPU_DEVICE_INFO[name]["shared_memory_per_block_optin"]
        return None


TPU_PATTERN = re.compile(r"^(?:tpu-)?(v\d+[a-z]?):(\d+(?:x\d+){1,2})$")
GPU_PATTERN = re.compile(r"^([a-z]\d+)(?:x(\d+))?$")  # h100, h100x8: GPUs on one host
NAMES = ("tpu-v3:4x4", "tpu-v4:2x2x1", "tpu-v5e:2x2", "tpu-v5e:1x1", "tpu-v5p:2x2x1", "tpu-v6e:2x2", "h100", "h200",
         "a100", "h100x8")


def describe_names() -> str:
    return ("tpu-<generation>:<topology> (" + ", ".join(n for n in NAMES if n.startswith("tpu")) + "; generations "
            + ", ".join(TPU_CHIPS) + "), " + ", ".join(GPU_CHIPS) + " (one GPU; <gpu>x<n>: n GPUs on one host)")


@functools.lru_cache(maxsize=None)
def get(name: str) -> Target:
    """The target named `name` ("tpu-v5e:2x2", "v4:2x2x1", "h100", "a100", "h100x8"); its devices are
    compile-only.

    Raises LraError for an unknown name, or when the compiler it needs is not installed.
    """
    gpu = GPU_PATTERN.match(name)
    if gpu and gpu.group(1) in GPU_CHIPS and int(gpu.group(2) or 1) >= 1:
        chip, count = gpu.group(1), int(gpu.group(2) or 1)
        if not _has_cuda_plugin():
            raise LraError(f"compiling for {name} needs XLA:GPU and ptxas: pip install -e \".[cuda]\" "
                           "(then run with JAX_PLATFORMS=cpu on a machine without a GPU)")
        topology = topologies.get_topology_desc(platform="cuda", target_config=gpu_target_config(chip),
                                                topology=f"1x1x{count}")  # slices x hosts x GPUs per host
        return Target(name, "cuda", GPU_CHIPS[chip], tuple(topology.devices), GPU_KINDS[chip])
    match = TPU_PATTERN.match(name)
    if not match or match.group(1) not in TPU_CHIPS:
        raise LraError(f"unknown compile target {name!r}; choose {describe_names()}")
    generation, shape = match.groups()
    if not _has_libtpu():
        raise LraError(f"compiling for {name} needs libtpu: pip install -e \".[tpu]\"")
    quiet_libtpu()
    try:
        topology = topologies.get_topology_desc(topology_name=f"{generation}:{shape}", platform="tpu")
    except Exception as error:  # noqa: BLE001 - libtpu's message names the bad topology
        raise LraError(f"libtpu has no topology {generation}:{shape}: {str(error).splitlines()[0]}") from None
    devices = tuple(topology.devices)
    return Target(f"tpu-{generation}:{shape}", "tpu", per_device(TPU_CHIPS[generation], devices), devices)


def per_device(chip: Chip, devices: tuple[Any, ...]) -> Chip:
    """`chip`'s figures per compile-only device. libtpu's v4 and v5p topologies have a device per
    TensorCore (two per chip), where jax on the VM sees one megacore device per chip; the
    per-core program is compiled against its half of the chip's HBM, so its figures are halved."""
    chips = len({tuple(d.coords) for d in devices})
    cores = len(devices) // max(chips, 1)
    if cores <= 1 or chip.name.endswith("core"):
        return chip
    return Chip(f"{chip.name} core (1/{cores} chip)", chip.memory_bytes // cores, chip.bandwidth / cores,
                {k: v / cores for k, v in chip.peak_flops.items()})


def on_tpu_vm() -> bool:
    """True where TPU chips are attached (/dev/accel* or VFIO devices), as on a Cloud TPU VM."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def quiet_libtpu() -> None:
    """Environment for libtpu on a machine with no TPU, set before it loads (where not already set):

    - TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES: libtpu otherwise asks the GCE metadata server,
      fails, and prints two warnings ("could not determine TPU accelerator type", "unexpected worker
      hostname"). The values do not change the topology of a compile-only target (named explicitly).
    - ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu otherwise locks /tmp/libtpu_lockfile and refuses a second
      process; compile-only devices hold no chip, so several compiling processes are safe.

    Nothing is set on a TPU VM, where the runtime needs the real values.
    """
    if on_tpu_vm():
        return
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _has_libtpu() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def _has_cuda_plugin() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


def available() -> dict[str, str]:
    """{"tpu": reason or "", "cuda": reason or ""}: "" where that compiler is installed."""
    return {"tpu": "" if _has_libtpu() else "libtpu is not installed (pip install -e \".[tpu]\")",
            "cuda": "" if _has_cuda_plugin() else "XLA:GPU is not installed (pip install -e \".[cuda]\")"}
