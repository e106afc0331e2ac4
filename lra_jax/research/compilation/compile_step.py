"""Compiling one config's train and eval steps for a compile-only accelerator target (`lra_jax.measure.
accelerators`), the library of `python -m lra_jax.tools.compile`: a `Row` per step with its result
(ok, does not fit, error), its memory, FLOPs and modeled time as the compilers give them, and the
fit planning of a step that does not fit (`plan_fit`). Nothing runs on an accelerator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lra_jax import compat, kernels
from lra_jax.research.compilation import lowering
from lra_jax.measure import fit
from lra_jax.measure.out_of_memory import is_oom, needed_bytes
from lra_jax.measure.units import gib

NOT_MODELED = "not modeled: the step has a Mosaic kernel, which the TPU cost model gives negative time"
KERNEL_ESTIMATE = re.compile(r'"cost_estimate":\s*\{')  # in a Mosaic call's backend config (`pl.CostEstimate`)
# XLA:GPU options of every GPU compile here. Without a device XLA cannot autotune: on a GPU it compiles
# several Triton tilings of each GEMM fusion, drops those that fail and may choose cuBLAS; deviceless it
# takes one tiling per fusion, which can fail ("Couldn't find output tile sizes that satisfy hlo: %dot =
# f32[64032,512] dot(...)"), so GEMMs are compiled as cuBLAS calls, which a device may also choose.
GPU_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}
MODES = ("train", "eval")
# How GPU memory compiled here is labelled wherever it is printed: measured on GPUs it came out both above
# and below (docs/gpu-memory.md, `python -m lra_jax.tools.gpu_memory`), so it bounds nothing.
DEVICELESS_GPU_MEMORY = "GPU memory compiled without a GPU: an estimate, not a measurement (docs/gpu-memory.md)"

@dataclasses.dataclass
class Row:
    """One compiled step; JSON-ready (`dataclasses.asdict`)."""

    variant: str
    task: str  # "text:4000" for the long Text
    target: str
    mode: str  # train | eval
    result: str  # ok | does not fit | error
    global_batch: int
    devices: int
    per_device_batch: int
    accum_steps: int = 1
    memory: dict[str, int] | None = None  # argument, output, alias, temp, total (bytes per device)
    device_memory: int | None = None
    flops: float | None = None
    flops_partial: str | None = None  # why the FLOPs are a lower bound; None: complete
    bytes_accessed: float | None = None  # XLA's count of HBM bytes read and written, partial as the FLOPs
    kernels: str = "-"
    kernel_calls: int = 0  # Pallas custom calls in the compiled module
    modeled_seconds: float | None = None  # TPU compiler's modeled step time; a lower bound where loops > 0
    modeled_note: str | None = None
    loops: int = 0  # while loops in the compiled module, whose bodies the cost analyses count once
    roofline_seconds: float | None = None  # TPU, complete counts only: `roofline_seconds()`
    compile_seconds: float = 0.0
    error: str | None = None
    plan: dict[str, Any] | None = None  # for a step that does not fit
    config_batch: int | None = None  # the config's global batch where the devices do not divide it

    @property
    def failed(self) -> bool:
        return self.result == "error"


# ----------------------------------------------------------------------------- compiling one step

def target_mesh(target):
    """The trainer's mesh (`distributed.make_mesh`) on the target's devices: 1-D, axis "data"."""
    return Mesh(np.array(target.devices), ("data",))


def abstract_on(target, tree, sharded: bool):
    """`tree` of ShapeDtypeStructs placed on the target's 1-D "data" mesh: batch split, state replicated."""
    mesh = target_mesh(target)
    sharding = NamedSharding(mesh, PartitionSpec("data") if sharded else PartitionSpec())
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), tree)


def memory_of(compiled) -> dict[str, int] | None:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    memory = {"argument": analysis.argument_size_in_bytes, "output": analysis.output_size_in_bytes,
              "alias": analysis.alias_size_in_bytes, "temp": analysis.temp_size_in_bytes}
    memory["total"] = memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
    return memory


