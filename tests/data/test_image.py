"""Image (CIFAR-10 grayscale) from TFDS under tfds.testing.mock_data: ids, conversion, 90/10 split."""

from __future__ import annotations

import os

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from helpers import splits_equal

from lra_jax.data import array_cache, image, tasks
from lra_jax.errors import DataError


def _config(data_dir: str = "", max_len: int = 1024, cache_dir: str = "", downsample: int = 1):
    return tasks.DataSettings(data_dir=data_dir, cache_dir=cache_dir, downsample=downsample), max_len


def test_grayscale_formula_by_hand():
    pixel = np.array([[[200, 100, 50]]], dtype=np.uint8)  # 0.299*200 + 0.587*100 + 0.114*50 = 124.2
    assert image.grayscale(pixel)[0, 0] == 124
    half = np.array([[[1, 0, 2]]], dtype=np.uint8)  # 0.299 + 0.228 = 0.527 -> 1
    assert image.grayscale(half)[0, 0] == 1
    assert image.grayscale(np.full((1, 1, 3), 255, np.uint8))[0, 0] == 255


def test_cifar10_tokens_labels_and_split(tmp_path):
    with tfds.testing.mock_data(num_examples=20):
        spec = tasks.get_task("image")
        splits = spec.load(*_config(cache_dir=str(tmp_path)))
        train_source = tfds.data_source("cifar10", split="train")
        first, last = train_source[0], train_source[19]
        test_labels = [int(tfds.data_source("cifar10", split="test")[i]["label"]) for i in range(20)]
    assert (spec.vocab_size, spec.num_classes, spec.dual) == (257, 10, False)
    assert {k: len(v[1]) for k, v in splits.items()} == {"train": 18, "val": 2, "test": 20}  # first 90% / last 10%
    tokens, labels = splits["train"]
    assert tokens.shape == (18, 1024) and tokens.dtype == np.int16 and labels.dtype == np.int32
    r, g, b = (int(v) for v in first["image"][3, 5])  # pixel (row 3, column 5) -> position 3 * 32 + 5
    assert tokens[0, 3 * 32 + 5] == round(0.299 * r + 0.587 * g + 0.114 * b) + 1
    assert labels[0] == int(first["label"])
    val_tokens, val_labels = splits["val"]
    assert np.array_equal(val_tokens[-1], image.grayscale(last["image"]).reshape(-1).astype(np.int16) + 1)
    assert val_labels[-1] == int(last["label"])
    assert splits["test"][1].tolist() == test_labels
    assert tokens.min() >= 1 and tokens.max() <= 256  # no pixel is padding


def test_max_len_pads_and_cuts():
    images = np.zeros((2, 4, 4, 3), np.uint8)
    assert image.encode_images(images, 20)[:, 16:].tolist() == [[0] * 4] * 2
    assert image.encode_images(images, 10).shape == (2, 10)


def test_downsampling_averages_blocks_rounding_half_up():
    gray = np.array([[[0, 1, 10, 10], [0, 0, 10, 11], [255, 255, 7, 8], [255, 255, 8, 8]]], np.uint8)
    # block means: 0.25 -> 0, 10.25 -> 10, 255, 7.75 -> 8; a mean of x.5 rounds up
    assert image.downsample(gray, 2).tolist() == [[[0, 10], [255, 8]]]
    assert np.array_equal(image.downsample(gray, 1), gray)
    assert image.downsample(np.array([[[1, 2], [1, 2]]], np.uint8), 2).tolist() == [[[2]]]  # 1.5 -> 2
    with pytest.raises(DataError, match="divide the 4x4 images"):
        image.downsample(gray, 3)


def test_mini_image_is_cifar_at_16x16(tmp_path):
    from lra_jax.config import task_defaults as base

    config = base.get_config("image,mini")
    assert (config.data.downsample, config.max_len) == (2, 256)
    with tfds.testing.mock_data(num_examples=10):
        small = tasks.get_task("image").load(*_config(max_len=256, downsample=2))["train"][0]
        whole = tasks.get_task("image").load(*_config())["train"][0]
    assert small.shape == (9, 256) and small.min() >= 1  # whole 16 x 16 images, no padding
    expected = image.downsample((whole - 1).reshape(-1, 32, 32).astype(np.uint8), 2).reshape(9, 256) + 1
    assert np.array_equal(small, expected)


def test_missing_dataset_names_path_and_command(tmp_path):
    with pytest.raises(DataError) as error:
        tasks.get_task("image").load(*_config(str(tmp_path / "tfds")))
    message = str(error.value)
    assert "'cifar10'" in message and str(tmp_path / "tfds") in message
    assert f"python -m lra_jax.data.prepare --task=image --data_dir={tmp_path / 'tfds'}" in message
    assert f"--config.data.data_dir={tmp_path / 'tfds'}" in message


# ----------------------------------------------------------------------------- cache


def _count_conversions(monkeypatch, convert=image._split) -> list[int]:
    """Patches image._split to record its max_len (calling the original, bound at import)."""
    calls: list[int] = []
    monkeypatch.setattr(image, "_split", lambda source, max_len, factor: calls.append(max_len)
                        or convert(source, max_len, factor))
    return calls


def test_prepared_dataset_is_converted_once_per_max_len(tmp_path, monkeypatch):
    shard = tmp_path / "cifar10-train.array_record-00000-of-00001"  # stands for the prepared files
    shard.write_bytes(b"records")
    monkeypatch.setattr(image, "tfds_source", lambda name, sources: {"files": array_cache.describe_files([shard])})
    cache = str(tmp_path / "cache")
    with tfds.testing.mock_data(num_examples=10):
        fresh = image.load_splits("", max_len=1024)
        first = tasks.get_task("image").load(*_config(cache_dir=cache))
        monkeypatch.setattr(image, "_split", lambda *a: pytest.fail("converted the records again"))
        again = tasks.get_task("image").load(*_config(cache_dir=cache))
        assert splits_equal(first, fresh) and splits_equal(again, fresh) and isinstance(again["val"][0], np.memmap)
        assert {k: len(v[1]) for k, v in again.items()} == {"train": 9, "val": 1, "test": 10}
        calls = _count_conversions(monkeypatch)
        shard.write_bytes(b"re-prepared records")  # new size
        image.load_splits("", max_len=1024, cache_dir=cache)
        image.load_splits("", max_len=1000, cache_dir=cache)
    assert calls == [1024, 1024, 1000, 1000]
    assert len(os.listdir(tmp_path / "cache" / "image")) == 3


def test_mock_data_is_not_cached(tmp_path, monkeypatch):
    calls = _count_conversions(monkeypatch)
    with tfds.testing.mock_data(num_examples=4):
        for _ in range(2):
            image.load_splits("", max_len=1024, cache_dir=str(tmp_path))
    assert len(calls) == 4 and os.listdir(tmp_path) == []
