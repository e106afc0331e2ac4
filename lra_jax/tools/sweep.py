r"""A grid of training runs (variants x tasks x scales x seeds): local, resumable, or emitted for a cluster.

    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=mini --seeds=0,1,2 --root=runs/sweep
    python -m lra_jax.tools.sweep --variants=softmax,linformer --tasks=listops --dry_run   # show the plan
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=mini --estimate      # how long it will take
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --emit > commands.txt
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --emit --distributed   # multi-host form
    python -m lra_jax.tools.sweep --variants=softmax --tasks=listops -- --config.num_train_steps=100

Each run is

    python -m lra_jax.train --config=configs/<file>.py:<task>,<scale> \
        --workdir=<root>/<task>-<scale>/<variant>/seed<k> --config.seed=<k>

(plus any `--config.*` overrides given after `--`), run one after another as subprocesses.
A run whose results.json exists is skipped; an interrupted run is started again and resumes from
its checkpoint (the trainer does that). A run that stopped on a non-finite loss (its results.json
says "diverged", with no accuracy) is reported as `diverged` and not retried: it would diverge
again the same way. A finished run is judged against the config its command
trains now: if that asks for more steps, it resumes; if it differs in what a run cannot change on
resume (model, optimizer, data, ...), the run is "stale": skipped and reported with the settings
that differ, its results kept (delete its workdir to train it again with the current config). A failed run is logged and the sweep goes on; the exit
status is 1 if any run failed. SIGINT/SIGTERM: the running child gets SIGTERM, saves a checkpoint
and exits; the sweep then stops (run the same command to continue).

`--estimate` runs each unfinished run's command with `--estimate` instead: the train step is
compiled and timed on random tokens of the run's shape, and the run's training time is projected
as compilation + num_train_steps x seconds per step (evaluation and data preparation excluded).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from lra_jax import config_paths
from lra_jax.errors import ConfigError, LraError
from lra_jax.tools.progress import print_now

REPO = config_paths.REPO_ROOT  # where the runs' relative config paths start

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command-line flags (defined only when run as a command, so modules import side by side)."""
    flags.DEFINE_string("variants", "all", "'all' (every variant with a configs/ file) or a comma list.")
    flags.DEFINE_string("tasks", "all", "'all' or a comma list of tasks (lra_jax.data.tasks.names()).")
    flags.DEFINE_list("scales", ["mini"], "Comma list of scales: full, mini.")
    flags.DEFINE_list("seeds", ["0"], "Comma list of seeds.")
    flags.DEFINE_string("root", os.path.join("runs", "sweep"), "Root of the run directories.")
    flags.DEFINE_bool("emit", False, "Print one train command per unfinished run (for a cluster) and exit.")
    flags.DEFINE_bool("distributed", False, "With --emit: the multi-host form, each command with --distributed, "
                      "to be run on every host of a TPU VM slice or every node of a Slurm job at once.")
    flags.DEFINE_bool("dry_run", False, "Print the plan (done / resume / new) and exit.")
    flags.DEFINE_bool("estimate", False, "Train nothing: time a few steps of every unfinished run on random "
                      "tokens (`train --estimate`, one process each, no data needed) and print each run's "
                      "projected training time and the total.")


# ----------------------------------------------------------------------------- variants -> config files

def config_files(configs_dir: str | None = None) -> dict[str, str]:
    """Registered variant -> its config file relative to the repository root, for those that have one.

    A path lookup (`config_paths.variant_path`): no config file is imported to find it."""
    from lra_jax.attention import registry

    found = {name: config_paths.variant_path(name, configs_dir) for name in registry.names()}
    return {name: os.path.relpath(path, REPO) for name, path in found.items() if path is not None}


# ----------------------------------------------------------------------------- the plan

