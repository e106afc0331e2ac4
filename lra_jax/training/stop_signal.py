"""SIGTERM and SIGINT during the train loop: the step in flight completes, is saved, and the run stops.

Before the loop (imports, data, compilation) the command's own handlers stop the run at once
(`lra_jax.train`); `StopSignal` takes both signals over for the loop alone and gives them back after.
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils


class StopSignal:
    """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop polls, so the step in flight completes and is saved.

    `received` is written only by the handler; `requested`, the decision, only by `agreed`. Kept
    apart, a SIGTERM handled while the all-gather runs cannot be overwritten by its result."""

    def __init__(self):
        self.received = False
        self.requested = False
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def _handle(self, signum, frame):
        self.received = True

    def agreed(self) -> bool:
        """Whether any process was asked to stop, decided alike on all of them, so that all stop
        after the same step and save it together. A pod's SIGTERM reaches hosts at different times;
        with several processes this costs one small all-gather per step."""
        if jax.process_count() > 1:
            self.requested = self.requested or bool(
                multihost_utils.process_allgather(np.int32(self.received)).max())
        else:
            self.requested = self.received
        return self.requested

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
