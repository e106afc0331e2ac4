"""The source commit and versions recorded beside every result (`lra_jax.provenance`)."""

import subprocess

import pytest

from lra_jax import provenance

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def test_the_commit_is_this_checkouts_head():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=provenance.REPO_ROOT, capture_output=True,
                          text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    assert provenance.source_commit().removesuffix("+changes") == head.stdout.strip()
    assert provenance.library_versions()["lra_jax_commit"] == provenance.source_commit()


def test_outside_git_the_commit_comes_from_the_environment(tmp_path, monkeypatch):
    """A copy of the tree without .git (as on a device machine) names the commit it was given, or none."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # git must not find a repository above
    monkeypatch.delenv(provenance.COMMIT_VARIABLE, raising=False)
    assert provenance.source_commit(str(tmp_path)) is None
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, "abc1234")
    assert provenance.source_commit(str(tmp_path)) == "abc1234"
