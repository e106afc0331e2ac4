"""Last and best checkpoints of a run, written atomically by Orbax.

    workdir/checkpoints/last/<step>   the newest state, for resuming
    workdir/checkpoints/best/<step>   the state with the best validation accuracy

Orbax writes each checkpoint to a temporary directory and renames it when
complete, so a run killed mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


def _abstract(state: Any) -> Any:
    """Shapes, dtypes and shardings of `state`: the target a restore fills in."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


class Checkpoints:
    """Saves and restores a run's train state (any pytree of arrays)."""

    def __init__(self, directory: str | os.PathLike):
        directory = os.path.abspath(directory)
        options = lambda: ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)  # noqa: E731
        self.last = ocp.CheckpointManager(os.path.join(directory, "last"), options=options())
        self.best = ocp.CheckpointManager(os.path.join(directory, "best"), options=options())

    def last_step(self) -> int | None:
        """Step of the newest checkpoint, or None."""
        return self.last.latest_step()

    def save_last(self, step: int, state: Any) -> None:
        if self.last.latest_step() != step:
            self.last.save(step, args=ocp.args.StandardSave(state))

    def save_best(self, step: int, state: Any, metrics: dict[str, float]) -> None:
        self.best.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        metrics=ocp.args.JsonSave(metrics)))

    def restore_last(self, like: Any) -> Any | None:
        """The newest saved state (shaped like `like`), or None if there is none."""
        step = self.last_step()
        if step is None:
            return None
        return self.last.restore(step, args=ocp.args.StandardRestore(_abstract(like)))

    def best_metrics(self) -> dict[str, float] | None:
        """Validation metrics of the best checkpoint, or None if there is none."""
        step = self.best.latest_step()
        if step is None:
            return None
        return dict(self.best.restore(step, args=ocp.args.Composite(metrics=ocp.args.JsonRestore())).metrics)

    def restore_best(self, like: Any) -> Any:
        step = self.best.latest_step()
        restored = self.best.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(like))))
        return restored.state

    def close(self) -> None:
        self.last.close()
        self.best.close()
