"""Bad values and bad workdirs, through the real command: a non-zero exit, at most three lines on
stderr, no traceback and no results.json that reads as a result. Values are refused before anything
compiles or generates data (`lra_jax.config.settings`), workdirs before anything is built
(`lra_jax.training.run_dir`)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import orbax.checkpoint as ocp
import pytest
from helpers import REPO, child_xla_flags, slow_except, tiny_config

from lra_jax.config.settings import from_config
from lra_jax.training import run_dir, trainer

# What is refused, and how it is said, is this package's Python, not the jax version's: CI checks it once.
pytestmark = pytest.mark.one_stack("newest")

MINI = "--config=configs/transformer.py:listops,mini"
NOBODY = 65534


def train(*flags, workdir, cache, user: int | None = None):
    env = dict(os.environ, LRA_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags())
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    return subprocess.run([*prefix, sys.executable, "-m", "lra_jax.train", *flags, f"--workdir={workdir}"],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def refused(done, workdir, expected: str) -> str:
    """Asserts the run was refused in one clear way; returns its error line."""
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 3, done.stderr[-3000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], done.stderr
    results = os.path.join(str(workdir), "results.json")
    if os.path.isfile(results):
        with open(results, encoding="utf-8") as f:
            assert json.load(f).get("status") != "complete"
    return errors[0]


# Each case starts `python -m lra_jax.train`: the fast tier keeps one.
@pytest.mark.parametrize("flag,expected", slow_except([
    ("--config.optimizer.learning_rate=-0.01", "--config.optimizer.learning_rate=-0.01 is out of range: it must be > 0"),
    ("--config.num_train_steps=0", "--config.num_train_steps=0 is out of range: it must be an integer >= 1"),
    ("--config.eval_every=0", "--config.eval_every=0 is out of range: it must be an integer >= 1"),
    ("--config.batch_size=0", "--config.batch_size=0 is out of range: it must be an integer >= 1"),
    ("--config.grad_accum_steps=3", "--config.batch_size=32 is not a multiple of the 1 devices times grad_accum_steps 3"),
    ("--config.model.dropout_rate=1.0", "--config.model.dropout_rate=1.0 is out of range: it must be in [0, 1)"),
    ("--config.optimizer.schedule=linear", "--config.optimizer.schedule='linear' is out of range: it must be one of"),
], keep={"--config.num_train_steps=0"}))
def test_a_bad_value_is_one_line_before_anything_is_built(flag, expected, tmp_path):
    done = train(MINI, flag, workdir=tmp_path / "run", cache=tmp_path / "cache")
    refused(done, tmp_path / "run", expected)
    assert not os.path.exists(tmp_path / "run") and not os.path.exists(tmp_path / "cache" / "listops")


@pytest.mark.slow
def test_a_workdir_that_is_a_file_or_under_one_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    refused(train(MINI, workdir=tmp_path / "file", cache=tmp_path / "cache"), tmp_path / "file",
            f"--workdir {tmp_path / 'file'} is a file, not a directory")
    refused(train(MINI, workdir=tmp_path / "file" / "run", cache=tmp_path / "cache"), tmp_path / "nothing",
            f"{tmp_path / 'file'} is a file, not a directory")


@pytest.mark.slow
def test_a_workdir_with_other_files_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "thesis.tex").write_text("x")
    refused(train(MINI, workdir=tmp_path / "run", cache=tmp_path / "cache"), tmp_path / "run",
            "holds files that are not a run's (thesis.tex)")


@pytest.fixture
def shared_dir():
    """A directory under /tmp that user nobody can enter but not write (owned by root, mode 755):
    a non-root user's view of someone else's directory. Skipped where the test cannot switch user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to user nobody needs root and setpriv")
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                            "-c", "import lra_jax.train"], check=False, cwd=REPO, capture_output=True, text=True)
    if probe.returncode != 0:  # e.g. a Python whose shared library lies under /root, which nobody cannot enter
        pytest.skip(f"user nobody cannot run {sys.executable}: {probe.stderr.strip()[-200:]}")
    path = tempfile.mkdtemp(prefix="lra-unwritable-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("kind", ["new", "empty", "run"])
@pytest.mark.slow
def test_an_unwritable_workdir_is_one_line_that_deletes_nothing(kind, shared_dir):
    """Run as user nobody: root passes every permission check, so chmod alone proves nothing as root."""
    workdir = os.path.join(shared_dir, "run")
    if kind != "new":
        os.makedirs(os.path.join(workdir, "checkpoints", "last"))
        os.chmod(workdir, 0o755)
    if kind == "run":  # what a run leaves (its checkpoints' content does not matter: nothing is read)
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            f.write("{}")
    cache = os.path.join(shared_dir, "cache")
    line = refused(train(MINI, workdir=workdir, cache=cache, user=NOBODY), workdir,
                   "cannot be created" if kind == "new" else "is not writable")
    assert workdir in line and "delete" not in line and "permission" in line.lower()
    assert (kind == "new") != os.path.isdir(os.path.join(workdir, "checkpoints"))


@pytest.mark.slow
def test_write_permission_lost_mid_run_is_one_line_and_keeps_the_checkpoints(tmp_path, data_cache, monkeypatch):
    """Orbax's second save fails as a refused write does (its status PERMISSION_DENIED). Simulated:
    as root no real permission is refused, and a filesystem with files open for writing cannot be
    remounted read-only. The run stops with one line naming the fix, the checkpoint saved before it kept."""
    save, calls = ocp.CheckpointManager.save, []

    def save_then_refuse(manager, step, *args, **kwargs):
        calls.append(step)
        if len(calls) > 1:
            raise RuntimeError(f"PERMISSION_DENIED: Error opening file {manager.directory}/{step}: Permission denied")
        return save(manager, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save_then_refuse)
    workdir = str(tmp_path / "run")
    with pytest.raises(run_dir.WorkdirError) as stopped:
        trainer.train_and_evaluate(from_config(tiny_config(data_cache)), workdir)
    message = str(stopped.value)
    assert "\n" not in message and workdir in message and "delete" not in message
    assert "permission denied" in message and "run the same command to resume" in message
    assert calls == [6, 6] and os.listdir(os.path.join(workdir, "checkpoints", "best")) == ["6"]  # best, then last
    assert not os.path.exists(os.path.join(workdir, "results.json"))


@pytest.mark.slow
def test_missing_listops_data_names_the_key_that_works(tmp_path):
    line = refused(train(MINI, "--config.data.data_dir=/nonexistent/listops", workdir=tmp_path / "run",
                         cache=tmp_path / "cache"), tmp_path / "run", "missing ListOps files")
    assert "--config.data.data_dir=<...>/lra_release/listops-1000" in line


@pytest.mark.slow
def test_a_damaged_listops_line_is_named_by_its_file_and_line(tmp_path):
    data = tmp_path / "listops"
    data.mkdir()
    good = "Source\tTarget\n" + "( ( ( [MAX 2 ) 9 ) ] )\t9\n" * 40
    for split in ("train", "val", "test"):
        (data / f"basic_{split}.tsv").write_text(good)
    lines = good.encode().splitlines(keepends=True)
    lines[19] = bytes(range(128, 256)) * 2 + bytes(range(44)) + b"\n"  # 300 bytes, not UTF-8
    (data / "basic_train.tsv").write_bytes(b"".join(lines))
    refused(train(MINI, f"--config.data.data_dir={data}", "--config.batch_size=4", workdir=tmp_path / "run",
                  cache=tmp_path / "cache"), tmp_path / "run", f"{data / 'basic_train.tsv'}:20: not UTF-8 text")
