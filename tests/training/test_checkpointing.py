"""Damaged checkpoints: the run reports each in one line, moves it aside and resumes exactly from
the newest one that restores; when none does, it stops with one line saying what to do."""

import glob
import json
import os
import shutil

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from helpers import tiny_config

from lra_jax.config.settings import from_config
from lra_jax.errors import CheckpointError
from lra_jax.training import checkpointing, trainer
from lra_jax.training.train_state import TrainState


def truncate_data_files(step_dir: str) -> None:
    """Cuts every OCDBT data file of the checkpoint's state to half its size, as a bad copy or a
    dying disk leaves them: the B-tree nodes under state/d/, which every restore reads first and
    which hold the values of at most 1024 bytes inline, and the larger values under
    state/ocdbt.process_<i>/d/. Cutting the latter alone can miss everything a restore reads: with
    two devices each replicated array is saved in two halves, nearly all small enough to be inline,
    and the few others lie in the first half of a file whose rest its process's own B-tree fills."""
    files = glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
    nodes = os.path.join(step_dir, "state", "d")
    assert any(os.path.dirname(path) == nodes for path in files), f"no B-tree node under {nodes}: {files}"
    for path in files:
        os.truncate(path, os.path.getsize(path) // 2)


def lines(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_cache):
    """A config saving at steps 4, 8 and 12 (the last two kept) and its undisturbed run."""
    config = tiny_config(data_cache)
    config.checkpoint_every = 4  # step 8, the fallback, is in the middle of a log window (every 3)
    workdir = str(tmp_path_factory.mktemp("undisturbed") / "run")
    trainer.train_and_evaluate(from_config(config), workdir)
    return config, workdir


@pytest.mark.slow
def test_the_last_two_checkpoints_are_kept(finished):
    _, workdir = finished
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints", "last"))) == ["12", "8"]


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_run_resumes_exactly(finished, tmp_path, capfd):
    config, undisturbed = finished
    workdir = str(tmp_path / "run")
    shutil.copytree(undisturbed, workdir)
    os.remove(os.path.join(workdir, "results.json"))  # as if killed once its last checkpoint was written
    last = os.path.join(workdir, "checkpoints", "last")
    truncate_data_files(os.path.join(last, "12"))
    capfd.readouterr()

    resumed = trainer.train_and_evaluate(from_config(config), workdir)

    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "does not restore" in line]
    assert len(warnings) == 1 and "step 12" in warnings[0] and last in warnings[0], err
    assert "resuming from step 8" in warnings[0]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    damaged = os.path.join(workdir, "checkpoints", "damaged", "last-12")
    assert os.path.isdir(damaged) and "moved to " + damaged in warnings[0]  # kept, not deleted
    assert lines(workdir) == lines(undisturbed)  # same cores, same compiled steps: the same numbers
    with open(os.path.join(undisturbed, "results.json")) as f:
        expected = json.load(f)
    for key in ("test_accuracy", "test_loss", "val_accuracy", "best_step"):
        assert resumed[key] == expected[key], key


@pytest.mark.slow
def test_when_no_checkpoint_restores_the_run_stops_with_one_line_and_moves_nothing(finished, tmp_path, capfd):
    config, undisturbed = finished
    workdir = str(tmp_path / "run")
    shutil.copytree(undisturbed, workdir)
    os.remove(os.path.join(workdir, "results.json"))
    last = os.path.join(workdir, "checkpoints", "last")
    for step in ("8", "12"):
        truncate_data_files(os.path.join(last, step))
    capfd.readouterr()

    with pytest.raises(CheckpointError) as caught:
        trainer.train_and_evaluate(from_config(config), workdir)

    message = str(caught.value)
    assert "\n" not in message and "step 12" in message and "step 8" in message
    assert "new --workdir" in message and f"delete {os.path.join(workdir, 'checkpoints')}" in message
    assert sorted(os.listdir(last)) == ["12", "8"]
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.slow
def test_a_damaged_results_json_is_reported_and_the_run_ends_again(finished, tmp_path, capfd):
    config, undisturbed = finished
    workdir = str(tmp_path / "run")
    shutil.copytree(undisturbed, workdir)
    path = os.path.join(workdir, "results.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[: len(text) // 2])
    capfd.readouterr()

    results = trainer.train_and_evaluate(from_config(config), workdir)

    assert [line for line in capfd.readouterr().err.splitlines() if "damaged" in line][0].startswith(
        f"warning: {path} is damaged")
    with open(os.path.join(undisturbed, "results.json")) as f:
        assert results["test_accuracy"] == json.load(f)["test_accuracy"]
    assert lines(workdir) == lines(undisturbed)  # the test line is written once, not twice


@pytest.mark.slow
def test_a_truncated_metrics_file_keeps_its_whole_lines_and_the_original(finished, tmp_path, capfd):
    config, undisturbed = finished
    workdir = str(tmp_path / "run")
    shutil.copytree(undisturbed, workdir)
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path) as f:
        text = f.read()
    cut = text.rindex("\n", 0, len(text) - 1) + 5  # a few characters into the last (test) line
    with open(path, "w") as f:
        f.write(text[:cut])
    capfd.readouterr()

    trainer.train_and_evaluate(from_config(config), workdir)

    err = capfd.readouterr().err
    assert f"warning: {path} line {text[:cut].count(chr(10)) + 1} is damaged" in err
    with open(f"{path}.damaged") as f:
        assert f.read() == text[:cut]
    assert lines(workdir) == lines(undisturbed)


