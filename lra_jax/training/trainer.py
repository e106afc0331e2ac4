"""The training loop: `train_and_evaluate(config, workdir)`.

One jitted, buffer-donating train step over pure NNX state, its batch split over
a mesh of every device (data parallel); validation every `eval_every` steps;
last + best checkpoints; resume from the workdir; SIGTERM saves and stops.
Determinism: one seed gives the init key, the dropout key (folded with the step)
and the data order (seeded by epoch), so a resumed run continues exactly.

Results (`results.json`): task, variant, test accuracy of the best-validation
checkpoint, its validation accuracy, steps/s, examples/s, peak memory,
parameter count, the attention settings as built, the config and library versions.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from lra_jax import compat, provenance
from lra_jax.attention import registry
from lra_jax.data import pipeline, tasks
from lra_jax.errors import ConfigError, DiskFull, TrainingDiverged
from lra_jax.models.classifier import build_model
from lra_jax.training import checkpointing, memory, metrics, optimizer, steps

# Settings that may change between a run and its resumption; any other change is refused.
# attention.query_chunk (additive) trades speed for memory and leaves the function unchanged.
RESUMABLE_CHANGES = {"num_train_steps", "eval_every", "checkpoint_every", "log_every", "data.data_dir",
                     "data.cache_dir", "val_examples", "attention.query_chunk",
                     "attention.impl",  # a kernel computes the same function: a run may resume on another
                     "grad_accum_steps",  # the same update in another number of micro-batches
                     "keep_checkpoints"}

# Settings added after runs were recorded, with the value that behaves as those runs did: a saved
# config without the key is read as having that value.
ADDED_SETTINGS = {"optimizer.skip_nonfinite_updates": 0, "grad_accum_steps": 1, "keep_checkpoints": 2}


def evaluate(eval_step, state, split: tasks.Split, batch_size: int, mesh: Mesh) -> dict[str, float]:
    """Accuracy and mean loss over a whole split, once (each process feeds its rows of each batch).

    At most two eval steps are in flight, as in the train loop. Queuing a whole split deadlocks
    a mesh of several CPU devices: XLA's CPU client admits at most 32 computations per device,
    and past that a step's all-reduce can wait forever for a device whose share of the same step
    was never admitted ("Expected 2 threads to join the rendezvous").
    """
    totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}

    def add(sums):  # waits for that step
        for key in totals:
            totals[key] += float(sums[key])

    previous = None
    rows = pipeline.process_rows(mesh, batch_size)
    for batch in pipeline.prefetch_to_mesh(pipeline.eval_batches(*split, batch_size=batch_size, rows=rows), mesh):
        sums = eval_step(state, batch)
        if previous is not None:
            add(previous)
        previous = sums
    if previous is not None:
        add(previous)
    return {"accuracy": totals["correct"] / totals["count"], "loss": totals["loss"] / totals["count"]}


def check_workdir_config(config: ml_collections.ConfigDict, workdir: str, resuming: bool) -> None:
    """Writes config.json (process 0 only); refuses to resume a checkpointed run made with another config."""
    path = os.path.join(workdir, "config.json")
    current = json.loads(config.to_json())
    if resuming and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            changed = config_changes(json.load(f), current)
        if changed:
            raise ConfigError(
                f"workdir {workdir} holds a run made with a different config ({', '.join(changed)} differ); "
                "pass a new --workdir, or delete that one to start over"
            )
    if jax.process_index() == 0:
        write_json(path, current)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two configs (as JSON), except RESUMABLE_CHANGES."""

    def flat(d: dict[str, Any], prefix: str = ""):
        for key, value in d.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    saved, current = dict(flat(saved)), dict(flat(current))
    return sorted(k for k in saved.keys() | current.keys()
                  if saved.get(k, ADDED_SETTINGS.get(k)) != current.get(k) and k not in RESUMABLE_CHANGES)


