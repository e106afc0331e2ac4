r"""A grid of training runs (variants x tasks x scales x grid points x seeds): local, parallel, resumable,
or emitted for a cluster; with a grid, each (variant, task) is reported at the point chosen on validation.

    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=mini --seeds=0,1,2 --root=runs/sweep
    python -m lra_jax.tools.sweep --variants=all --tasks=pathfinder --seeds=0,1,2 \
        --grid=optimizer.learning_rate=1e-3,5e-3 --protocol=two_stage --parallel=2 --root=runs/sweep
    python -m lra_jax.tools.sweep --variants=softmax,linformer --tasks=listops --dry_run   # show the plan
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=mini --estimate      # how long it will take
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --emit > commands.txt
    python -m lra_jax.tools.sweep --variants=all --tasks=all --scales=full --emit --distributed   # multi-host form
    python -m lra_jax.tools.sweep --variants=softmax --tasks=listops -- --config.num_train_steps=100

Each run is

    python -m lra_jax.train --config=configs/<file>.py:<task>,<scale> \
        --workdir=<root>/<task>-<scale>/<variant>/[<point>/]seed<k> --config.seed=<k> [<point's overrides>]

(plus any `--config.*` overrides given after `--`). `--grid=KEY=V1,V2,...` (repeatable: several axes
make a product) trains every value of any config key; a grid point is a directory `KEY=V[,KEY=V]`.
Protocols (`--protocol`): `grid` trains every point at every seed; `two_stage` trains every point at
the first seed, then the other seeds only at the point that seed's validation accuracy chose (the
second stage of a (variant, task) starts as soon as its first stage is finished). Either way the
reported point is the one with the best mean validation accuracy over the seeds every point has,
and its test accuracy is given as mean +- std over its seeds (lra_jax.tools.selection); test
accuracy never takes part in the choice.

`--parallel=N` runs N runs at once, each on its own devices (`--devices_per_run`, default 1; see
lra_jax.tools.device_slots): CPU cores pinned by affinity, GPUs by CUDA_VISIBLE_DEVICES, TPU chips by
libtpu's visibility variables. With N > 1 each run's output goes to <workdir>/train.log.

A run whose results.json exists is skipped; an interrupted run is started again and resumes from
its checkpoint (the trainer does that). A run that stopped on a non-finite loss (its results.json
says "diverged", with no accuracy) is reported as `diverged` and not retried: it would diverge
again the same way. A finished run is judged against the config its command
trains now: if that asks for more steps, it resumes; if it differs in what a run cannot change on
resume (model, optimizer, data, ...), the run is "stale": skipped and reported with the settings
that differ, its results kept (delete its workdir to train it again with the current config). A
failed run is logged and the sweep goes on; the exit status is 1 if any run failed. A run whose process
died from a signal (SIGKILL from the out-of-memory killer, a segfault) is recorded as `crashed` with the
last lines of its output, and the sweep goes on; run the sweep again to resume it from its checkpoint.
A results.json or metrics.jsonl that cannot be read (truncated by a full disk or a bad copy) is reported
in one line and its run treated as unfinished: it is started again and ends again from its checkpoints.
SIGINT/SIGTERM: every running child gets SIGTERM, saves a checkpoint and exits; the sweep then stops
(run the same command to continue).

`--estimate` runs `train --estimate` once for each distinct run shape (runs that differ only in seed
or optimizer settings share one): the train step is compiled and timed on random tokens, and each
run's training time is projected as compilation + num_train_steps x seconds per step (evaluation and
data preparation excluded). With `--target=tpu-v5e:2x2` (a compile target) nothing is timed here: each
shape's train step is compiled for that slice and the runs are given in chip-hours from the TPU
compiler's modeled step time (`lra_jax.tools.compile.estimate_sweep`), labelled modeled.
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
import threading
import time
import warnings
from collections.abc import Callable

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from lra_jax.config import paths as config_paths
from lra_jax.errors import ConfigError, LraError
from lra_jax.tools import device_slots, selection
from lra_jax.tools.choices import choose, config_files
from lra_jax.tools.progress import print_now

REPO = config_paths.REPO_ROOT  # where the runs' relative config paths start
FINAL = ("done", "diverged", "stale")  # states in which a run is not trained again
PROTOCOLS = ("grid", "two_stage")

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command-line flags (defined only when run as a command, so modules import side by side)."""
    flags.DEFINE_string("variants", "all", "'all' (every variant with a configs/ file) or a comma list.")
    flags.DEFINE_string("tasks", "all", "'all' or a comma list of tasks (lra_jax.data.tasks.names()).")
    flags.DEFINE_list("scales", ["mini"], "Comma list of scales: full, mini.")
    flags.DEFINE_list("seeds", ["0"], "Comma list of seeds (with --protocol=two_stage the first one "
                      "trains the whole grid).")
    flags.DEFINE_multi_string("grid", [], "KEY=V1,V2,...: train every value of config key KEY (e.g. "
                              "optimizer.learning_rate=1e-3,5e-3); repeat the flag for a product of axes.")
    flags.DEFINE_enum("protocol", "grid", PROTOCOLS, "grid: every grid point at every seed; two_stage: every "
                      "point at the first seed, the other seeds at the point chosen on its validation accuracy.")
    flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own devices (CPU cores, GPUs or TPU chips).")
    flags.DEFINE_enum("devices", "auto", device_slots.KINDS, "What --parallel shares out (auto: GPUs if any, "
                      "else TPU chips if any, else CPU cores).")
    flags.DEFINE_integer("devices_per_run", 1, "Devices (cores, GPUs, TPU chips) of each run with --parallel.")
    flags.DEFINE_string("root", os.path.join("runs", "sweep"), "Root of the run directories.")
    flags.DEFINE_bool("emit", False, "Print one train command per unfinished run (for a cluster) and exit.")
    flags.DEFINE_bool("distributed", False, "With --emit: the multi-host form, each command with --distributed, "
                      "to be run on every host of a TPU VM slice or every node of a Slurm job at once.")
    flags.DEFINE_bool("dry_run", False, "Print the plan (done / resume / new / waiting) and exit.")
    flags.DEFINE_bool("estimate", False, "Train nothing: time a few steps of each distinct unfinished run "
                      "shape on random tokens (`train --estimate`, no data needed) and print each run's "
                      "projected training time and the total.")
    flags.DEFINE_string("target", "", "With --estimate: no timing here; chip-hours modeled by the TPU compiler for "
                        "this compile target (e.g. tpu-v5e:2x2; lra_jax.tools.compile), labelled modeled.")


