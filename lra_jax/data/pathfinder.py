"""Pathfinder and Path-X: reader of image folders in the official layout (official or generated).

Source of the format facts:
  * Long Range Arena (Tay et al. 2021, ICLR), tasks "Pathfinder" (32x32,
    sequence 1024) and "Path-X" (128x128, sequence 16384): are the two marked
    points connected? 2 classes; the image is flattened row by row into a
    sequence of pixel values.
  * Official layout (`lra_release/pathfinder32/curv_contour_length_14`, and
    `pathfinder128/...` for Path-X), read by LRA's
    `lra_benchmarks/image/input_pipeline.py`: `metadata/<batch>.npy` files that
    are TEXT despite the name, one image per line, whitespace separated; field
    0 is the image folder relative to the difficulty folder (e.g. `imgs/0`),
    field 1 the file name (e.g. `sample_0.png`), field 3 the label 0/1.
    Images are 8-bit grayscale PNGs under `imgs/<batch>/`. Some official PNGs
    are empty or unreadable; like later LRA re-implementations, we skip them
    (logging how many).

Tokens: id = pixel value + 1 (0 stays padding, no pixel is padding), row-major,
int16 [N, H*W], padded/truncated to max_len (truncation warns: it cuts the image).
Labels int32 [N].

Split (ours; LRA's split order is not part of the release): all readable
images in metadata order (metadata files sorted by their numeric name, lines in
file order) are permuted by `np.random.default_rng(split_seed)`; the first 80%
are train, the next 10% val, the last 10% test.

Cache (`array_cache`): the decoded splits are written once as .npy files under
`<cache_dir>/<task>/arrays-<key>/` and memory-mapped on later loads; the key
hashes the source folder's absolute path, the names, sizes and modification
times of its metadata files, the split seed and the format version, so editing
or re-downloading the metadata (or another split seed) decodes again. The cached
tokens hold whole images; max_len pads or cuts them on load, so every max_len
shares one cache.

Generated images (`pathfinder_generator.generate`, in the official layout) are read
the same way; `tasks` decides between generating and reading.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from absl import logging
from PIL import Image, UnidentifiedImageError

from lra_jax.data import array_cache
from lra_jax.errors import DataError

VOCAB_SIZE = 257  # 256 pixel values + padding
NUM_CLASSES = 2
TOKEN_DTYPE = np.int16
SPLITS = array_cache.SPLITS
FRACTIONS = (0.8, 0.1, 0.1)
_FORMAT_VERSION = 1  # bump when the cached arrays change for the same source


def _metadata_files(data_dir: str) -> list[str]:
    folder = os.path.join(data_dir, "metadata")
    names = [n for n in os.listdir(folder) if n.endswith(".npy")]

    def order(name: str):
        stem = name[: -len(".npy")]
        return (0, int(stem), "") if stem.isdigit() else (1, 0, stem)

    return [os.path.join(folder, n) for n in sorted(names, key=order)]


def _missing_message(task: str, data_dir: str) -> str:
    sub = "pathfinder128" if task == "pathx" else "pathfinder32"
    return (
        f"{task}: {data_dir} has no metadata/*.npy files (expected the official layout "
        f"<difficulty>/metadata/<batch>.npy and <difficulty>/imgs/<batch>/sample_<i>.png); get them with "
        f"`python -m lra_jax.data.prepare --task={task} --data_dir=DIR` and train with "
        f"--config.data.data_dir=DIR/lra_release/{sub}/curv_contour_length_14, "
        "or leave data_dir empty to generate the images"
    )


def read_images(data_dir: str, task: str = "pathfinder") -> tuple[np.ndarray, np.ndarray, int]:
    """Decodes every image listed in the metadata of one difficulty folder.

    Args:
      data_dir: e.g. `lra_release/pathfinder32/curv_contour_length_14`.
      task: name used in messages.

    Returns:
      pixels uint8 [N, H*W] (row-major), labels int32 [N], and the number of
      listed images skipped as empty or unreadable.

    Raises:
      DataError: on a missing folder, a malformed metadata line (naming file
        and line), images of different sizes, or no readable image.
    """
    if not os.path.isdir(os.path.join(data_dir, "metadata")):
        raise DataError(_missing_message(task, data_dir))
    files = _metadata_files(data_dir)
    if not files:
        raise DataError(_missing_message(task, data_dir))
    rows: list[np.ndarray] = []
    labels: list[int] = []
    skipped = 0
    shape = None
    for meta in files:
        with open(meta, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        for lineno, line in enumerate(lines, start=1):
            fields = line.split()
            if not fields:
                continue
            where = f"{meta}:{lineno}"
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise DataError(
                    f"{where}: expected '<folder> <file> <index> <label 0|1> ...', got {line[:80]!r}; "
                    "fix the line or re-download the official files"
                )
            path = os.path.join(data_dir, fields[0], fields[1])
            try:
                if os.path.getsize(path) == 0:
                    raise OSError("empty file")
                with Image.open(path) as im:
                    image = np.asarray(im.convert("L") if im.mode != "L" else im, dtype=np.uint8)
            except (OSError, UnidentifiedImageError, ValueError) as e:
                skipped += 1
                logging.log_first_n(logging.WARNING, "%s: skipping %s (%s)", 5, task, path, e)
                continue
            if shape is None:
                shape = image.shape
            elif image.shape != shape:
                raise DataError(f"{where}: {path} is {image.shape}, earlier images are {shape}; fix the data")
            rows.append(image.reshape(-1))
            labels.append(int(fields[3]))
    if not rows:
        raise DataError(f"{task}: none of the images listed under {data_dir}/metadata could be read")
    if skipped:
        logging.warning("%s: skipped %d empty or unreadable images of %d listed", task, skipped, skipped + len(rows))
    return np.stack(rows), np.asarray(labels, dtype=np.int32), skipped


def split_indices(n: int, split_seed: int) -> dict[str, np.ndarray]:
    """Indices of train/val/test: a seeded permutation of range(n) cut 80/10/10."""
    order = np.random.default_rng(split_seed).permutation(n)
    n_train = round(FRACTIONS[0] * n)
    n_val = round(FRACTIONS[1] * n)
    return {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}


def _source_key(data_dir: str, split_seed: int) -> dict:
    """The cache key (unchanged since format 1, so caches decoded before stay valid)."""
    data_dir = os.path.abspath(data_dir)
    stats = [(os.path.basename(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in _metadata_files(data_dir)]
    return {"v": _FORMAT_VERSION, "dir": data_dir, "meta": stats, "split_seed": split_seed}


def _decode_splits(data_dir: str, task: str, split_seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Whole-image splits: tokens int16 [N, H*W], labels int32 [N]."""
    logging.info("%s: decoding the images in %s", task, data_dir)
    pixels, labels, _ = read_images(data_dir, task)
    return {split: (pixels[idx].astype(TOKEN_DTYPE) + 1, labels[idx])
            for split, idx in split_indices(len(labels), split_seed).items()}


