"""lra_jax.tools.chart: what the chart compares: speeds against the softmax of the same file, the bubble for what
it is, the scale behind every point and the paper's points, a colour and a marker per variant, and the results
table's full-scale section."""

import json
import os

import pytest
from chart_helpers import chart, measure, run_dir, runs, table_rows, write_bench, write_result  # noqa: F401 - runs
from run_records import write_record

from lra_jax.errors import LraError
from lra_jax.research.compilation import table2_report
from lra_jax.research.reports import chart_speeds, lra_chart, lra_results
from lra_jax.research.reports.chart_manifest import ChartOptions, display_path

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def test_main_panel_speed_is_relative_to_softmax_on_one_device_latest_file_first(runs, tmp_path):
    """Several bench files of one device: per variant the most recent file's auto step; an --impl=xla step of a
    variant with a kernel is not what auto runs and is left out; another device's files are not mixed in."""
    write_bench(tmp_path / "old.json", [("softmax", 4096, "ok", 10.0, 4 * 2**30), ("linear", 4096, "ok", 30.0, 2**30)],
                kind="GPU-A", date="2026-01-01T00:00:00")
    write_bench(tmp_path / "new.json", [("softmax", 4096, "ok", 20.0, 4 * 2**30)], kind="GPU-A",
                date="2026-02-01T00:00:00")
    write_bench(tmp_path / "xla.json", [("linear", 4096, "ok", 999.0, 2**30)], kind="GPU-A",
                date="2026-03-01T00:00:00", impl="xla")
    write_bench(tmp_path / "other.json", [("softmax", 4096, "ok", 1.0, 2**30)], kind="GPU-B")
    speeds = chart_speeds.device_speeds(str(tmp_path / "*.json"))
    assert speeds.device == "GPU-A"  # the device with the most variants measured
    assert speeds.speeds["linear"].relative_memory == pytest.approx(0.25)
    assert speeds.speeds["softmax"].source.endswith("new.json")
    assert chart_speeds.device_speeds(str(tmp_path / "*.json"), device="gpu-b").speeds["softmax"].relative_speed == 1
    with pytest.raises(LraError, match="--device=GPU matches 2 of the devices"):
        chart_speeds.device_speeds(str(tmp_path / "*.json"), device="GPU")
    with pytest.raises(LraError, match="names no bench JSON"):
        chart_speeds.device_speeds(str(tmp_path / "missing-*.json"))


def test_each_speed_is_divided_by_the_softmax_of_its_own_file_and_the_chart_says_which(runs, tmp_path):
    """Softmax ran at 10 examples/s in one file and 20 in a later one: a variant is divided by the softmax of
    its own file (linear 30/10 = 3, not 30/20 = 1.5); a file with no softmax borrows the one nearest in date,
    and the figure's note and the table name the files."""
    write_bench(tmp_path / "old.json", [("softmax", 4096, "ok", 10.0, 4 * 2**30), ("linear", 4096, "ok", 30.0, 2**30)],
                kind="GPU-A", date="2026-01-01T00:00:00")
    write_bench(tmp_path / "new.json", [("softmax", 4096, "ok", 20.0, 4 * 2**30)], kind="GPU-A",
                date="2026-02-01T00:00:00")
    write_bench(tmp_path / "others.json", [("local", 4096, "ok", 50.0, 2**30)], kind="GPU-A",
                date="2026-01-10T00:00:00")
    speeds = chart_speeds.device_speeds(str(tmp_path / "*.json"))
    linear, local, softmax = (speeds.speeds[v] for v in ("linear", "local", "softmax"))
    assert linear.relative_speed == pytest.approx(3.0) and linear.same_file
    assert local.relative_speed == pytest.approx(5.0) and local.baseline_source.endswith("old.json")  # 9 days, not 22
    assert not local.same_file and softmax.relative_speed == 1 and softmax.source.endswith("new.json")
    for name in ("linear", "softmax", "local"):
        write_result(runs, "listops", name, 5, 0.3)
    paths = chart(runs, tmp_path / "out", bench=tmp_path / "*.json", scale="full")
    with open(paths["inputs"], encoding="utf-8") as f:
        main = json.load(f)["panels"][0]
    assert "the LRA scores table names the file of every figure" in main["note"]
    note = chart_speeds.ratio_note(speeds)
    assert "each variant ÷ softmax measured in the same bench file (new.json, old.json)" in note
    assert ("others.json has no softmax step as impl=auto runs it: local ÷ softmax of old.json (the file nearest in "
            "date)") in note
    assert "softmax itself ran at 10 to 20 examples/s across these files" in note
    with open(paths["md"], encoding="utf-8") as f:
        rows = table_rows(f.read().split("## Speed and memory on GPU-A")[1])
    assert rows["linear"][1:5] == ["30", "3", "10", "the same command"]
    assert rows["local"][1:4] == ["50", "5", "10"]
    assert rows["local"][4] == f"{display_path(str(tmp_path / 'old.json'))} (nearest in date: its file has no " \
                               "softmax step as impl=auto runs it)"  # as the manifest names the file


