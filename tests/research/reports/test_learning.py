"""Whether a seed learned (lra_jax.research.reports.learning) and how the tables say it, through the chart command."""

import pytest
from chart_helpers import run_dir, table_rows
from run_records import write_run as write_records

from lra_jax.research.reports.learning import LEARNED_MARGIN, learned, learned_note
from lra_jax.tools import chart

pytestmark = pytest.mark.one_stack("oldest")


def write_run(root, task, variant, seed, accuracy, majority):
    write_records(run_dir(root, task, variant, seed, "mini", ""), {"seed": seed, "scale": "mini"}, accuracy,
                  task=task, variant=variant, scale="mini", test_majority_class_rate=majority)


def test_a_seed_learned_only_clearly_above_its_majority_rate():
    assert learned(0.5067 + LEARNED_MARGIN, 0.5067) and not learned(0.5067 + LEARNED_MARGIN - 0.001, 0.5067)
    assert not learned(0.4933, 0.5067)  # the other class, predicted throughout: chance too
    assert learned(0.60, None) is None  # no rate recorded: judged neither way
    assert learned_note((2, 3)) == ", 2/3 learned" and learned_note((3, 3)) == "" and learned_note(None) == ""


def test_the_tables_say_how_many_seeds_learned_where_some_sit_at_chance(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for seed, accuracy in enumerate((0.70, 0.4933, 0.80)):  # seed 1 predicted one class throughout
        write_run(runs, "pathfinder", "softmax", seed, accuracy, 0.5067)
        write_run(runs, "pathfinder", "linear", seed, 0.70 + 0.01 * seed, 0.5067)
        write_run(runs, "listops", "softmax", seed, 0.37, 0.167)
        write_run(runs, "listops", "linear", seed, 0.36, 0.167)
    chart.main([f"--runs={runs}", f"--out={tmp_path / 'out'}", "--reference="])
    table = (tmp_path / "out" / "lra_results.md").read_text(encoding="utf-8")
    rows = table_rows(table)
    assert rows["softmax"][2] == "66.44 ± 15.64, 2/3 learned", rows["softmax"]
    assert rows["linear"][2] == "71.00 ± 1.00" and rows["softmax"][1] == "37.00 ± 0.00"
    assert f"at least {100 * LEARNED_MARGIN:g} points above" in table
    summary = table_rows((tmp_path / "out" / "lra_summary.md").read_text(encoding="utf-8"))
    assert summary["softmax"][2] == "66.4 ± 15.6, 2/3 learned", summary["softmax"]