def write_json(path: str, content: dict) -> None:
    """Writes JSON atomically (temporary file, then rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


class _StopSignal:
    """Turns SIGTERM into a flag the loop polls, so the step in flight completes and is saved.

    `received` is written only by the handler; `requested`, the decision, only by `agreed`. Kept
    apart, a SIGTERM handled while the all-gather runs cannot be overwritten by its result."""

    def __init__(self):
        self.received = False
        self.requested = False
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = True

    def agreed(self) -> bool:
        """Whether any process was asked to stop, decided alike on all of them, so that all stop
        after the same step and save it together. A pod's SIGTERM reaches hosts at different times;
        with several processes this costs one small all-gather per step."""
        if jax.process_count() > 1:
            self.requested = self.requested or bool(
                multihost_utils.process_allgather(np.int32(self.received)).max())
        else:
            self.requested = self.received
        return self.requested

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
    """A 1-D data-parallel mesh over `devices` (default: every device)."""
    return Mesh(np.array(devices or jax.devices()), ("data",))


def create_train_state(config: ml_collections.ConfigDict, task: tasks.TaskSpec, mesh: Mesh):
    """Builds the model and optimizer; returns (graphdef, optimizer, state replicated on `mesh`).

    state = {"step", "params" (nnx.Param), "rest" (other model state), "opt_state"}.
    Initialisation is jitted: one compilation instead of many small eager ones.
    """
    accum = config.get("grad_accum_steps", 1)
    if accum < 1 or config.batch_size % (mesh.size * accum):
        raise ConfigError(f"batch_size {config.batch_size} is not divisible by the {mesh.size} devices times "
                          f"grad_accum_steps {accum}; set --config.batch_size to a multiple of {mesh.size * accum} "
                          "(grad_accum_steps must be >= 1)")
    init_key = jax.random.fold_in(jax.random.key(config.seed), 0)
    build = lambda key: build_model(config, vocab_size=task.vocab_size,  # noqa: E731
                                    num_classes=task.num_classes, rngs=nnx.Rngs(key), dual=task.dual)
    # configuration errors surface here, before any compilation
    graphdef = nnx.split(nnx.eval_shape(build, init_key), nnx.Param, ...)[0]
    tx = optimizer.make_optimizer(config)

    def init():  # the key is made inside: a process-local array cannot enter a multi-process program
        _, params, rest = nnx.split(build(jax.random.fold_in(jax.random.key(config.seed), 0)), nnx.Param, ...)
        return dict(step=jnp.zeros((), jnp.int32), params=params, rest=rest, opt_state=tx.init(params))

    return graphdef, tx, jax.jit(init, out_shardings=NamedSharding(mesh, PartitionSpec()))()


def attention_settings(graphdef: nnx.GraphDef, state: dict[str, Any]) -> dict[str, Any]:
    """The settings the model's attention layers were built with, defaults and derived values
    included (`registry.layer_settings`): what ran, where the config may say None; under
    "kernels", the kernel each attention layer runs (`registry.layer_kernels`)."""
    model = nnx.merge(graphdef, state["params"], state["rest"])
    return {**registry.layer_settings(model), "kernels": registry.layer_kernels(model)}


def dropout_key(config: ml_collections.ConfigDict) -> jax.Array:
    return jax.random.fold_in(jax.random.key(config.seed), 1)


def validation_subset(split: tasks.Split, num_examples: int, seed: int) -> tasks.Split:
    """`num_examples` examples of `split` drawn without replacement (fixed by `seed`), in their order;
    all of it when num_examples is 0 or not smaller than the split."""
    tokens, labels = split
    if not 0 < num_examples < len(labels):
        return split
    chosen = np.sort(np.random.default_rng(seed).choice(len(labels), num_examples, replace=False))
    return tokens[chosen], labels[chosen]


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any] | None:
    """Trains `config` in `workdir` (resuming what is there); returns results, or None if stopped by SIGTERM.

    With several processes (`jax.distributed`), all run this together on a shared `workdir`;
    process 0 alone prints and writes metrics, config.json and results.json. A full disk raises
    DiskFull (one line) with the checkpoints saved before it intact; a damaged checkpoint is
    reported and the run resumes from an older one (`checkpointing.Checkpoints`).
    """
    mesh = make_mesh()
    try:
        with compat.abstract_mesh(mesh):  # the steps' kernels run per device on its rows (`kernels.sharding`)
            return _train_and_evaluate(config, workdir, mesh)
    except OSError as error:
        if not checkpointing.out_of_space(error):
            raise
        raise DiskFull(f"disk full: writing {error.filename or workdir} failed ({error.strerror}), "
                       f"{checkpointing.megabytes(checkpointing.free_bytes(workdir))} free; the last checkpoint is "
                       "kept. Free space there (or move the workdir to a larger disk) and run the same command "
                       "to resume") from None


def finished_results(path: str) -> dict[str, Any] | None:
    """The results.json of a finished run; None (with one line saying so if it exists) when it is
    missing or unreadable, e.g. truncated: the run then finishes again from its checkpoints."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        if jax.process_index() == 0:
            print(f"warning: {path} is damaged ({error}); the run's end is done again", file=sys.stderr)
        return None


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, mesh: Mesh) -> dict[str, Any] | None:
    primary = jax.process_index() == 0
    # The code that runs: read before the run writes anything (its own files may be tracked by git).
    versions = provenance.library_versions()
    task = tasks.get_task(config.task)
    graphdef, tx, state = create_train_state(config, task, mesh)
    num_parameters = sum(x.size for x in jax.tree.leaves(state["params"]))
    attention = attention_settings(graphdef, state)
    for line in registry.describe_kernels(attention["kernels"]):
        print(line)
    os.makedirs(workdir, exist_ok=True)
    results_path = os.path.join(workdir, "results.json")

    checkpoints = checkpointing.Checkpoints(os.path.join(workdir, "checkpoints"), config.get("keep_checkpoints", 2))
    check_workdir_config(config, workdir, resuming=checkpoints.last_step() is not None)
    state = checkpoints.restore_last(state) or state
    start = int(state["step"])
    finished = finished_results(results_path) if start >= config.num_train_steps else None
    if finished is not None and metrics.whole(workdir):
        if primary:
            print(f"{workdir}: finished at step {start}; results in {results_path}")
        return finished
    if start and primary:
        print(f"{workdir}: resuming from step {start}")

    splits = task.load(config)
    splits["val"] = validation_subset(splits["val"], config.get("val_examples", 0), config.seed)
    eval_step = steps.make_eval_step(graphdef)
    batches = pipeline.prefetch_to_mesh(
        pipeline.train_batches(*splits["train"], batch_size=config.batch_size, seed=config.seed,
                               start_step=start, rows=pipeline.process_rows(mesh, config.batch_size)), mesh)
    first = next(batches)
    train_step = steps.make_train_step(graphdef, tx, dropout_key(config), optimizer.skipped_updates_allowed(config),
                                       config.get("grad_accum_steps", 1))
    train_step = train_step.lower(state, first).compile()
    step_memory = memory.peak_memory(train_step)
    memory.check_fits(step_memory, config)

    writer = metrics.MetricsWriter(workdir, start_step=start, enabled=primary)
    schedule = optimizer.make_schedule(config)
    best = checkpoints.best_metrics() or {"accuracy": -1.0, "step": -1}
    # a run resumed mid-window logs what it would have: the saved metrics as the step gave them (float32)
    window = [{key: np.float32(value) for key, value in m.items()} for m in checkpoints.unlogged_metrics()]
    train_seconds, timed_steps, steps_since_tick = 0.0, 0, 0
    progress = tqdm(total=config.num_train_steps, initial=start, unit="step", dynamic_ncols=True,
                    desc=f"{config.attention.name} {config.task}", mininterval=1.0, disable=not primary)
    step = start
    try:
        with _StopSignal() as stop:
            tick = time.perf_counter()
            for batch in itertools.chain([first], batches):
                if step >= config.num_train_steps or stop.agreed():
                    break
                state, step_metrics = train_step(state, batch)
                if window:  # at most two steps in flight: a stop or a save never waits for a long queue
                    check_finite(window[-1], step, workdir, checkpoints)
                step += 1
                steps_since_tick += 1
                window.append(step_metrics)
                progress.update(1)
                last = step == config.num_train_steps
                log, validate, save = (last or step % every == 0 for every in
                                       (config.log_every, config.eval_every, config.checkpoint_every))
                if not (log or validate or save):
                    continue
                jax.block_until_ready(state)  # time training only, not validation or saving
                train_seconds += time.perf_counter() - tick
                timed_steps, steps_since_tick = timed_steps + steps_since_tick, 0
                check_finite(step_metrics, step, workdir, checkpoints)  # before anything is written
                if log:
                    summary = window_summary(window)
                    window = []
                    writer.write(step, {"train/loss": summary["loss"], "train/accuracy": summary["accuracy"],
                                        "train/grad_norm": summary["grad_norm"],
                                        "train/skipped_updates": summary["skipped"],
                                        "train/learning_rate": float(schedule(step))})
                    progress.set_postfix(loss=f"{summary['loss']:.3f}", acc=f"{summary['accuracy']:.3f}",
                                         best_val=f"{max(best['accuracy'], 0):.3f}")
                if validate:
                    val = evaluate(eval_step, state, splits["val"], steps.eval_batch_size(config), mesh)
                    writer.write(step, {"val/accuracy": val["accuracy"], "val/loss": val["loss"]})
                    if val["accuracy"] > best["accuracy"]:
                        best = {"accuracy": val["accuracy"], "loss": val["loss"], "step": step}
                        checkpoints.save_best(step, state, best)
                if save:
                    checkpoints.save_last(step, state, unlogged(window))
                tick = time.perf_counter()
            if stop.requested and step < config.num_train_steps:
                if window:
                    check_finite(window[-1], step, workdir, checkpoints)
                checkpoints.save_last(step, state, unlogged(window))
    except TrainingDiverged as diverged:
        if primary:
            write_json(results_path, diverged_record(config, diverged, versions))
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
    if step < config.num_train_steps:
        if primary:
            print(f"stopped at step {step}; checkpoint saved in {workdir}. Run the same command to resume.")
        writer.close()
        checkpoints.close()
        return None

    best_state = checkpoints.restore_best(state)
    test = evaluate(eval_step, best_state, splits["test"], steps.eval_batch_size(config), mesh)
    writer.write(step, {"test/accuracy": test["accuracy"], "test/loss": test["loss"]})
    writer.close()
    checkpoints.close()
    steps_per_second = timed_steps / train_seconds if timed_steps else None  # None: no step ran here
    if steps_per_second is None and finished is not None:  # ending again: the speed measured when it trained
        steps_per_second = finished.get("steps_per_second")
    results = summarize(config, test, best, splits["test"][1], steps_per_second, step_memory, num_parameters,
                        attention, versions)
    if primary:
        write_json(results_path, results)
        print(f"test accuracy {test['accuracy']:.4f} (best validation {best['accuracy']:.4f} at step "
              f"{best['step']}); results in {results_path}")
    return results