def test_a_ratio_to_a_softmax_another_command_of_the_file_measured_is_named(tmp_path):
    """A file merged by `bench --update`: linear was measured by its first command, softmax again by the second,
    local by the second too. linear's ratio spans two commands (their times' drift in it): the note names it,
    the table says so; local's does not."""
    path = tmp_path / "merged.json"
    write_bench(path, [("softmax", 4096, "ok", 10.0, 4 * 2**30), ("linear", 4096, "ok", 30.0, 2**30),
                       ("local", 4096, "ok", 50.0, 2**30)], kind="GPU-A")
    report = json.loads(path.read_text())
    report["commands"] = ["bench.py --variants=softmax,linear --lengths=4096",
                          "bench.py --variants=softmax,local --lengths=4096 --update"]
    path.write_text(json.dumps(report))
    speeds = chart_speeds.device_speeds(str(path))
    assert not speeds.speeds["linear"].same_command and speeds.speeds["local"].same_command
    note = chart_speeds.ratio_note(speeds)
    assert "linear ÷ a softmax that another command of their file measured" in note and "local ÷" not in note
    rows = table_rows("\n".join(lra_results.speed_sources([speeds])))
    assert rows["linear"][4] == "the same file, another command (`--update`, at another time)"
    assert rows["local"][4] == "the same command"


@pytest.mark.slow
def test_the_bubble_says_it_is_xla_s_estimate_where_the_bench_measured_no_peak(runs, tmp_path):
    """A bench result with XLA's compiled estimate only (the committed H200 files): the bubble and the table call
    it an estimate, not a measured peak; a result recording a device peak ("peak_memory_source") is measured."""
    def bench(path, source):
        results = [{"variant": v, "length": 1024, "status": "ok", "examples_per_second": eps, "dropout_rate": 0.1,
                    "compiled_step_memory_bytes": mem, "attention": {"impl": "auto"},
                    **({"peak_memory_bytes": 2 * mem, "peak_memory_source": "device"} if source else
                       {"peak_memory_bytes": mem})}
                   for v, eps, mem in (("softmax", 20.0, 4 * 2**30), ("linear", 40.0, 2**30))]
        path.write_text(json.dumps({"device": {"kind": "GPU-A", "platform": "gpu"}, "date": "2026-01-01T00:00:00",
                                    "settings": {"batch_size": 32}, "results": results}))
    bench(tmp_path / "estimate.json", source=False)
    paths = chart(runs, tmp_path / "out", bench=tmp_path / "estimate.json", scale="full", length=1024)
    with open(paths["svg"], encoding="utf-8") as f:
        svg = " ".join(f.read().split())
    assert "XLA's compiled estimate" in svg and "peak memory on" not in svg
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert "XLA-estimated GiB @1024 (GPU-A)" in table and "| XLA estimate | 0.25 |" in table
    bench(tmp_path / "measured.json", source=True)
    speeds = chart_speeds.device_speeds(str(tmp_path / "measured.json"), length=1024)
    assert speeds.speeds["linear"].memory_kind == "device" and speeds.speeds["linear"].memory_bytes == 2 * 2**30
    assert speeds.memory_words == "measured device peak memory"


