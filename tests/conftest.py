"""Shared fixtures: a tiny ListOps config that trains in seconds on CPU."""

import tempfile

import jax
import pytest

from lra_jax import task_defaults as base

# Many tests build the same small programs anew (each run's jitted init, train and eval
# steps); a persistent compilation cache lets every compilation after the first be a lookup.
jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="lra_jax_test_xla_"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def tiny_config(cache_dir, name: str = "softmax", **settings):
    """ListOps with 256 short generated examples and a one-layer, 16-wide model."""
    config = base.get_config("listops,mini", attention=dict(name=name, **settings))
    config.max_len = 32
    config.data.cache_dir = str(cache_dir)
    config.data.generator.update(num_train=256, num_val=64, num_test=64, min_length=5, max_length=32)
    config.model.update(num_layers=1, num_heads=2, emb_dim=16, mlp_dim=32, dropout_rate=0.1,
                        attention_dropout_rate=0.1)
    config.batch_size = 16
    config.num_train_steps = 12
    config.eval_every = 6
    config.checkpoint_every = 6
    config.log_every = 3
    return config


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lra_cache")
