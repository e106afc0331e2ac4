"""The sweep's --pretrain=none,spt axis: the plan, the per-arm selection, the from-scratch vs SPT table,
the estimate of the pretraining stage, and the field that tells the two arms apart (no training)."""

import json
import os

import pytest
from run_records import write_run

from lra_jax.errors import ConfigError
from lra_jax.research.sweeps import selection, sweep_plan, sweep_report

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


FILES = {"softmax": "configs/transformer.py"}


def make_plan(root, seeds=("0",), overrides=("--config.num_train_steps=10",), **kwargs):
    return sweep_plan.plan("softmax", "listops", ["mini"], list(seeds), str(root), list(overrides), files=FILES,
                           task_names=["listops"], python="python", pretraining=["none", "spt"], **kwargs)


def test_spt_runs_get_the_masked_stage_and_their_own_directory_and_cell(tmp_path):
    scratch, spt = make_plan(tmp_path)
    assert (scratch.name, spt.name) == ("listops-mini/softmax/seed0", "listops-mini/softmax/spt/seed0")
    assert spt.workdir == str(tmp_path / "listops-mini" / "softmax" / "spt" / "seed0")
    assert scratch.cell != spt.cell and (scratch.pretrain, spt.pretrain) == ("none", "spt")
    assert spt.command[:-2] == [a if not a.startswith("--workdir=") else f"--workdir={spt.workdir}"
                                for a in scratch.command]  # the same fine-tuning
    assert spt.command[-2:] == ["--config.pretrain.objective=masked", "--config.pretrain.num_steps=10"]
    assert spt.config["pretrain"]["num_steps"] == 10 and scratch.config["pretrain"]["objective"] == "none"
    assert sweep_plan.shape_key(scratch) == sweep_plan.shape_key(spt)  # one fine-tuning step to time
    assert make_plan(tmp_path, pretrain_steps=4)[1].command[-1] == "--config.pretrain.num_steps=4"


def test_pretraining_axis_mistakes_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="comma list of none, spt"):
        sweep_plan.plan("softmax", "listops", ["mini"], ["0"], str(tmp_path), files=FILES, task_names=["listops"],
                        pretraining=["bert"])
    with pytest.raises(ConfigError, match="pretrain_steps"):
        make_plan(tmp_path, pretrain_steps=-1)


def write_result(run, val, test, seconds=None):
    record = {"num_steps": 10, "seconds": seconds} if run.pretrain == "spt" else None
    write_run(run.workdir, run.config, test, val, task=run.task, variant=run.variant, scale=run.scale,
              pretrain_objective="masked" if record else "none", pretrain=record)


def test_each_arm_is_chosen_on_validation_and_compared_with_its_pretraining_cost(tmp_path):
    runs = make_plan(tmp_path, seeds=("0", "1"))
    scratch0, scratch1, spt0, spt1 = runs
    write_result(scratch0, 0.3, 0.30)
    write_result(scratch1, 0.3, 0.40)
    write_result(spt0, 0.5, 0.50, seconds=20.0)
    write_result(spt1, 0.5, 0.60, seconds=40.0)
    table = sweep_report.pretraining_table(sweep_plan.protocol_runs(runs, "two_stage")[0])
    assert ("listops-mini softmax: scratch 35.00 ± 7.07 (n=2), SPT 55.00 ± 7.07 (n=2), gain +20.00; "
            "pretraining 10 steps, 30 s a run") in table
    found = {r.path: r.pretrain for r in selection.load(str(tmp_path))}
    assert found[os.path.join(spt0.workdir, "results.json")] == "masked"
    assert found[os.path.join(scratch0.workdir, "results.json")] == "none"


def test_the_estimate_adds_the_pretraining_stage_labelled_modeled(tmp_path):
    runs = make_plan(tmp_path)
    calls = []

    def capture(command, cwd):
        calls.append(command)
        return 0, json.dumps({"seconds_per_step": 0.5, "num_train_steps": 10, "projected_train_seconds": 60.0})

    rows = sweep_report.estimate_runs(runs, capture, log=lambda line: None)
    assert len(calls) == 1  # both arms fine-tune with the same step
    assert "pretrain_steps" not in rows[0] and rows[1]["projected_pretrain_seconds"] == 5.0
    table = sweep_report.estimate_table(rows)
    assert "listops-mini/softmax/spt/seed0 (pretraining)" in table
    assert "pretraining: 0 min, modeled" in table and "total: 2 min" in table