def _fit(tokens: np.ndarray, max_len: int, task: str) -> np.ndarray:
    """Pads (with 0) or truncates the flattened images to max_len."""
    length = tokens.shape[1]
    if length == max_len:
        return tokens
    if length > max_len:
        warnings.warn(f"{task}: images have {length} pixels, max_len={max_len} cuts them; set max_len={length}",
                      stacklevel=3)
        return np.ascontiguousarray(tokens[:, :max_len])
    return np.pad(tokens, ((0, 0), (0, max_len - length)))


def read_splits(
    data_dir: str, *, cache_dir: str, max_len: int, split_seed: int = 0, task: str = "pathfinder"
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Splits of one official difficulty folder, decoded once and cached.

    Returns:
      {"train"|"val"|"test": (tokens int16 [N, max_len], labels int32 [N])};
      with max_len = H*W the tokens are read-only memory maps of the cache.
    """
    if not os.path.isdir(os.path.join(data_dir, "metadata")):
        raise DataError(_missing_message(task, data_dir))
    if not _metadata_files(data_dir):
        raise DataError(_missing_message(task, data_dir))
    splits = array_cache.cached_splits(cache_dir, task, _source_key(data_dir, split_seed),
                                       lambda: _decode_splits(data_dir, task, split_seed))
    out = {}
    for split, (tokens, labels) in splits.items():  # a loop, not a comprehension: _fit's warning stacklevel
        out[split] = (_fit(tokens, max_len, task), labels)
    return out
