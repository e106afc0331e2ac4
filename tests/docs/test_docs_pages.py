"""The generated docs pages: `--check` passes on the committed ones and fails when a page is edited by
hand (the variants at a glance too: tests/research/reports/test_dependence_maps.py checks its images), when
the JSON it is generated from changes or when the chart the site shows is redrawn. And the
hand-written pages that list the others: the home page links every page of the nav, and the contributing
page lists every command and CI script, the self-pretraining page every causal variant."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

from lra_jax.research.reports import docs_pages, kernel_table

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def test_committed_pages_are_what_the_generator_writes():
    assert docs_pages.stale(os.path.join(REPO, "docs"), REPO) == []


def test_the_kernel_table_is_what_plan_picks_from_the_declarations_and_the_page_holds_it():
    table = kernel_table.block()
    ops = kernel_table.ops()
    assert {op.name for op in ops} >= {"flash", "block_sparse", "linear", "gated_scan"}
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")) for line in table.splitlines()[2:]}
    assert ("`flash`", "`luong`, `softmax`, `synthesizer`", "`auto`", "`pallas-triton`",
            "`pallas-mosaic-splash`; with attention dropout `pallas-mosaic-flash`; with a causal mask "
            "`pallas-mosaic-flash`", "`xla`") in rows
    assert ("", "", "`pallas`", "`pallas-triton`", "`xla`", "`pallas-triton` (interpreted)") in rows  # linear, gated
    path, text = kernel_table.current(os.path.join(REPO, "docs"))
    with open(path, encoding="utf-8") as f:
        assert f.read() == text, "docs/kernels.md's table is stale: run python -m lra_jax.tools.docs"


def _copy(tmp_path):
    """A repository root holding the committed bench and compile JSON and docs pages, to change freely."""
    root = tmp_path / "repo"
    shutil.copytree(os.path.join(REPO, "experiments", "results"), root / "experiments" / "results",
                    ignore=shutil.ignore_patterns("*.txt"))
    shutil.copytree(os.path.join(REPO, "docs"), root / "docs")
    shutil.copytree(os.path.join(REPO, "experiments", "charts"), root / "experiments" / "charts")
    shutil.copy(os.path.join(REPO, "README.md"), root / "README.md")  # its results table is generated too
    return root


def check(root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lra_jax.tools.docs", "--check", f"--root={root}",
                           f"--docs_dir={root / 'docs'}"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO})


@pytest.mark.slow
def test_check_fails_on_a_hand_edited_page(tmp_path):
    """The command as CI runs it, once: it draws every variant's dependence map again (minutes). That it passes
    on the committed pages is test_documented_commands' `docs --check` and CI's."""
    root = _copy(tmp_path)
    page = root / "docs" / "results" / "gpu-bench.md"
    page.write_text(page.read_text().replace("steps/s", "steps/s (edited)", 1))
    glance = root / "docs" / "variants-at-a-glance.md"
    glance.write_text(glance.read_text().replace("White is exactly zero", "White is zero", 1))
    result = check(root)
    assert result.returncode == 1 and "gpu-bench.md" in result.stderr, result.stderr
    assert "variants-at-a-glance.md" in result.stderr, result.stderr


def test_check_fails_when_the_json_changes(tmp_path):
    root = _copy(tmp_path)
    path = root / "experiments" / "results" / "bench-h200-b32-4096-others.json"
    report = json.loads(path.read_text())
    cell = next(r for r in report["results"] if r["status"] == "ok")
    cell["steps_per_second"] *= 2
    path.write_text(json.dumps(report))
    assert docs_pages.stale(str(root / "docs"), str(root)) == [str(root / "docs" / "results" / "gpu-bench.md")]


def test_check_fails_when_a_tpu_compile_json_changes(tmp_path):
    """docs/tpu-modeled-time.md counts the TPU rows of every compile JSON: a new one makes it stale."""
    root = _copy(tmp_path)
    path = root / "experiments" / "results" / "compile-full-text-tpu-v5e-2x2.json"
    report = json.loads(path.read_text())
    report["rows"] = report["rows"][1:]
    path.write_text(json.dumps(report))
    assert docs_pages.stale(str(root / "docs"), str(root)) == [str(root / "docs" / "tpu-modeled-time.md")]


def test_claims_are_computed_from_the_cells():
    cells = [{"status": "ok", "dropout_cost": -0.026, "utilisation": 0.34},
             {"status": "ok", "dropout_cost": 0.09, "utilisation": 0.64},
             {"status": "oom", "dropout_cost": 0.5, "utilisation": 0.9}]
    text = " ".join(docs_pages.claims(cells))
    assert "-2.6% and +9.0%" in text and "34.0% to 64.0%" in text and "2 cells" in text


def test_check_fails_when_the_chart_is_redrawn(tmp_path):
    """The chart the site shows is a copy of the committed one: a redrawn chart makes the copy stale."""
    root = _copy(tmp_path)
    assert docs_pages.stale(str(root / "docs"), str(root)) == []
    chart = root / "experiments" / "charts" / "lra_chart.png"
    chart.write_bytes(chart.read_bytes() + b"\0")
    assert docs_pages.stale(str(root / "docs"), str(root)) == [str(root / "docs" / "assets" / "lra_chart.png")]


def nav_pages(items) -> list[str]:
    """Every page of mkdocs.yml's nav, in order."""
    pages = []
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_home_page_links_every_page_of_the_nav():
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with mkdocs (pip install -e \".[docs]\")")
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        pages = nav_pages(yaml.safe_load(f)["nav"])
    with open(os.path.join(REPO, "docs", "index.md"), encoding="utf-8") as f:
        home = f.read()
    linked = set(re.findall(r"\]\(([\w/.-]+\.md)(?:#[\w-]*)?\)", home))
    assert len(pages) > 20 and "results/lra.md" in pages
    assert [p for p in pages if p != "index.md" and p not in linked] == []
    assert "README" not in home


