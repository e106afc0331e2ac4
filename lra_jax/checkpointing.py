"""Last and best checkpoints of a run, written atomically by Orbax.

    workdir/checkpoints/last/<step>   the newest state, for resuming, and the metrics of the
                                      steps after the last logged one (logged on resume)
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
        self.last = ocp.CheckpointManager(os.path.join(directory, "last"), options=options(),
                                          item_names=("state", "unlogged"))
        self.best = ocp.CheckpointManager(os.path.join(directory, "best"), options=options())

    def last_step(self) -> int | None:
        """Step of the newest checkpoint, or None."""
        return self.last.latest_step()

    def save_last(self, step: int, state: Any, unlogged: list[dict[str, float]] = ()) -> None:
        """Saves `state` and `unlogged`, the per-step metrics not yet averaged into a log line."""
        if self.last.latest_step() != step:
            self.last.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                            unlogged=ocp.args.JsonSave(list(unlogged))))

    def save_best(self, step: int, state: Any, metrics: dict[str, float]) -> None:
        self.best.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        metrics=ocp.args.JsonSave(metrics)))

    def restore_last(self, like: Any) -> Any | None:
        """The newest saved state (shaped like `like`), or None if there is none."""
        step = self.last_step()
        if step is None:
            return None
        if self._single_item(step):
            with ocp.CheckpointManager(self.last.directory) as single:
                return single.restore(step, args=ocp.args.StandardRestore(_abstract(like)))
        return self.last.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(like)))).state

    def unlogged_metrics(self) -> list[dict[str, float]]:
        """The per-step metrics saved with the newest state that no log line holds yet ([] if none)."""
        step = self.last_step()
        if step is None or self._single_item(step):
            return []
        return list(self.last.restore(step, args=ocp.args.Composite(unlogged=ocp.args.JsonRestore())).unlogged)

    def _single_item(self, step: int) -> bool:
        """Whether `last/<step>` holds the state alone, as lra_jax wrote it before it kept unlogged metrics."""
        return os.path.isdir(os.path.join(str(self.last.directory), str(step), "default"))

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
