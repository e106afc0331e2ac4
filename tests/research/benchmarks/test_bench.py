"""lra_jax.tools.bench: a tiny real benchmark (one process per cell), the JSON it writes, relative columns and
failure recording, a crashed or timed-out cell included."""

import json
import os
import signal
import sys
import threading
import time

import pytest

from lra_jax import provenance
from lra_jax.errors import ConfigError
from lra_jax.research.benchmarks import bench_cells, bench_report
from lra_jax.measure import host_memory, out_of_memory
from lra_jax.tools import bench

TINY = {"batch_size": 4, "steps": 5, "warmup": 1, "dtype": "float32", "scan_layers": False, "remat": False,
        "seed": 0, "num_layers": 1, "num_heads": 2, "emb_dim": 16, "mlp_dim": 32, "protocol": False}


@pytest.mark.slow
@pytest.mark.one_stack("oldest")  # the bench's files and columns are this package's Python: CI runs it once
def test_tiny_real_benchmark_writes_json_with_relative_columns(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_JAX_CACHE", str(tmp_path / "cache"))  # the cells' compilation cache
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")  # cells compile in 3 s, not 10
    out = tmp_path / "bench.json"
    lines = []
    bench_cells.benchmark(["softmax", "linear"], [32], {**TINY, "profile": True}, str(out), log=lines.append)
    report = json.loads(out.read_text())
    assert "profile" not in report["settings"]  # measured after the timed steps: not a condition of them
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
        assert r["dropout_rate"] == 0.1 and len(r["step_seconds"]) == 5 and r["matmul_peak_flops_per_second"] > 0
        # softmax and linear count their FLOPs (lra_jax/measure/flops.py); a CPU has no vendor figure.
        assert r["model_flops_per_step"] > 0 and r["utilisation_flops"] == "model"
        assert r["utilisation"] == pytest.approx(
            r["model_flops_per_step"] * r["steps_per_second"] / r["matmul_peak_flops_per_second"])
        assert r["vendor_peak_flops_per_second"] is None
        # XLA's bytes at the bandwidth measured in the cell: the step's time were it only streaming them.
        assert r["xla_bytes_accessed_per_step"] > 0 and r["memory_bandwidth_bytes_per_second"] > 0
        assert r["memory_time_share"] == pytest.approx(
            r["xla_bytes_accessed_per_step"] / r["memory_bandwidth_bytes_per_second"] / r["seconds_per_step"])
        # One more step under the profiler: its ops by kind, the matmuls' FLOPs those of the model's dots.
        profile = r["profile"]
        assert profile["seconds_by_kind"]["matmul"] > 0 and profile["op_seconds"] > 0
        assert sum(g["flops"] for g in profile["matmuls_by_contraction"].values()) == pytest.approx(
            r["model_flops_per_step"], rel=0.05)
    assert by_variant["softmax"]["relative_speed"] == pytest.approx(1.0)
    linear = by_variant["linear"]
    assert linear["relative_speed"] == pytest.approx(
        linear["steps_per_second"] / by_variant["softmax"]["steps_per_second"])
    assert linear["attention"]["name"] == "linear"
    printed = "\n".join(lines)
    assert "[2/2] linear @ 32" in printed and "×)" in printed and "% matmul peak" in printed and "% streaming bytes" in printed
    assert report["complete"] is True


def test_a_cell_gets_the_settings_whole():
    command = bench_cells.cell_command("performer", 64, TINY)
    assert command[:3] == [sys.executable, "-m", "lra_jax.tools.bench"]
    cell = json.loads(command[3].removeprefix("--cell="))
    assert cell == {"variant": "performer", "length": 64, "settings": TINY}


def fake_measure(variant, length, settings):
    if variant == "big":
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9.0GiB")
    if variant == "refused":
        raise out_of_memory.OutOfMemory("the train step needs about 90.0 GiB but this machine has 8.0 GiB")
    if variant == "broken":
        raise ValueError("shapes do not match")
    speed = {"softmax": 2.0, "fast": 8.0}[variant] * 1024 / length
    return {"steps_per_second": speed, "examples_per_second": 32 * speed, "peak_memory_bytes": length * 1000}


def test_failures_are_recorded_and_do_not_stop_the_sweep():
    results = bench_cells.run(["softmax", "big", "refused", "broken", "fast"], [1024, 2048], TINY,
                        measure_fn=fake_measure, log=lambda line: None)
    status = {(r["variant"], r["length"]): r["status"] for r in results}
    assert status[("big", 1024)] == "oom" and status[("refused", 2048)] == "oom"
    assert status[("broken", 1024)] == "error" and status[("fast", 2048)] == "ok"
    broken = next(r for r in results if r["variant"] == "broken")
    assert "shapes do not match" in broken["error"]
    fast = {r["length"]: r for r in results if r["variant"] == "fast"}
    assert fast[1024]["relative_speed"] == pytest.approx(4.0)
    assert fast[2048]["relative_memory"] == pytest.approx(1.0)
    text = bench_report.table(results)
    assert "OOM" in text and "ERROR" in text and "(4.0×)" in text


def test_unknown_variant_lists_known_ones():
    with pytest.raises(ConfigError, match="known variants: .*softmax"):
        bench.resolve_variants("softmax,nonesuch")
    assert "softmax" in bench.resolve_variants("all")


def test_variant_settings_come_from_its_config_file():
    assert bench_cells.variant_attention("linformer")["k"] == 256  # configs/linformer.py at full scale
    assert bench_cells.variant_attention("softmax")["name"] == "softmax"  # configs/transformer.py


def test_impl_reaches_every_variants_attention_and_defaults_to_auto():
    """--impl=xla times the XLA forms of the variants that have kernels (what the kernels buy)."""
    assert bench_cells.bench_config("local", 256, TINY).attention.impl == "auto"
    config = bench_cells.bench_config("local", 256, {**TINY, "impl": "xla"})
    assert (config.attention.impl, config.attention.window) == ("xla", 128)  # the config file's settings kept


def test_kernels_without_the_module_is_a_clear_error(monkeypatch, capsys):
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(bench.importlib, "import_module", missing)
    with pytest.raises(SystemExit) as exit_info:
        bench.run_kernels(["bench"])
    assert exit_info.value.code == 2
    assert "lra_jax/tools/kernel_bench.py is missing" in capsys.readouterr().err


def test_a_killed_benchmark_keeps_what_it_measured(tmp_path):
    out = tmp_path / "bench.json"

    def measure_then_die(variant, length, settings):
        if variant == "fast":
            raise KeyboardInterrupt  # the run is killed during its second variant
        return fake_measure(variant, length, settings)

    with pytest.raises(KeyboardInterrupt):
        bench_cells.benchmark(["softmax", "fast"], [1024, 2048], TINY, str(out), measure_fn=measure_then_die,
                        log=lambda line: None)
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert [(r["variant"], r["length"]) for r in report["results"]] == [("softmax", 1024), ("softmax", 2048)]


@pytest.mark.slow
def test_a_crashed_or_timed_out_cell_is_recorded_and_the_report_written(tmp_path, monkeypatch):
    ok = {"status": "ok", "steps_per_second": 2.0, "examples_per_second": 8.0, "peak_memory_bytes": 1000}
    children = {  # what each variant's process does instead of measuring
        "softmax": f"print('compiling...'); print({json.dumps(ok)!r})",
        "crash": "import sys; print('Fatal Python error: Segmentation fault', file=sys.stderr); sys.exit(3)",
        "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        "hang": "import time; time.sleep(60)",
    }
    monkeypatch.setattr(bench_cells, "cell_command",
                        lambda variant, length, settings: [sys.executable, "-c", children[variant]])
    out = tmp_path / "bench.json"
    lines = []
    device = {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}
    bench_cells.benchmark(list(children), [32], TINY, str(out), log=lines.append, device=device, cell_timeout=3)
    report = json.loads(out.read_text())
    assert report["complete"] is True
    cells = {r["variant"]: r for r in report["results"]}
    assert [r["variant"] for r in report["results"]] == list(children)
    assert cells["softmax"]["status"] == "ok" and cells["softmax"]["relative_speed"] == pytest.approx(1.0)
    crash = cells["crash"]
    assert crash["status"] == "crashed" and crash["exit_code"] == 3
    assert "exit code 3" in crash["error"] and "Segmentation fault" in crash["stderr_tail"]
    killed = cells["killed"]
    assert killed["status"] == "crashed" and killed["exit_code"] == -9 and "SIGKILL" in killed["error"]
    hang = cells["hang"]
    assert hang["status"] == "timeout" and "--cell_timeout" in hang["error"]
    assert 3 <= hang["wall_seconds"] < 30
    printed = "\n".join(lines)
    assert "CRASHED" in printed and "TIMEOUT" in printed and "[4/4] hang @ 32: TIMEOUT" in printed


def test_the_report_names_the_code_as_it_was_before_the_report_was_written_into_it(tmp_path, monkeypatch):
    """A bench writing into its own checkout changes a tracked file with its first cell; the commit it
    records is the checkout's before that (a 4K cell once recorded "+changes": its own partial report)."""
    out = tmp_path / "bench.json"
    monkeypatch.setattr(provenance, "source_commit", lambda: "abc1234" + ("+changes" if out.exists() else ""))
    device = {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}
    report = bench_cells.benchmark(["softmax", "fast"], [1024], TINY, str(out), measure_fn=fake_measure,
                             log=lambda line: None, device=device)
    assert report["versions"]["lra_jax_commit"] == "abc1234"
    assert json.loads(out.read_text())["versions"]["lra_jax_commit"] == "abc1234"


def test_update_replaces_remeasured_cells_keeps_the_rest_and_refuses_other_settings(tmp_path):
    from lra_jax.errors import LraError

    out = tmp_path / "bench.json"
    device = {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}
    quiet = {"log": lambda line: None, "device": device}
    bench_cells.benchmark(["softmax", "fast"], [1024, 2048], TINY, str(out), measure_fn=fake_measure, **quiet)

    def faster(variant, length, settings):
        result = fake_measure(variant, length, settings)
        return {**result, "steps_per_second": 2 * result["steps_per_second"]}

    bench_cells.benchmark(["fast"], [2048], TINY, str(out), measure_fn=faster, update=True, **quiet)
    report = json.loads(out.read_text())
    cells = {(r["variant"], r["length"]): r for r in report["results"]}
    assert list(cells) == [("softmax", 1024), ("softmax", 2048), ("fast", 1024), ("fast", 2048)]
    assert cells[("fast", 1024)]["steps_per_second"] == pytest.approx(8.0)  # kept
    assert cells[("fast", 2048)]["steps_per_second"] == pytest.approx(8.0)  # re-measured: 2 x 4.0
    assert cells[("fast", 2048)]["relative_speed"] == pytest.approx(8.0)  # against the kept softmax (1.0)
    assert len(report["commands"]) == 2
    # each cell names the command that measured it: the first (0) or this update (1)
    assert [cells[key]["measured_by"] for key in cells] == [0, 0, 0, 1]

    with pytest.raises(LraError, match="batch_size: file 4, now 8"):
        bench_cells.benchmark(["fast"], [2048], {**TINY, "batch_size": 8}, str(out), measure_fn=faster,
                        update=True, **quiet)
    with pytest.raises(LraError, match="needs an existing --out"):
        bench_cells.benchmark(["fast"], [2048], TINY, str(tmp_path / "none.json"), measure_fn=faster,
                        update=True, **quiet)
    assert json.loads(out.read_text())["results"] == report["results"]  # a refused update changes nothing


def test_a_speed_ratio_across_two_commands_is_marked_and_its_command_inferred_for_older_cells(tmp_path):
    """softmax at 2048 measured again by an --update: fast's 2048 speed ratio now divides by another command's
    softmax and is marked (its memory ratio is not: no timing); fast at 1024 still divides by its own command's.
    A file from before `measured_by` gives the same answer from its recorded commands."""
    out = tmp_path / "bench.json"
    quiet = {"log": lambda line: None, "device": {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}}
    bench_cells.benchmark(["softmax", "fast"], [1024, 2048], TINY, str(out), measure_fn=fake_measure, **quiet)
    bench_cells.benchmark(["softmax"], [2048], TINY, str(out), measure_fn=fake_measure, update=True, **quiet)
    report = json.loads(out.read_text())
    commands = report["commands"]
    assert bench_report.across_commands(report["results"], commands) == {("fast", 2048, 0.1)}
    speed, memory = bench_report.table(report["results"], commands).split("\n\n")[:2]
    assert "(4.0×)" in speed and "(4.0×†)" in speed and "†" not in memory
    footnote = bench_report.table(report["results"], commands).split("\n\n")[-1]  # wrapped to the table's width
    assert " ".join(footnote.split()) == bench_report.across_note(commands)
    assert "†" not in bench_report.table(report["results"])  # without the commands nothing is claimed

    assert [bench_report.measuring_command(r, commands) for r in report["results"]] == [0, 1, 0, 0]
    older = [{k: v for k, v in r.items() if k != "measured_by"} for r in report["results"]]
    recorded = ["bench.py --variants=softmax,fast --lengths=1024,2048 --dropout_rates=0.1",
                "bench.py --variants=softmax --lengths=2048 --update"]  # what the command lines were (here: pytest's)
    assert [bench_report.measuring_command(r, recorded) for r in older] == [0, 1, 0, 0]
    assert bench_report.measuring_command(older[0], None) is None


def test_a_file_from_before_keep_host_memory_updates_only_without_it(tmp_path):
    """Its cells ran with freed memory returned to the kernel: --nokeep_host_memory matches them."""
    from lra_jax.errors import LraError

    out = tmp_path / "bench.json"
    quiet = {"log": lambda line: None, "device": {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}}
    bench_cells.benchmark(["softmax"], [1024], TINY, str(out), measure_fn=fake_measure, **quiet)
    report = json.loads(out.read_text())
    report["settings"].pop("keep_host_memory", None)
    report["settings"].pop("impl", None)  # a file from before --impl: measured with "auto"
    out.write_text(json.dumps(report))
    with pytest.raises(LraError, match="keep_host_memory: file False, now True"):
        bench_cells.benchmark(["fast"], [1024], {**TINY, "keep_host_memory": True}, str(out), measure_fn=fake_measure,
                        update=True, **quiet)
    bench_cells.benchmark(["fast"], [1024], {**TINY, "keep_host_memory": False, "impl": "auto"}, str(out),
                    measure_fn=fake_measure, update=True, **quiet)
    assert {r["variant"] for r in json.loads(out.read_text())["results"]} == {"softmax", "fast"}


def test_sigterm_ends_the_bench_with_its_running_cell_and_keeps_the_measured_cells(tmp_path, monkeypatch):
    pid_file = tmp_path / "cell.pid"
    ok = {"status": "ok", "steps_per_second": 2.0, "examples_per_second": 8.0, "peak_memory_bytes": 1000}
    children = {
        "softmax": f"print({json.dumps(ok)!r})",
        "hang": f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)",
    }
    monkeypatch.setattr(bench_cells, "cell_command",
                        lambda variant, length, settings: [sys.executable, "-c", children[variant]])

    def terminate_once_the_cell_runs():
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    out = tmp_path / "bench.json"
    device = {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}
    previous = bench.end_on_sigterm()
    try:
        threading.Thread(target=terminate_once_the_cell_runs, daemon=True).start()
        with pytest.raises(SystemExit) as stopped:
            bench_cells.benchmark(list(children), [32], TINY, str(out), log=lambda line: None, device=device,
                            cell_timeout=60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):  # the hanging cell's process is gone, not orphaned
        os.kill(int(pid_file.read_text()), 0)
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert [r["variant"] for r in report["results"]] == ["softmax"]


