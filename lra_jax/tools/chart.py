r"""Speed-vs-score bubble chart and results table, regenerated from runs and a bench JSON.

    python -m lra_jax.tools.chart --runs=runs/ --bench=experiments/results/bench-<device>-<date>.json \
        --out=experiments/charts/ --scale=full --length=4096

Reads every results.json under --runs with `lra_jax.experiments.selection`: per variant and task, the grid
point with the best mean validation accuracy (never test) is reported by its test accuracy, mean and
sample std over seeds; a run without a grid is one point. Diverged runs are never results: they are
named under the chart and table. Each variant is scored the LRA way: the mean of its tasks' test means
(%) over ListOps, Text, Retrieval, Image and Pathfinder (Path-X is reported on its own).

Left panel: x = examples/s at --length from the bench JSON, y = LRA score with a bar of ±1 std of a
single-seed score (sqrt(sum of the tasks' variances) / T), bubble area proportional to peak memory;
variants missing a task are drawn hollow and scored over the tasks they have; a caption says how the
points were chosen. Right panel: the LRA paper's published Table 1 score against its Table 2 speed and
memory at 4K (relative to Transformer, as the paper's Figure 3), from experiments/reference/lra_paper.json.
With --modeled (a compile JSON of the Table 2 protocol, `python -m lra_jax.tools.compile --lengths=...`) a
middle panel puts the same scores against the TPU compiler's modeled speed on the paper's hardware,
labelled modeled: no TPU ran.
Variants that are not attention and serve as the yardstick (`REFERENCE_VARIANTS`: s4d, the diagonal
state-space model) are drawn as diamonds in the left panel; the right panel marks the S4D paper's
published score (experiments/reference/s4d_paper.json) as a line. The table gives our figures (mean ±
std), the grid point chosen per cell with every candidate's validation accuracy (where a grid was
swept) and both papers' figures. Writes lra_chart.png, lra_chart.svg, lra_results.md and
lra_chart.inputs.json: the command, every input's path, sha256 and recorded commit, and the values drawn.

    python -m lra_jax.tools.chart --check [--out=experiments/charts]

redraws in memory with the flags the manifest in --out recorded (flags given beside --check replace them)
and prints one line per input added, removed or changed and per output that differs from the fresh draw;
it exits 1 when there is any, 0 when the committed chart is up to date. Image bytes are not compared (they
differ between matplotlib versions): the values drawn are.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from absl import app, flags

from lra_jax.errors import LraError
from lra_jax.experiments import chart_manifest
from lra_jax.experiments.chart_manifest import ChartOptions
from lra_jax.experiments.lra_chart import check_chart, make_chart
from lra_jax.experiments.lra_results import REFERENCE

FLAGS = flags.FLAGS
OPTION_FLAGS = ("runs", "bench", "out", "scale", "length", "min_seeds", "modeled", "reference")

def define_flags() -> None:
    """The command-line flags (defined only when run as a command, so modules import side by side)."""
    flags.DEFINE_string("runs", "runs", "Directory searched recursively for results.json files.")
    flags.DEFINE_string("bench", None, "Bench JSON from `python -m lra_jax.tools.bench` (speed and memory); "
                        "without it the chart has no speed axis and only the table is written.")
    flags.DEFINE_string("out", "experiments/charts", "Output directory for PNG, SVG and Markdown.")
    flags.DEFINE_enum("scale", None, ["full", "mini"], "Only runs of this scale (default: all scales).")
    flags.DEFINE_integer("length", None, "Sequence length whose bench results set speed and memory "
                         "(default: the longest length in the bench JSON).")
    flags.DEFINE_string("modeled", None, "Table 2 compile JSON (`python -m lra_jax.tools.compile --lengths=...`) "
                        "for a middle panel: our scores against the TPU compiler's modeled speed at its longest length.")
    flags.DEFINE_string("reference", REFERENCE, "Published LRA figures for the right panel.")
    flags.DEFINE_integer("min_seeds", 1, "Leave out (and name) a variant's task whose chosen grid point has "
                         "fewer finished seeds: a chart of a sweep still running shows only finished cells.")
    flags.DEFINE_bool("check", False, "Write nothing: redraw in memory with the flags recorded in "
                      f"--out/{chart_manifest.MANIFEST_NAME} (flags given replace them) and exit 1, one line "
                      "per problem, when an input or an output differs from the committed chart.")


def check_options() -> ChartOptions:
    """The options of the committed chart in --out, as its manifest recorded them, with the flags given
    on the command line in their place."""
    path = os.path.join(FLAGS.out, chart_manifest.MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            recorded = ChartOptions.from_record(json.load(f)["options"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LraError(f"cannot read the chart's manifest {path} ({type(error).__name__}: {error}); draw the "
                       "chart first, or pass --out=<the directory of a drawn chart>") from error
    given = {name: FLAGS[name].value for name in OPTION_FLAGS if FLAGS[name].present}
    return dataclasses.replace(recorded, **given)


def run_check() -> None:
    """`--check`: one line per problem on stderr and exit 1, or a line saying the chart is current."""
    options = check_options()
    problems = check_chart(options)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"the chart in {options.out} is stale; redraw it with `{options.command()}`", file=sys.stderr)
        sys.exit(1)
    print(f"the chart in {options.out} is up to date with its inputs (`{options.command()}`)")

def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        if FLAGS.check:
            run_check()
            return
        paths = make_chart(FLAGS.runs, FLAGS.out, FLAGS.bench, FLAGS.scale, FLAGS.length, FLAGS.reference,
                           min_seeds=FLAGS.min_seeds, modeled_path=FLAGS.modeled)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    for path in paths.values():
        print(f"wrote {path}")


def cli() -> None:
    """The command (`python -m lra_jax.tools.chart`, `lra-chart`)."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    cli()
