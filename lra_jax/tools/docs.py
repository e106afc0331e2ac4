r"""The docs pages generated from the registry and the committed JSON (`lra_jax.experiments.docs_pages`).

    python -m lra_jax.tools.docs            # write docs/variants.md, docs/results/*.md, docs/assets/ (the
                                            # chart the site shows), README.md's results
    python -m lra_jax.tools.docs --check    # write nothing; exit 1 naming every page or asset that differs

README.md's results table is the chart's short table (`lra_jax.experiments.readme_results`).
"""

import sys

from absl import flags

from lra_jax.errors import LraError
from lra_jax.experiments import docs_pages, readme_results
from lra_jax.tools import parse_command_line


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("docs_dir", "docs", "The docs site's directory (mkdocs docs_dir).", flag_values=values)
    flags.DEFINE_string("root", ".", "The repository root (experiments/results/ is read under it).", flag_values=values)
    flags.DEFINE_bool("check", False, "Write nothing: fail when a committed page differs from its regeneration.",
                      flag_values=values)


def main(argv: list[str] | None = None) -> None:
    args, _ = parse_command_line("lra_jax.tools.docs", __doc__, define_flags, argv)
    try:
        readme, readme_text = readme_results.current(args.root)
        if args.check:
            stale = docs_pages.stale(args.docs_dir, args.root)
            with open(readme, encoding="utf-8") as f:
                stale += [readme] if f.read() != readme_text else []
            for path in stale:
                print(f"error: {path} differs from what `python -m lra_jax.tools.docs` generates from the "
                      "code, the committed JSON and the chart (edited by hand, or its source changed); run it and commit",
                      file=sys.stderr)
            if stale:
                sys.exit(1)
            print("the generated docs pages are up to date")
            return
        for path in docs_pages.write(args.docs_dir, args.root):
            print(f"wrote {path}")
        with open(readme, "w", encoding="utf-8") as f:
            f.write(readme_text)
        print(f"wrote {readme}'s results table")
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def cli() -> None:
    """The command (`python -m lra_jax.tools.docs`)."""
    main()


if __name__ == "__main__":
    cli()
