"""lra_jax.tools.sweep: the plan, grids and the two-stage protocol, skip/resume, failure reporting, --emit,
parallel runs on pinned devices and signal forwarding (no training)."""

import json
import os
import shlex
import subprocess
import sys
import threading

import pytest
from run_records import write_diverged_run, write_run

from lra_jax.errors import ConfigError
from lra_jax.research.sweeps import device_slots, sweep_plan, sweep_report, sweep_run

# The sweep is this package's Python around child processes, not the jax version's: CI runs it once.
pytestmark = pytest.mark.one_stack("oldest")

FILES = {"softmax": "configs/transformer.py", "linformer": "configs/linformer.py"}


def make_plan(root, variants="softmax,linformer", seeds=("0",), overrides=(), grid=()):
    return sweep_plan.plan(variants, "listops", ["mini"], list(seeds), str(root), list(overrides), files=FILES,
                      task_names=["listops"], python="python", grid=sweep_plan.parse_grid(list(grid), list(overrides)))


def workdir_of(command):
    return next(a.split("=", 1)[1] for a in command if a.startswith("--workdir="))


class FakeRunner:
    """Records commands; 'trains' by writing results.json, except for workdirs listed in `fail`."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def __call__(self, command, cwd, slot=None):
        self.calls.append(command)
        workdir = workdir_of(command)
        if any(workdir.endswith(f) for f in self.fail):
            return 1
        write_run(workdir, {})
        return 0


def test_plan_layout_and_commands(tmp_path):
    runs = make_plan(tmp_path, seeds=("0", "3"), overrides=["--config.num_train_steps=10"])
    assert [r.name for r in runs] == ["listops-mini/softmax/seed0", "listops-mini/softmax/seed3",
                                      "listops-mini/linformer/seed0", "listops-mini/linformer/seed3"]
    r = runs[1]
    assert r.workdir == str(tmp_path / "listops-mini" / "softmax" / "seed3")
    assert r.command == ["python", "-m", "lra_jax.train", "--config=configs/transformer.py:listops,mini",
                         f"--workdir={r.workdir}", "--config.seed=3", "--config.num_train_steps=10"]


def test_finished_skipped_interrupted_resumed_failures_reported(tmp_path):
    softmax, _, linformer, linformer3 = make_plan(tmp_path, seeds=("0", "1"))
    write_run(softmax.workdir, {})  # finished
    os.makedirs(os.path.join(linformer.workdir, "checkpoints"))  # interrupted
    runs = make_plan(tmp_path, seeds=("0", "1"))
    assert [r.state() for r in runs] == ["done", "new", "resume", "new"]
    runner = FakeRunner(fail=[os.path.join("linformer", "seed1")])
    summary = sweep_run.run_sweep(runs, runner, log=lambda line: None)
    assert [workdir_of(c) for c in runner.calls] == [r.workdir for r in runs[1:]]  # finished one skipped
    assert [s["status"] for s in summary] == ["skipped", "finished", "finished", "failed"]
    assert summary[2]["before"] == "resume"
    assert summary[3]["error"] == "exit status 1"
    table = sweep_report.summary_table(summary)
    assert "1 skipped, 2 finished, 1 failed; runs took" in table and "exit status 1" in table
    # a second sweep finds only the failed run left to do
    runner = FakeRunner()
    sweep_run.run_sweep(make_plan(tmp_path, seeds=("0", "1")), runner, log=lambda line: None)
    assert [workdir_of(c) for c in runner.calls] == [linformer3.workdir]


def finish(run, steps=None, **changed):
    """Writes what `train` leaves in a finished workdir: config.json (the run's config, with
    `changed` dotted keys set) and results.json (its step count)."""
    config = json.loads(sweep_plan.train_config(run.command).to_json())
    for dotted, value in changed.items():
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    write_run(run.workdir, config, num_train_steps=steps or config["num_train_steps"])


def test_a_finished_run_is_judged_against_the_config_its_command_trains_now(tmp_path):
    same, stale, longer = make_plan(tmp_path, seeds=("0", "1", "2"))[:3]
    finish(same)
    finish(stale, **{"optimizer.learning_rate": 0.123, "eval_every": 7})  # eval_every may change on resume
    finish(longer, steps=10)  # the config now asks for more steps: train goes on from the checkpoint
    runs = make_plan(tmp_path, seeds=("0", "1", "2"))[:3]
    stale_results = open(os.path.join(stale.workdir, "results.json")).read()
    assert [r.state() for r in runs] == ["done", "stale", "resume"]
    assert runs[1].changes() == ["optimizer.learning_rate"]
    runner = FakeRunner()
    summary = sweep_run.run_sweep(runs, runner, log=lambda line: None)
    assert [workdir_of(c) for c in runner.calls] == [longer.workdir]
    assert [s["status"] for s in summary] == ["skipped", "stale", "finished"]
    assert "optimizer.learning_rate differ" in summary[1]["error"] and f"delete {stale.workdir}" in summary[1]["error"]
    assert open(os.path.join(stale.workdir, "results.json")).read() == stale_results  # kept as it was
    assert "stale" in sweep_report.summary_table(summary)


class DivergingRunner(FakeRunner):
    """'Trains' like `train` does when the loss turns NaN: a results.json that says so, exit 3."""

    def __call__(self, command, cwd, slot=None):
        self.calls.append(command)
        write_diverged_run(workdir_of(command), {}, step=7)
        return 3


def test_a_diverged_run_is_reported_and_never_retried_or_emitted(tmp_path):
    runs = make_plan(tmp_path, variants="softmax")
    summary = sweep_run.run_sweep(runs, DivergingRunner(), log=lambda line: None)
    assert summary[0]["status"] == "diverged" and "diverged at step 7 (loss nan)" in summary[0]["error"]
    assert "1 diverged" in sweep_report.summary_table(summary)
    again = make_plan(tmp_path, variants="softmax")
    assert [r.state() for r in again] == ["diverged"]
    runner = FakeRunner()
    assert sweep_run.run_sweep(again, runner, log=lambda line: None)[0]["status"] == "diverged"
    assert runner.calls == []
    assert sweep_report.estimate_runs(again, capture=None, log=lambda line: None) == []


def test_exit_zero_without_results_is_a_failure(tmp_path):
    summary = sweep_run.run_sweep(make_plan(tmp_path, "softmax"), lambda command, cwd, slot: 0, log=lambda line: None)
    assert summary[0]["status"] == "failed" and "without results.json" in summary[0]["error"]


def test_a_run_trained_by_newer_code_is_stale_not_failed(tmp_path):
    """The code changed under a running sweep: the run's config.json has a key the sweep's plan lacks."""
    runs = make_plan(tmp_path, "softmax")

    def newer_train(command, cwd, slot=None):
        finish(runs[0], **{"optimizer.learning_rate": 0.123})
        return 0

    summary = sweep_run.run_sweep(runs, newer_train, log=lambda line: None)
    assert summary[0]["status"] == "stale"
    assert "optimizer.learning_rate differ" in summary[0]["error"] and "code changed" in summary[0]["error"]


def test_unknown_and_configless_variants_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown variant nonesuch; known: .*softmax"):
        make_plan(tmp_path, "softmax,nonesuch")
    with pytest.raises(ConfigError, match="no config file for variant performer"):
        make_plan(tmp_path, "performer")
    with pytest.raises(ConfigError, match="only --config"):
        make_plan(tmp_path, "softmax", overrides=["--workdir=x"])
    assert {r.variant for r in make_plan(tmp_path, "all")} == set(FILES)  # the others are skipped with a note


def test_config_files_map_variant_names_to_files():
    files = sweep_plan.config_files()
    assert files["softmax"] == os.path.join("configs", "transformer.py")
    assert files["linformer"] == os.path.join("configs", "linformer.py")


@pytest.mark.slow
def test_emit_prints_one_train_command_per_unfinished_run(tmp_path):
    write_run(tmp_path / "listops-mini" / "softmax" / "seed0", {})  # done
    stale = make_plan(tmp_path, "linformer", seeds=("1",))[0]
    finish(stale, **{"model.num_layers": 5})
    write_diverged_run(tmp_path / "listops-mini" / "softmax" / "seed2", {}, step=3)
    out = subprocess.run([sys.executable, "-m", "lra_jax.tools.sweep", "--variants=softmax,linformer",
                          "--tasks=listops", "--seeds=0,1,2", f"--root={tmp_path}", "--emit"],
                         cwd=sweep_plan.REPO, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("python -m lra_jax.train --config=configs/") for line in lines)
    assert f"--workdir={tmp_path}/listops-mini/softmax/seed1 --config.seed=1" in lines[0]
    assert f"--workdir={tmp_path}/listops-mini/linformer/seed0 --config.seed=0" in lines[1]
    assert f"--workdir={tmp_path}/listops-mini/linformer/seed2 --config.seed=2" in lines[2]
    assert "linformer/seed1 finished with another config (model.num_layers differ)" in out.stderr
    assert "softmax/seed2 diverged at step 3 (loss nan)" in out.stderr


@pytest.mark.slow
def test_emit_distributed_gives_the_multi_host_form(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lra_jax.tools.sweep", "--variants=softmax", "--tasks=listops",
                          f"--root={tmp_path}", "--emit", "--distributed"],
                         cwd=sweep_plan.REPO, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.strip().splitlines()
    assert line.startswith("python -m lra_jax.train --config=configs/") and line.endswith(" --distributed")


@pytest.mark.slow
def test_dry_run_prints_commands_to_paste_into_a_shell_and_the_totals(tmp_path):
    """Each planned run's state, name and its train command with the interpreter, quoted (a root with a
    space), then the total as the product of the axes, split into finished and to run."""
    root = tmp_path / "my runs"
    (done,) = [r for r in make_plan(root, grid=[f"{LR}=1e-3,5e-3"], seeds=("0", "1"))
               if r.name == f"listops-mini/softmax/{LR}=1e-3/seed0"]
    FakeRunner()(done.command, None)
    out = subprocess.run([sys.executable, "-m", "lra_jax.tools.sweep", "--variants=softmax,linformer",
                          "--tasks=listops", "--seeds=0,1", f"--grid={LR}=1e-3,5e-3", f"--root={root}", "--dry_run",
                          "--", "--config.num_train_steps=4"],
                         cwd=sweep_plan.REPO, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    state, name, command = lines[0].split(None, 2)
    assert (state, name) == ("done", done.name)
    assert shlex.split(command) == ["python", "-m", "lra_jax.train", "--config=configs/transformer.py:listops,mini",
                                    f"--workdir={done.workdir}", "--config.seed=0", f"--config.{LR}=1e-3",
                                    "--config.num_train_steps=4"]
    assert [line.split()[0] for line in lines[1:8]] == ["new"] * 7
    assert lines[8] == ("total: 8 runs (2 variants x 1 task x 1 scale x 2 grid points x 2 seeds): 1 done; "
                        "7 to run (0 to resume from their checkpoints, 7 new)")
    assert lines[9].startswith("(run the commands from ")


CHILD = """
import signal, sys, time
def stop(signum, frame):
    open(sys.argv[1], "w").write("checkpointed")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1] + ".started", "w").close()
