"""The metrics a train step returns ({"loss", "accuracy", "grad_norm", "skipped", "finite"}, one value
each), as the train loop reads them: checked finite, averaged over a log window, saved unlogged."""

from __future__ import annotations

import os

import jax
import numpy as np

from lra_jax.errors import TrainingDiverged
from lra_jax.training import checkpointing


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
