"""Label placement for bubble charts, and the check that no label covers anything, from the drawn extents.

Greedy, in display pixels, after the axes' limits and layout are final. Labels of crowded points are placed
first. Each label tries positions on rings of growing radius around its point (16 directions per ring) and
takes the cheapest:
  cost = 1e6 * (overlap with placed labels, with obstacles and outside the axes, pixels^2 or pixels)
       + 1e4 * (other points, error bars and placed labels its leader line would cross, and placed leader
                lines its box would cover)
       + (other bubbles covered, pixels^2) / 50 + distance to the point.
Obstacles are every point's marker (`point_box`: its bubble up to MARKER_PX, the centre dot always) and every
error bar (`boxes`), so a label sits on none of them. A label that lands beyond the first ring, or whose
point has another point within CROWDED_PX, gets a thin leader line back to its point. Greedy alone lets a
label placed early be crossed by the leader lines of labels placed after it, so REFINE_PASSES passes then
place each label again at its cheapest place with every other one fixed.

`covered` then measures what was drawn: every label's text box as the renderer drew it (its window extent)
against the other labels, the points, the error bars and the legend; a chart with any overlap is a defect.
"""

from __future__ import annotations

import math
from typing import Sequence

from matplotlib.text import Text

RINGS_PT = (5.0, 10.0, 16.0, 24.0, 34.0, 46.0, 60.0, 76.0, 94.0, 114.0, 136.0)
DIRECTIONS = 16
DOT_RADIUS_PX = 4.0  # the centre dot of every point
MARKER_PX = 9.0  # a label keeps clear of a bubble up to this radius; past it, of this much around the centre
CROWDED_PX = 60.0
REFINE_PASSES = 2  # after the greedy pass, each label placed again with all the others fixed

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels


def overlap(a: Box, b: Box) -> float:
    """Overlap area of two boxes."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def point_box(x: float, y: float, radius: float) -> Box:
    """What a label must not cover of a point at display (x, y) with a bubble of `radius` pixels."""
    r = max(DOT_RADIUS_PX, min(radius, MARKER_PX))
    return (x - r, y - r, x + r, y + r)


def _box_at(anchor: tuple[float, float], angle: float, distance: float, size: tuple[float, float]) -> Box:
    """The label box whose nearest side faces the point, `distance` pixels away along `angle`."""
    (x, y), (w, h) = anchor, size
    dx, dy = math.cos(angle), math.sin(angle)
    cx = x + dx * distance + (w / 2) * (1 if dx > 0.3 else -1 if dx < -0.3 else 0)
    cy = y + dy * distance + (h / 2) * (1 if dy > 0.3 else -1 if dy < -0.3 else 0)
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)


def crosses(start: tuple[float, float], end: tuple[float, float], box: Box) -> bool:
    """Whether the segment start-end passes through the inside of `box` (Liang-Barsky clipping)."""
    (x0, y0), (dx, dy) = start, (end[0] - start[0], end[1] - start[1])
    low, high = 0.0, 1.0
    for p, q in ((-dx, x0 - box[0]), (dx, box[2] - x0), (-dy, y0 - box[1]), (dy, box[3] - y0)):
        if p == 0:
            if q <= 0:
                return False
            continue
        t = q / p
        if p < 0:
            low = max(low, t)
        else:
            high = min(high, t)
        if low >= high:
            return False
    return True


def _segments_cross(a, b, c, d) -> bool:
    """Whether segments a-b and c-d cross (their ends not shared)."""
    def side(p, q, r):
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
    return side(a, b, c) * side(a, b, d) < 0 and side(c, d, a) * side(c, d, b) < 0


def _inside(point: tuple[float, float], box: Box) -> bool:
    return box[0] <= point[0] <= box[2] and box[1] <= point[1] <= box[3]


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
    hard = [point_box(x, y, r) for (x, y), r in bubbles] + list(boxes)
    sizes = []
    for label in labels:
        probe = ax.text(0, 0, label, fontsize=fontsize)
        extent = probe.get_window_extent(renderer)
        sizes.append((extent.width + 4, extent.height + 2))
        probe.remove()
    frame = ax.get_window_extent(renderer)

    def crowding(i):
        return sum(math.dist(anchors[i], a) < CROWDED_PX for a, _ in bubbles) - 1

    def has_leader(i, ring):
        return ring > 0 or crowding(i) > 0

    def centre(box):
        return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2

    def best_place(i, placed, leaders):
        """(cost, box, ring) of label i's cheapest place among the rings, the other labels' `placed` boxes
        and `leaders` (segments) fixed."""
        best = None
        for ring, radius_pt in enumerate(RINGS_PT):
            for k in range(DIRECTIONS):
                angle = math.pi / 4 + 2 * math.pi * k / DIRECTIONS  # up-right first
                box = _box_at(anchors[i], angle, radius_pt * px_per_pt, sizes[i])
                outside = (max(0, frame.x0 - box[0]) + max(0, box[2] - frame.x1)
                           + max(0, frame.y0 - box[1]) + max(0, box[3] - frame.y1))
                cost = 1e6 * (sum(overlap(box, other) for other in placed + hard) + outside)
                if has_leader(i, ring):
                    end = centre(box)
                    cost += 1e4 * sum(crosses(anchors[i], end, other) for other in hard + placed
                                      if not _inside(anchors[i], other))  # its own point and bar left out
                    cost += 1e4 * sum(_segments_cross(anchors[i], end, a, b) for a, b in leaders)
                cost += 1e4 * sum(crosses(a, b, box) for a, b in leaders)
                for j, ((x, y), r) in enumerate(bubbles):
                    if j != i:
                        cost += overlap(box, (x - r, y - r, x + r, y + r)) / 50
                cost += radius_pt * px_per_pt
                if best is None or cost < best[0]:
                    best = (cost, box, ring)
            if best[0] < 1e3:  # a free place on this ring: farther rings only cost more distance
                break
        return best

    # Greedy, the most crowded first; then each label is placed again with every other one fixed, so that a
    # label placed early also avoids the leader lines of those placed after it.
    places: dict[int, tuple[Box, int]] = {}
    order = sorted(range(len(labels)), key=lambda i: (-crowding(i), i))
    for sweep in range(1 + REFINE_PASSES):
        for i in order:
            places.pop(i, None)
            placed = [box for box, _ in places.values()]
            leaders = [(anchors[j], centre(box)) for j, (box, ring) in places.items() if has_leader(j, ring)]
            _, box, ring = best_place(i, placed, leaders)
            places[i] = (box, ring)

    annotations = []
    for i, label in enumerate(labels):
        box, ring = places[i]
        (cx, cy), color = centre(box), colors[i] if colors is not None else "0.45"
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


def covered(fig, annotations, points: Sequence[tuple[str, Box]], bars: Sequence[tuple[str, Box]] = (),
            legends: Sequence = ()) -> list[str]:
    """One line per overlap in the drawn figure, measured from the renderer's text extents: a label over
    another label, a point (`points`: (name, `point_box`) of every point, its own included), an error bar
    (`bars`: (name, box)) or a legend. [] when every label is clear."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [(a.get_text(), _box(text_extent(a, renderer))) for a in annotations]
    found = [f"label {a!r} overlaps label {b!r}" for i, (a, box) in enumerate(texts)
             for b, other in texts[i + 1:] if overlap(box, other) > 0]
    found += [f"label {a!r} overlaps the point of {name}" for a, box in texts for name, other in points
              if overlap(box, other) > 0]
    found += [f"label {a!r} overlaps the error bar of {name}" for a, box in texts for name, other in bars
              if overlap(box, other) > 0]
    for legend in legends:
        frame = _box(legend.get_window_extent(renderer))
        found += [f"label {a!r} overlaps the legend" for a, box in texts if overlap(box, frame) > 0]
    return found


def overlapping_pairs(ax, annotations) -> list[tuple[str, str]]:
    """Pairs of annotations whose rendered text boxes overlap."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [_box(text_extent(a, renderer)) for a in annotations]
    return [(annotations[i].get_text(), annotations[j].get_text())
            for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if overlap(boxes[i], boxes[j]) > 0]
