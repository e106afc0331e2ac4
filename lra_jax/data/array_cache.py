"""Decoded dataset splits kept on disk as .npy files, so a source is parsed once.

Layout: `<cache_dir>/<task>/arrays-<hash of key>/` holds `{split}_tokens.npy`,
`{split}_labels.npy` for train, val and test, and `info.json` (the key,
which splits are the same arrays as another, e.g. Text's val = test, stored
once, and the reader's notes: small JSON facts about the arrays that it needs
again on every load, e.g. how many ListOps sequences max_len cut). The key is a JSON-able description of everything the arrays depend on:
the source files (`describe_files`: absolute path, size, modification time),
max_len, the reader's format version, ... A changed source or setting gives a
new key, hence a new folder; the old one is left for the user to delete.

A folder is written under a temporary name beside it and renamed into place
when complete, so a half-written cache (a killed writer leaves a
`.tmp-arrays-*` folder) is never read; of two processes building the same
folder, the first rename wins and the second discards its copy. Tokens are
read back as read-only memory maps (`np.load(mmap_mode="r")`), labels in full.
A cache that cannot be written (read-only or full disk) is logged and skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable

import numpy as np
from absl import logging

from lra_jax.errors import DataError

Split = tuple[np.ndarray, np.ndarray]  # tokens [N, ...], labels int32 [N]
SPLITS = ("train", "val", "test")
_INFO = "info.json"  # written last inside the temporary folder


def describe_files(paths: Iterable[str]) -> list[dict]:
    """[{"path": absolute path, "size": bytes, "mtime_ns": modification time}] of each file, for a cache key."""
    out = []
    for path in paths:
        stat = os.stat(path)
        out.append({"path": os.path.abspath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return out


def folder_for(cache_dir: str, task: str, key: dict) -> str:
    """`<cache_dir>/<task>/arrays-<16 hex digits of sha256(json.dumps(key))>` (the key's own order)."""
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    return os.path.join(cache_dir, task, f"arrays-{digest}")


def write_atomically(out_dir: str, write: Callable[[str], None]) -> None:
    """Calls write(tmp_dir) on a fresh folder beside out_dir, then renames it to out_dir.

    If out_dir appeared meanwhile (another process built the same thing), that
    one is kept and ours discarded. On any error the temporary folder is removed.
    """
    parent, name = os.path.split(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(tmp)
    try:
        write(tmp)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not os.path.isdir(out_dir):
                raise
            logging.info("%s appeared while writing it; keeping that one", out_dir)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_splits(tmp: str, splits: dict[str, Split], key: dict, notes: dict) -> None:
    aliases: dict[str, str] = {}
    written: dict[str, Split] = {}
    for split in SPLITS:
        tokens, labels = splits[split]
        same = next((s for s, (t, y) in written.items() if t is tokens and y is labels), None)
        if same is not None:
            aliases[split] = same
            continue
        np.save(os.path.join(tmp, f"{split}_tokens.npy"), np.asarray(tokens))
        np.save(os.path.join(tmp, f"{split}_labels.npy"), np.asarray(labels))
        written[split] = (tokens, labels)
    with open(os.path.join(tmp, _INFO), "w", encoding="utf-8") as f:
        json.dump({"key": key, "aliases": aliases, "notes": notes}, f, indent=1)


def _read_splits(folder: str) -> tuple[dict[str, Split], dict]:
    try:
        with open(os.path.join(folder, _INFO), encoding="utf-8") as f:
            info = json.load(f)
        aliases = info.get("aliases", {})
        out = {}
        for split in SPLITS:
            if split not in aliases:
                tokens = np.load(os.path.join(folder, f"{split}_tokens.npy"), mmap_mode="r")
                out[split] = (tokens, np.load(os.path.join(folder, f"{split}_labels.npy")))
        for split, same in aliases.items():
            out[split] = out[same]
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"the array cache {folder} is damaged ({e}); delete {folder} to rebuild it") from None
    return out, info.get("notes", {})


def cached_splits(
    cache_dir: str | None, task: str, key: dict | None, build: Callable[[], dict[str, Split]]
) -> dict[str, Split]:
    """The splits for `key`, read from the cache, or built once by `build()` and cached.

    Args:
      cache_dir: root of the cache; "" or None: no caching (just build).
      task: sub-folder of cache_dir (and name in messages).
      key: JSON-able description of everything the arrays depend on; None when
        the source cannot be identified (e.g. mock data): no caching.
      build: () -> {"train"|"val"|"test": (tokens, labels)}.

    Returns:
      The splits; when cached, tokens are read-only memory maps.
    """
    return cached_splits_with_notes(cache_dir, task, key, lambda: (build(), {}))[0]


def cached_splits_with_notes(
    cache_dir: str | None, task: str, key: dict | None, build: Callable[[], tuple[dict[str, Split], dict]]
) -> tuple[dict[str, Split], dict]:
    """`cached_splits` for a reader that keeps notes beside the arrays.

    build: () -> (splits, notes), notes a JSON-able dict stored with the arrays and
    returned with them on every later load. Returns (splits, notes).
    """
    if not cache_dir or key is None:
        return build()
    folder = folder_for(cache_dir, task, key)
    if os.path.isdir(folder):
        logging.info("%s: reusing the arrays cached in %s", task, folder)
        return _read_splits(folder)
    splits, notes = build()
    if sorted(splits) != sorted(SPLITS):
        raise ValueError(f"{task}: build() returned splits {sorted(splits)}, expected {list(SPLITS)}")
    try:
        write_atomically(folder, lambda tmp: _write_splits(tmp, splits, key, notes))
    except OSError as e:  # a read-only or full cache still loads, just not faster next time
        logging.warning("%s: could not cache the arrays in %s (%s); set config.data.cache_dir elsewhere", task,
                        folder, e)
        return splits, notes
    logging.info("%s: cached the arrays in %s", task, folder)
    return _read_splits(folder)
