"""The earlier and the current mini Pathfinder recipe side by side: each column the sweep's own selection,
ranks within the compared variants, Welch/Holm on the change, the variants still to run named, and a column
that mixes recipes or holds a damaged run refused."""

import json
import os

import pytest

from lra_jax.attention import registry
from lra_jax.errors import LraError
from lra_jax.research.reports import recipe_comparison
from lra_jax.training.run_result import DamagedResult
from run_records import task_config, write_run

EARLIER = {"model.num_layers": 1, "num_train_steps": 1000}


def config(seed, rate, **changes):
    return task_config("pathfinder,mini", seed, **{"optimizer.learning_rate": rate, **changes})

def runs(root, where, variant, tests, rate=0.001, val=None, **changes):
    """One run per seed of `tests` (test accuracies) at `rate` under `where` (a column's root)."""
    for seed, test in enumerate(tests):
        workdir = os.path.join(root, where, variant, f"optimizer.learning_rate={rate:g}", f"seed{seed}")
        write_run(workdir, config(seed, rate, **changes), test, val, task="pathfinder", scale="mini", variant=variant,
                  test_majority_class_rate=0.507)


def rows(text):
    return {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")}


def test_each_variant_beside_itself_with_ranks_tests_and_what_is_still_to_run(tmp_path):
    runs(tmp_path, recipe_comparison.EARLIER_ROOT, "softmax", [0.493, 0.493, 0.585], **EARLIER)
    runs(tmp_path, recipe_comparison.EARLIER_ROOT, "s4d", [0.80, 0.82, 0.84], **EARLIER)
    runs(tmp_path, recipe_comparison.EARLIER_ROOT, "linear", [0.50, 0.51, 0.49], **EARLIER)
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "softmax", [0.69, 0.70, 0.71])
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "s4d", [0.86, 0.85, 0.87])
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "linear", [0.50, 0.52, 0.48])
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "fnet", [0.70])  # one seed so far: not compared
    text = recipe_comparison.block(str(tmp_path))
    pending = [v for v in registry.names() if v not in ("softmax", "s4d", "linear")]
    assert text.startswith(f"In progress: 3 of {len(registry.names())} registered variants")
    assert text.splitlines()[0].endswith("still to run: " + ", ".join(pending) + ".") and "fnet" in pending
    table = rows(text)
    assert list(table) == ["s4d", "softmax", "linear"]  # by rank on the current recipe
    assert "layers 1, steps 1000" in text and "layers 2, steps 2000" in text
    softmax = table["softmax"]
    assert softmax[1:6] == ["52.4 ± 5.3, 1/3 learned", "2", "70.0 ± 1.0", "2", "+17.6"]
    assert "Holm" in softmax[6] and "within seed noise" in softmax[6]  # one lucky earlier seed: a wide spread
    assert table["linear"][2] == "3" and table["linear"][5] == "+0.0" and "within seed noise" in table["linear"][6]
    assert "every seed learned for 1 of them on the earlier recipe and 2 on the current one" in text
    assert "Kendall's tau-b +1.00" in text and "over 36.0 points (linear 50.0 to s4d 86.0)" in text


def test_a_clear_change_is_called_and_holm_counts_every_variant_compared(tmp_path):
    runs(tmp_path, recipe_comparison.EARLIER_ROOT, "softmax", [0.49, 0.50, 0.51], **EARLIER)
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "softmax", [0.69, 0.70, 0.71])
    assert rows(recipe_comparison.block(str(tmp_path)))["softmax"][6].endswith(": higher |")


def test_a_column_of_two_recipes_is_refused_naming_what_differs(tmp_path):
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "softmax", [0.69, 0.70, 0.71])
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "s4d", [0.86], **EARLIER)
    with pytest.raises(LraError, match="2 recipes .layers 1 vs 2, steps 1000 vs 2000"):
        recipe_comparison.block(str(tmp_path))


def test_a_run_its_records_do_not_back_is_refused_naming_it(tmp_path):
    runs(tmp_path, recipe_comparison.CURRENT_ROOT, "softmax", [0.69, 0.70, 0.71])
    path = tmp_path / recipe_comparison.CURRENT_ROOT / "softmax" / "optimizer.learning_rate=0.001" / "seed1" / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "test_accuracy": 0.99}))
    with pytest.raises(DamagedResult, match="seed1"):
        recipe_comparison.block(str(tmp_path))


def test_before_any_variant_is_complete_the_block_says_only_what_is_to_run(tmp_path):
    runs(tmp_path, recipe_comparison.EARLIER_ROOT, "softmax", [0.49, 0.50, 0.51], **EARLIER)
    text = recipe_comparison.block(str(tmp_path))
    assert text.startswith(f"In progress: 0 of {len(registry.names())}") and "|" not in text