def test_dropout_rates_are_measured_side_by_side_and_their_cost_reported(tmp_path):
    """--dropout_rates=0,0.1: each (variant, length) at both rates one after the other; dropout_cost
    compares a cell with the same variant and length at rate 0; speeds relative to softmax at the same rate."""
    calls = []

    def timed(variant, length, settings):
        calls.append((variant, length, settings["dropout_rate"]))
        seconds = {"softmax": 4.0, "fast": 1.0}[variant] * (1.25 if settings["dropout_rate"] else 1.0)
        return {**fake_measure(variant, length, settings), "steps_per_second": 1 / seconds,
                "seconds_per_step": seconds}

    lines = []
    device = {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}
    report = bench_cells.benchmark(["softmax", "fast"], [1024, 2048], {**TINY, "dropout_rates": [0.0, 0.1]},
                             str(tmp_path / "bench.json"), measure_fn=timed, log=lines.append, device=device)
    assert calls[:4] == [("softmax", 1024, 0.0), ("softmax", 1024, 0.1), ("softmax", 2048, 0.0),
                         ("softmax", 2048, 0.1)]
    cells = {(r["variant"], r["length"], r["dropout_rate"]): r for r in report["results"]}
    assert len(cells) == 8
    assert cells["fast", 1024, 0.1]["dropout_cost"] == pytest.approx(0.25)
    assert cells["fast", 1024, 0.0]["dropout_cost"] is None
    assert cells["fast", 2048, 0.1]["relative_speed"] == pytest.approx(4.0)  # softmax at 0.1, not at 0
    printed = "\n".join(lines)
    assert "fast p=0.1" in printed and "dropout cost" in printed and "+25%" in printed
    # A report from before --dropout_rates holds rate 0.1 cells: --update with rate 0.1 joins it.
    legacy = json.loads((tmp_path / "bench.json").read_text())
    legacy["settings"].pop("dropout_rates")
    legacy["results"] = [{k: v for k, v in r.items() if k != "dropout_rate"} for r in legacy["results"]
                         if r["dropout_rate"] == 0.1]
    (tmp_path / "old.json").write_text(json.dumps(legacy))
    merged = bench_cells.benchmark(["fast"], [1024], {**TINY, "dropout_rates": [0.1]}, str(tmp_path / "old.json"),
                             measure_fn=timed, log=lines.append, device=device, update=True)
    assert len(merged["results"]) == 4  # the re-measured cell replaced its legacy twin