# ----------------------------------------------------------------------------- the plan

@dataclasses.dataclass
class Run:
    task: str
    scale: str
    variant: str
    seed: int
    workdir: str
    command: list[str]
    point: str = ""  # the grid point, "KEY=V[,KEY=V]"; "" without a grid
    first_stage: bool = True  # trained whatever the protocol (two_stage: the first seed)

    @property
    def name(self) -> str:
        return f"{self.cell}/{self.point + '/' if self.point else ''}seed{self.seed}"

    @property
    def cell(self) -> str:
        """The (task, scale, variant) whose grid points compete: 'listops-mini/softmax'."""
        return f"{self.task}-{self.scale}/{self.variant}"

    def state(self) -> str:
        """'done', 'diverged' (stopped on a non-finite loss: final, like done), 'stale' (finished
        or diverged with a config that differs in `changes`), 'resume' (has checkpoints, or
        finished fewer steps than the config now asks) or 'new'."""
        results = self.results()
        if results is not None and not self.metrics_whole():
            return "resume"  # the trainer repairs metrics.jsonl and ends the run again
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
        """results.json; None when missing, or damaged (then said once, and the run is unfinished)."""
        return read_json(os.path.join(self.workdir, "results.json"), report=True)

    def metrics_whole(self) -> bool:
        """Whether metrics.jsonl is missing or whole; a damaged one is said once."""
        from lra_jax.training import metrics

        path = os.path.join(self.workdir, "metrics.jsonl")
        if not os.path.exists(path):
            return True
        try:
            damaged = metrics.read_lines(path)[1]
        except OSError as error:
            damaged = f"{path} cannot be read ({error})"
        if damaged:
            report_once(path, f"note: {damaged}; {self.name} is treated as unfinished")
        return damaged is None

    def result(self) -> selection.Result | None:
        """The finished run's accuracies, for selection; None if unfinished or unreadable."""
        try:
            return selection.read_result(os.path.join(self.workdir, "results.json"))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def divergence(self) -> str:
        """Where a diverged run stopped, for the logs."""
        results = self.results() or {}
        return (f"diverged at step {results.get('diverged_at_step')} (loss {results.get('loss')}); "
                f"not a result: delete {self.workdir} to train it again")

    def changes(self) -> list[str]:
        """The settings in which the workdir's config.json differs from `config`, except those a
        run may change on resume (`trainer.config_changes`); [] when either is unknown."""
        from lra_jax.training import trainer

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


