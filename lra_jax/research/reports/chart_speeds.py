"""The chart's speed axis: one measured train step per variant on one device, relative to softmax.

The LRA paper's Figure 3 puts each model at its training speed at length 4K relative to the Transformer
(steps/s ÷ the Transformer's steps/s) with a bubble of its memory. `device_speeds` builds that axis from
bench JSONs (`python -m lra_jax.tools.bench`): of every file measured on one device kind, per variant the
train step at the length and dropout rate asked for, as `impl=auto` runs it (a result of `--impl=xla`
stands for a variant with no kernel, where auto runs XLA too); where several files measured a variant,
the most recent file's result (by its recorded date). Every figure keeps the file it came from.

    relative_speed(v) = examples/s(v) / examples/s(softmax)     relative_memory(v) = memory(v) / memory(softmax)

Softmax is the one of the same file: measured by the same command, at one time with the same kernel code,
so the ratio compares two steps and nothing else. A file that merged several commands (`bench --update`) may
hold a variant and its softmax from two commands run at different times, and the figure says so per variant
(`Speed.same_command`). Softmax's speed moves between files (kernel changes, another time on a shared
machine), so a file without a softmax step as `impl=auto` runs it (none, or only `--impl=xla`) borrows the
softmax of the file measured nearest to it in time (recorded date; the later file on a tie), and the figure
says so per variant (`Speed.baseline_source`, `ratio_note`).

Memory is what the bench file records of the step, kind by kind (`Speed.memory_kind`): a measured device
peak (`"peak_memory_source": "device"`, or a bare `peak_memory_bytes` with no compiled estimate beside it,
which the bench writes from the device's `peak_bytes_in_use`) or XLA's compiled estimate of the step
(`compiled_step_memory_bytes`: the compiler's buffer plan, not a measurement). A ratio divides two figures of
the same kind, a measured peak first where both have one. `device_peak_bytes_in_use` is never used: it is
the peak of the whole bench process, over every dropout rate it timed, not of one step.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import os
from typing import Any

from lra_jax.attention import registry
from lra_jax.errors import LraError
from lra_jax.research.benchmarks.bench_report import measuring_command

BASELINE = "softmax"  # the paper's Transformer: the unit of both axes
MEASURED, ESTIMATED = "device", "xla"  # the kinds of memory a bench result records (`memory_kinds`)
MEMORY_WORDS = {MEASURED: "measured device peak memory",
                ESTIMATED: "XLA's compiled estimate of the step's memory (not measured)"}


@dataclasses.dataclass(frozen=True)
class Speed:
    """One variant's measured train step: examples/s and memory, relative to softmax's, and its file;
    `baseline_source`: the file of the softmax it is divided by (`source` itself where that file has one),
    `memory_kind`: MEASURED or ESTIMATED (None: no memory recorded), `same_command`: whether one command of
    the file measured it and that softmax (False: cells of two `--update` commands, `bench_report.across_commands`)."""
    examples_per_second: float
    memory_bytes: float | None
    relative_speed: float
    relative_memory: float | None
    source: str
    baseline_source: str = ""
    baseline_examples_per_second: float | None = None
    memory_kind: str | None = None
    same_command: bool = True

    @property
    def same_file(self) -> bool:
        """Whether the softmax it is divided by was measured in its own file."""
        return self.baseline_source in ("", self.source)


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

    @property
    def memory_kinds(self) -> list[str]:
        """The kinds of memory drawn (MEASURED before ESTIMATED), each once."""
        kinds = {s.memory_kind for s in self.speeds.values() if s.memory_kind}
        return [k for k in (MEASURED, ESTIMATED) if k in kinds]

    @property
    def memory_words(self) -> str:
        """What the bubble is, in words: 'XLA's compiled estimate of the step's memory (not measured)'."""
        kinds = self.memory_kinds
        if len(kinds) == 1:
            return MEMORY_WORDS[kinds[0]]
        return ("memory: a measured device peak where the bench recorded one, else XLA's compiled estimate "
                "(per variant in the table)" if kinds else "memory (none recorded)")

    @property
    def memory_short(self) -> str:
        """The memory column's head: 'measured GiB', 'XLA-estimated GiB' or 'GiB (measured or XLA-estimated)'."""
        kinds = self.memory_kinds
        return {(MEASURED,): "measured GiB", (ESTIMATED,): "XLA-estimated GiB"}.get(
            tuple(kinds), "GiB (measured or XLA-estimated)")


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
    baselines = {p: r for p, r in candidates if r["length"] == length and r["variant"] == BASELINE}
    dates = {p: _date(benches[p]) for p in paths}
    speeds = {}
    for variant, (path, r) in sorted(latest.items()):
        base_path = path if path in baselines else _nearest(path, sorted(baselines), dates)
        base = baselines[base_path]
        memory, kind, base_memory = _paired_memory(r, base)
        commands = benches[path].get("commands")
        same_command = (base_path != path or measuring_command(r, commands) == measuring_command(base, commands))
        speeds[variant] = Speed(
            examples_per_second=r["examples_per_second"], memory_bytes=memory,
            relative_speed=r["examples_per_second"] / base["examples_per_second"],
            relative_memory=memory / base_memory if memory and base_memory else None, source=path,
            baseline_source=base_path, baseline_examples_per_second=base["examples_per_second"], memory_kind=kind,
            same_command=same_command)
    settings = benches[latest[BASELINE][0]].get("settings") or {}
    return DeviceSpeeds(device=chosen, platform=benches[paths[0]]["device"].get("platform", ""), length=length,
                        dropout_rate=dropout_rate, batch_size=settings.get("batch_size"), speeds=speeds,
                        files=tuple(paths))


