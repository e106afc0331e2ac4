"""The mini Pathfinder recipe search's table: one row per recipe read from the runs' configs, seeds that
learned and that reached the target counted, the mini config's recipe marked, a damaged run refused."""

import json
import os

import pytest

from lra_jax.research.reports import recipe_search
from lra_jax.training.run_result import DamagedResult
from run_records import task_config, write_run


def config(seed, **changes):
    return task_config("pathfinder,mini", seed, **changes)

def run(root, name, seed, test, **changes):
    write_run(os.path.join(root, recipe_search.SEARCH_ROOT, name, f"seed{seed}"), config(seed, **changes), test,
              task="pathfinder", scale="mini", variant="softmax", test_majority_class_rate=0.5)


def rows(root):
    return [line for line in recipe_search.table(str(root)).splitlines()[2:]]


def test_each_recipe_is_a_row_with_its_seeds_that_learned_and_reached_the_target(tmp_path):
    for seed, test in enumerate([0.70, 0.66, 0.52]):
        run(tmp_path, "chosen", seed, test)
    for seed, test in enumerate([0.50, 0.60]):
        run(tmp_path, "one-layer", seed, test, **{"model.num_layers": 1, "num_train_steps": 1000})
    chosen, other = sorted(rows(tmp_path), key=lambda line: "mini config" not in line)
    assert chosen.startswith("| **mini config** |")
    assert "| 3 | 2/3 | 2/3 | 62.7 ± 9.5 |" in chosen  # 0.52 is under majority + 5 points
    assert other.startswith("| | 1 | 32 | 1000 |") and "| 2 | 1/2 | 0/2 | 55.0 ± 7.1 |" in other


def test_a_run_its_records_do_not_back_is_refused_naming_it(tmp_path):
    run(tmp_path, "chosen", 0, 0.70)
    path = tmp_path / recipe_search.SEARCH_ROOT / "chosen" / "seed0" / "results.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "test_accuracy": 0.99}))
    with pytest.raises(DamagedResult, match="seed0"):
        recipe_search.table(str(tmp_path))
