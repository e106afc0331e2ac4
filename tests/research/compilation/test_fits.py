"""The compile matrix gathered from compile JSONs (`lra_jax.tools.fits`): cells, precedence, coverage."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

from lra_jax.research.choices import config_files
from lra_jax.tools import fits

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


GIB = 2**30


def row(variant, task, target, mode, result="ok", total=2 * GIB, plan=None, config_batch=None):
    return {"variant": variant, "task": task, "target": target, "mode": mode, "result": result,
            "memory": {"total": total} if result == "ok" else None, "plan": plan, "config_batch": config_batch,
            "device_memory": 80 * GIB}


def write(path, command, rows):
    path.write_text(json.dumps({"command": command, "date": "2026-11-25", "rows": rows}))
    return str(path)


def test_cells_show_memory_accumulation_refusals_and_errors_and_the_last_file_wins(tmp_path, capsys):
    first = write(tmp_path / "a.json", "python -m lra_jax.tools.compile --targets=h100 --scale=full", [
        row("softmax", "listops", "h100", "train", total=3 * GIB),
        row("softmax", "listops", "h100", "eval"),
        row("linformer", "pathx", "h100", "train", "does not fit",
            plan={"status": "planned", "per_device_batch": 8, "accum_steps": 4}),
        row("additive", "pathx", "h100", "train", "does not fit", plan={"status": "one example does not fit"}),
        row("routing", "text:4000", "h100", "eval", "error"),
        row("s4d", "listops", "h100", "train", total=GIB, config_batch=50)])
    later = write(tmp_path / "b.json", "python -m lra_jax.tools.compile --targets=h100", [
        row("softmax", "listops", "h100", "train", total=int(1.5 * GIB))])
    skipped = write(tmp_path / "c.json", "python -m lra_jax.tools.compile --targets=h100 --per_device_batch=8", [
        row("softmax", "image", "h100", "train")])
    assert fits.main([first, later, skipped, "--targets=h100"]) == 0
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
    columns = fits.shapes()
    assert columns == ["listops", "text", "text:4000", "retrieval", "image", "pathfinder", "pathx"]
    cells = {v: dict(zip(columns, lines[v])) for v in ("softmax", "linformer", "additive", "routing", "s4d")}
    assert cells["softmax"]["listops"] == "1.50/2.00"  # b.json's train row replaced a.json's
    assert cells["softmax"]["image"] == "./."  # a --per_device_batch run is not the config as it is
    assert cells["linformer"]["pathx"] == "a4/."
    assert cells["additive"]["pathx"] == "X/."
    assert cells["routing"]["text:4000"] == "./E"
    assert cells["s4d"]["listops"] == "1.00~/."  # compiled at a batch the devices divide
    coverage = " ".join(lines["6"])  # "6 of the 1232 steps ..."
    assert "of the" in coverage and "3 fit, 1 fit with accumulation, 1 do not fit one example per device, 1 errors, " \
        "1 compiled at a batch the devices divide" in coverage


def test_a_file_that_is_not_a_compile_json_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"rows\": []}")
    assert fits.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "not a compile JSON" in err[0]


def test_globbed_files_are_read_in_the_order_they_were_written(tmp_path):
    """A re-compile of a step written later the same day wins over a file with the day alone."""
    later = write(tmp_path / "a-later.json", "python -m lra_jax.tools.compile", [])
    day_only = write(tmp_path / "b-day-only.json", "python -m lra_jax.tools.compile", [])
    earlier = write(tmp_path / "c-earlier.json", "python -m lra_jax.tools.compile", [])
    for path, date in ((later, "2026-11-25T22:40:00"), (earlier, "2026-11-25T09:05:00")):
        document = json.loads(open(path).read())
        document["date"] = date
        open(path, "w").write(json.dumps(document))
    assert fits.by_date([later, day_only, earlier]) == [day_only, earlier, later]


def test_the_summary_gives_each_target_its_outcomes_largest_step_and_the_steps_to_plan(tmp_path, capsys):
    path = write(tmp_path / "a.json", "python -m lra_jax.tools.compile --targets=h100,a100 --scale=full", [
        row("softmax", "listops", "h100", "train", total=3 * GIB),
        row("luong", "retrieval", "h100", "train", total=70 * GIB),
        row("luong", "pathx", "h100", "eval", "does not fit",
            plan={"status": "planned", "per_device_batch": 8, "accum_steps": 8}),
        row("s4d", "image", "a100", "eval", total=GIB, config_batch=50),
        row("additive", "pathx", "a100", "train", "does not fit", plan={"status": "one example does not fit"})])
    assert fits.main([path, "--summary", "--targets=h100,a100"]) == 0
    out = capsys.readouterr().out.splitlines()
    h100 = next(line for line in out if line.startswith("h100 ")).split()
    a100 = next(line for line in out if line.startswith("a100 ")).split()
    steps = str(len(config_files()) * len(fits.shapes()) * 2)  # every variant x shape x train, eval
    assert h100[1:9] == ["3", "of", steps, "2", "1", "0", "0", "0"], h100
    assert " ".join(h100[9:]) == "70.00 of 80.00 (luong retrieval train) luong pathx eval a8"
    assert a100[1:9] == ["2", "of", steps, "1", "0", "1", "0", "1"], a100
    assert " ".join(a100[9:]) == "1.00 of 80.00 (s4d image eval) additive pathx train X"


def test_the_summary_names_its_columns_in_words_and_says_what_a_partial_row_means(tmp_path, capsys):
    """A target with 1 of its steps compiled reads as 'not compiled yet', not as a failure."""
    path = write(tmp_path / "a.json", "python -m lra_jax.tools.compile --targets=h200 --scale=full",
                 [row("softmax", "listops", "h200", "train")])
    assert fits.main([path, "--summary", "--targets=h200"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split("  ")
    assert [h.strip() for h in header if h.strip()][:7] == [
        "target", "compiled", "fit", "accumulate", "too big", "errors", "other batch"]
    variants = len(config_files())
    assert f"1 of {variants * 7 * 2}" in out
    legend = " ".join(out.split())
    assert f"of the {variants * 7 * 2} there are ({variants} variants x 7 task shapes x train, eval" in legend
    assert "Fewer is not a failure: the others were not compiled for that target yet" in legend
    assert "python -m lra_jax.tools.compile --targets=<target>" in legend
    for word in ("fit:", "accumulate (aN):", "too big (X):", "errors (E):", "other batch (~):"):
        assert word in legend


@pytest.mark.slow
def test_a_reader_that_stops_early_ends_the_command_without_a_traceback():
    """`python -m lra_jax.tools.fits | head -1` on the committed JSONs: head reads one line and exits."""
    done = subprocess.run(f"{sys.executable} -m lra_jax.tools.fits | head -1", shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.count("\n") == 1 and done.stdout.strip()
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
