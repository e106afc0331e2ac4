"""Train one LRA model: `python -m lra_jax.train --config=configs/linformer.py:listops,mini`.

Flags only: the work is `trainer.train_and_evaluate(settings, workdir)`; a full-scale config on a CPU is
trained with a warning and its alternatives (`cpu_advice`). With `--estimate` it trains
nothing and prints the run's projected training time instead (`step_timing.projected_training`): a
sentence and a table, or with `--json` one JSON line (what `sweep --estimate` reads).
Overrides: `--config.model.num_layers=2 --config.attention.k=64`.

Exit status: 0 finished; 2 bad input; 3 diverged; 75 (`errors.INTERRUPTED`) stopped by SIGTERM or Ctrl-C,
the step in flight saved: the same command resumes. An interrupted run never exits 0: a signal while the
modules import, the data loads or the step compiles is one line and 75 as well (nothing was trained).
"""

from __future__ import annotations

import os
import signal
import sys

from lra_jax.errors import INTERRUPTED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stopped_while_starting(signum: int, frame) -> None:
    """A stop signal before `main` runs: nothing was started, so one line and exit at once."""
    os.write(2, f"interrupted by {signal.Signals(signum).name} while starting; nothing was done: run the same "
                "command to start\n".encode())
    os._exit(INTERRUPTED)


# Installed before the imports below, which take seconds; unblocked too, where a parent blocked them (a
# blocked signal stays pending, and a run could not be stopped cleanly).
for _signal in STOP_SIGNALS:
    signal.signal(_signal, _stopped_while_starting)
if hasattr(signal, "pthread_sigmask"):  # POSIX
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

import json  # noqa: E402 (after the handlers)

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lra_jax.config import checks as config_errors  # noqa: E402
from lra_jax.config import settings as config_settings  # noqa: E402
from lra_jax.data.tasks import default_cache_dir  # noqa: E402
from lra_jax.errors import LraError  # noqa: E402
from lra_jax.measure import cpu_advice, step_timing  # noqa: E402
from lra_jax.training import distributed, trainer  # noqa: E402

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/linformer.py:listops,mini",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, results.json); "
                    "default runs/<variant>-<task>-<scale>.")
flags.DEFINE_bool("distributed", False, "Multi-process run (TPU pod, Slurm, several processes on one machine): "
                  "join it first. The cluster is detected, or give the three flags below (or JAX_COORDINATOR_ADDRESS, "
                  "JAX_NUM_PROCESSES, JAX_PROCESS_ID).")
flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0, the same for every process; implies "
                    "--distributed.")
flags.DEFINE_integer("num_processes", None, "How many processes the run has; implies --distributed.")
flags.DEFINE_integer("process_id", None, "This process's id, 0 to num_processes - 1; implies --distributed.")
flags.DEFINE_bool("estimate", False, "Train nothing: time a few train steps on random tokens of the config's "
                  "shape (no data needed) and print the projected training time.")
flags.DEFINE_bool("json", False, "With --estimate: print the projection as one JSON line instead of a sentence "
                  "and a table.")
FLAGS = flags.FLAGS


def default_workdir(config) -> str:
    return os.path.join("runs", f"{config.attention.name}-{config.task}-{config.scale}")


def config_file() -> str:
    """The --config file as given, without its argument: 'configs/linformer.py'."""
    spec = config_flags.get_config_filename(FLAGS["config"])
    return spec if spec.endswith(".py") else spec.rsplit(":", 1)[0]


def _stop_as_ctrl_c(signum: int, frame) -> None:
    """SIGTERM before the train loop takes the signals over (`training.stop_signal`): stopped as by Ctrl-C."""
    raise KeyboardInterrupt


def main(argv: list[str]) -> None:
    del argv  # `config_errors.parse_flags` refused any argument that is not a flag
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_as_ctrl_c)
    if FLAGS.config is None:
        print("error: --config is required, e.g. --config=configs/linformer.py:listops,mini", file=sys.stderr)
        sys.exit(2)
    if FLAGS.json and not FLAGS.estimate:
        print("error: --json goes with --estimate (the projection as one JSON line); a run writes its results to "
              "<workdir>/results.json", file=sys.stderr)
        sys.exit(2)
    logging.set_verbosity(logging.WARNING)
    try:
        explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
        if FLAGS.distributed or any(value is not None for value in explicit):
            distributed.initialize(*explicit)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    workdir = FLAGS.workdir or default_workdir(FLAGS.config)
    try:
        settings = config_settings.from_config(FLAGS.config)  # read once: a bad value is one line, here
        if FLAGS.estimate:
            projection = step_timing.projected_training(settings, announce=jax.process_index() == 0)
            print(json.dumps(projection) if FLAGS.json else step_timing.projection_report(projection))
            return
        advice = cpu_advice.FullScaleOnCpu(FLAGS.config.task, FLAGS.config.scale, config_file())
        if jax.process_index() == 0:
            print(f"workdir: {workdir}")
            if advice.applies:
                print(advice.before_training(), file=sys.stderr, flush=True)
        results = trainer.train_and_evaluate(settings, workdir,
                                             on_step_time=advice.projection if advice.applies else None)
        if results is None:  # stopped; it said where
            sys.exit(INTERRUPTED)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:  # outside the train loop (data, compilation, evaluation): nothing new to save
        print("interrupted; the estimate was not finished" if FLAGS.estimate else
              f"interrupted outside a training step; nothing was lost: run the same command to go on (workdir "
              f"{workdir})", file=sys.stderr)
        sys.exit(INTERRUPTED)


def cli() -> None:
    """The command (`python -m lra_jax.train`, `lra-train`)."""
    app.run(main, flags_parser=config_errors.parse_flags)


if __name__ == "__main__":
    cli()
