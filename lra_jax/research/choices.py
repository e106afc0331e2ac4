"""How the experiment commands (lower, compile, sweep, bench) choose variants, tasks, targets and lengths,
and find each variant's config file: one way for all of them."""

from __future__ import annotations

import os

from lra_jax.attention import registry
from lra_jax.config import paths as config_paths
from lra_jax.errors import ConfigError, LraError


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
    found = {name: config_paths.variant_path(name, configs_dir) for name in registry.names()}
    return {name: os.path.relpath(path, config_paths.REPO_ROOT) for name, path in found.items() if path is not None}


def config_path(relative: str) -> str:
    """A `config_files` path made absolute (the commands run from any directory)."""
    return os.path.join(config_paths.REPO_ROOT, relative)


def parse_lengths(values: str | list[str], required: bool = True) -> list[int]:
    """`--lengths` (a comma-separated string, or absl's list) as positive ints; [] when none is given
    and not `required`; LraError otherwise."""
    items = values.split(",") if isinstance(values, str) else list(values)
    try:
        lengths = [int(x) for x in items if x.strip()]
    except ValueError:
        lengths = [0]
    if any(n < 1 for n in lengths) or (required and not lengths):
        raise LraError(f"--lengths must be positive integers, e.g. --lengths=1024,2048; got {','.join(items)!r}")
    return lengths