def mixed_scales(tmp_path):
    """Runs of both scales: mini ListOps and Pathfinder for four variants, full ListOps for two."""
    root = tmp_path / "runs"
    for variant, accuracy in (("softmax", 0.40), ("linear", 0.30), ("performer", 0.33), ("local", 0.35)):
        for seed in (0, 1):
            write_result(root, "listops", variant, seed, accuracy + 0.01 * seed, scale="mini")
            write_result(root, "pathfinder", variant, seed, accuracy + 0.3, scale="mini")
    write_result(root, "listops", "softmax", 0, 0.37, scale="full")
    write_result(root, "listops", "performer", 0, 0.20, scale="full")
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 4096, "ok", 100.0, 8 * 2**30), ("linear", 4096, "ok", 560.0, 2**30),
                        ("performer", 4096, "ok", 540.0, 2**30), ("local", 4096, "ok", 520.0, 1.5 * 2**30)])
    return root, bench


@pytest.mark.slow
def test_full_scale_solid_mini_hollow_and_the_paper_on_the_same_axes(tmp_path):
    root, bench = mixed_scales(tmp_path)
    paths = chart(root, tmp_path / "out", bench=bench, length=4096)
    with open(paths["inputs"], encoding="utf-8") as f:
        main = json.load(f)["panels"][0]
    points = {(p["series"], p["variant"]): p for p in main["points"]}
    assert points[("full", "softmax")]["y"] == pytest.approx(37.0) and points[("full", "softmax")]["x"] == 1
    assert points[("mini", "linear")]["x"] == pytest.approx(5.6)
    assert "NVIDIA" not in main["title"] and "fake-accelerator" in main["title"]
    assert "full scale: ListOps, 1 seed" in main["title"] and "mini scale: ListOps + Pathfinder, 2 seeds" in main["title"]
    # the paper's Performer at its Table 2 speed, Table 1 accuracy over the tasks of our full-scale point (ListOps)
    performer = points[("paper", "performer")]
    assert performer["x"] == pytest.approx(5.7) and performer["y"] == pytest.approx(18.01)
    # linear has no full-scale point: averaged over the tasks of its mini one, but not joined to it
    assert points[("paper", "linear")]["y"] == pytest.approx((16.13 + 75.30) / 2)
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert "## Full scale against the LRA paper" in table and "### ListOps" in table
    assert "| performer | 20.00 | 18.01 | 1.99 | 1 | — | — | — |" in table
    assert "ListOps is scored at full scale on one seed" in table and "### Pathfinder" not in table
    with open(paths["svg"], encoding="utf-8") as f:
        svg = f.read()
    assert "full scale (solid)" in svg and "mini scale (hollow)" in svg and "LRA paper (full scale" in svg
    assert 'id="paper-line-performer"' in svg and "paper-line-linear" not in svg  # no line across scales


@pytest.mark.slow
def test_no_two_labels_of_the_drawn_chart_overlap(tmp_path):
    """The whole chart from fixture inputs: ten variants crowded at nearly the same speed and score, both
    scales, the paper's points and a CPU figure; no label covers another, a point, an error bar or a legend."""
    from lra_jax.research.reports.chart_labels import overlapping_pairs

    root = tmp_path / "runs"
    variants = ["softmax", "linear", "performer", "local", "bigbird", "linformer", "sinkhorn", "strided", "taylor",
                "fnet"]
    rows = []
    for i, variant in enumerate(variants):
        for seed in (0, 1):
            write_result(root, "listops", variant, seed, 0.40 + 0.002 * i + 0.01 * seed, scale="mini")
        write_result(root, "listops", variant, 0, 0.38 + 0.002 * i, scale="full")
        rows.append((variant, 4096, "ok", 100.0 if variant == "softmax" else 500.0 + 3 * i, 2**30))
    bench = tmp_path / "bench.json"
    write_bench(bench, rows)
    cpu = tmp_path / "cpu.json"
    write_bench(cpu, [(v, 2048, "ok", 1.0 + 0.01 * i, 2**28) for i, v in enumerate(variants)], kind="cpu")
    views, _, _ = lra_chart.render(ChartOptions(runs=str(root), bench=str(bench), cpu_bench=str(cpu),
                                                out=str(tmp_path / "out")))
    try:
        for view in views:
            assert overlapping_pairs(view.panel.ax, view.panel.annotations) == []
            assert view.panel.problems() == [], view.name
        assert sum(len(view.panel.annotations) for view in views) >= 2 * len(variants) + len(variants)
    finally:
        lra_chart.close(views)


