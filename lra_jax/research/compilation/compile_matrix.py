"""The compile matrix of `python -m lra_jax.tools.compile`: the (variant, task or Table 2 length) configs,
each compiled on each target as a `Job` (here or in spawned worker processes, `finished_jobs`), its
rows printed (`format_row`, `summary`) and written as JSON as they come (`write_json`), and an
unfinished run of the same command resumed (`unfinished_rows`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import importlib.metadata
import json
import multiprocessing
import os
import platform as host_platform
from typing import Any

import jax

from lra_jax.config.checks import apply_overrides
from lra_jax.research.compilation import compile_step, lowering, roofline, table2_report
from lra_jax.research.compilation.compile_step import Row
from lra_jax.measure import accelerators
from lra_jax.measure.units import gib

DEFAULT_TARGETS = "tpu-v5e:2x2,tpu-v4:2x2x1,h100,a100"

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
    rows = compile_step.compile_config(job.variant, job.label, config, target, job.modes)
    unfit = [row for row in rows if row.result == "does not fit"]
    if unfit and job.plan:
        plans = compile_step.plan_fit(job.variant, job.label, config, target, unfit)
        for row in unfit:
            row.plan = plans[row.mode]
            if row.plan["status"] == "error":
                row.result = "error"
    return rows


_WORKER_TARGETS: dict[str, Any] = {}  # a worker process's compile-only targets, built once each


def _start_worker() -> None:
    if "JAX_PLATFORMS" not in os.environ:
        jax.config.update("jax_platforms", "cpu")


def _run_in_worker(job: Job) -> list[Row]:
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


def format_row(row: Row) -> str:
    """One line per row (GiB per device), plus indented lines for an error, partial FLOPs, a plan."""
    memory = row.memory or {}
    flops = "-" if row.flops is None else f"{row.flops / 1e9:.1f}" + ("*" if row.flops_partial else "")
    checked = roofline.check(dataclasses.asdict(row))["modeled_seconds"]  # libtpu's time only within its band
    modeled = (f"{checked * 1e3:.2f}ms" if checked else
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


def configs(variants: list[str], tasks: list[str], lengths: list[int], scale: str, files: dict[str, str],
            overrides: list[str] = ()):
    """(variant, row label, config) to compile: each task's config (full-scale Text twice, as `lowering`),
    or with `lengths` the Table 2 protocol (`table2_report.config`) at each length, labelled "table2:<n>"; with
    `overrides` (`--config.KEY=VALUE`) applied to each (ConfigError for a bad one)."""
    if lengths:
        for variant in variants:
            for n in lengths:
                yield variant, f"{table2_report.LABEL}:{n}", apply_overrides(table2_report.config(variant, n), overrides, variant)
        return
    for variant, task, max_len in lowering.combinations(variants, tasks, scale):
        config = apply_overrides(lowering.load_config(files[variant], task, scale, max_len), overrides, variant)
        yield variant, (f"{task}:{config.max_len}" if max_len else task), config


def versions() -> dict[str, str]:
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
                "gpu_compiler_options": {"options": compile_step.GPU_COMPILER_OPTIONS,
                                         "note": "deviceless GPU compiles: GEMMs as cuBLAS calls (no autotuning "
                                                 "without a device, so no Triton GEMM tiling is chosen)"},
                "rows": [dataclasses.asdict(r) for r in rows]}
    if any(table2_report.length_of(r.task) for r in rows):
        document["table2"] = table2_report.relative(rows)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
