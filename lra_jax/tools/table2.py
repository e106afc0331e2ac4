"""Prints the LRA paper's Table 2 as compiled for its hardware, from a compile JSON (the library:
`lra_jax.research.compilation.table2_report`).

    python -m lra_jax.tools.table2 experiments/results/table2-tpu-v3-4x4.json   # the table again, from the JSON
"""

from __future__ import annotations

import sys

from absl import flags

from lra_jax.errors import LraError
from lra_jax.research.compilation.table2_report import (
    dropout_cost,
    format_dropout_cost,
    format_table,
    paper_figures,
    read_rows,
    relative,
)
from lra_jax.tools import parse_command_line


USAGE = ("usage: python -m lra_jax.tools.table2 <compile JSON made with --lengths>\n"
         "       python -m lra_jax.tools.table2 <the same without dropout> <with dropout>   (dropout's modeled cost)")


def define_flags(values: flags.FlagValues) -> None:
    """No flags of its own: the compile JSONs are positionals (`parse_command_line` still gives --help)."""
    del values


def main(argv: list[str] | None = None) -> int:
    """Prints the table of a compile JSON of this protocol, or with two (compiled with
    `--dropout_rate=0 --attention_dropout_rate=0`, then with the configs' 0.1) dropout's modeled cost;
    exit 2 on a file that is not one."""
    _, paths = parse_command_line("lra_jax.tools.table2", __doc__, define_flags, argv,
                                  positionals="JSON [JSON_WITH_DROPOUT]")
    if len(paths) not in (1, 2):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        tables = [read_rows(path) for path in paths]
        if len(tables) == 1:
            print(format_table(relative(tables[0]), paper_figures()))
        else:
            print(format_dropout_cost(dropout_cost(*tables)))
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.table2`, `lra-table2`)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
