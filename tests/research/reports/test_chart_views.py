"""The chart's figures as drawn: readable at the width people see them (no text under 9 px when shown 760 px
wide), no label over a label, a point, an error bar or a legend (from the renderer's extents), the headline
from scratch only with the variants it cannot draw named, and every point in the interactive view."""

import json

import pytest
from chart_helpers import write_bench, write_result

from lra_jax.research.reports import chart_interactive, chart_labels, lra_chart
from lra_jax.research.reports.chart_manifest import ChartOptions
from lra_jax.research.reports.chart_panels import PAPER

pytestmark = pytest.mark.one_stack("oldest")

# A cluster like the committed chart's: ten variants within 2.5-4x and 45-52%, with wide error bars.
CLUSTER = ["linear", "local", "performer", "routing", "sinkhorn", "strided", "taylor", "bigbird", "fnet", "longformer"]
SHOWN_PX = 760  # the docs home page's content column


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("crowded")
    runs, rows = root / "runs", [("softmax", 4096, "ok", 10.0, 2**30)]
    for i, variant in enumerate(["softmax", *CLUSTER]):
        for seed in range(3):
            spread = 0.02 * (i % 4) * (seed - 1)  # some wide bars
            write_result(runs, "listops", variant, seed, 0.36 + 0.004 * i + spread, scale="mini")
            write_result(runs, "pathfinder", variant, seed, 0.55 + 0.003 * i - spread, scale="mini")
        if variant != "softmax":
            rows.append((variant, 4096, "ok", 10.0 * (2.5 + 0.15 * i), 2**29 + 2**26 * i))
    for seed in range(3):  # scored, but with no speed on the bench's device
        write_result(runs, "listops", "mega", seed, 0.49, scale="mini")
        write_result(runs, "pathfinder", "mega", seed, 0.75, scale="mini")
    write_bench(root / "bench.json", rows)
    options = ChartOptions(runs=str(runs), bench=str(root / "bench.json"), length=4096, out=str(root / "out"),
                           scale="mini")
    views, texts, record = lra_chart.render(options)
    yield views, texts, record
    lra_chart.close(views)


def test_no_label_covers_a_label_a_point_an_error_bar_or_the_legend(rendered):
    views, _, _ = rendered
    for view in views:
        assert view.panel.annotations, view.name
        assert view.panel.problems() == [], view.name


def test_every_text_reads_at_the_width_the_docs_show_the_figure(rendered):
    views, _, record = rendered
    for panel in record["panels"]:
        assert panel["width_px"] <= 1400, panel["figure"]
        assert panel["smallest_text_px"] * SHOWN_PX / panel["width_px"] >= 9.0, panel["figure"]


def test_the_headline_is_one_point_per_variant_from_scratch_with_the_paper_and_names_what_it_cannot_draw(rendered):
    views, texts, record = rendered
    headline = record["panels"][0]
    assert headline["figure"] == "lra_chart"
    ours = [p for p in headline["points"] if p["series"] != PAPER]
    assert sorted(p["variant"] for p in ours) == sorted(["softmax", *CLUSTER])
    assert {p["series"] for p in ours} == {"mini"} and any(p["series"] == PAPER for p in headline["points"])
    assert "Not drawn: mega (no measured speed on fake-accelerator)." in headline["note"]
    assert "cannot draw mega (no measured speed on fake-accelerator)" in texts["lra_summary.md"]


def test_the_check_itself_sees_an_overlap(rendered):
    """`covered` is what the tests above rely on: it must report a label set on another, on a point and on
    an error bar, and a leader line through another label's text."""
    views, _, _ = rendered
    panel = views[0].panel
    ax, first = panel.ax, panel.annotations[0]
    x, y = first.xy
    added = []  # removed at the end: the figure is the module's

    def annotate(*args, **kwargs):
        added.append(ax.annotate(*args, **kwargs))
        return added[-1]

    try:
        twin = annotate(first.get_text() + " twin", (x, y), xytext=first.get_position(), textcoords=first.anncoords,
                        ha="center", va="center", fontsize=first.get_fontsize())
        found = chart_labels.covered(ax.figure, panel.annotations + [twin], panel._point_boxes(), panel._bars(),
                                     panel.legends)
        assert any("overlaps label" in line and "twin" in line for line in found), found
        on_point = annotate("on a point", (x, y), ha="center", va="center")
        assert any("'on a point' overlaps the point" in line
                   for line in chart_labels.covered(ax.figure, [on_point], panel._point_boxes()))
        on_bar = annotate("on a bar", (x, y), ha="center", va="center")
        assert any("'on a bar' overlaps the error bar" in line
                   for line in chart_labels.covered(ax.figure, [on_bar], [], panel._bars()))
        # A leader line from left of the first label's text to a label right of it runs through that text.
        box = chart_labels.text_extent(first, ax.figure.canvas.get_renderer())
        start = (box.x0 - 30, (box.y0 + box.y1) / 2)
        through = annotate("through", ax.transData.inverted().transform(start),
                           xytext=((box.x1 + 60 - start[0]) * 72.0 / ax.figure.dpi, 0), textcoords="offset points",
                           ha="center", va="center", arrowprops=dict(arrowstyle="-"))
        assert (f"label {first.get_text()!r} is crossed by the leader line of 'through'"
                in chart_labels.covered(ax.figure, [first, through], []))
    finally:
        for annotation in added:
            annotation.remove()


def test_the_interactive_view_holds_every_point_of_every_panel_with_its_hover(rendered):
    views, texts, _ = rendered
    document = json.loads(texts[chart_interactive.NAME])
    panels = {p["name"]: p for p in document["panels"]}
    for view in views:
        if view.name not in panels:  # the self-pretraining figure's points are the accelerator panel's
            continue
        drawn = {(p.variant, p.x, p.y) for p in view.panel.points}
        held = {(p["variant"], p["x"], p["y"]) for p in panels[view.name]["points"]}
        assert {(v, round(x, 6), round(y, 4)) for v, x, y in drawn} <= {(v, round(x, 6), round(y, 4))
                                                                         for v, x, y in held}
    softmax = next(p for p in panels["lra_chart"]["points"] if p["variant"] == "softmax")
    hover = "\n".join(softmax["hover"])
    for words in ("softmax", "Pathfinder: 55.0 ± 0.0 (3 seeds, learned: ", "speed: 1× softmax's", "memory: 1× softmax's",
                  "scale: mini", "device: fake-accelerator", "runs: ", "speed from: "):
        assert words in hover, (words, hover)
