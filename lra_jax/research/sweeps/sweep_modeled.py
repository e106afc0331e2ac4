"""`sweep --estimate --target=NAME`: a sweep's training time in chip-hours on a TPU slice, modeled by the
TPU compiler (each distinct run shape's train step compiled once for the target), never measured.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax

from lra_jax.errors import LraError
from lra_jax.research.compilation import compile_step, roofline
from lra_jax.research.sweeps import sweep_plan
from lra_jax.research.compilation.compile_step import Row
from lra_jax.measure import accelerators


def modeling_config(config):
    """(the run's train step as the TPU cost model counts it, the factor its modeled time is multiplied by).

    The model counts a loop body once (`compile_step.loops_in`), so scanned layers would be modeled as one layer and
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
    once per distinct run shape (`sweep_plan.shape_key`) as `modeling_config` lays it out. A modeled time is
    used only where it passes its roofline check (`roofline.check`: no loop left in the step, e.g. a
    variant's own such as additive's query chunks, and within 1-2x the roofline of XLA's counts); a run
    whose time does not is not counted and its reason is printed. Evaluation, data and compilation are not counted.
    Returns the exit status: 2 on a bad target, 1 if a step did not compile, else 0."""
    if "JAX_PLATFORMS" not in os.environ:
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
    total, failed, unmodeled, unfit = 0.0, 0, 0, 0
    log(f"{'run':<48} {'modeled ms':>10} {'steps':>7} {'chip-hours':>11}   (modeled for {target.name}, "
        f"{chips} chips; not measured)")
    for r in runs:
        if r.state() in sweep_plan.FINAL:
            continue
        key = sweep_plan.shape_key(r)
        if key not in measured:
            config, accum = modeling_config(sweep_plan.train_config(r.command))
            (row,) = compile_step.compile_config(r.variant, r.task, config, target, modes=("train",))
            measured[key] = row, accum
        row, accum = measured[key]
        steps = sweep_plan.train_config(r.command).num_train_steps
        checked = roofline.check(dataclasses.asdict(row))["modeled_seconds"]
        if checked is None:
            if row.failed:
                failed += 1
                why = f"error: {row.error}"
            elif row.result == "does not fit":
                unfit += 1
                why = "does not fit as configured (`compile` prints the accumulation that fits)"
            else:
                unmodeled += 1
                why = roofline.check(dataclasses.asdict(row))["reason"]
            log(f"{r.name:<48} {why}")
            continue
        seconds = accum * checked
        hours = steps * seconds * chips / 3600
        total += hours
        log(f"{r.name:<48} {seconds * 1e3:>10.2f} {steps:>7} {hours:>11.3f}")
    log(f"total: {total:.2f} chip-hours modeled by the XLA TPU compiler for {target.name} (training steps only; "
        "modeled times within 1-2x of their roofline, docs/tpu-modeled-time.md)"
        + (f"; not counted: {unmodeled} runs without a modeled time that passed its roofline check "
           "(Mosaic kernels, loops, a negative or out-of-band time)" if unmodeled else "")
        + (f"; not counted: {unfit} runs that do not fit as configured" if unfit else "")
        + (f"; {failed} runs failed to compile" if failed else ""))
    return 1 if failed else 0
