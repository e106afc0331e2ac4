"""prepare: argument handling and the "already prepared" logic (nothing is downloaded)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO

from lra_jax.data import prepare, retrieval
from lra_jax.errors import DataError


def make_release(root, tasks=("retrieval", "pathfinder", "pathx")):
    for task in tasks:
        folder = prepare.release_folder(task, str(root))
        os.makedirs(folder, exist_ok=True)
        if task == "retrieval":
            for name in retrieval.FILES.values():
                open(os.path.join(folder, name), "w").close()
        else:
            os.makedirs(os.path.join(folder, "metadata"))
            open(os.path.join(folder, "metadata", "0.npy"), "w").close()


@pytest.fixture
def no_download(monkeypatch):
    monkeypatch.setattr(prepare, "download_release", lambda data_dir: pytest.fail("tried to download"))


def test_already_prepared_release_is_not_downloaded(tmp_path, no_download):
    make_release(tmp_path)
    for task in ("retrieval", "pathfinder", "pathx"):
        (line,) = prepare.prepare(task, str(tmp_path))
        assert "already" in line
        assert f"--config.data.data_dir={prepare.release_folder(task, str(tmp_path))}" in line
    assert prepare.release_folder("pathx", "d") == "d/lra_release/pathfinder128/curv_contour_length_14"


def test_missing_release_is_downloaded_once_then_checked(tmp_path, monkeypatch):
    calls = []

    def fake_download(data_dir):
        calls.append(data_dir)
        make_release(data_dir, tasks=("retrieval",))

    monkeypatch.setattr(prepare, "download_release", fake_download)
    (line,) = prepare.prepare("retrieval", str(tmp_path))
    assert calls == [str(tmp_path)] and "ready in" in line
    with pytest.raises(DataError, match="pathfinder32/curv_contour_length_14 is still missing"):
        prepare.prepare("pathfinder", str(tmp_path))


class FakeBuilder:
    def __init__(self, prepared, error=None):
        self.prepared, self.error, self.data_dir = prepared, error, "/fake/tfds/cifar10/3.0.2"

    def is_prepared(self):
        return self.prepared

    def download_and_prepare(self):
        raise self.error


def test_tfds_already_prepared_and_tensorflow_hint(monkeypatch, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(tfds, "builder", lambda name, **kw: FakeBuilder(True))
    (line,) = prepare.prepare("image", str(tmp_path))
    assert "already prepared" in line and f"--config.data.data_dir={tmp_path}" in line
    missing_tf = ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
    monkeypatch.setattr(tfds, "builder", lambda name, **kw: FakeBuilder(False, missing_tf))
    with pytest.raises(DataError, match="pip install tensorflow-cpu"):
        prepare.prepare("image", "")


def test_all_goes_on_past_a_failure(monkeypatch, tmp_path, no_download):
    tfds = pytest.importorskip("tensorflow_datasets")
    make_release(tmp_path)
    missing_tf = ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
    monkeypatch.setattr(tfds, "builder", lambda name, **kw: FakeBuilder(name == "imdb_reviews", missing_tf))
    with pytest.raises(DataError) as error:
        prepare.prepare("all", str(tmp_path))
    message = str(error.value)
    assert "image:" in message and "text: imdb_reviews already prepared" in message
    assert "pathx: already in" in message


def test_command_line(tmp_path):
    make_release(tmp_path, tasks=("retrieval",))
    run = [sys.executable, "-m", "lra_jax.data.prepare"]
    ok = subprocess.run([*run, "--task=retrieval", f"--data_dir={tmp_path}"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert f"--config.data.data_dir={tmp_path}/lra_release/tsv_data" in ok.stdout
    bad = subprocess.run([*run, "--task=nope"], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "text|image|retrieval|pathfinder|pathx|all" in bad.stderr
    stray = subprocess.run([*run, "--task=retrieval", "pathfinder"], capture_output=True, text=True, check=False)
    assert stray.returncode != 0 and "unexpected argument 'pathfinder'" in stray.stderr  # never ignored


def test_the_python_floor_has_the_tar_extraction_filter_lra_prepare_uses():
    """`lra-prepare` unpacks the 7 GB release with tarfile's `filter="data"` (Python 3.11.4 and later): the
    floor pyproject admits must have it, or the unpacking fails after the download."""
    import inspect
    import re
    import tomllib

    from lra_jax.data import prepare

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        floor = tomllib.load(f)["project"]["requires-python"]
    assert 'filter="data"' in inspect.getsource(prepare.download_release)
    version = tuple(int(x) for x in re.fullmatch(r">=\s*([\d.]+)", floor.strip()).group(1).split("."))
    assert version >= (3, 11, 4), floor
