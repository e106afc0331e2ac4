"""lra_jax.research.sweeps.selection: the grid point is chosen on validation accuracy, never on test; mean and std."""

import json
import os

import pytest
from run_records import write_run

from lra_jax.research.sweeps import selection

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def result(point, seed, val, test, variant="softmax"):
    return selection.Result(task="listops", scale="mini", variant=variant, point=point, seed=seed,
                            val_accuracy=val, test_accuracy=test, diverged_at_step=None, path="")


def diverged(point, seed):
    return selection.Result(task="listops", scale="mini", variant="softmax", point=point, seed=seed,
                            val_accuracy=None, test_accuracy=None, diverged_at_step=9, path="")


def test_the_point_with_the_best_validation_mean_is_chosen_even_when_its_test_is_worse():
    chosen = selection.select([
        result("lr=1", 0, val=0.60, test=0.50), result("lr=1", 1, val=0.62, test=0.60),
        result("lr=1", 2, val=0.64, test=0.70),
        result("lr=2", 0, val=0.50, test=0.99), result("lr=2", 1, val=0.52, test=0.99),
        result("lr=2", 2, val=0.54, test=0.99),
    ])
    assert chosen.point == "lr=1" and chosen.seeds == [0, 1, 2] and chosen.n == 3
    assert chosen.test_mean == pytest.approx(0.60) and chosen.test_std == pytest.approx(0.10)  # ddof 1
    assert chosen.val_mean == pytest.approx(0.62)
    assert chosen.candidates == pytest.approx({"lr=1": 0.62, "lr=2": 0.52})


def test_points_are_compared_on_the_seeds_they_share_as_in_the_two_stage_protocol():
    # two-stage: both points at seed 0; only the chosen one at seeds 1, 2, which happen to be poor
    chosen = selection.select([result("lr=1", 0, 0.70, 0.6), result("lr=1", 1, 0.30, 0.5),
                               result("lr=1", 2, 0.32, 0.4), result("lr=2", 0, 0.65, 0.9)])
    assert chosen.point == "lr=1" and chosen.compared_on == [0]
    assert chosen.candidates == pytest.approx({"lr=1": 0.70, "lr=2": 0.65})
    assert chosen.test_mean == pytest.approx(0.5) and chosen.n == 3


def test_a_point_with_a_diverged_seed_is_out_and_all_diverged_is_none():
    chosen = selection.select([result("lr=1", 0, 0.5, 0.5), result("lr=1", 1, 0.5, 0.5),
                               result("lr=9", 0, 0.9, 0.9), diverged("lr=9", 1)])
    assert chosen.point == "lr=1" and chosen.diverged == ["lr=9"] and chosen.compared_on == [0, 1]
    assert selection.select([diverged("lr=1", 0)]) is None


def test_one_seed_has_no_std():
    chosen = selection.select([result("lr=2", 0, 0.6, 0.3), result("lr=1", 0, 0.5, 0.4)])
    assert chosen.point == "lr=2" and chosen.test_std is None and chosen.test_mean == pytest.approx(0.3)


def test_a_tie_goes_to_the_lower_value_by_number_not_to_the_first_name_in_sorted_order():
    # as text "optimizer.learning_rate=0.001" sorts before "...=5e-4"; by value 5e-4 is the lower rate
    low, high = "optimizer.learning_rate=5e-4", "optimizer.learning_rate=0.001"
    chosen = selection.select([result(high, 0, 0.5, 0.9), result(low, 0, 0.5, 0.1)])
    assert chosen.point == low and chosen.test_mean == pytest.approx(0.1)
    # sums in another order differ in the last bit: still a tie
    chosen = selection.select([result(high, s, v, 0.9) for s, v in enumerate((0.1, 0.2, 0.3))]
                              + [result(low, s, v, 0.1) for s, v in enumerate((0.3, 0.2, 0.1))])
    assert chosen.point == low
    # the config's own settings (a run outside a grid) come before any grid point; a clear best still wins
    assert selection.select([result(low, 0, 0.5, 0.1), result("", 0, 0.5, 0.2)]).point == ""
    assert selection.select([result(low, 0, 0.5, 0.1), result(high, 0, 0.5 + 1e-6, 0.2)]).point == high
    # several keys: the first key written decides, then the next
    assert selection.tie_order("lr=0.1,wd=0") < selection.tie_order("lr=0.1,wd=0.01") < selection.tie_order(
        "lr=0.2,wd=0")


def test_load_reads_the_grid_point_from_the_layout_and_skips_malformed_files(tmp_path, capsys):
    def write(rel, **fields):
        write_run(tmp_path / rel, {"seed": 1}, 0.4, 0.5, task="listops", variant="softmax", scale="mini", **fields)

    write("listops-mini/softmax/optimizer.learning_rate=0.05/seed1")
    write("listops-mini/softmax/seed1")
    write("listops-mini/linformer/seed0", status="diverged", diverged_at_step=3)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{not json")
    for name, text in (("a-list", "[1, 2]"), ("a-number", "3"), ("bad-config", json.dumps(
            {"task": "listops", "variant": "softmax", "config": [], "val_accuracy": 0.5, "test_accuracy": 0.4}))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(text)
    found = {r.path.replace(str(tmp_path) + "/", ""): r for r in selection.load(str(tmp_path), scale="mini")}
    assert found["listops-mini/softmax/optimizer.learning_rate=0.05/seed1/results.json"].point == \
        "optimizer.learning_rate=0.05"
    assert found["listops-mini/softmax/seed1/results.json"].point == ""
    assert found["listops-mini/linformer/seed0/results.json"].diverged
    err = capsys.readouterr().err.splitlines()
    assert len(found) == 3
    for name, why in (("broken", "JSONDecodeError"), ("a-list", "not a JSON object but an array"),
                      ("a-number", "not a JSON object but a number"), ("bad-config", "its config is not a JSON object")):
        [line] = [e for e in err if os.path.join(name, "results.json") in e]  # one line per damaged file
        assert line.startswith("warning: skipping") and why in line, line
    assert selection.load(str(tmp_path), scale="full") == []
