"""The suite's two tiers: `pytest -m "not slow"`, the quick check before a commit, and `pytest`, everything
(what CI runs). A case is in the slow tier by `@pytest.mark.slow`, by `helpers.slow_except` in its
parametrization, or by its file's `pytestmark`; every test file keeps some case in the fast tier, so that
a quick run still touches every area, unless its `pytestmark` says that the whole file is slow.
"""

import ast
import glob
import os
import subprocess
import sys

import pytest

# It collects the whole suite in a process of its own (about a minute): CI runs it, once (the markers are
# the suite's, not the jax version's), and the fast tier does not.
pytestmark = [pytest.mark.slow, pytest.mark.one_stack("oldest")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One collection of the whole suite (nothing runs) that prints each case's tier. --strict-markers: a
# misspelled `slow` fails the collection instead of leaving a slow case in the fast tier.
COLLECT = """
import sys, pytest
class Tiers:
    def pytest_collection_modifyitems(self, items):
        for item in items:
            print("TIER", "slow" if item.get_closest_marker("slow") else "fast", item.nodeid)
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--strict-markers",
                      "tests"], plugins=[Tiers()]))
"""


def tiers() -> dict[str, set[str]]:
    """{test file: the tiers of its cases}, from a collection of the suite in a process of its own."""
    done = subprocess.run([sys.executable, "-c", COLLECT], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("TIER "):
            _, tier, nodeid = line.split(" ", 2)
            out.setdefault(nodeid.split("::")[0], set()).add(tier)
    return out


def marked_slow_as_a_whole(path: str) -> bool:
    """The file assigns `pytestmark` at module level, `pytest.mark.slow` alone or in a list."""
    for node in ast.parse(open(path, encoding="utf-8").read()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return any(isinstance(n, ast.Attribute) and n.attr == "slow" for n in ast.walk(node.value))
    return False


def test_every_test_file_keeps_a_fast_case_or_is_marked_slow_as_a_whole():
    found = tiers()
    files = sorted(os.path.relpath(p, REPO)
                   for p in glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"), recursive=True))
    assert len(found) > 50 and "slow" in set().union(*found.values()), found  # the collection saw the suite
    for path in files:
        if path not in found:  # nothing collected: a module skipped as a whole (pytest.importorskip)
            continue
        whole = marked_slow_as_a_whole(os.path.join(REPO, path))
        if whole:
            assert found[path] == {"slow"}, path
        else:
            assert "fast" in found[path], (
                f"{path}: every case is marked slow; keep a quick, telling one in the fast tier, or mark the whole "
                f"file with `pytestmark = pytest.mark.slow` (and say why)")
