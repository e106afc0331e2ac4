"""ListOps generator and reader: LRA semantics, file format, determinism, caching, errors."""

from __future__ import annotations

import os
import random
import re

import numpy as np
import pytest

from lra_jax.data import listops, listops_generator
from lra_jax.errors import DataError

MINI = dict(min_length=10, max_length=100, max_depth=10, max_args=10)
SIZES = dict(num_train=2000, num_val=300, num_test=300)


# ----------------------------------------------------------------------------- an independent reference


def parse_pairs(source: str):
    """Source -> LRA's nested pairs, by a stack over the parentheses (ints for digits)."""
    stack: list = []
    for tok in source.split():
        if tok == ")":
            right, left, opening = stack.pop(), stack.pop(), stack.pop()
            assert opening == "(", source
            stack.append((left, right))
        else:
            stack.append(int(tok) if tok.isdigit() else tok)
    assert len(stack) == 1, source
    return stack[0]


def lra_to_string(t) -> str:
    """LRA's to_string: a pair (l, r) is written '( l r )'."""
    if isinstance(t, tuple):
        return "( " + lra_to_string(t[0]) + " " + lra_to_string(t[1]) + " )"
    return str(t)


def lra_value(t):
    """LRA's to_value on the nested pairs, with numpy's median and sum."""
    if not isinstance(t, tuple):
        return t
    left, right = lra_value(t[0]), lra_value(t[1])
    if isinstance(left, str):  # an operator meets its first argument
        return (left, [right])
    if right == "]":
        op, args = left
        return {
            "[MIN": lambda: min(args),
            "[MAX": lambda: max(args),
            "[MED": lambda: int(np.median(args)),
            "[SM": lambda: int(np.sum(args) % 10),
        }[op]()
    return (left[0], left[1] + [right])


def shape_of(source: str) -> tuple[int, int]:
    """(depth, most arguments of one operator) by a stack over the flat tokens; the root is depth 1."""
    depth = most_args = 0
    stack: list[int] = []
    for tok in source.split():
        if tok.startswith("["):
            if stack:
                stack[-1] += 1
            stack.append(0)
            depth = max(depth, len(stack))
        elif tok == "]":
            most_args = max(most_args, stack.pop())
        elif tok.isdigit():
            if stack:
                stack[-1] += 1
            depth = max(depth, len(stack) + 1)
    return depth, most_args


def length_of(source: str) -> int:
    return sum(tok not in "()" for tok in source.split())


def read_rows(path) -> tuple[str, list[tuple[str, int]]]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[0], [(s, int(t)) for s, t in (line.split("\t") for line in lines[1:])]


@pytest.fixture(scope="module")
def mini_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("listops") / "mini"
    listops_generator.generate_splits(str(out), **SIZES, **MINI, seed=0, progress=False)
    return out


# ----------------------------------------------------------------------------- semantics


def test_reference_parser_reads_the_lra_example():
    source = "( ( ( [MAX 2 ) 9 ) ] )"
    assert parse_pairs(source) == ((("[MAX", 2), 9), "]")
    assert lra_value(parse_pairs(source)) == 9
    assert lra_value(parse_pairs("( ( ( [MED 1 ) 2 ) ] )")) == 1  # int(np.median([1, 2])) = int(1.5)


def test_operators_follow_lra_including_the_truncated_median():
    rng = np.random.default_rng(0)
    for _ in range(500):
        args = rng.integers(0, 10, size=rng.integers(2, 11)).tolist()
        assert listops.apply_operator("[MIN", args) == min(args)
        assert listops.apply_operator("[MAX", args) == max(args)
        assert listops.apply_operator("[MED", args) == int(np.median(args))
        assert listops.apply_operator("[SM", args) == sum(args) % 10
    assert listops.apply_operator("[MED", [3, 4, 8, 9]) == 6  # median 6.0
    assert listops.apply_operator("[MED", [3, 4, 9, 0]) == 3  # median 3.5 -> 3


