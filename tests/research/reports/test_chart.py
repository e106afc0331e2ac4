"""lra_jax.tools.chart: LRA score arithmetic, validation-chosen grid points, partial variants, error bars,
and the chart/table files from fake runs."""

import json
import os
import re

import pytest
from chart_helpers import (  # noqa: F401 - runs is a fixture
    FIVE,
    chart,
    measure,
    run_dir,
    runs,
    table_rows,
    write_bench,
    write_diverged,
    write_result,
)
from PIL import Image

from lra_jax.errors import LraError
from lra_jax.research.reports import chart_speeds, lra_results

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def test_score_is_mean_of_five_tasks_with_seeds_averaged_and_path_x_separate(runs):
    measured = measure(runs, scale="full")
    softmax = measured["softmax"]
    # seed means: 45, 55, 65, 75, 85 (%)  -> score 65; Path-X (50) not in it.
    assert softmax["accuracy"]["listops"] == pytest.approx(45.0)
    assert softmax["accuracy"]["pathfinder"] == pytest.approx(85.0)
    assert softmax["score"] == pytest.approx(65.0)
    assert softmax["path_x"] == pytest.approx(50.0)
    assert softmax["seeds"]["text"] == 2 and softmax["seeds"]["path_x"] == 1
    # two seeds 10 points apart: std 10/sqrt(2) per task; a single-seed score: sqrt(5 * 50) / 5
    assert softmax["std"]["text"] == pytest.approx(50 ** 0.5)
    assert softmax["std"]["path_x"] is None
    assert softmax["score_std"] == pytest.approx(250 ** 0.5 / 5)
    assert softmax["missing"] == []
    assert "local" not in measured  # other scale filtered out
    assert "taylor" not in measured  # diverged only: no result


def test_partial_variant_lists_missing_tasks(runs):
    linear = measure(runs, scale="full")["linear"]
    assert linear["missing"] == ["retrieval", "image", "pathfinder"]
    assert linear["score"] == pytest.approx(40.0)  # over the tasks present only
    assert linear["score_std"] is None  # one seed per task: no spread


def test_scale_none_reads_every_scale(runs):
    assert "local" in measure(runs)


def test_score_spread_is_the_std_of_a_single_seed_score(tmp_path):
    assert lra_results.score_spread([7.5, 10.0]) == pytest.approx(6.25)  # sqrt(7.5² + 10²) / 2
    assert lra_results.score_spread([7.5, None]) is None and lra_results.score_spread([]) is None
    root = tmp_path / "runs"
    for seed, (listops, text) in enumerate([(0.30, 0.600), (0.40, 0.675), (0.50, 0.750)]):
        write_result(root, "listops", "softmax", seed, listops)
        write_result(root, "text", "softmax", seed, text)
    softmax = measure(root)["softmax"]
    assert softmax["std"]["listops"] == pytest.approx(10.0) and softmax["std"]["text"] == pytest.approx(7.5)
    assert softmax["score"] == pytest.approx(53.75) and softmax["score_std"] == pytest.approx(6.25)
    table = lra_results.markdown_table({"full": measure(root)}, None, None, None)
    cells = table_rows(table)["softmax"]
    # the columns are the tasks some variant ran; the others are named once under the table
    assert cells[1:3] == ["40.00 ± 10.00", "67.50 ± 7.50"] and cells[3] == "53.75 ± 6.25*"
    assert cells[4] == "3"  # seeds: alike on every task, one number
    assert "Not scored at this scale: Retrieval, Image, Pathfinder, Path-X." in table
    assert "## Selected grid points" not in table  # no grid anywhere


@pytest.fixture
def grid(tmp_path):
    """listops, two learning rates x three seeds: the better validation point has the worse test."""
    root = tmp_path / "grid"
    for seed, test in enumerate([0.5, 0.6, 0.7]):
        write_result(root, "listops", "softmax", seed, test, point="optimizer.learning_rate=0.001", val=0.8)
        write_result(root, "listops", "softmax", seed, 0.9, point="optimizer.learning_rate=0.005", val=0.7)
    return root


