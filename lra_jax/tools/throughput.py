"""Is the input pipeline fast enough? `python -m lra_jax.tools.throughput --config=configs/transformer.py:listops,mini`.

Times the training input path alone: `pipeline.train_batches` (shuffle by (seed, epoch), gather,
int32 cast) feeding `pipeline.prefetch_to_mesh` (device_put in a background thread), over
`--batches` batches. Then times the config's compiled train step on batches from the same
pipeline. Prints both in examples/s and their ratio. The pipeline should be many times faster than
the step, or the accelerator waits for data. Loading the splits (decoding, generation) happens
once before either timing and is not counted.
"""

from __future__ import annotations

import itertools
import sys
import time

import jax
from absl import flags, logging
from ml_collections import config_flags

from lra_jax import compat
from lra_jax.config import checks as config_errors
from lra_jax.config import settings as config_settings
from lra_jax.data import pipeline, tasks
from lra_jax.errors import LraError
from lra_jax.tools import bad_input, command_arguments, parse_command_line
from lra_jax.training import distributed, initial_state, steps


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    """The command's flags, on `values` (`parse_command_line`); `argv`, the arguments, holds the
    `--config.KEY=VALUE` overrides that ml_collections defines as flags of their own."""
    config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/transformer.py:listops,mini",
                                    flag_values=values, lock_config=True, sys_argv=["throughput", *argv])
    flags.DEFINE_integer("batches", 500, "Batches the pipeline delivers while timed.", flag_values=values)
    flags.DEFINE_integer("steps", 20, "Train steps timed (after one untimed step).", flag_values=values)


def pipeline_examples_per_second(train_split: tasks.Split, batch_size: int, seed: int, mesh, num_batches: int) -> float:
    """Examples/s delivered onto `mesh` by the training pipeline (every batch waited for)."""
    batches = pipeline.prefetch_to_mesh(pipeline.train_batches(*train_split, batch_size=batch_size, seed=seed), mesh)
    try:
        jax.block_until_ready(next(batches))  # thread started, first transfer done
        start = time.perf_counter()
        for batch in itertools.islice(batches, num_batches):
            jax.block_until_ready(batch)
        seconds = time.perf_counter() - start
    finally:
        batches.close()
    return num_batches * batch_size / seconds


def train_examples_per_second(config, task: tasks.TaskSpec, train_split: tasks.Split, mesh, num_steps: int) -> float:
    """Examples/s of the compiled train step, fed by the same pipeline."""
    config_settings.check_devices(config, mesh.size)
    graphdef, tx, state = initial_state.create_train_state(config, task, mesh)
    batches = pipeline.prefetch_to_mesh(
        pipeline.train_batches(*train_split, batch_size=config.batch_size, seed=config.seed), mesh)
    try:
        first = next(batches)
        with compat.abstract_mesh(mesh):  # kernels per device (`kernels.sharding`)
            step = steps.make_train_step(graphdef, tx, initial_state.run_key(config, "dropout"))
            step = step.lower(state, first).compile()
        state, metrics = step(state, first)
        jax.block_until_ready(metrics)
        start = time.perf_counter()
        for batch in itertools.islice(batches, num_steps):
            state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        seconds = time.perf_counter() - start
    finally:
        batches.close()
    return num_steps * config.batch_size / seconds


def main(argv: list[str] | None = None) -> None:
    argv = command_arguments(argv)
    args, _ = parse_command_line("lra_jax.tools.throughput", __doc__, lambda values: define_flags(values, argv),
                                 argv, check=config_errors.check)
    if args.config is None:
        bad_input("--config is required, e.g. --config=configs/transformer.py:listops,mini")
    logging.set_verbosity(logging.WARNING)
    try:
        config = config_settings.from_config(args.config)
        task = tasks.get_task(config.task)
        train_split = task.load(config.data, config.max_len)["train"]
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    mesh = distributed.make_mesh()
    fed = pipeline_examples_per_second(train_split, config.batch_size, config.seed, mesh, args.batches)
    trained = train_examples_per_second(config, task, train_split, mesh, args.steps)
    print(f"{config.variant} {config.task},{config.scale}, batch {config.batch_size}, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}:")
    print(f"  input pipeline  {fed:12,.0f} examples/s ({args.batches} batches)")
    print(f"  train step      {trained:12,.0f} examples/s ({args.steps} steps)")
    print(f"  pipeline / step {fed / trained:12.1f}x")


def cli() -> None:
    """The command (`python -m lra_jax.tools.throughput`, `lra-throughput`)."""
    main()


if __name__ == "__main__":
    cli()
