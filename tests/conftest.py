"""Shared fixtures and the test session's compilation cache (helpers live in helpers.py)."""

import tempfile

import jax
import pytest

# Many tests build the same small programs anew (each run's jitted init, train and eval
# steps); a persistent compilation cache lets every compilation after the first be a lookup.
jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="lra_jax_test_xla_"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lra_cache")
