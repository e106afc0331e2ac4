"""Memory of a compiled step, and the check that refuses a step the machine cannot hold.

On a GPU or TPU the step must fit the device's memory, and XLA's compiled estimate of it (temporaries,
arguments and outputs) is the figure to hold against that. On the CPU the step's memory is the host's,
and XLA:CPU's estimate falls short of it. The resident memory one train step adds to its process (the
peak after compiling and running it twice, in a fresh process, less the memory held before it ran),
against the step's temporaries (`temp_size_in_bytes`), on a 2-core CPU with jax 0.10.2:

    softmax, the full-scale ListOps model (4 scanned, rematerialised layers, width 512), length 2000:
        batch 1: temporaries 0.63 GB, added 0.87 GB (1.39x)
        batch 2: 1.21 GB, 1.64 GB (1.35x)
        batch 4: 2.39 GB, 3.29 GB (1.38x)
        length 1000, batch 4: 0.67 GB, 0.98 GB (1.47x)
    linformer, the same model, length 2000, batch 2: 0.38 GB, 0.49 GB (1.28x)
    softmax, mini scale (2 unscanned layers, width 64): length 128, batch 32: 0.07 GB, 0.09 GB (1.36x);
        length 512, batch 8: 0.14 GB, 0.22 GB (1.64x)

so a CPU step is taken to add 1.5x its temporaries and 256 MiB (`host_step_bytes`). XLA's estimate of the
full-scale softmax ListOps step (batch 32) is 18.9 GB, 18.8 GB of it temporaries: it passed a check of
the estimate on this 24 GiB machine and was killed by the kernel at about 22 GB. This check asks 28.5 GB
for it and refuses it once compiled (compiling it took 0.75 GB), before it runs.
"""

from __future__ import annotations

from typing import Any

import jax

from lra_jax.config.settings import Settings
from lra_jax.errors import ConfigError

HOST_TEMP_FACTOR = 1.5  # resident memory a CPU step adds, per byte of XLA's temporaries (measured above)
HOST_STEP_OVERHEAD = 256 * 2**20  # and besides, whatever the step's size
GIB = 2**30


def peak_memory(compiled) -> dict[str, Any]:
    """Device peak bytes where the backend reports them, else XLA's compiled estimate of the step."""
    stats = jax.local_devices()[0].memory_stats() or {}
    estimate = compiled_estimate(compiled)
    device_peak = stats.get("peak_bytes_in_use")
    return {
        "peak_memory_bytes": device_peak if device_peak is not None else estimate,
        "peak_memory_source": "device" if device_peak is not None else "xla_compiled_step",
        "compiled_step_memory_bytes": estimate,
    }


def compiled_estimate(compiled) -> int | None:
    """XLA's estimate of a compiled step's memory: temporaries + arguments + outputs not aliased to arguments."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return (analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)


def host_step_bytes(compiled) -> int | None:
    """The resident memory one run of a compiled CPU step adds to the process (the module docstring's rule):
    1.5x XLA's temporaries, the outputs not written over the arguments, and 256 MiB. The arguments are
    already resident."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(HOST_TEMP_FACTOR * analysis.temp_size_in_bytes + analysis.output_size_in_bytes
               - analysis.alias_size_in_bytes + HOST_STEP_OVERHEAD)


def available_memory() -> tuple[int | None, str]:
    """Bytes the step may use: the accelerator's limit, or on the CPU the host memory available beyond what
    this process holds (MemAvailable)."""
    device = jax.local_devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if limit:
        return limit, f"the {device.device_kind}"
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024, "this machine's available memory"
    except (OSError, KeyError, ValueError):
        return None, ""


def _resident_bytes() -> int:
    """This process's resident memory now (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm", encoding="utf-8") as f:
            return int(f.read().split()[1]) * 4096
    except (OSError, IndexError, ValueError):
        return 0


def check_fits(compiled, config: Settings) -> None:
    """Refuses a compiled train step the machine cannot hold (instead of an out-of-memory kill), before it runs.

    On an accelerator: XLA's estimate against the device's memory. On the CPU: the memory the step adds
    (`host_step_bytes`) against the host memory available; the message counts this process's resident memory
    on both sides."""
    on_host = jax.local_devices()[0].platform == "cpu"
    need = host_step_bytes(compiled) if on_host else compiled_estimate(compiled)
    have, where = available_memory()
    if not need or not have or need <= have:
        return
    scan = ("--config.model.scan_layers=True --config.model.remat=True, "
            if not (config.model.scan_layers and config.model.remat) else "")
    fixes = (f"the same run in less memory: --config.grad_accum_steps=k (now {config.grad_accum_steps}, k micro-batches); "
             f"another run, in a new --workdir: {scan}a lower --config.batch_size (now {config.batch_size}) or "
             f"--config.max_len, or the mini scale (--config=<file>:{config.task},mini)")
    if not on_host:
        raise ConfigError(f"the train step needs about {need / GIB:.1f} GiB but {where} has {have / GIB:.1f} GiB; "
                          f"{fixes}")
    held, temp = _resident_bytes(), compiled.memory_analysis().temp_size_in_bytes
    raise ConfigError(
        f"the train step needs about {(held + need) / GIB:.1f} GiB of host memory ({held / GIB:.1f} GiB this process "
        f"holds and 1.5x XLA's {temp / GIB:.1f} GiB of temporaries) but this machine has {(held + have) / GIB:.1f} GiB "
        f"for it ({have / GIB:.1f} GiB available besides); {fixes}; or train on a GPU or TPU")
