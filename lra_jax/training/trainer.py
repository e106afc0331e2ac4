"""The training loop: `train_and_evaluate(settings, workdir)`.

The config is read once, at the entry, into checked typed settings (`lra_jax.config.settings`);
the workdir and its records are `run_dir`'s. What the loop uses lives beside it: the initial state and
random streams (`initial_state`), the mesh (`distributed.make_mesh`), evaluation (`evaluation`), the
step's metrics (`step_metrics`), the stop signals (`stop_signal`), the step-time hook (`first_steps`).

One jitted, buffer-donating train step over pure NNX state, its batch split over
a mesh of every device (data parallel); validation every `eval_every` steps;
last + best checkpoints; resume from the workdir; SIGTERM or SIGINT saves and stops.
Determinism: one seed gives the init key, the dropout key (folded with the step)
and the data order (seeded by epoch), so a resumed run continues exactly.

Results (`results.json`): task, variant, test accuracy of the best-validation
checkpoint, its validation accuracy, steps/s, examples/s, peak memory,
parameter count, the attention settings as built, the config and library versions;
"pretrain_objective" ("none" from scratch) and "pretrain" (the stage's record, or None).

Both stages are a `Stage` trained by one function (`_train_stage`). Self-pretraining (`config.pretrain`,
`training.pretrain`) is a first stage in workdir/pretrain/ on the training split alone, with its own
checkpoints, metrics and record, resumed like any run; fine-tuning then starts from its encoder with a new
classifier head.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from lra_jax import compat, provenance
from lra_jax import progress as progress_bar
from lra_jax.attention import registry
from lra_jax.config import settings as config_settings
from lra_jax.config.settings import OptimizerSettings, Settings
from lra_jax.data import pipeline, tasks
from lra_jax.errors import DiskFull, TrainingDiverged
from lra_jax.training import (
    checkpointing,
    distributed,
    evaluation,
    memory,
    metrics,
    optimizer,
    pretrain,
    run_dir,
    run_result,
    step_metrics,
    steps,
)
from lra_jax.training.first_steps import FirstSteps, StepTimeHook, adding_steps
from lra_jax.training.initial_state import attention_settings, create_train_state, run_key
from lra_jax.training.stop_signal import StopSignal


def train_and_evaluate(settings: Settings, workdir: str, *, on_step_time: StepTimeHook | None = None
                       ) -> dict[str, Any] | None:
    """Trains the run `settings` describe in `workdir` (resuming what is there); returns results, or None if
    stopped by SIGTERM or SIGINT (a checkpoint saved). One process trains in a workdir at a time
    (`run_dir.locked`), and a workdir holding another config's run is refused (`run_dir.check_config`).

    `on_step_time(seconds_per_step, steps_left)`: called once the first steps are timed (`FirstSteps`),
    with the steps left in the whole run (pretraining and fine-tuning); a line it returns is printed.

    With several processes (`jax.distributed`), all run this together on a shared `workdir`;
    process 0 alone prints and writes metrics, config.json and results.json. A full disk raises
    DiskFull (one line) with the checkpoints saved before it intact; a damaged checkpoint is
    reported and the run resumes from an older one (`checkpointing.Checkpoints`). A bad value or
    workdir is reported (ConfigError, WorkdirError) before anything is built or written; a write
    refused mid-run is one line (WorkdirError), the checkpoints before it kept.
    """
    mesh = distributed.make_mesh()
    config_settings.check_devices(settings, mesh.size)
    run_dir.prepare(workdir)
    try:
        # one process per workdir; the steps' kernels run per device on its rows (`kernels.sharding`)
        with run_dir.locked(workdir), compat.abstract_mesh(mesh):
            return _train_and_evaluate(settings, workdir, mesh, on_step_time)
    except OSError as error:
        if run_dir.permission_denied(error):
            raise run_dir.not_writable(workdir, error) from None
        if not checkpointing.out_of_space(error):
            raise
        raise DiskFull(f"disk full: writing {error.filename or workdir} failed ({error.strerror}), "
                       f"{checkpointing.megabytes(checkpointing.free_bytes(workdir))} free; the last checkpoint is "
                       "kept. Free space there (or move the workdir to a larger disk) and run the same command "
                       "to resume") from None


def _train_and_evaluate(config: Settings, workdir: str, mesh: Mesh, on_step_time: StepTimeHook | None
                        ) -> dict[str, Any] | None:
    primary = jax.process_index() == 0
    # The code that runs: read before the run writes anything (its own files may be tracked by git).
    versions = provenance.library_versions()
    task = tasks.get_task(config.task)
    stage = Stage("train", workdir, config.num_train_steps, config.optimizer, "dropout")
    graphdef, tx, state = create_train_state(config, task, mesh)
    num_parameters = state.num_parameters
    attention = attention_settings(graphdef, state)
    for line in registry.describe_kernels(attention["kernels"]):
        print(line)
    results_path = os.path.join(workdir, "results.json")
    stage_dir = os.path.join(workdir, pretrain.STAGE_DIR)

    checkpoints = checkpointing.Checkpoints(os.path.join(stage.folder, "checkpoints"), config.keep_checkpoints)
    run_dir.check_config(config, workdir)
    restored = checkpoints.restore_last(state)
    state = restored or state
    start = int(state.step)
    finished = run_dir.finished_results(results_path) if start >= config.num_train_steps else None
    if finished is not None and metrics.whole(workdir):
        run_result.check(workdir, finished)  # one line, no "finished", where its metrics or config disagree
        if primary:
            print(f"{workdir}: finished at step {start}; results in {results_path}")
        return finished

    splits = task.load(config.data, config.max_len)
    evaluation.check_not_empty(config, splits, ["train"])
    pretrained = None
    if config.pretrain.objective != "none":  # on the training split alone, before validation is drawn
        pretrained = _pretrain(config, task, splits["train"], stage_dir, mesh, versions,
                               adding_steps(on_step_time, config.num_train_steps - start))
        if pretrained is None:
            checkpoints.close()
            return None
        if restored is None:  # fine-tuning starts from the pretrained encoder and a new head
            state = pretrain.transfer_encoder(pretrained["state"], state)
    evaluation.check_not_empty(config, splits, ["val", "test"])  # after pretraining, which never reads them
    if start and primary:
        print(f"{workdir}: resuming from step {start}")
    val_size = len(splits["val"][1])
    splits["val"] = evaluation.validation_subset(splits["val"], config.val_examples, config.seed)
    validated_on = ("" if len(splits["val"][1]) == val_size else
                    f", on {len(splits['val'][1]):,} of the {val_size:,} validation examples")
    eval_step = steps.make_eval_step(graphdef)
    best = checkpoints.best_metrics() or {"accuracy": -1.0, "step": -1}

    def validate(step, state, writer):
        nonlocal best
        val = evaluation.evaluate(eval_step, state, splits["val"], config.eval_batch_size, mesh)
        writer.write(step, {"val/accuracy": val["accuracy"], "val/loss": val["loss"]})
        if val["accuracy"] > best["accuracy"]:
            best = {"accuracy": val["accuracy"], "loss": val["loss"], "step": step}
            checkpoints.save_best(step, state, best)
        return best["accuracy"]

    state, step, timing, step_memory, writer = _train_stage(
        config, stage, graphdef, tx, state, checkpoints, splits["train"], mesh, versions, validate=validate,
        best_val=best["accuracy"] if best["step"] >= 0 else None, on_step_time=on_step_time)
    if step < stage.num_steps:
        return None

    best_state = checkpoints.restore_best(state)
    test = evaluation.evaluate(eval_step, best_state, splits["test"], config.eval_batch_size, mesh)
    writer.write(step, {"test/accuracy": test["accuracy"], "test/loss": test["loss"]})
    writer.close()
    checkpoints.close()
    steps_per_second = timing["steps_per_second"]  # None: no step ran here
    if steps_per_second is None and finished is not None:  # ending again: the speed measured when it trained
        steps_per_second = finished.get("steps_per_second")
    results = run_dir.results_record(config, test, best, splits["test"][1], steps_per_second, step_memory,
                                     num_parameters, attention, versions)
    results.update(pretrain_objective=config.pretrain.objective,
                   pretrain=pretrained and pretrained["record"])
    if primary:
        run_dir.write_json(results_path, results)
        print(f"test accuracy {test['accuracy']:.4f} (best validation {best['accuracy']:.4f} at step "
              f"{best['step']}{validated_on}); results in {results_path}")
    return results


def _pretrain(config: Settings, task: tasks.TaskSpec, train: tasks.Split, stage_dir: str, mesh: Mesh,
              versions: dict[str, str], on_step_time: StepTimeHook | None = None) -> dict[str, Any] | None:
    """The self-pretraining stage (`training.pretrain`) in `stage_dir`, resumed from what is there:
    {"state": its final state, "record": its record}, or None if stopped by SIGTERM. It is given
    the training split alone; its checkpoints, metrics and record (`pretrain.STAGE_RECORD`) are its own."""
    primary = jax.process_index() == 0
    stage = Stage("pretrain", stage_dir, config.pretrain.num_steps, config.pretrain_optimizer, "pretrain",
                  objective=pretrain.make_objective(config, task.vocab_size), record=pretrain.STAGE_RECORD)
    graphdef, tx, state = create_train_state(config, task, mesh, pretraining=True)
    os.makedirs(stage.folder, exist_ok=True)
    results_path = os.path.join(stage.folder, stage.record)
    checkpoints = checkpointing.Checkpoints(os.path.join(stage.folder, "checkpoints"), config.keep_checkpoints)
    state = checkpoints.restore_last(state) or state
    start = int(state.step)
    finished = run_dir.finished_results(results_path) if start >= stage.num_steps else None
    if finished is not None and metrics.whole(stage.folder):
        checkpoints.close()
        return {"state": state, "record": finished}
    if start and primary:
        print(f"{stage.folder}: resuming pretraining from step {start}")
    state, step, timing, _, writer = _train_stage(config, stage, graphdef, tx, state, checkpoints, train, mesh,
                                                  versions, on_step_time=on_step_time)
    if step < stage.num_steps:
        return None
    writer.close()
    checkpoints.close()
    steps_per_second = timing["steps_per_second"] or (finished or {}).get("steps_per_second")
    record = pretrain.stage_record(config, step, steps_per_second, timing["last_loss"],
                                   state.num_parameters)
    if primary:
        run_dir.write_json(results_path, record)
        print(f"pretraining ({config.pretrain.objective}) done at step {step}; fine-tuning from its encoder")
    return {"state": state, "record": record}


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a run, trained by `_train_stage`: fine-tuning ("train") or self-pretraining ("pretrain").

    folder: where its checkpoints/, metrics.jsonl and record live; num_steps, optimizer: its steps and
    optimizer settings; stream: its random stream (`initial_state.STREAMS`, folded with the step); objective:
    its loss (`steps.classification`, or the pretraining objective); record: its record's file name in `folder`."""

    name: str
    folder: str
    num_steps: int
    optimizer: OptimizerSettings
    stream: str
    objective: Callable = steps.classification
    record: str = "results.json"


