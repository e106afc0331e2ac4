"""Batches for training and evaluation, placed on the device mesh ahead of time.

Training order is a pure function of (seed, epoch), so a run resumed at step s
sees exactly the batches an uninterrupted run would have seen from step s on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Batch = dict[str, np.ndarray]


def train_batches(tokens: np.ndarray, labels: np.ndarray, *, batch_size: int, seed: int, start_step: int = 0) -> Iterator[Batch]:
    """Endless shuffled batches from `start_step` on; each epoch drops its last partial batch.

    Args:
      tokens: int [N, L] or, for dual tasks, int [N, 2, L] (any integer dtype, e.g. int16 or
        a read-only memory map). labels: int32 [N].
    Yields:
      {"inputs": int32 [batch_size, L] (or [batch_size, 2, L]), "label": int32 [batch_size]}.
    """
    steps_per_epoch = len(tokens) // batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"batch size {batch_size} is larger than the training set ({len(tokens)} examples)")
    step = start_step
    while True:
        epoch, offset = divmod(step, steps_per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(tokens))
        for index in range(offset, steps_per_epoch):
            rows = order[index * batch_size : (index + 1) * batch_size]
            yield {"inputs": tokens[rows].astype(np.int32, copy=False), "label": labels[rows]}
        step = (epoch + 1) * steps_per_epoch


def eval_batches(tokens: np.ndarray, labels: np.ndarray, *, batch_size: int) -> Iterator[Batch]:
    """Every example once, in order; the last batch is filled with padding of weight 0.

    Yields:
      {"inputs": int32 [batch_size, L] (or [batch_size, 2, L]), "label": int32 [batch_size],
      "weight": float32 [batch_size]}.
    """
    for start in range(0, len(tokens), batch_size):
        rows = slice(start, start + batch_size)
        count = len(tokens[rows])
        fill = batch_size - count
        inputs = np.asarray(tokens[rows], dtype=np.int32)
        yield {
            "inputs": np.pad(inputs, ((0, fill),) + ((0, 0),) * (inputs.ndim - 1)),
            "label": np.pad(labels[rows], (0, fill)),
            "weight": np.pad(np.ones(count, np.float32), (0, fill)),
        }


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the mesh's "data" axis."""
    return NamedSharding(mesh, PartitionSpec("data"))


def prefetch_to_mesh(batches: Iterator[Batch], mesh: Mesh, size: int = 2) -> Iterator[dict[str, jax.Array]]:
    """Moves batches onto the mesh in a background thread, `size` batches ahead.

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
                if not put(jax.device_put(batch, sharding)):
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