def test_cells_run_with_huge_pages_asked_of_glibc_malloc(monkeypatch):
    """--huge_pages (the default) puts glibc.malloc.hugetlb=1 into the cell's GLIBC_TUNABLES, keeping
    the user's other tunables and replacing their own hugetlb setting; without it the environment is as is."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2")
    env = bench_cells.cell_environment({**TINY, "huge_pages": True})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert bench_cells.cell_environment({**TINY, "huge_pages": False})["GLIBC_TUNABLES"] == (
        "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2")
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert bench_cells.cell_environment({**TINY, "huge_pages": True})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert "GLIBC_TUNABLES" not in bench_cells.cell_environment(TINY)


def test_cells_keep_freed_memory_when_asked(monkeypatch):
    """--keep_host_memory (the default) adds the three tunables of `host_memory.KEEP_FREED`, replacing
    the user's own arena_max and keeping the rest."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0")
    tunables = bench_cells.cell_environment({**TINY, "keep_host_memory": True})["GLIBC_TUNABLES"].split(":")
    assert tunables == ["glibc.malloc.tcache_count=0", *host_memory.KEEP_FREED]
    both = bench_cells.cell_environment({**TINY, "huge_pages": True, "keep_host_memory": True})["GLIBC_TUNABLES"]
    assert both.split(":") == ["glibc.malloc.tcache_count=0", *host_memory.HUGE_PAGES, *host_memory.KEEP_FREED]


