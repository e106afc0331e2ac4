"""A result is believed only with its evidence (`lra_jax.training.run_result`), through the real commands: a
results.json whose test accuracy was edited by hand (metrics.jsonl says otherwise), whose config is not the run's
config.json, or whose accuracy is NaN, 37.0 or -0.5 is one line naming the run's results.json; the sweep's
--status calls the run damaged, `train` refuses to call it finished, and the chart draws nothing (--runs) or
stops (--check) instead of drawing 99%, 3700% or a traceback. Every committed run passes the check."""

import glob
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, child_xla_flags
from run_records import write_run

from lra_jax.research.sweeps import sweep_plan, sweep_run
from lra_jax.tools import chart, sweep
from lra_jax.training import run_result

pytestmark = pytest.mark.one_stack("oldest")

TRUE_TEST = 0.228


def hand_edited(record, lines):
    record["test_accuracy"] = 0.99  # metrics.jsonl keeps the 0.228 the run measured


def config_changed(record, lines):
    record["config"]["model"]["num_layers"] += 3  # config.json keeps the run's


def nan(record, lines):
    record["test_accuracy"] = math.nan
    lines[-1]["test/accuracy"] = None  # as the trainer logs a non-finite value


def percent(record, lines):
    record["test_accuracy"] = lines[-1]["test/accuracy"] = 37.0  # both agree, and neither is an accuracy


def negative(record, lines):
    record["val_accuracy"] = -0.5
    for line in lines:
        if "val/accuracy" in line:
            line["val/accuracy"] = -0.5


# What each case's one line says; {test}: the test accuracy the run logged.
CASES = {"hand-edited test accuracy": (hand_edited, "test_accuracy 0.99 disagrees with the {test} that metrics.jsonl"),
         "config": (config_changed, "its config differs from config.json in model.num_layers"),
         "nan": (nan, "test_accuracy nan is not an accuracy"),
         "37.0": (percent, "test_accuracy 37.0 is not an accuracy"),
         "-0.5": (negative, "val_accuracy -0.5 is not an accuracy")}


