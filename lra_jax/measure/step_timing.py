"""How long one compiled train step of a config takes, on random tokens of the config's shape.

Used by `bench` (the LRA Table 2 protocol) and by `train --estimate` / `sweep --estimate`: a run's
projected training time (`projected_training`), for a reader by `projection_report`. No dataset is
read: the step's cost depends on the shapes only (batch, max_len, dual), not on the token values.
"""

from __future__ import annotations

import functools
import resource
import sys
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lra_jax import compat
from lra_jax import progress as progress_bar
from lra_jax.config.settings import Settings, check_devices
from lra_jax.data import tasks
from lra_jax.data.tasks import TaskSpec
from lra_jax.measure import host_memory
from lra_jax.measure.text_table import table
from lra_jax.measure.units import GIB, duration, gib
from lra_jax.training import distributed, initial_state, memory
from lra_jax.training.steps import make_train_step


def random_batch(task: TaskSpec, batch_size: int, max_len: int, seed: int) -> dict[str, np.ndarray]:
    """Token ids in [1, vocab_size) with ragged lengths in [max_len/2, max_len], zero-padded.

    inputs int32 [batch, max_len] ([batch, 2, max_len] for a dual task), label int32 [batch].
    """
    rng = np.random.default_rng(seed)
    shape = (batch_size, 2, max_len) if task.dual else (batch_size, max_len)
    tokens = rng.integers(1, task.vocab_size, size=shape, dtype=np.int32)
    lengths = rng.integers(max(1, max_len // 2), max_len + 1, size=shape[:-1])
    tokens[np.arange(max_len) >= lengths[..., None]] = 0
    return {"inputs": tokens, "label": rng.integers(0, task.num_classes, size=batch_size, dtype=np.int32)}


def time_train_step(config: Settings, task: TaskSpec, mesh: Mesh, *,
                    warmup: int, steps: int, announce: bool = False) -> dict[str, Any]:
    """Compiles the train step once, runs `warmup` untimed steps, then times `steps` steps.

    Raises ConfigError (from `memory.check_fits`) when the step needs more memory than the device
    (or on the CPU, the host) has, before running anything. `announce`: say on stderr what is compiled
    and about how long it takes (`compiling_line`), then show a progress bar of the steps. Returns seconds_per_step (the mean),
    step_seconds (each timed step), compile_seconds, the compiled step's memory figures, the
    process's largest resident host memory after the steps (`host_max_rss_bytes`),
    num_parameters, the attention settings as built (`initial_state.attention_settings`), `compiled`
    (for callers that want its cost analysis) and `run_step`, which runs one more step.
    """
    return time_train_steps([config], task, mesh, warmup=warmup, steps=steps, announce=announce)[0]


def compiling_line(config: Settings, platform: str, steps: int) -> str:
    """What `train --estimate` does first, and about how long it takes."""
    slow = config.scale == "full" and platform == "cpu"  # compiling: a minute or two; a step: up to minutes
    return (f"estimating {config.variant} on {config.task}: compiling the {config.scale}-scale train step for the "
            f"{platform} ({'a minute or two' if slow else 'seconds to a minute'}), then running {steps} steps"
            + (" (up to minutes each at full scale on a CPU)" if slow else ""))


def time_train_steps(configs: list[Settings], task: TaskSpec, mesh: Mesh, *,
                     warmup: int, steps: int, announce: bool = False) -> list[dict[str, Any]]:
    """`time_train_step` of several configs of one shape (e.g. dropout 0 and 0.1), their timed steps
    in rounds (step i of each config), so that a change of load on a shared machine hits them alike
    and their ratio holds. Rounds alternate their order (A B, B A, A B, ...): a load that grows or
    eases over minutes does not always favour the same config, and every other switch is saved.

    Before a config runs after another, the other's freed memory goes back to the kernel
    (`host_memory.release_freed`), so where malloc keeps freed memory the process holds one config's
    temporaries, not all of them. Where it keeps them (`host_memory.keeps_freed`), the first step
    after a switch maps them afresh, a cost a run of one config pays once, not per step (`softmax`
    at 1K on this 2-core CPU: 6.0-6.5 s instead of 4.1-4.3 s): an untimed step of the same config
    goes first. Where malloc maps every large block afresh anyway (glibc's default), every step pays
    that, and the step after a switch is timed directly. Only one step's temporary memory is live at
    a time: each config must fit alone. One dict per config, in order; each one's `pairing` says
    how its steps were ordered. `announce`: as `time_train_step`'s."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    runs = []
    for config in configs:
        check_devices(config, mesh.size)
        if announce:
            print(compiling_line(config, mesh.devices.flat[0].platform, warmup + steps), file=sys.stderr, flush=True)
        graphdef, tx, state = initial_state.create_train_state(config, task, mesh)
        batch = jax.device_put(random_batch(task, config.batch_size, config.max_len, config.seed),
                               NamedSharding(mesh, PartitionSpec("data")))
        start = time.perf_counter()
        with compat.abstract_mesh(mesh):  # kernels per device (`kernels.sharding`)
            train_step = make_train_step(graphdef, tx, initial_state.run_key(config, "dropout"))
            compiled = train_step.lower(state, batch).compile()
        compile_seconds = time.perf_counter() - start
        step_memory = memory.peak_memory(compiled)
        memory.check_fits(compiled, config)
        runs.append({"state": state, "batch": batch, "compiled": compiled, "compile_seconds": compile_seconds,
                     "step_memory": step_memory, "attention": initial_state.attention_settings(graphdef, state),
                     "step_seconds": []})
    switching = len(runs) > 1
    settle = switching and host_memory.keeps_freed()
    progress = progress_bar.bar(len(runs) * (warmup + steps), "timing the train step", disable=not announce)
    for run in runs:
        if switching:
            host_memory.release_freed()
        for _ in range(warmup):
            jax.block_until_ready(_step(run))
            progress.update(1)
    previous = runs[-1]
    for step in range(steps):  # each step waited for: a step takes milliseconds to minutes, the wait microseconds
        for run in runs if step % 2 == 0 else runs[::-1]:
            if run is not previous:
                host_memory.release_freed()
                if settle:  # in the memory the other executable gave back: not timed
                    jax.block_until_ready(_step(run))
            start = time.perf_counter()
            jax.block_until_ready(_step(run))
            run["step_seconds"].append(time.perf_counter() - start)
            progress.update(1)
            previous = run
    progress.close()
    host_max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    pairing = {"round_order": "alternating", "untimed_step_after_switch": settle} if switching else None
    return [{
        "seconds_per_step": sum(run["step_seconds"]) / steps,
        "step_seconds": run["step_seconds"],
        "compile_seconds": run["compile_seconds"],
        **run["step_memory"],
        "host_max_rss_bytes": host_max_rss,  # the process's, after every config's steps
        "num_parameters": run["state"].num_parameters,
        "attention": run["attention"],
        "pairing": pairing,
        "compiled": run["compiled"],
        "run_step": functools.partial(_step, run),
    } for run in runs]


def _step(run: dict[str, Any]) -> Any:
    """One more step of `run` (its state moves on); returns the new state and the step's metrics."""
    run["state"], metrics = run["compiled"](run["state"], run["batch"])
    return run["state"], metrics


def projected_training(config: Settings, *, warmup: int = 1, steps: int = 3, announce: bool = False
                       ) -> dict[str, Any]:
    """A run's projected training time: compilation + num_train_steps x the timed step.

    Evaluation, data preparation and checkpointing are not included. `announce`: as `time_train_step`'s.
    """
    mesh = distributed.make_mesh()
    timing = time_train_step(config, tasks.get_task(config.task), mesh, warmup=warmup, steps=steps,
                             announce=announce)
    return {
        "task": config.task, "scale": config.scale, "variant": config.variant,
        "batch_size": config.batch_size, "max_len": config.max_len, "num_train_steps": config.num_train_steps,
        "seconds_per_step": timing["seconds_per_step"], "compile_seconds": timing["compile_seconds"],
        "projected_train_seconds": timing["compile_seconds"] + config.num_train_steps * timing["seconds_per_step"],
        "compiled_step_memory_bytes": timing["compiled_step_memory_bytes"],
        "timed_steps": steps, "device": jax.devices()[0].device_kind, "num_devices": mesh.size,
    }


def projection_report(projection: dict[str, Any]) -> str:
    """`projected_training`'s figures for a reader: one sentence, then a table of them in units."""
    devices = projection.get("num_devices", 1)
    on = f"this {projection['device']} ({devices} device{'s' if devices != 1 else ''})"
    steps, per_step = projection["num_train_steps"], projection["seconds_per_step"]
    memory = projection["compiled_step_memory_bytes"]
    sentence = (f"{projection['variant']} on {projection['task']} ({projection['scale']} scale): about "
                f"{duration(projection['projected_train_seconds'])} of training on {on}, {steps:,} steps at "
                f"{duration(per_step)} a step after {duration(projection['compile_seconds'])} of compilation; "
                "evaluation and data preparation not included.")
    rows = [("projected training", duration(projection["projected_train_seconds"])),
            ("train steps", f"{steps:,}"),
            ("time per step", f"{duration(per_step)} (mean of {projection['timed_steps']} timed steps)"),
            ("compilation", duration(projection["compile_seconds"])),
            ("batch size", f"{projection['batch_size']:,}"),
            ("sequence length", f"{projection['max_len']:,} tokens"),
            ("step memory", "not reported by XLA" if memory is None else
             (f"{gib(memory)} GiB" if memory >= GIB / 10 else f"{memory / 2**20:,.1f} MiB") + " (XLA's compiled estimate)"),
            ("device", on)]
    return "\n".join([sentence, "", table((), rows), "", "(--json prints these figures as one JSON line)"])