def cost_of(compiled) -> dict[str, float]:
    """XLA's cost analysis of the compiled step; for a GPU executable, which has none, XLA's HLO cost
    analysis of its optimized module (`compat.hlo_cost_analysis`)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - unimplemented for some backends
        cost = None
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return dict(cost) if cost else compat.hlo_cost_analysis(compiled)


def unestimated_calls(hlo_text: str, call: str) -> int:
    """Kernel calls (`custom_call_target="<call>"`) in `hlo_text` without a cost estimate, which XLA's
    cost analysis counts as 0 (a Mosaic call with `pl.CostEstimate` is counted by its estimate)."""
    target = f'custom_call_target="{call}"'
    return sum(target in line and not KERNEL_ESTIMATE.search(line) for line in hlo_text.splitlines())


def loops_in(hlo_text: str) -> int:
    """The while loops in a compiled module (scanned layers, gradient accumulation, a variant's lax.map).
    XLA's cost analysis and the TPU compiler's modeled time count each body once (measured: a 4- and a
    16-trip loop of the same matmul model the same time), so both are lower bounds where this is > 0."""
    return len(re.findall(r"\bwhile\(", hlo_text))


def flops_partial(hlo_text: str, unestimated: int) -> str | None:
    """Why XLA's FLOP count of `hlo_text` is a lower bound, or None (`unestimated`: kernel calls it counts as 0)."""
    reasons = []
    loops = loops_in(hlo_text)
    if loops:
        reasons.append(f"{loops} loop(s) counted for one iteration")
    if unestimated:
        reasons.append(f"{unestimated} Pallas kernel call(s) counted as 0")
    return "partial: " + ", ".join(reasons) if reasons else None


def roofline_seconds(flops: float, bytes_accessed: float, chip) -> float:
    """The roofline time of a step (Williams et al. 2009): max(FLOPs / peak, bytes / HBM bandwidth), the
    least time the chip needs for that work. Peak is the bf16 MXU peak, which f32 matmuls also run at on
    TPU under jax's default precision (one bf16 pass; `accelerators.TPU_CHIPS`). A lower bound: it
    assumes perfect overlap and XLA's byte count (each fusion's operands and results) as HBM traffic."""
    return max(flops / chip.peak_flops["bfloat16"], bytes_accessed / chip.bandwidth)


def compiler_options(target) -> dict[str, Any] | None:
    """XLA options of a compile for `target`: `GPU_COMPILER_OPTIONS` on a GPU, none on TPU."""
    return dict(GPU_COMPILER_OPTIONS) if target.platform == "cuda" else None


@contextlib.contextmanager
def without_compilation_cache():
    """Compiles inside write nothing to jax's persistent compilation cache: an executable for compile-only
    devices cannot be read back without a client of that platform (jax 0.12 warns at every such read).
    (Whether the cache is used is decided once per process, so it is the writes that are stopped.)"""
    minimum = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", minimum)


def compile_step(step, args, target, mode: str, layer_kernels: list[dict], row: Row) -> Row:
    """Compiles `step(*args)` for `target` into `row` (memory, FLOPs, kernels, modeled time, result)."""
    state, batch = args
    started = time.perf_counter()
    try:
        # The target's own mesh as the context mesh: its compile-only devices name the GPU the Triton
        # kernels are lowered for (`compat.lowering_target` would name another mesh than the arguments').
        # Its shared memory chooses the Triton kernels' blocks (`kernels.tiling`).
        with kernels.target_platform(target.platform, shared_memory=shared_memory_of(target)), \
                compat.abstract_mesh(target_mesh(target)), \
                without_compilation_cache():
            lowered = step.lower(abstract_on(target, state, False), abstract_on(target, batch, True))
            compiled = lowered.compile(compiler_options=compiler_options(target))
    except Exception as error:  # noqa: BLE001 - one row per failure
        row.compile_seconds = time.perf_counter() - started
        message = str(error).strip()
        if is_oom(message):
            row.result = "does not fit"
            need = needed_bytes(message)  # what the compiler's message names: the temporaries
            row.memory = {"temp": need} if need else None
        else:
            row.result = "error"
        first = (message.splitlines() or [type(error).__name__])[0]
        row.error = f"{type(error).__name__}: {first[:400]}"
        return row
    row.compile_seconds = time.perf_counter() - started
    text = compiled.as_text()
    call = lowering.KERNEL_CALLS[kernels.platform_of(target.platform)]
    row.kernel_calls = text.count(f'custom_call_target="{call}"')
    row.memory = memory_of(compiled)
    row.device_memory = target.memory_per_device
    cost = cost_of(compiled)
    row.flops, row.bytes_accessed = cost.get("flops"), cost.get("bytes accessed")
    row.flops_partial = flops_partial(text, unestimated_calls(text, call))
    row.loops = loops_in(text)
    if target.platform != "tpu":  # Pathfinder softmax: 43 GFLOP for 512 examples here, 399 for 128 on TPU
        row.flops_partial = (row.flops_partial or "partial: ") + "; GPU: the HLO cost analysis of the optimized " \
            "module counts no cuBLAS GEMM (custom calls, `GPU_COMPILER_OPTIONS`)"
    if target.platform == "tpu":
        seconds = cost.get("optimal_seconds")
        if row.kernel_calls:
            row.modeled_note = NOT_MODELED
        elif seconds is None or seconds < 0:
            row.modeled_note = f"not modeled: the TPU cost model gave {seconds}"
        else:
            row.modeled_seconds = float(seconds)
            if row.loops:
                row.modeled_note = f"a lower bound: {row.loops} loop(s) modeled for one iteration"
        if row.flops_partial is None and row.flops and row.bytes_accessed:
            row.roofline_seconds = roofline_seconds(row.flops, row.bytes_accessed, target.chip)
    planned = [entry[mode] for entry in layer_kernels if entry[mode] != kernels.XLA]
    if planned and not row.kernel_calls:
        row.result, row.error = "error", f"{planned[0]} planned but {call} is not in the compiled {mode} step"
    elif row.memory and row.memory["total"] > target.memory_per_device:
        row.result = "does not fit"
    else:
        row.result = "ok"
    return row


def shared_memory_of(target) -> int | None:
    """The target GPU's shared memory per block (`accelerators.Target.shared_memory`); None on TPU."""
    return getattr(target, "shared_memory", None)


# ----------------------------------------------------------------------------- one config on one target

def compile_config(variant: str, label: str, config, target, modes=MODES) -> list[Row]:
    """The rows of `config`'s steps compiled for `target` (one error row if the steps cannot be built)."""
    devices = len(target.devices)
    accum = config.get("grad_accum_steps", 1)
    base = dict(variant=variant, task=label, target=target.name, global_batch=config.batch_size, devices=devices,
                per_device_batch=config.batch_size // devices, device_memory=target.memory_per_device)
    if config.batch_size % devices:
        return [Row(**base, mode=mode, result="error",
                    error=f"batch_size {config.batch_size} is not divisible by the target's {devices} devices")
                for mode in modes]
    try:
        with kernels.target_platform(target.platform, shared_memory=shared_memory_of(target)):
            built, layer_kernels = lowering.abstract_steps(config, target.platform)
    except Exception as error:  # noqa: BLE001
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return [Row(**base, mode=mode, result="error", error=f"{type(error).__name__}: {first[:400]}")
                for mode in modes]
    rows = []
    for (step, args), mode in zip(built, MODES):
        if mode not in modes:
            continue
        # the train step runs `accum` micro-batches, the eval step one of their size (`steps.eval_batch_size`)
        row = Row(**base, mode=mode, result="", accum_steps=accum if mode == "train" else 1)
        row.per_device_batch //= accum
        row.kernels = describe(layer_kernels, mode)
        rows.append(compile_step(step, args, target, mode, layer_kernels, row))
    return rows


def describe(layer_kernels: list[dict], mode: str) -> str:
    """The kernels of the attention layers in `mode`, collapsed where all layers agree."""
    names = [entry[mode] for entry in layer_kernels]
    if not names:
        return "-"
    if len(set(names)) == 1:
        return f"{names[0]} x{len(names)}"
    return ", ".join(names)


def plan_fit(variant: str, label: str, config, target, rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Fit planning for the steps `rows` that do not fit: one accumulation for all of them (the eval step
    runs in the train step's micro-batches), or the memory one example needs. Returns a plan per mode,
    each with the memory its own step was compiled to under the plan."""
    modes = tuple(row.mode for row in rows)
    compiled: dict[int, dict[str, int | None]] = {}  # per-device micro-batch -> mode -> bytes

    def probe(micro: int, accum: int) -> dict[str, Any]:
        trial = config.copy_and_resolve_references()
        trial.grad_accum_steps = accum
        results = compile_config(variant, label, trial, target, modes=modes)
        for result in results:
            if result.failed:
                raise RuntimeError(f"probe at {micro} per device failed ({result.mode} step): {result.error}")
        memory = {r.mode: (r.memory or {}).get("total") or (r.memory or {}).get("temp") for r in results}
        compiled[micro] = memory
        fits = all(r.result == "ok" for r in results)
        print(f"    planning {variant} {label} on {target.name}: {micro} per device x {accum}: "
              f"{'ok' if fits else 'does not fit'} ({', '.join(f'{m} {gib(b)} GiB' for m, b in memory.items())}, "
              f"{sum(r.compile_seconds for r in results):.0f} s)", file=sys.stderr, flush=True)
        known = [b for b in memory.values() if b]
        return {"fits": fits, "bytes": max(known) if known else None}

    try:
        planned = fit.plan(config.batch_size, len(target.devices), probe)
    except RuntimeError as error:
        return {mode: {"status": "error", "error": str(error)} for mode in modes}
    probes = [{k: p[k] for k in ("per_device_batch", "accum_steps", "fits", "bytes")} for p in planned.probes]
    if planned.accum_steps is None:
        one = compiled.get(1, {})
        return {row.mode: {"status": "one example does not fit", "probes": probes,
                           "bytes_for_one_example": one.get(row.mode) or (row.memory or {}).get("total")
                           or (row.memory or {}).get("temp")} for row in rows}
    return {mode: {"status": "planned", "per_device_batch": planned.per_device_batch,
                   "accum_steps": planned.accum_steps, "overrides": planned.overrides,
                   "verified_bytes": compiled[planned.per_device_batch][mode], "probes": probes} for mode in modes}