def test_dropout_cost_is_the_median_of_the_alternating_steps_ratios():
    """Steps i of both rates ran back to back: one pair slowed by another job moves the median of the
    pairs' ratios not at all, where the ratio of means would read it as dropout's cost."""
    free = {"seconds_per_step": 2.4, "step_seconds": [2.0, 2.0, 2.0, 2.0, 4.0]}
    dropped = {"seconds_per_step": 4.2, "step_seconds": [2.2, 2.2, 2.2, 8.0, 6.4]}  # pair 4: only this one slowed
    assert bench_report.paired_cost(dropped, free) == pytest.approx(0.1)
    assert dropped["seconds_per_step"] / free["seconds_per_step"] - 1 == pytest.approx(0.75)
    measured_apart = {"seconds_per_step": 3.0, "step_seconds": [3.0, 3.0, 3.0]}
    assert bench_report.paired_cost(measured_apart, free) == pytest.approx(0.25)  # the means, without pairs


def test_dropout_cost_interval_is_the_order_statistics_that_hold_the_median_pair_at_90_percent():
    """n pairs' ratios, sorted: the interval [k-th smallest, k-th largest] holds their median with
    probability 1 - 2 P(Binomial(n, 1/2) < k); the largest k that still gives 90%."""
    free = {"step_seconds": [1.0] * 9}
    dropped = {"step_seconds": [1.0 + x / 100 for x in (5, -3, 12, 7, 0, 30, 9, 4, 6)]}
    # sorted: -3 0 4 5 6 7 9 12 30. k = 2 covers 1 - 2 * 10/512 = 96%; k = 3: 1 - 2 * 46/512 = 82%.
    assert bench_report.paired_cost_interval(dropped, free) == pytest.approx([0.0, 0.12])
    assert bench_report.paired_cost(dropped, free) == pytest.approx(0.06)
    five = {"step_seconds": dropped["step_seconds"][:5]}
    assert bench_report.paired_cost_interval(five, {"step_seconds": [1.0] * 5}) == pytest.approx([-0.03, 0.12])  # 94%
    four = {"step_seconds": dropped["step_seconds"][:4]}
    assert bench_report.paired_cost_interval(four, {"step_seconds": [1.0] * 4}) is None  # at best 88%
    assert bench_report.paired_cost_interval(dropped, {"step_seconds": [1.0] * 5}) is None  # not paired