time.sleep(60)
"""


def test_signal_is_forwarded_to_the_child_and_the_sweep_stops(tmp_path):
    first, second = make_plan(tmp_path)
    marker = str(tmp_path / "child")
    first.command = [sys.executable, "-c", CHILD, marker]

    def send_sigint_once_started():
        for _ in range(600):
            if os.path.exists(marker + ".started"):
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), __import__("signal").SIGINT)

    with sweep_run.Stop() as stop:
        threading.Thread(target=send_sigint_once_started, daemon=True).start()
        summary = sweep_run.run_sweep([first, second], sweep_run.subprocess_runner(stop), stop, log=lambda line: None)
    with open(marker) as f:
        assert f.read() == "checkpointed"  # the child got SIGTERM and saved
    assert [s["status"] for s in summary] == ["stopped", "not started"]


def test_estimate_times_each_unfinished_run_shape_once_and_totals_per_task(tmp_path):
    runs = make_plan(tmp_path, seeds=("0", "1"), grid=[f"{LR}=1e-3,5e-3"])
    FakeRunner()(runs[0].command, None)  # softmax first point seed 0 finished: not estimated
    calls = []

    def capture(command, cwd):
        calls.append(command)
        if "linformer" in workdir_of(command):
            return 2, "error: out of memory\n"
        return 0, "workdir noise\n" + json.dumps({"seconds_per_step": 0.5, "num_train_steps": 120,
                                                   "projected_train_seconds": 61.0}) + "\n"

    rows = sweep_report.estimate_runs(runs, capture, log=lambda line: None)
    # seeds and learning rates do not change the step: one `train --estimate` per variant
    assert [workdir_of(c) for c in calls] == [runs[1].workdir, runs[4].workdir]
    assert all(c[-2:] == ["--estimate", "--json"] for c in calls)  # the projection as one JSON line
    assert [r["status"] for r in rows] == ["ok"] * 3 + ["failed"] * 4
    assert rows[3]["error"] == "exit status 2: error: out of memory"
    table = sweep_report.estimate_table(rows, parallel=2)
    assert "listops-mini: 3 min" in table  # 3 x 61 s
    assert "total: 3 min of training (0.1 h)" in table and "4 runs failed" in table
    assert "with --parallel=2" in table


# ----------------------------------------------------------------------------- grids and the protocol

LR = "optimizer.learning_rate"


def write_result(run, val, test):
    """What `train` leaves in a finished workdir, with these accuracies."""
    write_run(run.workdir, run.config, test, val, task=run.task, variant=run.variant, scale=run.scale)


def test_grid_axes_make_a_product_of_points_each_in_its_directory(tmp_path):
    runs = make_plan(tmp_path, "softmax", seeds=("0", "1"), grid=[f"{LR}=1e-3,5e-3", "model.num_layers=1,2"])
    assert len(runs) == 8
    r = runs[3]  # second point, seed 1
    assert r.point == f"{LR}=1e-3,model.num_layers=2"
    assert r.workdir == str(tmp_path / "listops-mini" / "softmax" / r.point / "seed1")
    assert r.command[-3:] == ["--config.seed=1", f"--config.{LR}=1e-3", "--config.model.num_layers=2"]
    assert r.config["optimizer"]["learning_rate"] == 1e-3 and r.config["model"]["num_layers"] == 2
    assert [x.first_stage for x in runs] == [True, False] * 4


def test_grid_mistakes_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="expected KEY=V1,V2"):
        sweep_plan.parse_grid(["optimizer.learning_rate"])
    with pytest.raises(ConfigError, match="use --seeds"):
        sweep_plan.parse_grid(["seed=1,2"])
    with pytest.raises(ConfigError, match="both a --grid axis and an override"):
        sweep_plan.parse_grid([f"{LR}=1,2"], [f"--config.{LR}=3"])
    with pytest.raises(ConfigError, match="cannot be configured"):
        make_plan(tmp_path, "softmax", grid=["optimizer.no_such_key=1,2"])


def test_two_stage_trains_the_other_seeds_only_at_the_point_chosen_on_validation(tmp_path):
    runs = make_plan(tmp_path, "softmax", seeds=("0", "1", "2"), grid=[f"{LR}=1e-3,5e-3"])
    low0, low1, low2, high0, high1, high2 = runs
    now, waiting = sweep_plan.protocol_runs(runs, "two_stage")
    assert now == [low0, high0] and waiting == ["listops-mini/softmax"]
    write_result(low0, val=0.40, test=0.90)  # best test, worse validation: must not be chosen
    now, waiting = sweep_plan.protocol_runs(runs, "two_stage")
    assert now == [low0, high0] and waiting  # the first stage is not finished yet
    write_result(high0, val=0.60, test=0.30)
    now, waiting = sweep_plan.protocol_runs(runs, "two_stage")
    assert now == [low0, high0, high1, high2] and waiting == []
    assert sweep_plan.protocol_runs(runs, "grid") == (runs, [])
    write_result(high1, val=0.10, test=0.40)  # a poor later seed does not move the choice: compared on seed 0
    write_result(high2, val=0.10, test=0.50)
    table = sweep_report.selection_table(sweep_plan.protocol_runs(runs, "two_stage")[0])
    assert f"listops-mini/softmax: {LR}=5e-3  test 40.00 ± 10.00 (n=3)" in table
    assert f"val on seeds 0: {LR}=1e-3 40.0, {LR}=5e-3 60.0" in table


def test_an_estimate_before_the_choice_counts_the_second_stage_at_the_first_point(tmp_path):
    runs = make_plan(tmp_path, seeds=("0", "1", "2"), grid=[f"{LR}=1e-3,5e-3"])  # 2 variants
    now, waiting = sweep_plan.protocol_runs(runs, "two_stage")
    stand_ins = sweep_plan.second_stage_stand_ins(runs, waiting)
    assert len(now) == 4 and len(stand_ins) == 4  # 2 points at seed 0, 2 later seeds, per variant
    assert {(r.point, r.seed) for r in stand_ins} == {(f"{LR}=1e-3", 1), (f"{LR}=1e-3", 2)}


def test_two_stage_sweep_starts_a_second_stage_as_soon_as_its_first_is_done(tmp_path):
    runs = make_plan(tmp_path, "softmax", seeds=("0", "1"), grid=[f"{LR}=1e-3,5e-3"])
    accuracy = {f"{LR}=1e-3": 0.7, f"{LR}=5e-3": 0.5}
    trained = []

    def runner(command, cwd, slot=None):
        r = next(r for r in runs if r.workdir == workdir_of(command))
        trained.append(r.name)
        write_result(r, accuracy[r.point], accuracy[r.point])
        return 0

    summary = sweep_run.run_sweep(lambda: sweep_plan.protocol_runs(runs, "two_stage")[0], runner, log=lambda line: None)
    assert trained == [f"listops-mini/softmax/{LR}=1e-3/seed0", f"listops-mini/softmax/{LR}=5e-3/seed0",
                       f"listops-mini/softmax/{LR}=1e-3/seed1"]
    assert [s["status"] for s in summary] == ["finished"] * 3


# ----------------------------------------------------------------------------- parallel runs

PARALLEL_CHILD = """
import json, os, signal, sys, time
workdir = sys.argv[1]
os.makedirs(workdir, exist_ok=True)
resumed = os.path.isdir(os.path.join(workdir, "checkpoints"))
with open(os.path.join(workdir, "seen.json"), "w") as f:
    json.dump({"cpus": sorted(os.sched_getaffinity(0)), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
               "resumed": resumed}, f)