def _date(bench: dict[str, Any]) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(bench.get("date")))
    except ValueError:
        return None


def _nearest(path: str, candidates: list[str], dates: dict[str, datetime.datetime | None]) -> str:
    """Of `candidates` (files with a softmax result), the one measured nearest in time to `path` (the later on
    a tie); without recorded dates, the most recent file (the last of `candidates`, oldest first)."""
    if dates.get(path) is None or any(dates.get(c) is None for c in candidates):
        return candidates[-1]
    return min(candidates, key=lambda c: (abs((dates[c] - dates[path]).total_seconds()), -dates[c].timestamp()))


def memory_kinds(result: dict[str, Any]) -> dict[str, float]:
    """The step's memory a bench result records, by kind: MEASURED (a device peak) and ESTIMATED (XLA's)."""
    kinds = {}
    peak, compiled = result.get("peak_memory_bytes"), result.get("compiled_step_memory_bytes")
    if peak and (result.get("peak_memory_source") == MEASURED or (not compiled and not result.get("peak_memory_source"))):
        kinds[MEASURED] = peak
    if compiled:
        kinds[ESTIMATED] = compiled
    elif peak and result.get("peak_memory_source") == "xla_compiled_step":
        kinds[ESTIMATED] = peak
    return kinds


def _paired_memory(result: dict[str, Any], base: dict[str, Any]) -> tuple[float | None, str | None, float | None]:
    """(the variant's memory, its kind, softmax's of the same kind or None): a measured peak where both have
    one, else XLA's estimate where both have one, else the variant's own with no ratio."""
    mine, theirs = memory_kinds(result), memory_kinds(base)
    for kind in (MEASURED, ESTIMATED):
        if kind in mine and kind in theirs:
            return mine[kind], kind, theirs[kind]
    kind = next((k for k in (MEASURED, ESTIMATED) if k in mine), None)
    return (mine[kind] if kind else None), kind, None


def ratio_note(speeds: DeviceSpeeds) -> str:
    """What every ratio of `speeds` divides by, in words for the figure: the same file's softmax, or for the
    variants of a file without one, which file's; and what the memory is."""
    own = sorted({s.source for s in speeds.speeds.values() if s.same_file})
    borrowed: dict[tuple[str, str], list[str]] = {}
    for variant, s in sorted(speeds.speeds.items()):
        if not s.same_file:
            borrowed.setdefault((s.source, s.baseline_source), []).append(variant)
    softmax = sorted({s.baseline_examples_per_second for s in speeds.speeds.values() if s.baseline_examples_per_second})
    parts = [f"Speed ratios on {speeds.device}: each variant ÷ softmax measured in the same bench file"
             + (f" ({', '.join(os.path.basename(p) for p in own)})" if own else "")]
    parts += [f"{os.path.basename(source)} has no softmax step as impl=auto runs it: {', '.join(vs)} ÷ softmax "
              f"of {os.path.basename(base)} (the file nearest in date)" for (source, base), vs in borrowed.items()]
    across = sorted(v for v, s in speeds.speeds.items() if s.same_file and not s.same_command)
    if across:
        parts.append(f"{', '.join(across)} ÷ a softmax that another command of their file measured (`--update`, "
                     "at another time): those ratios also hold the machine's drift between the two")
    if len(softmax) > 1:
        parts.append(f"softmax itself ran at {softmax[0]:.3g} to {softmax[-1]:.3g} examples/s across these files")
    return "; ".join(parts) + f". Bubble: {speeds.memory_words}, relative to softmax's of the same kind."