def test_cells_profiled_or_not_update_one_another(tmp_path):
    """--profile measures after the timed steps: a file without it takes cells with it, and back."""
    out = tmp_path / "bench.json"
    quiet = {"log": lambda line: None, "device": {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}}
    bench_cells.benchmark(["softmax"], [1024], TINY, str(out), measure_fn=fake_measure, **quiet)
    bench_cells.benchmark(["fast"], [1024], {**TINY, "profile": True}, str(out), measure_fn=fake_measure, update=True,
                    **quiet)
    bench_cells.benchmark(["fast"], [2048], TINY, str(out), measure_fn=fake_measure, update=True, **quiet)
    report = json.loads(out.read_text())
    assert len(report["results"]) == 3 and "profile" not in report["settings"]


def test_an_update_may_time_more_steps_than_the_file_never_fewer(tmp_path):
    """More timed steps measure the same cost more precisely: such cells join the file, whose settings
    keep its own step count; fewer would make a cell less precise than the file says, and are refused."""
    from lra_jax.errors import LraError

    out = tmp_path / "bench.json"
    quiet = {"log": lambda line: None, "device": {"platform": "cpu", "kind": "cpu", "count": 1, "process_count": 1}}
    bench_cells.benchmark(["softmax"], [1024], TINY, str(out), measure_fn=fake_measure, **quiet)
    more = {**TINY, "steps": TINY["steps"] + 4}
    bench_cells.benchmark(["fast"], [1024], more, str(out), measure_fn=fake_measure, update=True, **quiet)
    report = json.loads(out.read_text())
    assert report["settings"]["steps"] == TINY["steps"] and len(report["results"]) == 2
    with pytest.raises(LraError, match=f"steps: file {TINY['steps']}, now {TINY['steps'] - 1} \\(fewer"):
        bench_cells.benchmark(["fast"], [1024], {**TINY, "steps": TINY["steps"] - 1}, str(out), measure_fn=fake_measure,
                        update=True, **quiet)
    assert json.loads(out.read_text()) == report


