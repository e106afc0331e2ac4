"""The trainer's step-time hook: the first steps of a stage timed once, and the time left reported."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import jax
from tqdm import tqdm

StepTimeHook = Callable[[float, int], str | None]  # (seconds per step, steps left) -> a line to print, or None


class FirstSteps:
    """Times a stage's steps 2 to 1 + `count` once (the first may pay one-time costs) and gives `report` the
    seconds per step and the steps left; a line it returns is printed above the progress bar."""

    def __init__(self, report: StepTimeHook, start: int, num_steps: int, count: int = 2):
        self.report, self.num_steps = report, num_steps
        self.first, self.last = start + 1, start + 1 + count
        self.began = 0.0

    def after(self, step: int, state, progress: tqdm) -> None:
        """Called after each step: waits for step `first` and step `last` (once each), reports at `last`."""
        if step not in (self.first, self.last):
            return
        jax.block_until_ready(state)
        if step == self.first:
            self.began = time.perf_counter()
            return
        line = self.report((time.perf_counter() - self.began) / (self.last - self.first), self.num_steps - step)
        if line:
            progress.write(line, file=sys.stderr)


def adding_steps(hook: StepTimeHook | None, later: int) -> StepTimeHook | None:
    """`hook` told of `later` more steps left: a stage's projection covers the stages after it."""
    return None if hook is None else lambda seconds, left: hook(seconds, left + later)
