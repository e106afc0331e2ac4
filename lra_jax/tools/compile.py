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
  a model, not a measurement, printed only where it passes its roofline check (`lra_jax.research.
  roofline`, docs/tpu-modeled-time.md): no loop in the step (the model counts a loop body once), no
  Mosaic kernel it does not time, and within 1-2x the roofline of the step's counts (libtpu's figure can
  be off by whole seconds). Otherwise, where the counts are complete, the roofline is printed instead
  (`roofline_seconds`, with an "r": its FLOPs at the chip's peak or its bytes at HBM bandwidth, whichever
  takes longer; also a model). GPU memory here is compiled without a GPU: an estimate, not a measurement
  (docs/gpu-memory.md);
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

import os
import sys
import time

import jax
from absl import flags

from lra_jax import provenance
from lra_jax.config import checks as config_errors
from lra_jax.data.tasks import TASKS
from lra_jax.errors import LraError
from lra_jax.research.compilation import compile_matrix, compile_step, lowering, table2_report
from lra_jax.research.choices import choose, config_files, parse_lengths
from lra_jax.research.compilation.compile_matrix import (
    DEFAULT_TARGETS,
    HEADER,
    Job,
    format_row,
    summary,
)
from lra_jax.research.compilation.compile_step import MODES, Row
from lra_jax.measure import accelerators
from lra_jax.tools import command_arguments, parse_command_line


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("targets", DEFAULT_TARGETS, "comma-separated lra_jax.measure.accelerators names",
                        flag_values=values)
    flags.DEFINE_string("variants", "all", "'all' or comma-separated attention names", flag_values=values)
    flags.DEFINE_string("tasks", "all", "'all' or comma-separated LRA tasks", flag_values=values)
    flags.DEFINE_string("scale", "full", "full | mini", flag_values=values)
    flags.DEFINE_string("steps", "train,eval", "train, eval or both", flag_values=values)
    flags.DEFINE_enum("plan", "true", ["true", "false"],
                      "plan a train step that does not fit (compiles a few more times)", flag_values=values)
    flags.DEFINE_integer("per_device_batch", 0,
                         "examples per device instead of the config's global batch split over the target "
                         "(the Table 2 run on tpu-v3:4x4 uses 8: docs/tpu-modeled-time.md); 0: the config's",
                         flag_values=values)
    flags.DEFINE_string("lengths", "",
                        "the LRA paper's Table 2 protocol at these lengths (e.g. 1024,2048,3072,4096) "
                        "instead of --tasks: the bench's Text model", flag_values=values)
    flags.DEFINE_enum("impl", "auto", ["auto", "xla", "pallas"],
                      "config.attention.impl of every config; auto leaves each config's own "
                      "(xla: the LRA paper's Table 2 setting)", flag_values=values)
    flags.DEFINE_float("attention_dropout_rate", None,
                       "config.model.attention_dropout_rate of every config (0: TPU softmax and the "
                       "block-sparse variants train on splash attention); default: each config's own",
                       flag_values=values)
    flags.DEFINE_float("dropout_rate", None,
                       "config.model.dropout_rate (residual and MLP) of every config; with "
                       "--attention_dropout_rate=0 and 0 here a step without dropout; default: each config's own",
                       flag_values=values)
    flags.DEFINE_string("out", "", "write the rows as JSON here (e.g. experiments/results/...)", flag_values=values)
    flags.DEFINE_integer("parallel", 1,
                         "compile in this many processes at once (each takes a core and up to ~3 GiB of "
                         "host memory at full scale); the rows and the JSON do not depend on it", flag_values=values)


def parse(argv: list[str] | None = None) -> tuple[flags.FlagValues, list[str]]:
    """The flags and the `--config.KEY=VALUE` overrides after them (config_errors.apply_overrides)."""
    return parse_command_line("lra_jax.tools.compile", __doc__, define_flags, argv,
                              positionals="[--config.KEY=VALUE ...]", pass_unknown=True)


def main(argv: list[str] | None = None) -> int:
    argv = command_arguments(argv)
    args, overrides = parse(argv)
    if "JAX_PLATFORMS" not in os.environ:
        jax.config.update("jax_platforms", "cpu")  # compile-only targets; no local accelerator needed

    try:
        files = config_files()
        variants = choose(args.variants, sorted(files), "variant")
        tasks = choose(args.tasks, list(TASKS), "task")
        modes = tuple(choose(args.steps, list(MODES), "step"))
        lengths = parse_lengths(args.lengths, required=False)
        if args.per_device_batch < 0:
            raise LraError(f"--per_device_batch must be >= 0, got {args.per_device_batch}")
        if args.parallel < 1:
            raise LraError(f"--parallel must be >= 1, got {args.parallel}")
        for flag in ("dropout_rate", "attention_dropout_rate"):
            rate = getattr(args, flag)
            if rate is not None and not 0 <= rate < 1:
                raise LraError(f"--{flag} must be in [0, 1), got {rate}")
        if args.scale not in lowering.SCALES:
            raise LraError(f"unknown scale {args.scale!r}; choose full or mini")
        config_errors.check_override_form(overrides)
        matrix = list(compile_matrix.configs(variants, tasks, lengths, args.scale, files, overrides))
        names = [n.strip() for n in args.targets.split(",") if n.strip()]
        if not names:
            raise LraError(f"no targets given; choose from {accelerators.describe_names()}")
        targets = [accelerators.get(name) for name in names]
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    start, commit = time.perf_counter(), provenance.source_commit()
    done, earlier_seconds, earlier_commit = compile_matrix.unfinished_rows(args.out, argv) if args.out else ({}, 0.0, None)
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
    for index, job_rows in compile_matrix.finished_jobs(jobs, by_name, args.parallel):
        results[job_slot[index]] = job_rows
        print("\n".join(map(format_row, job_rows)), flush=True)
        if args.out:  # after every job: a long matrix cut short keeps what it compiled
            finished = [row for slot in results if slot for row in slot]
            compile_matrix.write_json(args.out, argv, finished, time.perf_counter() - start, complete=False, commit=commit)
    rows = [row for slot in results for row in slot]
    seconds = time.perf_counter() - start
    print(summary(rows))
    if lengths:
        print(table2_report.format_table(table2_report.relative(rows), table2_report.paper_figures()))
    print(f"{len(rows)} steps compiled ({args.scale} scale) in {seconds:.0f} s; GiB and GFLOP per device, "
          "* = partial FLOPs (loops counted once, kernels without an estimate as 0); modeled = the TPU compiler's "
          "model, printed only within 1-2x of its roofline (docs/tpu-modeled-time.md; r: that roofline of the step's "
          "FLOPs and bytes instead), not measured"
          + ("; " + compile_step.DEVICELESS_GPU_MEMORY if any(not r.target.startswith("tpu") for r in rows) else ""))
    if args.out:
        compile_matrix.write_json(args.out, argv, rows, seconds, complete=True, commit=commit)
        print(f"wrote {args.out}")
    return 1 if any(r.failed for r in rows) else 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.compile`, `lra-compile`)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
