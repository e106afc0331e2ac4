"""The chart's figures, one idea each, drawn for the width people see them at (README and docs: 760-1000 px).

- `headline` (lra_chart.png): the LRA paper's Figure 3, measured. x = training speed at one length relative
  to softmax on the main accelerator, y = LRA score, bubble area = memory relative to softmax; one point per
  variant trained from scratch, and the paper's points on the same axes. The variants it cannot draw (no
  measured speed there) are named under it.
- `pretraining` (lra_spt.png): one row per variant, an arrow from its score trained from scratch to its score
  self-pretrained, each with its spread over seeds; the row names the variant's speed.
- `cpu` (lra_cpu.png): every variant, against its speed measured on a CPU.
- `modeled` (lra_tpu_modeled.png): against the TPU compiler's modeled step on the paper's hardware, labelled
  modeled: no TPU ran.

Each figure is WIDTH_IN wide at DPI (WIDTH_IN * DPI px), every text at least SMALLEST_PT; its height follows
from what is under the axes (legends, note), measured from the drawn extents (`_lay_out`).
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no window, whatever backend the machine has
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch
from matplotlib.text import Text

from lra_jax.research.reports import chart_panels, spt_report
from lra_jax.research.reports.chart_panels import Panel, ordered_scales, scale_line
from lra_jax.research.reports.chart_speeds import BASELINE, DeviceSpeeds
from lra_jax.research.reports.lra_results import REFERENCE_VARIANTS, base_scale, is_pretrained

WIDTH_IN, DPI = 10.0, 100  # 1000 px natural width
AXES_HEIGHT_IN = 5.6
SMALLEST_PT = 9.0  # no text smaller: 12.5 px at 100 dpi, 9.5 px when the figure is shown 760 px wide
TITLE_PT, AXIS_PT = 11.0, 10.0
PAD_IN = 0.12
TITLE_CHARS, NOTE_CHARS = 110, 140  # characters per line of the title (11 pt) and the note (9 pt) at 1000 px
ARM_OFFSET, ROW_MARKER_AREA = 0.17, 50.0  # the self-pretraining figure: each arm's place in its row, marker (pt²)
Scores = dict[str, dict[str, dict[str, Any]]]
Speeds = dict[str, tuple[float, float | None]]  # variant -> (speed, memory), both relative to softmax's
Modeled = tuple[int, str, dict[str, dict[str, Any]]]  # `table2_report.load_modeled`: (length, target, variants)


@dataclasses.dataclass
class View:
    """One figure: its file stem, the panel drawn, and what the interactive view needs of it: the device,
    every variant's (speed, memory) and the file each came from, and the variants it could not draw (why)."""
    name: str
    fig: Any
    panel: Panel
    device: str
    speeds: Speeds
    sources: dict[str, str]
    not_drawn: dict[str, str]
    note: str
    legends: list = dataclasses.field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What the manifest keeps: the panel's values, the note, the width and the smallest text in px."""
        texts = [t for t in self.fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        smallest = min(t.get_fontsize() for t in texts) * self.fig.dpi / 72.0
        return {"figure": self.name, **self.panel.record(), "note": self.note,
                "width_px": round(self.fig.get_figwidth() * self.fig.dpi),
                "smallest_text_px": round(smallest, 2)}


def wrap(text: str, width: int) -> str:
    """`text` with each of its lines broken at `width` characters."""
    return "\n".join(textwrap.fill(part, width, break_on_hyphens=False) for part in text.splitlines())


def ours_line(scores: Scores) -> str:
    return "ours: " + "; ".join(scale_line(s, scores[s]) for s in ordered_scales(scores))


def from_scratch(scores: Scores) -> Scores:
    return {s: m for s, m in scores.items() if not is_pretrained(s)}


def relative(speeds: DeviceSpeeds) -> Speeds:
    return {v: (s.relative_speed, s.relative_memory) for v, s in speeds.speeds.items()}


def relative_modeled(modeled: Modeled) -> tuple[Speeds, dict[str, str]]:
    """(variant -> (modeled speed, memory) relative to softmax's, variant -> why it is not drawn)."""
    _, _, variants = modeled
    reasons = {v: m.get("reason") or "no modeled time" for v, m in variants.items() if not m.get("examples_per_second")}
    base = variants.get(BASELINE) or {}
    if not base.get("examples_per_second"):
        return {}, {**reasons, BASELINE: reasons.get(BASELINE, "not modeled") + " (every speed is relative to it)"}
    drawn = {v: (m["examples_per_second"] / base["examples_per_second"],
                 m["peak_memory_bytes"] / base["peak_memory_bytes"] if m.get("peak_memory_bytes") else None)
             for v, m in variants.items() if m.get("examples_per_second")}
    return drawn, reasons


def by_reason(reasons: dict[str, str]) -> dict[str, list[str]]:
    """reason -> the variants it holds for, in the order first met: one mention of a reason many share."""
    grouped: dict[str, list[str]] = {}
    for variant, why in reasons.items():
        grouped.setdefault(why, []).append(variant)
    return grouped


def not_drawn_line(missing: dict[str, str]) -> str:
    """'Not drawn: lru, mega, s6 (no measured speed on NVIDIA H200).' ('' when every variant is drawn)."""
    if not missing:
        return ""
    return "Not drawn: " + "; ".join(f"{', '.join(vs)} ({why})" for why, vs in by_reason(missing).items()) + "."


def _panel(scores: Scores, speeds: Speeds, styles, title: str, xlabel: str, memory_title: str,
           reference: dict[str, Any] | None = None, gid: str = "score-bar"):
    """A figure with one panel of `scores` against `speeds` (and the paper's points where `reference` is
    given); returns (figure, panel, the legends' handles and title)."""
    fig = plt.figure(figsize=(WIDTH_IN, 8.0), dpi=DPI)
    ax = fig.add_axes((0.1, 0.3, 0.85, 0.6))
    ax.set_title(wrap(title, TITLE_CHARS), fontsize=TITLE_PT)
    ax.set_xlabel(xlabel, fontsize=AXIS_PT)
    ax.set_ylabel("LRA score: mean test accuracy over the tasks scored (%)", fontsize=AXIS_PT)
    ax.tick_params(labelsize=AXIS_PT)
    drawn = [m for s in scores.values() for v, (_, m) in ((v, speeds[v]) for v in s if v in speeds) if m]
    largest = max(drawn + (chart_panels.paper_memory_ratios(reference) if reference else []) + [1.0])
    points = chart_panels.draw_ours(ax, scores, speeds, styles, largest, gid)
    if reference:
        points += chart_panels.draw_paper(ax, reference, points, scores, largest)
    if not points:
        ax.text(0.5, 0.5, "no variant has both a score and a speed", ha="center", transform=ax.transAxes,
                fontsize=AXIS_PT)
    chart_panels.finish(ax, points)
    return fig, Panel(ax, points), chart_panels.legend_handles(ax, points, largest), memory_title


def _finish(name: str, fig, panel: Panel, handles: list, memory_title: str, note: str, device: str,
            speeds: Speeds, sources: dict[str, str], not_drawn: dict[str, str]) -> View:
    """Legends and note under the axes, the figure's height from their drawn extents, then the labels."""
    sizes = [h for h in handles if h.get_label().endswith("memory")]
    marks = [h for h in handles if h not in sizes]
    largest = max((h.get_sizes()[0] for h in sizes), default=0.0)  # pt^2: each row as high as that bubble
    # The title's blank second line keeps the largest bubble, drawn above its row's middle, off the title.
    legends = [fig.legend(handles=sizes, title=wrap(memory_title, NOTE_CHARS) + "\n", loc="upper left",
                          ncol=max(len(sizes), 1),
                          fontsize=SMALLEST_PT, title_fontsize=SMALLEST_PT, frameon=False, borderpad=0.2,
                          columnspacing=2.5, handletextpad=1.2, alignment="left",
                          handleheight=max(0.7, 1.3 * largest ** 0.5 / SMALLEST_PT))]
    if marks:
        legends.append(fig.legend(handles=marks, loc="upper left", ncol=3, fontsize=SMALLEST_PT, frameon=False,
                                  borderpad=0.2, columnspacing=2.0))
    text = fig.text(0, 0, wrap(note, NOTE_CHARS), fontsize=SMALLEST_PT, va="top", ha="left")
    _lay_out(fig, panel.ax, legends, text)
    panel.legends = legends
    view = View(name, fig, panel, device, speeds, sources, not_drawn, note, legends)
    panel.place_labels()
    return view


def _lay_out(fig, ax, legends: list, note) -> None:
    """Axes AXES_HEIGHT_IN high under the title, then the legends and the note, each as high as drawn;
    the figure's height is their sum."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    dpi, pad = fig.dpi, PAD_IN * fig.dpi
    frame, tight = ax.get_window_extent(renderer), ax.get_tightbbox(renderer)
    left, below, above = frame.x0 - tight.x0, frame.y0 - tight.y0, tight.y1 - frame.y1
    heights = [legend.get_window_extent(renderer).height for legend in legends]
    note_height = note.get_window_extent(renderer).height if note.get_text() else 0.0
    width = WIDTH_IN * dpi
    height = pad + above + AXES_HEIGHT_IN * dpi + below + sum(h + pad for h in heights) + note_height + 2 * pad
    fig.set_size_inches(WIDTH_IN, height / dpi)
    bottom = height - pad - above - AXES_HEIGHT_IN * dpi
    ax.set_position((left / width + PAD_IN / WIDTH_IN, bottom / height,
                     1 - (left + 3 * pad) / width, AXES_HEIGHT_IN * dpi / height))
    y = bottom - below - pad
    for legend, h in zip(legends, heights):
        legend.set_bbox_to_anchor((pad / width, y / height), transform=fig.transFigure)
        y -= h + pad
    note.set_position((pad / width, y / height))
    fig.canvas.draw()


def headline(scores: Scores, main: DeviceSpeeds | None, reference: dict[str, Any] | None, styles,
             note: str = "") -> View:
    """lra_chart.png: one point per variant from scratch against the main device's speed, the paper's points."""
    scratch = from_scratch(scores)
    where = f"measured on {main.device}" if main else "no bench given"
    length = main.length if main else 4096
    settings = f", batch {main.batch_size}, dropout {main.dropout_rate:g}" if main else ""
    title = (f"LRA score against training speed at length {length}, relative to softmax ({where}{settings}); "
             f"{ours_line(scratch)}, trained from scratch")
    speeds = relative(main) if main else {}
    fig, panel, handles, _ = _panel(
        scratch, speeds, styles, title, f"training speed at length {length}, × softmax's ({where})",
        "", reference)
    memory = (f"bubble area: {main.memory_words}, relative to softmax's; paper: peak memory per TPU v3 core"
              if main else "bubble area: no memory")
    missing = {v: f"no measured speed on {main.device}" if main else "no bench given"
               for s in scratch.values() for v in s if v not in speeds}
    paper = ("LRA paper (grey squares): full scale, Table 1 accuracy over the same tasks as our point, Table 2 "
             "speed and memory at 4K on TPU v3." if reference else "")
    sources = ("Each speed ÷ the softmax of its own bench file, or of the file nearest in date where its file has "
               "none: the LRA scores table names the file of every figure." if main else "")
    text = "\n".join(filter(None, [not_drawn_line(missing), paper, note, sources]))
    return _finish("lra_chart", fig, panel, handles, memory, text, main.device if main else "",
                   speeds, {v: s.source for v, s in main.speeds.items()} if main else {}, missing)


def pretraining(scores: Scores, main: DeviceSpeeds, styles, source: str = "") -> View | None:
    """lra_spt.png: one row per variant whose two arms are scored on the same tasks (`spt_report.same_tasks`),
    the best from scratch at the top: its score from scratch (hollow) and self-pretrained (filled), each with
    ±1 std of a single-seed score, and an arrow from one to the other; the row names the variant's speed on the
    main device. None without a self-pretrained arm. `source` (`spt_report.source_note`): where both arms' runs
    are not the headline's, which runs they are and the tasks whose recipe differs."""
    pairs = spt_report.arms(scores)
    if not pairs:
        return None
    speeds = relative(main)
    rows, missing = [], {}
    for series, spt, scratch in pairs:
        for variant in sorted(set(spt) | set(scratch)):
            if variant not in spt:
                missing[variant] = "no self-pretrained arm"
            elif variant not in scratch or scratch[variant]["score"] is None or spt[variant]["score"] is None:
                missing[variant] = "not scored in both arms"
            elif not spt_report.same_tasks(spt[variant], scratch[variant]):
                missing[variant] = "the arms are scored on other tasks"
            else:
                rows.append((series, variant, scratch[variant], spt[variant]))
    rows.sort(key=lambda row: (row[2]["score"], row[1]))  # the best from scratch on the top row
    several = len(pairs) > 1
    title = ("Self-pretraining: each arrow runs from a variant's score trained from scratch (hollow) to its score "
             f"self-pretrained (filled), same fine-tuning budget, best from scratch at the top; {ours_line(scores)}")
    fig = plt.figure(figsize=(WIDTH_IN, 8.0), dpi=DPI)
    ax = fig.add_axes((0.25, 0.3, 0.7, 0.6))
    ax.set_title(wrap(title, TITLE_CHARS), fontsize=TITLE_PT)
    ax.set_xlabel("LRA score: mean test accuracy over the tasks scored (%)", fontsize=AXIS_PT)
    ax.set_ylabel(f"variant, and its training speed at length {main.length} × softmax's on {main.device}",
                  fontsize=AXIS_PT)
    ax.tick_params(labelsize=AXIS_PT)
    points, names = [], []
    for row, (series, variant, before, after) in enumerate(rows):
        color, marker = ("black", "D") if variant in REFERENCE_VARIANTS else styles[variant]
        ends = []
        for arm, m, filled, y in ((base_scale(series), before, False, row - ARM_OFFSET),
                                  (series, after, True, row + ARM_OFFSET)):
            x = m["score"]
            if m["score_std"]:
                ax.plot([x - m["score_std"], x + m["score_std"]], [y, y], color=color, linewidth=1.0, alpha=0.8,
                        gid=f"spt-score-bar-{arm.replace(', ', '-')}-{variant}")
            ax.scatter([x], [y], s=ROW_MARKER_AREA, marker=marker, facecolor=color if filled else "none",
                       edgecolor=color, linewidth=1.4, zorder=3)
            key = variant + (f" ({base_scale(series)})" if several else "")
            points.append(chart_panels.Point(variant, arm, x, y, ROW_MARKER_AREA, "",
                                             key if arm == base_scale(series) else f"{key} [{series}]", color, marker))
            ends.append((x, y))
        ax.add_patch(FancyArrowPatch(*ends, arrowstyle="-|>", color=color, linewidth=1.2, shrinkA=5, shrinkB=5,
                                     mutation_scale=11, zorder=3.5))
        speed = speeds.get(variant)
        names.append(variant + (f" ({base_scale(series)})" if several else "")
                     + (f"  {speed[0]:.2g}×" if speed else "  no speed"))
    ax.set_yticks(range(len(rows)), names)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.grid(axis="x", color="0.9")
    ax.set_axisbelow(True)
    handles = [Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="0.3", linestyle="",
                      label="from scratch"),
               Line2D([], [], marker="o", color="0.3", linestyle="", label="self-pretrained"),
               Line2D([], [], color="0.3", linewidth=1.0, label="±1 std of a single-seed score")]
    legends = [fig.legend(handles=handles, loc="upper left", ncol=3, fontsize=SMALLEST_PT, frameon=False,
                          borderpad=0.2, columnspacing=2.0)]
    note = "\n".join(filter(None, [source, not_drawn_line(missing)]))
    text = fig.text(0, 0, wrap(note, NOTE_CHARS), fontsize=SMALLEST_PT, va="top", ha="left")
    _lay_out(fig, ax, legends, text)
    panel = Panel(ax, points, legends)
    return View("lra_spt", fig, panel, main.device, speeds, {v: s.source for v, s in main.speeds.items()}, missing,
                note, legends)


