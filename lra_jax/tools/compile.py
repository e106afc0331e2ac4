"""Compiles every train and eval step for real TPU slices and GPUs, from any machine:
`python -m lra_jax.tools.compile` (`lra-compile`).

    python -m lra_jax.tools.compile --targets=tpu-v5e:2x2,tpu-v4:2x2x1,h100,a100 --variants=all \
        --tasks=all --scale=full --out=experiments/results/compile-full.json

`lower` is the cheap check (the kernels translate); this command runs the accelerator compilers
themselves (libtpu's TPU compiler with its Mosaic kernels; XLA:GPU through Triton and ptxas), which
is where a step is refused: HBM, shared memory, registers. Targets are `lra_jax.measure.accelerators` names.

For each (variant, task, target) the train step and the eval step of `configs/<variant>.py:<task>,<scale>`
(full-scale Text twice, at 1000 and 4000 tokens, as in `lower`) are compiled over the data-parallel
mesh the trainer builds on that slice: the global batch split over the target's devices, the state
replicated, with the attention kernels chosen for the target's platform. Per row:

- result: `ok`, `does not fit` (the compiler's RESOURCE_EXHAUSTED on TPU; on GPU, where XLA:GPU does
  not refuse, the compiled step's memory above the device's) or `error` and its first line;
- memory per device (arguments, temporaries, total = arguments + outputs - aliased + temporaries),
  from the compiled step (`memory_analysis()`), against the device's HBM (`accelerators`);
- FLOPs per device, XLA's count of the compiled step (for GPU, whose executables have no cost
  analysis, XLA's HLO cost analysis of the compiled module). XLA counts a loop body once and a custom call (a Pallas
  kernel) as zero: where the step has either, the figure is marked partial and says why;
- kernels: the kernel each attention layer compiled to; a Pallas kernel must appear in the compiled
  module as its custom call, else the row is an error;
- modeled (TPU only): the TPU compiler's modeled step time (`cost_analysis()["optimal_seconds"]`),
  a model, not a measurement. It is left out for a step containing a Mosaic kernel, which the cost
  model does not model (it comes out negative there): such rows say "not modeled". A step with loops
  gets a lower bound, printed with ">=": the model counts a loop body once (`loops_in`). Where the counts
  are complete (no loop, every kernel call with its cost estimate, as our Mosaic kernels give), such a
  step gets a roofline instead (`roofline_seconds`, printed with an "r"): its FLOPs at the chip's peak
  or its bytes at HBM bandwidth, whichever takes longer; also a model, never a measurement;
- compile seconds on this machine.

A train step that does not fit is planned (`lra_jax.measure.fit`, unless --plan=false): the largest per-device
micro-batch that fits (bisection over the divisors of the per-device batch, compiling each probe)
and the exact overrides that keep the global batch, `--config.batch_size=B --config.grad_accum_steps=K`,
which were compiled and fit; or, where one example per device does not fit, the memory it needs.

With `--lengths` the configs are the LRA paper's Table 2 protocol instead of the tasks: the bench's
Text model (`lra_jax.tools.bench`: 4 layers, width 256, 4 heads, MLP 1024, dropout 0.1) at each
length, with each variant's full-scale attention settings; the train steps are then printed as Table 2
(modeled steps/s and memory per device, relative to softmax) next to the paper's figures at 4K:

    python -m lra_jax.tools.compile --targets=tpu-v3:4x4 --variants=all --lengths=1024,2048,3072,4096 \
        --per_device_batch=32 --impl=xla --steps=train --plan=false --out=experiments/results/table2-tpu-v3.json

`--impl=xla` is the paper's setting (its models ran XLA attention; none had a kernel). `--impl`
sets `config.attention.impl` of every config (auto, the default, leaves each config's own). Any other
setting takes train's own flag after the others, applied to every config, e.g. synthesizer's factorized
mode: `... --variants=synthesizer --tasks=text --config.attention.mode=factorized_random`.

`--parallel=N` compiles N (config, target) pairs at once, each in a spawned process of its own (the
compilers use about one core each); the rows, their order and the JSON are those of a serial run, and a run
cut short resumes at any N. With `--out`, each finished pair is written at once.

Exit status 0 when every row compiled (fitting or planned), 1 if any row is an error, 2 on bad input.
`JAX_PLATFORMS` defaults to cpu here: the targets are compile-only, no local accelerator is used.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import os
import platform as host_platform
import re
import sys
import time
from typing import Any

from lra_jax import provenance
from lra_jax.errors import LraError
from lra_jax.tools import table2

GIB = 2**30
DEFAULT_TARGETS = "tpu-v5e:2x2,tpu-v4:2x2x1,h100,a100"
NOT_MODELED = "not modeled: the step has a Mosaic kernel, which the TPU cost model gives negative time"
KERNEL_ESTIMATE = re.compile(r'"cost_estimate":\s*\{')  # in a Mosaic call's backend config (`pl.CostEstimate`)
# XLA:GPU options of every GPU compile here. Without a device XLA cannot autotune: on a GPU it compiles
# several Triton tilings of each GEMM fusion, drops those that fail and may choose cuBLAS; deviceless it
# takes one tiling per fusion, which can fail ("Couldn't find output tile sizes that satisfy hlo: %dot =
# f32[64032,512] dot(...)"), so GEMMs are compiled as cuBLAS calls, which a device may also choose.
GPU_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}
MODES = ("train", "eval")


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
    """The trainer's mesh (`trainer.make_mesh`) on the target's devices: 1-D, axis "data"."""
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(target.devices), ("data",))


def abstract_on(target, tree, sharded: bool):
    """`tree` of ShapeDtypeStructs placed on the target's 1-D "data" mesh: batch split, state replicated."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

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
    from lra_jax import compat

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