_reported: set[str] = set()


def report_once(key: str, line: str) -> None:
    """Prints `line` to stderr the first time `key` is seen (a run's state is read many times)."""
    if key not in _reported:
        _reported.add(key)
        print(line, file=sys.stderr, flush=True)


def read_json(path: str, report: bool = False) -> dict | None:
    """The JSON object in `path`; None if there is none, or it is unreadable (then the run is redone;
    with `report`, one line says so)."""
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        if report:
            report_once(path, f"note: {path} is damaged ({error}); its run is treated as unfinished")
        return None
    if not isinstance(found, dict):
        if report:
            report_once(path, f"note: {path} holds no JSON object; its run is treated as unfinished")
        return None
    return found


def parse_grid(specs: list[str], overrides: list[str] = ()) -> list[tuple[str, list[str]]]:
    """['optimizer.learning_rate=1e-3,5e-3', ...] -> [('optimizer.learning_rate', ['1e-3', '5e-3']), ...]."""
    axes = []
    for spec in specs:
        key, _, values = spec.partition("=")
        key = key.strip().removeprefix("--config.").removeprefix("config.")
        chosen = [v.strip() for v in values.split(",") if v.strip()]
        if not key or not chosen:
            raise ConfigError(f"--grid={spec}: expected KEY=V1,V2,... with a config key, "
                              f"e.g. --grid=optimizer.learning_rate=1e-3,5e-3")
        if key == "seed":
            raise ConfigError("--grid=seed=...: seeds are not a grid axis; use --seeds")
        if any(k == key for k, _ in axes):
            raise ConfigError(f"--grid names {key} twice; give all its values in one --grid")
        if any(o.split("=", 1)[0] == f"--config.{key}" for o in overrides):
            raise ConfigError(f"{key} is both a --grid axis and an override after '--'; drop one")
        bad = [v for v in chosen if "/" in v or "," in v]
        if bad:
            raise ConfigError(f"--grid={spec}: a value may not contain '/' (it names a directory)")
        axes.append((key, chosen))
    return axes


def plan(variants: str, tasks: str, scales: list[str], seeds: list[str], root: str,
         overrides: list[str] = (), files: dict[str, str] | None = None,
         task_names: list[str] | None = None, python: str = sys.executable,
         grid: list[tuple[str, list[str]]] = ()) -> list[Run]:
    """Every run of the grid, in order task, scale, variant, grid point, seed."""
    from lra_jax.attention import registry
    from lra_jax.data import tasks as task_registry

    files = config_files() if files is None else files
    chosen = choose(variants, registry.names(), "variant")
    missing = [v for v in chosen if v not in files]
    if missing and variants.strip() != "all":
        raise ConfigError(f"no config file for variant {', '.join(missing)}: add configs/<file>.py whose "
                          f"attention.name is it (variants with one: {', '.join(sorted(files))})")
    for v in missing:
        print(f"note: variant {v} has no configs/ file; skipped", file=sys.stderr)
    chosen = [v for v in chosen if v in files]
    task_list = choose(tasks, task_names or task_registry.names(), "task")
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
    points = [list(zip([k for k, _ in grid], values)) for values in itertools.product(*(v for _, v in grid))]
    runs = []
    for task, scale, variant, point, seed in itertools.product(task_list, scales, chosen, points, seed_list):
        label = ",".join(f"{k}={v}" for k, v in point)
        workdir = os.path.join(root, f"{task}-{scale}", variant, *([label] if label else []), f"seed{seed}")
        command = [python, "-m", "lra_jax.train", f"--config={files[variant]}:{task},{scale}",
                   f"--workdir={workdir}", f"--config.seed={seed}", *(f"--config.{k}={v}" for k, v in point),
                   *overrides]
        runs.append(Run(task, scale, variant, seed, workdir, command, label, seed == seed_list[0]))
    if grid and runs and runs[0].config is None:
        try:
            train_config(runs[0].command)
        except Exception as error:  # noqa: BLE001 - name the bad key or value in one line
            raise ConfigError(f"--grid: {runs[0].name} cannot be configured: {error}") from error
    return runs


