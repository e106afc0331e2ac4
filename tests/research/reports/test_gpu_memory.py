"""Deviceless against measured GPU memory (lra_jax.research.reports.gpu_memory_report, `python -m lra_jax.tools.gpu_memory`)."""

import json

import pytest

from lra_jax.config import paths
from lra_jax.errors import LraError
from lra_jax.research.reports import gpu_memory_report as report
from lra_jax.tools import gpu_memory

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


GIB = 2**30


def compile_json(path, command="python -m lra_jax.tools.compile --targets=h100 --lengths=4096 --impl=xla"):
    rows = [{"variant": v, "task": "table2:4096", "target": "h100", "mode": "train", "result": result,
             "per_device_batch": 32, "kernels": "xla x4", "memory": {"total": gib * GIB}}
            for v, gib, result in (("softmax", 60, "ok"), ("linear", 12, "ok"), ("additive", 90, "does not fit"))]
    rows.append({**rows[0], "variant": "local", "kernels": "pallas-triton x4"})  # a kernel: not XLA's step
    path.write_text(json.dumps({"command": command, "commit": "abc1234", "rows": rows}))
    return str(path)


def bench_json(path, kind, cells, date="2026-11-26T10:00:00"):
    results = [{"attention": {"name": v, "kernels": [{"train": "xla"}] * 4}, "length": 4096, "dropout_rate": rate,
                "status": "ok", "compiled_step_memory_bytes": gib * GIB, "device_peak_bytes_in_use": (gib + 1) * GIB}
               for v, rate, gib in cells]
    path.write_text(json.dumps({"device": {"kind": kind, "platform": "gpu"}, "date": date,
                                "settings": {"batch_size": 32, "dtype": "float32", "scan_layers": False, "remat": False},
                                "versions": {"jax": "0.11.2"}, "results": results}))
    return str(path)


def test_cells_pair_on_variant_length_batch_and_dropout(tmp_path):
    deviceless = report.deviceless_cells(compile_json(tmp_path / "t2.json"))
    assert [c["variant"] for c in deviceless] == ["softmax", "linear", "additive"] and deviceless[0]["dropout"] == 0.1
    h100 = report.measured_cells(bench_json(tmp_path / "b1.json", "NVIDIA H100 80GB HBM3",
                                            [("softmax", 0.1, 50), ("softmax", 0.0, 40), ("linear", 0.1, 13)]))
    h200 = report.measured_cells(bench_json(tmp_path / "b2.json", "NVIDIA H200", [("additive", 0.1, 75)]))
    pairs = report.pair(deviceless, h100 + h200)
    assert [(p["deviceless"]["variant"], p["measured"]["device"][:11], p["same_gpu"]) for p in pairs] == [
        ("softmax", "NVIDIA H100", True), ("linear", "NVIDIA H100", True), ("additive", "NVIDIA H200", False)]
    assert pairs[0]["over_compiled"] == pytest.approx(1.2) and pairs[1]["over_compiled"] == pytest.approx(12 / 13)
    assert report.spread(pairs, "over_compiled") == (pytest.approx(12 / 13), pytest.approx(1.2), 2)
    page = report.format_page(pairs, deviceless, h100 + h200, "python -m lra_jax.tools.gpu_memory")
    assert "| additive | h100, abc1234 | 90.00 | NVIDIA H200 | 75.00 | 76.00 | 1.20 | 1.18 | does not fit |" in page
    assert "at commit abc1234 against the step compiled on the same GPU: 0.92-1.20x (2 steps)" in page
    assert "No step was measured on both GPUs" in page


def test_the_gpu_and_the_code_compiled_are_told_apart(tmp_path):
    measured = (report.measured_cells(bench_json(tmp_path / "b1.json", "NVIDIA H100 80GB HBM3", [("linear", 0.1, 12)]))
                + report.measured_cells(bench_json(tmp_path / "b2.json", "NVIDIA H200", [("linear", 0.1, 14)])))
    assert report.gpu_difference(measured, "NVIDIA H100", "NVIDIA H200") == (2 * GIB, 2 * GIB, 1)
    old = report.deviceless_cells(compile_json(tmp_path / "old.json"))
    new = [dict(c, commit="def5678", date="2026-11-28", bytes=c["bytes"] * (0.5 if c["variant"] == "softmax" else 1))
           for c in old]
    assert report.code_change(old + new) == [("softmax", "abc1234", "def5678", pytest.approx(2.0))]


def test_dropout_comes_from_the_compile_command():
    assert report.dropout_of("compile --dropout_rate=0 --attention_dropout_rate=0") == 0.0
    assert report.dropout_of("compile --dropout_rate=0 --attention_dropout_rate=0.1") is None


def test_a_pattern_that_matches_nothing_is_named(tmp_path):
    with pytest.raises(LraError, match=f"--deviceless={tmp_path}/none-.*names no file"):
        gpu_memory.expand(f"{tmp_path}/none-*.json", "deviceless")


def test_the_committed_page_is_what_the_committed_json_gives(monkeypatch):
    """docs/gpu-memory.md is generated: redrawn from the committed JSONs it is the same text."""
    monkeypatch.chdir(paths.REPO_ROOT)
    deviceless = [c for p in gpu_memory.expand(gpu_memory.DEVICELESS, "deviceless") for c in report.deviceless_cells(p)]
    measured = [c for p in gpu_memory.expand(gpu_memory.MEASURED, "measured") for c in report.measured_cells(p)]
    command = "python -m lra_jax.tools.gpu_memory --doc=docs/gpu-memory.md"
    page = report.format_page(report.pair(deviceless, measured), deviceless, measured, command)
    with open("docs/gpu-memory.md", encoding="utf-8") as f:
        assert f.read() == page, f"docs/gpu-memory.md is stale: run `{command}`"