def test_every_target_agrees_with_an_independent_evaluator(mini_dir):
    for split in listops.SPLITS:
        header, rows = read_rows(mini_dir / listops.file_name(split))
        assert header == "Source\tTarget"
        for source, target in rows:
            tree = parse_pairs(source)
            assert lra_to_string(tree) == source  # exactly LRA's parenthesisation
            assert lra_value(tree) == target, source


def test_lengths_obey_the_strict_bounds_and_split_sizes(mini_dir):
    for split in listops.SPLITS:
        _, rows = read_rows(mini_dir / listops.file_name(split))
        assert len(rows) == SIZES[f"num_{split}"]
        lengths = [length_of(s) for s, _ in rows]
        assert MINI["min_length"] < min(lengths) and max(lengths) < MINI["max_length"]


def test_depth_and_arguments_obey_the_limits(tmp_path):
    out = tmp_path / "small"
    listops_generator.generate_splits(
        str(out),
        num_train=300,
        num_val=50,
        num_test=50,
        min_length=5,
        max_length=60,
        max_depth=3,
        max_args=4,
        progress=False,
    )
    shapes = []
    for split in listops.SPLITS:
        _, rows = read_rows(out / listops.file_name(split))
        for source, target in rows:
            depth, most_args = shape_of(source)
            assert 2 <= depth <= 3 and 2 <= most_args <= 4, source
            assert lra_value(parse_pairs(source)) == target
            assert 5 < length_of(source) < 60
            shapes.append((depth, most_args))
    assert (3, 4) in shapes  # both limits are reached, not just respected


def test_no_duplicates_across_splits(mini_dir):
    sources = [s for split in listops.SPLITS for s, _ in read_rows(mini_dir / listops.file_name(split))[1]]
    assert len(sources) == len(set(sources)) == sum(SIZES.values())


def test_dedup_finds_every_tree_of_a_small_space_and_then_reports_exhaustion(tmp_path):
    # max_depth=2, max_args=2, 3 < length < 5: exactly the 4 * 10 * 10 trees [OP d d ].
    small = dict(min_length=3, max_length=5, max_depth=2, max_args=2)
    samples = listops_generator.generate_samples(400, **small, progress=False)
    assert len({s for s, _, _ in samples}) == 400
    with pytest.raises(DataError, match="only 400 distinct ListOps trees"):
        listops_generator.generate_samples(401, **small, progress=False)


def test_label_distribution_of_mini_samples(mini_dir):
    files = [str(mini_dir / listops.file_name(s)) for s in listops.SPLITS]
    labels = np.concatenate([listops.read_split(path, 100)[1] for path in files])
    counts = np.bincount(labels, minlength=10)
    # Seen: 2600 samples with 10 < len < 100: majority class 0 or 9 at ~15% (the LRA setting: ~17%).
    assert counts.min() > 0
    assert 0.10 < counts.max() / counts.sum() < 0.25
    assert {int(counts.argmax())} <= {0, 9}  # MIN pulls to 0, MAX to 9


# ----------------------------------------------------------------------------- determinism and files


def test_generation_is_deterministic_and_seeded(tmp_path):
    args = dict(num_train=200, num_val=20, num_test=20, **MINI, progress=False)
    listops_generator.generate_splits(str(tmp_path / "a"), seed=3, **args)
    listops_generator.generate_splits(str(tmp_path / "b"), seed=3, **args)
    listops_generator.generate_splits(str(tmp_path / "c"), seed=4, **args)
    for split in listops.SPLITS:
        name = listops.file_name(split)
        a, b, c = ((tmp_path / d / name).read_bytes() for d in "abc")
        assert a == b
        assert a != c


def test_result_does_not_depend_on_the_number_of_workers():
    args = dict(**MINI, seed=1, progress=False)
    n = 3 * listops_generator._CHUNK + 17  # several chunks, the last one partly used
    in_process = listops_generator.generate_samples(n, num_workers=1, **args)
    assert listops_generator.generate_samples(n, num_workers=2, **args) == in_process