def protocol_runs(runs: list[Run], protocol: str) -> tuple[list[Run], list[str]]:
    """The runs `protocol` asks for now, and the cells whose second stage waits for their first.

    grid: all of them. two_stage: every first-stage run; a cell's other seeds once all its first-stage
    runs are final, at the point their validation accuracy chose (none if every point diverged)."""
    if protocol not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    if protocol == "grid":
        return runs, []
    now, waiting = [], []
    for cell, group in itertools.groupby(runs, key=lambda r: r.cell):
        group = list(group)
        first = [r for r in group if r.first_stage]
        now += first
        if len(first) == len(group):
            continue
        if all(r.state() in FINAL for r in first):
            chosen = selection.select([res for r in first if (res := r.result()) is not None])
            now += [r for r in group if not r.first_stage and chosen is not None and r.point == chosen.point]
        else:
            waiting.append(cell)
    order = {id(r): i for i, r in enumerate(runs)}
    return sorted(now, key=lambda r: order[id(r)]), waiting


def second_stage_stand_ins(runs: list[Run], waiting: list[str]) -> list[Run]:
    """For an estimate before the choice: the second-stage runs of each waiting cell, taken at its
    first grid point (they cost the same unless the grid changes the run's shape)."""
    first_point: dict[str, str] = {}
    for r in runs:
        first_point.setdefault(r.cell, r.point)
    return [r for r in runs if r.cell in waiting and not r.first_stage and r.point == first_point[r.cell]]


# ----------------------------------------------------------------------------- running

class _Stop:
    """SIGINT/SIGTERM -> forward SIGTERM to every running child (each checkpoints) and stop the sweep."""

    def __init__(self):
        self.requested = False
        self.children: set[subprocess.Popen] = set()
        self.previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True
        print(f"\nsweep: {signal.Signals(signum).name}: asking the {len(self.children)} running run(s) to "
              "checkpoint and stop...", file=sys.stderr, flush=True)
        for child in list(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# A runner returns the exit status, or (exit status, the last lines of the run's output).
Runner = Callable[[list[str], str, device_slots.Slot | None], "int | tuple[int, str]"]
TAIL_BYTES = 4096  # of a run's output kept for its summary row
TAIL_LINES = 5


def last_lines(text: str, count: int = TAIL_LINES) -> str:
    """The last `count` non-empty lines of `text`, progress-bar redraws (carriage returns) split too."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _pump(source, sink, tail: bytearray) -> None:
    """Copies `source` to `sink` as it comes, keeping its last TAIL_BYTES in `tail`."""
    while chunk := os.read(source.fileno(), 65536):
        if hasattr(sink, "buffer"):
            sink.buffer.write(chunk)
        else:  # a text stream without bytes underneath (a test's capture)
            sink.write(chunk.decode("utf-8", errors="replace"))
        sink.flush()
        tail += chunk
        del tail[:-TAIL_BYTES]


def subprocess_runner(stop: _Stop, log_to_workdir: bool = False) -> Runner:
    """Runs a command in its own session (a terminal Ctrl-C reaches only the sweep, which forwards it),
    on its slot's devices; with `log_to_workdir`, its output goes to <workdir>/train.log. Returns the
    exit status and the last lines of the run's stderr (of train.log with `log_to_workdir`)."""

    def run(command: list[str], cwd: str, slot: device_slots.Slot | None = None) -> tuple[int, str]:
        env = {**os.environ, **slot.env} if slot else None
        log, log_path = None, None
        if log_to_workdir:
            workdir = os.path.join(cwd, next(a.split("=", 1)[1] for a in command if a.startswith("--workdir=")))
            os.makedirs(workdir, exist_ok=True)
            log_path = os.path.join(workdir, "train.log")
            log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115
        tail = bytearray()
        try:
            child = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, stdout=log,
                                     stderr=subprocess.STDOUT if log else subprocess.PIPE)
            stop.children.add(child)
            pump = None
            if log is None:
                pump = threading.Thread(target=_pump, args=(child.stderr, sys.stderr, tail), daemon=True)
                pump.start()
            try:
                code = child.wait()
            finally:
                stop.children.discard(child)
            if pump is not None:
                pump.join()
                child.stderr.close()
        finally:
            if log:
                log.close()
        if log_path:
            with open(log_path, "rb") as f:
                f.seek(max(os.path.getsize(log_path) - TAIL_BYTES, 0))
                tail = bytearray(f.read())
        return code, last_lines(tail.decode("utf-8", errors="replace"))

    return run