def check_finite(step_metrics: dict[str, jax.Array], step: int, workdir: str,
                 checkpoints: checkpointing.Checkpoints) -> None:
    """Raises TrainingDiverged if step `step` left a non-finite state (waits for its metrics).

    Called on every step before anything of it is logged or saved, so no checkpoint ever holds
    a non-finite state. Reading one flag per step costs a few microseconds (one step stays in
    flight meanwhile).
    """
    if bool(step_metrics["finite"]):
        return
    last = checkpoints.last_step()
    saved = (f"the last good checkpoint is step {last} in {os.path.join(workdir, 'checkpoints', 'last')}"
             if last is not None else "no checkpoint was saved before it")
    loss, grad_norm = float(step_metrics["loss"]), float(step_metrics["grad_norm"])
    raise TrainingDiverged(
        f"training diverged at step {step} (loss {loss}, gradient norm {grad_norm}); {saved}. Lower "
        "--config.optimizer.learning_rate, clip with --config.optimizer.grad_clip_norm, or skip rare "
        "bad steps with --config.optimizer.skip_nonfinite_updates=<k>",
        step=step, loss=loss, grad_norm=grad_norm, last_checkpoint=last)


def unlogged(window: list[dict[str, jax.Array]]) -> list[dict[str, float]]:
    """The window's per-step metrics as plain numbers, to be saved with a checkpoint."""
    return [{key: float(value) for key, value in step_metrics.items()} for step_metrics in window]