def test_the_point_is_chosen_on_validation_never_test(grid, tmp_path):
    paths = chart(grid, tmp_path / "out")
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert table_rows(table)["softmax"][1] == "60.00 ± 10.00"  # not the 90.00 of the better-test point
    assert "Selection is on validation, never on test" in table
    section = table[table.index("## Selected grid points"):]
    assert ("| softmax | ListOps | learning_rate=0.001 | learning_rate=0.001: 80.00; learning_rate=0.005: 70.00 "
            "| 0, 1, 2 | 0, 1, 2 | 60.00 ± 10.00 |") in section


def test_a_diverged_seed_takes_its_point_out_and_is_named_with_it(grid, tmp_path):
    write_diverged(grid, "listops", "softmax", 3, 7, point="optimizer.learning_rate=0.001")
    chosen = measure(grid)["softmax"]["chosen"]["listops"]
    assert chosen.point == "optimizer.learning_rate=0.005" and chosen.test_mean == pytest.approx(0.9)
    paths = chart(grid, tmp_path / "out")
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert "Left out, diverged (not results): softmax listops learning_rate=0.001 seed 3 (step 7)." in table
    assert "| learning_rate=0.005: 70.00; diverged: learning_rate=0.001 |" in table


def test_single_runs_beside_grid_points_are_one_more_candidate(tmp_path):
    """The committed tree mixes old `<variant>/seed0` runs with grid runs, some unfinished."""
    root = tmp_path / "runs"
    write_result(root, "listops", "softmax", 0, 0.40, val=0.45)
    write_result(root, "listops", "softmax", 0, 0.30, point="optimizer.learning_rate=0.005", val=0.50)
    write_result(root, "listops", "softmax", 1, 0.34, point="optimizer.learning_rate=0.005", val=0.10)
    run_dir(root, "listops", "softmax", 0, "full", "optimizer.learning_rate=0.001")  # no results.json yet
    paths = chart(root, tmp_path / "out")
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    # compared on seed 0 (the only seed both have): 50 > 45; then the test mean over both its seeds
    assert ("| softmax | ListOps | learning_rate=0.005 | (no grid): 45.00; learning_rate=0.005: 50.00 | 0 "
            "| 0, 1 | 32.00 ± 2.83 |") in table


def test_short_point_drops_key_prefixes_unless_keys_then_clash():
    assert lra_results.short_point("optimizer.learning_rate=0.005") == "learning_rate=0.005"
    assert lra_results.short_point("optimizer.learning_rate=0.005,model.dropout=0.1") == "learning_rate=0.005, dropout=0.1"
    assert lra_results.short_point("a.rate=1,b.rate=2") == "a.rate=1, b.rate=2"
    assert lra_results.short_point("") == "(no grid)"


def test_caption_says_how_points_were_chosen(grid, runs):
    assert "best mean validation accuracy" in lra_results.caption(measure(grid))
    assert "never chosen on test" in lra_results.caption(measure(grid))
    plain = lra_results.caption(measure(runs, scale="full"))
    assert "grid point" not in plain and "no grid" in plain
    assert "n = 1 to 2 seeds per task" in plain


@pytest.mark.slow
def test_error_bars_are_one_single_seed_score_std(runs, tmp_path):
    """A bar where every task has two seeds or more, in the bubble's colour (black for s4d); none with one seed."""
    for task in FIVE:
        write_result(runs, task, "s4d", 0, 0.8)
        write_result(runs, task, "s4d", 1, 0.9)
    measured = measure(runs, scale="full")
    bars = lra_results.score_bars(measured, ["softmax", "linear", "s4d"])
    assert bars[0] == pytest.approx(250 ** 0.5 / 5) and bars[1] is None and bars[2] == pytest.approx(250 ** 0.5 / 5)
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 2**30), ("linear", 1024, "ok", 400.0, 2**30),
                        ("s4d", 1024, "ok", 80.0, 2**29)])
    paths = chart(runs, tmp_path / "out", bench=bench, scale="full")
    with open(paths["svg"], encoding="utf-8") as f:
        svg = f.read()
    assert 'id="score-bar-full-softmax-0"' in svg and 'id="score-bar-full-s4d-0"' in svg
    assert "score-bar-full-linear" not in svg
    s4d_bar = re.search(r'<g id="score-bar-full-s4d-2">(.*?)</g>', svg, re.S).group(1)
    assert "stroke: #000000" in s4d_bar
    assert "validation" in svg or "no grid" in svg  # the caption under the panel


