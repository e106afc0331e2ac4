"""The generated docs pages: `--check` passes on the committed ones and fails when a page is edited by
hand or when the JSON it is generated from changes."""

import json
import os
import shutil
import subprocess
import sys

from lra_jax.experiments import docs_pages

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_committed_pages_are_what_the_generator_writes():
    assert docs_pages.stale(os.path.join(REPO, "docs"), REPO) == []


def _copy(tmp_path):
    """A repository root holding the committed bench JSON and docs pages, to change freely."""
    root = tmp_path / "repo"
    shutil.copytree(os.path.join(REPO, "experiments", "results"), root / "experiments" / "results",
                    ignore=shutil.ignore_patterns("compile-*", "*.txt"))
    shutil.copytree(os.path.join(REPO, "docs"), root / "docs")
    shutil.copytree(os.path.join(REPO, "experiments", "charts"), root / "experiments" / "charts")
    return root


def check(root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lra_jax.tools.docs", "--check", f"--root={root}",
                           f"--docs_dir={root / 'docs'}"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO})


def test_check_fails_on_a_hand_edited_page(tmp_path):
    root = _copy(tmp_path)
    assert check(root).returncode == 0
    page = root / "docs" / "results" / "gpu-bench.md"
    page.write_text(page.read_text().replace("steps/s", "steps/s (edited)", 1))
    result = check(root)
    assert result.returncode == 1 and "gpu-bench.md" in result.stderr, result.stderr


def test_check_fails_when_the_json_changes(tmp_path):
    root = _copy(tmp_path)
    path = root / "experiments" / "results" / "bench-h200-b32-4096-others.json"
    report = json.loads(path.read_text())
    cell = next(r for r in report["results"] if r["status"] == "ok")
    cell["steps_per_second"] *= 2
    path.write_text(json.dumps(report))
    assert docs_pages.stale(str(root / "docs"), str(root)) == [str(root / "docs" / "results" / "gpu-bench.md")]


def test_claims_are_computed_from_the_cells():
    cells = [{"status": "ok", "dropout_cost": -0.026, "utilisation": 0.34},
             {"status": "ok", "dropout_cost": 0.09, "utilisation": 0.64},
             {"status": "oom", "dropout_cost": 0.5, "utilisation": 0.9}]
    text = " ".join(docs_pages.claims(cells))
    assert "-2.6% and +9.0%" in text and "34.0% to 64.0%" in text and "2 cells" in text
