"""Image: CIFAR-10 as sequences of grayscale pixels (LRA task "image").

Source of the format facts:
  * Long Range Arena (Tay et al. 2021, ICLR), task "Image": CIFAR-10
    (Krizhevsky 2009) converted to grayscale, flattened to 32 * 32 = 1024
    pixels, 10 classes. LRA's `lra_benchmarks/image/input_pipeline.py`
    converts with `tf.image.rgb_to_grayscale` (weights 0.2989, 0.5870, 0.1140)
    and holds out part of the train split for validation.
  * TFDS `cifar10` (3.0.2): splits train (50,000) and test (10,000), features
    `image` uint8 [32, 32, 3] and `label` (0-9). Read with `tfds.data_source`
    (ArrayRecord, no TensorFlow needed to read).

Ours: gray = round(0.299 R + 0.587 G + 0.114 B), computed exactly in integers
as (299 R + 587 G + 114 B + 500) // 1000 (ties round up); TensorFlow's
conversion instead truncates (weighted sum / 255) * 255.5, which can differ by
one gray level. id = gray + 1 (no pixel is padding), flattened row-major:
tokens int16 [N, max_len] (1024 for whole images; other lengths pad or cut).
The mini scale first averages 2x2 pixel blocks (`downsample_factor`, 16 x 16 = 256 tokens),
rounding halves up, as Pathfinder's mini scale uses 16 x 16 images: 1024-token
full attention is too slow for a CPU sweep.
Splits: train = the first 90% of TFDS train (45,000), val = its last 10%
(5,000), test = TFDS test (10,000).

Cache (`array_cache`): the records are read and converted once per max_len; the
arrays are kept under `<cache_dir>/image/arrays-<key>/` and memory-mapped on
later loads. The key (`text.tfds_source`) holds the prepared dataset's folder,
version and files (size, modification time), plus max_len and the format
version: re-preparing the dataset, another data_dir or another max_len converts
again. A source whose files cannot be found (`tfds.testing.mock_data`) is not
cached.
"""

from __future__ import annotations

import numpy as np
from absl import logging

from lra_jax.data import array_cache
from lra_jax.data.text import read_records, tfds_source, tfds_split
from lra_jax.errors import DataError

VOCAB_SIZE = 257  # 256 gray levels + padding
NUM_CLASSES = 10
TFDS_NAME = "cifar10"
TOKEN_DTYPE = np.int16
TRAIN_FRACTION = 0.9
_FORMAT_VERSION = 1  # bump when the cached arrays change for the same source


def grayscale(images: np.ndarray) -> np.ndarray:
    """round(0.299 R + 0.587 G + 0.114 B) of uint8 [..., 3] images, as uint8 [...]."""
    rgb = np.asarray(images, dtype=np.int32)
    return ((rgb[..., 0] * 299 + rgb[..., 1] * 587 + rgb[..., 2] * 114 + 500) // 1000).astype(np.uint8)


def downsample(gray: np.ndarray, factor: int) -> np.ndarray:
    """Mean of each factor x factor block, rounded half up: uint8 [N, H, W] -> uint8 [N, H/f, W/f]."""
    n, h, w = gray.shape
    if factor < 1 or h % factor or w % factor:
        raise DataError(f"image downsample factor {factor} must be at least 1 and divide the {h}x{w} images; "
                        f"set --config.data.downsample to 1, 2, 4, ...")
    blocks = gray.reshape(n, h // factor, factor, w // factor, factor).astype(np.int32).sum(axis=(2, 4))
    area = factor * factor
    return ((2 * blocks + area) // (2 * area)).astype(np.uint8)


def encode_images(images: np.ndarray, max_len: int, downsample_factor: int = 1) -> np.ndarray:
    """Token ids gray + 1 of uint8 [N, H, W, 3] images, row-major, padded/cut to max_len: int16 [N, max_len].

    downsample_factor f > 1 averages f x f pixel blocks first (H*W/f^2 tokens per image).
    """
    if max_len < 1:
        raise DataError(f"max_len={max_len}; set --config.max_len to 1 or more")
    gray = grayscale(images)
    if downsample_factor != 1:
        gray = downsample(gray, downsample_factor)
    flat = gray.reshape(len(images), -1).astype(TOKEN_DTYPE) + 1
    if flat.shape[1] >= max_len:
        if flat.shape[1] > max_len:
            logging.warning("image: %d pixels per image cut to max_len=%d", flat.shape[1], max_len)
        return np.ascontiguousarray(flat[:, :max_len])
    return np.pad(flat, ((0, 0), (0, max_len - flat.shape[1])))


def _split(source, max_len: int, downsample_factor: int) -> tuple[np.ndarray, np.ndarray]:
    records = read_records(source, ("image", "label"))
    images = np.stack([np.asarray(im, dtype=np.uint8) for im in records["image"]])
    if images.ndim != 4 or images.shape[-1] != 3:
        raise DataError(f"cifar10 images have shape {images.shape[1:]}, expected [32, 32, 3]")
    return encode_images(images, max_len, downsample_factor), np.asarray(records["label"], dtype=np.int32).reshape(-1)


def load_splits(
    data_dir: str, *, max_len: int, cache_dir: str | None = None, downsample_factor: int = 1
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """CIFAR-10 grayscale splits {"train"|"val"|"test": (int16 [N, max_len], int32 [N])}.

    Args:
      data_dir: TFDS data_dir ("" = TFDS default).
      max_len: sequence length (1024 = whole images; 256 = whole images at downsample_factor 2).
      cache_dir: where the converted arrays are kept ("" or None: convert every time).
      downsample_factor: average f x f pixel blocks (the mini scale uses 2: 16 x 16 images).
    """
    sources = {split: tfds_split(TFDS_NAME, split, data_dir, "image") for split in ("train", "test")}
    source = tfds_source(TFDS_NAME, sources)
    key = None if source is None else {"v": _FORMAT_VERSION, "source": source, "max_len": max_len}
    if downsample_factor != 1:  # keys of whole-image caches stay as they were
        key = None if key is None else {**key, "downsample_factor": downsample_factor}

    def build() -> dict[str, tuple[np.ndarray, np.ndarray]]:
        tokens, labels = _split(sources["train"], max_len, downsample_factor)
        n_train = round(TRAIN_FRACTION * len(labels))
        return {"train": (tokens[:n_train], labels[:n_train]), "val": (tokens[n_train:], labels[n_train:]),
                "test": _split(sources["test"], max_len, downsample_factor)}

    return array_cache.cached_splits(cache_dir, "image", key, build)
