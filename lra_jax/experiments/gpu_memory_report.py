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
from lra_jax.experiments import table2_report
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
                      "path": path})
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
    """The Markdown table, one line per pair, and the spread of the ratios on the same GPU."""
    lines = ["| variant | deviceless target | GiB deviceless | measured on | GiB compiled on the GPU | GiB peak in use "
             "| deviceless / compiled on GPU | deviceless / peak in use | fits as deviceless says |",
             "|---|---|--:|---|--:|--:|--:|--:|---|"]
    for p in pairs:
        d, m = p["deviceless"], p["measured"]
        lines.append(f"| {d['variant']} | {d['target']} | {_gib(d['bytes'])} | {m['device']} | {_gib(m['compiled_bytes'])} "
                     f"| {_gib(m['peak_bytes'])} | {_ratio(p['over_compiled'])} | {_ratio(p['over_peak'])} "
                     f"| {'yes' if d['result'] == 'ok' else d['result']} |")
    return "\n".join(lines)


def spread(pairs: list[dict[str, Any]], key: str, same_gpu: bool = True) -> tuple[float, float, int] | None:
    values = [p[key] for p in pairs if p[key] is not None and p["same_gpu"] == same_gpu]
    return (min(values), max(values), len(values)) if values else None


def format_page(pairs: list[dict[str, Any]], command: str) -> str:
    """docs/gpu-memory.md: the provenance, the table, the spread of the ratios and what the gap is."""
    sources = sorted({p["deviceless"]["path"] for p in pairs} | {p["measured"]["path"] for p in pairs})
    made = sorted({f"`{os.path.relpath(p['deviceless']['path'])}` at commit {p['deviceless']['commit']}" for p in pairs}
                  | {f"`{os.path.relpath(p['measured']['path'])}` on {p['measured']['device']} (jax "
                     f"{p['measured']['jax']}, commit {p['measured']['commit']})" for p in pairs})
    summary = []
    for key, what in (("over_compiled", "the step's memory analysis compiled on the GPU"),
                      ("over_peak", "the GPU's peak bytes in use")):
        for same, where in ((True, "on the same GPU"), (False, "on the other GPU")):
            found = spread(pairs, key, same)
            if found:
                summary.append(f"- against {what}, {where}: {found[0]:.2f}-{found[1]:.2f}x ({found[2]} steps)")
    return f"""# GPU memory: compiled without a GPU against measured on one

<!-- Generated by `{command}`; do not edit by hand. -->

Generated by `{command}` from {len(sources)} committed JSONs: {'; '.join(made)}.

The Table 2 train step (4 layers, width 256, batch 32 per GPU, float32, layers unrolled, XLA attention, dropout
as recorded) compiled without a GPU (`python -m lra_jax.tools.compile --targets=h100 --lengths=4096 --impl=xla`)
and measured on one (`python -m lra_jax.tools.bench --impl=xla --batch_size=32 --lengths=4096`). "Compiled on
the GPU" is the memory analysis of the step as the bench compiled it on the device; "peak in use" is the
device's peak bytes in use over the bench process, which also holds the batch, the RNG state and the
allocator's slack, and is the higher of the two dropout rates the bench measured in one process.

{format_table(pairs)}

Deviceless over measured:

{chr(10).join(summary) or '- no pairs'}

## Why they differ

- **No autotuning.** Without a device XLA:GPU cannot time candidate kernels. The deviceless compiles here turn
  Triton GEMM fusions off (`compile_step.GPU_COMPILER_OPTIONS`: deviceless, XLA takes one tiling per fusion,
  which can fail), so every matmul is a cuBLAS call whose operands must be materialised; on the device the
  autotuner may fuse a producer (a dropout mask, a softmax normalisation) into a Triton GEMM and never write it.
  This is why the n x n family (softmax, luong, synthesizer, additive) differs most.
- **A different GPU.** XLA's rematerialisation pass aims at the memory of the GPU it compiles for (its target
  config when deviceless); an H100 target against an H200 measurement compares two limits.
- **The code and stack compiled.** A pair is only as close as the commits and jax versions named above; the
  bench's measurements may predate the current code.
- **Not in the compile.** The device's peak in use adds what the step does not own (input batch, allocator
  fragmentation), so it can exceed the compiled-on-device figure.

So a deviceless GPU figure is an estimate of the step's memory on that GPU, not a measurement, and the tools
label it so; the table above says how far it was from the devices that ran the same step.
"""