@pytest.mark.slow
def test_self_pretrained_runs_are_scored_apart_and_drawn_with_an_arrow_from_scratch(tmp_path):
    """Runs whose results.json records a pretraining objective form their own cells: never selected against
    the runs from scratch, drawn at their own score with an arrow from scratch, their gain in the table."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        for variant, accuracy in (("softmax", 0.40), ("linear", 0.30)):
            write_result(root, "listops", variant, seed, accuracy + 0.02 * seed, scale="mini")
            spt = run_dir(root / "spt", "listops", variant, seed, "mini", "")
            write_record(spt, {
                "task": "listops", "variant": variant, "test_accuracy": accuracy + 0.1 + 0.02 * seed,
                "val_accuracy": 0.0, "scale": "mini", "pretrain_objective": "masked",
                "config": {"seed": seed, "scale": "mini"}})
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 4096, "ok", 100.0, 2**30), ("linear", 4096, "ok", 500.0, 2**29)])
    paths = chart(root, tmp_path / "out", bench=bench)
    with open(paths["inputs"], encoding="utf-8") as f:
        panels = json.load(f)["panels"]
    assert {p["series"] for p in panels[0]["points"]} == {"mini", "paper"}  # the headline: from scratch only
    main = next(p for p in panels if p["figure"] == "lra_spt")  # one row per variant, the score on x
    points = {(p["series"], p["variant"]): p for p in main["points"]}
    assert points[("mini", "linear")]["x"] == pytest.approx(31.0)
    assert points[("mini, SPT (masked)", "linear")]["x"] == pytest.approx(41.0)  # its val accuracy 0 chose nothing
    rows = {v: round(points[("mini", v)]["y"]) for v in ("linear", "softmax")}
    assert rows == {"linear": 0, "softmax": 1}, "the best from scratch on the top row"
    assert "mini scale, SPT (masked): ListOps, 2 seeds" in main["title"]
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert "## Self-pretraining gain (mini, SPT (masked) against mini from scratch)" in table
    assert "| linear | +10.00 ± 2.00 | +10.00 ± 2.00 |" in table  # std 1.41 each: sqrt(2 + 2)
    published = table.split("## Published (self-pretraining paper)")[1]  # after the gain, with its source
    assert "2310.02980" in published and "| Transformer + rotary embeddings | masked SPT |" in published
    with open(paths["inputs"], encoding="utf-8") as f:
        assert any(r["path"].endswith("spt_paper.json") for r in json.load(f)["inputs"])
    with open(paths["lra_spt.svg"], encoding="utf-8") as f:
        assert "self-pretrained" in f.read()  # the arrow's legend entry


@pytest.mark.slow
def test_every_panel_title_stays_inside_the_figure(tmp_path):
    """Every figure names the series it draws in its title, here both scales, and the self-pretraining figure
    the self-pretrained arm too: the lines are broken so that none runs off the figure's edge."""
    root = tmp_path / "runs"
    for i, variant in enumerate(["softmax", "linear"]):
        for seed in (0, 1):
            write_result(root, "listops", variant, seed, 0.40 + 0.01 * i, scale="mini")
            spt = run_dir(root / "spt", "listops", variant, seed, "mini", "")
            write_record(spt, {
                "task": "listops", "variant": variant, "test_accuracy": 0.45, "val_accuracy": 0.45, "scale": "mini",
                "pretrain_objective": "masked", "config": {"seed": seed, "scale": "mini"}})
        write_result(root, "listops", variant, 0, 0.38, scale="full")
    bench, cpu = tmp_path / "bench.json", tmp_path / "cpu.json"
    write_bench(bench, [("softmax", 4096, "ok", 100.0, 2**30), ("linear", 4096, "ok", 500.0, 2**29)])
    write_bench(cpu, [("softmax", 2048, "ok", 1.0, 2**28), ("linear", 2048, "ok", 2.0, 2**27)], kind="cpu")
    modeled = tmp_path / "table2.json"
    modeled.write_text(json.dumps({"rows": [
        {"variant": v, "task": "table2:4096", "target": "tpu-v3:4x4", "mode": "train", "result": "ok",
         "global_batch": 1024, "modeled_seconds": seconds, "roofline_seconds": seconds, "memory": {"total": 2**30}}
        for v, seconds in (("softmax", 0.5), ("linear", 0.1))]}))
    views, _, _ = lra_chart.render(ChartOptions(runs=str(root), bench=str(bench), cpu_bench=str(cpu),
                                                modeled=str(modeled), out=str(tmp_path / "out")))
    try:
        assert [v.name for v in views] == ["lra_chart", "lra_spt", "lra_cpu", "lra_tpu_modeled"]
        for view in views:
            title = view.panel.ax.title
            assert ("SPT (masked)" in " ".join(title.get_text().split())) == (view.name == "lra_spt"), view.name
            assert "full scale" in title.get_text() and "mini scale" in title.get_text(), view.name
            box, figure = title.get_window_extent(view.fig.canvas.get_renderer()), view.fig.bbox
            assert figure.x0 <= box.x0 and box.x1 <= figure.x1, title.get_text()
    finally:
        lra_chart.close(views)