def crash_cause(code: int) -> str | None:
    """'killed by SIGKILL (out of memory?)' for an exit status that is a signal's; None otherwise
    (a negative status is Popen's signal number, 128 + n a shell's)."""
    number = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if number is None:
        return None
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"killed by {name}" + (" (out of memory?)" if number == signal.SIGKILL else "")


def _final_row(r: Run, before: str) -> dict | None:
    """The summary row of a run that is not trained again (done, diverged, stale); None otherwise."""
    row = {"run": r.name, "before": before, "status": "skipped", "seconds": 0.0, "workdir": r.workdir}
    if before == "diverged":
        row["status"], row["error"] = "diverged", r.divergence()
    elif before == "stale":
        row["status"] = "stale"
        row["error"] = (f"finished with another config ({', '.join(r.changes())} differ); "
                        f"delete {r.workdir} to train it with the current one")
    return row if before in FINAL else None


def _train(r: Run, before: str, runner: Runner, slot, stop: _Stop | None, cwd: str) -> dict:
    """Trains one run; its summary row."""
    row = {"run": r.name, "before": before, "status": "failed", "seconds": 0.0, "workdir": r.workdir}
    start = time.perf_counter()
    tail = ""
    try:
        code = runner(r.command, cwd, slot)
        if isinstance(code, tuple):
            code, tail = code
    except OSError as error:
        code, row["error"] = -1, str(error)
    row["seconds"] = time.perf_counter() - start
    row["exit_code"] = code
    if tail:
        row["last_lines"] = tail
    after = r.state()
    crashed = crash_cause(code)
    if after == "done":
        row["status"] = "finished"
    elif after == "diverged":
        row["status"], row["error"] = "diverged", r.divergence()
    elif stop is not None and stop.requested:
        row["status"] = "stopped"
    elif crashed:
        row["status"] = "crashed"
        row["error"] = (f"{crashed}; run the sweep again to resume it from its checkpoint"
                        + (f"; its last lines: {' | '.join(tail.splitlines())}" if tail else ""))
    else:
        row.setdefault("error", f"exit status {code}" + (" without results.json" if code == 0 else "")
                       + (f"; its last lines: {' | '.join(tail.splitlines())}" if tail else ""))
    return row


