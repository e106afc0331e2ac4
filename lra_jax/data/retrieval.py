"""Retrieval: byte-level document matching on the ACL Anthology Network (LRA task "retrieval").

Source of the format facts:
  * Long Range Arena (Tay et al. 2021, ICLR), task "Retrieval" (AAN, Radev et
    al. 2013): does paper 1 cite paper 2? Two documents per example, each
    byte-level (id = byte + 1, vocabulary 257) and truncated to max_len; a
    dual encoder classifies the pair (2 classes).
  * Official files `lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv`,
    read by LRA's `lra_benchmarks/matching/input_pipeline.py` with
    `tf.data.experimental.CsvDataset(field_delim="\\t", use_quote_delim=False,
    record_defaults=[float32, string, string, string, string])`: tab separated,
    no quoting, no header, five columns `label, id1, id2, text1, text2`; the
    label is written as a number that may be a float ("1.0").
  * LRA validates on the "eval" file; so do we.

We also accept a header line (detected: its first field is not a number), CRLF
line ends and text that is not valid UTF-8 (documents are read as raw bytes).
A row without exactly five fields, or whose label is not 0 or 1, is a DataError
naming the file and line.

Output: tokens int16 [N, 2, max_len] (document 1 in [:, 0], document 2 in
[:, 1], 0 = padding) and labels int32 [N].

Cache (`array_cache`): the TSVs (several GB) are parsed once per max_len; the
arrays are kept under `<cache_dir>/retrieval/arrays-<key>/` and memory-mapped on
later loads. The key holds the three files' absolute paths, sizes and
modification times, max_len and the format version: a changed or moved file, or
another max_len, parses again.
"""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from lra_jax.data import array_cache
from lra_jax.data.text import TOKEN_DTYPE, encode_bytes
from lra_jax.errors import DataError

VOCAB_SIZE = 257
NUM_CLASSES = 2
FILES = {  # split -> official file name
    "train": "new_aan_pairs.train.tsv",
    "val": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}
NUM_FIELDS = 5
_FORMAT_VERSION = 1  # bump when the cached arrays change for the same files


def _parse_label(field: bytes, where: str) -> int | None:
    """The label 0/1 of a label field ("1", "1.0", ...), None if it is not a number."""
    try:
        value = float(field.strip())
    except ValueError:
        return None
    if value not in (0.0, 1.0):
        raise DataError(f"{where}: label {field.decode('utf-8', 'replace')!r} is not 0 or 1; fix the line")
    return int(value)


def read_split(path: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Reads one official AAN pairs TSV.

    Args:
      path: a `label<TAB>id1<TAB>id2<TAB>text1<TAB>text2` file, with or without a header line.
      max_len: length of each document.

    Returns:
      tokens int16 [N, 2, max_len] and labels int32 [N].

    Raises:
      DataError: naming the file and line, on a row without five fields or with a bad label.
    """
    if max_len < 1:
        raise DataError(f"max_len={max_len}; set --config.max_len to 1 or more")
    first: list[bytes] = []
    second: list[bytes] = []
    labels: list[int] = []
    truncated = 0
    try:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, start=1):
                line = line.rstrip(b"\r\n")
                if lineno == 1:
                    line = line.removeprefix(b"\xef\xbb\xbf")  # UTF-8 byte order mark
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                fields = line.split(b"\t")
                if len(fields) != NUM_FIELDS:
                    raise DataError(
                        f"{where}: expected {NUM_FIELDS} tab-separated fields (label, id1, id2, text1, text2), "
                        f"got {len(fields)}; fix the line or re-download the official file"
                    )
                label = _parse_label(fields[0], where)
                if label is None:
                    if lineno == 1 and not labels:  # a header line such as "label<TAB>id1<TAB>..."
                        continue
                    raise DataError(
                        f"{where}: label {fields[0][:20].decode('utf-8', 'replace')!r} is not a number; "
                        "fix the line or re-download the official file"
                    )
                truncated += len(fields[3]) > max_len or len(fields[4]) > max_len
                first.append(fields[3][:max_len])
                second.append(fields[4][:max_len])
                labels.append(label)
    except FileNotFoundError:
        raise DataError(f"Retrieval file {path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"Retrieval file {path} is a directory; point data_dir at the folder holding it") from None
    if truncated:
        logging.info("retrieval: %s: %d of %d pairs truncated to max_len=%d", path, truncated, len(labels), max_len)
    tokens = np.zeros((len(labels), 2, max_len), dtype=TOKEN_DTYPE)
    if labels:
        tokens[:, 0] = encode_bytes(first, max_len)
        tokens[:, 1] = encode_bytes(second, max_len)
    return tokens, np.asarray(labels, dtype=np.int32)


def load_splits(
    data_dir: str, *, max_len: int, cache_dir: str | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """AAN splits {"train"|"val"|"test": (int16 [N, 2, max_len], int32 [N])}; val = the eval file.

    Args:
      data_dir: folder with `new_aan_pairs.{train,eval,test}.tsv` (official `lra_release/tsv_data`).
      max_len: length of each document.
      cache_dir: where the parsed arrays are kept ("" or None: parse every time).
    """
    folder = data_dir or "<data_dir>"
    paths = {split: os.path.join(folder, name) for split, name in FILES.items()}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if not data_dir or missing:
        what = f"missing Retrieval files: {', '.join(missing)}" if data_dir else (
            "Retrieval needs the official AAN files and config.data.data_dir is empty"
        )
        raise DataError(
            f"{what}; get them with `python -m lra_jax.data.prepare --task=retrieval --data_dir=DIR` "
            "and train with --config.data.data_dir=DIR/lra_release/tsv_data"
        )
    key = {"v": _FORMAT_VERSION, "files": array_cache.describe_files(paths.values()), "max_len": max_len}
    return array_cache.cached_splits(
        cache_dir, "retrieval", key, lambda: {split: read_split(path, max_len) for split, path in paths.items()}
    )