def test_contributing_lists_every_command_and_ci_script():
    with open(os.path.join(REPO, "docs", "contributing.md"), encoding="utf-8") as f:
        layout = f.read().split("## Layout", 1)[1].split("## ", 1)[0]
    tools = re.search(r"^  tools/ .*?(?=^  \S)", layout, re.S | re.M).group(0)
    ci = re.search(r"^\.ci/ .*?(?=^\S)", layout, re.S | re.M).group(0)
    commands = {name[:-3] for name in os.listdir(os.path.join(REPO, "lra_jax", "tools"))
                if name.endswith(".py") and name != "__init__.py"}
    assert [c for c in sorted(commands) if not re.search(rf"\b{c}\b", tools)] == []
    scripts = os.listdir(os.path.join(REPO, ".ci"))
    assert [s for s in sorted(scripts) if s not in ci] == []


def test_the_self_pretraining_page_names_every_causal_variant():
    """The page's list of causal layers, written by hand, names each variant the registry gives a causal form
    (it once listed S4D alone after seven more had theirs), and under the setting that gives it."""
    from lra_jax.attention.core import causal_forms

    with open(os.path.join(REPO, "docs", "self-pretraining.md"), encoding="utf-8") as f:
        listed = f.read().split("the layers must be causal", 1)[1].split("Every other variant", 1)[0]
    bullets = re.split(r"^- ", listed, flags=re.M)[1:]
    forms = causal_forms()
    assert len(forms) >= 16
    missing = [name for name, form in sorted(forms.items())
               if not any(f"`--config.attention.{form}`" in b and re.search(rf"\b{re.escape(name)}\b", b, re.I)
                          for b in bullets)]
    assert missing == [], "docs/self-pretraining.md does not name these causal variants under their setting"


def test_a_bench_table_merged_from_several_commands_says_so():
    """A JSON whose cells several `--update` commands measured names the last and says how many there were."""
    report = {"command": "/clone/lra_jax/tools/bench.py --variants=s5", "device": {"count": 1, "kind": "cpu"},
              "commands": ["/clone/lra_jax/tools/bench.py --variants=softmax", "/clone/lra_jax/tools/bench.py --variants=s5"]}
    text = docs_pages.header(report, "bench.json")
    assert "`python -m lra_jax.tools.bench --variants=s5`" in text and "measured by 2 such commands" in text
    assert "such commands" not in docs_pages.header({**report, "commands": report["commands"][1:]}, "bench.json")


def test_the_cpu_bench_page_leads_with_the_file_the_chart_draws(tmp_path):
    """Several CPU bench files are history; the one the chart's manifest names leads the page, marked."""
    results, charts = tmp_path / "experiments" / "results", tmp_path / "experiments" / "charts"
    results.mkdir(parents=True)
    charts.mkdir(parents=True)
    cell = {"variant": "softmax", "length": 2048, "status": "ok", "steps_per_second": 0.1, "peak_memory_bytes": 2**30}
    for name in ("bench-cpu-a-old.json", "bench-cpu-z-new.json"):
        (results / name).write_text(json.dumps({"command": f"x/lra_jax/tools/bench.py --out={name}",
                                                "device": {"count": 1, "kind": "cpu"}, "results": [cell]}))
    (charts / "lra_chart.inputs.json").write_text(json.dumps(
        {"options": {"cpu_bench": "experiments/results/bench-cpu-z-new.json"}}))
    page = docs_pages.cpu_results_page(str(tmp_path))
    sections = page.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["bench-cpu-z-new.json", "bench-cpu-a-old.json"]
    assert "the chart's CPU view is drawn from" in sections[0] and "chart" not in sections[1]
    (charts / "lra_chart.inputs.json").unlink()  # no chart drawn: the files by name, none marked
    page = docs_pages.cpu_results_page(str(tmp_path))
    assert page.index("## bench-cpu-a-old.json") < page.index("## bench-cpu-z-new.json")
    assert "drawn from" not in page
