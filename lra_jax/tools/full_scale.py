r"""Full-scale ListOps with the LRA paper's recipe on one GPU (the `listops-full` stage of `.ci/gpu-check`;
the library and what each step does: `lra_jax.experiments.full_scale`).

    python -m lra_jax.tools.full_scale                       # check bfloat16 (once), then train VARIANTS in order
    python -m lra_jax.tools.full_scale --pack=listops-full.tar.gz   # the finished runs, to commit
    python -m lra_jax.tools.full_scale --scale=mini --steps=4 --precision_steps=2 -- --config.batch_size=8

Runs land in <root>/listops-<scale>/<variant>/seed0 (default root experiments/full-lra), the precision
record in <root>/listops-<scale>/precision.json. `--config.*` overrides after `--` go to every run, the
check's too. SIGINT/SIGTERM: the run in progress checkpoints and stops; the same command resumes it.
Exit 0 when every run finished (or was already), 1 when one failed or crashed, 130 when stopped, 2 on
bad input.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from lra_jax.errors import LraError
from lra_jax.experiments import full_scale
from lra_jax.experiments.choices import choose
from lra_jax.experiments.progress import print_now
from lra_jax.experiments.sweep_run import Stop, subprocess_runner

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command-line flags (defined only when run as a command, so modules import side by side)."""
    flags.DEFINE_enum("scale", "full", ["full", "mini"], "full: the paper's recipe; mini: the same stage "
                      "on the mini configs (a CPU test of the stage).")
    flags.DEFINE_string("root", "experiments/full-lra", "Root of the runs (the layout the chart reads).")
    flags.DEFINE_string("scratch", "runs/full-scale-precision", "Root of the precision check's two runs "
                        "(never results: kept apart from --root).")
    flags.DEFINE_string("variants", ",".join(full_scale.VARIANTS), "The runs, in order (softmax first).")
    flags.DEFINE_integer("precision_steps", 300, "Steps of each precision-check run (float32 and bfloat16).")
    flags.DEFINE_integer("steps", 0, "Steps of each run; 0: the recipe's (5,000 at full scale). For tests.")
    flags.DEFINE_string("pack", None, "Train nothing: write this tar.gz of the finished runs and the precision "
                        "record (names relative to --root: unpack with `tar -xzf FILE -C ROOT`).")


def main(argv: list[str]) -> None:
    overrides = argv[1:]
    try:
        if FLAGS.pack:
            names = full_scale.pack(FLAGS.root, FLAGS.scale, FLAGS.pack)
            print(f"packed {len(names)} files into {FLAGS.pack}: " + (", ".join(names) or "nothing finished yet"))
            return
        variants = choose(FLAGS.variants, list(full_scale.VARIANTS), "variant")
        with Stop() as stop:
            outcome = full_scale.run_stage(FLAGS.scale, os.path.abspath(FLAGS.root), os.path.abspath(FLAGS.scratch),
                                           FLAGS.precision_steps, variants, FLAGS.steps, overrides,
                                           subprocess_runner(stop), stop, log=print_now)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if outcome == "stopped":
        print("stopped; run the same command to continue (finished runs are skipped, interrupted ones resume)")
        sys.exit(130)
    sys.exit(1 if outcome == "failed" else 0)


def cli() -> None:
    """The command (`python -m lra_jax.tools.full_scale`)."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    cli()