def test_a_failed_generation_leaves_nothing_behind(tmp_path, monkeypatch):
    real_open = open

    def killed(path, *args, **kwargs):
        if "basic_test" in str(path):  # the last split's file, inside the temporary folder
            raise KeyboardInterrupt
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", killed)
    with pytest.raises(KeyboardInterrupt):
        listops_generator.generate(str(tmp_path), num_train=50, num_val=5, num_test=5, **MINI)
    assert os.listdir(tmp_path / "listops") == []  # neither the final directory nor the temporary one


def test_existing_output_needs_overwrite(tmp_path):
    args = dict(num_train=20, num_val=5, num_test=5, **MINI, progress=False)
    out = tmp_path / "out"
    listops_generator.generate_splits(str(out), **args)
    with pytest.raises(DataError, match="already exists.*overwrite=True"):
        listops_generator.generate_splits(str(out), **args)
    listops_generator.generate_splits(str(out), seed=1, overwrite=True, **args)
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert sorted(os.listdir(out)) == ["basic_test.tsv", "basic_train.tsv", "basic_val.tsv", "generator.json"]


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(min_length=10, max_length=11), "admits no length"),
        (dict(min_length=20, max_length=100, max_depth=2, max_args=5), "at most 7 tokens"),
        (dict(min_length=10, max_length=100, max_args=1), "max_args >= 2"),
        (dict(min_length=10, max_length=100, num_val=-1), "num_val=-1"),
    ],
)
def test_impossible_generator_arguments_are_refused(tmp_path, bad, match):
    args = dict(num_train=10, num_val=1, num_test=1, progress=False) | bad
    with pytest.raises(DataError, match=match):
        listops_generator.generate_splits(str(tmp_path / "x"), **args)


# ----------------------------------------------------------------------------- loading and caching


def load(cache_dir, max_len, **generator_args):
    """What `tasks` does for ListOps without data_dir: generate once, then read through the cache."""
    folder = listops_generator.generate(cache_dir, **generator_args)
    return folder, listops.read_splits(folder, cache_dir=cache_dir, max_len=max_len)


def test_generated_splits_are_made_once_then_read_from_the_array_cache(tmp_path, monkeypatch):
    calls = []
    generate = listops_generator.generate_splits
    monkeypatch.setattr(listops_generator, "generate_splits", lambda *a, **k: calls.append(a) or generate(*a, **k))
    args = dict(num_train=100, num_val=10, num_test=10, **MINI, seed=2)
    out_dir, first = load(str(tmp_path), 100, **args)
    assert calls == [(out_dir,)] and os.path.dirname(out_dir) == str(tmp_path / "listops")
    mtimes = {name: os.stat(os.path.join(out_dir, name)).st_mtime_ns for name in os.listdir(out_dir)}

    with monkeypatch.context() as patch:
        patch.setattr(listops, "_read", lambda *a: pytest.fail("read the files again instead of the cache"))
        again = load(str(tmp_path), 100, **args)[1]
    assert len(calls) == 1  # reused, not regenerated
    assert {name: os.stat(os.path.join(out_dir, name)).st_mtime_ns for name in mtimes} == mtimes
    for split in listops.SPLITS:
        tokens, labels = first[split]
        assert tokens.shape == (args[f"num_{split}"], 100) and tokens.dtype == listops.TOKEN_DTYPE
        assert labels.shape == (args[f"num_{split}"],) and labels.dtype == np.int32
        np.testing.assert_array_equal(tokens, again[split][0])
        np.testing.assert_array_equal(labels, again[split][1])
        np.testing.assert_array_equal(
            tokens, listops.read_split(os.path.join(out_dir, listops.file_name(split)), 100)[0]
        )

    for reload in (False, True):  # another max_len: same files; decoded once, then from its own cache
        with monkeypatch.context() as patch, \
                pytest.warns(UserWarning, match="ListOps sequences are longer than max_len=64") as record:
            if reload:  # warns again from what the cache stored
                patch.setattr(listops, "_read", lambda *a: pytest.fail("read the files again instead of the cache"))
            load(str(tmp_path), 64, **args)
        assert any(re.search(r"basic_train.tsv: \d+ of 100 ListOps.*\(longest \d+\)", str(w.message))
                   for w in record)
    assert len(os.listdir(tmp_path / "listops")) == 3  # the generated files, arrays for 100 and for 64
    assert load(str(tmp_path), 100, **(args | dict(seed=3)))[0] != out_dir  # another argument: another folder


