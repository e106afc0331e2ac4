"""The linear recurrence by a parallel scan (lra_jax/kernels/linear_recurrence.py) against the step-by-step
scan and the recurrence as written."""

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close, reassociation_tol, slow_except
from lra_jax.kernels.linear_recurrence import linear_scan, sequential_scan


def assert_complex_close(actual, desired, tol):
    """`assert_close` on the real and the imaginary parts together."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    assert_close(np.stack([actual.real, actual.imag]), np.stack([desired.real, desired.imag]), tol)


@pytest.mark.parametrize("reverse", slow_except([False, True], keep={False}))
def test_the_parallel_scan_is_the_recurrence(reverse):
    rng = np.random.default_rng(0)
    a = jnp.asarray(0.95 * np.exp(1j * rng.uniform(0, 2 * np.pi, 6)), jnp.complex64)
    b = jnp.asarray(rng.standard_normal((3, 50, 6)) + 1j * rng.standard_normal((3, 50, 6)), jnp.complex64)
    parallel = linear_scan(a, b, reverse=reverse)
    sequential = sequential_scan(a, b, reverse=reverse)
    # the same sums of at most 50 terms, associated in another order
    assert_complex_close(parallel, sequential, reassociation_tol(50, depth=2))
    h = np.zeros((3, 6), np.complex64)  # and both are the recurrence as written, step by step
    steps = range(49, -1, -1) if reverse else range(50)
    for t in steps:
        h = np.asarray(a) * h + np.asarray(b[:, t])
    assert_complex_close(sequential[:, 0 if reverse else -1], h, reassociation_tol(50, depth=2))