def damage(workdir, case):
    """Applies `case` to the run's results.json and metrics.jsonl; returns what its one line must say."""
    change, says = CASES[case]
    paths = {name: os.path.join(workdir, name) for name in ("results.json", "metrics.jsonl")}
    with open(paths["results.json"], encoding="utf-8") as f:
        record = json.load(f)
    with open(paths["metrics.jsonl"], encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    logged = lines[-1]["test/accuracy"]
    change(record, lines)
    with open(paths["results.json"], "w", encoding="utf-8") as f:
        json.dump(record, f)  # NaN as JSON's NaN, as json.dump writes it
    with open(paths["metrics.jsonl"], "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return says.format(test=logged)


def the_line(text, workdir, says):
    """The one line of `text` that names the run's results.json (by its absolute path, or relative to the working
    directory as the chart shows paths) and says `says`."""
    path = os.path.join(workdir, "results.json")
    lines = [line for line in text.splitlines() if path in line or os.path.relpath(path) in line]
    assert len(lines) == 1 and says in lines[0] and "delete" in lines[0], text[-3000:]
    assert "Traceback" not in text
    return lines[0]


# ----------------------------------------------------------------------------- sweep --status

def planned_run(root):
    return sweep_plan.plan("softmax", "listops", ["mini"], ["0"], str(root),
                           files={"softmax": "configs/transformer.py"}, task_names=["listops"])[0]


def sweep_status(root, capsys):
    with pytest.raises(SystemExit) as exit_:
        sweep.main(["--variants=softmax", "--tasks=listops", "--scales=mini", "--seeds=0", f"--root={root}",
                    "--status"])
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


@pytest.mark.parametrize("case", CASES)
def test_sweep_status_calls_a_run_without_its_evidence_damaged_not_done(tmp_path, capsys, case):
    run = planned_run(tmp_path)
    write_run(run.workdir, run.config, TRUE_TEST, 0.25)
    code, text = sweep_status(tmp_path, capsys)
    assert code == 0 and text.strip().splitlines()[-1] == "1 done", text
    says = damage(run.workdir, case)
    code, text = sweep_status(tmp_path, capsys)
    assert code == 0 and text.strip().splitlines()[-1] == "1 damaged", text
    line = the_line(text, run.workdir, says)
    assert line.split()[:2] == ["listops-mini/softmax/seed0", "damaged"]


def test_a_sweep_never_trains_over_a_damaged_run_and_counts_it_unfinished(tmp_path):
    run = planned_run(tmp_path)
    write_run(run.workdir, run.config, TRUE_TEST, 0.25)
    says = damage(run.workdir, "hand-edited test accuracy")
    trained = []
    [row] = sweep_run.run_sweep([run], lambda command, cwd, slot: trained.append(command) or 0, log=lambda line: None)
    assert trained == [] and row["status"] == "damaged" and row["status"] in sweep_run.UNFINISHED
    assert says in row["error"] and os.path.join(run.workdir, "results.json") in row["error"]


def test_a_run_extended_to_more_steps_resumes_though_its_old_test_line_is_gone(tmp_path):
    """A finished rsqrt run asked for more steps: the trainer drops the old test line from metrics.jsonl as it
    goes on, and results.json is rewritten at the new end; until then the run is to resume, not damaged."""
    run = planned_run(tmp_path)
    write_run(run.workdir, run.config, TRUE_TEST, 0.25, num_train_steps=run.config["num_train_steps"] - 1)
    path = os.path.join(run.workdir, "metrics.jsonl")
    with open(path, encoding="utf-8") as f:
        kept = [line for line in f if "test/accuracy" not in line]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(kept)
    assert run.damage() is not None and run.state() == "resume"


# ----------------------------------------------------------------------------- chart --runs and --check

def chart_runs(root):
    """Two variants on ListOps, one seed each, as the sweep lays them out; the softmax run's workdir."""
    for variant, test in (("softmax", TRUE_TEST), ("linear", 0.3)):
        write_run(root / "listops-mini" / variant / "seed0", {"seed": 0, "scale": "mini", "model": {"num_layers": 2}},
                  test, test, task="listops", variant=variant, scale="mini")
    return str(root / "listops-mini" / "softmax" / "seed0")


def run_chart(capsys, *flags):
    with pytest.raises(SystemExit) as exit_:
        chart.main(list(flags))
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


@pytest.mark.parametrize("case", CASES)
def test_chart_runs_draws_nothing_from_a_run_without_its_evidence(tmp_path, capsys, case):
    workdir = chart_runs(tmp_path / "runs")
    says = damage(workdir, case)
    code, text = run_chart(capsys, f"--runs={tmp_path / 'runs'}", f"--out={tmp_path / 'out'}")
    assert code == 2 and the_line(text, workdir, says).startswith("error: ")
    assert not os.path.exists(tmp_path / "out")  # nothing drawn, no table


@pytest.mark.parametrize("case", CASES)
def test_chart_check_stops_on_a_run_without_its_evidence(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    workdir = chart_runs(tmp_path / "runs")
    chart.main(["--runs=runs", "--out=out"])
    capsys.readouterr()
    says = damage(workdir, case)
    code, text = run_chart(capsys, "--check", "--out=out")
    assert code == 2 and the_line(text, "runs/listops-mini/softmax/seed0", says).startswith("error: ")


# ----------------------------------------------------------------------------- train

LISTOPS = ["--config=configs/transformer.py:listops,mini", "--config.num_train_steps=4", "--config.eval_every=2",
           "--config.checkpoint_every=2", "--config.log_every=2", "--config.max_len=32",
           "--config.model.num_layers=1", "--config.model.emb_dim=16", "--config.model.mlp_dim=32",
           "--config.model.num_heads=2", "--config.data.generator.num_train=64", "--config.data.generator.num_val=32",
           "--config.data.generator.num_test=32", "--config.data.generator.max_length=32"]


def train(cache, workdir):
    env = dict(os.environ, LRA_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags())
    return subprocess.run([sys.executable, "-m", "lra_jax.train", *LISTOPS, f"--workdir={workdir}"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ListOps run trained to its end by `python -m lra_jax.train`: (cache, workdir)."""
    root = tmp_path_factory.mktemp("trained")
    done = train(root / "cache", root / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "cache", root / "run"


@pytest.mark.slow
def test_train_finds_its_own_run_finished_and_backed(trained):
    cache, workdir = trained
    again = train(cache, workdir)
    assert again.returncode == 0 and f"{workdir}: finished at step 4" in again.stdout, again.stderr[-3000:]
    run_result.read(str(workdir))  # what it wrote is backed by its own log and config


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_train_refuses_to_call_a_run_without_its_evidence_finished(trained, tmp_path, case):
    cache, original = trained
    workdir = tmp_path / "run"
    shutil.copytree(original, workdir)
    says = damage(str(workdir), case)
    if case == "config":  # the run's identity check refuses another config before any result is read
        says = "model.num_layers differ from its results.json"
    again = train(cache, workdir)
    errors = [line for line in again.stderr.splitlines() if line.startswith("error: ")]
    assert again.returncode == 2 and len(errors) == 1 and "finished" not in again.stdout, again.stderr[-3000:]
    assert "Traceback" not in again.stderr and says in errors[0] and "delete" in errors[0], errors


# ----------------------------------------------------------------------------- the committed runs

def test_every_committed_run_is_backed_by_its_records():
    workdirs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(REPO, "experiments", "**", "results.json"),
                                                           recursive=True))
    assert workdirs
    problems = [p for w in workdirs if (p := run_result.problem(w, json.load(open(os.path.join(w, "results.json")))))]
    assert problems == []


def test_an_accuracy_is_a_finite_fraction():
    assert [run_result.accuracy(v) for v in (0, 1, 0.5, 1.0)] == [0.0, 1.0, 0.5, 1.0]
    assert all(run_result.accuracy(v) is None for v in (math.nan, math.inf, 37.0, -0.5, 1.0001, "0.9", None, True))