@dataclasses.dataclass
class Run:
    task: str
    scale: str
    variant: str
    seed: int
    workdir: str
    command: list[str]

    @property
    def name(self) -> str:
        return f"{self.task}-{self.scale}/{self.variant}/seed{self.seed}"

    def state(self) -> str:
        """'done', 'diverged' (stopped on a non-finite loss: final, like done), 'stale' (finished
        or diverged with a config that differs in `changes`), 'resume' (has checkpoints, or
        finished fewer steps than the config now asks) or 'new'."""
        results = self.results()
        if results is not None:
            if self.changes():
                return "stale"
            if results.get("status") == "diverged":
                return "diverged"
            trained = results.get("num_train_steps")
            asked = trained and (self.config or {}).get("num_train_steps")
            return "resume" if asked and trained < asked else "done"
        if os.path.isdir(os.path.join(self.workdir, "checkpoints")):
            return "resume"
        return "new"

    def results(self) -> dict | None:
        return read_json(os.path.join(self.workdir, "results.json"))

    def divergence(self) -> str:
        """Where a diverged run stopped, for the logs."""
        results = self.results() or {}
        return (f"diverged at step {results.get('diverged_at_step')} (loss {results.get('loss')}); "
                f"not a result: delete {self.workdir} to train it again")

    def changes(self) -> list[str]:
        """The settings in which the workdir's config.json differs from `config`, except those a
        run may change on resume (`trainer.config_changes`); [] when either is unknown."""
        from lra_jax import trainer

        saved = read_json(os.path.join(self.workdir, "config.json"))
        return trainer.config_changes(saved, self.config) if saved and self.config else []

    @functools.cached_property
    def config(self) -> dict | None:
        """The config this run's command trains, as JSON; None if it cannot be built (the train
        command then reports why)."""
        try:
            return json.loads(train_config(self.command).to_json())
        except Exception:  # noqa: BLE001 - any error in a user's config file: let `train` name it
            return None


def train_config(command: list[str]) -> ml_collections.ConfigDict:
    """The config a train command's --config file and --config.* overrides give, parsed as `train` does
    (a relative config path is taken from the repository root, where the sweep runs its commands)."""
    args = [a for a in command if a.startswith("--config")]
    spec = next(a.split("=", 1)[1] for a in args if a.startswith("--config="))
    args = ["train", *(f"--config={os.path.join(REPO, spec)}" if a.startswith("--config=") else a for a in args)]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "config file", flag_values=values, lock_config=True,
                                    sys_argv=args)  # where it looks for the --config.* overrides
    with warnings.catch_warnings():  # ml_collections loads the file with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        values(args)
        return values.config