def needed_bytes(message: str) -> int | None:
    """The memory a RESOURCE_EXHAUSTED message says the program needs (largest size it names)."""
    sizes = []
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([KMG])i?B?\b", message):
        sizes.append(float(number) * {"K": 2**10, "M": 2**20, "G": 2**30}[unit])
    return int(max(sizes)) if sizes else None


def is_oom(message: str) -> bool:
    """A refusal for device memory (not a kernel asking for more shared memory than the GPU has: that is a
    kernel error, whatever the batch)."""
    if "Shared memory size limit exceeded" in message:
        return False
    return "RESOURCE_EXHAUSTED" in message or "Ran out of memory" in message


def compiler_options(target) -> dict[str, Any] | None:
    """XLA options of a compile for `target`: `GPU_COMPILER_OPTIONS` on a GPU, none on TPU."""
    return dict(GPU_COMPILER_OPTIONS) if target.platform == "cuda" else None


@contextlib.contextmanager
def without_compilation_cache():
    """Compiles inside write nothing to jax's persistent compilation cache: an executable for compile-only
    devices cannot be read back without a client of that platform (jax 0.12 warns at every such read).
    (Whether the cache is used is decided once per process, so it is the writes that are stopped.)"""
    import jax

    minimum = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", minimum)


def compile_step(step, args, target, mode: str, layer_kernels: list[dict], row: Row) -> Row:
    """Compiles `step(*args)` for `target` into `row` (memory, FLOPs, kernels, modeled time, result)."""
    from lra_jax import compat, kernels
    from lra_jax.tools.lower import KERNEL_CALLS

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
    call = KERNEL_CALLS[kernels.platform_of(target.platform)]
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
    from lra_jax import kernels
    from lra_jax.tools import lower

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
            built, layer_kernels = lower.abstract_steps(config, target.platform)
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
    from lra_jax.measure import fit

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


# ----------------------------------------------------------------------------- jobs, here or in workers

@dataclasses.dataclass(frozen=True)
class Job:
    """One config on one target, the unit of work; picklable for a worker (the target goes by name)."""

    variant: str
    label: str
    config: Any  # ml_collections.ConfigDict
    target: str
    modes: tuple[str, ...]
    plan: bool


