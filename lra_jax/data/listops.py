"""ListOps: generator with the LRA semantics and reader of the official TSV files.

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
  * Tree generation (`_generate_tree`): the root is at depth 1; a node at depth
    < max_depth is a digit with probability 0.75, otherwise an operator with
    randint(2, max_args) arguments (both ends inclusive), each generated at
    depth + 1; a node at depth max_depth is always a digit.
  * Length = number of tokens: digits, operator tokens and closing "]" (the
    parentheses below are not counted). A tree is kept only if
    min_length < length < max_length, and samples are deduplicated over all
    splits. LRA: max_depth 10, max_args 10, 500 < length < 2000, 96k / 2k / 2k
    train / val / test samples, 10 classes.

File format (official `lra_release/listops-1000/basic_{train,val,test}.tsv`,
and what `generate_splits` writes): tab separated, header line `Source<TAB>Target`,
one example per line. Source is the tree written with LRA's nesting parentheses:
an operator with arguments a1..ak is the left-nested pairs (op, a1), (.., a2),
..., (.., "]") and a pair (l, r) is written "( l r )", so [MAX 2 9 ] reads
`( ( ( [MAX 2 ) 9 ) ] )`. Target is the integer answer 0-9.

Tokenisation uses a FIXED vocabulary (`VOCAB`): id 0 = padding, 1-10 = the
digits 0-9, then [MIN [MAX [MED [SM [FIRST [LAST and "]"; parentheses are
dropped. Sequences are 0-padded and truncated to max_len as in LRA.

Differences from the LRA code:
  * LRA tokenises with the tfds `Tokenizer`, which splits on non-alphanumeric
    characters and so drops "]" (and the "[" of each operator) and builds its
    vocabulary from the data. Without "]" an expression is ambiguous:
    [MAX 1 [MIN 2 3 ] 4 ] = 4 and [MAX 1 [MIN 2 3 4 ] ] = 2 both read
    "MAX 1 MIN 2 3 4". We keep "]" (and the "[" inside each operator token).
  * LRA splits the samples in the iteration order of a Python set (arbitrary);
    we split in generation order (i.i.d.): the first num_train distinct trees
    are train, the next num_val val, the rest test. Generation is deterministic
    given the arguments (per-chunk seeded `random.Random`, never global state)
    and does not depend on the number of worker processes.
  * We stop building a tree as soon as its length reaches max_length, and we
    draw the operator before its arguments; neither changes the distribution of
    the accepted trees (see `_generate_tree`).

Generation costs about 1 ms of CPU per accepted tree at the LRA bounds (most
candidates are rejected: 75% of roots are a lone digit), so ~100 s for the
100k LRA samples on one core; large jobs are spread over worker processes (a
chunk of `_CHUNK` trees per seed (seed, chunk index)) behind a tqdm progress
bar. `load_splits` caches the generated files under a hash of the generator
arguments, written to a temporary directory and renamed into place, so an
interrupted generation is never mistaken for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
import warnings
from typing import Iterator

import numpy as np
from absl import logging

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
SPLITS: tuple[str, ...] = ("train", "val", "test")
HEADER = "Source\tTarget"

# LRA defaults (Tay et al. 2021, listops-1000).
LRA_NUM_TRAIN, LRA_NUM_VAL, LRA_NUM_TEST = 96_000, 2_000, 2_000
LRA_MIN_LENGTH, LRA_MAX_LENGTH, LRA_MAX_DEPTH, LRA_MAX_ARGS = 500, 2000, 10, 10
LRA_RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"

_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(VOCAB) if i != PAD_ID}
_DROP, _UNKNOWN = -1, -2
_LOOKUP: dict[str, int] = {**_TOKEN_IDS, "(": _DROP, ")": _DROP}
_VALUE_P = 0.25  # LRA: a node below max_depth is an operator iff random() <= VALUE_P
_CHUNK = 256  # accepted trees per generation chunk; fixed so results never depend on workers
_GENERATOR_VERSION = 1  # bump when the generated files change for the same arguments
_MAX_TRIALS_WITHOUT_ACCEPT = 2_000_000


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


# ----------------------------------------------------------------------------- generation


class _TooLong(Exception):
    """Raised inside `_generate_tree` once a tree reaches max_length tokens."""


def _generate_tree(
    rng: random.Random, max_depth: int, max_args: int, max_length: int
) -> tuple[str, int, int] | None:
    """One tree: (Source string, value, length), or None once its length reaches max_length.

    Follows LRA's `generate_tree`. Stopping a tree as soon as it reaches max_length
    tokens does not change the distribution of the accepted trees: such a tree
    would be rejected anyway (length < max_length fails), and the next tree is
    drawn from fresh random numbers either way. Drawing the operator before the
    arguments (LRA draws it after) does not either: it is independent of them.
    """
    rand = rng.random  # int(rand() * n): uniform on 0..n-1 up to a bias < 1e-15, 4x cheaper than randrange
    out: list[str] = []
    length = 0

    def node(depth: int) -> int:
        nonlocal length
        if depth < max_depth and rand() <= _VALUE_P:
            k = 2 + int(rand() * (max_args - 1))  # randint(2, max_args)
            op = OPERATORS[int(rand() * 4)]
            length += 2  # the operator token and its "]"
            if length >= max_length:
                raise _TooLong
            out.append("( " * (k + 1) + op + " ")
            args = [node(depth + 1)]
            for _ in range(k - 1):
                out.append(" ) ")
                args.append(node(depth + 1))
            out.append(" ) ] )")
            return apply_operator(op, args)
        length += 1
        if length >= max_length:
            raise _TooLong
        d = int(rand() * 10)
        out.append(DIGITS[d])
        return d

    try:
        value = node(1)
    except _TooLong:
        return None
    return "".join(out), value, length


def _generate_chunk(task: tuple[int, int, int, int, int, int, int]) -> list[tuple[str, int, int]]:
    """`_CHUNK` accepted trees (possibly repeating) from the RNG of chunk `chunk`."""
    seed, chunk, min_length, max_length, max_depth, max_args, count = task
    rng = random.Random(f"lra_jax.listops/{seed}/{chunk}")  # str seeds are hashed (sha512): stable
    accepted: list[tuple[str, int, int]] = []
    trials = 0
    while len(accepted) < count:
        trials += 1
        tree = _generate_tree(rng, max_depth, max_args, max_length)
        if tree is not None and tree[2] > min_length:
            accepted.append(tree)
        elif not accepted and trials >= _MAX_TRIALS_WITHOUT_ACCEPT:
            raise DataError(
                f"no ListOps tree with {min_length} < length < {max_length} in {trials} tries "
                f"(max_depth={max_depth}, max_args={max_args}); "
                "widen the length bounds or raise max_depth/max_args"
            )
    return accepted


def _max_tree_length(max_depth: int, max_args: int) -> int:
    length = 1  # a node at max_depth is a digit
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def _check_generator_args(num_train, num_val, num_test, min_length, max_length, max_depth, max_args) -> None:
    for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
        if value < 0:
            raise DataError(f"ListOps {name}={value} is negative; ask for 0 or more samples")
    if max_depth < 1 or max_args < 2:
        raise DataError(
            f"ListOps needs max_depth >= 1 and max_args >= 2, got {max_depth} and {max_args}; fix them"
        )
    if min_length < 0 or max_length <= min_length + 1:
        raise DataError(
            f"ListOps keeps min_length < length < max_length, so ({min_length}, {max_length}) "
            "admits no length; set max_length > min_length + 1"
        )
    if _max_tree_length(max_depth, max_args) <= min_length:
        raise DataError(
            f"ListOps trees with max_depth={max_depth}, max_args={max_args} have at most "
            f"{_max_tree_length(max_depth, max_args)} tokens, never more than min_length={min_length}; "
            "lower min_length"
        )


def _default_workers(total: int, min_length: int) -> int:
    # About 1 us of Python per token generated; processes pay off beyond a few seconds of work.
    if total * max(min_length, 1) < 2_000_000:
        return 1
    return max(1, min(os.cpu_count() or 1, 16))


def _chunks(
    seed: int,
    num_chunks: int,
    num_workers: int,
    *,
    min_length: int,
    max_length: int,
    max_depth: int,
    max_args: int,
) -> Iterator[list[tuple[str, int, int]]]:
    """Chunks 0, 1, ..., num_chunks - 1 in order, computed in-process or by `num_workers` processes.

    Worker j is `python -m lra_jax.data.listops --worker ...`, which streams
    chunks j, j + W, j + 2W, ... as JSON lines until it is stopped; we read them
    round robin. Fresh interpreters rather than multiprocessing: nothing is
    forked from a process that may hold JAX's threads, and the caller's main
    module is neither re-imported nor required to have a __main__ guard.
    """
    bounds = (min_length, max_length, max_depth, max_args)
    if num_workers <= 1:
        for chunk in range(num_chunks):
            yield _generate_chunk((seed, chunk, *bounds, _CHUNK))
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", __name__, "--worker", *map(str, (seed, j, num_workers, *bounds))],
            stdout=subprocess.PIPE,
            env=env,
        )
        for j in range(num_workers)
    ]
    try:
        for chunk in range(num_chunks):
            worker = workers[chunk % num_workers]
            line = worker.stdout.readline()
            if not line:
                raise RuntimeError(f"ListOps worker {worker.args} exited with status {worker.wait()}")
            trees = json.loads(line)
            if isinstance(trees, dict):
                raise DataError(trees["error"])
            yield [tuple(t) for t in trees]
    finally:
        for worker in workers:
            worker.kill()
            worker.stdout.close()
            worker.wait()


def _worker(argv: list[str]) -> None:
    """The worker process of `_chunks`: writes chunks first, first + step, ... to stdout."""
    seed, chunk, step, *bounds = (int(a) for a in argv)
    try:
        while True:
            try:
                line = json.dumps(_generate_chunk((seed, chunk, *bounds, _CHUNK)))
            except DataError as e:
                sys.stdout.write(json.dumps({"error": str(e)}) + "\n")
                return
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            chunk += step
    except (BrokenPipeError, KeyboardInterrupt):  # the parent is done with us, or Ctrl-C
        pass


def generate_samples(
    num_samples: int,
    *,
    min_length: int,
    max_length: int,
    max_depth: int = LRA_MAX_DEPTH,
    max_args: int = LRA_MAX_ARGS,
    seed: int = 0,
    num_workers: int | None = None,
    progress: bool = True,
) -> list[tuple[str, int, int]]:
    """`num_samples` distinct trees as (Source, Target, length), in generation order.

    Deterministic given the arguments other than `num_workers` and `progress`:
    chunk i of `_CHUNK` trees comes from its own RNG seeded by (seed, i), and the
    chunks are merged (and deduplicated) in chunk order.
    """
    from tqdm.auto import tqdm

    if num_samples <= 0:
        return []
    if num_workers is None:
        num_workers = _default_workers(num_samples, min_length)
    max_chunks = 20 * (-(-num_samples // _CHUNK)) + 20
    bounds = dict(min_length=min_length, max_length=max_length, max_depth=max_depth, max_args=max_args)
    seen: set[str] = set()
    samples: list[tuple[str, int, int]] = []
    with tqdm(total=num_samples, desc="ListOps", unit="tree", disable=not progress, mininterval=1.0) as bar:
        chunks = _chunks(seed, max_chunks, num_workers, **bounds)
        try:
            for chunk in chunks:
                before = len(samples)
                for sample in chunk:
                    if sample[0] not in seen:
                        seen.add(sample[0])
                        samples.append(sample)
                        if len(samples) == num_samples:
                            break
                bar.update(len(samples) - before)
                if len(samples) == num_samples:
                    return samples
        finally:
            chunks.close()
    raise DataError(
        f"only {len(samples)} distinct ListOps trees with {min_length} < length < {max_length} "
        f"(max_depth={max_depth}, max_args={max_args}) among {max_chunks * _CHUNK} accepted trees, "
        f"{num_samples} asked; "
        "widen the length bounds or ask for fewer samples"
    )


def generate_splits(
    out_dir: str,
    *,
    num_train: int,
    num_val: int,
    num_test: int,
    min_length: int,
    max_length: int,
    max_depth: int = LRA_MAX_DEPTH,
    max_args: int = LRA_MAX_ARGS,
    seed: int = 0,
    num_workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, str]:
    """Writes `basic_{train,val,test}.tsv` (official format) and `generator.json` into `out_dir`.

    Deterministic given the generator arguments (not on `num_workers`); no tree
    appears twice over all splits. Files are written into a temporary directory
    beside `out_dir` that is then renamed, so a killed run never leaves a partial
    dataset under `out_dir`.

    Args:
      out_dir: directory to create; it must not exist (or be empty) unless `overwrite`.
      num_train, num_val, num_test: samples per split (LRA: 96000, 2000, 2000).
      min_length, max_length: keep trees with min_length < length < max_length (LRA: 500, 2000).
      max_depth, max_args: tree depth and arguments per operator (LRA: 10, 10).
      seed: generation seed.
      num_workers: processes; None = 1 for small jobs, else every core (at most 16).
      progress: show a tqdm progress bar.
      overwrite: replace an existing `out_dir`.

    Returns:
      The path of each split's file, keyed "train", "val", "test".
    """
    _check_generator_args(num_train, num_val, num_test, min_length, max_length, max_depth, max_args)
    out_dir = os.path.abspath(out_dir)
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
        raise DataError(
            f"{out_dir} already exists and is not empty; "
            "delete it, choose another directory or pass overwrite=True"
        )
    start = time.perf_counter()
    samples = generate_samples(
        num_train + num_val + num_test,
        min_length=min_length,
        max_length=max_length,
        max_depth=max_depth,
        max_args=max_args,
        seed=seed,
        num_workers=num_workers,
        progress=progress,
    )
    logging.info("ListOps: generated %d trees in %.1f s", len(samples), time.perf_counter() - start)
    bounds = {"train": (0, num_train), "val": (num_train, num_train + num_val)}
    bounds["test"] = (num_train + num_val, len(samples))
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = _sibling(out_dir, "tmp")
    os.mkdir(tmp)  # unlike tempfile.mkdtemp, keeps the umask's permissions for a shared cache
    try:
        for split, (lo, hi) in bounds.items():
            with open(os.path.join(tmp, file_name(split)), "w", encoding="utf-8", newline="\n") as f:
                f.write(HEADER + "\n")
                f.writelines(f"{source}\t{target}\n" for source, target, _ in samples[lo:hi])
        lengths = np.array([s[2] for s in samples])
        meta = {
            "generator_version": _GENERATOR_VERSION,
            "args": _generator_args(
                num_train, num_val, num_test, min_length, max_length, max_depth, max_args, seed
            ),
            "length_mean": float(lengths.mean()) if len(lengths) else None,
            "length_min": int(lengths.min()) if len(lengths) else None,
            "length_max": int(lengths.max()) if len(lengths) else None,
            "label_counts": np.bincount([s[1] for s in samples], minlength=NUM_CLASSES).tolist(),
        }
        with open(os.path.join(tmp, "generator.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        _move_into_place(tmp, out_dir, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {split: os.path.join(out_dir, file_name(split)) for split in SPLITS}


def _sibling(path: str, kind: str) -> str:
    """A fresh hidden name beside `path`, e.g. dir/.name.tmp-1234-5f3a9c."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _move_into_place(tmp: str, out_dir: str, *, overwrite: bool) -> None:
    """Renames the finished directory `tmp` to `out_dir`."""
    if os.path.isdir(out_dir) and not os.listdir(out_dir):
        os.rmdir(out_dir)
    if os.path.exists(out_dir) and not overwrite:
        # Another process finished the same directory meanwhile; with the same
        # arguments its files are identical, so keep them (it may be reading them).
        logging.info("ListOps: %s appeared while generating; keeping it", out_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    elif os.path.exists(out_dir):
        old = _sibling(out_dir, "old")
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)


