"""How the experiment commands (lower, compile, sweep) choose variants, tasks and targets, and find
each variant's config file: one way for all of them."""

from __future__ import annotations

import os

from lra_jax.config import paths as config_paths
from lra_jax.errors import ConfigError


def choose(spec: str, known: list[str], what: str) -> list[str]:
    """'all' -> `known`; 'a,b' -> ['a', 'b'] if each is known; else ConfigError naming the unknown ones."""
    if spec.strip() == "all":
        return list(known)
    chosen = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in known]
    if unknown or not chosen:
        raise ConfigError(f"unknown {what} {', '.join(unknown) or repr(spec)}; known: all, {', '.join(known)}")
    return chosen


def config_files(configs_dir: str | None = None) -> dict[str, str]:
    """Registered variant -> its config file relative to the repository root, for those that have one.

    A path lookup (`config_paths.variant_path`): no config file is imported to find it."""
    from lra_jax.attention import registry

    found = {name: config_paths.variant_path(name, configs_dir) for name in registry.names()}
    return {name: os.path.relpath(path, config_paths.REPO_ROOT) for name, path in found.items() if path is not None}


def config_path(relative: str) -> str:
    """A `config_files` path made absolute (the commands run from any directory)."""
    return os.path.join(config_paths.REPO_ROOT, relative)
