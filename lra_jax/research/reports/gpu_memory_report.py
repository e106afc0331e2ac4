"""GPU memory of the Table 2 train step compiled without a GPU against the same step measured on one.

Deviceless: `python -m lra_jax.tools.compile --targets=h100 --lengths=4096 --impl=xla ...` (Table 2 JSONs,
`table2_report`): XLA:GPU's `memory_analysis()` of a step compiled for a GPU described by its target
config, with no device to autotune on. Measured: `python -m lra_jax.tools.bench` on the GPU, the same
step (4 layers, width 256, batch 32, float32, layers unrolled, XLA attention), where it records the
memory analysis of the step as compiled on the device and the device's peak bytes in use. A cell is
paired where variant, length, batch, dropout and XLA attention agree; the GPU may differ (an H100
target against an H200 measurement), which the table names. `format_page` writes docs/gpu-memory.md.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from lra_jax.errors import LraError
from lra_jax.research.compilation import table2_report
from lra_jax.measure.units import GIB

_RATE = re.compile(r"--(?:attention_)?dropout_rate=([0-9.]+)")
_DEVICES = {"h100": "NVIDIA H100", "h200": "NVIDIA H200", "a100": "NVIDIA A100"}


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise LraError(f"cannot read {path}: {error}") from error


def dropout_of(command: str) -> float | None:
    """The dropout rate of a compile command's steps: its --dropout_rate flags, else the bench configs'
    0.1 (`bench_cells.bench_config`); None where the two flags differ."""
    rates = {float(r) for r in _RATE.findall(command)}
    return 0.1 if not rates else (rates.pop() if len(rates) == 1 else None)


def deviceless_cells(path: str) -> list[dict[str, Any]]:
    """The GPU train rows of a Table 2 compile JSON, XLA attention only."""
    document = _read(path)
    dropout = dropout_of(document.get("command", ""))
    cells = []
    for row in document.get("rows", []):
        length = table2_report.length_of(row.get("task", ""))
        if row.get("target", "").startswith("tpu") or row.get("mode") != "train" or length is None:
            continue
        if not str(row.get("kernels", "")).startswith("xla"):
            continue
        memory = row.get("memory") or {}
        cells.append({"variant": row["variant"], "target": row["target"], "length": length, "dropout": dropout,
                      "batch": row["per_device_batch"], "result": row["result"],
                      "bytes": memory.get("total") or memory.get("temp"), "commit": document.get("commit"),
                      "date": document.get("date", ""), "path": path})
    return cells


def measured_cells(path: str) -> list[dict[str, Any]]:
    """The cells of a bench JSON made on a GPU whose attention ran XLA in every layer."""
    document = _read(path)
    device, settings = document.get("device", {}), document.get("settings", {})
    if device.get("platform") != "gpu" or settings.get("scan_layers") or settings.get("remat"):
        return []
    commit = document.get("commit") or document.get("versions", {}).get("lra_jax_commit")
    cells = []
    for cell in document.get("results", []):
        attention = cell.get("attention", {})
        if cell.get("status") != "ok" or any(k.get("train") != "xla" for k in attention.get("kernels", [])):
            continue
        cells.append({"variant": attention.get("name"), "device": device.get("kind", ""), "length": cell["length"],
                      "dropout": cell["dropout_rate"], "batch": settings.get("batch_size"),
                      "dtype": settings.get("dtype"), "compiled_bytes": cell.get("compiled_step_memory_bytes"),
                      "peak_bytes": cell.get("device_peak_bytes_in_use"), "commit": commit or "not recorded",
                      "jax": document.get("versions", {}).get("jax"), "date": document.get("date", ""), "path": path})
    return cells


def pair(deviceless: list[dict[str, Any]], measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per deviceless cell and measuring GPU: the latest measurement of the same step (float32), and the
    ratios deviceless / measured, for the compiled-on-device and the peak-in-use figures."""
    latest: dict[tuple, dict[str, Any]] = {}
    for m in sorted(measured, key=lambda m: m["date"]):
        if m["dtype"] == "float32":
            latest[(m["variant"], m["length"], m["dropout"], m["batch"], m["device"])] = m
    pairs = []
    for d in deviceless:
        for (variant, length, dropout, batch, device), m in latest.items():
            if (variant, length, dropout, batch) != (d["variant"], d["length"], d["dropout"], d["batch"]):
                continue
            ratio = lambda measured_bytes: d["bytes"] / measured_bytes if d["bytes"] and measured_bytes else None
            pairs.append({"deviceless": d, "measured": m, "same_gpu": device.startswith(_DEVICES.get(d["target"], "?")),
                          "over_compiled": ratio(m["compiled_bytes"]), "over_peak": ratio(m["peak_bytes"])})
    return pairs


