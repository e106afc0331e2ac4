"""lra_jax.bench: a tiny real benchmark, the JSON it writes, relative columns and failure recording."""

import json

import pytest

from lra_jax import bench
from lra_jax.errors import ConfigError

TINY = {"batch_size": 4, "steps": 5, "warmup": 1, "dtype": "float32", "scan_layers": False, "remat": False,
        "seed": 0, "num_layers": 1, "num_heads": 2, "emb_dim": 16, "mlp_dim": 32, "protocol": False}


def test_tiny_real_benchmark_writes_json_with_relative_columns(tmp_path):
    out = tmp_path / "bench.json"
    lines = []
    bench.benchmark(["softmax", "linear"], [32], TINY, str(out), log=lines.append)
    report = json.loads(out.read_text())
    assert report["device"]["count"] >= 1 and report["device"]["platform"]
    assert report["versions"]["jax"] and report["settings"]["steps"] == 5
    by_variant = {r["variant"]: r for r in report["results"]}
    assert set(by_variant) == {"softmax", "linear"}
    for r in by_variant.values():
        assert r["status"] == "ok", r
        assert r["length"] == 32 and r["steps_per_second"] > 0
        assert r["examples_per_second"] == pytest.approx(4 * r["steps_per_second"])
        assert r["compiled_step_memory_bytes"] > 0 and r["num_parameters"] > 0
        assert r["flops_per_step"] is None or r["flops_per_step"] > 0
    assert by_variant["softmax"]["relative_speed"] == pytest.approx(1.0)
    linear = by_variant["linear"]
    assert linear["relative_speed"] == pytest.approx(
        linear["steps_per_second"] / by_variant["softmax"]["steps_per_second"])
    assert linear["attention"]["name"] == "linear"
    printed = "\n".join(lines)
    assert "[2/2] linear @ 32" in printed and "×)" in printed


def fake_measure(variant, length, settings):
    if variant == "big":
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9.0GiB")
    if variant == "refused":
        raise bench.OutOfMemory("the train step needs about 90.0 GiB but this machine has 8.0 GiB")
    if variant == "broken":
        raise ValueError("shapes do not match")
    speed = {"softmax": 2.0, "fast": 8.0}[variant] * 1024 / length
    return {"steps_per_second": speed, "examples_per_second": 32 * speed, "peak_memory_bytes": length * 1000}


def test_failures_are_recorded_and_do_not_stop_the_sweep():
    results = bench.run(["softmax", "big", "refused", "broken", "fast"], [1024, 2048], TINY,
                        measure_fn=fake_measure, log=lambda line: None)
    status = {(r["variant"], r["length"]): r["status"] for r in results}
    assert status[("big", 1024)] == "oom" and status[("refused", 2048)] == "oom"
    assert status[("broken", 1024)] == "error" and status[("fast", 2048)] == "ok"
    broken = next(r for r in results if r["variant"] == "broken")
    assert "shapes do not match" in broken["error"]
    fast = {r["length"]: r for r in results if r["variant"] == "fast"}
    assert fast[1024]["relative_speed"] == pytest.approx(4.0)
    assert fast[2048]["relative_memory"] == pytest.approx(1.0)
    text = bench.table(results)
    assert "OOM" in text and "ERROR" in text and "(4.0×)" in text


def test_unknown_variant_lists_known_ones():
    with pytest.raises(ConfigError, match="known variants: .*softmax"):
        bench.resolve_variants("softmax,nonesuch")
    assert "softmax" in bench.resolve_variants("all")


def test_variant_settings_come_from_its_config_file():
    assert bench.variant_attention("linformer")["k"] == 256  # configs/linformer.py at full scale
    assert bench.variant_attention("softmax")["name"] == "softmax"  # configs/transformer.py


def test_kernels_without_the_module_is_a_clear_error(monkeypatch, capsys):
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(bench.importlib, "import_module", missing)
    with pytest.raises(SystemExit) as exit_info:
        bench.run_kernels(["bench"])
    assert exit_info.value.code == 2
    assert "lra_jax/kernels/bench.py is missing" in capsys.readouterr().err


def test_a_killed_benchmark_keeps_what_it_measured(tmp_path):
    out = tmp_path / "bench.json"

    def measure_then_die(variant, length, settings):
        if variant == "fast":
            raise KeyboardInterrupt  # the run is killed during its second variant
        return fake_measure(variant, length, settings)

    with pytest.raises(KeyboardInterrupt):
        bench.benchmark(["softmax", "fast"], [1024, 2048], TINY, str(out), measure_fn=measure_then_die,
                        log=lambda line: None)
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert [(r["variant"], r["length"]) for r in report["results"]] == [("softmax", 1024), ("softmax", 2048)]