def read_json(path: str) -> dict | None:
    """The JSON object in `path`; None if there is none (or it is unreadable: then the run is redone)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _select(spec: str, known: list[str], what: str) -> list[str]:
    if spec.strip() == "all":
        return list(known)
    chosen = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in known]
    if unknown or not chosen:
        raise ConfigError(f"unknown {what} {', '.join(unknown) or repr(spec)}; known: {', '.join(known)}")
    return chosen


def plan(variants: str, tasks: str, scales: list[str], seeds: list[str], root: str,
         overrides: list[str] = (), files: dict[str, str] | None = None,
         task_names: list[str] | None = None, python: str = sys.executable) -> list[Run]:
    """Every run of the grid, in order task, scale, variant, seed."""
    from lra_jax.attention import registry
    from lra_jax.data import tasks as task_registry

    files = config_files() if files is None else files
    chosen = _select(variants, registry.names(), "variant")
    missing = [v for v in chosen if v not in files]
    if missing and variants.strip() != "all":
        raise ConfigError(f"no config file for variant {', '.join(missing)}: add configs/<file>.py whose "
                          f"attention.name is it (variants with one: {', '.join(sorted(files))})")
    for v in missing:
        print(f"note: variant {v} has no configs/ file; skipped", file=sys.stderr)
    chosen = [v for v in chosen if v in files]
    task_list = _select(tasks, task_names or task_registry.names(), "task")
    bad_scales = [s for s in scales if s not in ("full", "mini")]
    if bad_scales:
        raise ConfigError(f"unknown scale {', '.join(bad_scales)}; known: full, mini")
    try:
        seed_list = [int(s) for s in seeds]
    except ValueError as error:
        raise ConfigError(f"--seeds must be integers, got {','.join(seeds)}") from error
    for o in overrides:
        if not o.startswith("--config."):
            raise ConfigError(f"extra argument {o!r}: only --config.* overrides may follow '--'")
    runs = []
    for task, scale, variant, seed in itertools.product(task_list, scales, chosen, seed_list):
        workdir = os.path.join(root, f"{task}-{scale}", variant, f"seed{seed}")
        command = [python, "-m", "lra_jax.train", f"--config={files[variant]}:{task},{scale}",
                   f"--workdir={workdir}", f"--config.seed={seed}", *overrides]
        runs.append(Run(task, scale, variant, seed, workdir, command))
    return runs


# ----------------------------------------------------------------------------- running

class _Stop:
    """SIGINT/SIGTERM -> forward SIGTERM to the running child (it checkpoints) and stop the sweep."""

    def __init__(self):
        self.requested = False
        self.child: subprocess.Popen | None = None
        self.previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True
        print(f"\nsweep: {signal.Signals(signum).name}: asking the running run to checkpoint and stop...",
              file=sys.stderr, flush=True)
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def subprocess_runner(stop: _Stop) -> Callable[[list[str], str], int]:
    """Runs a command in its own session (a terminal Ctrl-C reaches only the sweep, which forwards it)."""

    def run(command: list[str], cwd: str) -> int:
        stop.child = subprocess.Popen(command, cwd=cwd, start_new_session=True)
        try:
            return stop.child.wait()
        finally:
            stop.child = None

    return run


def run_sweep(runs: list[Run], runner: Callable[[list[str], str], int], stop: _Stop | None = None,
              log: Callable[[str], None] = print_now, cwd: str = REPO) -> list[dict]:
    """Runs the unfinished runs in order; returns one summary row per run."""
    summary = []
    for i, r in enumerate(runs, 1):
        before = r.state()
        row = {"run": r.name, "before": before, "status": "skipped", "seconds": 0.0, "workdir": r.workdir}
        summary.append(row)
        if before == "done":
            log(f"[{i}/{len(runs)}] {r.name}: done, skipped")
            continue
        if before == "diverged":
            row["status"], row["error"] = "diverged", r.divergence()
            log(f"[{i}/{len(runs)}] {r.name}: {row['error']}")
            continue
        if before == "stale":
            row["status"] = "stale"
            row["error"] = (f"finished with another config ({', '.join(r.changes())} differ); "
                            f"delete {r.workdir} to train it with the current one")
            log(f"[{i}/{len(runs)}] {r.name}: {row['error']}")
            continue
        if stop is not None and stop.requested:
            row["status"] = "not started"
            continue
        log(f"[{i}/{len(runs)}] {r.name}: {'resuming' if before == 'resume' else 'starting'}\n  "
            + shlex.join(r.command))
        start = time.perf_counter()
        try:
            code = runner(r.command, cwd)
        except OSError as error:
            code, row["error"] = -1, str(error)
        row["seconds"] = time.perf_counter() - start
        row["exit_code"] = code
        after = r.state()
        if after == "done":
            row["status"] = "finished"
        elif after == "diverged":
            row["status"], row["error"] = "diverged", r.divergence()
        elif stop is not None and stop.requested:
            row["status"] = "stopped"
        else:
            row["status"] = "failed"
            row.setdefault("error", f"exit status {code}" + (" without results.json" if code == 0 else ""))
        log(f"[{i}/{len(runs)}] {r.name}: {row['status']} ({row['seconds']:.0f} s)"
            + (f": {row['error']}" if row["status"] in ("failed", "diverged") else ""))
    return summary


def estimate_runs(runs: list[Run], capture: Callable[[list[str], str], tuple[int, str]],
                  log: Callable[[str], None] = print_now, cwd: str = REPO) -> list[dict]:
    """`train --estimate` for every unfinished run; one row per run (its JSON, or status "failed")."""
    rows = []
    for i, r in enumerate(runs, 1):
        if r.state() in ("done", "diverged", "stale"):
            continue
        code, output = capture([*r.command, "--estimate"], cwd)
        lines = output.strip().splitlines()
        try:
            row = {"run": r.name, "status": "ok", **json.loads(lines[-1])}
        except (IndexError, json.JSONDecodeError):
            row = {"run": r.name, "status": "failed", "error": f"exit status {code}: "
                   + (lines[-1] if lines else "no output")}
        rows.append(row)
        log(f"[{i}/{len(runs)}] {r.name}: " + (f"{row['projected_train_seconds'] / 60:.1f} min projected"
                                               if row["status"] == "ok" else row["error"]))
    return rows


def capture_output(command: list[str], cwd: str) -> tuple[int, str]:
    """Runs `command`; returns its exit status and its stdout (stderr passes through)."""
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, text=True, check=False)
    return done.returncode, done.stdout


def estimate_table(rows: list[dict]) -> str:
    """Per run: seconds per step, steps and projected minutes; then the total per task and overall."""
    width = max([len(r["run"]) for r in rows] + [3])
    lines = [f"{'run':<{width}}  {'s/step':>8} {'steps':>6} {'minutes':>8}"]
    per_task: dict[str, float] = {}
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['run']:<{width}}  failed: {r['error']}")
            continue
        minutes = r["projected_train_seconds"] / 60
        per_task[r["run"].split("/")[0]] = per_task.get(r["run"].split("/")[0], 0.0) + minutes
        lines.append(f"{r['run']:<{width}}  {r['seconds_per_step']:>8.3f} {r['num_train_steps']:>6} {minutes:>8.1f}")
    lines += [f"{task}: {minutes:.0f} min" for task, minutes in per_task.items()]
    total = sum(per_task.values())
    failed = sum(r["status"] != "ok" for r in rows)
    lines.append(f"total: {total:.0f} min of training ({total / 60:.1f} h) in one process at a time"
                 + (f"; {failed} runs failed to compile or run and are not counted" if failed else ""))
    return "\n".join(lines)


def summary_table(summary: list[dict]) -> str:
    width = max([len(s["run"]) for s in summary] + [3])
    lines = [f"{'run':<{width}}  {'status':<12} {'time':>8}  note"]
    for s in summary:
        note = s.get("error", "") if s["status"] in ("failed", "stale", "diverged") else s["workdir"]
        lines.append(f"{s['run']:<{width}}  {s['status']:<12} {s['seconds']:>7.0f}s  {note}")
    counts = {k: sum(s["status"] == k for s in summary) for k in dict.fromkeys(s["status"] for s in summary)}
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items()))
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    overrides = argv[1:]
    try:
        runs = plan(FLAGS.variants, FLAGS.tasks, FLAGS.scales, FLAGS.seeds, FLAGS.root, overrides)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if FLAGS.emit:
        for r in runs:
            if r.state() == "stale":
                print(f"note: {r.name} finished with another config ({', '.join(r.changes())} differ); "
                      f"not emitted: delete {r.workdir} to train it with the current one", file=sys.stderr)
            elif r.state() == "diverged":
                print(f"note: {r.name} {r.divergence()}; not emitted", file=sys.stderr)
            elif r.state() != "done":
                print(shlex.join(["python", *r.command[1:], *(["--distributed"] if FLAGS.distributed else [])]))
        return
    if FLAGS.estimate:
        rows = estimate_runs(runs, capture_output)
        print("\n" + estimate_table(rows))
        sys.exit(1 if any(r["status"] != "ok" for r in rows) else 0)
    if FLAGS.dry_run:
        for r in runs:
            print(f"{r.state():<7} {r.name:<40} {shlex.join(r.command[1:])}")
        return
    with _Stop() as stop:
        summary = run_sweep(runs, subprocess_runner(stop), stop)
    print("\n" + summary_table(summary))
    if stop.requested:
        print("sweep stopped; run the same command to continue (finished runs are skipped, "
              "interrupted ones resume)")
        sys.exit(130)
    if any(s["status"] == "failed" for s in summary):
        sys.exit(1)


def cli() -> None:
    """The command (`python -m lra_jax.tools.sweep`, `lra-sweep`)."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    cli()
