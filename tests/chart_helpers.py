"""Fake runs, bench files and the chart drawn from them, shared by the chart's tests."""

import json

import pytest
from run_records import write_diverged_run, write_run

from lra_jax.research.reports import lra_chart, lra_results
from lra_jax.research.sweeps import selection
from lra_jax.research.reports.chart_manifest import ChartOptions

FIVE = ("listops", "text", "retrieval", "image", "pathfinder")


def run_dir(root, task, variant, seed, scale, point):
    """Where `sweep` writes a run: <root>/<task>-<scale>/<variant>[/<point>]/seed<k>."""
    workdir = root / f"{task}-{scale}" / variant
    workdir = (workdir / point if point else workdir) / f"seed{seed}"
    workdir.mkdir(parents=True)
    return workdir


def write_result(root, task, variant, seed, accuracy, scale="full", point="", val=None):
    """A finished run's records: test accuracy `accuracy`, validation `val` (default: the same)."""
    write_run(run_dir(root, task, variant, seed, scale, point), {"seed": seed, "scale": scale}, accuracy, val,
              task=task, variant=variant, scale=scale)


def write_diverged(root, task, variant, seed, step, scale="full", point=""):
    """A diverged run's records: a status and a step, no accuracies."""
    write_diverged_run(run_dir(root, task, variant, seed, scale, point), {"seed": seed, "scale": scale}, step,
                       task=task, variant=variant, scale=scale)


def measure(root, scale=None):
    """What the chart and table are drawn from."""
    return lra_results.aggregate(selection.select_all(lra_results.read_runs(str(root), scale)))


def table_rows(table):
    """First cell -> the row's cells, for every Markdown table row."""
    rows = {}
    for line in table.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            rows.setdefault(cells[0], cells)
    return rows


def write_bench(path, rows, kind="fake-accelerator", date="2026-01-01T00:00:00", impl="auto"):
    """A bench JSON of train steps at dropout 0.1 on device `kind`: rows of (variant, length, status,
    examples/s, peak memory bytes)."""
    results = [{"variant": v, "length": n, "status": s, "examples_per_second": eps, "dropout_rate": 0.1,
                "peak_memory_bytes": mem, "attention": {"impl": impl}} for v, n, s, eps, mem in rows]
    path.write_text(json.dumps({"device": {"kind": kind, "platform": "gpu", "count": 1}, "date": date,
                                "settings": {"batch_size": 32, "impl": impl}, "results": results}))


def chart(runs, out, **options):
    """make_chart with these options (paths as strings)."""
    options = {k: str(v) if k in ("bench", "cpu_bench", "modeled") else v for k, v in options.items()}
    return lra_chart.make_chart(ChartOptions(runs=str(runs), out=str(out), **options))


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
    # a diverged run is not a result: left out, with a note (taylor has nothing else).
    write_diverged(root, "listops", "taylor", 1, 12)
    # a broken file is skipped, not fatal.
    (root / "broken").mkdir()
    (root / "broken" / "results.json").write_text("{not json")
    return root
