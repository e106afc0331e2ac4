"""The train loop's stop signals (`lra_jax.training.stop_signal`)."""

import signal

import jax
import numpy as np
from jax.experimental import multihost_utils

from lra_jax.training import stop_signal


def test_a_sigterm_handled_during_the_stop_all_gather_is_not_lost(monkeypatch):
    """Several processes agree on stopping by an all-gather each step; a SIGTERM whose handler runs
    while that all-gather is in flight must stop the run one step later, not be overwritten."""
    stop = stop_signal.StopSignal()
    gathered = []

    def all_gather_hit_by_sigterm(flag):
        gathered.append(int(flag))
        if len(gathered) == 1:
            stop._handle(signal.SIGTERM, None)  # arrives while the other processes' flags come in
        return np.array([int(flag), 0])

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", all_gather_hit_by_sigterm)
    assert stop.agreed() is False  # this step's gather went out before the signal
    assert stop.agreed() is True and gathered == [0, 1]  # the next one carries it
    assert stop.agreed() is True  # and the decision stays


def test_the_handlers_are_given_back_after_the_loop():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with stop_signal.StopSignal() as stop:
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C in the loop sets the flag instead of raising
        assert stop.agreed() is True
    assert {sig: signal.getsignal(sig) for sig in before} == before
