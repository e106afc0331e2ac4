"""Text (IMDb byte level) from TFDS under tfds.testing.mock_data: byte + 1 ids, truncation, splits."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from lra_jax.data import tasks, text
from lra_jax.errors import DataError


def _config(data_dir: str = "", max_len: int = 16):
    return ml_collections.ConfigDict({"max_len": max_len, "seed": 0, "data": {"data_dir": data_dir, "cache_dir": ""}})


def test_encode_bytes_ids_truncation_padding():
    tokens = text.encode_bytes(["ab", b"\xff\x00z", "é" * 5], max_len=4)
    assert tokens.dtype == np.int16 and tokens.shape == (3, 4)
    assert tokens[0].tolist() == [ord("a") + 1, ord("b") + 1, 0, 0]
    assert tokens[1].tolist() == [256, 1, ord("z") + 1, 0]  # byte 0 -> id 1, never padding
    assert tokens[2].tolist() == [0xC3 + 1, 0xA9 + 1] * 2  # UTF-8 bytes, cut at max_len


def test_imdb_splits_from_tfds():
    with tfds.testing.mock_data(num_examples=12):
        spec = tasks.get_task("text")
        splits = spec.load(_config(max_len=16))
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


def test_missing_dataset_names_path_and_command(tmp_path):
    with pytest.raises(DataError) as error:
        tasks.get_task("text").load(_config(str(tmp_path)))
    message = str(error.value)
    assert "'imdb_reviews'" in message and str(tmp_path) in message
    assert f"python -m lra_jax.data.prepare --task=text --data_dir={tmp_path}" in message
    assert f"--config.data.data_dir={tmp_path}" in message