if os.environ.get("SWEEP_TEST_FINISH") or resumed:  # a finished run's records, as run_result reads them
    open(os.path.join(workdir, "config.json"), "w").write("{}")
    open(os.path.join(workdir, "metrics.jsonl"), "w").write('{"step": 1, "val/accuracy": 0.5}\\n'
                                                            '{"step": 2, "test/accuracy": 0.5}\\n')
    json.dump({"config": {}, "val_accuracy": 0.5, "test_accuracy": 0.5, "best_step": 1},
              open(os.path.join(workdir, "results.json"), "w"))
    sys.exit(0)
def stop(signum, frame):
    os.makedirs(os.path.join(workdir, "checkpoints"))  # what train does on SIGTERM
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(workdir + ".started", "w").close()
time.sleep(60)
"""


def test_parallel_sweep_pins_each_run_and_an_interrupt_checkpoints_all_then_resumes(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    slots = [device_slots.Slot(f"cpu {c}", {"CUDA_VISIBLE_DEVICES": str(i)}, frozenset([c]))
             for i, c in enumerate([cores[0], cores[-1]])]
    runs = make_plan(tmp_path, seeds=("0", "1"))  # four runs, two slots
    for r in runs:
        r.command = [sys.executable, "-c", PARALLEL_CHILD, r.workdir, f"--workdir={r.workdir}"]

    def interrupt_once_two_started():
        for _ in range(1200):
            if sum(os.path.exists(r.workdir + ".started") for r in runs) == 2:
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), __import__("signal").SIGINT)

    with sweep_run.Stop() as stop:
        threading.Thread(target=interrupt_once_two_started, daemon=True).start()
        summary = sweep_run.run_sweep(runs, sweep_run.subprocess_runner(stop, log_to_workdir=True), stop,
                                  log=lambda line: None, slots=slots, cwd=str(tmp_path))
    assert sorted(s["status"] for s in summary) == ["not started", "not started", "stopped", "stopped"]
    interrupted = [r for r, s in zip(runs, summary) if s["status"] == "stopped"]
    assert all(r.state() == "resume" for r in interrupted)  # each child checkpointed on the forwarded signal
    seen = [json.load(open(os.path.join(r.workdir, "seen.json"))) for r in interrupted]
    assert sorted((s["cpus"], s["visible"]) for s in seen) == sorted(
        ([c], str(i)) for i, c in enumerate([cores[0], cores[-1]]))  # one slot each, pinned
    assert all(os.path.exists(os.path.join(r.workdir, "train.log")) for r in interrupted)

    os.environ["SWEEP_TEST_FINISH"] = "1"
    try:
        with sweep_run.Stop() as stop:
            summary = sweep_run.run_sweep(runs, sweep_run.subprocess_runner(stop, log_to_workdir=True), stop,
                                      log=lambda line: None, slots=slots, cwd=str(tmp_path))
    finally:
        del os.environ["SWEEP_TEST_FINISH"]
    assert [s["status"] for s in summary] == ["finished"] * 4
    assert sorted(s["before"] for s in summary) == ["new", "new", "resume", "resume"]
    assert all(json.load(open(os.path.join(r.workdir, "seen.json")))["resumed"] for r in interrupted)


def test_device_slots_are_disjoint_and_too_many_is_a_clear_error(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    (only,) = device_slots.slots("cpu", parallel=1, per_run=len(cores))
    assert only.cpus == frozenset(cores) and only.env == {}
    with pytest.raises(ConfigError, match="lower --parallel"):
        device_slots.slots("cpu", parallel=len(cores) + 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    gpus = device_slots.slots("gpu", parallel=2, per_run=2)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in gpus] == ["3,5", "6,7"]
    monkeypatch.setattr(device_slots, "tpu_chips", lambda: ["0", "1", "2", "3"])
    tpus = device_slots.slots("tpu", parallel=4)
    assert [s.env["TPU_VISIBLE_CHIPS"] for s in tpus] == ["0", "1", "2", "3"]
    assert len({s.env["TPU_PROCESS_PORT"] for s in tpus}) == 4
    assert {s.env["TPU_CHIPS_PER_PROCESS_BOUNDS"] for s in tpus} == {"1,1,1"}
    with pytest.raises(ConfigError, match="not a sub-slice"):
        device_slots.slots("tpu", parallel=1, per_run=3)


def test_runs_per_device_shares_each_device_group_and_splits_a_gpus_memory(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    shared = device_slots.slots("cpu", parallel=2, per_run=1, runs_per_device=2)
    assert [s.cpus for s in shared] == [frozenset(cores[:1])] * 2
    assert [s.label for s in shared] == [f"cpu {cores[0]} (run 1 of 2)", f"cpu {cores[0]} (run 2 of 2)"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    gpus = device_slots.slots("gpu", parallel=6, per_run=1, runs_per_device=3)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in gpus] == ["3"] * 3 + ["5"] * 3
    shares = [float(s.env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) for s in gpus]
    assert shares == [pytest.approx(device_slots.GPU_MEMORY_SHARE / 3, abs=1e-3)] * 6
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in device_slots.slots("gpu", parallel=2)[0].env
    with pytest.raises(ConfigError, match="raise --runs_per_device"):
        device_slots.slots("gpu", parallel=5, runs_per_device=2)
    monkeypatch.setattr(device_slots, "tpu_chips", lambda: ["0", "1"])
    with pytest.raises(ConfigError, match="a TPU chip belongs to one process"):
        device_slots.slots("tpu", parallel=2, runs_per_device=2)
    with pytest.raises(ConfigError, match="at least 1"):
        device_slots.slots("cpu", parallel=1, runs_per_device=0)


def sweep_cli(tmp_path, *flags):
    return subprocess.run([sys.executable, "-m", "lra_jax.tools.sweep", "--variants=softmax", "--tasks=listops",
                           f"--root={tmp_path}", *flags], cwd=sweep_plan.REPO, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.slow
def test_a_misspelled_or_bad_override_refuses_the_sweep_before_a_finished_run_is_reported(tmp_path):
    finish(make_plan(tmp_path, "softmax")[0])  # a finished sweep, asked a new question
    for override, says in (("--config.optimizer.learning_rte=0.01", "did you mean --config.optimizer.learning_rate"),
                           ("--config.model.dropout_rate=1.5", "--config.model.dropout_rate=1.5 is out of range")):
        out = sweep_cli(tmp_path, "--", override)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        assert out.returncode == 2 and len(errors) == 1 and says in errors[0], out.stdout + out.stderr[-2000:]
        assert "listops-mini/softmax/seed0" in errors[0] and "skipped" not in out.stdout + out.stderr


@pytest.mark.slow
def test_parallel_zero_and_the_status_of_a_missing_root_are_refused_in_one_line(tmp_path):
    for flags, says in ((["--parallel=0"], "--parallel=0: give 1 or more"),
                        (["--status"], "does not exist: no run of this sweep was made or submitted there")):
        out = sweep_cli(tmp_path / "missing", *flags)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        assert out.returncode == 2 and len(errors) == 1 and says in errors[0], out.stderr[-2000:]


@pytest.mark.parametrize("flag, says", [
    ("--runs_per_device=0", "--runs_per_device=0: give 1 or more runs sharing each device"),
    ("--runs_per_device=-5", "--runs_per_device=-5: give 1 or more"),
    ("--devices_per_run=0", "--devices_per_run=0: give 1 or more devices per run"),
    ("--gpus_per_run=-1", "--gpus_per_run=-1: give 0 or more GPUs per Slurm run"),
    ("--cpus_per_run=0", "--cpus_per_run=0: give 1 or more CPU cores per Slurm run"),
    ("--max_running=-2", "--max_running=-2: give 0 or more Slurm array tasks at once"),
    ("--seeds=0,0", "--seeds=0,0 names seed 0 more than once"),
    ("--seeds=1,01,2,3,2", "names seeds 1, 2 more than once"),
])
def test_device_and_slurm_counts_out_of_range_and_repeated_seeds_are_refused_in_one_line(tmp_path, capsys, flag,
                                                                                        says):
    from lra_jax.tools import sweep

    with pytest.raises(SystemExit) as exit_:  # --dry_run: the old code printed the plan and exited 0
        sweep.main(["--variants=softmax", "--tasks=listops", f"--root={tmp_path}", "--dry_run", flag])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert exit_.value.code == 2 and len(errors) == 1 and says in errors[0], errors


def test_a_run_stopped_from_outside_the_sweep_is_interrupted_and_the_sweep_does_not_exit_zero(tmp_path):
    from lra_jax.errors import INTERRUPTED

    (run,) = make_plan(tmp_path, "softmax")
    row = sweep_run._train(run, "new", lambda command, cwd, slot: (INTERRUPTED, "stopped at step 3"), None, None, ".")
    assert row["status"] == "interrupted" and "run the sweep again to resume it" in row["error"]
    assert "interrupted" in sweep_run.UNFINISHED
