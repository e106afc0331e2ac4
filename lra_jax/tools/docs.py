r"""The docs pages generated from the registry and the committed JSON (`lra_jax.research.reports.docs_pages`).

    python -m lra_jax.tools.docs            # write docs/variants.md, docs/results/*.md,
                                            # docs/tpu-modeled-time.md, docs/assets/ (the chart the site
                                            # shows), README.md's results, docs/kernels.md's kernel table,
                                            # docs/variants-at-a-glance.md and its maps (docs/assets/patterns/)
    python -m lra_jax.tools.docs --check    # write nothing; exit 1 naming every page or asset that differs

README.md's results table is the chart's short table (`lra_jax.research.reports.readme_results`); docs/kernels.md's
table of what each kernel op runs where is generated from the ops' declarations (`lra_jax.research.reports.kernel_table`);
docs/tasks-and-data.md's table of the mini Pathfinder recipes tried is read from their runs
(`lra_jax.research.reports.recipe_search`), and so is its comparison of every variant under the earlier and the
current recipe (`lra_jax.research.reports.recipe_comparison`).
"The variants at a glance" draws every variant's dependence map (`lra_jax.research.reports.dependence_page`): about
two minutes of one core in either mode (the maps' Jacobians are computed again by `--check`), less where JAX's
compilation cache holds them.
"""

import sys

from absl import flags

from lra_jax.errors import LraError
from lra_jax.research.reports import (dependence_page, docs_pages, kernel_table, readme_results, recipe_comparison,
                                      recipe_search)
from lra_jax.tools import parse_command_line
from lra_jax.tools.patterns import use_compilation_cache


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("docs_dir", "docs", "The docs site's directory (mkdocs docs_dir).", flag_values=values)
    flags.DEFINE_string("root", ".", "The repository root (experiments/results/ is read under it).", flag_values=values)
    flags.DEFINE_bool("check", False, "Write nothing: fail when a committed page differs from its regeneration.",
                      flag_values=values)


def main(argv: list[str] | None = None) -> None:
    args, _ = parse_command_line("lra_jax.tools.docs", __doc__, define_flags, argv)
    try:
        _, tasks_page = recipe_search.current(args.root, args.docs_dir)  # two blocks on one page
        blocks = [readme_results.current(args.root), kernel_table.current(args.docs_dir),  # (path, text)
                  recipe_comparison.current(args.root, args.docs_dir, tasks_page)]
        if args.check:
            stale = docs_pages.stale(args.docs_dir, args.root) + dependence_page.stale(args.docs_dir)
            for path, text in blocks:
                with open(path, encoding="utf-8") as f:
                    stale += [path] if f.read() != text else []
            for path in stale:
                print(f"error: {path} differs from what `python -m lra_jax.tools.docs` generates from the "
                      "code, the committed JSON and the chart (edited by hand, or its source changed); run it and commit",
                      file=sys.stderr)
            if stale:
                sys.exit(1)
            print("the generated docs pages are up to date")
            return
        for path in docs_pages.write(args.docs_dir, args.root) + dependence_page.write(args.docs_dir):
            print(f"wrote {path}")
        for path, text in blocks:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {path}'s generated block")
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def cli() -> None:
    """The command (`python -m lra_jax.tools.docs`), with the compilation cache of the dependence maps."""
    use_compilation_cache()
    main()


if __name__ == "__main__":
    cli()
