"""Memory of a compiled step, and the check that refuses a step the machine cannot hold."""

from __future__ import annotations

from typing import Any

import jax

from lra_jax.config.settings import Settings
from lra_jax.errors import ConfigError


def peak_memory(compiled) -> dict[str, Any]:
    """Device peak bytes where the backend reports them, else XLA's compiled estimate of the step."""
    stats = jax.local_devices()[0].memory_stats() or {}
    analysis = compiled.memory_analysis()
    estimate = None
    if analysis is not None:
        estimate = (analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
                    + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)
    device_peak = stats.get("peak_bytes_in_use")
    return {
        "peak_memory_bytes": device_peak if device_peak is not None else estimate,
        "peak_memory_source": "device" if device_peak is not None else "xla_compiled_step",
        "compiled_step_memory_bytes": estimate,
    }


def available_memory() -> tuple[int | None, str]:
    """Bytes the step may use: the accelerator's limit, or the host's available memory on CPU."""
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


def check_fits(memory: dict[str, Any], config: Settings) -> None:
    """Refuses a train step that XLA says needs more memory than there is (instead of an OOM kill)."""
    need = memory["compiled_step_memory_bytes"]
    have, where = available_memory()
    if need and have and need > have:
        gib = 2**30
        hint = ("set --config.model.scan_layers=True --config.model.remat=True, or "
                if not (config.model.scan_layers and config.model.remat) else "")
        raise ConfigError(
            f"the train step needs about {need / gib:.1f} GiB but {where} has {have / gib:.1f} GiB; "
            f"{hint}lower --config.batch_size (now {config.batch_size}) or --config.max_len"
        )
