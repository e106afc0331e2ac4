"""ListOps generator with the LRA semantics, written in the official TSV format.

The task, the vocabulary, the file format and the reader are in `listops`; this module
only makes data. Tree generation (`_generate_tree`) follows the LRA generator
(`lra/data/listops.py`): the root is at depth 1; a node at depth < max_depth is a digit
with probability 0.75, otherwise an operator (MIN, MAX, MED or SM) with
randint(2, max_args) arguments (both ends inclusive), each generated at depth + 1; a
node at depth max_depth is always a digit. A tree is kept only if
min_length < length < max_length (length = digits, operator tokens and closing "]"),
and samples are deduplicated over all splits. LRA: max_depth 10, max_args 10,
500 < length < 2000, 96k / 2k / 2k train / val / test samples.

Differences from the LRA code:
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
100k LRA samples on one core; large jobs are spread over worker processes
(`worker_pool`; a chunk of `_CHUNK` trees per seed (seed, chunk index)) behind a
progress bar (`lra_jax.progress`). `generate` writes the files once under
`<cache_dir>/listops/<hash of the arguments>/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from typing import Iterator

import numpy as np
from absl import logging

from lra_jax import progress as progress_bar
from lra_jax.data import array_cache, worker_pool
from lra_jax.data.listops import DIGITS, HEADER, NUM_CLASSES, OPERATORS, SPLITS, apply_operator, file_name
from lra_jax.errors import DataError

# LRA defaults (Tay et al. 2021, listops-1000).
LRA_NUM_TRAIN, LRA_NUM_VAL, LRA_NUM_TEST = 96_000, 2_000, 2_000
LRA_MIN_LENGTH, LRA_MAX_LENGTH, LRA_MAX_DEPTH, LRA_MAX_ARGS = 500, 2000, 10, 10

_VALUE_P = 0.25  # LRA: a node below max_depth is an operator iff random() <= VALUE_P
_CHUNK = 256  # accepted trees per generation chunk; fixed so results never depend on workers
_GENERATOR_VERSION = 1  # bump when the generated files change for the same arguments
_MAX_TRIALS_WITHOUT_ACCEPT = 2_000_000


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

    Worker j is `python -m lra_jax.data.listops_generator --worker ...` (a fresh
    interpreter, see `worker_pool`), which streams chunks j, j + W, j + 2W, ... as
    JSON lines until it is stopped; we read them round robin.
    """
    bounds = (min_length, max_length, max_depth, max_args)
    if num_workers <= 1:
        for chunk in range(num_chunks):
            yield _generate_chunk((seed, chunk, *bounds, _CHUNK))
        return
    argvs = [["--worker", seed, j, num_workers, *bounds] for j in range(num_workers)]
    for line in worker_pool.lines_round_robin(__name__, argvs, num_chunks):
        trees = json.loads(line)
        if isinstance(trees, dict):
            raise DataError(trees["error"])
        yield [tuple(t) for t in trees]


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
    if num_samples <= 0:
        return []
    if num_workers is None:
        num_workers = _default_workers(num_samples, min_length)
    max_chunks = 20 * (-(-num_samples // _CHUNK)) + 20
    bounds = dict(min_length=min_length, max_length=max_length, max_depth=max_depth, max_args=max_args)
    seen: set[str] = set()
    samples: list[tuple[str, int, int]] = []
    with progress_bar.bar(num_samples, "ListOps", unit="tree", disable=not progress) as bar:
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
    beside `out_dir` that is then renamed (`array_cache.write_atomically`), so a
    killed run never leaves a partial dataset under `out_dir`.

    Args:
      out_dir: directory to create; it must not exist (or be empty) unless `overwrite`.
      num_train, num_val, num_test: samples per split (LRA: 96000, 2000, 2000).
      min_length, max_length: keep trees with min_length < length < max_length (LRA: 500, 2000).
      max_depth, max_args: tree depth and arguments per operator (LRA: 10, 10).
      seed: generation seed.
      num_workers: processes; None = 1 for small jobs, else every core (at most 16).
      progress: show a progress bar (`lra_jax.progress`).
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
    if os.path.isdir(out_dir) and not os.listdir(out_dir):
        os.rmdir(out_dir)
    elif os.path.exists(out_dir) and overwrite:
        shutil.rmtree(out_dir)
    # else: another process wrote the same folder meanwhile: write_atomically keeps it (same arguments,
    # same files, and it may be reading them)

    def write(tmp: str) -> None:
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

    array_cache.write_atomically(out_dir, write)
    return {split: os.path.join(out_dir, file_name(split)) for split in SPLITS}


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


def generate(
    cache_dir: str,
    *,
    num_train: int = LRA_NUM_TRAIN,
    num_val: int = LRA_NUM_VAL,
    num_test: int = LRA_NUM_TEST,
    min_length: int = LRA_MIN_LENGTH,
    max_length: int = LRA_MAX_LENGTH,
    max_depth: int = LRA_MAX_DEPTH,
    max_args: int = LRA_MAX_ARGS,
    seed: int = 0,
    num_workers: int | None = None,
) -> str:
    """The folder of the splits for these arguments under `cache_dir/listops/`, generated once.

    Returns a folder holding `basic_{train,val,test}.tsv`, for `listops.read_splits`.
    """
    args = _generator_args(num_train, num_val, num_test, min_length, max_length, max_depth, max_args, seed)
    _check_generator_args(num_train, num_val, num_test, min_length, max_length, max_depth, max_args)
    blob = json.dumps({"version": _GENERATOR_VERSION, **args}, sort_keys=True)
    out_dir = os.path.join(cache_dir, "listops", hashlib.sha256(blob.encode()).hexdigest()[:12])
    if os.path.isdir(out_dir):
        missing = [file_name(s) for s in SPLITS if not os.path.isfile(os.path.join(out_dir, file_name(s)))]
        if missing:  # the folder appears only complete (atomic rename): someone removed files
            raise DataError(f"the ListOps cache {out_dir} lacks {', '.join(missing)}; delete {out_dir} to regenerate it")
        logging.info("ListOps: reusing the generated splits in %s", out_dir)
        return out_dir
    logging.info("ListOps: generating %s into %s", args, out_dir)
    generate_splits(out_dir, num_workers=num_workers, **args)
    return out_dir


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"]:
        sys.exit("usage: python -m lra_jax.data.listops_generator --worker SEED FIRST STEP MIN_LEN MAX_LEN "
                 "MAX_DEPTH MAX_ARGS")
    _worker(sys.argv[2:])
