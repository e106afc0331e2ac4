"""lra_jax.research.reports.spt_report: self-pretrained against from scratch, compared only on the same tasks, and
what the gain table says computed from its cells."""

import json
import re

import pytest
from scipy import stats

from lra_jax.research.reports import spt_report
from chart_helpers import chart, run_dir, table_rows, write_bench, write_result
from run_records import write_record

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def cell(accuracy: dict, std: dict | None = None, seeds: int = 3) -> dict:
    """An `lra_results.aggregate` entry with these per-task means (%) and stds."""
    std = std or {t: 1.0 for t in accuracy}
    return {"accuracy": accuracy, "std": std, "seeds": {t: seeds for t in accuracy}}


def write_spt(root, task, variant, seed, accuracy):
    """A self-pretrained run's results.json (its own folder, as the sweep's spt/ arm)."""
    workdir = run_dir(root / "spt", task, variant, seed, "mini", "")
    write_record(workdir, {
        "task": task, "variant": variant, "test_accuracy": accuracy, "val_accuracy": accuracy, "scale": "mini",
        "pretrain_objective": "masked", "pretrain": {"num_steps": 100, "seconds": 12.0 + seed, "final_train_loss": 2.0 + 0.1 * seed},
        "config": {"seed": seed, "scale": "mini"}})


def test_pareto_front_keeps_only_variants_nobody_beats_in_both_speed_and_accuracy():
    speed = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 2.0}
    accuracy = {"a": 60.0, "b": 50.0, "c": 40.0, "d": 45.0}  # d is slower-or-equal and worse than b
    assert spt_report.pareto(speed, accuracy) == ["c", "b", "a"]


def test_welch_t_test_from_the_arms_summaries_matches_the_test_on_the_seeds_themselves():
    spt_seeds, scratch_seeds = [41.0, 42.5, 44.0], [39.0, 40.0, 40.5]
    def summary(seeds):
        mean = sum(seeds) / len(seeds)
        std = (sum((x - mean) ** 2 for x in seeds) / (len(seeds) - 1)) ** 0.5
        return cell({"listops": mean}, {"listops": std}, seeds=len(seeds))
    w = spt_report.welch(summary(spt_seeds), summary(scratch_seeds), "listops")
    reference = stats.ttest_ind(spt_seeds, scratch_seeds, equal_var=False)
    assert w.t == pytest.approx(reference.statistic) and w.p == pytest.approx(reference.pvalue)
    # by hand: v = 1/3 each, t = 1.7 / sqrt(2/3) = 2.082, df = (2/3)² / (2 (1/3)² / 2) = 4, p = 0.1058
    w = spt_report.welch(cell({"listops": 41.7}), cell({"listops": 40.0}), "listops")
    assert (w.t, w.df, w.p) == pytest.approx((2.0821, 4.0, 0.10578), abs=1e-4)


def test_a_difference_beyond_twice_the_standard_error_is_no_longer_called_a_gain():
    # 41.7 - 40 = 1.7 > 2 se (1.63), the old rule's "clear gain"; Welch with 3 seeds a side: p = 0.11
    scratch = cell({"listops": 40.0})
    assert spt_report.verdict(cell({"listops": 41.7}), scratch, "listops") == "noise"
    assert spt_report.verdict(cell({"listops": 44.0}), scratch, "listops") == "gain"  # p = 0.0080
    assert spt_report.verdict(cell({"listops": 36.0}), scratch, "listops") == "loss"
    one_seed = cell({"listops": 90.0}, {"listops": None}, seeds=1)
    assert spt_report.verdict(one_seed, scratch, "listops") == "untested"  # no spread, no claim
    flat = cell({"listops": 40.0}, {"listops": 0.0})
    assert spt_report.welch(flat, flat, "listops").p == 1.0 and spt_report.verdict(
        cell({"listops": 41.0}, {"listops": 0.0}), flat, "listops") == "untested"


