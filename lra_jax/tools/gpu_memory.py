r"""Writes the table of GPU memory compiled without a GPU against measured on one, from committed JSONs
(the library: `lra_jax.research.reports.gpu_memory_report`).

    python -m lra_jax.tools.gpu_memory --doc=docs/gpu-memory.md

--deviceless: Table 2 compile JSONs for GPU targets (`compile --targets=h100 --lengths=4096 --impl=xla`);
--measured: bench JSONs made on GPUs. Both take comma-separated glob patterns. Without --doc the table is printed.
"""

from __future__ import annotations

import glob
import os
import sys

from absl import flags

from lra_jax.errors import LraError
from lra_jax.research.reports import gpu_memory_report
from lra_jax.tools import parse_command_line


DEVICELESS = "experiments/results/table2-h*.json"
MEASURED = "experiments/results/bench-h100-*.json,experiments/results/bench-h200-*.json"


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("deviceless", DEVICELESS, "Table 2 compile JSONs of GPU targets (globs, comma-separated).",
                        flag_values=values)
    flags.DEFINE_string("measured", MEASURED, "Bench JSONs made on GPUs (globs, comma-separated).", flag_values=values)
    flags.DEFINE_string("doc", None, "Write the page here (else print the table).", flag_values=values)


def expand(patterns: str, what: str) -> list[str]:
    """The files the comma-separated globs name, sorted; LraError when a pattern names none."""
    paths = []
    for pattern in filter(None, patterns.split(",")):
        found = sorted(glob.glob(pattern))
        if not found:
            raise LraError(f"--{what}={pattern} names no file")
        paths += found
    return paths


def command(args: flags.FlagValues) -> str:
    """The command that writes the page, with the flags given that are not their defaults."""
    flags_given = [f"--{name}={getattr(args, name)}" for name, default in
                   (("deviceless", DEVICELESS), ("measured", MEASURED), ("doc", None)) if getattr(args, name) != default]
    return " ".join(["python -m lra_jax.tools.gpu_memory", *flags_given])


def main(argv: list[str] | None = None) -> int:
    args, _ = parse_command_line("lra_jax.tools.gpu_memory", __doc__, define_flags, argv)
    try:
        deviceless = [c for p in expand(args.deviceless, "deviceless") for c in gpu_memory_report.deviceless_cells(p)]
        measured = [c for p in expand(args.measured, "measured") for c in gpu_memory_report.measured_cells(p)]
        pairs = gpu_memory_report.pair(deviceless, measured)
        if not pairs:
            raise LraError("no deviceless cell has a measured twin (same variant, length, batch, dropout, XLA attention)")
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.doc:
        os.makedirs(os.path.dirname(args.doc) or ".", exist_ok=True)
        with open(args.doc, "w", encoding="utf-8") as f:
            f.write(gpu_memory_report.format_page(pairs, deviceless, measured, command(args)))
    else:
        print(gpu_memory_report.format_table(pairs))
    return 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.gpu_memory`, `lra-gpu-memory`)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
