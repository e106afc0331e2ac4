"""Shared fixtures and the test session's compilation cache (helpers live in helpers.py)."""

import atexit
import os
import re
import shutil
import tempfile

import jax
import pytest

from helpers import FAST_COMPILE, REPRESENTATIVE

# The suite's CPU programs compile without LLVM's optimisation passes (helpers.FAST_COMPILE), as
# the process tests' child processes do: most of the suite's time is compiling small programs.
# Set before any test touches a backend (XLA reads XLA_FLAGS when the CPU client starts), and
# inherited by pytest-xdist's workers and by every child process that keeps the environment. A
# level already in XLA_FLAGS is kept; the other flags there (the README's other reduction orders)
# are kept too. The deviceless TPU and GPU compiles took the same CPU time either way.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), FAST_COMPILE]))

# Many tests build the same small programs anew (each run's jitted init, train and eval
# steps); a persistent compilation cache lets every compilation after the first be a lookup.
# One cache for the whole session: pytest-xdist's controller loads this file before it starts
# its workers, which inherit the variable, so a program one worker compiled is a lookup in the
# others too (a worker that reads an entry another is still writing warns and compiles it).
# The process that makes the folder (pytest's, or xdist's controller, which outlives its workers)
# removes it at exit: one suite run leaves ~50 MB of compiled programs, and the runs add up.
_SESSION_CACHE = "LRA_JAX_TEST_XLA_CACHE"
if _SESSION_CACHE not in os.environ:
    os.environ[_SESSION_CACHE] = tempfile.mkdtemp(prefix="lra_jax_test_xla_")
    atexit.register(shutil.rmtree, os.environ[_SESSION_CACHE], ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", os.environ[_SESSION_CACHE])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# CI runs the suite on two stacks (.ci/run sets LRA_JAX_CI_STACK=oldest or newest). A test that drives
# whole processes whose outcome does not depend on the jax version (a Slurm cluster, a shell stage) is
# marked `one_stack("<stack>")` and runs on that stack only, so that CI pays for it once; without the
# variable (anyone's own `pytest`) every test runs.
CI_STACK = os.environ.get("LRA_JAX_CI_STACK")
# A suite repeated for every variant (`every_variant("<argument>")`, the argument holding the variant's name,
# e.g. "local", "local@tpu", "softmax-causal") runs for every variant on the newest stack and for
# `helpers.REPRESENTATIVE` on the oldest: there CI checks that the supported range runs each variant's code,
# which the attention contract's forward and gradient (`test_all_padding_row_is_finite_with_finite_gradients`,
# not so marked) do for every variant, while the properties repeated per variant are the variants' own.
# A variant's cases share one xdist group (`--dist loadgroup`): one worker builds and compiles its layer once.
# The thinned stack runs the slow tier only where a test is marked for it (`one_stack`): its fast tier touches
# every area of the package (tests/test_test_tiers.py), which is what checks that the range runs, and the slow
# tier's depth (long runs, every parametrization) runs once, on the newest stack.
THINNED_STACK = "oldest"


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("one_stack")
        if marker and CI_STACK and CI_STACK != marker.args[0]:
            item.add_marker(pytest.mark.skip(reason=f"runs on the {marker.args[0]} stack in CI "
                                                    f"(LRA_JAX_CI_STACK={CI_STACK})"))
        elif not marker and CI_STACK == THINNED_STACK and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.skip(reason=f"the slow tier runs on the newest stack in CI; the {CI_STACK} "
                                                    f"stack runs the fast tier (tests/conftest.py)"))
        marker = item.get_closest_marker("every_variant")
        if marker and hasattr(item, "callspec"):
            case = str(item.callspec.params[marker.args[0]])
            item.add_marker(pytest.mark.xdist_group(case))
            if CI_STACK == THINNED_STACK and re.split("[@-]", case)[0] not in REPRESENTATIVE:
                item.add_marker(pytest.mark.skip(reason=f"a suite repeated per variant: on the {CI_STACK} stack CI runs "
                                                        f"it for {', '.join(REPRESENTATIVE)} (tests/conftest.py)"))


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lra_cache")
