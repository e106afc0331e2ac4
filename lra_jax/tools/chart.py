r"""The LRA paper's speed-vs-score bubble chart, measured, and its results table, from runs and bench JSONs.

    python -m lra_jax.tools.chart --runs=experiments/mini-lra,experiments/pathfinder-mini-rerun \
        --spt_runs=experiments/mini-lra,experiments/pathfinder-mini-earlier-recipe \
        --bench='experiments/results/bench-h200-*.json' \
        --length=4096 --cpu_bench=experiments/results/bench-cpu-1core-b8-2048-every-variant-one-command.json \
        --out=experiments/charts

Scores: every results.json under --runs (`lra_jax.research.sweeps.selection`): per variant and task, the grid
point with the best mean validation accuracy (never test) is reported by its test accuracy, mean and sample std
over seeds; diverged runs are never results and are named. A results.json that its run's metrics.jsonl or
config.json does not back, or whose accuracy is not a fraction in [0, 1] (`lra_jax.training.run_result`), is one
line naming it and exit 2: nothing is drawn. A variant's score is the mean of its tasks' test means (%) over
ListOps, Text, Retrieval, Image and Pathfinder (Path-X on its own), per scale.

Main panel (the paper's Figure 3, measured): x = train-step speed at --length relative to softmax on the
--device of the --bench files (each variant over the softmax of its own bench file; a file without one
borrows the softmax of the file nearest in date, and the note under the panel and the table say which),
bubble = the step's memory there relative to softmax's, labelled for what the bench recorded (a measured
device peak, or XLA's compiled estimate), y = LRA score with a bar of ±1 std of a single-seed score;
full-scale points solid, mini-scale hollow, every variant its own colour and marker. The LRA paper's
models (experiments/reference/lra_paper.json, full scale: Table 2 speed and memory at 4K relative to the
Transformer, Table 1 accuracy averaged over the tasks our point is scored on) on the same axes, joined by
a dotted line only to our full-scale point of the same variant, never across scales.
The self-pretraining figure and gain table set each variant's self-pretrained arm against its arm from
scratch; --spt_runs gives that comparison runs of its own (both arms, when the headline's runs of a task
moved to another recipe), and the table and figure name each task whose recipe there is not the headline's.
Secondary panels, also relative to softmax: --cpu_bench (measured on a CPU) and --modeled (the TPU
compiler's modeled step on the paper's hardware, labelled modeled). s4d, the state-space yardstick, is a
diamond. The published LRA score of each implemented state-space or modern-mixer variant (S4D, S5, LRU,
Mega: experiments/reference/s4d_paper.json, modern_papers.json) is a short bar in its colour at its point
on the main panel, averaged over the same tasks, dashed to the point only at full scale. Writes
lra_chart.png, lra_chart.svg, lra_results.md (per scale: the scores and every device's speed and memory;
full-scale scores beside the paper's; the file each speed came from; the chosen grid points; the LRA,
S4D, S5, LRU and Mega papers' figures, and with a self-pretrained arm, the gain and the SPT paper's
figures, experiments/reference/spt_paper.json) and lra_chart.inputs.json (the command, every input's path, sha256 and
recorded commit, and the values drawn).

    python -m lra_jax.tools.chart --check [--out=experiments/charts]

redraws in memory with the flags the manifest in --out recorded (flags given beside --check replace them)
and prints one line per input added, removed or changed and per output that differs from the fresh draw;
it exits 1 when there is any, 0 when the committed chart is up to date. Image bytes are not compared (they
differ between matplotlib versions): the values drawn are, and each image must decode (the PNG with
Pillow, the SVG as XML) and carry the sha256 of the manifest's drawn values, written into it when drawn;
a replaced, damaged or foreign image is one line naming it and the command that redraws it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from absl import flags

from lra_jax.errors import LraError
from lra_jax.research.reports import chart_manifest
from lra_jax.research.reports.chart_manifest import ChartOptions
from lra_jax.research.reports.lra_chart import check_chart, make_chart
from lra_jax.research.reports.lra_results import REFERENCE
from lra_jax.tools import parse_command_line


OPTION_FLAGS = tuple(field.name for field in dataclasses.fields(ChartOptions))


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    defaults = ChartOptions()
    flags.DEFINE_string("runs", defaults.runs, "Directories (comma-separated) searched recursively for results.json.",
                        flag_values=values)
    flags.DEFINE_string("spt_runs", None, "Directories (comma-separated) of the self-pretraining comparison, both "
                        "arms: when given, its figure, gain table and the interactive view's self-pretrained arm "
                        "are drawn from these runs alone (a task whose recipe there is not the headline's is named) "
                        "and the self-pretrained runs under --runs are not read.", flag_values=values)
    flags.DEFINE_string("bench", None, "Bench JSONs (`python -m lra_jax.tools.bench`; comma-separated paths or "
                        "globs) for the main panel: speed and memory relative to softmax on one device; without "
                        "it the main panel has no speed axis.", flag_values=values)
    flags.DEFINE_string("device", None, "The device of the main panel: part of a device kind recorded in the --bench "
                        "files (e.g. H200); default: the device with the most variants measured.", flag_values=values)
    flags.DEFINE_integer("length", None, "Sequence length of the main panel's speed (the paper's: 4096; default: "
                         "the longest length softmax was measured at).", flag_values=values)
    flags.DEFINE_float("dropout_rate", defaults.dropout_rate, "Dropout rate of the measured train steps (the LRA "
                       "recipe trains with 0.1).", flag_values=values)
    flags.DEFINE_string("cpu_bench", None, "A CPU bench JSON for a secondary panel (its longest length with softmax).",
                        flag_values=values)
    flags.DEFINE_string("modeled", None, "Table 2 compile JSON (`python -m lra_jax.tools.compile --lengths=...`) "
                        "for a secondary panel: the TPU compiler's modeled speed at its longest length.",
                        flag_values=values)
    flags.DEFINE_string("out", defaults.out, "Output directory for PNG, SVG, Markdown and the manifest.",
                        flag_values=values)
    flags.DEFINE_enum("scale", None, ["full", "mini"], "Only runs of this scale (default: every scale, full-scale "
                      "points solid and mini-scale points hollow).", flag_values=values)
    flags.DEFINE_integer("min_seeds", defaults.min_seeds, "Leave out (and name) a variant's task whose chosen grid "
                         "point has fewer finished seeds: a chart of a sweep still running shows only finished cells.",
                         flag_values=values)
    flags.DEFINE_string("reference", REFERENCE, "Published LRA figures (the paper's points on the main panel).",
                        flag_values=values)
    flags.DEFINE_bool("check", False, "Write nothing: redraw in memory with the flags recorded in "
                      f"--out/{chart_manifest.MANIFEST_NAME} (flags given replace them) and exit 1, one line "
                      "per problem, when an input or an output differs from the committed chart.", flag_values=values)


def check_options(args: flags.FlagValues) -> ChartOptions:
    """The options of the committed chart in --out, as its manifest recorded them, with the flags given
    on the command line in their place."""
    path = os.path.join(args.out, chart_manifest.MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            recorded = ChartOptions.from_record(json.load(f)["options"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LraError(f"cannot read the chart's manifest {path} ({type(error).__name__}: {error}); draw the "
                       "chart first, or pass --out=<the directory of a drawn chart>") from error
    given = {name: args[name].value for name in OPTION_FLAGS if args[name].present}
    return dataclasses.replace(recorded, **given)


def run_check(args: flags.FlagValues) -> None:
    """`--check`: one line per problem on stderr and exit 1, or a line saying the chart is current."""
    options = check_options(args)
    problems = check_chart(options)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"the chart in {options.out} is stale; redraw it with `{options.command()}`", file=sys.stderr)
        sys.exit(1)
    print(f"the chart in {options.out} is up to date with its inputs (`{options.command()}`)")

def main(argv: list[str] | None = None) -> None:
    args, _ = parse_command_line("lra_jax.tools.chart", __doc__, define_flags, argv)
    try:
        if args.check:
            run_check(args)
            return
        paths = make_chart(ChartOptions(**{name: args[name].value for name in OPTION_FLAGS}))
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    for path in dict.fromkeys(paths.values()):
        print(f"wrote {path}")


def cli() -> None:
    """The command (`python -m lra_jax.tools.chart`, `lra-chart`)."""
    main()


if __name__ == "__main__":
    cli()
