"""Advice for a full-scale config trained on a CPU. Full scale is sized for a GPU or TPU (Linformer's
ListOps takes ~37 s a step on 2 cores: days for its 5,000 steps). `train` does not refuse the run for its
time (only a step the host cannot hold, `training.memory.check_fits`); it says so at most twice: before
anything is built or generated (`before_training`), and with the projected time once the first steps are
timed (`projection`, the trainer's `on_step_time` hook). Nothing is said at mini scale or on a GPU or TPU.
"""

from __future__ import annotations

import jax

from lra_jax.measure.units import duration


class FullScaleOnCpu:
    """Whether a run is a full-scale config on the CPU backend (`applies`), and what to tell its user."""

    def __init__(self, task: str, scale: str, config_file: str):
        self.task, self.config_file = task, config_file
        self.applies = scale == "full" and jax.default_backend() == "cpu"
        self._projected = False

    def before_training(self) -> str | None:
        """The warning and the alternatives; None where they do not apply."""
        if not self.applies:
            return None
        return (f"warning: {self.config_file}:{self.task} is a full-scale config, sized for a GPU or TPU, and it runs on "
                "the CPU: expect hours to days (the projected time follows the first steps). Training anyway. "
                f"Alternatives: the mini scale, minutes on a CPU (--config={self.config_file}:{self.task},mini); "
                "--estimate, which times a few steps and projects the run without data or training; or compile "
                "it for a GPU or TPU here first (\"Will it fit?\", docs/will-it-fit.md).")

    def projection(self, seconds_per_step: float, steps_left: int) -> str | None:
        """The projected time of the steps left, said once; None where it does not apply or was said."""
        if not self.applies or self._projected:
            return None
        self._projected = True
        return (f"warning: at {duration(seconds_per_step)} a step on this CPU, the {steps_left:,} "
                f"step{'s' if steps_left != 1 else ''} left take about {duration(seconds_per_step * steps_left)} "
                "(validation and checkpoints not counted). Ctrl-C "
                "stops the run with a checkpoint; the same command resumes it.")