@pytest.mark.slow
def test_a_damaged_best_checkpoint_stops_the_run_with_one_line(finished, tmp_path, capfd):
    config, undisturbed = finished
    workdir = str(tmp_path / "run")
    shutil.copytree(undisturbed, workdir)
    os.remove(os.path.join(workdir, "results.json"))
    best = os.path.join(workdir, "checkpoints", "best")
    (step,) = os.listdir(best)
    for path in glob.glob(os.path.join(best, step, "metrics", "*")):
        os.truncate(path, os.path.getsize(path) // 2)
    capfd.readouterr()

    with pytest.raises(CheckpointError) as caught:
        trainer.train_and_evaluate(from_config(config), workdir)

    message = str(caught.value)
    assert "\n" not in message and f"best checkpoint, step {step} in {os.path.join(best, step)}" in message
    assert "new --workdir" in message and os.listdir(best) == [step]
    assert "Traceback" not in capfd.readouterr().err


def test_opening_removes_interrupted_saves_before_it_returns_and_leaves_no_thread(tmp_path):
    """A save killed mid-write leaves `<step>.orbax-checkpoint-tmp`; opening the checkpoints deletes it
    at once. Orbax's own clean-up ran in a thread, and a process that then stopped on bad input (missing
    data) exited under it: 'cannot schedule new futures after interpreter shutdown' and a traceback."""
    import threading

    from lra_jax.training import checkpointing

    interrupted = tmp_path / "checkpoints" / "last" / f"12{checkpointing.TMP_SUFFIX}"
    for i in range(200):  # enough files that a clean-up in the background is still busy on return
        (interrupted / f"part{i}").mkdir(parents=True)
        (interrupted / f"part{i}" / "data").write_bytes(b"x" * 1024)
    before = set(threading.enumerate())

    checkpoints = checkpointing.Checkpoints(tmp_path / "checkpoints")

    assert not interrupted.exists()
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []
    assert checkpoints.last_step() is None
    checkpoints.close()


def test_a_train_state_is_saved_in_the_dict_layout_and_restored_typed(tmp_path):
    """A TrainState goes to disk as the dict every earlier checkpoint holds ({"step", "params", "rest",
    "opt_state"}), so a checkpoint written before the type existed restores as a TrainState."""
    tree = {"step": jnp.array(5, jnp.int32), "params": {"w": jnp.arange(3.0)}, "rest": {"n": jnp.ones(2)},
            "opt_state": {"mu": jnp.full(3, 0.5)}}
    checkpoints = checkpointing.Checkpoints(tmp_path / "checkpoints")
    checkpoints.save_last(5, tree)  # as the trainer wrote it before TrainState
    like = TrainState.from_tree(jax.tree.map(jnp.zeros_like, tree))
    restored = checkpoints.restore_last(like)
    assert isinstance(restored, TrainState) and int(restored.step) == 5
    assert restored.params["w"].tolist() == [0.0, 1.0, 2.0] and restored.opt_state["mu"].tolist() == [0.5] * 3
    checkpoints.save_best(6, restored.replace(step=jnp.array(6, jnp.int32)), {"accuracy": 0.5})
    best = checkpoints.restore_best(like)
    assert isinstance(best, TrainState) and int(best.step) == 6 and best.rest["n"].tolist() == [1.0, 1.0]
    checkpoints.close()
    on_disk = ocp.StandardCheckpointer().metadata(tmp_path / "checkpoints" / "best" / "6" / "state")
    assert set(getattr(on_disk, "item_metadata", on_disk)) == {"step", "params", "rest", "opt_state"}
