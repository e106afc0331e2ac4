"""The chart's speed axis: one measured train step per variant on one device, relative to softmax.

The LRA paper's Figure 3 puts each model at its training speed at length 4K relative to the Transformer
(steps/s ÷ the Transformer's steps/s) with a bubble of its memory. `device_speeds` builds that axis from
bench JSONs (`python -m lra_jax.tools.bench`): of every file measured on one device kind, per variant the
train step at the length and dropout rate asked for, as `impl=auto` runs it (a result of `--impl=xla`
stands for a variant with no kernel, where auto runs XLA too); where several files measured a variant,
the most recent file's result (by its recorded date). Every figure keeps the file it came from.

    relative_speed(v) = examples/s(v) / examples/s(softmax)     relative_memory(v) = peak(v) / peak(softmax)
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

from lra_jax.attention import registry
from lra_jax.errors import LraError

BASELINE = "softmax"  # the paper's Transformer: the unit of both axes


@dataclasses.dataclass(frozen=True)
class Speed:
    """One variant's measured train step: examples/s and peak memory, relative to softmax's, and its file."""
    examples_per_second: float
    memory_bytes: float | None
    relative_speed: float
    relative_memory: float | None
    source: str


@dataclasses.dataclass(frozen=True)
class DeviceSpeeds:
    """Every variant's `Speed` on `device` at `length` and `dropout_rate`; `files`: every file read."""
    device: str
    platform: str
    length: int
    dropout_rate: float
    batch_size: int | None
    speeds: dict[str, Speed]
    files: tuple[str, ...]


def expand(patterns: str | list[str] | tuple[str, ...]) -> list[str]:
    """Paths from a comma-separated list (or a list) of paths and globs, sorted; a pattern matching nothing
    is an error naming it."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    paths = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern.strip())) if glob.has_magic(pattern) else [pattern.strip()]
        if not matched or not all(os.path.isfile(p) for p in matched):
            raise LraError(f"--bench: {pattern} names no bench JSON file")
        paths += matched
    return sorted(set(paths))


def read_bench(path: str) -> dict[str, Any]:
    """A bench JSON, with its results and device kind checked present."""
    try:
        with open(path, encoding="utf-8") as f:
            bench = json.load(f)
        if not isinstance(bench.get("results"), list) or not bench["device"]["kind"]:
            raise ValueError("no results list or no device kind")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise LraError(f"cannot read bench JSON {path} ({type(error).__name__}: {error}); make one with "
                       "`python -m lra_jax.tools.bench`") from error
    return bench


def device_name(bench: dict[str, Any]) -> str:
    """The device kind a bench ran on; a CPU with the cores it used ('CPU (1 core)')."""
    device = bench["device"]
    if device.get("platform") == "cpu" or device["kind"].lower() == "cpu":
        cores = device.get("host_cpu_cores")
        return f"CPU ({cores} core{'s' if cores != 1 else ''})" if cores else "CPU"
    return device["kind"]


def _runs_as_auto(result: dict[str, Any], settings: dict[str, Any]) -> bool:
    """Whether this result is the step `impl=auto` runs: measured with auto, or with xla for a variant that
    has no kernel (auto runs XLA for it too)."""
    impl = (result.get("attention") or {}).get("impl") or settings.get("impl") or "auto"
    if impl == "auto":
        return True
    try:
        return impl == "xla" and getattr(registry.get(result["variant"]), "kernel_op", None) is None
    except (KeyError, ValueError):
        return False


def device_speeds(patterns: str | list[str], device: str | None = None, length: int | None = 4096,
                  dropout_rate: float = 0.1) -> DeviceSpeeds:
    """`DeviceSpeeds` from the bench JSONs `patterns` names, of the device whose name contains `device`
    (case-insensitive; None: the device with the most variants measured). `length` None: the longest
    length with a softmax result."""
    benches = {path: read_bench(path) for path in expand(patterns)}
    by_device: dict[str, list[str]] = {}
    for path, bench in benches.items():
        by_device.setdefault(device_name(bench), []).append(path)
    if device is None:
        chosen = max(by_device, key=lambda d: (len({r["variant"] for p in by_device[d]
                                                    for r in benches[p]["results"] if r.get("status") == "ok"}), d))
    else:
        matches = [d for d in by_device if device.lower() in d.lower()]
        if len(matches) != 1:
            raise LraError(f"--device={device} matches {len(matches)} of the devices measured in the bench JSONs "
                           f"({', '.join(sorted(by_device))}); name one of them")
        chosen = matches[0]
    paths = sorted(by_device[chosen], key=lambda p: (benches[p].get("date") or "", p))  # oldest first
    candidates = [(p, r) for p in paths for r in benches[p]["results"]
                  if r.get("status") == "ok" and r.get("examples_per_second")
                  and float(r.get("dropout_rate") or 0.0) == dropout_rate
                  and _runs_as_auto(r, benches[p].get("settings") or {})]
    if length is None:
        lengths = [r["length"] for _, r in candidates if r["variant"] == BASELINE]
        if not lengths:
            raise LraError(f"no {BASELINE} result at dropout {dropout_rate} on {chosen} in {', '.join(paths)}: "
                           "the speed axis is relative to it")
        length = max(lengths)
    latest = {r["variant"]: (p, r) for p, r in candidates if r["length"] == length}  # later files replace
    if BASELINE not in latest:
        raise LraError(f"no {BASELINE} result at length {length} and dropout {dropout_rate} on {chosen} in "
                       f"{', '.join(paths)}: the speed axis is relative to it; bench it with "
                       f"`python -m lra_jax.tools.bench --variants={BASELINE} --lengths={length}`")
    base = latest[BASELINE][1]
    base_memory = _memory(base)
    speeds = {}
    for variant, (path, r) in sorted(latest.items()):
        memory = _memory(r)
        speeds[variant] = Speed(
            examples_per_second=r["examples_per_second"], memory_bytes=memory,
            relative_speed=r["examples_per_second"] / base["examples_per_second"],
            relative_memory=memory / base_memory if memory and base_memory else None, source=path)
    settings = benches[latest[BASELINE][0]].get("settings") or {}
    return DeviceSpeeds(device=chosen, platform=benches[paths[0]]["device"].get("platform", ""), length=length,
                        dropout_rate=dropout_rate, batch_size=settings.get("batch_size"), speeds=speeds,
                        files=tuple(paths))


def _memory(result: dict[str, Any]) -> float | None:
    """Peak device memory of the step (measured), else the compiled step's."""
    return result.get("peak_memory_bytes") or result.get("compiled_step_memory_bytes")
