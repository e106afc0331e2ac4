"""Errors the user can fix: the CLI prints their message on one line and exits non-zero.

Exit statuses of `train`: 0 finished, 2 bad input (`LraError`), 3 diverged (`TrainingDiverged`),
`INTERRUPTED` (75, sysexits' EX_TEMPFAIL) stopped by SIGTERM or SIGINT with a checkpoint saved: run the same
command to resume. An interrupted run never exits 0.
"""

INTERRUPTED = 75


class LraError(Exception):
    """A problem with the user's input; the message names the problem and the fix."""

    exit_code = 2


class ConfigError(LraError):
    """An unknown variant, setting or value in the configuration."""


class DataError(LraError):
    """Missing or malformed data files."""


class TrainingDiverged(LraError):
    """A non-finite loss or gradient norm: the run stopped with its checkpoints untouched."""

    exit_code = 3

    def __init__(self, message: str, *, step: int, loss: float, grad_norm: float, last_checkpoint: int | None):
        super().__init__(message)
        self.step, self.loss, self.grad_norm, self.last_checkpoint = step, loss, grad_norm, last_checkpoint


class CheckpointError(LraError):
    """No checkpoint of a run restores (each damaged): the run cannot resume from its workdir."""


class DiskFull(LraError):
    """Not enough free space at the workdir for the next checkpoint or log line; nothing saved is lost."""