def _gib(value: float | None) -> str:
    return "-" if not value else f"{value / GIB:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_table(pairs: list[dict[str, Any]]) -> str:
    """The Markdown table, one line per pair."""
    lines = ["| variant | deviceless: target, commit | GiB deviceless | measured on | GiB compiled on the GPU "
             "| GiB peak in use | deviceless / compiled on GPU | deviceless / peak in use | fits as deviceless says |",
             "|---|---|--:|---|--:|--:|--:|--:|---|"]
    for p in pairs:
        d, m = p["deviceless"], p["measured"]
        lines.append(f"| {d['variant']} | {d['target']}, {d['commit']} | {_gib(d['bytes'])} | {m['device']} "
                     f"| {_gib(m['compiled_bytes'])} | {_gib(m['peak_bytes'])} | {_ratio(p['over_compiled'])} "
                     f"| {_ratio(p['over_peak'])} | {'yes' if d['result'] == 'ok' else d['result']} |")
    return "\n".join(lines)


def spread(pairs: list[dict[str, Any]], key: str, same_gpu: bool = True, commit: str | None = None):
    """(min, max, count) of a ratio over the pairs on the same GPU (or not), of one deviceless commit or all."""
    values = [p[key] for p in pairs if p[key] is not None and p["same_gpu"] == same_gpu
              and commit in (None, p["deviceless"]["commit"])]
    return (min(values), max(values), len(values)) if values else None


def gpu_difference(measured: list[dict[str, Any]], first: str, second: str) -> tuple[float, float, int] | None:
    """(min, max, count) in bytes of `second`'s compiled-on-device memory minus `first`'s for the same step
    (variant, length, dropout, batch) measured on both GPUs (device names starting with `first`, `second`)."""
    by_gpu: dict[str, dict[tuple, int]] = {first: {}, second: {}}
    for m in measured:
        for gpu in by_gpu:
            if m["device"].startswith(gpu) and m["compiled_bytes"]:
                by_gpu[gpu][(m["variant"], m["length"], m["dropout"], m["batch"])] = m["compiled_bytes"]
    both = [by_gpu[second][k] - by_gpu[first][k] for k in by_gpu[first] if k in by_gpu[second]]
    return (min(both), max(both), len(both)) if both else None


def code_change(deviceless: list[dict[str, Any]]) -> list[tuple[str, str, str, float]]:
    """(variant, older commit, newer commit, older / newer bytes) where two deviceless JSONs of the same
    target compiled the same step at different commits and differ by more than 10%."""
    by_step: dict[tuple, dict[str, dict[str, Any]]] = {}
    for d in deviceless:
        by_step.setdefault((d["variant"], d["target"], d["length"], d["dropout"], d["batch"]), {})[d["commit"]] = d
    changes = []
    for (variant, *_), commits in by_step.items():
        cells = sorted(commits.values(), key=lambda d: d["date"])
        for old, new in zip(cells, cells[1:]):
            if old["bytes"] and new["bytes"] and abs(old["bytes"] / new["bytes"] - 1) > 0.1:
                changes.append((variant, old["commit"], new["commit"], old["bytes"] / new["bytes"]))
    return changes


