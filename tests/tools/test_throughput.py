"""The pipeline-throughput command: both timings are measured on real batches and printed."""

import math

import pytest
from helpers import tiny_config

from lra_jax.config.settings import from_config
from lra_jax.data import tasks
from lra_jax.tools import throughput
from lra_jax.training import distributed

# Its one test builds the data and times train steps: the slow tier.
pytestmark = pytest.mark.slow


def test_pipeline_and_train_step_rates_are_measured(data_cache):
    config = from_config(tiny_config(data_cache))
    task = tasks.get_task(config.task)
    train = task.load(config.data, config.max_len)["train"]
    mesh = distributed.make_mesh()
    fed = throughput.pipeline_examples_per_second(train, config.batch_size, config.seed, mesh, num_batches=40)
    trained = throughput.train_examples_per_second(config, task, train, mesh, num_steps=3)
    assert math.isfinite(fed) and fed > 0
    assert math.isfinite(trained) and trained > 0