def test_missing_official_files_are_named(tmp_path):
    (tmp_path / "basic_train.tsv").write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n")
    with pytest.raises(DataError) as err:
        listops.read_splits(str(tmp_path), cache_dir=str(tmp_path / "cache"), max_len=16)
    message = str(err.value)
    assert str(tmp_path / "basic_val.tsv") in message and str(tmp_path / "basic_test.tsv") in message
    assert "basic_train.tsv" not in message
    assert "lra_release.gz" in message and "--config.data.data_dir=" in message and "\n" not in message


def test_official_files_are_read_from_data_dir(tmp_path):
    for split, target in zip(listops.SPLITS, (9, 2, 5)):
        text = f"Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t{target}\n"
        (tmp_path / listops.file_name(split)).write_text(text)
    splits = listops.read_splits(str(tmp_path), cache_dir=str(tmp_path / "cache"), max_len=6)
    assert [int(splits[s][1][0]) for s in listops.SPLITS] == [9, 2, 5]
    assert os.listdir(tmp_path / "cache" / "listops")[0].startswith("arrays-")  # decoded arrays, nothing generated


# ----------------------------------------------------------------------------- tokens and the reader


def test_vocabulary_is_fixed():
    assert listops.PAD_ID == 0 and listops.VOCAB[0] == "<pad>"
    assert listops.VOCAB_SIZE == len(listops.VOCAB) == 18 and listops.NUM_CLASSES == 10
    assert listops.VOCAB[1:11] == tuple("0123456789")
    assert set(listops.VOCAB[11:]) == {"[MIN", "[MAX", "[MED", "[SM", "[FIRST", "[LAST", "]"}
    ids = {tok: i for i, tok in enumerate(listops.VOCAB)}
    assert listops.encode("( ( ( [MAX 2 ) 9 ) ] )") == [ids["[MAX"], ids["2"], ids["9"], ids["]"]]
    assert listops.encode("( ( [FIRST 0 ) ] )") == [ids["[FIRST"], 1, ids["]"]]
    with pytest.raises(DataError, match="unknown ListOps token 'MAX'"):
        listops.encode("( ( ( MAX 2 ) 9 ) ] )")


def test_reader_on_a_hand_written_official_file(tmp_path):
    path = tmp_path / "basic_test.tsv"
    lines = [
        "Source\tTarget",
        "( ( ( [MAX 2 ) 9 ) ] )\t9",
        "( ( ( ( [SM 5 ) ( ( ( [MIN 7 ) 3 ) ] ) ) 8 ) ] )\t6",
        "( ( ( [MED 1 ) 2 ) ] )\t1",
    ]
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")  # csv.writer's line ends, as in lra_release
    tokens, labels = listops.read_split(str(path), max_len=12)
    enc = {tok: i for i, tok in enumerate(listops.VOCAB)}
    expected = [
        ["[MAX", "2", "9", "]"],
        ["[SM", "5", "[MIN", "7", "3", "]", "8", "]"],
        ["[MED", "1", "2", "]"],
    ]
    assert tokens.dtype == np.int32 and labels.dtype == np.int32 and tokens.shape == (3, 12)
    for row, toks in zip(tokens, expected):
        assert row[: len(toks)].tolist() == [enc[t] for t in toks]
        assert not row[len(toks) :].any()
    assert labels.tolist() == [9, 6, 1]
    assert [lra_value(parse_pairs(line.split("\t")[0])) for line in lines[1:]] == [9, 6, 1]


