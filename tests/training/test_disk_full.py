"""A full disk is a clear stop: one line with the path, the space needed and the space free; no
partial checkpoint left behind; the earlier checkpoints intact; the same command resumes exactly
once there is room. The disk is a small tmpfs mounted by the test (root only; skipped otherwise)."""

import json
import os
import subprocess

import pytest
from helpers import tiny_config

from lra_jax.config.settings import from_config
from lra_jax.errors import DiskFull
from lra_jax.training import checkpointing, trainer


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) mounts a tmpfs of `size` (e.g. '600k') at tmp_path/disk and returns its path;
    remount(size) resizes it, as freeing space would. Unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = []

    def mount(size: str) -> str:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            pytest.skip(f"cannot mount a small tmpfs to fill ({done.stderr.strip() or done.returncode}); "
                        "the full-disk tests need root")
        mounted.append(disk)
        return str(disk)

    def remount(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)

    yield mount, remount
    if mounted:
        if subprocess.run(["umount", str(disk)], check=False).returncode:
            subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, data_cache):
    config = tiny_config(data_cache)
    workdir = str(tmp_path_factory.mktemp("undisturbed") / "run")
    trainer.train_and_evaluate(from_config(config), workdir)
    return config, workdir


def lines(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def debris(workdir: str) -> list[str]:
    return [os.path.join(root, d) for root, dirs, _ in os.walk(workdir) for d in dirs
            if d.endswith(checkpointing.TMP_SUFFIX)]


def stops_for_lack_of_space(config, workdir: str, capfd) -> str:
    """Runs until DiskFull; its message, checked to be one line with the path and both sizes."""
    with pytest.raises(DiskFull) as caught:
        trainer.train_and_evaluate(from_config(config), workdir)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("disk full: saving step ")
    assert os.path.join(workdir, "checkpoints") in message and " free;" in message and "needs about" in message
    err = capfd.readouterr().err
    for noise in ("Traceback", "Event loop is closed", "RESOURCE_EXHAUSTED", "Exception ignored"):
        assert noise not in err, err[-3000:]
    assert debris(workdir) == []
    return message


def fill_the_disk_after_the_first_save(monkeypatch, disk: str, remount) -> None:
    """After the first `last` checkpoint the disk is shrunk to leave 64 KiB free: far less than any
    checkpoint of the tiny model (164-228 KiB here; Orbax's data files vary from run to run, so a fixed
    disk size let a whole run fit now and then), far more than the log lines before the next save."""
    save = checkpointing.Checkpoints.save_last

    def save_then_fill_the_disk(*args):
        save(*args)
        used = os.statvfs(disk).f_blocks - os.statvfs(disk).f_bfree
        remount(f"{(used * os.statvfs(disk).f_frsize + (64 << 10)) >> 10}k")

    monkeypatch.setattr(checkpointing.Checkpoints, "save_last", save_then_fill_the_disk)


@pytest.mark.slow
def test_a_save_that_would_not_fit_stops_before_writing_and_the_run_resumes_exactly(
        undisturbed, small_disk, capfd, monkeypatch):
    config, expected = undisturbed
    mount, remount = small_disk
    disk = mount("16m")
    workdir = os.path.join(disk, "run")
    fill_the_disk_after_the_first_save(monkeypatch, disk, remount)
    stops_for_lack_of_space(config, workdir, capfd)
    monkeypatch.undo()

    saved = sorted(os.listdir(os.path.join(workdir, "checkpoints", "last")))
    assert saved and all(step.isdigit() for step in saved)
    remount("16m")  # space freed
    results = trainer.train_and_evaluate(from_config(config), workdir)
    assert lines(workdir) == lines(expected)
    with open(os.path.join(expected, "results.json")) as f:
        assert results["test_accuracy"] == json.load(f)["test_accuracy"]


@pytest.mark.slow
def test_a_save_that_fails_for_lack_of_space_leaves_no_debris_and_the_run_resumes_exactly(
        undisturbed, small_disk, capfd, monkeypatch):
    config, expected = undisturbed
    mount, remount = small_disk
    disk = mount("16m")
    workdir = os.path.join(disk, "run")
    fill_the_disk_after_the_first_save(monkeypatch, disk, remount)
    monkeypatch.setattr(checkpointing, "free_bytes", lambda path: 1 << 40)  # the check is fooled: Orbax's write fails

    stops_for_lack_of_space(config, workdir, capfd)

    for kind in ("last", "best"):  # only whole checkpoints: each has Orbax's commit marker
        for step in os.listdir(os.path.join(workdir, "checkpoints", kind)):
            assert os.path.exists(os.path.join(workdir, "checkpoints", kind, step, "commit_success.txt"))
    monkeypatch.undo()
    remount("16m")
    trainer.train_and_evaluate(from_config(config), workdir)
    assert lines(workdir) == lines(expected)


def test_a_writer_thread_still_running_when_the_save_fails_leaves_no_debris(tmp_path, monkeypatch):
    """Orbax writes a checkpoint's parts in threads and raises at the first failure while the others
    still write (seen under load: a `_sharding` lock file written after the cleanup). Here a late
    writer creates its file 0.3 s after the save raised; the cleanup waits for it."""
    import errno
    import threading
    import time

    import jax.numpy as jnp

    checkpoints = checkpointing.Checkpoints(tmp_path / "checkpoints")
    where = os.path.join(checkpoints.directory, "best")
    writers = []

    def failing_save(step, args):
        def late_writer():
            time.sleep(0.3)
            part = os.path.join(where, f"{step}{checkpointing.TMP_SUFFIX}", f"state{checkpointing.TMP_SUFFIX}")
            os.makedirs(part, exist_ok=True)
            open(os.path.join(part, "_sharding.__lock"), "w").close()

        os.makedirs(os.path.join(where, f"{step}{checkpointing.TMP_SUFFIX}"))
        writers.append(threading.Thread(target=late_writer))
        writers[0].start()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.best, "save", failing_save)
    with pytest.raises(DiskFull, match="disk full: saving step 12"):
        checkpoints.save_best(12, {"w": jnp.ones(3)}, {"accuracy": 0.5})
    writers[0].join()  # what it left is there now
    assert debris(str(tmp_path)) == []
    assert os.listdir(where) == []


