"""Label placement for bubble charts, and the check that no label covers anything, from the drawn extents.

Greedy, in display pixels, after the axes' limits and layout are final. Labels of crowded points are placed
first. Each label tries positions on rings of growing radius around its point (16 directions per ring) and
takes the cheapest:
  cost = COVER * (overlap with placed labels, with obstacles and outside the axes, pixels^2 or pixels)
       + THROUGH_TEXT * (placed labels its leader line would cross, and placed leader lines its box would cover)
       + THROUGH_POINT * (other points its leader line would cross)
       + CROSSING * (error bars and placed leader lines its leader line would cross)
       + (other bubbles covered, pixels^2) / 50 + distance to the point.
A line through a label's text is as bad as a covered one (the text is what is read), one through another
point next (it seems to lead there); crossing a bar or another line costs about as much as 80 px more of line,
so a short line across a bar beats a long one around the cluster.
Obstacles are every point's marker (`point_box`: its bubble up to MARKER_PX, the centre dot always) and every
error bar (`boxes`), so a label sits on none of them. A label that lands beyond the first ring, or whose
point has another point within CROWDED_PX, gets a thin leader line back to its point. Greedy alone lets a
label placed early be crossed by the leader lines of labels placed after it, so REFINE_PASSES passes then
place each label again at its cheapest place with every other one fixed. Two labels can still each hold the
other's only free place; then up to RESTARTS other orders (seeded, so a chart is drawn the same every time)
are laid out and the layout with the fewest labels left covering something or crossed is kept. Every place
of a label is costed at once (numpy), so a panel of 40 labels is laid out in well under a second.

`covered` then measures what was drawn: every label's text box as the renderer drew it (its window extent)
against the other labels, the points, the error bars and the legend, and the leader lines against every other
label's text; a chart with any of these is a defect.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

import numpy as np
from matplotlib.text import Text

RINGS_PT = (5.0, 10.0, 16.0, 24.0, 34.0, 46.0, 60.0, 76.0, 94.0, 114.0, 136.0, 160.0, 186.0)
DIRECTIONS = 16
DOT_RADIUS_PX = 4.0  # the centre dot of every point
MARKER_PX = 9.0  # a label keeps clear of a bubble up to this radius; past it, of this much around the centre
CROWDED_PX = 60.0
REFINE_PASSES = 2  # after the greedy pass, each label placed again with all the others fixed
RESTARTS = 12  # other orders tried while a layout leaves a label covering something or crossed by a line
COVER, THROUGH_TEXT, THROUGH_POINT, CROSSING = 1e6, 1e6, 1e4, 80.0  # the costs' weights (above)

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels


def overlaps(boxes, others) -> np.ndarray:
    """[len(boxes), len(others)] overlap areas of two lists of boxes."""
    a, b = np.reshape(boxes, (-1, 1, 4)), np.reshape(others, (1, -1, 4))
    w = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    h = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    return np.where((w > 0) & (h > 0), w * h, 0.0)


def point_box(x: float, y: float, radius: float) -> Box:
    """What a label must not cover of a point at display (x, y) with a bubble of `radius` pixels."""
    r = max(DOT_RADIUS_PX, min(radius, MARKER_PX))
    return (x - r, y - r, x + r, y + r)


def crossings(starts, ends, boxes) -> np.ndarray:
    """[len(starts), len(boxes)]: whether segment starts[i]-ends[i] passes through the inside of boxes[j]
    (Liang-Barsky clipping: the segment's parameter interval inside each of the box's four half-planes)."""
    (x0, y0), (x1, y1) = np.reshape(starts, (-1, 2)).T, np.reshape(ends, (-1, 2)).T
    box = np.reshape(boxes, (1, -1, 4))
    dx, dy = (x1 - x0)[:, None, None], (y1 - y0)[:, None, None]
    x0, y0 = x0[:, None], y0[:, None]
    p = np.concatenate([-dx, dx, -dy, dy], axis=-1)  # [segments, 1, 4], against q's [segments, boxes, 4]
    q = np.stack([x0 - box[..., 0], box[..., 2] - x0, y0 - box[..., 1], box[..., 3] - y0], axis=-1)
    t = q / np.where(p == 0, 1.0, p)
    low = np.maximum(0.0, np.where(p < 0, t, -np.inf).max(axis=-1))
    high = np.minimum(1.0, np.where(p > 0, t, np.inf).min(axis=-1))
    parallel_outside = ((p == 0) & (q <= 0)).any(axis=-1)
    return (low < high) & ~parallel_outside


def segments_crossing(starts, ends, others) -> np.ndarray:
    """[len(starts), len(others)]: whether segment starts[i]-ends[i] crosses segment others[j] = (c, d),
    their ends not shared."""
    a, b = np.reshape(starts, (-1, 1, 2)), np.reshape(ends, (-1, 1, 2))
    c, d = (np.reshape([segment[k] for segment in others], (1, -1, 2)) for k in (0, 1))

    def side(p, q, r):
        return (q[..., 0] - p[..., 0]) * (r[..., 1] - p[..., 1]) - (q[..., 1] - p[..., 1]) * (r[..., 0] - p[..., 0])
    return (side(a, b, c) * side(a, b, d) < 0) & (side(c, d, a) * side(c, d, b) < 0)


def _candidates(anchor: tuple[float, float], size: tuple[float, float], px_per_pt: float):
    """Every place a label of `size` may take around its point, ring by ring and up-right first in each:
    (boxes [rings * DIRECTIONS, 4], each box's ring, its distance in pixels). Each box's nearest side faces
    the point, the ring's radius away."""
    (x, y), (w, h) = anchor, size
    angle = np.pi / 4 + 2 * np.pi * np.arange(DIRECTIONS) / DIRECTIONS
    dx, dy = np.tile(np.cos(angle), len(RINGS_PT)), np.tile(np.sin(angle), len(RINGS_PT))
    distance = np.repeat(RINGS_PT, DIRECTIONS) * px_per_pt
    cx = x + dx * distance + (w / 2) * np.where(dx > 0.3, 1, np.where(dx < -0.3, -1, 0))
    cy = y + dy * distance + (h / 2) * np.where(dy > 0.3, 1, np.where(dy < -0.3, -1, 0))
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    return boxes, np.repeat(np.arange(len(RINGS_PT)), DIRECTIONS), distance


def _centres(boxes) -> np.ndarray:
    boxes = np.reshape(boxes, (-1, 4))
    return np.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2], axis=-1)


