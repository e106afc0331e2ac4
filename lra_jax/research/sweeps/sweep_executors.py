"""Where a sweep's runs are trained: one protocol, `Executor`, with a local and a Slurm implementation
behind `python -m lra_jax.tools.sweep --executor=local|slurm`.

    executor = LocalExecutor(slots)          # or SlurmExecutor(root, options)
    status = executor.execute(replan, pending)

`replan()` gives the runs the protocol allows now (`sweep_plan.protocol_runs`): a local sweep asks again
after each run ends, so that a two-stage cell's other seeds start as soon as its first stage is done; a
Slurm submission takes what it allows at submission. `pending` names the cells that wait for their first
stage (empty: none). The exit status is the sweep's.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Protocol

from lra_jax.errors import LraError
from lra_jax.research.sweeps import slurm
from lra_jax.research.sweeps.sweep_plan import Run
from lra_jax.research.sweeps.sweep_report import pretraining_table, selection_table, summary_table
from lra_jax.research.sweeps.sweep_run import UNFINISHED, Stop, run_sweep, subprocess_runner

Replan = Callable[[], list[Run]]


class Executor(Protocol):
    def execute(self, replan: Replan, pending: str) -> int:
        """Trains (or submits) the runs `replan` gives; the sweep's exit status."""


@dataclasses.dataclass(frozen=True)
class LocalExecutor:
    """Trains the runs here, one per slot at once (`device_slots.slots`; [None]: one run at a time on every
    device), then prints the summary, the grid points chosen on validation and the pretraining comparison.
    Exit status 130 when stopped by SIGINT or SIGTERM (run the same command to continue), 1 when a run
    failed, crashed or was interrupted from outside, else 0."""

    slots: list

    def execute(self, replan: Replan, pending: str) -> int:
        with Stop() as stop:
            summary = run_sweep(replan, subprocess_runner(stop, log_to_workdir=len(self.slots) > 1), stop,
                                slots=self.slots)
        print("\n" + summary_table(summary))
        for table in (selection_table(replan()), pretraining_table(replan())):
            if table:
                print("\n" + table)
        if stop.requested:
            print("sweep stopped; run the same command to continue (finished runs are skipped, "
                  "interrupted ones resume)")
            return 130
        return 1 if any(s["status"] in UNFINISHED for s in summary) else 0


@dataclasses.dataclass(frozen=True)
class SlurmExecutor:
    """Submits the runs that are neither finished nor queued as one Slurm array job (`slurm.submit`; a task
    that gets SIGTERM checkpoints, requeues itself and resumes); follow them with `--status`. Exit status 2
    when the submission fails (one line), else 0."""

    root: str
    options: slurm.Options

    def execute(self, replan: Replan, pending: str) -> int:
        try:
            job_id, submitted = slurm.submit(replan(), self.root, self.options)
        except LraError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"submitted {len(submitted)} runs as Slurm array job {job_id} (recorded in "
              f"{slurm.jobs_path(self.root)}); follow them with --status" if job_id else
              "nothing to submit: every run is finished, queued or running (see --status)")
        if pending:
            print(f"note: {pending}; submit again once those runs are finished", file=sys.stderr)
        return 0
