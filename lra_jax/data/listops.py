"""ListOps: the task, its vocabulary, and the reader of the TSV files (official or generated).

ListOps (Nangia & Bowman 2018, "ListOps: A Diagnostic Dataset for Latent Tree
Learning", NAACL SRW) is the hierarchical-reasoning task of the Long Range Arena
(Tay et al. 2021, "Long Range Arena: A Benchmark for Efficient Transformers",
ICLR; task "listops-1000"). An expression is a tree of list operations on digits:

    [MAX 2 9 [MIN 4 7 ] 0 ]   ->   9

Semantics (those of the LRA generator, `lra/data/listops.py`):
  * Digits 0-9; operators MIN, MAX, MED (median) and SM (sum modulo 10), all
    closed by "]". MED is `int(np.median(args))`: a median ending in .5 is
    truncated, e.g. [MED 1 2 ] = int(1.5) = 1 (the arguments are non-negative,
    so this is the floor). FIRST and LAST exist in the LRA code but its
    generator never uses them; the vocabulary still knows them.
  * Length = number of tokens: digits, operator tokens and closing "]" (the
    parentheses below are not counted). 10 classes.

File format (official `lra_release/listops-1000/basic_{train,val,test}.tsv`,
and what `listops_generator` writes): tab separated, header line `Source<TAB>Target`,
one example per line. Source is the tree written with LRA's nesting parentheses:
an operator with arguments a1..ak is the left-nested pairs (op, a1), (.., a2),
..., (.., "]") and a pair (l, r) is written "( l r )", so [MAX 2 9 ] reads
`( ( ( [MAX 2 ) 9 ) ] )`. Target is the integer answer 0-9.

Tokenisation uses a FIXED vocabulary (`VOCAB`): id 0 = padding, 1-10 = the
digits 0-9, then [MIN [MAX [MED [SM [FIRST [LAST and "]"; parentheses are
dropped. Sequences are 0-padded and truncated to max_len as in LRA.

Difference from the LRA code: LRA tokenises with the tfds `Tokenizer`, which splits on
non-alphanumeric characters and so drops "]" (and the "[" of each operator) and builds its
vocabulary from the data. Without "]" an expression is ambiguous:
[MAX 1 [MIN 2 3 ] 4 ] = 4 and [MAX 1 [MIN 2 3 4 ] ] = 2 both read "MAX 1 MIN 2 3 4".
We keep "]" (and the "[" inside each operator token).

Cache (`array_cache`): `read_splits` decodes a folder's three files once per max_len into
`<cache_dir>/listops/arrays-<key>/` (tokens uint8, ids < 256) and memory-maps them on later
loads. The key hashes the files' absolute paths, sizes and modification times, max_len and the
format version. How many sequences max_len cut is stored with the arrays, so every load warns.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from absl import logging

from lra_jax.data import array_cache
from lra_jax.errors import DataError

DIGITS: tuple[str, ...] = tuple(str(d) for d in range(10))
OPERATORS: tuple[str, ...] = ("[MIN", "[MAX", "[MED", "[SM")  # those the LRA generator draws from
EXTRA_OPERATORS: tuple[str, ...] = ("[FIRST", "[LAST")  # in the LRA code, never generated
END = "]"
PAD = "<pad>"
VOCAB: tuple[str, ...] = (PAD, *DIGITS, *OPERATORS, *EXTRA_OPERATORS, END)
PAD_ID = 0
VOCAB_SIZE = len(VOCAB)  # 18
NUM_CLASSES = 10
SPLITS = array_cache.SPLITS
HEADER = "Source\tTarget"
TOKEN_DTYPE = np.uint8  # of the splits `read_splits` returns (ids < VOCAB_SIZE)
LRA_RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"

_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(VOCAB) if i != PAD_ID}
_DROP, _UNKNOWN = -1, -2
_LOOKUP: dict[str, int] = {**_TOKEN_IDS, "(": _DROP, ")": _DROP}
_FORMAT_VERSION = 1  # bump when the cached arrays change for the same files


def file_name(split: str) -> str:
    """The official file name of `split` ("train", "val" or "test")."""
    return f"basic_{split}.tsv"


def encode(source: str) -> list[int]:
    """Token ids of a Source string (parentheses dropped, no padding).

    Raises:
        DataError: on a token outside `VOCAB`.
    """
    ids = []
    for tok in source.split():
        i = _LOOKUP.get(tok, _UNKNOWN)
        if i == _UNKNOWN:
            raise DataError(_unknown_token_message(tok))
        if i != _DROP:
            ids.append(i)
    return ids


def _unknown_token_message(tok: str) -> str:
    known = " ".join(VOCAB[1:])
    return f"unknown ListOps token {tok!r} (known: {known} and parentheses); fix or regenerate the file"


def apply_operator(op: str, args: list[int]) -> int:
    """The value of operator token `op` (e.g. "[MED") on the digits `args`, as in LRA."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    if op == "[MED":  # int(np.median(args)): a .5 median is truncated (args >= 0: floor)
        s = sorted(args)
        m = len(s) // 2
        return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2
    if op == "[FIRST":
        return args[0]
    if op == "[LAST":
        return args[-1]
    raise ValueError(f"unknown ListOps operator {op!r}")


# ----------------------------------------------------------------------------- reading


def read_split(path: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Reads one TSV (ours or the official LRA file) into token ids and labels.

    Args:
      path: a `Source<TAB>Target` file with that header line.
      max_len: sequence length; longer sequences are truncated (as in LRA, with a warning).

    Returns:
      tokens int32 [N, max_len] (0 = padding) and labels int32 [N].

    Raises:
      DataError: naming the file and line, on a missing or wrong header, a line
        without exactly two tab-separated columns, an unknown token, an empty
        Source or a Target that is not an integer in 0-9.
    """
    tokens, labels, truncated, longest = _read(path, max_len)
    if truncated:
        _warn_truncated(path, truncated, len(labels), max_len, longest)
    return tokens, labels


def _read(path: str, max_len: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """`read_split` without the warning: also returns the truncated count and the longest length."""
    if max_len < 1:
        raise DataError(f"ListOps max_len={max_len}; set it to 1 or more")
    rows: list[np.ndarray] = []
    labels: list[int] = []
    truncated = longest = 0
    lineno = 0
    try:
        # bytes, decoded line by line: a text file decodes ahead in blocks, and its first bad byte
        # would be reported at the line last read, not at its own
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                line = raw.decode("utf-8").rstrip("\r\n")
                if lineno == 1:
                    if line.lstrip("\ufeff") != HEADER:
                        raise DataError(
                            f"{path}:1: expected the header 'Source<TAB>Target', got {line[:40]!r}; "
                            "fix the header or regenerate the file"
                        )
                    continue
                if not line.strip():
                    continue
                ids, label = _parse_line(line, f"{path}:{lineno}")
                longest = max(longest, ids.size)
                if ids.size > max_len:
                    truncated += 1
                    ids = ids[:max_len]
                rows.append(ids)
                labels.append(label)
    except FileNotFoundError:
        raise DataError(
            f"ListOps file {path} does not exist; generate it or point data_dir at lra_release/listops-1000"
        ) from None
    except IsADirectoryError:
        raise DataError(f"ListOps file {path} is a directory; point at the basic_*.tsv file inside") from None
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}:{lineno}: not UTF-8 text ({e.reason}); fix the file or use the official basic_*.tsv"
        ) from None
    if lineno == 0:
        raise DataError(
            f"{path}:1: expected the header 'Source<TAB>Target', got an empty file; fix or regenerate it"
        )
    tokens = np.zeros((len(rows), max_len), dtype=np.int32)
    for i, ids in enumerate(rows):
        tokens[i, : ids.size] = ids
    return tokens, np.asarray(labels, dtype=np.int32), truncated, longest


# The fast path of `_parse_line`: each operator becomes one stand-in character; a line
# in the canonical form (single-character tokens separated by single spaces) then has
# spaces at every odd position, and its even positions, less parentheses, are the ids.
_STAND_INS = {op: chr(1 + i) for i, op in enumerate((*OPERATORS, *EXTRA_OPERATORS))}
_NO_PARENS = str.maketrans("", "", "()")
_CHAR_IDS = np.full(256, _UNKNOWN, dtype=np.int32)
for _tok, _id in _TOKEN_IDS.items():
    _CHAR_IDS[ord(_STAND_INS.get(_tok, _tok))] = _id


def _parse_line(line: str, where: str) -> tuple[np.ndarray, int]:
    """Token ids and label of one `Source<TAB>Target` line; `where` = "path:line" for errors."""
    fields = line.split("\t")
    if len(fields) != 2:
        raise DataError(
            f"{where}: expected 2 tab-separated columns (Source, Target), got {len(fields)}; "
            "fix the line or regenerate the file"
        )
    source, target = fields
    target = target.strip()
    if not (target.isascii() and target.isdigit() and int(target) < NUM_CLASSES):
        raise DataError(
            f"{where}: Target {target!r} is not an integer in 0-{NUM_CLASSES - 1}; "
            "fix the line or regenerate the file"
        )
    ids = None
    if source.isascii() and not any(c in source for c in _STAND_INS.values()):
        short = source
        for op, c in _STAND_INS.items():
            short = short.replace(op, c)
        spaces = short[1::2]
        if spaces.count(" ") == len(spaces):
            fast = _CHAR_IDS[np.frombuffer(short[0::2].translate(_NO_PARENS).encode("ascii"), dtype=np.uint8)]
            if fast.size and (fast != _UNKNOWN).all():
                ids = fast
    if ids is None:  # any other spacing, or an error to name precisely
        toks = source.split()
        ids = np.array([_LOOKUP.get(t, _UNKNOWN) for t in toks], dtype=np.int32)
        if (ids == _UNKNOWN).any():
            raise DataError(f"{where}: {_unknown_token_message(toks[int(np.argmax(ids == _UNKNOWN))])}")
        ids = ids[ids != _DROP]
        if ids.size == 0:
            raise DataError(f"{where}: empty Source; fix the line or regenerate the file")
    return ids, int(target)


def _warn_truncated(path: str, truncated: int, total: int, max_len: int, longest: int) -> None:
    message = (
        f"{path}: {truncated} of {total} ListOps sequences are longer than max_len={max_len} "
        f"(longest {longest}) and were truncated; raise max_len to keep them whole"
    )
    warnings.warn(message, stacklevel=3)


# ----------------------------------------------------------------------------- loading


def read_splits(data_dir: str, *, cache_dir: str, max_len: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The splits in `data_dir` (official or generated), decoded once per max_len and cached.

    Returns:
      {"train"|"val"|"test": (tokens uint8 [N, max_len] (0 = padding), labels int32 [N])};
      when cached, the tokens are read-only memory maps.

    Warns (every load) when max_len cuts sequences.
    """
    paths = {split: os.path.join(data_dir, file_name(split)) for split in SPLITS}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        raise DataError(
            f"missing ListOps files: {', '.join(missing)}; download {LRA_RELEASE_URL}, unpack it and "
            "set --config.data.data_dir=<...>/lra_release/listops-1000, "
            "or leave data_dir empty to generate the data"
        )
    if max_len < 1:
        raise DataError(f"ListOps max_len={max_len}; set it to 1 or more")

    def build() -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
        logging.info("ListOps: reading %s", data_dir)
        splits, notes = {}, {}
        for split, path in paths.items():
            tokens, labels, truncated, longest = _read(path, max_len)
            splits[split] = (tokens.astype(TOKEN_DTYPE), labels)
            notes[split] = {"truncated": truncated, "total": len(labels), "longest": longest}
        return splits, notes

    key = {"v": _FORMAT_VERSION, "files": array_cache.describe_files(paths.values()), "max_len": max_len}
    splits, notes = array_cache.cached_splits_with_notes(cache_dir, "listops", key, build)
    for split in SPLITS:
        if notes[split]["truncated"]:
            _warn_truncated(paths[split], notes[split]["truncated"], notes[split]["total"], max_len,
                            notes[split]["longest"])
    return splits
