"""The state-space and modern-mixer papers' published LRA figures (`lra_results.MIXER_REFERENCES`:
experiments/reference/s4d_paper.json, modern_papers.json): every file well formed, listed in the results
table (the figures keep to our measured points and the LRA paper's)."""

import json

import pytest
from chart_helpers import FIVE, measure, write_result

from lra_jax.attention import registry
from lra_jax.research.reports import lra_results

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")

SIX = (*FIVE, "path_x")


def documents() -> list[dict]:
    out = []
    for path in lra_results.MIXER_REFERENCES:
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def every_paper() -> list[dict]:
    return [paper for document in documents() for paper in lra_results.papers(document)]


@pytest.mark.parametrize("paper", every_paper(), ids=lambda paper: paper.get("name", "S4D"))
def test_a_paper_names_its_sources_and_every_row_has_every_task_and_true_averages(paper):
    assert "arXiv:" in paper["paper"] and paper["source"] and all(paper["source"].values())
    assert tuple(paper["tasks"]) == FIVE == lra_results.LRA_TASKS
    if "name" in paper:  # the modern papers: where in the paper, the page only where it was verified
        assert paper["table"].startswith("Table ") and (paper["page"] is None or isinstance(paper["page"], int))
        assert paper["notes"] and paper["averages"]
    for model in paper["models"]:
        accuracy, name = model["accuracy"], model["paper_name"]
        assert set(accuracy) == set(SIX) and set(model["std"]) == set(SIX), name
        assert all(isinstance(accuracy[t], float) for t in FIVE), name
        assert isinstance(accuracy["path_x"], float) or accuracy["path_x"] == "FAIL", name
        # Each figure and each average is printed to 0.01: a mean agrees with its average to that rounding.
        assert sum(accuracy[t] for t in FIVE) / 5 == pytest.approx(model["avg5"], abs=0.006), name
        path_x = 50.0 if accuracy["path_x"] == "FAIL" else accuracy["path_x"]  # the S4D paper's convention
        assert (sum(accuracy[t] for t in FIVE) + path_x) / 6 == pytest.approx(model["avg6"], abs=0.006), name
        assert model["variant"] is None or model["variant"] in registry.names(), name
        assert model["verified"], name
    implemented = [m["paper_name"] for m in paper["models"] if m["variant"]]
    assert implemented == [paper["implemented"]]


def test_each_implemented_variant_has_one_published_row_and_the_others_no_lra_run():
    rows = [m["variant"] for paper in every_paper() for m in paper["models"] if m["variant"]]
    assert sorted(rows) == ["lru", "mega", "s4d", "s5"]
    absent = [a["variant"] for document in documents() for a in document.get("no_lra_run", [])]
    assert sorted(absent) == ["gla", "hyena", "s6", "ssd"]
    assert set(absent) <= set(registry.names()) and not set(absent) & set(rows)
    assert set(lra_results.implemented_rows(documents())) == set(rows)


def test_the_results_table_lists_every_published_paper(tmp_path):
    root = tmp_path / "runs"
    write_result(root, "listops", "softmax", 0, 0.4)
    table = lra_results.markdown_table({"full": measure(root)}, None, None, None, mixer_references=documents())
    for heading in ("## Published (S4D paper): the state-space yardstick, not attention", "## Published (S5 paper)",
                    "## Published (LRU paper)", "## Published (Mega paper)"):
        assert heading in table
    assert "| S4D-Lin (s4d) | 60.52 | 86.97 | 90.96 | 87.93 | 93.96 | FAIL | 84.07 | 78.39 |" in table
    assert "| S5 (s5) | 62.15 | 89.31 | 91.40 | 88.00 | 95.33 | 98.58 | 85.24 | 87.46 |" in table
    assert "| LRU (lru) | 60.20 | 89.40 | 89.90 | 89.00 | 95.10 | 94.20 | 84.72 | 86.30 |" in table
    assert "| Mega (mega) | 63.14 | 90.43 | 91.25 | 90.44 | 96.01 | 97.98 | 86.25 | 88.21 |" in table
    assert "| Mega-chunk | 58.76 | 90.19 | 90.97 | 85.80 | 94.41 | 93.81 | 84.03 | 85.66 |" in table
    assert "arXiv:2209.10655 (Table 2, p. 7)." in table and "arXiv:2303.06349 (Table 3)." in table
    absent = next(line for line in table.splitlines() if line.startswith("Implemented, with no LRA run"))
    assert all(f"{v} (" in absent for v in ("s6", "ssd", "gla", "hyena"))
    # without the files, no published section
    assert "## Published (" not in lra_results.markdown_table({"full": measure(root)}, None, None, None)