def test_report_shows_where_profiled_steps_spend_their_time():
    """Per profiled cell: the kinds' shares of the ops' time, the matmuls' rate against the measured peak
    (all, and those with the smallest contraction that carry 5% of the FLOPs or more), ops over wall."""
    profile = {"seconds_by_kind": {"matmul": 6.0, "fft": 0.0, "sort": 0.0, "gather": 0.5, "transcendental": 1.0,
                                   "elementwise": 2.0, "data movement": 0.5, "other": 0.0},
               "op_seconds": 10.0, "unmatched_seconds": 0.0, "profiled_wall_seconds": 10.5,
               "matmuls_by_contraction": {"64": {"flops": 100.0, "seconds": 2.0},
                                          "256": {"flops": 400.0, "seconds": 4.0},
                                          "2": {"flops": 1.0, "seconds": 0.1}}}
    cell = {"variant": "softmax", "length": 2048, "dropout_rate": 0.0, "status": "ok", "profile": profile,
            "matmul_peak_flops_per_second": 100.0}
    lines = bench_report.profile_table([cell, {**cell, "variant": "linear", "profile": None}]).splitlines()
    assert len(lines) == 2
    # matmul 60% of the ops; 501 FLOPs in 6.1 s at a peak of 100/s: 82%; k = 64: 100 in 2 s, 50%.
    assert lines[1].split() == ["softmax", "p=0", "2048", "60%", "82%", "k=64", "50%", "10%", "20%", "5%", "5%",
                                "95%"]
    assert bench_report.profile_table([{**cell, "profile": None}]) == ""


