"""The plan of a sweep (the library of `python -m lra_jax.tools.sweep`): every run of a grid of variants x
tasks x scales x grid points x seeds as a train command and a workdir (`plan`), the state of each run
read from its workdir (`Run.state`), the runs a protocol asks for now (`protocol_runs`), and what decides
a run's step time (`shape_key`, for the estimates).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import shlex
import sys
import warnings

import ml_collections
from absl import flags
from ml_collections import config_flags

from lra_jax.attention import registry
from lra_jax.config import checks as config_checks
from lra_jax.config import paths as config_paths
from lra_jax.config import settings as config_settings
from lra_jax.data import tasks as task_registry
from lra_jax.errors import ConfigError, LraError
from lra_jax.research.sweeps import selection
from lra_jax.research.choices import choose, config_files
from lra_jax.training import metrics, run_dir, run_result

REPO = config_paths.REPO_ROOT  # where the runs' relative config paths start
FINAL = ("done", "diverged", "stale")  # states in which a run is not trained again
PROTOCOLS = ("grid", "two_stage")
# The `--pretrain` axis: "none" trains from scratch, "spt" self-pretrains (masked tokens on the task's
# training split, `lra_jax.training.pretrain`) before the same fine-tuning; its runs live under spt/.
PRETRAINING = ("none", "spt")

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
    pretrain: str = "none"  # "none" (from scratch) or "spt" (`PRETRAINING`)

    @property
    def name(self) -> str:
        return f"{self.cell}/{self.point + '/' if self.point else ''}seed{self.seed}"

    @property
    def cell(self) -> str:
        """The (task, scale, variant[, pretraining]) whose grid points compete: 'listops-mini/softmax',
        'listops-mini/softmax/spt'."""
        return f"{self.task}-{self.scale}/{self.variant}" + ("/spt" if self.pretrain == "spt" else "")

    def shell_command(self, *extra: str) -> str:
        """The train command (and `extra` flags) as one line to paste into a shell: `python -m lra_jax.train
        ...`, each argument quoted where the shell needs it."""
        return shlex.join(["python", *self.command[1:], *extra])

    def state(self) -> str:
        """'done', 'diverged' (stopped on a non-finite loss: final, like done), 'stale' (finished
        or diverged with a config that differs in `changes`), 'damaged' (a results.json its metrics.jsonl
        or config.json does not back: `damage`; never trained over), 'resume' (has checkpoints, or
        finished fewer steps than the config now asks) or 'new'."""
        results = self.results()
        if results is not None and not self.metrics_whole():
            return "resume"  # the trainer repairs metrics.jsonl and ends the run again
        if results is not None:
            if self.changes():
                return "stale"
            trained = results.get("num_train_steps")
            asked = trained and (self.config or {}).get("num_train_steps")
            if asked and trained < asked:
                return "resume"  # the trainer goes on (dropping the old test line) and writes a new results.json
            if self.damage():
                return "damaged"
            return "diverged" if results.get("status") == "diverged" else "done"
        if os.path.isdir(os.path.join(self.workdir, "checkpoints")):
            return "resume"
        return "new"

    def results(self) -> dict | None:
        """results.json; None when missing, or damaged (then said once, and the run is unfinished)."""
        return read_json(os.path.join(self.workdir, "results.json"), report=True)

    def metrics_whole(self) -> bool:
        """Whether metrics.jsonl is missing or whole; a damaged one is said once."""
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
        """The finished run's accuracies, for selection; None if unfinished, unreadable or damaged."""
        try:
            return selection.read_result(os.path.join(self.workdir, "results.json"))
        except (OSError, ValueError, KeyError, TypeError, run_result.DamagedResult):
            return None

    def damage(self) -> str | None:
        """The one line saying why its results.json is not believed (`run_result.problem`); None when
        its metrics.jsonl and config.json back it, or there is none."""
        results = self.results()
        return None if results is None else run_result.problem(self.workdir, results)

    def divergence(self) -> str:
        """Where a diverged run stopped, for the logs."""
        results = self.results() or {}
        return (f"diverged at step {results.get('diverged_at_step')} (loss {results.get('loss')}); "
                f"not a result: delete {self.workdir} to train it again")

    def changes(self) -> list[str]:
        """The settings in which the workdir's config.json differs from `config`, except those a
        run may change on resume (`run_dir.config_changes`); [] when either is unknown."""
        saved = read_json(os.path.join(self.workdir, "config.json"))
        return run_dir.config_changes(saved, self.config) if saved and self.config else []

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


