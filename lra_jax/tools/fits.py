"""What has been compiled for which accelerator, and whether it fits: the full-scale compile matrix
gathered from `compile`'s JSONs (`python -m lra_jax.tools.fits`).

    python -m lra_jax.tools.fits                                   # experiments/results/compile-*.json
    python -m lra_jax.tools.fits --targets=h100,a100 experiments/results/compile-full-*.json
    python -m lra_jax.tools.fits --summary                         # a line per target

Per target, a line per variant and a column per full-scale task shape (Text twice, at 1000 and 4000
tokens, as `compile` runs it), each cell its train and eval steps, `train/eval`: memory per device in
GiB where the step fits as configured, `aN` where it fits with accumulation N (`compile` planned it and
printed the overrides), `X` where one example per device does not fit, `E` a compile error, `.` not
compiled yet; a trailing `~` where the devices do not divide the config's batch, so the step was
compiled at the nearest batch they do (the trainer refuses the config's). Only rows of the configs as they are count: a JSON made with --lengths, --per_device_batch,
--impl other than auto, --attention_dropout_rate or at mini scale is skipped. Where several files hold
the same step, the last file read wins (files in the order given; globbed ones by the date and time of
their last write, then name; a JSON from before compile wrote the time has its day only, which sorts
before any time of that day).
`--summary` prints one line per target instead: how many of its steps are compiled (of every variant x
shape x train, eval: fewer means not compiled yet, not failed), how they came out, the largest that fits
as configured, and the steps that need accumulation or more memory; a legend under it says what each
column counts. The end says how much of the matrix `compile` runs by default (every variant and task on its default
targets, train and eval) has been compiled. Every figure is the compiler's, never a measurement.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import textwrap
from typing import Any

from absl import flags

from lra_jax.data.tasks import TASKS
from lra_jax.errors import LraError
from lra_jax.research.compilation import compile_step, lowering
from lra_jax.research.choices import config_files
from lra_jax.research.compilation.compile_matrix import DEFAULT_TARGETS
from lra_jax.research.compilation.compile_step import MODES
from lra_jax.measure.text_table import table as text_table
from lra_jax.measure.units import gib
from lra_jax.tools import parse_command_line


DEFAULT_GLOB = "experiments/results/compile-*.json"
OVERRIDES = ("--lengths", "--per_device_batch", "--impl=xla", "--impl=pallas", "--attention_dropout_rate",
             "--scale=mini")
FIT, ACCUMULATED, UNFIT, ERRORS, REBATCHED = (
    "fit", "fit with accumulation", "do not fit one example per device", "errors",
    "compiled at a batch the devices divide, not the config's")
COUNTS = ((FIT, lambda m: m[0].isdigit()), (ACCUMULATED, lambda m: m.startswith("a")),
          (UNFIT, lambda m: m.startswith("X")), (ERRORS, lambda m: m == "E"), (REBATCHED, lambda m: m.endswith("~")))

Key = tuple[str, str, str, str]  # variant, task label, target, mode


def shapes() -> list[str]:
    """The full-scale task shapes, labelled as `compile` labels its rows."""
    return [f"{task}:{length}" if length else task
            for _, task, length in lowering.combinations(["-"], list(TASKS), "full")]


def load_rows(paths: list[str]) -> dict[Key, dict[str, Any]]:
    """The rows of the configs as they are, by (variant, task, target, mode); a later file's row wins."""
    rows: dict[Key, dict[str, Any]] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
            command, found = document["command"], document["rows"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise LraError(f"{path}: not a compile JSON ({type(error).__name__}: {error}); "
                           "make one with python -m lra_jax.tools.compile --out=...") from None
        if any(flag in command for flag in OVERRIDES):
            continue
        for row in found:
            rows[(row["variant"], row["task"], row["target"], row["mode"])] = row
    return rows


def cell(row: dict[str, Any] | None) -> str:
    """One step's mark: GiB per device, aN, X, E or '.' (see the module docstring)."""
    if row is None:
        return "."
    rebatched = "~" if row.get("config_batch") else ""
    if row["result"] == "ok":
        return gib((row.get('memory') or {}).get('total', 0)) + rebatched
    if row["result"] == "does not fit":
        plan = row.get("plan") or {}
        return (f"a{plan['accum_steps']}" if plan.get("status") == "planned" else "X") + rebatched
    return "E"


def table(rows: dict[Key, dict[str, Any]], target: str, variants: list[str], columns: list[str]) -> str:
    lines = [f"{target}: train/eval, GiB per device (aN: fits with accumulation N; X: one example does not "
             "fit; E: error; .: not compiled; ~: at the nearest batch the devices divide)"
             + ("" if target.startswith("tpu") else "; " + compile_step.DEVICELESS_GPU_MEMORY), f"{'variant':<17}" + "".join(f"{c:>14}" for c in columns)]
    for variant in variants:
        cells = ["/".join(cell(rows.get((variant, c, target, m))) for m in MODES) for c in columns]
        lines.append(f"{variant:<17}" + "".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def outcomes(marks: list[str]) -> dict[str, int]:
    """How many compiled steps (cells other than '.') came out each way; a `~` step counts twice."""
    done = [m for m in marks if m != "."]
    return {name: sum(test(m) for m in done) for name, test in COUNTS}


def coverage(rows: dict[Key, dict[str, Any]], variants: list[str], columns: list[str], targets: list[str]) -> str:
    """How much of the variants x shapes x targets x steps matrix is compiled, and how it came out."""
    keys = [(v, c, t, m) for t in targets for v in variants for c in columns for m in MODES]
    marks = [cell(rows.get(k)) for k in keys]
    return (f"{sum(m != '.' for m in marks)} of the {len(keys)} steps of the default matrix ({len(variants)} variants "
            f"x {len(columns)} task shapes x {', '.join(targets)} x train, eval) compiled: "
            + ", ".join(f"{n} {name}" for name, n in outcomes(marks).items()))


def summary(rows: dict[Key, dict[str, Any]], targets: list[str], variants: list[str], columns: list[str]) -> str:
    """One line per target: steps compiled, how they came out, the largest step that fits as configured
    (GiB of the device's), and every step that needs accumulation or does not fit; a legend under it."""
    steps = len(variants) * len(columns) * len(MODES)
    cells = []
    for target in targets:
        keys = [(v, c, target, m) for v in variants for c in columns for m in MODES]
        marks = {k: cell(rows.get(k)) for k in keys}
        n = outcomes(list(marks.values()))
        fitting = [rows[k] for k, m in marks.items() if m[0].isdigit()]
        largest = max(fitting, key=lambda r: r["memory"]["total"], default=None)
        biggest = (f"{gib(largest['memory']['total'])} of {gib(largest['device_memory'])} "
                   f"({largest['variant']} {largest['task']} {largest['mode']})") if largest else "-"
        unfit = [f"{k[0]} {k[1]} {k[3]} {m}" for k, m in marks.items() if m[0] in "aX"]
        cells.append((target, f"{sum(m != '.' for m in marks.values())} of {steps}", n[FIT], n[ACCUMULATED],
                      n[UNFIT], n[ERRORS], n[REBATCHED], biggest, ", ".join(unfit) or "-"))
    header = ("target", "compiled", "fit", "accumulate", "too big", "errors", "other batch",
              "largest as configured, GiB per device", "needs accumulation (aN) or more memory (X)")
    legend = [
        f"compiled: the target's steps found in the files read, of the {steps} there are ({len(variants)} variants "
        f"x {len(columns)} task shapes x train, eval; files made with overrides such as --lengths are not counted). "
        "Fewer is not a failure: the others were not compiled for that target yet. To compile them:",
        "    python -m lra_jax.tools.compile --targets=<target> --variants=all --tasks=all --scale=full "
        "--out=experiments/results/compile-full-<target>.json",
        "Of the steps compiled: fit: fits as configured; accumulate (aN): fits with gradient accumulation over "
        "N micro-batches (compile printed the overrides); too big (X): does not fit, and no accumulation that "
        "fits was planned; errors (E): did not compile; other batch (~): compiled at the nearest batch the "
        "target's devices divide, not the config's (which the trainer refuses), and counted in one of the "
        "columns before it too."]
    wrapped = [line if line.startswith(" ") else textwrap.fill(line, width=110, break_on_hyphens=False)
               for line in legend]
    return text_table(header, cells, align="lrrrrrr") + "\n\n" + "\n".join(wrapped)


def by_date(paths: list[str]) -> list[str]:
    def date(path: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return str(json.load(f).get("date", ""))
        except (OSError, ValueError):
            return ""
    return sorted(paths, key=lambda p: (date(p), p))


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`); the compile JSONs are positionals."""
    flags.DEFINE_bool("summary", False, "one line per target instead of the tables", flag_values=values)
    flags.DEFINE_string("targets", "", "comma-separated targets to show (default: the default "
                                       "matrix's and every other target in the files)", flag_values=values)


def main(argv: list[str] | None = None) -> int:
    args, files = parse_command_line("lra_jax.tools.fits", __doc__, define_flags, argv,
                                     positionals=f"[FILE ...]  (compile JSONs; default {DEFAULT_GLOB}, by date)")
    paths = files or by_date(glob.glob(DEFAULT_GLOB))
    try:
        if not paths:
            raise LraError(f"no compile JSONs match {DEFAULT_GLOB} in {os.getcwd()}; run from the repository root "
                           "or name the files")
        rows = load_rows(paths)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    variants, columns = sorted(config_files()), shapes()
    matrix = DEFAULT_TARGETS.split(",")
    seen = sorted({k[2] for k in rows} - set(matrix))
    targets = [t.strip() for t in args.targets.split(",") if t.strip()] or matrix + seen
    if args.summary:
        print(summary(rows, targets, variants, columns) + "\n")
    else:
        for target in targets:
            print(table(rows, target, variants, columns) + "\n")
    print(coverage(rows, variants, columns, matrix))
    print(f"from {len(paths)} files; memory as compiled (deviceless), not measured; "
          + compile_step.DEVICELESS_GPU_MEMORY)
    return 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.fits`, `lra-fits`). A reader that stops early (`| head`)
    ends it quietly, as it ends any Unix filter, not with a BrokenPipeError traceback."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    cli()
