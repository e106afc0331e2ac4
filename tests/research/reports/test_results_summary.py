"""The short results table (`results_summary`, lra_summary.md): what the README shows of the chart's runs,
written and checked with the chart."""

import re

import pytest

from chart_helpers import chart, run_dir, table_rows, write_bench
from run_records import write_record

from lra_jax.research.reports import chart_manifest, lra_chart, results_summary
from lra_jax.research.reports.chart_manifest import ChartOptions

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def write_run(root, task, variant, seed, accuracy, steps, steps_per_second, pretrain="none"):
    result = {"task": task, "variant": variant, "test_accuracy": accuracy, "val_accuracy": accuracy,
              "scale": "mini", "num_train_steps": steps, "steps_per_second": steps_per_second,
              "devices": {"count": 1, "kind": "cpu", "platform": "cpu"},
              "pretrain_objective": pretrain, "config": {"seed": seed, "scale": "mini"}}
    workdir = run_dir(root, task, variant if pretrain == "none" else f"{variant}/spt", seed, "mini", "")
    write_record(workdir, result)


def test_the_summary_gives_score_speed_memory_scale_hardware_and_train_time(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, "listops", "softmax", seed, 0.30 + 0.02 * seed, 1500, 10.0)  # 150 s a seed
        write_run(runs, "pathfinder", "softmax", seed, 0.60, 1200, 4.0 + 2.0 * seed)  # 300 s, 200 s: mean 250
        write_run(runs, "listops", "linear", seed, 0.40, 1500, 30.0)
        write_run(runs, "pathfinder", "linear", seed, 0.70, 1200, 40.0)
        write_run(runs, "listops", "linear", seed, 0.90, 1500, 30.0, pretrain="masked")  # not a from-scratch row
    write_bench(tmp_path / "bench.json", [("softmax", 4096, "ok", 10.0, 4 * 2**30),
                                         ("linear", 4096, "ok", 25.0, 2**30)])
    paths = chart(runs, tmp_path / "out", bench=tmp_path / "bench.json", length=4096)
    summary = open(paths["summary"], encoding="utf-8").read()
    rows = table_rows(summary)
    assert rows["Variant"] == ["Variant", "ListOps", "Pathfinder", "Score", "Speed (× softmax)", "Memory (GiB)",
                               "Scale", "Trained on", "Train time"]
    # Best score first; mean ± sample std over the two seeds; the self-pretrained runs are not rows.
    assert list(rows)[1:] == ["linear", "softmax"]
    assert rows["softmax"] == ["softmax", "31.0 ± 1.4", "60.0 ± 0.0", "45.5 ± 0.7", "1.00", "4.0", "mini",
                               "1 x cpu", "6.7 min"]  # 150 s + 250 s
    assert rows["linear"][4:] == ["2.50", "1.0", "mini", "1 x cpu", "80 s"]  # 50 s + 30 s


def test_the_check_names_a_hand_edited_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed in (0, 1):
        write_run(tmp_path / "runs", "listops", "softmax", seed, 0.3, 100, 10.0)
    options = ChartOptions(runs="runs", out="out", scale="mini")
    lra_chart.make_chart(options)
    assert lra_chart.check_chart(options) == []
    path = tmp_path / "out" / results_summary.NAME
    path.write_text(path.read_text().replace("31.0", "39.0").replace("30.0", "39.0"))
    assert [p for p in lra_chart.check_chart(options) if results_summary.NAME in p and "differs" in p]
    path.unlink()
    assert f"output missing: out/{results_summary.NAME}" in lra_chart.check_chart(options)
    assert (tmp_path / "out" / chart_manifest.TABLE_NAME).exists()



def test_a_variant_scored_on_fewer_tasks_is_listed_apart_never_ranked(tmp_path):
    """A mean over one easy task would top every two-task score: both tables rank only the variants scored
    on every task shown and list the rest after them, their score marked *."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, "listops", "softmax", seed, 0.30, 100, 10.0)
        write_run(runs, "pathfinder", "softmax", seed, 0.60, 100, 10.0)
        write_run(runs, "listops", "linear", seed, 0.40, 100, 10.0)
        write_run(runs, "pathfinder", "linear", seed, 0.70, 100, 10.0)
        write_run(runs, "pathfinder", "ssd", seed, 0.90, 100, 10.0)  # 90.0 on Pathfinder alone
    paths = chart(runs, tmp_path / "out")
    for path in (paths["summary"], tmp_path / "out" / chart_manifest.TABLE_NAME):
        text = open(path, encoding="utf-8").read()
        variants = [line.split("|")[1].strip() for line in text.splitlines()
                    if line.startswith("| ") and line.split("|")[1].strip() in ("softmax", "linear", "ssd")]
        assert variants[:3] == ["linear", "softmax", "ssd"], path
        assert "not ranked" in text.split("| ssd")[0].rsplit("| softmax", 1)[1], path
        assert [line for line in text.splitlines() if line.startswith("| ssd") and re.search(r"90\.00? ± 0\.00?\*", line)], path