def check_configs(runs: list[Run]) -> None:
    """ConfigError naming the first run whose command builds no valid config (a misspelled override after
    '--', a value out of range), before anything is trained or reported: a run judged against a config that
    cannot be built would be reported done as it was. Commands that differ only in their seed are built once."""
    seen = set()
    for r in runs:
        flags_ = tuple(a for a in r.command if a.startswith("--config") and not a.startswith("--config.seed="))
        if flags_ in seen:
            continue
        seen.add(flags_)
        spec = next(a.split("=", 1)[1] for a in flags_ if a.startswith("--config="))
        problem = config_checks.check([f"--config={os.path.join(REPO, spec)}", *flags_[1:]])
        if problem is None:
            try:
                config_settings.from_config(train_config(r.command))
            except LraError as error:
                problem = str(error)
            except Exception as error:  # noqa: BLE001 - a value ml_collections cannot parse: said in one line
                problem = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        if problem:
            raise ConfigError(f"{r.name}: {problem}")


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
         grid: list[tuple[str, list[str]]] = (), pretraining: list[str] = ("none",),
         pretrain_steps: int = 0) -> list[Run]:
    """Every run of the grid, in order task, scale, variant, pretraining, grid point, seed.

    `pretraining`: the axis of `PRETRAINING`; an "spt" run adds --config.pretrain.objective=masked and
    --config.pretrain.num_steps=`pretrain_steps` (0: as many as its fine-tuning steps), and fine-tunes
    with the same budget as the run from scratch."""
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
    repeated = sorted({seed for seed in seed_list if seed_list.count(seed) > 1})
    if repeated:
        which = f"seed{'s' if len(repeated) > 1 else ''} {', '.join(map(str, repeated))}"
        raise ConfigError(f"--seeds={','.join(seeds)} names {which} more than once: a seed is one run; "
                          "give each seed once")
    for o in overrides:
        if not o.startswith("--config."):
            raise ConfigError(f"extra argument {o!r}: only --config.* overrides may follow '--'")
    unknown = [p for p in pretraining if p not in PRETRAINING]
    if unknown or not pretraining:
        raise ConfigError(f"--pretrain={','.join(pretraining)}: expected a comma list of {', '.join(PRETRAINING)}")
    if pretrain_steps < 0:
        raise ConfigError(f"--pretrain_steps={pretrain_steps} must be >= 0 (0: as many as the fine-tuning steps)")
    points = [list(zip([k for k, _ in grid], values)) for values in itertools.product(*(v for _, v in grid))]
    runs = []
    for task, scale, variant, spt, point, seed in itertools.product(task_list, scales, chosen, pretraining, points,
                                                                    seed_list):
        label = ",".join(f"{k}={v}" for k, v in point)
        workdir = os.path.join(root, f"{task}-{scale}", variant, *(["spt"] if spt == "spt" else []),
                               *([label] if label else []), f"seed{seed}")
        command = [python, "-m", "lra_jax.train", f"--config={files[variant]}:{task},{scale}",
                   f"--workdir={workdir}", f"--config.seed={seed}", *(f"--config.{k}={v}" for k, v in point),
                   *overrides]
        if spt == "spt":
            steps = pretrain_steps or _fine_tuning_steps(command)
            command += ["--config.pretrain.objective=masked", f"--config.pretrain.num_steps={steps}"]
        runs.append(Run(task, scale, variant, seed, workdir, command, label, seed == seed_list[0], spt))
    if grid and runs and runs[0].config is None:
        try:
            train_config(runs[0].command)
        except Exception as error:  # noqa: BLE001 - name the bad key or value in one line
            raise ConfigError(f"--grid: {runs[0].name} cannot be configured: {error}") from error
    return runs


@functools.cache
def _steps_of(config_arg: str, overrides: tuple[str, ...]) -> int:
    return int(train_config(["--config=" + config_arg, *overrides]).num_train_steps)


def _fine_tuning_steps(command: list[str]) -> int:
    """num_train_steps of the config a train command trains (its --config file and overrides, seed aside)."""
    spec = next(a.split("=", 1)[1] for a in command if a.startswith("--config="))
    overrides = tuple(a for a in command if a.startswith("--config.") and not a.startswith("--config.seed="))
    try:
        return _steps_of(spec, overrides)
    except Exception as error:  # noqa: BLE001 - any error in a user's config file, in one line
        raise ConfigError(f"--pretrain=spt: the fine-tuning steps of {spec} cannot be read ({error}); "
                          "pass --pretrain_steps") from error


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

def shape_key(r: Run) -> str:
    """What decides a run's step time: its config without seed, optimizer and pretraining (its
    fine-tuning step is the same), or its command if the config cannot be built."""
    if r.config is None:
        return shlex.join(r.command)
    return json.dumps({k: v for k, v in r.config.items() if k not in ("seed", "optimizer", "pretrain")},
                      sort_keys=True)
