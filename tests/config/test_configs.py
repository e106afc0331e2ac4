"""Config files: every variant has one, found by path; each accepts every task and scale, with the
LRA-code values where they are known; the configs folder is not installed as a package."""

import ast
import glob
import os
import subprocess
import sys

import pytest

from lra_jax.attention import registry
from lra_jax.config import paths as config_paths
from lra_jax.config import task_defaults as base

CONFIG_FILES = sorted(glob.glob(os.path.join(config_paths.CONFIGS_DIR, "*.py")))


def test_every_registered_variant_has_its_config_file_by_path():
    for name in registry.names():
        path = config_paths.variant_path(name)
        assert path is not None, f"{name}: add configs/{name}.py"
        assert config_paths.load(path).attention.name == name, path
    assert config_paths.variant_path("softmax") == os.path.join(config_paths.CONFIGS_DIR, "transformer.py")
    assert config_paths.variant_path("nonesuch") is None
    assert len(CONFIG_FILES) == len(registry.names())  # no config file of an unregistered variant


@pytest.mark.parametrize("task", base.TASKS)
@pytest.mark.parametrize("scale", base.SCALES)
def test_every_variant_config_accepts_every_task_and_scale(task, scale):
    for stem in CONFIG_FILES:
        config = config_paths.load(f"{stem}:{task},{scale}")
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


def test_installing_puts_no_configs_package_into_site_packages():
    """setuptools' own package discovery from pyproject.toml (what a wheel would hold), from another directory."""
    code = ("import warnings; warnings.simplefilter('ignore');"
            "from setuptools.dist import Distribution;"
            "from setuptools.config.pyprojecttoml import apply_configuration;"
            f"print(apply_configuration(Distribution(), {os.path.join(config_paths.REPO_ROOT, 'pyproject.toml')!r}).packages)")
    done = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(config_paths.REPO_ROOT),
                          capture_output=True, text=True, check=True)
    packages = ast.literal_eval(done.stdout.strip())  # the list of package names setuptools found
    assert "lra_jax" in packages and "lra_jax.tools" in packages
    assert [p for p in packages if p.split(".")[0] != "lra_jax"] == []