def cpu(scores: Scores, speeds: DeviceSpeeds, styles) -> View:
    """lra_cpu.png: every variant from scratch against its speed measured on a CPU."""
    scratch = from_scratch(scores)
    across = sum(not s.same_command for s in speeds.speeds.values())
    title = (f"{speeds.device}, measured: LRA score against training speed at length {speeds.length} relative to "
             f"softmax (batch {speeds.batch_size}, dropout {speeds.dropout_rate:g}); {ours_line(scratch)}")
    relative_speeds = relative(speeds)
    fig, panel, handles, _ = _panel(scratch, relative_speeds, styles, title,
                                    f"training speed at length {speeds.length}, × softmax's (examples/s on "
                                    f"{speeds.device})", "", gid="cpu-score-bar")
    missing = {v: f"not measured on {speeds.device}" for s in scratch.values() for v in s if v not in relative_speeds}
    drift = (f"{across} of {len(speeds.speeds) - 1} ratios divide by a softmax measured at another time (drift "
             "included; the table names them)." if across else "")
    return _finish("lra_cpu", fig, panel, handles, f"bubble area: {speeds.memory_words} on {speeds.device}, "
                   "relative to softmax's", "\n".join(filter(None, [not_drawn_line(missing), drift])),
                   speeds.device, relative_speeds, {v: s.source for v, s in speeds.speeds.items()}, missing)