def test_the_full_scale_section_gives_each_task_its_table_with_device_precision_and_seeds(tmp_path):
    root = tmp_path / "runs"
    runs = (("listops", "softmax", 0, 0.3712, "bfloat16"), ("pathfinder", "softmax", 0, 0.70, "float32"),
            ("pathfinder", "softmax", 1, 0.74, "float32"), ("pathfinder", "linear", 0, 0.75, "float32"))
    for task, variant, seed, accuracy, dtype in runs:
        result = {"task": task, "variant": variant, "test_accuracy": accuracy, "val_accuracy": accuracy,
                  "scale": "full", "steps_per_second": 12.5, "devices": {"platform": "gpu", "kind": "NVIDIA H200",
                                                                          "count": 1},
                  "config": {"seed": seed, "scale": "full", "model": {"dtype": dtype}}}
        write_record(run_dir(root, task, variant, seed, "full", ""), result)
    with open(table2_report.REFERENCE, encoding="utf-8") as f:
        reference = json.load(f)
    lines = lra_results.full_scale_against_paper(measure(root), reference)
    text = "\n".join(lines)
    listops, pathfinder = text.split("### ListOps")[1].split("### Pathfinder")
    assert "| softmax | 37.12 | 36.37 | 0.75 | 1 | 1 x NVIDIA H200 | bfloat16 | 12.50 |" in listops
    assert "ListOps is scored at full scale on one seed" in listops
    assert "| softmax | 72.00 ± 2.83 | 71.40 | 0.60 | 2 | 1 x NVIDIA H200 | float32 | 12.50 |" in pathfinder
    assert "| linear | 75.00 | 75.30 | -0.30 | 1 |" in pathfinder
    assert "one seed" not in pathfinder  # softmax has two
    assert pathfinder.index("| softmax") < pathfinder.index("| linear"), "softmax first"


@pytest.mark.slow
def test_every_variant_has_a_colour_and_a_marker_of_its_own(tmp_path):
    """22 variants drawn from a 20-colour palette shared colours (synthesizer took additive's); now no two
    share a colour or a marker, none takes the paper's square or grey or the reference's diamond or black."""
    from lra_jax.attention import registry
    from lra_jax.research.reports import chart_panels

    styles = chart_panels.variant_styles()
    attention = [v for v in registry.names() if v not in lra_results.REFERENCE_VARIANTS]
    assert set(styles) == set(attention)
    colours = [c for c, _ in styles.values()]
    markers = [str(m) for _, m in styles.values()]
    assert len(set(colours)) == len(colours) and len(set(markers)) == len(markers)
    assert not {"s", "D"} & set(markers) and "#000000" not in colours and "#7f7f7f" not in colours
    # drawn: every point of ours records its own colour and marker
    root = tmp_path / "runs"
    rows = []
    for i, variant in enumerate(attention):
        write_result(root, "listops", variant, 0, 0.30 + 0.005 * i, scale="mini")
        rows.append((variant, 1024, "ok", 10.0 + i, 2**30))
    bench = tmp_path / "bench.json"
    write_bench(bench, rows)
    paths = chart(root, tmp_path / "out", bench=bench, length=1024)
    with open(paths["inputs"], encoding="utf-8") as f:
        ours = [p for p in json.load(f)["panels"][0]["points"] if p["series"] == "mini"]
    assert len(ours) == len(attention)
    assert len({p["color"] for p in ours}) == len(ours) and len({p["marker"] for p in ours}) == len(ours)