def test_a_gain_clear_alone_is_not_clear_among_many_comparisons():
    """p = 0.0080 alone is a gain; with 21 other variants tested on the task, Holm multiplies it by 22."""
    scratch = {f"v{i:02d}": cell({"listops": 40.0}) for i in range(22)}
    spt = {**{v: cell({"listops": 40.0}) for v in scratch}, "v00": cell({"listops": 44.0})}
    tests = spt_report.task_tests(spt, scratch, "listops", sorted(scratch))
    welch, adjusted, said = tests["v00"]
    assert welch.p == pytest.approx(0.0080, abs=1e-4) and adjusted == pytest.approx(22 * welch.p)
    assert said == "noise" and spt_report.verdict(spt["v00"], scratch["v00"], "listops") == "gain"
    [line] = [x for x in spt_report.findings(spt, scratch) if x.startswith("- ")]
    assert line.startswith("- ListOps: 22 variants compared: 0 clear gains, 0 clear losses, 22 within noise "
                           "(Holm, p < 0.05)")


def test_findings_count_gains_compare_softmax_with_s4d_and_rank_agreement():
    scratch = {"softmax": cell({"pathfinder": 60.0}), "linear": cell({"pathfinder": 55.0}),
               "local": cell({"pathfinder": 50.0}), "s4d": cell({"pathfinder": 80.0})}
    spt = {"softmax": cell({"pathfinder": 75.0}), "linear": cell({"pathfinder": 55.5}),
           "local": cell({"pathfinder": 65.0}), "s4d": cell({"pathfinder": 81.0})}
    speed = {"softmax": 1.0, "linear": 3.0, "local": 2.0}
    [line] = [x for x in spt_report.findings(spt, scratch, speed, "GPU") if x.startswith("- ")]
    assert line.startswith("- Pathfinder: 4 variants compared: 2 clear gains, 0 clear losses, 2 within noise "
                           "(Holm, p < 0.05); mean gain +7.88 (linear +0.50 to local +15.00)")
    assert "S4D minus softmax +20.00 from scratch, +6.00 with SPT" in line
    # scratch order softmax > linear > local, SPT order softmax > local > linear: C=2, D=1
    assert "rank agreement 0.33 over 3 attention variants" in line
    assert "from scratch: softmax, linear, local; with SPT: softmax, local, linear" in line
    assert "(Pareto) from scratch: linear, softmax; with SPT: linear, local, softmax" in line
    [line] = [x for x in spt_report.findings({**spt, "softmax": cell({"pathfinder": 50.0})}, scratch, speed, "GPU")
              if x.startswith("- ")]
    assert line.startswith("- Pathfinder: 4 variants compared: 1 clear gain, 1 clear loss, 2 within noise ")


def test_spt_scored_on_other_tasks_than_from_scratch_is_named_not_drawn_and_has_no_score_gain(tmp_path):
    """Self-pretrained runs on Pathfinder only against runs from scratch on ListOps and Pathfinder: the
    arrow would join means over different tasks, so the point is left out and named; the table still
    gives the Pathfinder gain."""
    root = tmp_path / "runs"
    for seed in (0, 1, 2):
        for variant, accuracy in (("softmax", 0.40), ("linear", 0.30)):
            for task in ("listops", "pathfinder"):
                write_result(root, task, variant, seed, accuracy + 0.01 * seed, scale="mini")
            write_spt(root, "pathfinder", variant, seed, accuracy + 0.1 + 0.01 * seed)
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 4096, "ok", 100.0, 2**30), ("linear", 4096, "ok", 500.0, 2**29)])
    paths = chart(root, tmp_path / "out", bench=bench)
    with open(paths["inputs"], encoding="utf-8") as f:
        main = json.load(f)["panels"][0]
    drawn = {(p.get("series"), p["variant"]) for p in main["points"]}
    assert ("mini", "linear") in drawn and not any("SPT" in (series or "") for series, _ in drawn)
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    assert ("Self-pretrained scores not drawn until both arms are scored on the same tasks (SPT: Pathfinder; "
            "from scratch: ListOps + Pathfinder; per-task gains in the table): linear, softmax.") in table
    gains = table.split("## Self-pretraining gain")[1]
    assert table_rows(gains)["linear"] == ["linear", "+10.00 ± 1.41", "—"]
    assert "- Pathfinder: 2 variants compared: 2 clear gains" in gains
    # the test behind it, with raw and Holm-adjusted p: 10 points apart, std 1 a side, 3 seeds: t = 12.2, df 4
    row = table_rows(gains.split("Welch's two-sided t-test")[1])["linear"]
    assert re.fullmatch(r"t \+12\.25 \(df 4\.0\), p (\S+), Holm (\S+): gain", row[1]), row
    compute = gains.split("Pretraining compute at the chosen grid point")[1]
    # means of 12, 13, 14 s and of losses 2.0, 2.1, 2.2
    assert table_rows(compute)["linear"] == ["linear", "100 steps, 13 s, loss 2.10"]


