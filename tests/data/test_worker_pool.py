"""The generators' worker processes: failures are named, and no worker outlives its caller."""

import pytest

from lra_jax.data import worker_pool
from lra_jax.errors import DataError


def test_a_failing_worker_is_named_with_its_status():
    with pytest.raises(DataError, match=r"Test workers exited with status \[1\]"):
        worker_pool.run_all("lra_jax.no_such_module", [[]], "Test")


def test_a_worker_that_ends_early_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="no_such_module.*exited with status 1"):
        list(worker_pool.lines_round_robin("lra_jax.no_such_module", [[]], 1))


def test_leaving_early_kills_the_workers():
    with worker_pool.started("lra_jax.data.listops_generator", [["--worker", 0, 0, 1, 10, 100, 10, 10]],
                             capture=True) as workers:
        assert workers[0].stdout.readline().startswith("[")  # streams chunks until stopped
    assert workers[0].returncode is not None