@pytest.mark.slow
def test_a_writer_thread_that_reraises_its_failure_from_join_is_waited_for_quietly(tmp_path, monkeypatch):
    """Orbax's writer threads re-raise their own error from `join` (seen under load on the newest
    stack: the RESOURCE_EXHAUSTED of a best checkpoint's write escaped through the cleanup's wait
    instead of the disk-full message). Waiting for such a thread must end the wait, not the run."""
    import errno
    import threading

    import jax.numpy as jnp

    waiting = threading.Event()
    wait_for_stragglers = checkpointing._await_stragglers
    monkeypatch.setattr(checkpointing, "_await_stragglers", lambda running: (
        waiting.set(), wait_for_stragglers(running)))

    class ReraisingWriter(threading.Thread):  # as orbax's _SignalingThread.join does
        def run(self):  # still writing when the cleanup starts waiting
            waiting.wait(10)
            self.error = OSError(errno.ENOSPC, "No space left on device")

        def join(self, timeout=None):
            super().join(timeout)
            raise ValueError(f"RESOURCE_EXHAUSTED: {self.error}")

    checkpoints = checkpointing.Checkpoints(tmp_path / "checkpoints")
    writers = []

    def failing_save(step, args):
        writers.append(ReraisingWriter())
        writers[0].start()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.best, "save", failing_save)
    with pytest.raises(DiskFull, match="disk full: saving step 12"):
        checkpoints.save_best(12, {"w": jnp.ones(3)}, {"accuracy": 0.5})
    assert not writers[0].is_alive()


def test_a_writer_thread_listed_before_it_runs_is_waited_for(monkeypatch):
    """With several devices Orbax starts more writer threads at once, and `threading.enumerate()`
    lists one an instant before it runs, when `join` raises (seen with two host devices: "cannot join
    thread before it is started" instead of the disk-full message). The cleanup waits for it to start
    and end."""
    import threading
    import time

    done = []
    writer = threading.Thread(target=lambda: (time.sleep(0.2), done.append(True)))
    listed = threading.enumerate
    threading.Timer(0.2, writer.start).start()
    running = set(listed())
    monkeypatch.setattr(checkpointing.threading, "enumerate", lambda: listed() + [writer])
    checkpointing._await_stragglers(running)
    assert done == [True]


def test_a_log_line_that_meets_a_full_disk_names_its_file(tmp_path, monkeypatch):
    """A write or flush of an open file raises an OSError without a filename; the writer adds it, so the
    run's one-line DiskFull names metrics.jsonl rather than the whole workdir."""
    import errno

    from lra_jax.training.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path)

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "jsonl", type("Full", (), {"name": writer.jsonl.name, "write": full, "flush": full})())
    with pytest.raises(OSError) as caught:
        writer.write(3, {"train/loss": 0.5})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "metrics.jsonl")
    assert checkpointing.out_of_space(caught.value)
    writer.tensorboard.close()  # left open, its writer thread outlives the test


def test_closing_the_metrics_writer_on_a_full_disk_still_closes_tensorboard(tmp_path):
    """The log's close flushes, so on a full disk it raises; TensorBoard's writer (a thread of its own)
    is closed all the same, not left to an exit hook that fails at interpreter shutdown."""
    import errno

    from lra_jax.training.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path)
    writer.jsonl.close()

    def full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    writer.jsonl = type("Full", (), {"name": writer.jsonl.name, "close": staticmethod(full)})()
    with pytest.raises(OSError):
        writer.close()
    assert writer.tensorboard.all_writers is None  # closed
