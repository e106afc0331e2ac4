r"""Full-scale LRA (ListOps and Pathfinder) with the LRA paper's recipe on one GPU (the `full-lra` stage of
`.ci/gpu-check`; the library and what each step does: `lra_jax.research.sweeps.full_lra_stage`).

    python -m lra_jax.tools.full_scale --time_box=500           # data, checks, runs: on every GPU, each shared
    python -m lra_jax.tools.full_scale --probe_runs_per_device=1,2,4,8   # how many runs should share a GPU
    python -m lra_jax.tools.full_scale --pack=full-lra.tar.gz   # the finished runs and the carried ones, to commit
    python -m lra_jax.tools.full_scale --scale=mini --precision_steps=2 \
        --override=listops:--config.num_train_steps=4 -- --config.batch_size=8

Runs land in <root>/<task>-<scale>/<variant>/seed0 (default root experiments/full-lra), each task's records
(precision.json, data.json) in <root>/<task>-<scale>/. `--config.*` overrides after `--` go to every run,
the checks' too; `--override=TASK:--config.KEY=VALUE` (repeatable) to one task's. SIGINT/SIGTERM or the
time box: the runs in progress checkpoint and stop; the same command resumes them. Exit 0 when every run
finished (or was already), 1 when one failed or crashed, 130 when stopped, 2 on bad input.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from lra_jax.errors import LraError
from lra_jax.research.sweeps import device_sharing, device_slots, full_lra_stage
from lra_jax.research.choices import choose
from lra_jax.research.progress import print_now
from lra_jax.research.sweeps.sweep_run import Stop, subprocess_runner
from lra_jax.tools import parse_command_line


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_enum("scale", "full", ["full", "mini"], "full: the paper's recipe; mini: the same stage "
                      "on the mini configs (a CPU test of the stage).", flag_values=values)
    flags.DEFINE_string("root", "experiments/full-lra", "Root of the runs (the layout the chart reads).",
                        flag_values=values)
    flags.DEFINE_string("scratch", "runs/full-scale-precision", "Root of the precision checks' runs "
                        "(never results: kept apart from --root).", flag_values=values)
    flags.DEFINE_string("tasks", ",".join(full_lra_stage.TASKS), "The tasks, taking turns variant by variant.",
                        flag_values=values)
    flags.DEFINE_string("variants", ",".join(full_lra_stage.VARIANTS), "The runs, in order (softmax first).",
                        flag_values=values)
    flags.DEFINE_integer("precision_steps", 300, "Steps of each precision-check run (float32 and bfloat16).",
                         flag_values=values)
    flags.DEFINE_integer("parallel", 0, "Runs at once (0: every device of the host times --runs_per_device).",
                         flag_values=values)
    flags.DEFINE_integer("runs_per_device", 0, "Runs that share one device (GPU: each preallocates its share "
                         f"of the memory; CPU: one core). 0: the best N recorded by --probe_runs_per_device in "
                         f"<root>/{device_sharing.RECORD}, else {full_lra_stage.RUNS_PER_DEVICE}.", flag_values=values)
    flags.DEFINE_list("probe_runs_per_device", [], "Train nothing: time N runs of --probe_task's softmax sharing one "
                      "device, for each N given, and record the best N in <root>/" + device_sharing.RECORD + ".",
                      flag_values=values)
    flags.DEFINE_enum("probe_task", "pathfinder", list(full_lra_stage.TASKS), "The task whose runs the probe times.",
                      flag_values=values)
    flags.DEFINE_integer("probe_steps", 100, "Timed steps of each process of the probe (after 10 untimed).",
                         flag_values=values)
    flags.DEFINE_float("time_box", 0, "Seconds from the start after which every run checkpoints and stops "
                       "(0: none); a run that cannot travel starts only when its estimated time fits.",
                       flag_values=values)
    flags.DEFINE_multi_string("override", [], "TASK:--config.KEY=VALUE, a config override of one task's runs "
                              "and check (repeatable).", flag_values=values)
    flags.DEFINE_string("pack", None, "Train nothing: write this tar.gz of the finished runs, the records and "
                        "the carried runs (names relative to --root: unpack with `tar -xzf FILE -C ROOT`).",
                        flag_values=values)


def task_overrides(given: list[str], tasks: list[str], common: list[str]) -> dict[str, list[str]]:
    """task -> its overrides: `common` (after `--`), then those of `--override=TASK:FLAG`."""
    out = {task: list(common) for task in tasks}
    for item in given:
        task, _, flag = item.partition(":")
        if task not in out or not flag.startswith("--config."):
            raise LraError(f"--override={item}: expected TASK:--config.KEY=VALUE with TASK one of {', '.join(tasks)}")
        out[task].append(flag)
    return out


def probe(args: flags.FlagValues, overrides: list[str]) -> None:
    """--probe_runs_per_device: the record, written under --root and printed."""
    counts = [int(n) for n in args.probe_runs_per_device]
    record = full_lra_stage.read_record(args.root, args.probe_task, args.scale)
    run = full_lra_stage.main_runs(args.scale, args.root, {args.probe_task: record["dtype"] if record else "float32"},
                               [full_lra_stage.CHECK_VARIANT], {args.probe_task: overrides})[0]
    config_args = [a for a in run.command if a.startswith("--config")]
    result = device_sharing.probe(config_args, counts, args.probe_steps, warmup=10, log=print_now)
    path = full_lra_stage.write_json(os.path.join(args.root, device_sharing.RECORD), result)
    print(f"best: {result['best']} run(s) per device ({result['rule']}); record in {path}")


def main(argv: list[str] | None = None) -> None:
    args, common = parse_command_line("lra_jax.tools.full_scale", __doc__, define_flags, argv,
                                      positionals="[-- --config.KEY=VALUE ...]")
    try:
        tasks = choose(args.tasks, list(full_lra_stage.TASKS), "task")
        if args.pack:
            names, left = full_lra_stage.pack(args.root, args.scale, args.pack, tuple(tasks))
            print(f"packed {len(names)} files into {args.pack}: " + (", ".join(names) or "nothing finished yet"))
            for line in left:
                print(f"not carried: {line}")
            return
        overrides = task_overrides(args.override, tasks, common)
        if args.probe_runs_per_device:
            probe(args, overrides.get(args.probe_task, list(common)))
            return
        variants = choose(args.variants, list(full_lra_stage.VARIANTS), "variant")
        per_device = args.runs_per_device or device_sharing.read_best(args.root) or full_lra_stage.RUNS_PER_DEVICE
        parallel = args.parallel or device_slots.count() * per_device
        print_now(f"{parallel} run(s) at once, {per_device} per device")
        slots = device_slots.slots("auto", parallel, 1, per_device) if parallel > 1 or per_device > 1 else [None]
        with Stop() as stop:
            outcome = full_lra_stage.run_stage(args.scale, os.path.abspath(args.root), os.path.abspath(args.scratch),
                                           tasks, variants, args.precision_steps, overrides,
                                           subprocess_runner(stop, log_to_workdir=len(slots) > 1), stop, slots,
                                           args.time_box, log=print_now)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if outcome == "stopped":
        print("stopped; run the same command to continue (finished runs are skipped, interrupted ones resume)")
        sys.exit(130)
    sys.exit(1 if outcome == "failed" else 0)


def cli() -> None:
    """The command (`python -m lra_jax.tools.full_scale`, `lra-full-scale`)."""
    main()


if __name__ == "__main__":
    cli()
