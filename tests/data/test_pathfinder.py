"""Pathfinder/Path-X: reader of the official layout, split, cache, generator (connectivity, balance, seeds)."""

from __future__ import annotations

import os
from collections import deque

import numpy as np
import pytest
from PIL import Image

from lra_jax.data import pathfinder, pathfinder_generator, tasks
from lra_jax.errors import DataError

GEN = {"image_size": 32, "contour_length": 14, "seed": 0}


def write_official(root, n: int = 20, size: int = 8, empty: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """n images in the official layout (2 batches), image `empty` an empty file; returns pixels, labels."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(n, size, size), dtype=np.uint8)
    pixels[:, 0, 0] = np.arange(n)  # identifies the image
    labels = np.arange(n) % 2
    os.makedirs(root / "metadata")
    for batch in (0, 1):
        os.makedirs(root / "imgs" / str(batch))
        lines = []
        for i in range(batch * n // 2, (batch + 1) * n // 2):
            path = root / "imgs" / str(batch) / f"sample_{i}.png"
            if i == empty:
                path.write_bytes(b"")
            else:
                Image.fromarray(pixels[i]).save(path)
            lines.append(f"imgs/{batch} sample_{i}.png {i} {labels[i]} 14 2\n")
        (root / "metadata" / f"{batch}.npy").write_text("".join(lines))
    return pixels, labels


def test_reads_official_layout_skips_empty_and_splits(tmp_path):
    pixels, labels = write_official(tmp_path / "curv_contour_length_14")
    splits = pathfinder.read_splits(str(tmp_path / "curv_contour_length_14"), cache_dir=str(tmp_path / "cache"),
                                    max_len=64)
    sizes = {k: len(v[1]) for k, v in splits.items()}
    assert sizes == {"train": 15, "val": 2, "test": 2}  # 19 readable images, 80/10/10
    seen = []
    for tokens, split_labels in splits.values():
        assert tokens.shape[1] == 64 and tokens.dtype == np.int16 and split_labels.dtype == np.int32
        for row, label in zip(np.asarray(tokens), split_labels):
            i = int(row[0]) - 1  # pixel (0, 0) + 1 identifies the image
            seen.append(i)
            assert row.tolist() == (pixels[i].reshape(-1).astype(int) + 1).tolist()  # id = pixel + 1, row-major
            assert label == labels[i]
    assert sorted(seen) == [i for i in range(20) if i != 3]  # the empty PNG is skipped, nothing else
    order = pathfinder.split_indices(19, 0)
    assert np.array_equal(np.sort(np.concatenate(list(order.values()))), np.arange(19))


def test_cache_is_reused_and_max_len_pads(tmp_path, monkeypatch):
    write_official(tmp_path / "d")
    first = pathfinder.read_splits(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_len=64)
    monkeypatch.setattr(pathfinder, "read_images", lambda *a, **k: pytest.fail("decoded the PNGs again"))
    again = pathfinder.read_splits(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_len=70)
    for split in pathfinder.SPLITS:
        assert np.array_equal(again[split][0][:, :64], first[split][0])
        assert (again[split][0][:, 64:] == 0).all()
    assert [n for n in os.listdir(tmp_path / "c" / "pathfinder") if n.startswith(".tmp")] == []


def test_changed_metadata_or_split_seed_decodes_again_and_leftovers_are_ignored(tmp_path, monkeypatch):
    write_official(tmp_path / "d")
    root = tmp_path / "c" / "pathfinder"
    first = pathfinder.read_splits(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_len=64)
    (folder,) = os.listdir(root)
    os.makedirs(root / f".tmp-{folder}-123-deadbeef")  # a killed writer's leftover, never read
    decode = pathfinder.read_images
    calls: list[str] = []
    monkeypatch.setattr(pathfinder, "read_images", lambda *a: calls.append(a[0]) or decode(*a))
    again = pathfinder.read_splits(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_len=64)
    assert calls == [] and all(np.array_equal(again[s][0], first[s][0]) for s in pathfinder.SPLITS)
    meta = tmp_path / "d" / "metadata" / "1.npy"
    os.utime(meta, ns=(0, os.stat(meta).st_mtime_ns + 10**9))  # touched: same lines, new mtime
    touched = pathfinder.read_splits(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_len=64)
    assert len(calls) == 1 and all(np.array_equal(touched[s][0], first[s][0]) for s in pathfinder.SPLITS)
    reseeded = pathfinder.read_splits(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_len=64, split_seed=1)
    assert len(calls) == 2 and not np.array_equal(reseeded["train"][0], first["train"][0])
    assert len([n for n in os.listdir(root) if n.startswith("arrays-")]) == 3


def test_malformed_metadata_names_file_and_line(tmp_path):
    write_official(tmp_path / "d")
    (tmp_path / "d" / "metadata" / "1.npy").write_text("imgs/1 sample_10.png 10 1\nimgs/1 sample_11.png\n")
    with pytest.raises(DataError, match=r"metadata/1.npy:2: expected"):
        pathfinder.read_splits(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_len=64)


@pytest.mark.parametrize("task", ["pathfinder", "pathx"])
def test_missing_folder_names_path_and_command(tmp_path, task):
    config = _config(str(tmp_path / "nothing"), str(tmp_path / "c"), max_len=1024)
    with pytest.raises(DataError) as error:
        tasks.get_task(task).load(*config)
    message = str(error.value)
    assert str(tmp_path / "nothing") in message
    assert f"python -m lra_jax.data.prepare --task={task}" in message and "--config.data.data_dir=" in message


# ----------------------------------------------------------------------------- generator


def components(image: np.ndarray) -> np.ndarray:
    """Labels of the 8-connected components of the lit pixels (0 = background), by BFS."""
    h, w = image.shape
    comp = np.zeros((h, w), dtype=np.int32)
    count = 0
    for y0, x0 in zip(*np.nonzero(image)):
        if comp[y0, x0]:
            continue
        count += 1
        comp[y0, x0] = count
        queue = deque([(y0, x0)])
        while queue:
            y, x = queue.popleft()
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    yy, xx = y + dy, x + dx
                    if 0 <= yy < h and 0 <= xx < w and image[yy, xx] and not comp[yy, xx]:
                        comp[yy, xx] = count
                        queue.append((yy, xx))
    return comp


@pytest.mark.parametrize("size", [32, 16, 20, 64])
def test_generator_connects_positives_and_separates_negatives(size):
    args = {**pathfinder_generator.default_knobs(size), **GEN, "image_size": size}
    labels = []
    for i in range(60 if size == 32 else 12):
        image, label, ((xa, ya), (xb, yb)) = pathfinder_generator.render(i, **args)
        assert image.shape == (size, size) and image.dtype == np.uint8
        assert set(np.unique(image)) == {0, 255}
        comp = components(image)
        assert comp[ya, xa] and comp[yb, xb]  # both marks are lit
        assert (comp[ya, xa] == comp[yb, xb]) == bool(label)
        assert comp.max() == 2 + args["num_distractors"]  # snakes never touch each other
        labels.append(label)
    assert np.mean(labels) == 0.5


def test_grey_markers_change_only_the_marker_pixels():
    args = {**pathfinder_generator.default_knobs(16), **GEN, "image_size": 16}
    disc = pathfinder_generator._disc(args["marker_radius"])
    for i in range(6):
        white, label, marked = pathfinder_generator.render(i, **args)
        grey, grey_label, grey_marked = pathfinder_generator.render(i, **{**args, "marker_value": 128})
        assert (label, marked) == (grey_label, grey_marked)
        assert np.array_equal(white > 0, grey > 0)  # same snakes, same connectivity
        assert set(np.unique(grey)) == {0, 128, 255}
        marker_pixels = {(x + dx, y + dy) for x, y in marked for dx, dy in disc}
        assert set(zip(*np.nonzero(grey == 128)[::-1])) == marker_pixels


def test_generator_is_deterministic_by_seed():
    args = {**pathfinder_generator.default_knobs(32), **GEN}
    a = [pathfinder_generator.render(i, **args)[0] for i in range(4)]
    b = [pathfinder_generator.render(i, **args)[0] for i in range(4)]
    c = [pathfinder_generator.render(i, **{**args, "seed": 1})[0] for i in range(4)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not any(np.array_equal(x, y) for x, y in zip(a, c))
    assert not np.array_equal(a[0], a[2])


def test_generated_task_loads_through_the_official_reader(tmp_path):
    data = tasks.DataSettings(cache_dir=str(tmp_path), generator=dict(num_examples=50, **GEN))
    splits = tasks.get_task("pathfinder").load(data, 1024)
    assert {k: len(v[1]) for k, v in splits.items()} == {"train": 40, "val": 5, "test": 5}
    tokens = np.concatenate([np.asarray(v[0]) for v in splits.values()])
    assert tokens.shape == (50, 1024) and set(np.unique(tokens)) == {1, 256}  # pixel 0/255 -> id 1/256
    generated = [n for n in os.listdir(tmp_path / "pathfinder") if n.startswith("generated-")]
    folder = tmp_path / "pathfinder" / generated[0]
    assert (folder / "imgs" / "0" / "sample_49.png").is_file()
    meta = (folder / "metadata" / "0.npy").read_text().splitlines()
    assert meta[1].split()[:4] == ["imgs/0", "sample_1.png", "1", "1"]
    labels = np.concatenate([v[1] for v in splits.values()])
    assert labels.sum() == 25
    first = Image.open(folder / "imgs" / "0" / "sample_7.png")
    args = {**pathfinder_generator.default_knobs(32), **GEN}
    assert np.array_equal(np.asarray(first), pathfinder_generator.render(7, **args)[0])


def _config(data_dir: str, cache_dir: str, max_len: int):
    return tasks.DataSettings(data_dir=data_dir, cache_dir=cache_dir), max_len