def format_page(pairs: list[dict[str, Any]], deviceless: list[dict[str, Any]], measured: list[dict[str, Any]],
                command: str) -> str:
    """docs/gpu-memory.md: the provenance, the table, the spread of the ratios and what the gap is."""
    made = sorted({f"`{os.path.relpath(p['deviceless']['path'])}` at commit {p['deviceless']['commit']}" for p in pairs}
                  | {f"`{os.path.relpath(p['measured']['path'])}` on {p['measured']['device']} (jax "
                     f"{p['measured']['jax']}, commit {p['measured']['commit']})" for p in pairs})
    summary = []
    for commit in sorted({p["deviceless"]["commit"] for p in pairs}):
        for same, where in ((True, "the same GPU"), (False, "the other GPU")):
            found = spread(pairs, "over_compiled", same, commit)
            if found:
                summary.append(f"- deviceless at commit {commit} against the step compiled on {where}: "
                               f"{found[0]:.2f}-{found[1]:.2f}x ({found[2]} steps)")
    offset = gpu_difference(measured, "NVIDIA H100", "NVIDIA H200")
    offset_text = (f"The same step measured on both GPUs took {offset[0] / GIB:.2f}-{offset[1] / GIB:.2f} GiB more "
                   f"on the H200 than on the H100 ({offset[2]} steps)" if offset else "No step was measured on both GPUs")
    changes = code_change(deviceless)
    change_text = ("; ".join(f"{v}: {ratio:.2f}x at {old} what it is at {new}" for v, old, new, ratio in changes)
                   if changes else "no step changed by more than 10% between the commits compiled")
    return f"""# GPU memory: compiled without a GPU against measured on one

<!-- Generated by `{command}`; do not edit by hand. -->

Generated by `{command}` from the committed JSONs {'; '.join(made)}.

The Table 2 train step (4 layers, width 256, batch 32 per GPU, float32, layers unrolled, XLA attention, dropout
0.1) compiled without a GPU (`python -m lra_jax.tools.compile --targets=h100 --lengths=4096 --impl=xla
--per_device_batch=32 --steps=train --plan=false`) and measured on one (`python -m lra_jax.tools.bench
--impl=xla --batch_size=32 --lengths=4096 --dropout_rates=0,0.1`). "Compiled on the GPU" is XLA's memory analysis
of the step as the bench compiled it on the device; "peak in use" is the device's peak bytes in use over the
bench process, which also holds the batch and the allocator's slack and covers both dropout rates it measured.

{format_table(pairs)}

Deviceless over compiled on the GPU:

{chr(10).join(summary) or '- no pairs'}

## Why they differ

- **The code compiled.** Deviceless compiles of the same step at two commits: {change_text}. Each ratio
  above is the commit's own deviceless figure against the GPU's: a deviceless figure is only as current as the
  code it compiled.
- **The GPU.** {offset_text}: XLA:GPU's choices depend on the device (its memory size sets the
  rematerialisation target; the autotuner picks kernels and their workspaces), so an H100 figure is not an
  H200 one.
- **No autotuning.** Without a device XLA:GPU cannot time candidate kernels: the deviceless compiles turn
  Triton GEMM fusions off (`compile_step.GPU_COMPILER_OPTIONS`; deviceless XLA takes one tiling per fusion,
  which can fail) and call cuBLAS, where the device may fuse a producer into a Triton GEMM and never write it,
  or pick an algorithm with a larger workspace. The two ways can go either way, as the table shows.
- **Not in the compile.** The peak in use adds what the step does not own (the batch, allocator slack).

So a deviceless GPU figure is an estimate of the step's memory on that GPU, not a measurement and not a
bound in either direction: the tools (`compile`, `table2`, `fits`) print it labelled so.
"""
