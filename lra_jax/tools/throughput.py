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
from absl import app, flags, logging
from ml_collections import config_flags

from lra_jax import compat
from lra_jax.config import checks as config_errors
from lra_jax.data import pipeline, tasks
from lra_jax.errors import LraError
from lra_jax.training import steps, trainer

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/transformer.py:listops,mini",
                                lock_config=True)
flags.DEFINE_integer("batches", 500, "Batches the pipeline delivers while timed.")
flags.DEFINE_integer("steps", 20, "Train steps timed (after one untimed step).")
FLAGS = flags.FLAGS


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
    graphdef, tx, state = trainer.create_train_state(config, task, mesh)
    batches = pipeline.prefetch_to_mesh(
        pipeline.train_batches(*train_split, batch_size=config.batch_size, seed=config.seed), mesh)
    try:
        first = next(batches)
        with compat.abstract_mesh(mesh):  # kernels per device (`kernels.sharding`)
            step = steps.make_train_step(graphdef, tx, trainer.dropout_key(config)).lower(state, first).compile()
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


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/transformer.py:listops,mini")
    logging.set_verbosity(logging.WARNING)
    config = FLAGS.config
    try:
        task = tasks.get_task(config.task)
        train_split = task.load(config)["train"]
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    mesh = trainer.make_mesh()
    fed = pipeline_examples_per_second(train_split, config.batch_size, config.seed, mesh, FLAGS.batches)
    trained = train_examples_per_second(config, task, train_split, mesh, FLAGS.steps)
    print(f"{config.attention.name} {config.task},{config.scale}, batch {config.batch_size}, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}:")
    print(f"  input pipeline  {fed:12,.0f} examples/s ({FLAGS.batches} batches)")
    print(f"  train step      {trained:12,.0f} examples/s ({FLAGS.steps} steps)")
    print(f"  pipeline / step {fed / trained:12.1f}x")


def cli() -> None:
    """The command (`python -m lra_jax.tools.throughput`, `lra-throughput`)."""
    app.run(main, flags_parser=config_errors.parse_flags)


if __name__ == "__main__":
    cli()
