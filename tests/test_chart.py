"""lra_jax.tools.chart: LRA score arithmetic, partial variants, and the chart/table files from fake runs."""

import json
import os

import pytest
from PIL import Image

from lra_jax.tools import chart
from lra_jax.errors import LraError

FIVE = ("listops", "text", "retrieval", "image", "pathfinder")


def write_result(root, task, variant, seed, accuracy, scale="full"):
    workdir = root / f"{task}-{scale}" / variant / f"seed{seed}"
    workdir.mkdir(parents=True)
    result = {"task": task, "variant": variant, "test_accuracy": accuracy, "scale": scale,
              "config": {"seed": seed, "scale": scale}}
    (workdir / "results.json").write_text(json.dumps(result))


def write_bench(path, rows):
    results = [{"variant": v, "length": n, "status": s, "examples_per_second": eps,
                "peak_memory_bytes": mem} for v, n, s, eps, mem in rows]
    path.write_text(json.dumps({"device": {"kind": "fake-accelerator", "platform": "cpu", "count": 1},
                                "results": results}))


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    # softmax: every task, two seeds (accuracies chosen so seed means are exact), plus Path-X.
    for i, task in enumerate(FIVE):
        write_result(root, task, "softmax", 0, 0.40 + 0.1 * i)
        write_result(root, task, "softmax", 1, 0.50 + 0.1 * i)
    write_result(root, "pathx", "softmax", 0, 0.5)
    # linear: two tasks only.
    write_result(root, "listops", "linear", 0, 0.20)
    write_result(root, "text", "linear", 0, 0.60)
    # a mini-scale run that --scale=full must ignore.
    write_result(root, "listops", "local", 0, 0.99, scale="mini")
    # a diverged run is not a result: left out, with a note.
    diverged = root / "listops-full" / "linear" / "seed1"
    diverged.mkdir(parents=True)
    (diverged / "results.json").write_text(json.dumps(
        {"status": "diverged", "task": "listops", "variant": "linear", "scale": "full",
         "diverged_at_step": 12, "config": {"seed": 1, "scale": "full"}}))
    # a broken file is skipped, not fatal.
    (root / "broken").mkdir()
    (root / "broken" / "results.json").write_text("{not json")
    return root


def test_score_is_mean_of_five_tasks_with_seeds_averaged_and_path_x_separate(runs):
    measured = chart.aggregate(chart.load_results(str(runs), scale="full"))
    softmax = measured["softmax"]
    # seed means: 45, 55, 65, 75, 85 (%)  -> score 65; Path-X (50) not in it.
    assert softmax["accuracy"]["listops"] == pytest.approx(45.0)
    assert softmax["accuracy"]["pathfinder"] == pytest.approx(85.0)
    assert softmax["score"] == pytest.approx(65.0)
    assert softmax["path_x"] == pytest.approx(50.0)
    assert softmax["seeds"]["text"] == 2 and softmax["seeds"]["path_x"] == 1
    assert softmax["missing"] == []
    assert "local" not in measured  # other scale filtered out


def test_partial_variant_lists_missing_tasks(runs):
    linear = chart.aggregate(chart.load_results(str(runs), scale="full"))["linear"]
    assert linear["missing"] == ["retrieval", "image", "pathfinder"]
    assert linear["score"] == pytest.approx(40.0)  # over the tasks present only


def test_scale_none_reads_every_scale(runs):
    assert "local" in chart.aggregate(chart.load_results(str(runs)))


def test_chart_png_svg_and_markdown(runs, tmp_path):
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 4 * 2**30), ("linear", 1024, "ok", 400.0, 2**30),
                        ("softmax", 4096, "oom", None, None), ("linear", 4096, "ok", 100.0, 2 * 2**30)])
    out = tmp_path / "charts"
    paths = chart.make_chart(str(runs), str(out), bench_path=str(bench), scale="full", length=1024)
    for key in ("png", "svg", "md"):
        assert os.path.getsize(paths[key]) > 0
    with Image.open(paths["png"]) as image:
        width, height = image.size
    assert 800 <= width <= 4000 and 400 <= height <= 3000
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    softmax_cells = [c.strip() for c in rows["softmax"].split("|")[1:-1]]
    assert softmax_cells[1:8] == ["45.00", "55.00", "65.00", "75.00", "85.00", "65.00", "50.00"]
    assert softmax_cells[9:11] == ["20", "4.00"]  # examples/s (3 significant digits) and GiB at 1024
    linear_cells = [c.strip() for c in rows["linear"].split("|")[1:-1]]
    assert linear_cells[6] == "40.00*" and linear_cells[-1] == "retrieval, image, pathfinder"
    assert "examples/s @1024" in table
    assert "Left out, diverged (not results): linear listops seed 1 (step 12)." in table
    # GitHub renders a table only when its delimiter row has one cell per header cell
    lines = table.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("|---")]
    assert len(heads) == 3  # ours, the LRA paper's, the S4D paper's
    for i in heads:
        assert lines[i].count("---") == len(lines[i - 1].split("|")) - 2
    # the published panel's table comes from experiments/reference with its source
    assert "Transformer | softmax | 36.37" in table and "arXiv:2011.04006" in table
    with open(paths["svg"], encoding="utf-8") as f:
        assert "(hollow)" in f.read()  # partial-variant legend entry


