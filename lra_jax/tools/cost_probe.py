r"""Probes what the TPU compiler's modeled step time does with loops (the library:
`lra_jax.research.compilation.modeled_loops`).

    python -m lra_jax.tools.cost_probe --target=tpu-v5e:2x2 --out=experiments/results/cost-probe-tpu-v5e.json
    python -m lra_jax.tools.docs      # rewrites docs/tpu-modeled-time.md from that JSON and the compile JSONs

compiles L products of 4096 x 4096 float32 matrices unrolled and scanned for one compile-only device of
--target (needs libtpu: the `[tpu]` extra; runs on a CPU, about a minute) and writes their modeled times,
XLA's counts and rooflines to --out. The page that explains them, docs/tpu-modeled-time.md, is one of the
generated docs pages (`lra_jax.research.reports.modeled_time_doc`).
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import jax
from absl import flags

from lra_jax.errors import LraError
from lra_jax.research.compilation import compile_matrix, modeled_loops
from lra_jax.measure import accelerators
from lra_jax.provenance import source_commit
from lra_jax.tools import command_arguments, parse_command_line


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("target", "tpu-v5e:2x2", "TPU compile target (`lra_jax.measure.accelerators`).",
                        flag_values=values)
    flags.DEFINE_string("out", "experiments/results/cost-probe-tpu-v5e.json", "The probe's JSON.", flag_values=values)
    flags.DEFINE_integer("size", modeled_loops.SIZE, "The matrices' size n.", flag_values=values)


def run_probe(args: flags.FlagValues, argv: list[str]) -> None:
    """Compiles the probe for --target and writes --out; `argv`, the command's arguments, is recorded."""
    if "JAX_PLATFORMS" not in os.environ:
        jax.config.update("jax_platforms", "cpu")
    target = accelerators.get(args.target)
    if target.platform != "tpu":
        raise LraError(f"--target={args.target}: only TPU targets have a modeled step time")
    commit = source_commit()  # the code the probe compiles with, as it starts
    results = modeled_loops.probe(target, size=args.size, log=lambda line: print(line, file=sys.stderr, flush=True))
    provenance = {"command": "python -m lra_jax.tools.cost_probe " + " ".join(argv),
                  "commit": commit, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "versions": compile_matrix.versions()}
    document = modeled_loops.document(target.name, results, args.size, provenance)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    print(modeled_loops.format_pairs(document["pairs"]))
    print(f"wrote {args.out}; docs/tpu-modeled-time.md reads it: run `python -m lra_jax.tools.docs`")


def main(argv: list[str] | None = None) -> int:
    argv = command_arguments(argv)
    args, _ = parse_command_line("lra_jax.tools.cost_probe", __doc__, define_flags, argv)
    try:
        run_probe(args, argv)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.cost_probe`, `lra-cost-probe`)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