def test_report_summarises_saved_cells_per_variant_and_length(tmp_path, capsys):
    """--report prints, from bench JSONs alone, each variant's seconds per step at dropout 0, dropout's
    cost, the share of the matmul peak (on accelerators also of the vendor's) and of streaming XLA's
    bytes; a failed cell shows its status."""
    def cell(variant, length, rate, seconds, **extra):
        return {"variant": variant, "length": length, "dropout_rate": rate, "status": "ok",
                "seconds_per_step": seconds, "steps_per_second": 1 / seconds, "peak_memory_bytes": 1,
                "utilisation": 0.5, "memory_time_share": 0.25, **extra}

    first = {"results": [cell("softmax", 1024, 0.0, 4.0), cell("softmax", 1024, 0.1, 4.4)]}
    second = {"results": [cell("softmax", 4096, 0.0, 40.0), {"variant": "softmax", "length": 4096,
                                                               "dropout_rate": 0.1, "status": "oom"},
                          {"variant": "linear", "length": 4096, "dropout_rate": 0.0, "status": "oom"}]}
    paths = []
    for name, report in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps(report))
        paths.append(str(tmp_path / name))
    lines = bench_report.summary(bench_report.read_reports(paths)).splitlines()
    assert "n = 1024" in lines[0] and "n = 4096" in lines[0]
    assert lines[2].split() == ["softmax", "4", "+10%", "—", "50%", "25%", "40", "—", "—", "50%", "25%"]
    assert lines[3].split() == ["linear", "—", "—", "—", "—", "—", "OOM"]
    paired = {"results": [cell("softmax", 1024, 0.0, 2.0, step_seconds=[2.0] * 5),
                          cell("softmax", 1024, 0.1, 2.2, step_seconds=[1.9, 2.1, 2.2, 2.3, 2.5])]}
    (tmp_path / "paired.json").write_text(json.dumps(paired))
    lines = bench_report.summary(bench_report.read_reports([str(tmp_path / "paired.json")])).splitlines()
    assert lines[2].split() == ["softmax", "2", "+10%", "-5..+25", "50%", "25%"]
    on_gpu = {"results": [cell("softmax", 4096, 0.0, 0.2, matmul_peak_flops_per_second=300e12,
                               vendor_peak_flops_per_second=500e12)]}
    (tmp_path / "gpu.json").write_text(json.dumps(on_gpu))
    lines = bench_report.summary(bench_report.read_reports([str(tmp_path / "gpu.json")])).splitlines()
    assert "% vendor" in lines[1] and "% vendor" not in bench_report.summary(paired["results"])
    assert lines[2].split() == ["softmax", "0.2", "—", "—", "50%", "30%", "25%"]  # 50% of 300 is 30% of 500
    # a peak timed on too small a product (under half the vendor's): no share of it, the vendor's stays
    on_gpu["results"][0]["matmul_peak_flops_per_second"] = 100e12
    unsound = bench_report.summary(on_gpu["results"]).splitlines()[2].split()
    assert unsound == ["softmax", "0.2", "—", "—", "—", "10%", "25%"] and bench_report.unsound_peak(on_gpu["results"][0])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(bench.LraError, match="bad.json is not a bench JSON"):
        bench_report.read_reports([str(tmp_path / "bad.json")])


def test_vendor_peaks_are_known_for_the_gpus_we_compile_for_and_none_for_cpus():
    from lra_jax.measure import device_peak

    assert device_peak.vendor_peak("NVIDIA H200", "float32") == 494e12  # TF32, as jax runs float32 there
    assert device_peak.vendor_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert device_peak.vendor_peak("TPU v5 lite", "bfloat16") == 197e12
    assert device_peak.vendor_peak("cpu", "float32") is None
