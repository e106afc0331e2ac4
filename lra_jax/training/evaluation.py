"""Evaluation of a train state on a whole split, and the checks and choices of the splits evaluated."""

from __future__ import annotations

import numpy as np
from jax.sharding import Mesh

from lra_jax.config.settings import Settings
from lra_jax.data import pipeline, tasks
from lra_jax.errors import DataError


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


def validation_subset(split: tasks.Split, num_examples: int, seed: int) -> tasks.Split:
    """`num_examples` examples of `split` drawn without replacement (fixed by `seed`), in their order;
    all of it when num_examples is 0 or not smaller than the split."""
    tokens, labels = split
    if not 0 < num_examples < len(labels):
        return split
    chosen = np.sort(np.random.default_rng(seed).choice(len(labels), num_examples, replace=False))
    return tokens[chosen], labels[chosen]


def check_not_empty(config: Settings, splits: dict[str, tasks.Split], names: list[str]) -> None:
    """DataError naming the splits of `names` that hold no example: found before training, not at its end."""
    empty = [name for name in names if len(splits[name][1]) == 0]
    if empty:
        raise DataError(f"the {config.task} data has no examples in its {', '.join(empty)} split"
                        f"{'s' if len(empty) > 1 else ''} ({config.data.data_dir or 'generated data'}); fill "
                        f"{'them' if len(empty) > 1 else 'it'}, or pass another --config.data.data_dir")