def modeled(scores: Scores, modeled_speeds: Modeled, source: str, styles) -> View:
    """lra_tpu_modeled.png: every modeled variant from scratch against the TPU compiler's modeled step."""
    scratch = from_scratch(scores)
    length, target, variants = modeled_speeds
    speeds, reasons = relative_modeled(modeled_speeds)
    batches = sorted({m["per_device_batch"] for m in variants.values() if m.get("per_device_batch")})
    batch = f", {'/'.join(map(str, batches))} examples per core" if batches else ""
    title = (f"{target}, modeled by the XLA TPU compiler, not measured{batch}: LRA score against the modeled "
             f"training speed at length {length} relative to softmax; {ours_line(scratch)}")
    fig, panel, handles, _ = _panel(scratch, speeds, styles, title, f"modeled training speed at length {length}, "
                                    f"× softmax's (compiled-only on {target}; no TPU ran)", "",
                                    gid="modeled-score-bar")
    missing = {v: reasons.get(v, "not in the compile JSON") for s in scratch.values() for v in sorted(s)
               if v not in speeds}
    label = next((m["modeled_label"] for m in variants.values() if m.get("modeled_label")), "")
    text = (f"Speed: the step compiled on a CPU for the TPU target (`python -m lra_jax.tools.compile --lengths`), "
            f"{label or 'modeled by libtpu'}.\n" + not_drawn_line(missing))
    return _finish("lra_tpu_modeled", fig, panel, handles, "bubble area: memory per device (compiled), relative to "
                   "softmax's", text, f"{target} (modeled)", speeds, {v: source for v in speeds}, missing)


def views(scores: Scores, main: DeviceSpeeds | None, reference: dict[str, Any] | None,
          cpu_speeds: DeviceSpeeds | None = None, modeled_speeds: Modeled | None = None, modeled_source: str = "",
          note: str = "", spt_scores: Scores | None = None, spt_source: str = "") -> list[View]:
    """Every figure the inputs allow, the headline first. The self-pretraining figure draws `spt_scores` (both
    arms) where the comparison has runs of its own, `scores` otherwise."""
    spt_scores = scores if spt_scores is None else spt_scores
    styles = chart_panels.variant_styles({v for s in (*scores.values(), *spt_scores.values()) for v in s})
    drawn = [headline(scores, main, reference, styles, note)]  # the same styles in every figure
    if main:
        drawn.append(pretraining(spt_scores, main, styles, spt_source))
    if cpu_speeds:
        drawn.append(cpu(scores, cpu_speeds, styles))
    if modeled_speeds:
        drawn.append(modeled(scores, modeled_speeds, modeled_source, styles))
    return [v for v in drawn if v is not None]