def test_spt_runs_of_their_own_give_both_arms_and_name_the_task_whose_recipe_is_not_the_headlines(tmp_path):
    """--spt_runs: the headline's Pathfinder on one recipe (2 layers), the self-pretraining comparison's two arms
    on another (1 layer). The gain is set against the comparison's own scratch arm, never the headline's; the
    self-pretrained runs under --runs are not read; the table and the figure say where both arms come from and
    which task's recipe is not the headline's; the command records the flag and --check holds."""
    from lra_jax.research.reports.chart_manifest import display_path
    from lra_jax.tools import chart as chart_command

    headline, comparison = tmp_path / "headline", tmp_path / "comparison"

    def write(root, seed, accuracy, layers, spt=False):
        workdir = run_dir(root / "spt" if spt else root, "pathfinder", "softmax", seed, "mini", "")
        record = {"task": "pathfinder", "variant": "softmax", "test_accuracy": accuracy, "val_accuracy": accuracy,
                  "scale": "mini", "config": {"seed": seed, "scale": "mini", "model": {"num_layers": layers}}}
        if spt:
            record.update(pretrain_objective="masked", pretrain={"num_steps": 100})
        write_record(workdir, record)

    for seed in (0, 1, 2):
        write(headline, seed, 0.70 + 0.01 * seed, layers=2)
        write(headline, seed, 0.99, layers=2, spt=True)  # not the comparison's: never read
        write(comparison, seed, 0.50 + 0.01 * seed, layers=1)
        write(comparison, seed, 0.60 + 0.01 * seed, layers=1, spt=True)
    bench = tmp_path / "bench.json"
    write_bench(bench, [("softmax", 4096, "ok", 100.0, 2**30)])
    out = tmp_path / "out"
    paths = chart(headline, out, bench=bench, spt_runs=str(comparison))
    with open(paths["md"], encoding="utf-8") as f:
        table = f.read()
    gains = table.split("## Self-pretraining gain")[1]
    assert table_rows(gains)["softmax"] == ["softmax", "+10.00 ± 1.41", "+10.00 ± 1.41"]
    shown = display_path(str(comparison))  # as the command names it: relative to the working directory
    source = (f"Both arms of the self-pretraining comparison are the runs under {shown}. Pathfinder on another "
              "recipe than the headline's (layers 1; the headline: layers 2).")
    assert source in gains
    assert source in table.split("## How the scores are computed")[1].split("## Self-pretraining gain")[0]
    with open(paths["inputs"], encoding="utf-8") as f:
        manifest = json.load(f)
    headline_points = manifest["panels"][0]["points"]
    assert [round(p["y"], 3) for p in headline_points if p.get("series") == "mini"] == [71.0]
    spt_panel = next(p for p in manifest["panels"] if p["figure"] == "lra_spt")
    assert " ".join(spt_panel["note"].split()).startswith(source)
    assert f"--spt_runs={shown}" in manifest["command"]
    with open(paths["lra_interactive.json"], encoding="utf-8") as f:
        interactive = json.load(f)
    pretrained = [p for panel in interactive["panels"] for p in panel["points"] if p["arm"] == "self-pretrained"]
    assert pretrained and all(round(p["y"], 3) == 61.0 for p in pretrained)
    chart_command.main(["--check", f"--out={out}"])  # exits 1 if anything differs