def _train_stage(config: Settings, stage: Stage, graphdef, tx, state, checkpoints: checkpointing.Checkpoints,
                 train: tasks.Split, mesh: Mesh, versions: dict[str, str], *, validate=None,
                 best_val: float | None = None, on_step_time: StepTimeHook | None = None):
    """Trains `stage` from `state`'s step to its num_steps: the batches resumed where the state is, the
    step compiled and refused if it cannot fit, its metrics written, the loop (`_Loop`) run.
    -> (state, the step it ended at, the loop's timing, the step's memory, the stage's metrics writer)."""
    start = int(state.step)
    batches = pipeline.prefetch_to_mesh(
        pipeline.train_batches(*train, batch_size=config.batch_size, seed=config.seed, start_step=start,
                               rows=pipeline.process_rows(mesh, config.batch_size)), mesh)
    first = next(batches)
    train_step = steps.make_train_step(graphdef, tx, run_key(config, stage.stream),
                                       config.optimizer.skip_nonfinite_updates, config.grad_accum_steps,
                                       objective=stage.objective)
    train_step = train_step.lower(state, first).compile()
    step_memory = memory.peak_memory(train_step)
    memory.check_fits(train_step, config)
    writer = metrics.MetricsWriter(stage.folder, start_step=start, enabled=jax.process_index() == 0)
    loop = _Loop(config, stage, checkpoints, writer, optimizer.make_schedule(stage.optimizer), versions, validate,
                 best_val=best_val, on_step_time=on_step_time)
    state, step, timing = loop.run(state, train_step, first, batches, start)
    return state, step, timing, step_memory, writer


