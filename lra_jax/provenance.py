"""What a recorded result was made with: the library versions and the source commit.

Every JSON the commands write (a run's metadata, a bench or compile report) carries these, so a
figure names the code under it. Outside a git checkout (a copy of the tree sent to a device
machine) the commit comes from $LRA_JAX_COMMIT, which `.ci/gpu-check` passes on.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMIT_VARIABLE = "LRA_JAX_COMMIT"


def source_commit(root: str = REPO_ROOT) -> str | None:
    """The git commit of the checkout at `root`, "+changes" when its tracked files differ; outside git
    $LRA_JAX_COMMIT, else None."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get(COMMIT_VARIABLE) or None
    return commit + ("+changes" if dirty else "")


def library_versions() -> dict[str, str]:
    """Python's and the stack's versions, and lra_jax's source commit ("unknown" where none is known)."""
    versions = {"python": platform.python_version()}
    for package in ("lra_jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "unknown"
    versions["lra_jax_commit"] = source_commit() or "unknown"
    return versions
