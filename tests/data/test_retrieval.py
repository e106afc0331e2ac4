"""Retrieval (AAN) reader: official TSV format, header detection, float labels, pairing, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import splits_equal
from lra_jax.data import retrieval, tasks
from lra_jax.errors import DataError

ROWS = [  # label, id1, id2, text1, text2 (as in new_aan_pairs.*.tsv)
    ("1.0", "P01-1001", "P02-2002", "ab", "cde"),
    ("0.0", "P03-3003", "P04-4004", "héllo world", "z"),
    ("1", "P05", "P06", "xyz", "q\"uoted 'text"),
]


def write(path, rows, header=False, crlf=False):
    end = "\r\n" if crlf else "\n"
    lines = (["label\tid1\tid2\ttext1\ttext2"] if header else []) + ["\t".join(r) for r in rows]
    path.write_bytes((end.join(lines) + end).encode("utf-8"))
    return str(path)


def ids(text: str, max_len: int) -> list[int]:
    raw = list(text.encode("utf-8"))[:max_len]
    return [b + 1 for b in raw] + [0] * (max_len - len(raw))


@pytest.mark.parametrize("header,crlf", [(False, False), (True, False), (False, True)])
def test_reads_pairs_labels_and_truncates(tmp_path, header, crlf):
    path = write(tmp_path / "pairs.tsv", ROWS, header=header, crlf=crlf)
    tokens, labels = retrieval.read_split(path, max_len=4)
    assert tokens.shape == (3, 2, 4) and tokens.dtype == np.int16
    assert labels.dtype == np.int32 and labels.tolist() == [1, 0, 1]
    for row, (_, _, _, t1, t2) in zip(tokens, ROWS):
        assert row[0].tolist() == ids(t1, 4)  # document 1 in [:, 0]
        assert row[1].tolist() == ids(t2, 4)  # document 2 in [:, 1]
    assert tokens[1, 0].tolist() == [ord("h") + 1, 0xC3 + 1, 0xA9 + 1, ord("l") + 1]  # bytes of "é"


@pytest.mark.parametrize(
    "bad,message",
    [
        ("1\tP1\tP2\tonly four", "expected 5 tab-separated fields"),
        ("2.0\tP1\tP2\ta\tb", "is not 0 or 1"),
        ("yes\tP1\tP2\ta\tb", "is not a number"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, message):
    path = tmp_path / "bad.tsv"
    path.write_text("\t".join(ROWS[0]) + "\n" + bad + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: .*{message}"):
        retrieval.read_split(str(path), max_len=8)


def write_official(folder) -> None:
    folder.mkdir(exist_ok=True)
    for split, name in retrieval.FILES.items():
        rows = ROWS[: {"train": 3, "val": 2, "test": 1}[split]]
        write(folder / name, rows, header=split == "test")


def test_load_splits_maps_eval_to_val(tmp_path):
    write_official(tmp_path)
    config = _config(str(tmp_path), max_len=16, cache_dir=str(tmp_path / "cache"))
    spec = tasks.get_task("retrieval")
    assert spec.dual and spec.vocab_size == retrieval.VOCAB_SIZE and spec.num_classes == 2
    splits = spec.load(*config)
    assert {k: len(v[1]) for k, v in splits.items()} == {"train": 3, "val": 2, "test": 1}
    assert splits["val"][0].shape == (2, 2, 16)


def _parse_counting(monkeypatch) -> list[str]:
    calls: list[str] = []
    parse = retrieval.read_split
    monkeypatch.setattr(retrieval, "read_split", lambda path, max_len: calls.append(path) or parse(path, max_len))
    return calls


def test_second_load_is_served_from_the_cache(tmp_path, monkeypatch):
    write_official(tmp_path / "tsv")
    load = {"max_len": 6, "cache_dir": str(tmp_path / "cache")}
    fresh = retrieval.load_splits(str(tmp_path / "tsv"), max_len=6, cache_dir="")  # no cache: parses
    first = retrieval.load_splits(str(tmp_path / "tsv"), **load)
    monkeypatch.setattr(retrieval, "read_split", lambda *a: pytest.fail("parsed the TSVs again"))
    again = retrieval.load_splits(str(tmp_path / "tsv"), **load)
    assert splits_equal(first, fresh) and splits_equal(again, fresh)
    assert isinstance(again["train"][0], np.memmap) and again["train"][0].shape == (3, 2, 6)
    assert len(os.listdir(tmp_path / "cache" / "retrieval")) == 1


def test_changed_file_or_max_len_rebuilds(tmp_path, monkeypatch):
    write_official(tmp_path)
    load = {"cache_dir": str(tmp_path / "cache")}
    retrieval.load_splits(str(tmp_path), max_len=6, **load)
    calls = _parse_counting(monkeypatch)
    train = tmp_path / retrieval.FILES["train"]
    os.utime(train, ns=(0, os.stat(train).st_mtime_ns + 10**9))  # touched: same bytes, new mtime
    retrieval.load_splits(str(tmp_path), max_len=6, **load)
    assert len(calls) == 3
    write(train, ROWS[:1])  # new content and size
    changed = retrieval.load_splits(str(tmp_path), max_len=6, **load)
    assert len(calls) == 6 and changed["train"][1].tolist() == [1]
    longer = retrieval.load_splits(str(tmp_path), max_len=9, **load)
    assert len(calls) == 9 and longer["train"][0].shape == (1, 2, 9)
    assert len(os.listdir(tmp_path / "cache" / "retrieval")) == 4  # one folder per (files, max_len)


def test_half_written_cache_of_a_killed_writer_is_ignored(tmp_path, monkeypatch):
    write_official(tmp_path)
    load = {"max_len": 6, "cache_dir": str(tmp_path / "cache")}
    first = retrieval.load_splits(str(tmp_path), **load)
    root = tmp_path / "cache" / "retrieval"
    (folder,) = os.listdir(root)
    os.rename(root / folder, root / f".tmp-{folder}-123-deadbeef")  # as a killed writer leaves it...
    os.remove(root / f".tmp-{folder}-123-deadbeef" / "info.json")  # ...before its last file
    calls = _parse_counting(monkeypatch)
    again = retrieval.load_splits(str(tmp_path), **load)
    assert len(calls) == 3 and splits_equal(again, first) and folder in os.listdir(root)


@pytest.mark.parametrize("data_dir", ["", "missing"])
def test_missing_files_name_the_path_and_the_command(tmp_path, data_dir):
    folder = str(tmp_path / data_dir) if data_dir else ""
    with pytest.raises(DataError) as error:
        tasks.get_task("retrieval").load(*_config(folder, max_len=8))
    message = str(error.value)
    assert "python -m lra_jax.data.prepare --task=retrieval" in message
    assert "--config.data.data_dir=" in message
    if folder:
        assert f"{folder}/new_aan_pairs.train.tsv" in message


def _config(data_dir: str, max_len: int, cache_dir: str = ""):
    return tasks.DataSettings(data_dir=data_dir, cache_dir=cache_dir), max_len