def run_sweep(runs: list[Run] | Callable[[], list[Run]], runner: Runner, stop: _Stop | None = None,
              log: Callable[[str], None] = print_now, cwd: str = REPO,
              slots: list[device_slots.Slot | None] = (None,)) -> list[dict]:
    """Trains the unfinished runs, one per slot at a time; returns one summary row per run.

    `runs` may be a function giving the runs to do now (the protocol's plan, which grows as first
    stages finish): a free slot takes the next unstarted run of its latest answer."""
    current = runs if callable(runs) else (lambda: runs)
    printing = threading.Lock()

    def say(line: str) -> None:
        with printing:  # one slot's lines never break into another's
            log(line)

    rows: dict[str, dict] = {}
    started: set[str] = set()
    in_flight = [0]
    changed = threading.Condition()

    def next_run():
        for r in current():
            if r.name in started:
                continue
            started.add(r.name)
            before = r.state()
            row = _final_row(r, before)
            if row is None:
                return r, before
            rows[r.name] = row
            say(f"{r.name}: " + (row.get("error") or "done, skipped"))
        return None, None

    def work(slot):
        if slot is not None:
            slot.pin()  # this thread's CPU mask, which the runs it starts inherit
        while True:
            with changed:
                while True:
                    if stop is not None and stop.requested:
                        return
                    r, before = next_run()
                    if r is not None or in_flight[0] == 0:
                        break
                    changed.wait()  # a running first stage may release second-stage runs
                if r is None:
                    changed.notify_all()
                    return
                in_flight[0] += 1
            where = f" on {slot.label}" if slot is not None else ""
            say(f"{r.name}: {'resuming' if before == 'resume' else 'starting'}{where}\n  " + shlex.join(r.command))
            row = _train(r, before, runner, slot, stop, cwd)
            say(f"{r.name}: {row['status']} ({row['seconds']:.0f} s)"
                + (f": {row['error']}" if row["status"] in ("failed", "crashed", "diverged") else ""))
            with changed:
                rows[r.name] = row
                in_flight[0] -= 1
                changed.notify_all()

    workers = [threading.Thread(target=work, args=(slot,), daemon=True) for slot in slots]
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):  # joined with a timeout so that signals reach the handler
        for w in workers:
            w.join(0.2)
    return [rows.get(r.name) or {"run": r.name, "before": r.state(), "status": "not started", "seconds": 0.0,
                                 "workdir": r.workdir} for r in current()]


# ----------------------------------------------------------------------------- estimating

def shape_key(r: Run) -> str:
    """What decides a run's step time: its config without seed and optimizer (and its command if the
    config cannot be built)."""
    if r.config is None:
        return shlex.join(r.command)
    return json.dumps({k: v for k, v in r.config.items() if k not in ("seed", "optimizer")}, sort_keys=True)


def estimate_runs(runs: list[Run], capture: Callable[[list[str], str], tuple[int, str]],
                  log: Callable[[str], None] = print_now, cwd: str = REPO) -> list[dict]:
    """`train --estimate` once per distinct shape of the unfinished runs; one row per run (its JSON, or
    status "failed")."""
    rows, measured = [], {}
    for i, r in enumerate(runs, 1):
        if r.state() in FINAL:
            continue
        key = shape_key(r)
        if key not in measured:
            code, output = capture([*r.command, "--estimate"], cwd)
            lines = output.strip().splitlines()
            try:
                measured[key] = {"status": "ok", **json.loads(lines[-1])}
            except (IndexError, json.JSONDecodeError):
                measured[key] = {"status": "failed", "error": f"exit status {code}: "
                                 + (lines[-1] if lines else "no output")}
        row = {"run": r.name, **measured[key]}
        rows.append(row)
        log(f"[{i}/{len(runs)}] {r.name}: " + (f"{row['projected_train_seconds'] / 60:.1f} min projected"
                                               if row["status"] == "ok" else row["error"]))
    return rows


def capture_output(command: list[str], cwd: str) -> tuple[int, str]:
    """Runs `command`; returns its exit status and its stdout (stderr passes through)."""
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, text=True, check=False)
    return done.returncode, done.stdout


def estimate_table(rows: list[dict], parallel: int = 1) -> str:
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
                 + (f", about {total / parallel / 60:.1f} h of wall time with --parallel={parallel}"
                    if parallel > 1 else "")
                 + (f"; {failed} runs failed to compile or run and are not counted" if failed else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- reporting

def summary_table(summary: list[dict]) -> str:
    width = max([len(s["run"]) for s in summary] + [3])
    lines = [f"{'run':<{width}}  {'status':<12} {'time':>8}  note"]
    for s in summary:
        note = s.get("error", "") if s["status"] in ("failed", "crashed", "stale", "diverged") else s["workdir"]
        lines.append(f"{s['run']:<{width}}  {s['status']:<12} {s['seconds']:>7.0f}s  {note}")
    counts = {k: sum(s["status"] == k for s in summary) for k in dict.fromkeys(s["status"] for s in summary)}
    hours = sum(s["seconds"] for s in summary) / 3600
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items())
                 + f"; runs took {hours:.2f} h in all (the sum over runs)")
    return "\n".join(lines)


