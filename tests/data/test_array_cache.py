"""array_cache: build once then memory-map, keys, aliases, atomic writes, races, leftovers, failures."""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import splits_equal
from lra_jax.data import array_cache
from lra_jax.errors import DataError

KEY = {"v": 1, "files": [], "max_len": 4}


def make_splits(offset: int = 0) -> dict:
    test = (np.arange(8, dtype=np.int16).reshape(2, 4) + offset, np.array([0, 1], np.int32))
    return {"train": (np.ones((3, 4), np.int16) + offset, np.array([1, 0, 1], np.int32)), "val": test, "test": test}


def fail():
    pytest.fail("built again instead of reading the cache")


def test_builds_once_then_memory_maps_and_keeps_aliases(tmp_path):
    fresh = make_splits()
    first = array_cache.cached_splits(str(tmp_path), "task", KEY, lambda: fresh)
    again = array_cache.cached_splits(str(tmp_path), "task", KEY, fail)
    assert splits_equal(first, fresh) and splits_equal(again, fresh)
    tokens = again["train"][0]
    assert isinstance(tokens, np.memmap) and not tokens.flags.writeable and tokens.dtype == np.int16
    assert again["val"][0] is again["test"][0]  # stored once
    (folder,) = os.listdir(tmp_path / "task")
    assert folder.startswith("arrays-") and "test_tokens.npy" not in os.listdir(tmp_path / "task" / folder)


def test_another_key_gets_another_folder(tmp_path):
    array_cache.cached_splits(str(tmp_path), "task", KEY, make_splits)
    other = array_cache.cached_splits(str(tmp_path), "task", {**KEY, "max_len": 5}, lambda: make_splits(10))
    assert splits_equal(other, make_splits(10)) and len(os.listdir(tmp_path / "task")) == 2


@pytest.mark.parametrize("cache_dir,key", [("", KEY), (None, KEY), ("DIR", None)])
def test_no_cache_dir_or_no_key_builds_every_time(tmp_path, cache_dir, key):
    cache_dir = str(tmp_path) if cache_dir == "DIR" else cache_dir
    calls = []
    for _ in range(2):
        array_cache.cached_splits(cache_dir, "task", key, lambda: calls.append(1) or make_splits())
    assert len(calls) == 2 and os.listdir(tmp_path) == []


def test_leftover_temporary_folder_is_ignored(tmp_path):
    folder = array_cache.folder_for(str(tmp_path), "task", KEY)
    leftover = os.path.join(os.path.dirname(folder), f".tmp-{os.path.basename(folder)}-123-deadbeef")
    os.makedirs(leftover)
    with open(os.path.join(leftover, "train_tokens.npy"), "wb") as f:
        f.write(b"\x93NUMPY half written")
    splits = array_cache.cached_splits(str(tmp_path), "task", KEY, make_splits)
    assert splits_equal(splits, make_splits()) and os.path.isfile(os.path.join(folder, "info.json"))


def test_racing_writer_keeps_the_first_folder(tmp_path):
    def build_while_another_finishes():
        array_cache.cached_splits(str(tmp_path), "task", KEY, make_splits)  # the other process wins the rename
        return make_splits()

    splits = array_cache.cached_splits(str(tmp_path), "task", KEY, build_while_another_finishes)
    assert splits_equal(splits, make_splits())
    assert [n for n in os.listdir(tmp_path / "task") if n.startswith(".tmp")] == []


def test_unwritable_cache_still_returns_the_arrays(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    splits = array_cache.cached_splits(str(blocker), "task", KEY, make_splits)
    assert splits_equal(splits, make_splits())


def test_failed_build_leaves_nothing(tmp_path):
    def broken():
        raise DataError("bad line")

    with pytest.raises(DataError, match="bad line"):
        array_cache.cached_splits(str(tmp_path), "task", KEY, broken)
    assert not os.path.exists(tmp_path / "task") or os.listdir(tmp_path / "task") == []


def test_damaged_cache_says_delete_it(tmp_path):
    folder = array_cache.folder_for(str(tmp_path), "task", KEY)
    os.makedirs(folder)
    with pytest.raises(DataError, match=f"delete {folder} to rebuild"):
        array_cache.cached_splits(str(tmp_path), "task", KEY, fail)


def test_wrong_split_names_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="expected"):
        array_cache.cached_splits(str(tmp_path), "task", KEY, lambda: {"train": make_splits()["train"]})


def test_describe_files_has_absolute_path_size_and_mtime(tmp_path, monkeypatch):
    (tmp_path / "a.tsv").write_bytes(b"12345")
    os.utime(tmp_path / "a.tsv", ns=(1, 2_000_000_000))
    monkeypatch.chdir(tmp_path)
    assert array_cache.describe_files(["a.tsv"]) == [
        {"path": str(tmp_path / "a.tsv"), "size": 5, "mtime_ns": 2_000_000_000}
    ]


def test_notes_are_stored_with_the_arrays_and_returned_on_every_load(tmp_path):
    notes = {"train": {"truncated": 3}}
    first = array_cache.cached_splits_with_notes(str(tmp_path), "task", KEY, lambda: (make_splits(), notes))
    again = array_cache.cached_splits_with_notes(str(tmp_path), "task", KEY, lambda: pytest.fail("rebuilt"))
    assert first[1] == again[1] == notes and splits_equal(first[0], again[0])
    assert array_cache.cached_splits(str(tmp_path), "task", KEY, lambda: pytest.fail("rebuilt")) is not None
