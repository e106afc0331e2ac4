"""Batches for training and evaluation, placed on the device mesh ahead of time.

Training order is a pure function of (seed, epoch), so a run resumed at step s
sees exactly the batches an uninterrupted run would have seen from step s on.
In a multi-process run every process walks the same global batches and reads only
the rows its own devices hold (`process_rows`), so the order does not depend on the
number of processes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lra_jax.errors import ConfigError, LraError

Batch = dict[str, np.ndarray]


def train_batches(tokens: np.ndarray, labels: np.ndarray, *, batch_size: int, seed: int, start_step: int = 0,
                  rows: slice = slice(None)) -> Iterator[Batch]:
    """Endless shuffled batches from `start_step` on; each epoch drops its last partial batch.

    `rows` picks this process's part of every global batch (`process_rows`); only those are read.

    Args:
      tokens: int [N, L] or, for dual tasks, int [N, 2, L] (any integer dtype, e.g. int16 or
        a read-only memory map). labels: int32 [N].
    Yields:
      {"inputs": int32 [R, L] (or [R, 2, L]), "label": int32 [R]}, R the rows picked (batch_size for all).
    """
    steps_per_epoch = len(tokens) // batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"--config.batch_size={batch_size} is larger than the training set ({len(tokens)} examples); "
                          "lower it")
    step = start_step
    while True:
        epoch, offset = divmod(step, steps_per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(tokens))
        for index in range(offset, steps_per_epoch):
            chosen = order[index * batch_size : (index + 1) * batch_size][rows]
            yield {"inputs": tokens[chosen].astype(np.int32, copy=False), "label": labels[chosen]}
        step = (epoch + 1) * steps_per_epoch


def eval_batches(tokens: np.ndarray, labels: np.ndarray, *, batch_size: int,
                 rows: slice = slice(None)) -> Iterator[Batch]:
    """Every example once, in order; the last batch is filled with padding of weight 0.

    `rows` picks this process's part of every global batch (`process_rows`); every process
    yields the same number of batches, some of them possibly all padding.

    Yields:
      {"inputs": int32 [R, L] (or [R, 2, L]), "label": int32 [R], "weight": float32 [R]},
      R the rows picked (batch_size for all).
    """
    for start in range(0, len(tokens), batch_size):
        chosen = np.arange(start, start + batch_size)[rows]
        chosen = chosen[chosen < len(tokens)]  # real examples come first: the padding is at the end
        fill = len(np.arange(batch_size)[rows]) - len(chosen)
        inputs = np.asarray(tokens[chosen], dtype=np.int32)
        yield {
            "inputs": np.pad(inputs, ((0, fill),) + ((0, 0),) * (inputs.ndim - 1)),
            "label": np.pad(labels[chosen], (0, fill)),
            "weight": np.pad(np.ones(len(chosen), np.float32), (0, fill)),
        }


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the mesh's "data" axis."""
    return NamedSharding(mesh, PartitionSpec("data"))


def process_rows(mesh: Mesh, batch_size: int) -> slice:
    """The rows of every global batch of `batch_size` that this process's devices hold (all of
    them with one process): a process reads and sends only these."""
    indices = data_sharding(mesh).addressable_devices_indices_map((batch_size,)).values()
    starts = sorted(index[0].indices(batch_size)[:2] for index in indices)
    for (_, stop), (start, _) in zip(starts, starts[1:]):
        if stop != start:
            raise LraError(f"process {jax.process_index()}'s devices hold rows {starts} of each batch, not one "
                           "block, so it cannot read only its own rows: order the mesh's data axis by process "
                           "(jax.make_mesh does; a hand-built Mesh must list each process's devices together)")
    return slice(starts[0][0], starts[-1][1])


def prefetch_to_mesh(batches: Iterator[Batch], mesh: Mesh, size: int = 2) -> Iterator[dict[str, jax.Array]]:
    """Moves batches onto the mesh in a background thread, `size` batches ahead.

    Each batch holds this process's rows (`process_rows`) of a global batch split evenly over
    the processes; it becomes one global array (`jax.make_array_from_process_local_data`).

    Close the returned generator (or exhaust it) before exiting: that stops and joins the thread.
    """
    sharding = data_sharding(mesh)
    ready: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fill():
        try:
            for batch in batches:
                if not put(jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)):
                    return
        except BaseException as error:  # re-raised in the consumer
            put(error)
        put(done)

    producer = threading.Thread(target=fill, daemon=True)
    producer.start()
    try:
        while (item := ready.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:  # a producer left inside a device transfer at interpreter exit aborts the process
        stop.set()
        producer.join()
