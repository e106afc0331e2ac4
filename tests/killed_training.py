"""A tiny training run that kills itself with SIGKILL at a chosen point, for the fault-injection test.

    python tests/killed_training.py CACHE_DIR WORKDIR XLA_CACHE [step|eval|save N]

kills the process right after dispatching its N-th train step, during its N-th evaluation batch,
or in the middle of its N-th checkpoint save (Orbax has begun the temporary directory; the JSON
item is being written). Without a kill point it trains to the end. `config(cache_dir)` is the
run's config, shared with the test's undisturbed run.
"""

from __future__ import annotations

import os
import signal
import sys

from lra_jax.config.settings import from_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KILLS = ("step", "eval", "save")


def config(cache_dir: str):
    """tiny_config saving every 2 steps, validating every 4 and logging every 3 (mid-window saves)."""
    from helpers import tiny_config

    c = tiny_config(cache_dir)
    c.update(checkpoint_every=2, eval_every=4, log_every=3)
    return c


class _Killing:
    """Wraps a compiled step: calls it, then SIGKILLs the process on the `n`-th call (in flight)."""

    def __init__(self, step, n: int):
        self.step, self.n, self.calls = step, n, 0

    def __call__(self, *args):
        out = self.step(*args)
        self.calls += 1
        if self.calls == self.n:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    def __getattr__(self, name):  # memory_analysis() and the like
        return getattr(self.step, name)


def kill_at(where: str, n: int) -> None:
    """Installs the kill point."""
    import orbax.checkpoint as ocp

    from lra_jax.training import steps

    if where == "step":
        make = steps.make_train_step

        class Lowerable:
            def __init__(self, jitted):
                self.jitted = jitted

            def lower(self, *args):
                lowered = self.jitted.lower(*args)
                return type("Lowered", (), {"compile": lambda _: _Killing(lowered.compile(), n)})()

        steps.make_train_step = lambda *a, **k: Lowerable(make(*a, **k))
    elif where == "eval":
        make_eval = steps.make_eval_step
        steps.make_eval_step = lambda *a, **k: _Killing(make_eval(*a, **k), n)
    elif where == "save":
        handler = ocp.handlers.JsonCheckpointHandler
        save, calls = handler.async_save, []

        async def killing_save(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return await save(self, *args, **kwargs)

        handler.async_save = killing_save
    else:
        raise SystemExit(f"unknown kill point {where}; known: {', '.join(KILLS)}")


def main(argv: list[str]) -> None:
    import jax

    cache_dir, workdir, xla_cache, *kill = argv[1:]
    jax.config.update("jax_compilation_cache_dir", xla_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    if kill:
        kill_at(kill[0], int(kill[1]))
    from lra_jax.training import trainer

    trainer.train_and_evaluate(from_config(config(cache_dir)), workdir)


if __name__ == "__main__":
    main(sys.argv)