def divisible_batch(batch: int, devices: int) -> int:
    """The multiple of `devices` nearest to `batch` (the lower one on a tie, at least `devices`)."""
    lower = max(batch // devices * devices, devices)
    return lower if batch - lower <= lower + devices - batch else lower + devices


def run_job(job: Job, target) -> list[Row]:
    """The job's rows: its steps compiled for `target`; the steps that do not fit planned together.

    A global batch the target's devices do not divide (S4D's 50 on 4 chips) is refused by the trainer;
    the steps are compiled at the nearest batch they divide, and each row names the config's batch."""
    devices = len(target.devices)
    if job.config.batch_size % devices == 0:
        return compile_and_plan(job, target, job.config)
    config = job.config.copy_and_resolve_references()
    config.batch_size = divisible_batch(job.config.batch_size, devices)
    rows = compile_and_plan(job, target, config)
    for row in rows:
        row.config_batch = job.config.batch_size
    return rows


def compile_and_plan(job: Job, target, config) -> list[Row]:
    """`config`'s steps compiled for `target`, those that do not fit planned together (`plan_fit`)."""
    rows = compile_config(job.variant, job.label, config, target, job.modes)
    unfit = [row for row in rows if row.result == "does not fit"]
    if unfit and job.plan:
        plans = plan_fit(job.variant, job.label, config, target, unfit)
        for row in unfit:
            row.plan = plans[row.mode]
            if row.plan["status"] == "error":
                row.result = "error"
    return rows


_WORKER_TARGETS: dict[str, Any] = {}  # a worker process's compile-only targets, built once each


def _start_worker() -> None:
    if "JAX_PLATFORMS" not in os.environ:
        import jax

        jax.config.update("jax_platforms", "cpu")


def _run_in_worker(job: Job) -> list[Row]:
    from lra_jax.measure import accelerators

    if job.target not in _WORKER_TARGETS:
        _WORKER_TARGETS[job.target] = accelerators.get(job.target)
    return run_job(job, _WORKER_TARGETS[job.target])


def worker_pool(parallel: int) -> concurrent.futures.Executor:
    """`parallel` fresh processes (spawned: JAX must not be forked), each compiling one job at a time."""
    return concurrent.futures.ProcessPoolExecutor(parallel, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_start_worker)


def finished_jobs(jobs: list[Job], targets: dict[str, Any], parallel: int):
    """(index, rows) of each job as it finishes: in order in this process, or `parallel` at a time in
    `worker_pool` processes, in the order they finish. A compile failure is a row; a worker that dies
    (say, killed for host memory) ends the run, and what finished before it is kept by the caller."""
    if parallel == 1:
        for index, job in enumerate(jobs):
            yield index, run_job(job, targets[job.target])
        return
    with worker_pool(parallel) as pool:
        futures = {pool.submit(_run_in_worker, job): index for index, job in enumerate(jobs)}
        try:
            for future in concurrent.futures.as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


# ----------------------------------------------------------------------------- printing

HEADER = (f"{'variant':<17}{'task':<13}{'target':<14}{'step':<6}{'result':<13}{'b/dev':>5} {'args':>6} {'temp':>7} "
          f"{'total':>7} {'of':>5}  {'GFLOP':>9} {'modeled':>9} {'comp s':>6}  kernels")


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def format_row(row: Row) -> str:
    """One line per row (GiB per device), plus indented lines for an error, partial FLOPs, a plan."""
    memory = row.memory or {}
    flops = "-" if row.flops is None else f"{row.flops / 1e9:.1f}" + ("*" if row.flops_partial else "")
    at_least = ">=" if row.loops else ""
    modeled = (f"{at_least}{row.modeled_seconds * 1e3:.2f}ms" if row.modeled_seconds is not None else
               f"{row.roofline_seconds * 1e3:.2f}ms r" if row.roofline_seconds is not None else "-")
    batch = f"{row.per_device_batch}" + (f"x{row.accum_steps}" if row.accum_steps > 1 else "")
    line = (f"{row.variant:<17}{row.task:<13}{row.target:<14}{row.mode:<6}{row.result:<13}{batch:>5} "
            f"{gib(memory.get('argument')):>6} {gib(memory.get('temp')):>7} {gib(memory.get('total')):>7} "
            f"{gib(row.device_memory):>5}  {flops:>9} {modeled:>9} {row.compile_seconds:>6.1f}  {row.kernels}")
    if row.error:
        line += f"\n    {row.error}"
    if row.config_batch:
        line += (f"\n    the config's batch {row.config_batch} does not split over {row.devices} devices (the trainer "
                 f"refuses it): compiled at --config.batch_size={row.global_batch}, the nearest that does")
    if row.plan:
        line += "\n    " + describe_plan(row.plan)
    return line


def describe_plan(plan: dict[str, Any]) -> str:
    if plan["status"] == "planned":
        return (f"does not fit: use per-device batch {plan['per_device_batch']} with accumulation "
                f"{plan['accum_steps']}: {plan['overrides']} (compiled: {gib(plan['verified_bytes'])} GiB per device)")
    if plan["status"] == "one example does not fit":
        return (f"does not fit even with one example per device: it needs {gib(plan['bytes_for_one_example'])} "
                "GiB per device (on TPU the temporaries the compiler names; a larger device or a shorter "
                "--config.max_len)")
    return f"fit planning failed: {plan['error']}"


def summary(rows: list[Row]) -> str:
    """Per target: rows ok, planned (does not fit as configured), unfittable, errors."""
    lines = []
    for target in dict.fromkeys(r.target for r in rows):
        mine = [r for r in rows if r.target == target]
        ok = sum(r.result == "ok" for r in mine)
        planned = sum(r.result == "does not fit" and (r.plan or {}).get("status") == "planned" for r in mine)
        unfit = sum(r.result == "does not fit" for r in mine) - planned
        errors = sum(r.failed for r in mine)
        rebatched = sum(bool(r.config_batch) for r in mine)
        lines.append(f"{target}: {len(mine)} steps, {ok} fit, {planned} fit with accumulation, "
                     f"{unfit} do not fit, {errors} errors" + (f"; {rebatched} at a batch the devices divide, "
                                                               "not the config's" if rebatched else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- sweep --estimate --target

def modeling_config(config):
    """(the run's train step as the TPU cost model counts it, the factor its modeled time is multiplied by).

    The model counts a loop body once (`loops_in`), so scanned layers would be modeled as one layer and
    accumulated micro-batches as one: the layers are unrolled (scan_layers=False, remat kept) and one
    micro-batch is compiled (batch_size / grad_accum_steps), its time multiplied by grad_accum_steps
    (which counts the optimizer update that often: an overestimate of that small part)."""
    accum = config.get("grad_accum_steps", 1)
    modeled = config.copy_and_resolve_references()
    modeled.model.scan_layers = False
    if accum > 1:
        modeled.batch_size = config.batch_size // accum
        modeled.grad_accum_steps = 1
    return modeled, accum


def estimate_sweep(runs, target_name: str, log=print) -> int:
    """`sweep --estimate --target=NAME`: each unfinished run's chip-hours on a TPU target, modeled:
    num_train_steps x the TPU compiler's modeled train step time x the slice's chips, the step compiled
    once per distinct run shape (`sweep.shape_key`) as `modeling_config` lays it out. Where loops remain in
    the step (a variant's own, e.g. additive's query chunks) the time is a lower bound, marked >=.
    Evaluation, data and compilation are not counted.
    Returns the exit status: 2 on a bad target, 1 if a step did not compile, else 0."""
    from lra_jax.measure import accelerators
    from lra_jax.tools import sweep

    if "JAX_PLATFORMS" not in os.environ:
        import jax

        jax.config.update("jax_platforms", "cpu")
    try:
        target = accelerators.get(target_name)
        if target.platform != "tpu":
            raise LraError(f"--target={target_name}: only TPU targets have a modeled step time (the TPU compiler's)")
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    chips = len({tuple(d.coords) for d in target.devices})
    measured: dict[str, tuple[Row, int]] = {}
    total, failed, unmodeled, unfit, bounds = 0.0, 0, 0, 0, 0
    log(f"{'run':<48} {'modeled ms':>10} {'steps':>7} {'chip-hours':>11}   (modeled for {target.name}, "
        f"{chips} chips; not measured)")
    for r in runs:
        if r.state() in sweep.FINAL:
            continue
        key = sweep.shape_key(r)
        if key not in measured:
            config, accum = modeling_config(sweep.train_config(r.command))
            (row,) = compile_config(r.variant, r.task, config, target, modes=("train",))
            measured[key] = row, accum
        row, accum = measured[key]
        steps = sweep.train_config(r.command).num_train_steps
        if row.modeled_seconds is None:
            if row.failed:
                failed += 1
                why = f"error: {row.error}"
            elif row.result == "does not fit":
                unfit += 1
                why = "does not fit as configured (`compile` prints the accumulation that fits)"
            else:
                unmodeled += 1
                why = row.modeled_note or "not modeled"
            log(f"{r.name:<48} {why}")
            continue
        seconds = accum * row.modeled_seconds
        hours = steps * seconds * chips / 3600
        total += hours
        bounds += bool(row.loops)
        log(f"{r.name:<48} {'>=' if row.loops else '':>2}{seconds * 1e3:>8.2f} {steps:>7} {hours:>11.3f}")
    log(f"total: {'at least ' if bounds else ''}{total:.2f} chip-hours modeled by the XLA TPU compiler for "
        f"{target.name} (training steps only)"
        + (f"; {bounds} runs are lower bounds (>=: loops in the step, modeled once)" if bounds else "")
        + (f"; not counted: {unmodeled} runs not modeled (Mosaic kernels in the step)" if unmodeled else "")
        + (f"; not counted: {unfit} runs that do not fit as configured" if unfit else "")
        + (f"; {failed} runs failed to compile" if failed else ""))
    return 1 if failed else 0


# ----------------------------------------------------------------------------- the command

def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lra_jax.tools.compile", description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=DEFAULT_TARGETS, help="comma-separated lra_jax.measure.accelerators names")
    parser.add_argument("--variants", default="all", help="'all' or comma-separated attention names")
    parser.add_argument("--tasks", default="all", help="'all' or comma-separated LRA tasks")
    parser.add_argument("--scale", default="full", help="full | mini")
    parser.add_argument("--steps", default="train,eval", help="train, eval or both")
    parser.add_argument("--plan", default="true", choices=("true", "false"),
                        help="plan a train step that does not fit (compiles a few more times)")
    parser.add_argument("--per_device_batch", type=int, default=0,
                        help="examples per device instead of the config's global batch split over the target "
                             "(the Table 2 run on tpu-v3:4x4 uses 8: see the README); 0: the config's")
    parser.add_argument("--lengths", default="",
                        help="the LRA paper's Table 2 protocol at these lengths (e.g. 1024,2048,3072,4096) "
                             "instead of --tasks: the bench's Text model")
    parser.add_argument("--impl", default="auto", choices=("auto", "xla", "pallas"),
                        help="config.attention.impl of every config; auto leaves each config's own "
                             "(xla: the LRA paper's Table 2 setting)")
    parser.add_argument("--attention_dropout_rate", type=float, default=None,
                        help="config.model.attention_dropout_rate of every config (0: TPU softmax and the "
                             "block-sparse variants train on splash attention); default: each config's own")
    parser.add_argument("--dropout_rate", type=float, default=None,
                        help="config.model.dropout_rate (residual and MLP) of every config; with "
                             "--attention_dropout_rate=0 and 0 here a step without dropout; default: each config's own")
    parser.add_argument("--out", default="", help="write the rows as JSON here (e.g. experiments/results/...)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="compile in this many processes at once (each takes a core and up to ~3 GiB of "
                             "host memory at full scale); the rows and the JSON do not depend on it")
    args, args.overrides = parser.parse_known_args(argv)  # --config.KEY=VALUE (config_errors.apply_overrides)
    return args


def parse_lengths(text: str) -> list[int]:
    """`--lengths` as positive ints; [] when not given."""
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        lengths = [0]
    if any(n < 1 for n in lengths):
        raise LraError(f"--lengths must be positive integers, e.g. --lengths=1024,2048; got {text!r}")
    return lengths


def configs(variants: list[str], tasks: list[str], lengths: list[int], scale: str, files: dict[str, str],
            overrides: list[str] = ()):
    """(variant, row label, config) to compile: each task's config (full-scale Text twice, as `lower`),
    or with `lengths` the Table 2 protocol (`table2.config`) at each length, labelled "table2:<n>"; with
    `overrides` (`--config.KEY=VALUE`) applied to each (ConfigError for a bad one)."""
    from lra_jax.config.checks import apply_overrides
    from lra_jax.tools import lower

    if lengths:
        for variant in variants:
            for n in lengths:
                yield variant, f"{table2.LABEL}:{n}", apply_overrides(table2.config(variant, n), overrides, variant)
        return
    for variant, task, max_len in lower.combinations(variants, tasks, scale):
        config = apply_overrides(lower.load_config(files[variant], task, scale, max_len), overrides, variant)
        yield variant, (f"{task}:{config.max_len}" if max_len else task), config


def versions() -> dict[str, str]:
    import importlib.metadata

    import jax

    found = {"jax": jax.__version__, "python": host_platform.python_version()}
    for package in ("jaxlib", "libtpu", "jax-cuda12-plugin", "flax"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def command_line(argv: list[str]) -> str:
    """The command that reproduces the rows, as the JSON records it: without --parallel, which does not change
    them (so a run cut short resumes at any parallelism)."""
    kept = [a for i, a in enumerate(argv) if not a.startswith("--parallel=") and a != "--parallel"
            and not (i and argv[i - 1] == "--parallel")]
    return "python -m lra_jax.tools.compile " + " ".join(kept)


def unfinished_rows(path: str, argv: list[str]) -> tuple[dict[tuple[str, str, str, str], Row], float, str | None]:
    """The rows of an unfinished run of the same command written to `path`, by (variant, task, target,
    mode), its seconds and its commit: a long matrix cut short resumes where it stopped. ({}, 0, None)
    otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        if document.get("complete", True) or document.get("command") != command_line(argv):
            return {}, 0.0, None
        rows = [Row(**r) for r in document["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return {}, 0.0, None
    return ({(r.variant, r.task, r.target, r.mode): r for r in rows}, float(document.get("seconds", 0.0)),
            document.get("commit"))


def write_json(path: str, argv: list[str], rows: list[Row], seconds: float, complete: bool,
               commit: str | None) -> None:
    """The rows as JSON at `path`, replaced atomically; `complete` False while the command still runs.
    `commit`: the checkout's `source_commit()` when the command started, the code its rows were compiled
    from (a commit made while it runs changes nothing it imported)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    document = {"command": command_line(argv), "complete": complete, "commit": commit,
                "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": f"{host_platform.machine()}, "
                f"{os.cpu_count()} cores (compile-only targets: nothing ran on the accelerators)",
                "versions": versions(), "seconds": round(seconds, 1),
                "note": "memory in bytes per device; flops per device (XLA's count, flops_partial says where it is "
                        "a lower bound); modeled_seconds: the TPU compiler's modeled step time, not measured",
                "gpu_compiler_options": {"options": GPU_COMPILER_OPTIONS,
                                         "note": "deviceless GPU compiles: GEMMs as cuBLAS calls (no autotuning "
                                                 "without a device, so no Triton GEMM tiling is chosen)"},
                "rows": [dataclasses.asdict(r) for r in rows]}
    if any(table2.length_of(r.task) for r in rows):
        document["table2"] = table2.relative(rows)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if "JAX_PLATFORMS" not in os.environ:
        import jax

        jax.config.update("jax_platforms", "cpu")  # compile-only targets; no local accelerator needed
    from lra_jax.config import checks as config_errors
    from lra_jax.config import task_defaults
    from lra_jax.measure import accelerators
    from lra_jax.tools import lower
    from lra_jax.tools.choices import choose, config_files

    try:
        files = config_files()
        variants = choose(args.variants, sorted(files), "variant")
        tasks = choose(args.tasks, list(task_defaults.TASKS), "task")
        modes = tuple(choose(args.steps, list(MODES), "step"))
        lengths = parse_lengths(args.lengths)
        if args.per_device_batch < 0:
            raise LraError(f"--per_device_batch must be >= 0, got {args.per_device_batch}")
        if args.parallel < 1:
            raise LraError(f"--parallel must be >= 1, got {args.parallel}")
        for flag in ("dropout_rate", "attention_dropout_rate"):
            rate = getattr(args, flag)
            if rate is not None and not 0 <= rate < 1:
                raise LraError(f"--{flag} must be in [0, 1), got {rate}")
        if args.scale not in lower.SCALES:
            raise LraError(f"unknown scale {args.scale!r}; choose full or mini")
        config_errors.check_override_form(args.overrides)
        matrix = list(configs(variants, tasks, lengths, args.scale, files, args.overrides))
        names = [n.strip() for n in args.targets.split(",") if n.strip()]
        if not names:
            raise LraError(f"no targets given; choose from {accelerators.describe_names()}")
        targets = [accelerators.get(name) for name in names]
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    start, commit = time.perf_counter(), provenance.source_commit()
    done, earlier_seconds, earlier_commit = unfinished_rows(args.out, argv) if args.out else ({}, 0.0, None)
    if done:
        print(f"resuming the unfinished run in {args.out}: {len(done)} steps compiled there are kept", flush=True)
        if earlier_commit and earlier_commit != commit:  # the kept rows came from other code
            commit = f"{earlier_commit}, resumed at {commit}"
    start -= earlier_seconds
    print(HEADER, flush=True)
    by_name = dict(zip(names, targets))
    results: list[list[Row] | None] = []  # per (config, target) in matrix order: its rows once known
    jobs: list[Job] = []
    job_slot: list[int] = []  # jobs[i]'s place in `results`
    for variant, label, config in matrix:
        if args.impl != "auto" or args.attention_dropout_rate is not None or args.dropout_rate is not None:
            config = config.copy_and_resolve_references()
            if args.impl != "auto":
                config.attention.impl = args.impl
            for flag in ("dropout_rate", "attention_dropout_rate"):
                if getattr(args, flag) is not None:
                    config.model[flag] = getattr(args, flag)
        for name, target in by_name.items():
            if args.per_device_batch:
                config = config.copy_and_resolve_references()
                config.batch_size = args.per_device_batch * len(target.devices)
            earlier = [done.get((variant, label, target.name, mode)) for mode in modes]
            if all(earlier):  # compiled by the unfinished run of this command that --out holds
                results.append(earlier)
                print("\n".join(map(format_row, earlier)), flush=True)
                continue
            job_slot.append(len(results))
            results.append(None)
            jobs.append(Job(variant, label, config, name, modes, args.plan == "true"))
    for index, job_rows in finished_jobs(jobs, by_name, args.parallel):
        results[job_slot[index]] = job_rows
        print("\n".join(map(format_row, job_rows)), flush=True)
        if args.out:  # after every job: a long matrix cut short keeps what it compiled
            finished = [row for slot in results if slot for row in slot]
            write_json(args.out, argv, finished, time.perf_counter() - start, complete=False, commit=commit)
    rows = [row for slot in results for row in slot]
    seconds = time.perf_counter() - start
    print(summary(rows))
    if lengths:
        print(table2.format_table(table2.relative(rows), table2.paper_figures()))
    print(f"{len(rows)} steps compiled ({args.scale} scale) in {seconds:.0f} s; GiB and GFLOP per device, "
          "* = partial FLOPs (loops counted once, kernels without an estimate as 0); modeled = the TPU compiler's "
          "model (>=: a lower bound, loops modeled once; r: the roofline of the step's FLOPs and bytes), not measured")
    if args.out:
        write_json(args.out, argv, rows, seconds, complete=True, commit=commit)
        print(f"wrote {args.out}")
    return 1 if any(r.failed for r in rows) else 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.compile`, `lra-compile`)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
