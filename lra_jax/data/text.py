"""Text: byte-level IMDb sentiment classification (LRA task "text").

Source of the format facts:
  * Long Range Arena (Tay et al. 2021, ICLR), task "Text": IMDb reviews
    (Maas et al. 2011) read as bytes, binary sentiment; LRA's
    `lra_benchmarks/text_classification/input_pipeline.py` loads the TFDS
    `imdb_reviews` dataset, trains on its train split and evaluates on its
    test split for both validation and test, and encodes with
    `tfds.deprecated.text.ByteTextEncoder`, which reserves id 0 for padding:
    id = byte + 1, vocabulary 257.
  * TFDS `imdb_reviews` (plain_text config): splits train (25,000) and test
    (25,000), features `text` (str) and `label` (0 = negative, 1 = positive).
    Read with `tfds.data_source` (ArrayRecord, no TensorFlow needed); the
    real data source returns `text` as UTF-8 bytes, `tfds.testing.mock_data`
    returns str: both are accepted.

Encoding: the UTF-8 bytes of each review, id = byte + 1, truncated to
max_len and 0-padded. Tokens are int16 [N, max_len] (ids < 257 fit);
`pipeline` casts batches to int32.

Cache (`array_cache`): the records are read and encoded once per max_len; the
arrays are kept under `<cache_dir>/text/arrays-<key>/` (test once: val is the
same arrays) and memory-mapped on later loads. The key (`tfds_source`) holds the
prepared dataset's folder (TFDS data_dir/name/config/version), its version and
every file there with size and modification time, plus max_len and the format
version: re-preparing the dataset, another data_dir or another max_len encodes
again. A source whose files cannot be found (`tfds.testing.mock_data`) is not
cached.
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
from absl import logging

from lra_jax.data import array_cache
from lra_jax.errors import DataError

VOCAB_SIZE = 257  # 256 byte values + padding
NUM_CLASSES = 2
TFDS_NAME = "imdb_reviews"
TOKEN_DTYPE = np.int16
_READ_CHUNK = 1024  # records fetched per data-source call
_FORMAT_VERSION = 1  # bump when the cached arrays change for the same source


def encode_bytes(texts: Iterable[str | bytes], max_len: int) -> np.ndarray:
    """Byte-level ids (byte + 1, 0 = padding) of each text, truncated/padded to max_len.

    Args:
      texts: N strings (encoded as UTF-8) or byte strings.
      max_len: sequence length L.

    Returns:
      int16 [N, L].
    """
    if max_len < 1:
        raise DataError(f"max_len={max_len}; set --config.max_len to 1 or more")
    rows = [t.encode("utf-8") if isinstance(t, str) else bytes(t) for t in texts]
    out = np.zeros((len(rows), max_len), dtype=TOKEN_DTYPE)
    for i, raw in enumerate(rows):
        ids = np.frombuffer(raw[:max_len], dtype=np.uint8)
        out[i, : ids.size] = ids.astype(TOKEN_DTYPE) + 1
    return out


def missing_tfds_message(name: str, data_dir: str | None, task: str, reason: str) -> str:
    """One-line DataError text for a TFDS dataset that is not prepared."""
    where = data_dir or "the default TFDS data_dir (~/tensorflow_datasets or $TFDS_DATA_DIR)"
    flag = f" --data_dir={data_dir}" if data_dir else ""
    override = f" and train with --config.data.data_dir={data_dir}" if data_dir else (
        " (add --data_dir=DIR there and --config.data.data_dir=DIR here to use another folder)"
    )
    return (
        f"TFDS dataset {name!r} (ArrayRecord format) is not prepared in {where} ({reason}); "
        f"get it with `python -m lra_jax.data.prepare --task={task}{flag}`{override}"
    )


@contextlib.contextmanager
def _without_missing_info_warning() -> Iterator[None]:
    """Drops TFDS's "Variant folder ... has no dataset_info.json" log line, which an unprepared
    dataset prints before our own message (the one that says how to prepare it)."""
    drop = lambda record: "has no dataset_info.json" not in record.getMessage()  # noqa: E731
    absl_logger = std_logging.getLogger("absl")
    absl_logger.addFilter(drop)
    try:
        yield
    finally:
        absl_logger.removeFilter(drop)


def tfds_split(name: str, split: str, data_dir: str | None, task: str) -> Sequence[dict]:
    """A TFDS random-access data source, or DataError at once if it is not prepared.

    `download=False` makes an unprepared dataset fail immediately instead of
    attempting (and, offline, retrying for minutes) a download.
    """
    import tensorflow_datasets as tfds  # optional heavy dependency (the [tfds] extra), loaded when used

    try:
        with _without_missing_info_warning():
            return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
    except Exception as e:  # noqa: BLE001 - TFDS raises assorted types (AssertionError, NotImplementedError, ...)
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise DataError(missing_tfds_message(name, data_dir, task, reason)) from None


def tfds_source(name: str, sources: Mapping[str, Sequence]) -> dict | None:
    """Cache-key description of prepared TFDS data sources, or None where their files cannot be found.

    Returns:
      {"tfds": name, "version", "folder" (absolute), "files": `describe_files` of
      every file in the folder}, where the folder holds a file of each split.
    """
    try:
        info = next(iter(sources.values())).dataset_info
        folder, version = os.path.abspath(info.data_dir), str(info.version)
        names = sorted(os.listdir(folder))
    except (AttributeError, OSError, StopIteration, TypeError):
        return None
    if not all(any(n.startswith(f"{name}-{split}.") for n in names) for split in sources):
        return None  # e.g. tfds.testing.mock_data: records made up, no files
    files = [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]
    return {"tfds": name, "version": version, "folder": folder, "files": array_cache.describe_files(files)}


def read_records(source: Sequence[dict], keys: Sequence[str]) -> dict[str, list]:
    """All records of a data source, as {key: [value per record]}, fetched in chunks.

    Uses the batched `__getitems__` of ArrayRecord sources; falls back to one
    record at a time where that fails (the one of `tfds.testing.mock_data`
    raises TypeError in tensorflow-datasets 4.9.10).
    """
    out: dict[str, list] = {k: [] for k in keys}
    n = len(source)
    batched = hasattr(source, "__getitems__")
    for start in range(0, n, _READ_CHUNK):
        idx = list(range(start, min(n, start + _READ_CHUNK)))
        records = None
        if batched:
            try:
                records = source.__getitems__(idx)
            except TypeError:
                batched = False
        if records is None:
            records = [source[i] for i in idx]
        for record in records:
            for k in keys:
                out[k].append(record[k])
    return out


def _split(source: Sequence[dict], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    records = read_records(source, ("text", "label"))
    tokens = encode_bytes(records["text"], max_len)
    labels = np.asarray(records["label"], dtype=np.int32).reshape(-1)
    return tokens, labels


def load_splits(
    data_dir: str, *, max_len: int, cache_dir: str | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """IMDb byte-level splits {"train"|"val"|"test": (int16 [N, max_len], int32 [N])}.

    train = TFDS train (25,000); val and test are both TFDS test (25,000), as in LRA.

    Args:
      data_dir: TFDS data_dir ("" = TFDS default).
      max_len: sequence length.
      cache_dir: where the encoded arrays are kept ("" or None: encode every time).
    """
    sources = {split: tfds_split(TFDS_NAME, split, data_dir, "text") for split in ("train", "test")}
    source = tfds_source(TFDS_NAME, sources)
    key = None if source is None else {"v": _FORMAT_VERSION, "source": source, "max_len": max_len}

    def build() -> dict[str, tuple[np.ndarray, np.ndarray]]:
        train, test = _split(sources["train"], max_len), _split(sources["test"], max_len)
        logging.info("text: %d train, %d test reviews (val = test, as in LRA)", len(train[1]), len(test[1]))
        return {"train": train, "val": test, "test": test}

    return array_cache.cached_splits(cache_dir, "text", key, build)
