"""How concurrent runs share one host's devices: each slot is a disjoint set of CPU cores, GPUs or TPU chips.

    slots("auto", parallel=2, per_run=1)   # on a 2-core CPU host: cores {0} and {1}

A run started in a slot sees only the slot's devices:
- CPU: the child's CPU affinity is the slot's cores (`os.sched_setaffinity`, inherited from the
  thread that starts it; XLA sizes its thread pool from it), so two runs never share a core;
- GPU: `CUDA_VISIBLE_DEVICES` lists the slot's GPUs;
- TPU: `TPU_VISIBLE_CHIPS` (and the older `TPU_VISIBLE_DEVICES`) lists the slot's chips, with
  `TPU_CHIPS_PER_PROCESS_BOUNDS` for their shape, `TPU_PROCESS_BOUNDS=1,1,1` (each run is a
  one-process job) and a port of its own (`TPU_PROCESS_PORT`), as libtpu needs for several
  processes on one TPU VM host.
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


def _groups(devices: list, parallel: int, per_run: int, what: str) -> list[list]:
    if parallel < 1 or per_run < 1:
        raise ConfigError(f"--parallel and --devices_per_run must be at least 1 (got {parallel}, {per_run})")
    if parallel * per_run > len(devices):
        raise ConfigError(f"--parallel={parallel} runs x --devices_per_run={per_run} needs {parallel * per_run} "
                          f"{what}, but this host has {len(devices)} available ({', '.join(map(str, devices))}); "
                          f"lower --parallel or --devices_per_run")
    return [devices[i * per_run:(i + 1) * per_run] for i in range(parallel)]


def slots(kind: str = "auto", parallel: int = 1, per_run: int = 1) -> list[Slot]:
    """`parallel` disjoint slots of `per_run` devices each, of `kind` (auto: `detect()`)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown device kind {kind!r}; known: {', '.join(KINDS)}")
    kind = detect() if kind == "auto" else kind
    if kind == "cpu":
        groups = _groups(sorted(os.sched_getaffinity(0)), parallel, per_run, "CPU cores")
        return [Slot(f"cpu {','.join(map(str, g))}", {}, frozenset(g)) for g in groups]
    if kind == "gpu":
        groups = _groups(gpu_ids(), parallel, per_run, "GPUs")
        return [Slot(f"gpu {','.join(g)}", {"CUDA_VISIBLE_DEVICES": ",".join(g)}) for g in groups]
    if per_run not in TPU_CHIP_BOUNDS:
        raise ConfigError(f"--devices_per_run={per_run} TPU chips is not a sub-slice libtpu accepts on one "
                          f"host; use one of {', '.join(map(str, TPU_CHIP_BOUNDS))}")
    groups = _groups(tpu_chips(), parallel, per_run, "TPU chips")
    out = []
    for i, g in enumerate(groups):
        chips, port = ",".join(g), str(TPU_BASE_PORT + i)
        out.append(Slot(f"tpu {chips}", {
            "TPU_VISIBLE_CHIPS": chips, "TPU_VISIBLE_DEVICES": chips,
            "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[per_run], "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_PORT": port, "TPU_PROCESS_ADDRESSES": f"localhost:{port}", "CLOUD_TPU_TASK_ID": "0"}))
    return out
