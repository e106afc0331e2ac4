"""Pallas kernels under a data-parallel mesh: each device runs the kernel on its own rows of the batch.

XLA cannot partition a kernel's custom call. For a Mosaic (TPU) kernel it refuses outright: a step
jitted over a slice of several chips fails to compile ("Mosaic kernels cannot be automatically
partitioned"); a Triton (GPU) call it accepts, but gathers the whole batch onto every GPU and runs
the kernel there on all of it. `over_batch(fn)` runs `fn` inside `jax.shard_map` over the "data" axis of the
context mesh, so every device calls the kernel on its [b / devices, ...] rows. Without a context
mesh, or with one device on that axis, it is `fn` itself. The trainer and the compile command trace
their steps with their mesh as the context mesh (`lra_jax.compat.abstract_mesh`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

BATCH_AXIS = "data"  # the trainer's mesh axis (`training.distributed.make_mesh`)


def batch_devices() -> int:
    """How many devices share the batch in the context mesh (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or BATCH_AXIS not in mesh.axis_names:
        return 1
    return mesh.shape[BATCH_AXIS]


def over_batch(fn: Callable, first_row: bool = False) -> Callable:
    """`fn(*arrays, **shared)` run per device: every positional array [b, ...] and every output [b, ...]
    split over the devices' rows of b; the keyword arrays (`shared`, e.g. a block mask) whole on each.
    Pass traced arrays in, never close over them: inside the per-device function only its inputs are
    on the per-device mesh. `first_row=True` also passes `fn` the keyword `first_row`, the index in
    the whole batch of the device's first row (int32; 0 unsharded): a kernel that draws a dropout mask
    per global row (`lra_jax.kernels.dropout`) offsets its batch index by it."""

    def call(*arrays, **shared):
        if batch_devices() == 1:
            return fn(*arrays, **shared, **({"first_row": jnp.int32(0)} if first_row else {}))
        names = tuple(shared)

        def per_device(*args):
            offset = {}
            if first_row:
                offset["first_row"] = lax.axis_index(BATCH_AXIS).astype(jnp.int32) * args[0].shape[0]
            return fn(*args[:len(arrays)], **dict(zip(names, args[len(arrays):])), **offset)

        rows, whole = PartitionSpec(BATCH_AXIS), PartitionSpec()
        return jax.shard_map(per_device, mesh=jax.sharding.get_abstract_mesh(),
                             in_specs=(rows,) * len(arrays) + (whole,) * len(names), out_specs=rows,
                             check_vma=False)(*arrays, *shared.values())

    return call
