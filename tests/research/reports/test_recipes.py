"""lra_jax.research.reports.recipes: a run's recipe from its config.json, and the note that names a task whose
recipe in one set of cells is not another's."""

import os

import pytest

from lra_jax.research.reports import recipes
from run_records import task_config, write_run

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")
TITLES = {"listops": "ListOps", "pathfinder": "Pathfinder"}


def cell(root, name, task, **changes):
    """A cell of `task` whose chosen point's runs (one seed) were trained with `changes` to the mini config, as
    an `lra_results.aggregate` entry holds it: {"files": {task: its run directory}}."""
    workdir = os.path.join(root, name, "seed0")
    write_run(workdir, task_config(f"{task},mini", 0, **changes), 0.6, task=task, scale="mini", variant="softmax")
    return {"files": {task: os.path.dirname(workdir)}}


def test_a_recipe_is_the_settings_but_the_rate_and_the_words_name_what_differs():
    current = recipes.recipe(task_config("pathfinder,mini", 0))
    earlier = recipes.recipe(task_config("pathfinder,mini", 1, **{"model.num_layers": 1, "num_train_steps": 1000,
                                                                   "optimizer.learning_rate": 0.5}))
    assert "rate" not in current and current["contour"] == 6
    assert recipes.words(earlier, current) == "layers 1, steps 1000"
    assert recipes.words(current, current) == "the same"
    assert recipes.recipe(task_config("listops,mini", 0))["contour"] is None  # a setting the task has not


def test_the_note_names_only_the_tasks_whose_recipes_differ_with_every_recipe_of_each_side(tmp_path):
    headline = {"softmax": {"files": {**cell(tmp_path, "h-listops", "listops")["files"],
                                      **cell(tmp_path, "h-pathfinder", "pathfinder")["files"]}},
                "linear": cell(tmp_path, "h-linear", "pathfinder", **{"num_train_steps": 1500})}
    same = {"softmax": cell(tmp_path, "c-listops", "listops")}
    assert recipes.difference_note(same, headline, TITLES) == ""
    other = {"softmax": {"files": {**same["softmax"]["files"],
                                   **cell(tmp_path, "c-pathfinder", "pathfinder", **{"model.num_layers": 1})["files"]}}}
    assert recipes.difference_note(other, headline, TITLES) == (
        "Pathfinder on another recipe than the headline's (layers 1, steps 2000; the headline: layers 2, steps 1500; "
        "layers 2)."), "each side's every recipe, in variant order, against the other side's first"