def window_summary(window: list[dict[str, jax.Array]]) -> dict[str, float]:
    """Mean loss, accuracy and gradient norm over the window's updated steps; skipped steps counted."""
    skipped = [bool(m["skipped"]) for m in window]
    kept = [m for m, s in zip(window, skipped) if not s] or window
    means = {k: float(np.mean([m[k] for m in kept])) for k in ("loss", "accuracy", "grad_norm")}
    return {**means, "skipped": float(sum(skipped))}


def diverged_record(config: ml_collections.ConfigDict, diverged: TrainingDiverged,
                    versions: dict[str, str]) -> dict[str, Any]:
    """results.json of a diverged run: status "diverged", where and how, and no accuracy at all,
    so that it cannot be read as a result."""
    return {
        "status": "diverged",
        "task": config.task,
        "variant": config.attention.name,
        "scale": config.scale,
        "message": str(diverged),
        "diverged_at_step": diverged.step,
        "loss": repr(diverged.loss),  # "nan" / "inf": strict JSON has no non-finite numbers
        "grad_norm": repr(diverged.grad_norm),
        "last_checkpoint_step": diverged.last_checkpoint,
        "versions": versions,
        "config": json.loads(config.to_json()),
    }


def summarize(config, test: dict[str, float], best: dict[str, float], test_labels: np.ndarray,
              steps_per_second: float | None, memory: dict[str, Any], num_parameters: int,
              attention: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    """The contents of results.json; `versions` as read when the run (or its last resume) started."""
    device = jax.devices()[0]
    return {
        "status": "complete",
        "task": config.task,
        "variant": config.attention.name,
        "impl": config.attention.impl,
        "scale": config.scale,
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "val_accuracy": best["accuracy"],
        "best_step": best["step"],
        "test_majority_class_rate": float(np.bincount(test_labels).max() / len(test_labels)),
        "num_train_steps": config.num_train_steps,
        "batch_size": config.batch_size,
        "max_len": config.max_len,
        "steps_per_second": steps_per_second,
        "examples_per_second": steps_per_second and steps_per_second * config.batch_size,
        **memory,
        "num_parameters": int(num_parameters),
        "attention": attention,
        "devices": {"platform": device.platform, "kind": device.device_kind, "count": jax.device_count()},
        "versions": versions,
        "config": json.loads(config.to_json()),
    }
