"""Fit planning: the largest per-device batch that fits a device, and the gradient accumulation that
keeps the config's global batch (`config.grad_accum_steps`, lra_jax.training.steps).

A global batch B over D devices puts b = B / D examples on each; with accumulation k each device holds
b / k of them at a time, so the candidates are the divisors of b. Memory grows with the micro-batch,
so the largest one that fits is found by bisection over the divisors, each probe a compilation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def divisors(n: int) -> list[int]:
    """The divisors of `n` >= 1, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_fitting(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
    """The largest candidate (ascending list) for which `fits` holds, assuming fits is monotone
    (true up to some size, false above); None if the smallest does not fit. Calls `fits` about
    log2(len(candidates)) times, never twice for one candidate."""
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


@dataclasses.dataclass
class Plan:
    """The outcome of planning one train step: the override that fits, or the memory one example needs."""

    global_batch: int
    devices: int
    per_device_batch: int | None  # examples per device per micro-batch; None: not even one fits
    accum_steps: int | None
    probes: list[dict[str, Any]]  # every compilation tried: per-device batch, fits, memory
    min_bytes: int | None = None  # where even one example does not fit: what it needs (if known)

    @property
    def overrides(self) -> str:
        """The flags that run the config's global batch this way ('' when nothing fits)."""
        if self.accum_steps is None:
            return ""
        return f"--config.batch_size={self.global_batch} --config.grad_accum_steps={self.accum_steps}"


def plan(global_batch: int, devices: int, probe: Callable[[int, int], dict[str, Any]]) -> Plan:
    """Plans `global_batch` over `devices`. `probe(per_device_batch, accum_steps)` compiles that
    configuration and returns at least {"fits": bool, "bytes": int | None}. The full per-device batch
    is not probed (the caller knows it does not fit)."""
    per_device = global_batch // devices
    probes: list[dict[str, Any]] = []

    def fits(micro: int) -> bool:
        result = probe(micro, per_device // micro)
        probes.append({"per_device_batch": micro, "accum_steps": per_device // micro, **result})
        return bool(result["fits"])

    best = largest_fitting([d for d in divisors(per_device) if d < per_device], fits)
    if best is None:
        one = next((p for p in probes if p["per_device_batch"] == 1), None)
        return Plan(global_batch, devices, None, None, probes, min_bytes=one and one.get("bytes"))
    return Plan(global_batch, devices, best, per_device // best, probes)
