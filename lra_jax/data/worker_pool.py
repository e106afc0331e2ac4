"""Worker processes for the data generators: fresh Python interpreters, `python -m <module> ARGS...`.

Fresh interpreters rather than multiprocessing: nothing is forked from a process that may hold
JAX's threads, and the caller's main module is neither re-imported nor required to have a
`__main__` guard. The folder holding `lra_jax/` goes first on the workers' PYTHONPATH, so they run
this copy of the code. Workers still running when the caller is done or fails (Ctrl-C included)
are killed, and every worker is reaped.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence

from lra_jax.errors import DataError

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds lra_jax/


@contextlib.contextmanager
def started(module: str, argvs: Sequence[Sequence[str]], *, capture: bool = False) -> Iterator[list[subprocess.Popen]]:
    """One worker `python -m module *argv` per argv; with `capture`, their stdout is a pipe (text)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
    workers: list[subprocess.Popen] = []
    try:
        for argv in argvs:
            workers.append(subprocess.Popen([sys.executable, "-m", module, *map(str, argv)], env=env,
                                            stdout=subprocess.PIPE if capture else None,
                                            text=capture or None))
        yield workers
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            if worker.stdout is not None:
                worker.stdout.close()
            worker.wait()


def run_all(module: str, argvs: Sequence[Sequence[str]], what: str) -> None:
    """Runs every worker to its end; DataError naming `what` if any exits with a non-zero status."""
    with started(module, argvs) as workers:
        codes = [worker.wait() for worker in workers]
    if any(codes):
        raise DataError(f"{what} workers exited with status {codes}; see their errors above")


def lines_round_robin(module: str, argvs: Sequence[Sequence[str]], count: int) -> Iterator[str]:
    """`count` stdout lines: line i is the next line of worker i % len(argvs).

    Raises RuntimeError if a worker ends before giving its line. Closing the iterator early
    kills the workers.
    """
    with started(module, argvs, capture=True) as workers:
        for i in range(count):
            worker = workers[i % len(workers)]
            line = worker.stdout.readline()
            if not line:
                raise RuntimeError(f"worker `{shlex.join(worker.args)}` exited with status {worker.wait()}")
            yield line
