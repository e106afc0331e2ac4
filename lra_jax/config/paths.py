"""Where the config files are, how a variant's file is found, and how one is loaded: by path.

Config files are plain Python files in the repository's `configs/` folder, not an installed
package: ml_collections loads one by path (`--config=configs/linformer.py:listops,mini`) and each
starts from `lra_jax.config.task_defaults`. A variant's file is `configs/<variant>.py`, except `softmax`,
whose file is `configs/transformer.py`. Finding it is a path lookup: no config file is imported
to find another.
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout holding lra_jax/
CONFIGS_DIR = os.path.join(REPO_ROOT, "configs")
FILE_STEMS = {"softmax": "transformer"}  # variants whose file is not named after them


def variant_path(variant: str, configs_dir: str | None = None) -> str | None:
    """`configs_dir/<file>.py` of `variant` if that file exists, else None."""
    path = os.path.join(configs_dir or CONFIGS_DIR, f"{FILE_STEMS.get(variant, variant)}.py")
    return path if os.path.isfile(path) else None


def load(spec: str) -> ml_collections.ConfigDict:
    """Runs `get_config` of 'path/to/config.py[:arg]' (as ml_collections does) and returns the config."""
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("lra_jax_user_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def missing_file_message(path: str) -> str:
    """Why `path` (a --config file that does not exist) was not found, and what to pass instead."""
    stem = os.path.basename(path)
    in_repo = os.path.join(CONFIGS_DIR, stem)
    if os.path.isfile(in_repo) and os.path.abspath(path) != in_repo:
        return (f"config file {path!r} not found from {os.getcwd()}; the repository's is {in_repo}: "
                f"pass --config={in_repo}[:TASK,SCALE] or run from {REPO_ROOT}")
    folder = os.path.dirname(path) or "."
    here = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".py")) \
        if os.path.isdir(folder) else []
    choices = ", ".join(here) or (f"the files in {CONFIGS_DIR}" if os.path.isdir(CONFIGS_DIR) else
                                  "configs/<variant>.py of a repository checkout (configs are not installed)")
    return f"config file {path!r} not found (run from the repository root); available: {choices}"