def _generator_args(num_train, num_val, num_test, min_length, max_length, max_depth, max_args, seed) -> dict:
    return dict(
        num_train=num_train,
        num_val=num_val,
        num_test=num_test,
        min_length=min_length,
        max_length=max_length,
        max_depth=max_depth,
        max_args=max_args,
        seed=seed,
    )


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
        with open(path, encoding="utf-8", newline="") as f:
            for lineno, line in enumerate(f, start=1):
                line = line.rstrip("\r\n")
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
            f"{path}:{lineno + 1}: not UTF-8 text ({e.reason}); fix the file or use the official basic_*.tsv"
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


def cache_key(**generator_args) -> str:
    """Short hash of the generator arguments and version: the cache directory's name."""
    blob = json.dumps({"version": _GENERATOR_VERSION, **generator_args}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def load_splits(
    data_dir: str,
    *,
    cache_dir: str,
    max_len: int,
    num_train: int = LRA_NUM_TRAIN,
    num_val: int = LRA_NUM_VAL,
    num_test: int = LRA_NUM_TEST,
    min_length: int = LRA_MIN_LENGTH,
    max_length: int = LRA_MAX_LENGTH,
    max_depth: int = LRA_MAX_DEPTH,
    max_args: int = LRA_MAX_ARGS,
    seed: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ListOps splits as {"train"|"val"|"test": (tokens [N, max_len] int32, labels [N] int32)}.

    With a non-empty `data_dir`, reads the official `basic_{train,val,test}.tsv`
    there (the generator arguments are then unused). Otherwise generates the
    splits into `cache_dir/listops/<cache_key>/` unless they are already there,
    and reads them; the token arrays are cached beside them per max_len.
    """
    if data_dir:
        paths = {split: os.path.join(data_dir, file_name(split)) for split in SPLITS}
        missing = [p for p in paths.values() if not os.path.isfile(p)]
        if missing:
            raise DataError(
                f"missing ListOps files: {', '.join(missing)}; download {LRA_RELEASE_URL}, unpack it and "
                "set --config.data_dir=<...>/lra_release/listops-1000, "
                "or leave data_dir empty to generate the data"
            )
        logging.info("ListOps: reading the official files in %s", data_dir)
        return {split: read_split(path, max_len) for split, path in paths.items()}

    args = _generator_args(num_train, num_val, num_test, min_length, max_length, max_depth, max_args, seed)
    _check_generator_args(num_train, num_val, num_test, min_length, max_length, max_depth, max_args)
    out_dir = os.path.join(cache_dir, "listops", cache_key(**args))
    paths = {split: os.path.join(out_dir, file_name(split)) for split in SPLITS}
    if os.path.isdir(out_dir):
        missing = [p for p in paths.values() if not os.path.isfile(p)]
        if missing:  # the directory appears only complete (atomic rename): someone removed files
            raise DataError(
                f"the ListOps cache {out_dir} lacks {', '.join(missing)}; delete {out_dir} to regenerate it"
            )
        logging.info("ListOps: reusing the generated splits in %s", out_dir)
    else:
        logging.info("ListOps: generating %s into %s", args, out_dir)
        generate_splits(out_dir, **args)
    return _read_cached(out_dir, paths, max_len)


def _read_cached(
    out_dir: str, paths: dict[str, str], max_len: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reads the generated splits through an .npz of their token arrays (per max_len)."""
    npz = os.path.join(out_dir, f"encoded-v{_GENERATOR_VERSION}-len{max_len}.npz")
    if os.path.isfile(npz):
        with np.load(npz) as z:
            result = {s: (z[f"{s}_tokens"].astype(np.int32), z[f"{s}_labels"]) for s in SPLITS}
            for s in SPLITS:
                truncated, total, longest = (int(v) for v in z[f"{s}_truncated"])
                if truncated:
                    _warn_truncated(paths[s], truncated, total, max_len, longest)
        return result
    result: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    arrays: dict[str, np.ndarray] = {}
    for split, path in paths.items():
        tokens, labels, truncated, longest = _read(path, max_len)
        if truncated:
            _warn_truncated(path, truncated, len(labels), max_len, longest)
        result[split] = (tokens, labels)
        arrays[f"{split}_tokens"], arrays[f"{split}_labels"] = tokens.astype(np.uint8), labels  # ids < 256
        arrays[f"{split}_truncated"] = np.array([truncated, len(labels), longest])  # to warn again on reload
    tmp = None
    try:
        tmp = _sibling(npz, "tmp")
        with open(tmp, "xb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, npz)
    except OSError as e:  # a read-only cache still loads, just not faster next time
        logging.warning("ListOps: could not cache the token arrays in %s (%s)", npz, e)
        if tmp and os.path.exists(tmp):
            os.remove(tmp)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"]:
        sys.exit(
            "usage: python -m lra_jax.data.listops --worker SEED FIRST STEP MIN_LEN MAX_LEN MAX_DEPTH MAX_ARGS"
        )
    _worker(sys.argv[2:])
