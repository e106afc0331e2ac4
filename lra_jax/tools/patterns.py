r"""Draws what each variant's output depends on: the map ||dy_i / dx_j|| of the real layer, one PNG per family
(the library: `lra_jax.research.reports.dependence_maps` computes the maps, `dependence_figure` draws them).

    python -m lra_jax.tools.patterns                               # every variant, n = 64: ./patterns/<family>.png
    python -m lra_jax.tools.patterns --variants=local,s4d --length=128 --seed=1 --out=/tmp/maps

Each map is the norm over the channels of the layer's Jacobian at one random input (all positions real,
deterministic), divided by its largest, on a log colour scale where exactly zero is white; a variant with a
causal form is drawn in that form too. One line per map says how many inputs each output depends on, and
for a causal form whether every later input is exactly zero. The docs page "The variants at a glance" and its
images are these maps at the defaults, written and checked by `python -m lra_jax.tools.docs`.
"""

from __future__ import annotations

import os
import sys

import jax
from absl import flags

from lra_jax.attention import registry
from lra_jax.data.tasks import default_cache_dir
from lra_jax.errors import LraError
from lra_jax.research.reports import dependence_maps as maps, dependence_figure
from lra_jax.tools import bad_input, parse_command_line


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("variants", "all", "Comma-separated variant names, or 'all'.", flag_values=values)
    flags.DEFINE_string("out", "patterns", "Directory for the PNGs, one per family.", flag_values=values)
    flags.DEFINE_integer("length", maps.LENGTH, "Positions n of each map (all real).", flag_values=values)
    flags.DEFINE_integer("seed", maps.SEED, "Seed of the layers' weights and of the random input.",
                         flag_values=values)


def use_compilation_cache() -> None:
    """JAX's persistent compilation cache, as training uses it: a second drawing of the same maps skips the
    compiles (most of the time a map takes). Set by the process's command (`cli`), not by an in-process `main`."""
    jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv: list[str] | None = None) -> int:
    args, _ = parse_command_line("lra_jax.tools.patterns", __doc__, define_flags, argv)
    names = registry.names() if args.variants == "all" else [v.strip() for v in args.variants.split(",") if v.strip()]
    low, high = maps.LENGTHS
    if not low <= args.length <= high:
        bad_input(f"--length={args.length} is outside {low}..{high}: the Jacobian has (n d)^2 entries; "
                  f"give a length in that range")
    if not names:
        bad_input("--variants names no variant; give names separated by commas, or 'all'")
    try:
        maps.check_variants(names)
        drawn = maps.panels(names, n=args.length, seed=args.seed,
                                progress=lambda panel: print(f"{panel.label}: {maps.summary(panel)}", flush=True))
        paths = dependence_figure.draw_families(drawn, args.out)
    except LraError as error:
        bad_input(str(error))
    except OSError as error:
        bad_input(f"cannot write to --out={args.out} ({error.strerror or error}); give a writable directory")
    for path in paths:
        print(f"wrote {path}")
    return 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.patterns`, `lra-patterns`), with the compilation cache."""
    use_compilation_cache()
    sys.exit(main())


if __name__ == "__main__":
    cli()