def test_state_space_reference_is_drawn_apart(tmp_path):
    """s4d is not attention: a labelled row and a diamond on our panel, its published score as a line."""
    root = tmp_path / "runs"
    for task in FIVE:
        write_result(root, task, "softmax", 0, 0.5)
        write_result(root, task, "s4d", 0, 0.8)
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 2**30), ("s4d", 1024, "ok", 80.0, 2**29)])
    paths = chart.make_chart(str(root), str(tmp_path / "out"), bench_path=str(bench), length=1024)
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert "| s4d (state-space model, not attention (the reference)) | 80.00" in table
    assert "| S4D-LegS | — | 60.50 | 86.20 | 89.50 | — | 93.10 | 91.90 | — | — |" in table
    assert "2206.11893" in table and "2303.06349" in table
    with open(paths["svg"], encoding="utf-8") as f:
        svg = f.read()
    assert "s4d: state-space model, not attention" in svg


def test_ssm_reference_file_is_consistent():
    with open(chart.SSM_REFERENCE, encoding="utf-8") as f:
        reference = json.load(f)
    assert "source" in reference and "2206.11893" in reference["paper"]
    for model in reference["models"]:
        accuracy = model["accuracy"]
        if any(accuracy[t] is None for t in FIVE):  # an average needs every task
            assert model["avg5"] is None and model["avg6"] is None, model["paper_name"]
            continue
        # published figures are rounded to 0.01: their mean agrees to within that rounding
        assert sum(accuracy[t] for t in FIVE) / 5 == pytest.approx(model["avg5"], abs=0.006), model["paper_name"]
        path_x = 50.0 if accuracy["path_x"] == "FAIL" else accuracy["path_x"]  # the paper's convention
        assert (sum(accuracy[t] for t in FIVE) + path_x) / 6 == pytest.approx(model["avg6"], abs=0.006)
    implemented = [m["paper_name"] for m in reference["models"] if m["variant"] == "s4d"]
    assert implemented in ([], [reference["implemented"]])


def test_slow_speeds_keep_their_digits():
    assert chart._significant(0.0342) == "0.0342" and chart._significant(None) == "—"


def test_default_length_is_longest_with_results(tmp_path):
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 1024, "ok", 20.0, 1), ("softmax", 4096, "oom", None, None),
                        ("linear", 2048, "ok", 50.0, 1)])
    length, at = chart.load_bench(str(bench), None)
    assert length == 2048 and set(at) == {"linear"}
    with pytest.raises(LraError, match="3072"):
        chart.load_bench(str(bench), 3072)


def test_no_results_is_a_clear_error(tmp_path):
    with pytest.raises(LraError, match="no results.json"):
        chart.make_chart(str(tmp_path), str(tmp_path / "out"))


def test_reference_file_is_consistent():
    with open(chart.REFERENCE, encoding="utf-8") as f:
        reference = json.load(f)
    assert "source" in reference and "2011.04006" in reference["paper"]
    for model in reference["models"]:
        mean = sum(model["accuracy"][t] for t in FIVE) / 5
        if model["paper_name"] != "Sinkhorn Trans.":  # published average has a known typo, see notes
            # The paper rounds each accuracy and the average to two decimals: +-0.005 each.
            assert mean == pytest.approx(model["avg"], abs=0.006), model["paper_name"]
    by_name = {m["paper_name"]: m["variant"] for m in reference["models"]}
    assert by_name["Transformer"] == "softmax" and by_name["Sparse Trans."] == "strided"


def test_crowded_labels_do_not_overlap_and_stay_inside_the_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lra_jax.tools.chart_labels import overlapping_pairs, place_labels, text_extent

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
