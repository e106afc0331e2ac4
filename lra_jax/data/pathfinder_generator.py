"""Pathfinder image generator, written to the official LRA layout.

Pathfinder (Linsley et al. 2018, "Learning long-range spatial dependencies
with horizontal gated recurrent units", NeurIPS) asks whether two marked
points are joined by one path. Long Range Arena (Tay et al. 2021) used
Linsley's generator at 32x32 ("Pathfinder") and 128x128 ("Path-X"), with
contour lengths 6, 9 and 14 paddles as the difficulty levels, 50/50 labels.

This is our own generator with the same ingredients (not a port of Linsley's code):
  * A snake is a chain of `contour_length` straight "paddles" of
    `paddle_length` pixels. The first heading is uniform; each next heading
    turns by a uniform angle in [-max_turn_degrees, +max_turn_degrees]
    (continuity). Consecutive paddles share their end point.
  * Two main snakes of `contour_length` paddles and `num_distractors`
    distractor snakes of `distractor_length` paddles per image.
  * Positive (label 1): both end points of main snake A are marked with a disc
    of radius `marker_radius`. Negative (label 0): one end point of A and one
    end point of main snake B are marked, so the marks lie on different snakes.
  * Snakes never touch: every pixel of a snake (markers included) is at
    Chebyshev distance >= 2 from every pixel of another snake, so two pixels are
    8-connected through lit pixels iff they are on the same snake. Placement:
    a few candidate shapes are drawn at once, each tried at 32 random positions
    that keep it inside the image; the first free (shape, position) pair wins;
    after 8 rounds without one, the image is restarted with fresh draws.
  * Rendering: NOT anti-aliased. Each paddle is sampled at paddle_length + 1
    evenly spaced points, rounded to pixels: an 8-connected chain (see `_shapes`).
    Pixels are 0 (background), 255 (snakes) and `marker_value` (markers; 255 by default,
    as in the official images; a distinct grey makes the task easier, see lra_jax/config/task_defaults.py).
  * Labels alternate: example i has label i % 2 (exactly balanced).
  * Deterministic: example i draws only from `np.random.default_rng([_RNG_TAG, seed, i])`,
    so the output does not depend on the number of worker processes.
  * Speed: >= 800 images/s of CPU time per core at 32x32 and 128x128 (numpy; measured
    on a heavily loaded 2-core machine),
    plus PNG writing; `write_dataset` spreads batches over worker processes.

Layout written (that of `lra_release/pathfinder32/curv_contour_length_14`, read
by LRA's `lra_benchmarks/image/input_pipeline.py`): `imgs/<b>/sample_<i>.png`
(8-bit grayscale) and `metadata/<b>.npy`, a TEXT file despite its name, one
line per image: `imgs/<b> sample_<i>.png <i> <label> <contour_length> <paddle_length>`
(fields 0, 1 and 3 are what the readers use). Batch b holds images
b * BATCH_SIZE ... (b + 1) * BATCH_SIZE - 1.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys

import numpy as np
from absl import logging
from PIL import Image

from lra_jax.data import array_cache, worker_pool
from lra_jax.errors import DataError

VERSION = 1  # bump when the images change for the same arguments
BATCH_SIZE = 1000  # images per imgs/<b> folder and metadata/<b>.npy file
_RNG_TAG = 0x9A7F  # first word of every example's numpy seed sequence
_FIRST_CANDIDATES = 2  # snake shapes drawn at once in a snake's first round
_CANDIDATES = 8  # ... and in its later rounds
_SHIFTS = 32  # random positions tried per shape
_SNAKE_TRIES = 8  # rounds of candidates before the image is restarted
_IMAGE_TRIES = 100


def default_knobs(image_size: int) -> dict:
    """Generator settings that scale with the image (32 -> paddle 2 px, 16 -> 1 px; 2 distractors)."""
    scale = image_size / 32
    return {
        "paddle_length": max(1, round(2 * scale)),
        "num_distractors": 2,
        "distractor_length": None,  # None: contour_length
        "max_turn_degrees": 30.0,
        "marker_radius": max(1, round(scale)),
        "marker_value": 255,  # pixel value of the end markers (snakes are 255)
    }


class _Failed(Exception):
    """An image could not be completed with the draws so far; restart it."""


@functools.lru_cache(maxsize=8)
def _disc(r: int) -> np.ndarray:
    """Offsets (dx, dy) int [D, 2] of a disc marker of radius r."""
    d = np.arange(-r, r + 1)
    dx, dy = np.meshgrid(d, d)
    keep = dx * dx + dy * dy <= r * r + r
    return np.stack([dx[keep], dy[keep]], axis=1)


def _shapes(rng: np.random.Generator, count: int, paddles: int, paddle_length: int, max_turn: float) -> np.ndarray:
    """Pixels (x, y) int [count, paddles * m + 1, 2] of `count` snakes, relative to their start.

    Vertex k + 1 = vertex k + paddle_length (cos h_k, sin h_k), h_0 uniform,
    h_k = h_(k-1) + uniform(-max_turn, max_turn). Each paddle is sampled at
    m = paddle_length + 1 evenly spaced points after its start, each rounded to
    the nearest pixel: successive samples are < 1 px apart along each axis, so
    successive pixels are equal or 8-neighbours and the snake is 8-connected.
    """
    turns = rng.uniform(-max_turn, max_turn, size=(count, paddles))
    turns[:, 0] = rng.uniform(-np.pi, np.pi, size=count)
    heading = np.cumsum(turns, axis=1)
    step = paddle_length * np.stack([np.cos(heading), np.sin(heading)], axis=-1)  # [C, K, 2]
    m = paddle_length + 1
    frac = np.arange(1, m + 1) / m  # [m]
    start = np.cumsum(step, axis=1) - step  # vertex k
    points = start[:, :, None, :] + frac[None, None, :, None] * step[:, :, None, :]  # [C, K, m, 2]
    points = np.rint(points.reshape(count, paddles * m, 2)).astype(np.int32)
    return np.concatenate([np.zeros((count, 1, 2), np.int32), points], axis=1)


class _Canvas:
    """An image being drawn: lit pixels, and the pixels no other snake may use."""

    def __init__(self, size: int):
        self.size = size
        self.lit = np.zeros((size, size), dtype=np.uint8)
        self.blocked = np.zeros((size + 2, size + 2), dtype=bool)  # 3x3 dilation of placed snakes, 1 px border

    def place(
        self, rng: np.random.Generator, paddles: int, paddle_length: int, max_turn: float,
        marks: tuple[bool, bool], disc: np.ndarray, marker_value: int,
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """Draws one snake with its end markers where it touches no other snake; returns its end pixels.

        Each round draws a few shapes (_FIRST_CANDIDATES, then _CANDIDATES) and _SHIFTS random in-image positions
        for each, tests them all with one gather, and keeps the first free pair.
        """
        s = self.size
        for attempt in range(_SNAKE_TRIES):
            count = _FIRST_CANDIDATES if attempt == 0 else _CANDIDATES  # most snakes fit at once
            pixels = _shapes(rng, count, paddles, paddle_length, max_turn)  # [C, M, 2]
            ends = pixels[:, [0, -1]]  # [C, 2, 2]
            parts = [pixels] + [disc[None] + ends[:, i, None] for i in (0, 1) if marks[i]]
            foot = np.concatenate(parts, axis=1)  # [C, F, 2]
            lo, hi = foot.min(axis=1), foot.max(axis=1)  # [C, 2]
            room = s - (hi - lo)  # number of in-image positions along x and y
            valid = (room > 0).all(axis=1) & (ends[:, 0] != ends[:, 1]).any(axis=1)
            shift = np.floor(rng.random((count, _SHIFTS, 2)) * np.maximum(room, 1)[:, None]).astype(np.int32)
            shift -= lo[:, None]
            # Flat indices into the bordered `blocked` (row stride s + 2); those of invalid
            # candidates may be out of range: clipped, and their result ignored.
            stride = s + 2
            foot_flat = (foot[..., 1] + 1) * stride + foot[..., 0] + 1  # [C, F]
            shift_flat = shift[..., 1] * stride + shift[..., 0]  # [C, T]
            flat = foot_flat[:, None, :] + shift_flat[:, :, None]  # [C, T, F]
            ok = ~self.blocked.take(flat, mode="clip").any(axis=-1) & valid[:, None]  # [C, T]
            if not ok.any():
                continue
            c, t = divmod(int(np.argmax(ok)), _SHIFTS)
            x, y = foot[c, :, 0] + shift[c, t, 0], foot[c, :, 1] + shift[c, t, 1]
            body = pixels.shape[1]  # foot = snake pixels, then marker pixels
            self.lit[y[:body], x[:body]] = 255
            self.lit[y[body:], x[body:]] = marker_value
            for dy in (0, 1, 2):
                for dx in (0, 1, 2):
                    self.blocked[y + dy, x + dx] = True
            (x0, y0), (x1, y1) = (ends[c] + shift[c, t]).tolist()
            return (x0, y0), (x1, y1)
        raise _Failed


def render(
    index: int,
    *,
    image_size: int,
    contour_length: int,
    seed: int,
    paddle_length: int,
    num_distractors: int,
    distractor_length: int | None,
    max_turn_degrees: float,
    marker_radius: int,
    marker_value: int,
) -> tuple[np.ndarray, int, tuple[tuple[int, int], tuple[int, int]]]:
    """Example `index`: (image uint8 [S, S] of 0/255, label, the two marked (x, y) points)."""
    label = index % 2
    rng = np.random.default_rng([_RNG_TAG, seed, index])
    turn = np.radians(max_turn_degrees)
    disc = _disc(marker_radius)
    distractor_length = distractor_length or contour_length
    for _ in range(_IMAGE_TRIES):
        canvas = _Canvas(image_size)
        try:
            if label:
                a = canvas.place(rng, contour_length, paddle_length, turn, (True, True), disc, marker_value)
                canvas.place(rng, contour_length, paddle_length, turn, (False, False), disc, marker_value)
                marked = (a[0], a[1])
            else:
                a = canvas.place(rng, contour_length, paddle_length, turn, (True, False), disc, marker_value)
                b = canvas.place(rng, contour_length, paddle_length, turn, (True, False), disc, marker_value)
                marked = (a[0], b[0])
            for _ in range(num_distractors):
                canvas.place(rng, distractor_length, paddle_length, turn, (False, False), disc, marker_value)
        except _Failed:
            continue
        return canvas.lit, label, marked
    raise DataError(
        f"Pathfinder: could not fit 2 + {num_distractors} snakes of {contour_length} paddles of "
        f"{paddle_length} px in a {image_size}x{image_size} image; lower num_distractors, "
        "contour_length or paddle_length, or raise image_size"
    )


def check_args(image_size: int, contour_length: int, num_examples: int, **knobs) -> None:
    """DataError on settings the generator cannot honour."""
    if image_size < 16:
        raise DataError(f"Pathfinder image_size={image_size}; use 16 or more")
    if contour_length < 1 or num_examples < 1:
        raise DataError(f"Pathfinder needs contour_length >= 1 and num_examples >= 1, got {contour_length}, {num_examples}")
    if (knobs["paddle_length"] < 1 or knobs["marker_radius"] < 0 or knobs["num_distractors"] < 0
            or not 1 <= knobs["marker_value"] <= 255):
        raise DataError(f"Pathfinder generator settings out of range: {knobs}")


def write_batch(out_dir: str, batch: int, num_examples: int, **args) -> None:
    """Renders images batch * BATCH_SIZE ... (exclusive end min(num_examples, ...)) into `out_dir`."""
    sub = f"imgs/{batch}"
    os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    lines = []
    for i in range(batch * BATCH_SIZE, min(num_examples, (batch + 1) * BATCH_SIZE)):
        image, label, _ = render(i, **args)
        name = f"sample_{i}.png"
        Image.fromarray(image).save(os.path.join(out_dir, sub, name), compress_level=1)
        lines.append(f"{sub} {name} {i} {label} {args['contour_length']} {args['paddle_length']}\n")
    os.makedirs(os.path.join(out_dir, "metadata"), exist_ok=True)
    with open(os.path.join(out_dir, "metadata", f"{batch}.npy"), "w") as f:
        f.writelines(lines)


def write_dataset(out_dir: str, num_examples: int, num_workers: int | None = None, **args) -> None:
    """Writes `num_examples` images in the official layout into `out_dir` (which must be new).

    Batches are spread over `num_workers` fresh interpreters
    (`python -m lra_jax.data.pathfinder_generator`, see `worker_pool`); by default
    one per core beyond 4 batches of work, else in-process.
    """
    num_batches = -(-num_examples // BATCH_SIZE)
    if num_workers is None:
        num_workers = 1 if num_batches < 4 else min(len(os.sched_getaffinity(0)), num_batches, 16)
    if num_workers <= 1:
        for b in range(num_batches):
            write_batch(out_dir, b, num_examples, **args)
        return
    argv = [out_dir, num_examples, repr(sorted(args.items()))]
    worker_pool.run_all(__name__, [[j, num_workers, *argv] for j in range(num_workers)], "Pathfinder generator")


def generate(cache_dir: str, task: str, *, image_size: int, contour_length: int, num_examples: int,
             seed: int = 0, num_workers: int | None = None, **knobs) -> str:
    """Generates images in the official layout under cache_dir/task/ (once); returns that folder,
    for `pathfinder.read_splits`."""
    args = {**default_knobs(image_size), **knobs}
    unknown = set(args) - set(default_knobs(image_size))
    if unknown:
        raise DataError(f"unknown {task} generator settings {sorted(unknown)}; known: "
                        f"image_size, contour_length, num_examples, seed, {', '.join(default_knobs(0))}")
    args.update(image_size=image_size, contour_length=contour_length, seed=seed)
    check_args(num_examples=num_examples, **args)
    blob = json.dumps({"v": VERSION, "num_examples": num_examples, **args}, sort_keys=True)
    out_dir = os.path.join(cache_dir, task, f"generated-{hashlib.sha256(blob.encode()).hexdigest()[:16]}")
    if os.path.isdir(out_dir):
        return out_dir
    logging.info("%s: generating %d images %s into %s", task, num_examples, args, out_dir)
    array_cache.write_atomically(out_dir, lambda tmp: write_dataset(tmp, num_examples, num_workers, **args))
    return out_dir


if __name__ == "__main__":  # worker: python -m lra_jax.data.pathfinder_generator J W OUT_DIR N ARGS
    first, step, out, total, items = sys.argv[1:6]
    kwargs = dict(ast.literal_eval(items))
    for b in range(int(first), -(-int(total) // BATCH_SIZE), int(step)):
        write_batch(out, b, int(total), **kwargs)