def test_chart_png_svg_and_markdown(runs, tmp_path):
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 4 * 2**30), ("linear", 1024, "ok", 400.0, 2**30),
                        ("softmax", 4096, "oom", None, None), ("linear", 4096, "ok", 100.0, 2 * 2**30)])
    out = tmp_path / "charts"
    paths = chart(runs, out, bench=bench, scale="full", length=1024)
    for key in ("png", "svg", "md"):
        assert os.path.getsize(paths[key]) > 0
    with Image.open(paths["png"]) as image:
        width, height = image.size
    assert 800 <= width <= 4000 and 400 <= height <= 3000
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    rows = table_rows(table)
    softmax_cells = rows["softmax"]
    assert softmax_cells[1:8] == ["45.00 ± 7.07", "55.00 ± 7.07", "65.00 ± 7.07", "75.00 ± 7.07", "85.00 ± 7.07",
                                  "65.00 ± 3.16", "50.00"]
    assert softmax_cells[8] == "2/2/2/2/2/1"  # seeds per task present, Path-X last
    linear_cells = rows["linear"]
    assert linear_cells[6] == "40.00*" and linear_cells[3:6] == ["—", "—", "—"]  # the tasks it did not run
    # speed relative to softmax and GiB at 1024: a table of their own, the rows in score order
    speeds = table_rows(table.split("## Speed and memory\n")[1].split("\n## ")[0])
    assert speeds["softmax"][1:3] == ["1", "4.00"] and speeds["linear"][1:3] == ["20", "1.00"]
    assert list(speeds)[1:] == list(rows)[1:3]
    assert "× softmax @1024 (fake-accelerator)" in table
    # where each speed came from, with the file, the softmax it is divided by and what the memory is
    assert "| linear | 400 | 20 | 20 | the same command |" in table
    assert "| linear | 1.00 | measured peak | 0.25 | " in table
    assert "Left out, diverged (not results): taylor listops seed 1 (step 12)." in table
    assert "sample std over seeds (ddof 1" in table and "never on test" in table
    # GitHub renders a table only when its delimiter row has one cell per header cell
    lines = table.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("|---")]
    # ours, speed and memory, full scale against the paper (one table per task: the five and Path-X), speed
    # sources (speed, memory), the LRA paper's (Table 1, Table 2), the S4D, S5, LRU and Mega papers', and the
    # variants scored on fewer tasks, listed apart from the ranking
    assert len(heads) == 17
    for i in heads:
        assert lines[i].count("---") == len(lines[i - 1].split("|")) - 2
    # the published panel's table comes from experiments/reference with its source
    assert "Transformer (softmax) | 36.37" in table and "arXiv:2011.04006" in table
    with open(paths["svg"], encoding="utf-8") as f:
        svg = f.read()
    assert "full scale (solid)" in svg and "scored on fewer tasks" in svg  # legend entries


@pytest.mark.slow
def test_state_space_reference_is_drawn_apart(tmp_path):
    """s4d is not attention: a labelled row and a black diamond on the chart, named in the legend; its
    published score is in the table (the figure keeps to measured points and the LRA paper's)."""
    root = tmp_path / "runs"
    for task in FIVE:
        write_result(root, task, "softmax", 0, 0.5)
        write_result(root, task, "s4d", 0, 0.8)
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 2**30), ("s4d", 1024, "ok", 80.0, 2**29)])
    paths = chart(root, tmp_path / "out", bench=bench, length=1024)
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert "| s4d † | 80.00" in table and "† s4d: the reference: a state-space model, not attention." in table
    assert "| S4D-Lin (s4d) | 60.52 | 86.97 | 90.96 | 87.93 | 93.96 | FAIL | 84.07 | 78.39 |" in table
    assert "2206.11893" in table and "annotated-s4" in table
    with open(paths["svg"], encoding="utf-8") as f:
        svg = f.read()
    assert "s4d: state-space yardstick" in svg
    with open(paths["inputs"], encoding="utf-8") as f:
        points = json.load(f)["panels"][0]["points"]
    assert [(p["variant"], p["marker"], p["color"]) for p in points if p["variant"] == "s4d"] == [
        ("s4d", "D", "#000000")]


