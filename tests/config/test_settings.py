"""The config boundary: every config file reads into checked typed settings; a config without the
settings added later reads with `task_defaults.OPTIONAL`; the task list is data/tasks.py's alone."""

import dataclasses
import importlib.util
import json
import os

import ml_collections
import pytest

from lra_jax.config import paths, settings, task_defaults
from lra_jax.data import prepare, tasks
from lra_jax.data.tasks import DataSettings
from lra_jax.errors import ConfigError
from lra_jax.models.model_settings import ModelSettings
from lra_jax.training import run_dir


@pytest.mark.parametrize("task", tasks.TASKS)
@pytest.mark.parametrize("scale", task_defaults.SCALES)
def test_every_config_file_reads_into_typed_settings(task, scale):
    for name in sorted(os.listdir(paths.CONFIGS_DIR)):
        if name.endswith(".py"):
            config = paths.load(f"{os.path.join(paths.CONFIGS_DIR, name)}:{task},{scale}")
            s = settings.from_config(config)
            assert isinstance(s.model, ModelSettings) and isinstance(s.data, DataSettings)
            assert s.task == task and s.variant == config.attention.name
            assert s.optimizer.total_steps == config.num_train_steps
            assert s.record == json.loads(config.to_json())


def test_a_config_without_the_later_settings_reads_as_the_runs_before_them():
    config = task_defaults.get_config("listops,mini").to_dict()
    for dotted in task_defaults.OPTIONAL:
        node, _, key = dotted.rpartition(".")
        del (config[node] if node else config)[key]
    s = settings.from_config(ml_collections.ConfigDict(config))
    assert (s.grad_accum_steps, s.keep_checkpoints, s.val_examples, s.optimizer.skip_nonfinite_updates) == (1, 2, 0, 0)
    full = task_defaults.get_config("listops,mini")
    assert run_dir.config_changes(config, settings.from_config(full).record) == []


def test_settings_are_frozen_and_the_eval_batch_is_the_micro_batch():
    config = task_defaults.get_config("text,mini")
    s = settings.from_config(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch_size = 3
    assert s.eval_batch_size == s.batch_size
    config.grad_accum_steps = 4
    assert settings.from_config(config).eval_batch_size == config.batch_size // 4


@pytest.mark.parametrize("key,value,expected", [
    ("optimizer.learning_rate", 0.0, "learning_rate=0.0 is out of range: it must be > 0"),
    ("optimizer.b2", 1.0, "b2=1.0 is out of range: it must be in [0, 1)"),
    ("optimizer.warmup_steps", -1, "warmup_steps=-1 is out of range: it must be an integer >= 0"),
    ("checkpoint_every", 0, "checkpoint_every=0 is out of range"),
    ("keep_checkpoints", 0, "keep_checkpoints=0 is out of range: it must be an integer >= 1"),
    ("model.pooling", "cls", None),  # fine with a CLS token
    ("max_len", 0, "max_len=0 is out of range"),
])
def test_each_bad_value_is_one_line_naming_key_value_and_range(key, value, expected):
    config = task_defaults.get_config("listops,mini")
    node, _, name = key.rpartition(".")
    (config[node] if node else config)[name] = value
    if expected is None:
        settings.from_config(config)
        return
    with pytest.raises(ConfigError) as error:
        settings.from_config(config)
    assert f"--config.{key}" in str(error.value) and expected in str(error.value) and "\n" not in str(error.value)


def test_cls_pooling_without_a_cls_token_is_refused():
    config = task_defaults.get_config("listops,mini")
    config.model.cls_token = False
    with pytest.raises(ConfigError, match="model.pooling='cls' is out of range.*cls_token=True"):
        settings.from_config(config)


def test_the_task_list_lives_in_data_tasks():
    assert task_defaults.TASKS is tasks.TASKS
    assert set(prepare.TASKS) == set(tasks.TASKS) - {"listops"}
    spec = importlib.util.spec_from_file_location("s4d_config", os.path.join(paths.CONFIGS_DIR, "s4d.py"))
    s4d = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s4d)
    assert tuple(s4d.PAPER) == tasks.TASKS  # the paper's settings, one row per task