def selection_table(runs: list[Run]) -> str:
    """Per cell with more than one grid point: the chosen point, the validation means it was chosen
    on, and its test accuracy as mean +- std over seeds (%)."""
    lines = []
    for cell, group in itertools.groupby(runs, key=lambda r: r.cell):
        group = list(group)
        if len({r.point for r in group}) < 2:
            continue
        finished = [res for r in group if (res := r.result()) is not None]
        chosen = selection.select(finished)
        if chosen is None:
            if finished:
                lines.append(f"{cell}: nothing to report, every grid point diverged")
            continue
        val = ", ".join(f"{p} {100 * v:.1f}" for p, v in chosen.candidates.items())
        std = f" ± {100 * chosen.test_std:.2f}" if chosen.test_std is not None else ""
        lines.append(f"{cell}: {chosen.point}  test {100 * chosen.test_mean:.2f}{std} (n={chosen.n}); "
                     f"val on seeds {','.join(map(str, chosen.compared_on)) or 'own'}: {val}"
                     + (f"; diverged: {', '.join(chosen.diverged)}" if chosen.diverged else ""))
    return "\n".join(["selected on validation accuracy, never test:", *lines]) if lines else ""


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str]) -> None:
    overrides = argv[1:]
    try:
        runs = plan(FLAGS.variants, FLAGS.tasks, FLAGS.scales, FLAGS.seeds, FLAGS.root, overrides,
                    grid=parse_grid(FLAGS.grid, overrides))
        now, waiting = protocol_runs(runs, FLAGS.protocol)
        slots = (device_slots.slots(FLAGS.devices, FLAGS.parallel, FLAGS.devices_per_run)
                 if FLAGS.parallel > 1 or FLAGS.devices_per_run > 1 else [None])
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    pending = (f"{len(waiting)} (variant, task) cells wait for their first stage (seed {FLAGS.seeds[0]} at every "
               f"grid point) before their other seeds can be planned: {', '.join(waiting)}") if waiting else ""
    if FLAGS.emit:
        for r in now:
            if r.state() == "stale":
                print(f"note: {r.name} finished with another config ({', '.join(r.changes())} differ); "
                      f"not emitted: delete {r.workdir} to train it with the current one", file=sys.stderr)
            elif r.state() == "diverged":
                print(f"note: {r.name} {r.divergence()}; not emitted", file=sys.stderr)
            elif r.state() != "done":
                print(shlex.join(["python", *r.command[1:], *(["--distributed"] if FLAGS.distributed else [])]))
        if pending:
            print(f"note: {pending}; emit again once those runs are finished", file=sys.stderr)
        return
    if FLAGS.estimate and FLAGS.target:
        from lra_jax.tools import compile as compile_cmd

        sys.exit(compile_cmd.estimate_sweep(now + second_stage_stand_ins(runs, waiting), FLAGS.target))
    if FLAGS.estimate:
        stand_ins = second_stage_stand_ins(runs, waiting)
        rows = estimate_runs(now + stand_ins, capture_output)
        print("\n" + estimate_table(rows, FLAGS.parallel))
        if stand_ins:
            print(f"({len(stand_ins)} second-stage runs counted at their cell's first grid point, "
                  "as the chosen one is not known yet)")
        sys.exit(1 if any(r["status"] != "ok" for r in rows) else 0)
    if FLAGS.dry_run:
        for r in now:
            print(f"{r.state():<8} {r.name:<48} {shlex.join(r.command[1:])}")
        if pending:
            print(f"waiting  {pending}")
        return
    with _Stop() as stop:
        summary = run_sweep(lambda: protocol_runs(runs, FLAGS.protocol)[0],
                            subprocess_runner(stop, log_to_workdir=len(slots) > 1), stop, slots=slots)
    print("\n" + summary_table(summary))
    chosen = selection_table(protocol_runs(runs, FLAGS.protocol)[0])
    if chosen:
        print("\n" + chosen)
    if stop.requested:
        print("sweep stopped; run the same command to continue (finished runs are skipped, "
              "interrupted ones resume)")
        sys.exit(130)
    if any(s["status"] in ("failed", "crashed") for s in summary):
        sys.exit(1)


def cli() -> None:
    """The command (`python -m lra_jax.tools.sweep`, `lra-sweep`)."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    cli()
