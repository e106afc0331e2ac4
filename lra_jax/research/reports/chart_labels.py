"""Label placement for bubble charts: every label near its point, no two labels overlapping.

Greedy, in display pixels. Labels of crowded points are placed first. Each label tries positions
on rings of growing radius around its point (16 directions per ring) and takes the cheapest:
  cost = 1e6 * (overlaps with placed labels, pixels^2) + 1e6 * (pixels outside the axes)
       + 1e3 * (other points' centre dots covered) + (other bubbles covered, pixels^2) / 50
       + distance to the point.
A label that lands beyond the first ring, or whose point has another point within CROWDED_PX,
gets a thin leader line back to its point (in the point's colour when colours are given).
"""

from __future__ import annotations

import math
from typing import Sequence

from matplotlib.text import Text

RINGS_PT = (6.0, 12.0, 20.0, 30.0, 42.0, 56.0, 72.0, 90.0)
DIRECTIONS = 16
DOT_RADIUS_PX = 4.0
CROWDED_PX = 60.0


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """Overlap area of two boxes (x0, y0, x1, y1)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def _box_at(anchor: tuple[float, float], angle: float, distance: float, size: tuple[float, float]):
    """The label box whose nearest side faces the point, `distance` pixels away along `angle`."""
    (x, y), (w, h) = anchor, size
    dx, dy = math.cos(angle), math.sin(angle)
    cx = x + dx * distance + (w / 2) * (1 if dx > 0.3 else -1 if dx < -0.3 else 0)
    cy = y + dy * distance + (h / 2) * (1 if dy > 0.3 else -1 if dy < -0.3 else 0)
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)


def place_labels(ax, points: Sequence[tuple[float, float]], labels: Sequence[str],
                 bubble_areas: Sequence[float], fontsize: float = 9,
                 colors: Sequence | None = None,
                 obstacles: Sequence[tuple[tuple[float, float], float]] = ()) -> list:
    """Annotates `ax` with `labels` at data `points`; returns the annotations.

    bubble_areas are the scatter sizes (pt^2) drawn at the points, so labels avoid other bubbles;
    `obstacles` ((x, y), area) are more bubbles drawn without a label, avoided the same way.
    Call after the axes limits and scales are final.
    """
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    px_per_pt = fig.dpi / 72.0
    anchors = [tuple(ax.transData.transform(p)) for p in points]
    radii = [math.sqrt(max(s, 0.0)) / 2 * px_per_pt for s in bubble_areas]
    others = [(tuple(ax.transData.transform(p)), math.sqrt(max(s, 0.0)) / 2 * px_per_pt) for p, s in obstacles]
    sizes = []
    for label in labels:
        probe = ax.text(0, 0, label, fontsize=fontsize)
        extent = probe.get_window_extent(renderer)
        sizes.append((extent.width + 2, extent.height + 2))
        probe.remove()
    frame = ax.get_window_extent(renderer)

    def crowding(i):
        return sum(math.dist(anchors[i], anchors[j]) < CROWDED_PX for j in range(len(anchors))) - 1

    placed, annotations = [], [None] * len(labels)
    for i in sorted(range(len(labels)), key=crowding, reverse=True):
        best = None
        for ring, radius_pt in enumerate(RINGS_PT):
            for k in range(DIRECTIONS):
                angle = math.pi / 4 + 2 * math.pi * k / DIRECTIONS  # up-right first
                box = _box_at(anchors[i], angle, radius_pt * px_per_pt, sizes[i])
                outside = (max(0, frame.x0 - box[0]) + max(0, box[2] - frame.x1)
                           + max(0, frame.y0 - box[1]) + max(0, box[3] - frame.y1))
                cost = 1e6 * (sum(_overlap(box, other) for other in placed) + outside)
                for j, (x, y) in enumerate(anchors):
                    dot = (x - DOT_RADIUS_PX, y - DOT_RADIUS_PX, x + DOT_RADIUS_PX, y + DOT_RADIUS_PX)
                    cost += 1e3 * (_overlap(box, dot) > 0)
                    if j != i:
                        r = radii[j]
                        cost += _overlap(box, (x - r, y - r, x + r, y + r)) / 50
                for (x, y), r in others:
                    dot = (x - DOT_RADIUS_PX, y - DOT_RADIUS_PX, x + DOT_RADIUS_PX, y + DOT_RADIUS_PX)
                    cost += 1e3 * (_overlap(box, dot) > 0) + _overlap(box, (x - r, y - r, x + r, y + r)) / 50
                cost += radius_pt * px_per_pt
                if best is None or cost < best[0]:
                    best = (cost, box, ring)
        _, box, ring = best
        placed.append(box)
        centre = ((box[0] + box[2]) / 2 - anchors[i][0], (box[1] + box[3]) / 2 - anchors[i][1])
        color = colors[i] if colors is not None else "0.45"
        leader = (dict(arrowstyle="-", color=color, linewidth=0.9, shrinkA=0, shrinkB=3)
                  if ring > 0 or crowding(i) > 0 else None)
        annotations[i] = ax.annotate(labels[i], points[i], xytext=(centre[0] / px_per_pt, centre[1] / px_per_pt),
                                     textcoords="offset points", ha="center", va="center",
                                     fontsize=fontsize, zorder=5, arrowprops=leader)
    return annotations


def overlapping_pairs(ax, annotations) -> list[tuple[str, str]]:
    """Pairs of annotations whose rendered text boxes overlap (for tests and sanity checks)."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [text_extent(a, renderer) for a in annotations]
    return [(annotations[i].get_text(), annotations[j].get_text())
            for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def text_extent(annotation, renderer):
    """The box of an annotation's text alone (Annotation.get_window_extent adds its leader line)."""
    return Text.get_window_extent(annotation, renderer)
