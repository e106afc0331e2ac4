"""The Python shown in README.md and docs/ runs, and a documented result says where it holds.

Every ```python block at the start of a line (not the indented fragments inside a list, which show part
of a class) runs as a program of its own on the CPU and must exit 0: the library snippet of the README
is a test. A stated result (an "expected" or observed accuracy) is either a range or names the machine
it came from, since float sums in another order give another figure on another machine.
"""

import glob
import os
import re
import subprocess
import sys

import pytest
from helpers import REPO

DOCUMENTS = ["README.md", *sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))]


def python_blocks() -> list[tuple[str, str]]:
    """(document, code) of every unindented ```python block."""
    blocks = []
    for document in DOCUMENTS:
        text = open(os.path.join(REPO, document), encoding="utf-8").read()
        blocks += [(document, code) for code in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)]
    return blocks


def test_the_readme_shows_the_library_in_python():
    assert any(document == "README.md" and "registry.build(" in code for document, code in python_blocks())


@pytest.mark.parametrize("document,code", python_blocks(), ids=lambda value: value[:40] if "\n" in value else value)
@pytest.mark.slow
def test_a_documented_program_runs(document, code, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{document}: the block exits {done.returncode}:\n{done.stderr[-3000:]}"


STATED = re.compile(r"([Ee]xpected|One run, one machine|gave)\b[^.;]*?\b0\.\d{3}\b")
MACHINE = re.compile(r"\b(CPU|CPUs|GPU|GPUs|H100|H200|TPU|machine)\b")
RANGE = re.compile(r"\bbetween 0\.\d+ and 0\.\d+")


def stated_results() -> list[tuple[str, str]]:
    """(file, sentence) of every sentence stating an accuracy as a result, in the documents and configs."""
    files = DOCUMENTS + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "configs", "*.py")))
    found = []
    for path in files:
        text = " ".join(open(os.path.join(REPO, path), encoding="utf-8").read().split())
        for sentence in re.split(r"(?<=[.:])\s+(?=[A-Z])", text):
            if STATED.search(sentence):
                found.append((path, sentence))
    return found


def test_results_are_stated_somewhere():
    files = {path for path, _ in stated_results()}
    assert "README.md" in files and "configs/linformer.py" in files


@pytest.mark.parametrize("path,sentence", stated_results(), ids=lambda value: value[:30])
def test_a_stated_result_is_a_range_or_names_its_machine(path, sentence):
    assert RANGE.search(sentence) or MACHINE.search(sentence), (
        f"{path}: '{sentence}' states a result without a range or the machine it came from")
