r"""A grid of training runs (variants x tasks x scales x grid points x seeds): local, parallel, resumable,
or emitted for a cluster; with a grid, each (variant, task) is reported at the point chosen on validation.

    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=mini --seeds=0,1,2 --root=runs/sweep
    python -m lra_jax.tools.sweep --variants=all --tasks=pathfinder --seeds=0,1,2 \
        --grid=optimizer.learning_rate=1e-3,5e-3 --protocol=two_stage --parallel=2 --root=runs/sweep
    python -m lra_jax.tools.sweep --variants=softmax,linformer --tasks=listops --dry_run   # the commands, totals
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=mini --estimate      # how long it will take
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --emit > commands.txt
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --emit --distributed   # multi-host form
    python -m lra_jax.tools.sweep --variants=softmax --tasks=listops -- --config.num_train_steps=100
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --executor=slurm --partition=gpu \
        --time=12:00:00 --max_running=16       # submit to Slurm (again: only what is missing or failed)
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --status   # each run's state

Each run is

    python -m lra_jax.train --config=configs/<file>.py:<task>,<scale> \
        --workdir=<root>/<task>-<scale>/<variant>/[<point>/]seed<k> --config.seed=<k> [<point's overrides>]

(plus any `--config.*` overrides given after `--`). `--grid=KEY=V1,V2,...` (repeatable: several axes
make a product) trains every value of any config key; a grid point is a directory `KEY=V[,KEY=V]`.
Protocols (`--protocol`): `grid` trains every point at every seed; `two_stage` trains every point at
the first seed, then the other seeds only at the point that seed's validation accuracy chose (the
second stage of a (variant, task) starts as soon as its first stage is finished). Either way the
reported point is the one with the best mean validation accuracy over the seeds every point has,
and its test accuracy is given as mean +- std over its seeds (lra_jax.research.sweeps.selection); test
accuracy never takes part in the choice.

`--parallel=N` runs N runs at once, each on its own devices (`--devices_per_run`, default 1; see
lra_jax.research.sweeps.device_slots): CPU cores pinned by affinity, GPUs by CUDA_VISIBLE_DEVICES, TPU chips by
libtpu's visibility variables. `--runs_per_device=K` lets K runs share each device (a small model leaves a
GPU mostly idle): on a GPU each preallocates 0.9/K of its memory. With N > 1 each run's output goes to
<workdir>/train.log.

A run whose results.json exists is skipped; an interrupted run is started again and resumes from
its checkpoint (the trainer does that). A run that stopped on a non-finite loss (its results.json
says "diverged", with no accuracy) is reported as `diverged` and not retried: it would diverge
again the same way. A finished run is judged against the config its command
trains now: if that asks for more steps under LRA's rsqrt schedule, it resumes (a cosine schedule ends
at its last step: a longer run is another run, "stale"); if it differs in what a run cannot change on
resume (model, optimizer, data, ...), the run is "stale": skipped and reported with the settings
that differ, its results kept (delete its workdir to train it again with the current config). A run
that finishes stale was trained by code changed while the sweep ran; the next sweep judges it afresh. A
failed run is logged and the sweep goes on; the exit status is 1 if any run failed, crashed or was
interrupted from outside the sweep (the trainer's exit status 75). Every run's config is built and checked
before anything is reported: a misspelled or out-of-range override after `--` is one line and exit 2. A run whose process
died from a signal (SIGKILL from the out-of-memory killer, a segfault) is recorded as `crashed` with the
last lines of its output, and the sweep goes on; run the sweep again to resume it from its checkpoint.
A results.json or metrics.jsonl that cannot be read (truncated by a full disk or a bad copy) is reported
in one line and its run treated as unfinished: it is started again and ends again from its checkpoints.
A results.json that its run's metrics.jsonl or config.json does not back (an accuracy edited by hand, or
not in [0, 1]; lra_jax.training.run_result) makes its run `damaged`: named in one line, never trained over,
and the exit status is 1.
SIGINT/SIGTERM: every running child gets SIGTERM, saves a checkpoint and exits; the sweep then stops
(run the same command to continue).

`--executor` chooses where the runs train (`lra_jax.research.sweeps.sweep_executors`): `local` here, and
`slurm` submits the runs that are neither finished nor queued as one Slurm array job of
scripts/slurm_sweep.sbatch (one task per run, resources from --partition, --account, --time,
--gpus_per_run, --cpus_per_run, --mem, --max_running) and records its id in <root>/slurm/jobs.json;
`--status` gives each run's state from its results.json and Slurm's view (lra_jax.research.sweeps.slurm).
A task that gets SIGTERM (its time limit, a preemption) checkpoints, requeues itself and resumes.

`--estimate` runs `train --estimate --json` once for each distinct run shape (runs that differ only in seed
or optimizer settings share one): the train step is compiled and timed on random tokens, and each
run's training time is projected as compilation + num_train_steps x seconds per step (evaluation and
data preparation excluded). With `--target=tpu-v5e:2x2` (a compile target) nothing is timed here: each
shape's train step is compiled for that slice and the runs are given in chip-hours from the TPU
compiler's modeled step time (`lra_jax.research.sweeps.sweep_modeled`), labelled modeled.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from lra_jax.errors import LraError
from lra_jax.research.sweeps import device_slots, slurm, sweep_modeled
from lra_jax.research.sweeps.sweep_plan import (
    PROTOCOLS,
    check_configs,
    parse_grid,
    plan,
    protocol_runs,
    second_stage_stand_ins,
)
from lra_jax.research.sweeps.sweep_executors import LocalExecutor, SlurmExecutor
from lra_jax.research.sweeps.sweep_report import capture_output, estimate_runs, estimate_table, plan_lines
from lra_jax.tools import parse_command_line


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("variants", "all", "'all' (every variant with a configs/ file) or a comma list.",
                        flag_values=values)
    flags.DEFINE_string("tasks", "all", "'all' or a comma list of tasks (lra_jax.data.tasks.names()).",
                        flag_values=values)
    flags.DEFINE_list("scales", ["mini"], "Comma list of scales: full, mini.", flag_values=values)
    flags.DEFINE_list("seeds", ["0"], "Comma list of seeds (with --protocol=two_stage the first one "
                      "trains the whole grid).", flag_values=values)
    flags.DEFINE_multi_string("grid", [], "KEY=V1,V2,...: train every value of config key KEY (e.g. "
                              "optimizer.learning_rate=1e-3,5e-3); repeat the flag for a product of axes.",
                              flag_values=values)
    flags.DEFINE_enum("protocol", "grid", PROTOCOLS, "grid: every grid point at every seed; two_stage: every "
                      "point at the first seed, the other seeds at the point chosen on its validation accuracy.",
                      flag_values=values)
    flags.DEFINE_list("pretrain", ["none"], "Comma list of none (from scratch), spt (self-pretraining: masked "
                      "tokens on the task's training split, then the same fine-tuning; runs under spt/).",
                      flag_values=values)
    flags.DEFINE_integer("pretrain_steps", 0, "Pretraining steps of each spt run (0: as many as its fine-tuning steps).",
                         flag_values=values)
    flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own devices (CPU cores, GPUs or TPU chips).",
                         flag_values=values)
    flags.DEFINE_enum("devices", "auto", device_slots.KINDS, "What --parallel shares out (auto: GPUs if any, "
                      "else TPU chips if any, else CPU cores).", flag_values=values)
    flags.DEFINE_integer("devices_per_run", 1, "Devices (cores, GPUs, TPU chips) of each run with --parallel.",
                         flag_values=values)
    flags.DEFINE_integer("runs_per_device", 1, "Runs that share each device (group) with --parallel: for small "
                         "models that leave a GPU mostly idle; each then preallocates its share of the GPU's memory. "
                         "Not on TPU (a chip belongs to one process).", flag_values=values)
    flags.DEFINE_string("root", os.path.join("runs", "sweep"), "Root of the run directories.", flag_values=values)
    flags.DEFINE_bool("emit", False, "Print one train command per unfinished run (for a cluster) and exit.",
                      flag_values=values)
    flags.DEFINE_bool("distributed", False, "With --emit: the multi-host form, each command with --distributed, "
                      "to be run on every host of a TPU VM slice or every node of a Slurm job at once.",
                      flag_values=values)
    flags.DEFINE_bool("dry_run", False, "Print the plan and exit: each run's state (done / resume / new) and train "
                      "command, ready to paste into a shell, then the totals (runs, done, to run; waiting cells).",
                      flag_values=values)
    flags.DEFINE_bool("estimate", False, "Train nothing: time a few steps of each distinct unfinished run "
                      "shape on random tokens (`train --estimate`, no data needed) and print each run's "
                      "projected training time and the total.", flag_values=values)
    flags.DEFINE_enum("executor", "local", ["local", "slurm"], "local: train here (--parallel); slurm: submit "
                      "the runs not finished and not queued as one Slurm array job (scripts/slurm_sweep.sbatch), "
                      "job ids recorded in <root>/slurm/jobs.json.", flag_values=values)
    flags.DEFINE_bool("status", False, "Print each run's state (done, pending, running, requeued, failed, not "
                      "submitted) from its results.json and Slurm's view of the recorded jobs, and exit.",
                      flag_values=values)
    flags.DEFINE_string("partition", "", "--executor=slurm: the Slurm partition (default: the cluster's).",
                        flag_values=values)
    flags.DEFINE_string("account", "", "--executor=slurm: the Slurm account to charge (default: yours).",
                        flag_values=values)
    flags.DEFINE_string("time", "24:00:00", "--executor=slurm: time limit per run; 5 min before it the run "
                        "checkpoints, and is requeued to resume.", flag_values=values)
    flags.DEFINE_integer("gpus_per_run", 1, "--executor=slurm: GPUs per run (--gres=gpu:N; 0 for none).",
                         flag_values=values)
    flags.DEFINE_integer("cpus_per_run", 8, "--executor=slurm: CPU cores per run (--cpus-per-task).",
                         flag_values=values)
    flags.DEFINE_string("mem", "", "--executor=slurm: memory per run, e.g. 64G (default: the cluster's).",
                        flag_values=values)
    flags.DEFINE_integer("max_running", 0, "--executor=slurm: array tasks running at once (0: no limit).",
                         flag_values=values)
    flags.DEFINE_string("target", "", "With --estimate: no timing here; chip-hours modeled by the TPU compiler for "
                        "this compile target (e.g. tpu-v5e:2x2; lra_jax.research.sweeps.sweep_modeled), labelled modeled.",
                        flag_values=values)

# ----------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_command_line("lra_jax.tools.sweep", __doc__, define_flags, argv,
                                         positionals="[-- --config.KEY=VALUE ...]")
    try:
        runs = plan(args.variants, args.tasks, args.scales, args.seeds, args.root, overrides,
                    grid=parse_grid(args.grid, overrides), pretraining=args.pretrain,
                    pretrain_steps=args.pretrain_steps)
        check_configs(runs)
        for name, least, what in (("parallel", 1, "runs at once"), ("devices_per_run", 1, "devices per run"),
                                  ("runs_per_device", 1, "runs sharing each device"),
                                  ("gpus_per_run", 0, "GPUs per Slurm run"), ("cpus_per_run", 1, "CPU cores per Slurm run"),
                                  ("max_running", 0, "Slurm array tasks at once (0: no limit)")):
            if args[name].value < least:
                raise LraError(f"--{name}={args[name].value}: give {least} or more {what}")
        if args.status and not os.path.isdir(args.root):
            raise LraError(f"--root={args.root} does not exist: no run of this sweep was made or submitted there; "
                           "check --root")
        now, waiting = protocol_runs(runs, args.protocol)
        slots = (device_slots.slots(args.devices, args.parallel, args.devices_per_run, args.runs_per_device)
                 if args.parallel > 1 or args.devices_per_run > 1 or args.runs_per_device > 1 else [None])
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    pending = (f"{len(waiting)} (variant, task) cells wait for their first stage (seed {args.seeds[0]} at every "
               f"grid point) before their other seeds can be planned: {', '.join(waiting)}") if waiting else ""
    if args.emit:
        for r in now:
            if r.state() == "stale":
                print(f"note: {r.name} finished with another config ({', '.join(r.changes())} differ); "
                      f"not emitted: delete {r.workdir} to train it with the current one", file=sys.stderr)
            elif r.state() == "diverged":
                print(f"note: {r.name} {r.divergence()}; not emitted", file=sys.stderr)
            elif r.state() == "damaged":
                print(f"note: {r.damage()}; not emitted", file=sys.stderr)
            elif r.state() != "done":
                print(r.shell_command(*(["--distributed"] if args.distributed else [])))
        if pending:
            print(f"note: {pending}; emit again once those runs are finished", file=sys.stderr)
        return
    if args.estimate and args.target:
        sys.exit(sweep_modeled.estimate_sweep(now + second_stage_stand_ins(runs, waiting), args.target))
    if args.estimate:
        stand_ins = second_stage_stand_ins(runs, waiting)
        rows = estimate_runs(now + stand_ins, capture_output)
        print("\n" + estimate_table(rows, args.parallel))
        if stand_ins:
            print(f"({len(stand_ins)} second-stage runs counted at their cell's first grid point, "
                  "as the chosen one is not known yet)")
        sys.exit(1 if any(r["status"] != "ok" for r in rows) else 0)
    if args.dry_run:
        print("\n".join(plan_lines(runs, now)))
        if pending:
            print(f"waiting  {pending}")
        return
    if args.status:
        sys.exit(status(args.root, now))
    executor = (SlurmExecutor(args.root, slurm.Options(args.partition, args.account, args.time, args.gpus_per_run,
                                                       args.cpus_per_run, args.mem, args.max_running))
                if args.executor == "slurm" else LocalExecutor(slots))
    code = executor.execute(lambda: protocol_runs(runs, args.protocol)[0], pending)
    if code:
        sys.exit(code)


def status(root: str, now: list) -> int:
    """--status: each run's state from its results.json and Slurm's view; the exit status."""
    try:
        print(slurm.status_table(now, slurm.states(now, root)))
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.sweep`, `lra-sweep`)."""
    main()


if __name__ == "__main__":
    cli()