class _Every(NamedTuple):
    """A loop hook: `run(step, state)` after every `every` steps and after the last one."""

    every: int
    run: Callable[[int, Any], None]


class _Loop:
    """The train loop of one stage (fine-tuning "train", or "pretrain"), shared by both.

    At most two steps in flight, each under a profiler step annotation (`jax.profiler.StepTraceAnnotation`,
    named after the stage), so that a trace taken of a run shows its steps. A SIGTERM or SIGINT saves the
    step in flight and stops; a non-finite step raises TrainingDiverged with the stage's record saying so.
    The periodic work is a list of hooks (`_Every`), run in order once the step's state is ready and
    checked finite, and never counted as training time:
      - log, every `log_every` steps: the window's mean metrics under "<name>/...";
      - validate, every `eval_every` steps (fine-tuning only): `validate(step, state, writer)` returns the
        best validation accuracy so far, which the progress bar shows as best_val (the figure the run's
        last line gives; `best_val` is the best before this loop, None if none);
      - save, every `checkpoint_every` steps: the last checkpoint, with the window's unlogged metrics.
    `on_step_time` is `train_and_evaluate`'s (`FirstSteps`)."""

    def __init__(self, config: Settings, stage: Stage, checkpoints: checkpointing.Checkpoints,
                 writer: metrics.MetricsWriter, schedule, versions, validate=None, best_val: float | None = None,
                 on_step_time: StepTimeHook | None = None):
        self.config, self.stage, self.checkpoints, self.writer = config, stage, checkpoints, writer
        self.schedule, self.versions, self.validate, self.on_step_time = schedule, versions, validate, on_step_time
        self.shown = {"loss": "-", "acc": "-"}  # the progress bar's figures, as of the last log and validation
        if validate is not None:
            self.shown["best_val"] = "-" if best_val is None else f"{best_val:.3f}"
        # a run resumed mid-window logs what it would have: the saved metrics as the step gave them (float32)
        self.window = [{key: np.float32(value) for key, value in m.items()} for m in checkpoints.unlogged_metrics()]
        self.last_loss = None
        self.hooks = [_Every(config.log_every, self._log),
                      *([_Every(config.eval_every, self._validate)] if validate is not None else []),
                      _Every(config.checkpoint_every, self._save)]

    def _log(self, step: int, state) -> None:
        summary, name = step_metrics.window_summary(self.window), self.stage.name
        self.window, self.last_loss = [], summary["loss"]
        self.writer.write(step, {f"{name}/loss": summary["loss"], f"{name}/accuracy": summary["accuracy"],
                                 f"{name}/grad_norm": summary["grad_norm"],
                                 f"{name}/skipped_updates": summary["skipped"],
                                 f"{name}/learning_rate": float(self.schedule(step))})
        self.shown.update(loss=f"{summary['loss']:.3f}", acc=f"{summary['accuracy']:.3f}")

    def _validate(self, step: int, state) -> None:
        self.shown["best_val"] = f"{self.validate(step, state, self.writer):.3f}"

    def _save(self, step: int, state) -> None:
        self.checkpoints.save_last(step, state, step_metrics.unlogged(self.window))

    def run(self, state, train_step, first, batches, start: int):
        """-> (state, the step it ended at, {"steps_per_second", "last_loss"}); the stage's files are
        closed when it stops before num_steps (then it prints how to resume)."""
        config, stage, checkpoints, writer = self.config, self.stage, self.checkpoints, self.writer
        primary = jax.process_index() == 0
        train_seconds, timed_steps, steps_since_tick = 0.0, 0, 0
        desc = f"{config.variant} {config.task}" + (f" {stage.name}" if stage.name != "train" else "")
        progress = progress_bar.bar(stage.num_steps, desc, initial=start, disable=not primary)
        step = start
        first_steps = FirstSteps(self.on_step_time, start, stage.num_steps) if self.on_step_time and primary else None
        try:
            with StopSignal() as stop:
                tick = time.perf_counter()
                for batch in itertools.chain([first], batches):
                    if step >= stage.num_steps or stop.agreed():
                        break
                    with jax.profiler.StepTraceAnnotation(stage.name, step_num=step):
                        state, latest = train_step(state, batch)
                    if self.window:  # at most two steps in flight: a stop or a save never waits for a long queue
                        step_metrics.check_finite(self.window[-1], step, stage.folder, checkpoints)
                    step += 1
                    steps_since_tick += 1
                    self.window.append(latest)
                    progress.update(1)
                    if first_steps is not None:
                        first_steps.after(step, state, progress)
                    due = [hook for hook in self.hooks if step == stage.num_steps or step % hook.every == 0]
                    if not due:
                        continue
                    jax.block_until_ready(state)  # time training only, not validation or saving
                    train_seconds += time.perf_counter() - tick
                    timed_steps, steps_since_tick = timed_steps + steps_since_tick, 0
                    step_metrics.check_finite(latest, step, stage.folder, checkpoints)  # before anything is written
                    for hook in due:
                        hook.run(step, state)
                    progress.set_postfix(self.shown)  # after this step's validation: the bar never shows a stale best
                    tick = time.perf_counter()
                if stop.requested and step < stage.num_steps:
                    if self.window:
                        step_metrics.check_finite(self.window[-1], step, stage.folder, checkpoints)
                    self._save(step, state)
        except TrainingDiverged as diverged:
            if primary:
                run_dir.write_json(os.path.join(stage.folder, stage.record),
                                   run_dir.diverged_record(config, diverged, self.versions))
            writer.close()
            checkpoints.close()
            raise
        except (DiskFull, OSError):  # files closed, so that the disk can be unmounted or its space freed
            with contextlib.suppress(OSError):
                writer.close()
            checkpoints.close()
            raise
        finally:
            batches.close()
            progress.close()
        if step < stage.num_steps:
            if primary:
                print(f"stopped at step {step}; checkpoint saved in {stage.folder}. Run the same command to resume.")
            writer.close()
            checkpoints.close()
        steps_per_second = timed_steps / train_seconds if timed_steps else None
        return state, step, {"steps_per_second": steps_per_second, "last_loss": self.last_loss}
