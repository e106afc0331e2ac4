"""Text (IMDb byte level) from TFDS under tfds.testing.mock_data: byte + 1 ids, truncation, splits."""

from __future__ import annotations

import os
import types

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from helpers import splits_equal
from lra_jax.data import array_cache, tasks, text
from lra_jax.errors import DataError


def _config(data_dir: str = "", max_len: int = 16, cache_dir: str = ""):
    return tasks.DataSettings(data_dir=data_dir, cache_dir=cache_dir), max_len


def test_encode_bytes_ids_truncation_padding():
    tokens = text.encode_bytes(["ab", b"\xff\x00z", "é" * 5], max_len=4)
    assert tokens.dtype == np.int16 and tokens.shape == (3, 4)
    assert tokens[0].tolist() == [ord("a") + 1, ord("b") + 1, 0, 0]
    assert tokens[1].tolist() == [256, 1, ord("z") + 1, 0]  # byte 0 -> id 1, never padding
    assert tokens[2].tolist() == [0xC3 + 1, 0xA9 + 1] * 2  # UTF-8 bytes, cut at max_len


def test_imdb_splits_from_tfds(tmp_path):
    with tfds.testing.mock_data(num_examples=12):
        spec = tasks.get_task("text")
        splits = spec.load(*_config(max_len=16, cache_dir=str(tmp_path)))
        train = [tfds.data_source("imdb_reviews", split="train")[i] for i in range(12)]
        test = [tfds.data_source("imdb_reviews", split="test")[i] for i in range(12)]
    assert (spec.vocab_size, spec.num_classes, spec.dual) == (257, 2, False)
    assert {k: len(v[1]) for k, v in splits.items()} == {"train": 12, "val": 12, "test": 12}
    assert splits["val"][0] is splits["test"][0]  # val = TFDS test, as in LRA
    tokens, labels = splits["train"]
    assert tokens.shape == (12, 16) and tokens.dtype == np.int16 and labels.dtype == np.int32
    for row, label, record in zip(tokens, labels, train):
        raw = record["text"].encode("utf-8") if isinstance(record["text"], str) else record["text"]
        expected = [b + 1 for b in raw[:16]] + [0] * (16 - min(16, len(raw)))
        assert row.tolist() == expected and label == int(record["label"])
    assert splits["test"][1].tolist() == [int(r["label"]) for r in test]


def test_missing_dataset_names_path_and_command(tmp_path, caplog):
    (tmp_path / "imdb_reviews" / "plain_text" / "1.0.0").mkdir(parents=True)  # a folder with no dataset in it
    with pytest.raises(DataError) as error:
        tasks.get_task("text").load(*_config(str(tmp_path)))
    assert not [r for r in caplog.records if "dataset_info.json" in r.getMessage()]  # our message alone
    message = str(error.value)
    assert "'imdb_reviews'" in message and str(tmp_path) in message
    assert f"python -m lra_jax.data.prepare --task=text --data_dir={tmp_path}" in message
    assert f"--config.data.data_dir={tmp_path}" in message


# ----------------------------------------------------------------------------- cache


def _count_encodings(monkeypatch, encode=text._split) -> list[int]:
    """Patches text._split to record its max_len (calling the original, bound at import)."""
    calls: list[int] = []
    monkeypatch.setattr(text, "_split", lambda source, max_len: calls.append(max_len) or encode(source, max_len))
    return calls


def test_prepared_dataset_is_encoded_once_per_max_len(tmp_path, monkeypatch):
    shard = tmp_path / "imdb_reviews-train.array_record-00000-of-00001"  # stands for the prepared files
    shard.write_bytes(b"records")
    monkeypatch.setattr(text, "tfds_source", lambda name, sources: {"files": array_cache.describe_files([shard])})
    cache = str(tmp_path / "cache")
    with tfds.testing.mock_data(num_examples=12):
        fresh = text.load_splits("", max_len=16)
        first = text.load_splits("", max_len=16, cache_dir=cache)
        monkeypatch.setattr(text, "_split", lambda *a: pytest.fail("encoded the records again"))
        again = text.load_splits("", max_len=16, cache_dir=cache)
        assert splits_equal(first, fresh) and splits_equal(again, fresh)
        assert isinstance(again["train"][0], np.memmap) and again["val"][0] is again["test"][0]
        calls = _count_encodings(monkeypatch)
        os.utime(shard, ns=(0, os.stat(shard).st_mtime_ns + 10**9))  # re-prepared: new mtime
        text.load_splits("", max_len=16, cache_dir=cache)
        shorter = text.load_splits("", max_len=8, cache_dir=cache)
    assert calls == [16, 16, 8, 8] and shorter["train"][0].shape == (12, 8)
    assert len(os.listdir(tmp_path / "cache" / "text")) == 3


def test_mock_data_has_no_files_so_is_not_cached(tmp_path, monkeypatch):
    calls = _count_encodings(monkeypatch)
    with tfds.testing.mock_data(num_examples=4):
        sources = {"train": tfds.data_source("imdb_reviews", split="train")}
        assert text.tfds_source("imdb_reviews", sources) is None
        for _ in range(2):
            tasks.get_task("text").load(*_config(max_len=8, cache_dir=str(tmp_path)))
    assert len(calls) == 4 and os.listdir(tmp_path) == []


def test_tfds_source_describes_the_prepared_folder(tmp_path):
    for name in ("dataset_info.json", "imdb_reviews-train.array_record-00000-of-00001",
                 "imdb_reviews-test.array_record-00000-of-00001"):
        (tmp_path / name).write_bytes(b"x")
    source = types.SimpleNamespace(dataset_info=types.SimpleNamespace(data_dir=str(tmp_path), version="1.0.0"))
    key = text.tfds_source("imdb_reviews", {"train": source, "test": source})
    assert key["folder"] == str(tmp_path) and key["version"] == "1.0.0" and key["tfds"] == "imdb_reviews"
    assert [f["path"] for f in key["files"]] == sorted(str(p) for p in tmp_path.iterdir())
    assert text.tfds_source("imdb_reviews", {"unsupervised": source}) is None  # no file of that split
