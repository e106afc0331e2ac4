"""How concurrent runs share one host's devices: each slot is a set of CPU cores, GPUs or TPU chips.

    slots("auto", parallel=2, per_run=1)                      # on a 2-core CPU host: cores {0} and {1}
    slots("gpu", parallel=4, per_run=1, runs_per_device=4)    # four runs on GPU 0, a quarter of its memory each

Slots are disjoint unless `runs_per_device` > 1: then that many slots share each device group (a small
model leaves a large accelerator mostly idle; several runs fill it).

A run started in a slot sees only the slot's devices:
- CPU: the child's CPU affinity is the slot's cores (`os.sched_setaffinity`, inherited from the
  thread that starts it; XLA sizes its thread pool from it), so two runs never share a core;
- GPU: `CUDA_VISIBLE_DEVICES` lists the slot's GPUs; runs that share a GPU each preallocate their share
  of its memory (`XLA_PYTHON_CLIENT_MEM_FRACTION` = `GPU_MEMORY_SHARE` / runs_per_device), so that
  none can starve the others;
- TPU: `TPU_VISIBLE_CHIPS` (and the older `TPU_VISIBLE_DEVICES`) lists the slot's chips, with
  `TPU_CHIPS_PER_PROCESS_BOUNDS` for their shape, `TPU_PROCESS_BOUNDS=1,1,1` (each run is a
  one-process job) and a port of its own (`TPU_PROCESS_PORT`), as libtpu needs for several
  processes on one TPU VM host. A chip belongs to one process: TPU runs never share one.
Devices are found without importing jax (which would claim the accelerators in this process).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess

from lra_jax.errors import ConfigError

KINDS = ("auto", "cpu", "gpu", "tpu")
TPU_BASE_PORT = 8476
# Chips per run -> libtpu's chip bounds (x, y, z) on one host.
TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
# Of a GPU's memory, what the runs that share it preallocate together (JAX alone takes 0.75); the
# rest is left to the CUDA contexts (one per process, ~0.5 GiB each) and the driver.
GPU_MEMORY_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class Slot:
    """The devices one run may use: `env` is added to the child's environment, `cpus` (if set) is its
    CPU affinity."""
    label: str
    env: dict[str, str]
    cpus: frozenset[int] | None = None

    def pin(self) -> None:
        """Restricts the calling thread to the slot's cores. Linux keeps the CPU mask per thread and a
        child process inherits the mask of the thread that starts it, so the sweep starts each slot's
        runs from a thread of its own, pinned once (no pre-exec hook in a threaded parent)."""
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)


def gpu_ids() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else those `nvidia-smi -L` lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]


def tpu_chips() -> list[str]:
    """The TPU chips of this host: /dev/accel* (v2-v5e) or /dev/vfio/<n> (v5p, v6e)."""
    accel = sorted(glob.glob("/dev/accel[0-9]*"), key=lambda p: int(p[len("/dev/accel"):]))
    if accel:
        return [p[len("/dev/accel"):] for p in accel]
    return sorted((os.path.basename(p) for p in glob.glob("/dev/vfio/[0-9]*")), key=int)


def detect() -> str:
    """'gpu' if a GPU is visible, else 'tpu' if a TPU chip is, else 'cpu'."""
    if gpu_ids():
        return "gpu"
    return "tpu" if tpu_chips() else "cpu"


def count(kind: str = "auto") -> int:
    """How many devices of `kind` (auto: `detect()`) this host has: GPUs, TPU chips or CPU cores."""
    kind = detect() if kind == "auto" else kind
    return len({"gpu": gpu_ids, "tpu": tpu_chips}.get(kind, lambda: os.sched_getaffinity(0))())


def _groups(devices: list, parallel: int, per_run: int, runs_per_device: int, what: str) -> list[list]:
    if parallel < 1 or per_run < 1 or runs_per_device < 1:
        raise ConfigError(f"--parallel, --devices_per_run and --runs_per_device must be at least 1 (got {parallel}, "
                          f"{per_run}, {runs_per_device})")
    groups = -(-parallel // runs_per_device)  # device groups, each shared by up to runs_per_device runs
    if groups * per_run > len(devices):
        raise ConfigError(f"--parallel={parallel} runs x --devices_per_run={per_run} / --runs_per_device="
                          f"{runs_per_device} needs {groups * per_run} {what}, but this host has {len(devices)} "
                          f"available ({', '.join(map(str, devices))}); lower --parallel or --devices_per_run, "
                          "or raise --runs_per_device")
    return [devices[(i // runs_per_device) * per_run:(i // runs_per_device + 1) * per_run] for i in range(parallel)]


def _share(i: int, runs_per_device: int) -> str:
    """' (run 2 of 4)': which of the runs sharing a device a slot is; '' when devices are not shared."""
    return f" (run {i % runs_per_device + 1} of {runs_per_device})" if runs_per_device > 1 else ""


def slots(kind: str = "auto", parallel: int = 1, per_run: int = 1, runs_per_device: int = 1) -> list[Slot]:
    """`parallel` slots of `per_run` devices each, of `kind` (auto: `detect()`); each device group is
    shared by `runs_per_device` consecutive slots (1: every slot has devices of its own)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown device kind {kind!r}; known: {', '.join(KINDS)}")
    kind = detect() if kind == "auto" else kind
    if kind == "cpu":
        groups = _groups(sorted(os.sched_getaffinity(0)), parallel, per_run, runs_per_device, "CPU cores")
        return [Slot(f"cpu {','.join(map(str, g))}{_share(i, runs_per_device)}", {}, frozenset(g))
                for i, g in enumerate(groups)]
    if kind == "gpu":
        groups = _groups(gpu_ids(), parallel, per_run, runs_per_device, "GPUs")
        memory = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{GPU_MEMORY_SHARE / runs_per_device:.3f}"} \
            if runs_per_device > 1 else {}
        return [Slot(f"gpu {','.join(g)}{_share(i, runs_per_device)}", {"CUDA_VISIBLE_DEVICES": ",".join(g), **memory})
                for i, g in enumerate(groups)]
    if runs_per_device > 1:
        raise ConfigError(f"--runs_per_device={runs_per_device} on TPU: a TPU chip belongs to one process, so runs "
                          "cannot share one; use --runs_per_device=1 (and --parallel up to the number of chips)")
    if per_run not in TPU_CHIP_BOUNDS:
        raise ConfigError(f"--devices_per_run={per_run} TPU chips is not a sub-slice libtpu accepts on one "
                          f"host; use one of {', '.join(map(str, TPU_CHIP_BOUNDS))}")
    groups = _groups(tpu_chips(), parallel, per_run, 1, "TPU chips")
    out = []
    for i, g in enumerate(groups):
        chips, port = ",".join(g), str(TPU_BASE_PORT + i)
        out.append(Slot(f"tpu {chips}", {
            "TPU_VISIBLE_CHIPS": chips, "TPU_VISIBLE_DEVICES": chips,
            "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[per_run], "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_PORT": port, "TPU_PROCESS_ADDRESSES": f"localhost:{port}", "CLOUD_TPU_TASK_ID": "0"}))
    return out
