r"""The docs pages generated from the registry and the committed JSON (`lra_jax.experiments.docs_pages`).

    python -m lra_jax.tools.docs            # write docs/variants.md, docs/results/*.md, docs/assets/ (the
                                            # chart the site shows), README.md's results
    python -m lra_jax.tools.docs --check    # write nothing; exit 1 naming every page or asset that differs

README.md's results table is the chart's short table (`lra_jax.experiments.readme_results`).
"""

import sys

from absl import app, flags

from lra_jax.errors import LraError
from lra_jax.experiments import docs_pages, readme_results

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("docs_dir", "docs", "The docs site's directory (mkdocs docs_dir).")
    flags.DEFINE_string("root", ".", "The repository root (experiments/results/ is read under it).")
    flags.DEFINE_bool("check", False, "Write nothing: fail when a committed page differs from its regeneration.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        readme, readme_text = readme_results.current(FLAGS.root)
        if FLAGS.check:
            stale = docs_pages.stale(FLAGS.docs_dir, FLAGS.root)
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
        for path in docs_pages.write(FLAGS.docs_dir, FLAGS.root):
            print(f"wrote {path}")
        with open(readme, "w", encoding="utf-8") as f:
            f.write(readme_text)
        print(f"wrote {readme}'s results table")
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def cli() -> None:
    """The command (`python -m lra_jax.tools.docs`)."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    cli()
