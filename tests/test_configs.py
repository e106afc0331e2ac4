"""Every variant config accepts every task and scale, with the LRA-code values where they are known."""

import importlib
import pathlib

import pytest

from configs import base

CONFIG_FILES = sorted(p.stem for p in pathlib.Path(base.__file__).parent.glob("*.py")
                      if p.stem not in ("__init__", "base"))


@pytest.mark.parametrize("task", base.TASKS)
@pytest.mark.parametrize("scale", base.SCALES)
def test_every_variant_config_accepts_every_task_and_scale(task, scale):
    for stem in CONFIG_FILES:
        config = importlib.import_module(f"configs.{stem}").get_config(f"{task},{scale}")
        assert (config.task, config.scale) == (task, scale), stem
        assert config.attention.name, stem
        assert config.model.emb_dim % config.model.num_heads == 0, (stem, task, scale)
        assert config.model.pooling != "cls" or config.model.cls_token, (stem, task, scale)


def test_full_scale_follows_the_lra_code():
    text = base.get_config("text")
    assert (text.max_len, text.model.num_layers, text.model.emb_dim, text.model.mlp_dim) == (1000, 4, 256, 1024)
    assert (text.batch_size, text.num_train_steps, text.optimizer.warmup_steps) == (32, 20_000, 8_000)
    retrieval = base.get_config("retrieval")
    assert (retrieval.max_len, retrieval.model.emb_dim, retrieval.model.mlp_dim) == (4000, 128, 512)
    image = base.get_config("image")
    assert (image.batch_size, image.optimizer.learning_rate, image.optimizer.schedule) == (256, 5e-4, "cosine")
    assert image.num_train_steps == 45_000 // 256 * 200
    pathfinder = base.get_config("pathfinder")
    assert (pathfinder.max_len, pathfinder.batch_size, pathfinder.model.pooling) == (1024, 512, "mean")
    pathx = base.get_config("pathx")
    assert (pathx.max_len, pathx.batch_size, pathx.optimizer.grad_clip_norm) == (16384, 64, 1.0)


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError, match="pathfinder"):
        base.get_config("pathfindr,mini")