def test_no_line_joins_the_papers_full_scale_points_to_our_mini_points(tmp_path):
    """Mini-scale runs only: the paper's points stand apart, labelled, with no dotted line to ours, and the
    legend says they are full scale and why they are not joined."""
    root = tmp_path / "runs"
    for variant, accuracy in (("softmax", 0.40), ("linear", 0.30), ("performer", 0.35)):
        write_result(root, "listops", variant, 0, accuracy, scale="mini")
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 4096, "ok", 100.0, 2**30), ("linear", 4096, "ok", 500.0, 2**29),
                        ("performer", 4096, "ok", 400.0, 2**29)])
    views, _, record = lra_chart.render(ChartOptions(runs=str(root), bench=str(bench), out=str(tmp_path / "out")))
    try:
        main = views[0].panel.ax
        assert not [line for line in main.get_lines() if line.get_linestyle() == ":"]
        legend = " ".join(t.get_text() for legend in views[0].legends for t in legend.get_texts())
        assert "LRA paper (full scale" in legend and "dotted" not in legend and "mini scale" in legend
        paper = [p for p in views[0].panel.points if p.series == "paper"]
        written = {t.get_text() for t in main.texts}
        assert "LRA paper: Transformer (softmax)" in {p.key for p in paper}
        assert {p.label for p in paper} <= written and "Transformer (paper)" in written  # each labelled
        assert "LRA paper (grey squares): full scale" in record["panels"][0]["note"]
    finally:
        lra_chart.close(views)


def test_a_results_json_that_is_not_an_object_is_one_warning_and_skipped(runs, tmp_path, capsys):
    """A results.json holding a list or a number (a bad copy) crashed the chart; now it is skipped like a
    damaged file, with one line naming it."""
    for name, text in (("a-list", "[]"), ("a-number", "42")):
        (runs / name).mkdir()
        (runs / name / "results.json").write_text(text)
    paths = chart(runs, tmp_path / "out", scale="full")
    err = capsys.readouterr().err.splitlines()
    for name, what in (("a-list", "an array"), ("a-number", "a number")):
        [line] = [e for e in err if os.path.join(name, "results.json") in e]
        assert line.startswith("warning: skipping") and f"not a JSON object but {what}" in line, line
    with open(paths["md"], encoding="utf-8") as f:
        assert "| softmax |" in f.read()


def test_a_cell_made_from_uncommitted_code_is_marked_and_named(tmp_path):
    root = tmp_path / "runs"
    for seed, commit in ((0, "abc1234"), (1, "abc1234+changes")):
        result = {"task": "listops", "variant": "softmax", "test_accuracy": 0.4, "val_accuracy": 0.4, "scale": "mini",
                  "versions": {"lra_jax_commit": commit}, "config": {"seed": seed, "scale": "mini"}}
        write_record(run_dir(root, "listops", "softmax", seed, "mini", ""), result)
    write_result(root, "listops", "linear", 0, 0.3, scale="mini")
    measured = measure(root)
    assert measured["softmax"]["chosen"]["listops"].uncommitted == 1
    lines = lra_results.scale_table("mini", measured)
    rows = table_rows("\n".join(lines))
    assert rows["softmax"][1] == "40.00 ± 0.00‡" and rows["linear"][1] == "30.00"
    assert any(line.startswith("‡ Made, in part, from code with uncommitted changes") and "softmax ListOps" in line
               for line in lines)