def test_slow_speeds_keep_their_digits():
    assert lra_results._significant(0.0342) == "0.0342" and lra_results._significant(None) == "—"


def test_default_length_is_the_longest_softmax_ran_at(tmp_path):
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 1), ("softmax", 4096, "oom", None, None),
                        ("linear", 1024, "ok", 50.0, 1), ("linear", 2048, "ok", 50.0, 1)])
    speeds = chart_speeds.device_speeds(str(bench), length=None)
    assert speeds.length == 1024 and set(speeds.speeds) == {"softmax", "linear"}
    with pytest.raises(LraError, match="no softmax result at length 2048"):
        chart_speeds.device_speeds(str(bench), length=2048)


def test_no_results_is_a_clear_error(tmp_path):
    with pytest.raises(LraError, match="no results.json"):
        chart(tmp_path, tmp_path / "out")


def test_spt_reference_file_is_consistent():
    """Every published self-pretraining figure names its model, protocol, what it averages, where the paper
    states it; the figure is a number, a signed range or an approximation the paper itself gives."""
    with open(lra_results.SPT_REFERENCE, encoding="utf-8") as f:
        reference = json.load(f)
    assert "2310.02980" in reference["paper"] and reference["source"]["figures"]
    for figure in reference["figures"]:
        assert all(figure[k] for k in ("model", "training", "over", "where")), figure
        assert re.fullmatch(r"(about )?[+]?\d+(\.\d)?( to [+]\d+)?", figure["figure"]), figure


def test_reference_file_is_consistent():
    with open(lra_results.REFERENCE, encoding="utf-8") as f:
        reference = json.load(f)
    assert "source" in reference and "2011.04006" in reference["paper"]
    for model in reference["models"]:
        mean = sum(model["accuracy"][t] for t in FIVE) / 5
        if model["paper_name"] != "Sinkhorn Trans.":  # published average has a known typo, see notes
            # The paper rounds each accuracy and the average to two decimals: +-0.005 each.
            assert mean == pytest.approx(model["avg"], abs=0.006), model["paper_name"]
    by_name = {m["paper_name"]: m["variant"] for m in reference["models"]}
    assert by_name["Transformer"] == "softmax" and by_name["Sparse Trans."] == "strided"


def test_the_label_geometry_sees_what_crosses_and_what_does_not():
    """The placer's and the check's geometry: a segment through a box, beside it, stopping short of it,
    vertical and horizontal ones (the clipping's parallel cases), and two segments crossing or not."""
    from lra_jax.research.reports.chart_labels import crossings, overlaps, segments_crossing

    box = (10.0, 10.0, 20.0, 20.0)
    segments = [((0, 15), (30, 15)),  # straight through
                ((0, 0), (30, 5)),  # below it
                ((0, 15), (9, 15)),  # stops short
                ((15, 0), (15, 30)),  # vertical, through
                ((25, 0), (25, 30)),  # vertical, beside
                ((0, 25), (30, 25)),  # horizontal, above
                ((15, 15), (40, 40))]  # starts inside
    assert crossings([a for a, _ in segments], [b for _, b in segments], [box])[:, 0].tolist() == [
        True, False, False, True, False, False, True]
    assert segments_crossing([(0, 0), (0, 0)], [(10, 10), (10, 0)], [((0, 10), (10, 0))]).tolist() == [[True], [False]]
    assert overlaps([box, (30, 30, 40, 40)], [(15, 15, 25, 25)]).tolist() == [[25.0], [0.0]]


