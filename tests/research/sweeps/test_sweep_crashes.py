"""Sweeps survive a run's crash and damaged files: a child killed by a signal is recorded as crashed
with its last output lines and the sweep goes on; the next sweep resumes it. A truncated results.json
or metrics.jsonl is reported in one line and its run treated as unfinished; the chart skips it."""

import os
import sys

import pytest
from run_records import write_run

from lra_jax.research.sweeps import selection, sweep_plan, sweep_report, sweep_run

# The sweep is this package's Python around child processes, not the jax version's: CI runs it once.
pytestmark = pytest.mark.one_stack("oldest")

FILES = {"softmax": "configs/transformer.py", "linformer": "configs/linformer.py"}

# What a finished run leaves in `workdir`: results.json and the records that back it (`run_result`).
RECORDS = r"""
import json
open(os.path.join(workdir, "config.json"), "w").write("{}")
open(os.path.join(workdir, "metrics.jsonl"), "w").write('{"step": 1, "val/accuracy": 0.5}\n{"step": 2, "test/accuracy": 0.5}\n')
json.dump({"config": {}, "val_accuracy": 0.5, "test_accuracy": 0.5, "best_step": 1},
          open(os.path.join(workdir, "results.json"), "w"))
"""

# First time: "checkpoints", a last word on stderr, then SIGKILL (as the out-of-memory killer sends).
# Again: resumes from the checkpoints it left and finishes (results.json).
CHILD = r"""
import os, signal, sys
workdir = sys.argv[1].split("=", 1)[1]
checkpoints = os.path.join(workdir, "checkpoints")
if not os.path.isdir(checkpoints):
    os.makedirs(checkpoints)
    print("step 5: allocating 40 GiB", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""" + RECORDS

FINISH = r"""
import os, sys
workdir = sys.argv[1].split("=", 1)[1]
os.makedirs(workdir, exist_ok=True)
""" + RECORDS


def make_plan(root):
    runs = sweep_plan.plan("softmax,linformer", "listops", ["mini"], ["0"], str(root), files=FILES,
                      task_names=["listops"], python="python")
    crashing, finishing = runs
    crashing.command = [sys.executable, "-c", CHILD, f"--workdir={crashing.workdir}"]
    finishing.command = [sys.executable, "-c", FINISH, f"--workdir={finishing.workdir}"]
    return runs


@pytest.mark.parametrize("log_to_workdir", [False, True], ids=["console", "train.log"])
def test_a_crashed_run_is_recorded_with_its_last_lines_the_sweep_goes_on_and_resumes_it(tmp_path, log_to_workdir):
    runs = make_plan(tmp_path)
    with sweep_run.Stop() as stop:
        summary = sweep_run.run_sweep(runs, sweep_run.subprocess_runner(stop, log_to_workdir), stop, log=lambda line: None,
                                  cwd=str(tmp_path))
    crashed, finished = summary
    assert crashed["status"] == "crashed" and crashed["exit_code"] == -9
    assert "killed by SIGKILL (out of memory?)" in crashed["error"]
    assert crashed["last_lines"].splitlines()[-1] == "step 5: allocating 40 GiB"
    assert "step 5: allocating 40 GiB" in crashed["error"] and "\n" not in crashed["error"]
    assert finished["status"] == "finished"  # the sweep went on
    assert "crashed" in sweep_report.summary_table(summary)

    with sweep_run.Stop() as stop:
        again = sweep_run.run_sweep(make_plan(tmp_path), sweep_run.subprocess_runner(stop, log_to_workdir), stop,
                                log=lambda line: None, cwd=str(tmp_path))
    assert [(row["before"], row["status"]) for row in again] == [("resume", "finished"), ("done", "skipped")]


def test_a_signal_exit_status_names_the_signal_and_an_error_exit_is_no_crash():
    assert sweep_run.crash_cause(-9) == "killed by SIGKILL (out of memory?)"
    assert sweep_run.crash_cause(139) == "killed by SIGSEGV"  # as a shell reports it: 128 + 11
    assert sweep_run.crash_cause(-15) == "killed by SIGTERM"
    assert sweep_run.crash_cause(1) is None and sweep_run.crash_cause(2) is None and sweep_run.crash_cause(0) is None


def truncate(path: str) -> None:
    """Cuts the file in the middle of its last line, as a full disk or an interrupted copy does."""
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[: len(text) - 8])


def finished_run(workdir, accuracy=0.5):
    os.makedirs(os.path.join(workdir, "checkpoints"), exist_ok=True)
    write_run(workdir, {}, accuracy, task="listops", variant="softmax", scale="mini")


@pytest.mark.parametrize("damaged", ["results.json", "metrics.jsonl"])
def test_a_truncated_file_is_reported_once_and_its_run_is_unfinished(tmp_path, capsys, damaged):
    run = make_plan(tmp_path)[0]
    finished_run(run.workdir)
    assert run.state() == "done"
    path = os.path.join(run.workdir, damaged)
    truncate(path)
    assert run.state() == "resume" and run.state() == "resume"
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 1 and path in err[0] and "treated as unfinished" in err[0], err
    assert "damaged" in err[0]


def test_the_chart_and_the_selection_skip_a_truncated_results_json_in_one_line(tmp_path, capsys):
    for seed, accuracy in ((0, 0.5), (1, 0.7)):
        finished_run(str(tmp_path / "listops-mini" / "softmax" / f"seed{seed}"), accuracy)
    broken = str(tmp_path / "listops-mini" / "softmax" / "seed1" / "results.json")
    truncate(broken)
    found = selection.load(str(tmp_path))
    assert [r.test_accuracy for r in found] == [0.5]
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 1 and broken in err[0] and "unfinished" in err[0]