def _inside(point: tuple[float, float], boxes) -> np.ndarray:
    boxes = np.reshape(boxes, (-1, 4))
    return (boxes[:, 0] <= point[0]) & (point[0] <= boxes[:, 2]) & (boxes[:, 1] <= point[1]) & (point[1] <= boxes[:, 3])


def place_labels(ax, points: Sequence[tuple[float, float]], labels: Sequence[str],
                 bubble_areas: Sequence[float], fontsize: float = 9, colors: Sequence | None = None,
                 obstacles: Sequence[tuple[tuple[float, float], float]] = (), boxes: Sequence[Box] = ()) -> list:
    """Annotates `ax` with `labels` at data `points`; returns the annotations.

    Args:
        bubble_areas: the scatter sizes (pt^2) drawn at the points, so labels avoid other bubbles.
        obstacles: more bubbles drawn without a label, ((x, y) in data, area pt^2), avoided the same way.
        boxes: more display boxes no label may cover (error bars).
    """
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    px_per_pt = fig.dpi / 72.0
    anchors = [tuple(ax.transData.transform(p)) for p in points]
    radii = [math.sqrt(max(s, 0.0)) / 2 * px_per_pt for s in bubble_areas]
    others = [(tuple(ax.transData.transform(p)), math.sqrt(max(s, 0.0)) / 2 * px_per_pt) for p, s in obstacles]
    bubbles = list(zip(anchors, radii)) + others
    bubble_boxes = np.array([(x - r, y - r, x + r, y + r) for (x, y), r in bubbles]).reshape(-1, 4)
    marks = np.array([point_box(x, y, r) for (x, y), r in bubbles]).reshape(-1, 4)
    bars = np.array(boxes, dtype=float).reshape(-1, 4)
    hard = np.concatenate([marks, bars])
    sizes = []
    for label in labels:
        probe = ax.text(0, 0, label, fontsize=fontsize)
        extent = probe.get_window_extent(renderer)
        sizes.append((extent.width + 4, extent.height + 2))
        probe.remove()
    frame = ax.get_window_extent(renderer)
    candidates = [_candidates(anchors[i], sizes[i], px_per_pt) for i in range(len(labels))]

    def crowding(i):
        return sum(math.dist(anchors[i], a) < CROWDED_PX for a, _ in bubbles) - 1

    def has_leader(i, ring):
        return ring > 0 or crowding(i) > 0

    def best_place(i, placed, leaders):
        """(cost, box, ring) of label i's cheapest place: the nearest ring with a free place (cost under 1e3:
        farther rings only cost more distance), else the cheapest of all; the other labels' `placed` boxes and
        `leaders` (segments) fixed."""
        places, rings, distance = candidates[i]
        placed = np.reshape(placed, (-1, 4))
        ends, start = _centres(places), np.broadcast_to(anchors[i], (len(places), 2))
        outside = (np.maximum(0, frame.x0 - places[:, 0]) + np.maximum(0, places[:, 2] - frame.x1)
                   + np.maximum(0, frame.y0 - places[:, 1]) + np.maximum(0, places[:, 3] - frame.y1))
        cost = COVER * (overlaps(places, np.concatenate([placed, hard])).sum(axis=1) + outside)
        through = (THROUGH_TEXT * crossings(start, ends, placed).sum(axis=1)
                   + THROUGH_POINT * crossings(start, ends, marks[~_inside(anchors[i], marks)]).sum(axis=1)
                   + CROSSING * crossings(start, ends, bars[~_inside(anchors[i], bars)]).sum(axis=1))  # its own point and bar left out
        if leaders:
            through += CROSSING * segments_crossing(start, ends, leaders).sum(axis=1)
            cost += THROUGH_TEXT * crossings([a for a, _ in leaders], [b for _, b in leaders], places).sum(axis=0)
        cost += np.where((rings > 0) | (crowding(i) > 0), through, 0.0)
        mine = np.arange(len(bubbles)) == i
        cost += overlaps(places, bubble_boxes[~mine]).sum(axis=1) / 50 + distance
        running = np.minimum.accumulate(cost)
        free = np.flatnonzero(running[DIRECTIONS - 1::DIRECTIONS] < 1e3)
        last = (free[0] + 1) * DIRECTIONS if len(free) else len(cost)
        k = int(np.argmin(cost[:last]))
        return float(cost[k]), tuple(places[k]), int(rings[k])

    def lay_out(order):
        """Greedy in `order`, then each label placed again with every other one fixed (a label placed early
        then also avoids the leader lines of those placed after it): ({i: (box, ring)}, {i: its last cost})."""
        places: dict[int, tuple[Box, int]] = {}
        costs: dict[int, float] = {}
        for _ in range(1 + REFINE_PASSES):
            for i in order:
                places.pop(i, None)
                placed = [box for box, _ in places.values()]
                leaders = [(anchors[j], tuple(_centres(box)[0])) for j, (box, ring) in places.items()
                           if has_leader(j, ring)]
                costs[i], box, ring = best_place(i, placed, leaders)
                places[i] = (box, ring)
        return places, costs

    def defects(costs):  # labels left covering something or crossed by a line, then the total cost
        return sum(cost >= THROUGH_TEXT for cost in costs.values()), sum(costs.values())

    # The most crowded first. Where that leaves a defect (two labels that each block the other's only free
    # place), other orders, seeded, and the layout with the fewest defects is kept.
    order = sorted(range(len(labels)), key=lambda i: (-crowding(i), i))
    places, costs = lay_out(order)
    shuffler = random.Random(0)
    for _ in range(RESTARTS):
        if defects(costs)[0] == 0:
            break
        candidate = lay_out(shuffler.sample(order, len(order)))
        if defects(candidate[1]) < defects(costs):
            places, costs = candidate

    annotations = []
    for i, label in enumerate(labels):
        box, ring = places[i]
        (cx, cy), color = _centres(box)[0], colors[i] if colors is not None else "0.45"
        leader = (dict(arrowstyle="-", color=color, linewidth=0.8, shrinkA=0, shrinkB=3)
                  if has_leader(i, ring) else None)
        annotations.append(ax.annotate(label, points[i], xytext=((cx - anchors[i][0]) / px_per_pt,
                                                                 (cy - anchors[i][1]) / px_per_pt),
                                       textcoords="offset points", ha="center", va="center",
                                       fontsize=fontsize, zorder=5, arrowprops=leader))
    return annotations