def test_crowded_labels_do_not_overlap_and_stay_inside_the_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lra_jax.research.reports.chart_labels import (
        overlapping_pairs,
        place_labels,
        text_extent,
    )

    fig, ax = plt.subplots(figsize=(6, 4))
    # twelve points packed into a tenth of the axes, as the linear-time variants are on a log x axis
    points = [(1.0 + 0.02 * (i % 4), 40.0 + 0.3 * (i // 4)) for i in range(12)]
    ax.scatter(*zip(*points), s=400)
    ax.set_xlim(0.5, 1.5)
    ax.set_ylim(35, 50)
    labels = [f"variant_{i}*" for i in range(12)]
    annotations = place_labels(ax, points, labels, [400.0] * 12, fontsize=9)
    assert [a.get_text() for a in annotations] == labels
    assert overlapping_pairs(ax, annotations) == []
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    for a in annotations:
        box = text_extent(a, renderer)
        assert frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 and frame.y0 - 1 <= box.y0 and box.y1 <= frame.y1 + 1
    plt.close(fig)


@pytest.mark.slow
def test_min_seeds_leaves_out_and_names_the_cells_of_a_sweep_still_running(tmp_path):
    root = tmp_path / "runs"
    for seed in range(3):
        write_result(root, "pathfinder", "softmax", seed, 0.6, point="lr=1")
    write_result(root, "listops", "softmax", 0, 0.3, point="lr=1")  # second stage not run yet
    paths = chart(root, tmp_path / "out", min_seeds=3)
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert "Left out, fewer than 3 seeds at the chosen point: softmax listops (n=1)." in table
    row = next(line for line in table.splitlines() if line.startswith("| softmax |"))
    # ListOps not reported (no column), Pathfinder is
    assert "| ListOps |" not in table.split("## How the scores")[0] and "60.00 ± 0.00" in row
    assert "Not scored at this scale: ListOps, Text, Retrieval, Image, Path-X." in table
    with pytest.raises(LraError, match="fewer than 3 seeds"):
        chart(root / "listops-full", tmp_path / "out2", min_seeds=3)


@pytest.mark.slow
def test_a_modeled_panel_from_a_table2_compile_json(runs, tmp_path):
    """--modeled adds the TPU compiler's modeled speed as a figure of its own, labelled modeled, its own bars."""
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 2**30), ("linear", 1024, "ok", 400.0, 2**30)])
    modeled = tmp_path / "table2.json"
    rows = [{"variant": v, "task": "table2:4096", "target": "tpu-v3:4x4", "mode": "train", "result": "ok",
             "global_batch": 1024, "modeled_seconds": seconds, "roofline_seconds": seconds / 1.2,
             "memory": {"total": 3 * 2**30}}
            for v, seconds in (("softmax", 0.5), ("linear", 0.1))]
    modeled.write_text(json.dumps({"rows": rows}))
    paths = chart(runs, tmp_path / "out", bench=bench, scale="full", modeled=modeled)
    with open(paths["svg"], encoding="utf-8") as f:
        assert 'id="score-bar-full-softmax-0"' in f.read()
    with open(paths["lra_tpu_modeled.svg"], encoding="utf-8") as f:
        svg = f.read()
    assert "modeled by the XLA TPU compiler" in svg and "tpu-v3:4x4" in svg
    assert 'id="modeled-score-bar-full-softmax-0"' in svg
    with open(paths["inputs"], encoding="utf-8") as f:
        modeled_panel = json.load(f)["panels"][1]
    linear = next(p for p in modeled_panel["points"] if p["variant"] == "linear")
    assert linear["x"] == pytest.approx(5.0)  # (1024 / 0.1 s) / (1024 / 0.5 s): relative to softmax


def test_a_modeled_json_without_table2_rows_is_one_clear_error(runs, tmp_path):
    modeled = tmp_path / "compile.json"
    modeled.write_text(json.dumps({"rows": [{"variant": "softmax", "task": "listops", "mode": "train"}]}))
    with pytest.raises(LraError, match="no Table 2 rows: make it with `python -m lra_jax.tools.compile --lengths"):
        chart(runs, tmp_path / "out", modeled=modeled)