@pytest.mark.parametrize(
    "content, line, match",
    [
        ("Source,Target\n( ( [MAX 2 ) ] )\t2\n", 1, "header"),
        ("", 1, "an empty file"),
        ("( ( [MAX 2 ) ] )\t2\n", 1, "header"),
        (
            "Source\tTarget\n( ( [MAX 2 ) ] )\t2\n( ( [MAX 2 ) ( [FOO 1 ] )\t2\n",
            3,
            "unknown ListOps token '\\[FOO'",
        ),
        ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9.0\n", 2, "not an integer in 0-9"),
        ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t12\n", 2, "not an integer in 0-9"),
        ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t-1\n", 2, "not an integer in 0-9"),
        ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\n", 2, "expected 2 tab-separated columns"),
        ("Source\tTarget\n( ( [MAX 2 ) ] )\t2\t7\n", 2, "expected 2 tab-separated columns"),
        ("Source\tTarget\n( )\t2\n", 2, "empty Source"),
    ],
)
def test_malformed_files_name_the_file_and_line(tmp_path, content, line, match):
    path = tmp_path / "basic_train.tsv"
    path.write_text(content)
    with pytest.raises(DataError, match=match) as err:
        listops.read_split(str(path), max_len=16)
    assert f"{path}:{line}:" in str(err.value)
    assert "\n" not in str(err.value) and ("fix" in str(err.value) or "regenerate" in str(err.value))


def test_reader_agrees_with_encode_on_odd_spacing_and_garbage(mini_dir):
    """The reader's fast path (canonical spacing) and its fallback both match `encode`."""
    rng = random.Random(0)
    _, rows = read_rows(mini_dir / listops.file_name("val"))
    alphabet = "()[]MINAXEDSFRTL0123456789 x\x01\u0663"
    checked = {"ok": 0, "error": 0}
    for source, target in rows:
        for _ in range(4):
            chars = list(source)
            i = rng.randrange(len(chars))
            kind = rng.randrange(4)
            if kind == 0:
                chars.insert(i, rng.choice(alphabet))
            elif kind == 1:
                del chars[i]
            elif kind == 2:
                chars[i] = rng.choice(alphabet)
            # kind 3: unchanged
            mutated = "".join(chars)
            try:
                expected = listops.encode(mutated)
            except DataError:
                expected = []
            if expected:
                ids, label = listops._parse_line(f"{mutated}\t{target}", "f:2")
                assert ids.tolist() == expected and label == target, mutated
                checked["ok"] += 1
            else:
                with pytest.raises(DataError, match="^f:2: "):
                    listops._parse_line(f"{mutated}\t{target}", "f:2")
                checked["error"] += 1
    assert min(checked.values()) > 100  # both outcomes were exercised
    spaced = "  (   ( ( [MAX 2 )  9 ) ] ) "
    assert listops._parse_line(f"{spaced}\t9", "f:2")[0].tolist() == listops.encode("( ( ( [MAX 2 ) 9 ) ] )")


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        listops.read_split(str(tmp_path / "nope.tsv"), max_len=16)


def test_truncation_to_max_len_is_counted_and_warned(mini_dir):
    path = str(mini_dir / listops.file_name("val"))
    full, labels = listops.read_split(path, max_len=100)
    lengths = (full != listops.PAD_ID).sum(axis=1)
    over = int((lengths > 16).sum())
    assert 0 < over < len(lengths)
    message = f"{over} of {len(lengths)} ListOps sequences are longer than max_len=16"
    with pytest.warns(UserWarning, match=message):
        short, short_labels = listops.read_split(path, max_len=16)
    assert short.shape == (len(lengths), 16)
    np.testing.assert_array_equal(short, full[:, :16])
    np.testing.assert_array_equal(short_labels, labels)