def text_extent(annotation, renderer):
    """The box of an annotation's text alone (Annotation.get_window_extent adds its leader line)."""
    return Text.get_window_extent(annotation, renderer)


def _box(extent) -> Box:
    return (extent.x0, extent.y0, extent.x1, extent.y1)


def _leaders(annotations, texts) -> list[tuple[str, tuple[tuple[float, float], tuple[float, float]]]]:
    """(label, (its point, its text's centre)) in display pixels for every annotation drawn with a leader line."""
    return [(text, (tuple(a.axes.transData.transform(a.xy)), tuple(_centres(box)[0])))
            for a, (text, box) in zip(annotations, texts) if a.arrow_patch is not None]


def _pairs(names, boxes, other_names, others, overlapping) -> list[tuple[str, str]]:
    """(name, other name) of every pair that `overlapping` ([len(boxes), len(others)] booleans) marks."""
    if not len(boxes) or not len(others):
        return []
    marked = overlapping(np.reshape(boxes, (-1, 4)), np.reshape(others, (-1, 4)))
    return [(names[i], other_names[j]) for i, j in zip(*np.nonzero(marked))]


def covered(fig, annotations, points: Sequence[tuple[str, Box]], bars: Sequence[tuple[str, Box]] = (),
            legends: Sequence = ()) -> list[str]:
    """One line per overlap in the drawn figure, measured from the renderer's text extents: a label over
    another label, a point (`points`: (name, `point_box`) of every point, its own included), an error bar
    (`bars`: (name, box)) or a legend, and a label that another label's leader line runs through. [] when
    every label is clear."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [(a.get_text(), _box(text_extent(a, renderer))) for a in annotations]
    names, boxes = [t for t, _ in texts], [box for _, box in texts]
    found = [f"label {a!r} overlaps label {b!r}" for a, b in overlapping_boxes(names, boxes)]

    def against(items, words):
        return [f"label {a!r} overlaps {words} {b}" for a, b in
                _pairs(names, boxes, [n for n, _ in items], [box for _, box in items],
                       lambda x, y: overlaps(x, y) > 0)]
    found += against(points, "the point of")
    leaders = _leaders(annotations, texts)
    through = crossings([s for _, (s, _) in leaders], [e for _, (_, e) in leaders], boxes) if leaders else []
    found += [f"label {names[j]!r} is crossed by the leader line of {leaders[i][0]!r}"
              for i, j in zip(*np.nonzero(through)) if names[j] != leaders[i][0]]
    found += against(bars, "the error bar of")
    found += against([("", _box(legend.get_window_extent(renderer))) for legend in legends], "the legend")
    return [line.rstrip() for line in found]


def overlapping_boxes(names, boxes) -> list[tuple[str, str]]:
    """Pairs (earlier, later) of `names` whose `boxes` overlap."""
    return [(a, b) for a, b in _pairs(names, boxes, names, boxes, lambda x, y: np.triu(overlaps(x, y) > 0, k=1))]


def overlapping_pairs(ax, annotations) -> list[tuple[str, str]]:
    """Pairs of annotations whose rendered text boxes overlap."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return overlapping_boxes([a.get_text() for a in annotations], [_box(text_extent(a, renderer)) for a in annotations])
