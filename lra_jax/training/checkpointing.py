"""Last and best checkpoints of a run, written atomically by Orbax, that survive damage and full disks.

    workdir/checkpoints/last/<step>      the newest `keep` states, for resuming, each with the metrics
                                         of the steps after the last logged one (logged on resume)
    workdir/checkpoints/best/<step>      the state with the best validation accuracy
    workdir/checkpoints/damaged/<name>   checkpoints that failed to restore, moved aside (never deleted)

Orbax writes each checkpoint to a temporary directory and renames it when complete, so a run
killed mid-write leaves the previous checkpoints intact; the temporary directory is removed when
the next run opens the checkpoints (here, before they open: Orbax's own clean-up runs in a thread
that a process exiting at once, e.g. on missing data, interrupts with a traceback). A checkpoint that fails to restore (a truncated file, a bad
copy) is reported in one line and moved aside, and the run resumes from the newest one that does.
Before each save the free space at the directory is compared with the size of the last checkpoint
plus a margin; a save that does not fit, or fails for lack of space anyway, raises `DiskFull` and
leaves no partial checkpoint behind.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from lra_jax.errors import CheckpointError, DiskFull
from lra_jax.training.run_dir import permission_denied
from lra_jax.training.train_state import TrainState

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's name for a checkpoint being written
MARGIN_BYTES = 1 << 20  # free space asked beyond a checkpoint's size: at least 1 MiB, or 10% of it
STRAGGLER_SECONDS = 120  # how long a failed save's leftover writer threads are awaited before cleaning up
STATUS = re.compile(r"\b(OUT_OF_RANGE|DATA_LOSS|NOT_FOUND|INVALID_ARGUMENT|FAILED_PRECONDITION|RESOURCE_EXHAUSTED"
                    r"|PERMISSION_DENIED|UNKNOWN|INTERNAL): [^\n\[]*")


def _on_disk(state: Any) -> Any:
    """What is written for `state`: a TrainState as its checkpoint layout (`TrainState.as_tree`, a dict),
    any other pytree as it is."""
    return state.as_tree() if isinstance(state, TrainState) else state


def _abstract(like: Any) -> Any:
    """Shapes, dtypes and shardings of `like` on disk: the target a restore fills in."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _on_disk(like))


def _typed_like(restored: Any, like: Any) -> Any:
    """A restored tree as the type of `like` (a TrainState from its dict layout)."""
    return TrainState.from_tree(restored) if isinstance(like, TrainState) else restored


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def directory_bytes(path: str) -> int:
    """Bytes in the files under `path` (0 if it does not exist)."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def megabytes(n: int) -> str:
    """'1.23 MB' (or GB), with digits enough to tell a need from what is free."""
    return f"{n / 1e6:.2f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def reason(error: BaseException) -> str:
    """One line on why a restore or save failed: the first storage status (e.g. 'OUT_OF_RANGE: Error
    reading ...') found along the exception's causes, else the first line of its message."""
    seen, chain = set(), error
    messages = []
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        messages.append(str(chain))
        chain = chain.__cause__ or chain.__context__
    for message in messages:
        found = STATUS.search(message)
        if found:
            return found.group(0).strip().rstrip(":,")[:300]
    first = next((m.strip().splitlines()[0] for m in messages if m.strip()), type(error).__name__)
    return f"{type(error).__name__}: {first[:300]}"


def out_of_space(error: BaseException) -> bool:
    """Whether `error` (or one of its causes) says the disk or quota is full."""
    chain, seen = error, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, OSError) and chain.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if re.search(r"RESOURCE_EXHAUSTED|No space left|Disk quota exceeded|ENOSPC", str(chain)):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _leftover_noise(unraisable) -> bool:
    """Whether an unraisable exception is the echo of a failed Orbax read or write: an abandoned
    read coroutine, or a TensorStore callback reaching the event loop Orbax has closed."""
    message = str(unraisable.exc_value)
    return ("Event loop is closed" in message or "Encountered error while reading" in message
            or "orbax" in repr(unraisable.object))


def _filtered(hook: Callable) -> Callable:
    def unraisablehook(unraisable):
        if not _leftover_noise(unraisable):
            hook(unraisable)

    unraisablehook.lra_jax_filter = True
    return unraisablehook


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keeps Orbax's and TensorStore's noise about a failed restore or save off the console: the
    'Exception ignored in <coroutine ...>' tracebacks of abandoned reads, the 'Event loop is
    closed' of late callbacks and its error logs. The caller reports the failure in one line.
    After a failure the filter stays, as late callbacks arrive after the call returned."""
    hook, loggers = sys.unraisablehook, [logging.getLogger(name) for name in ("absl", "orbax", "asyncio")]
    levels = [logger.level for logger in loggers]
    sys.unraisablehook = lambda unraisable: None
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    failed = True
    try:
        yield
        failed = False
    finally:
        if failed:  # only a failure abandons coroutines: finalised (and silenced) here, not later.
            gc.collect()  # A collection costs ~0.3 s in a large process: not paid on every save.
        sys.unraisablehook = _filtered(hook) if failed and not hasattr(hook, "lra_jax_filter") else hook
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _await_stragglers(running: set[threading.Thread], seconds: float = STRAGGLER_SECONDS) -> None:
    """Waits for the threads a failed save started that still run. Orbax writes a checkpoint's
    parts in threads of their own, and the save raises when the first one fails while the others
    may still be writing into the temporary directory; deleting it before they end leaves debris.
    Orbax's threads re-raise their own failure from `join` (the same full disk): that one has ended."""
    deadline = time.monotonic() + seconds
    for thread in set(threading.enumerate()) - running:
        while True:
            try:
                thread.join(max(deadline - time.monotonic(), 0))
            except RuntimeError as error:  # a thread started a moment ago is listed before it runs
                if "before it is started" in str(error) and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            except Exception:  # noqa: BLE001, S110 - the writer's own error, already reported by the save
                pass
            break


def _remove_interrupted_saves(directory: str) -> None:
    """Deletes the temporary directories of saves that never completed (`<step>.orbax-checkpoint-tmp`)
    in `directory`: process 0 deletes, every process waits for it."""
    if jax.process_index() == 0 and os.path.isdir(directory):
        for name in os.listdir(directory):
            if TMP_SUFFIX in name:
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"lra_jax removed interrupted saves in {directory}")


class Checkpoints:
    """Saves and restores a run's train state (a `TrainState`, or any pytree of arrays).

    Args:
        directory: workdir/checkpoints.
        keep: how many `last` checkpoints to keep (>= 1): an older one is the fallback when the
            newest is damaged.
        say: where the one-line reports go (a damaged checkpoint moved aside).
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 2, say: Callable[[str], None] | None = None):
        self.directory = os.path.abspath(directory)
        self.keep = max(int(keep), 1)
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        options = lambda keep: ocp.CheckpointManagerOptions(  # noqa: E731
            max_to_keep=keep, enable_async_checkpointing=False, cleanup_tmp_directories=False)
        self.last = self._open("last", options(self.keep), item_names=("state", "unlogged"))
        self.best = self._open("best", options(1))
        self._unlogged: dict[int, list[dict[str, float]]] = {}

    def _open(self, kind: str, options: ocp.CheckpointManagerOptions, **kwargs) -> ocp.CheckpointManager:
        """The manager of `directory/kind`; CheckpointError in one line when a checkpoint there is
        too damaged for Orbax to list it (it reads each step's metadata and `metrics` item)."""
        where = os.path.join(self.directory, kind)
        _remove_interrupted_saves(where)
        try:
            with quiet():
                return ocp.CheckpointManager(where, options=options, **kwargs)
        except Exception as error:  # noqa: BLE001 - name it in one line
            steps = sorted((d for d in os.listdir(where) if d.isdigit()), key=int) if os.path.isdir(where) else []
            raise CheckpointError(self._damaged_message(kind, where, ", ".join(steps) or "?", error)) from None

    def _damaged_message(self, kind: str, where: str, step: str, error: BaseException) -> str:
        if permission_denied(error):  # not damaged: nothing to delete
            return (f"the checkpoints in {where} cannot be read: permission denied ({reason(error)}); give this "
                    f"user read and write permission on {self.directory} (chmod/chown) and run the same command")
        if kind == "best":
            return (f"the best checkpoint, step {step} in {os.path.join(where, step)}, does not restore "
                    f"({reason(error)}); delete {os.path.join(where, step)} to go on (the best is then chosen among "
                    "the validations still to come), or start over with a new --workdir")
        return (f"the checkpoints in {where} (steps {step}) cannot be read ({reason(error)}); start over with a "
                f"new --workdir, or delete {self.directory} to train this workdir from step 0")

    def last_step(self) -> int | None:
        """Step of the newest checkpoint, or None."""
        return self.last.latest_step()

    # ------------------------------------------------------------------------- saving

    def save_last(self, step: int, state: Any, unlogged: list[dict[str, float]] = ()) -> None:
        """Saves `state` and `unlogged`, the per-step metrics not yet averaged into a log line."""
        if self.last.latest_step() != step:
            self._save(self.last, step, state, ocp.args.Composite(
                state=ocp.args.StandardSave(_on_disk(state)), unlogged=ocp.args.JsonSave(list(unlogged))))

    def save_best(self, step: int, state: Any, metrics: dict[str, float]) -> None:
        self._save(self.best, step, state, ocp.args.Composite(state=ocp.args.StandardSave(_on_disk(state)),
                                                              metrics=ocp.args.JsonSave(metrics)))

    def bytes_needed(self, state: Any) -> int:
        """Free space a new checkpoint asks for: the newest checkpoint's size (the state's bytes
        before there is one) plus MARGIN_BYTES or 10%, whichever is larger."""
        sizes = [directory_bytes(os.path.join(str(m.directory), str(m.latest_step())))
                 for m in (self.last, self.best) if m.latest_step() is not None]
        size = max(sizes) if sizes else sum(x.nbytes for x in jax.tree.leaves(state))
        return size + max(size // 10, MARGIN_BYTES)

    def _save(self, manager: ocp.CheckpointManager, step: int, state: Any, args: ocp.args.Composite) -> None:
        where = str(manager.directory)
        needed, free = self.bytes_needed(state), free_bytes(where)
        if free < needed:
            raise DiskFull(self._full_message(step, where, needed, free))
        existed = os.path.exists(os.path.join(where, str(step)))
        running = set(threading.enumerate())
        try:
            with quiet():
                manager.save(step, args=args)
        except Exception as error:  # noqa: BLE001 - a failed write: name a full disk, keep the rest as it was
            _await_stragglers(running)
            if jax.process_index() == 0:
                shutil.rmtree(os.path.join(where, f"{step}{TMP_SUFFIX}"), ignore_errors=True)
                if not existed:  # never leave a half-written step behind
                    shutil.rmtree(os.path.join(where, str(step)), ignore_errors=True)
            manager.reload()
            if permission_denied(error):  # the trainer names it in one line
                raise PermissionError(errno.EACCES, "Permission denied", where) from None
            if out_of_space(error):
                raise DiskFull(self._full_message(step, where, needed, free_bytes(where))) from None
            raise

    def _full_message(self, step: int, where: str, needed: int, free: int) -> str:
        last = self.last.latest_step()
        kept = f"the checkpoint of step {last} is kept" if last is not None else "no checkpoint was saved yet"
        return (f"disk full: saving step {step} in {where} needs about {megabytes(needed)}, "
                f"{megabytes(free)} free; {kept}. Free space there (or move the workdir to a larger disk) "
                "and run the same command to resume")

    # ------------------------------------------------------------------------- restoring

    def restore_last(self, like: Any) -> Any | None:
        """The newest saved state that restores (shaped like `like`), or None if there is none.

        A checkpoint that fails to restore is reported in one line and moved to `damaged/`, once an
        older one has restored; raises CheckpointError if none does (nothing is moved then)."""
        damaged = []
        for step in sorted(self.last.all_steps(), reverse=True):
            try:
                with quiet():
                    state, unlogged = self._restore_last(step, like)
            except Exception as error:  # noqa: BLE001 - any failure to read a checkpoint back: try the older one
                if permission_denied(error):  # unreadable, not damaged: moved nowhere
                    raise CheckpointError(self._damaged_message("last", str(self.last.directory), str(step),
                                                                error)) from None
                damaged.append((step, reason(error)))
                continue
            for bad, why in damaged:
                moved = self._move_aside(self.last, bad)
                self.say(f"warning: checkpoint step {bad} in {self.last.directory} does not restore ({why}); "
                         f"moved to {moved}; resuming from step {step}")
            self._unlogged = {step: unlogged}
            return state
        if damaged:
            listed = "; ".join(f"step {step}: {why}" for step, why in damaged)
            raise CheckpointError(
                f"no checkpoint in {self.last.directory} restores ({listed}); start over with a new --workdir, "
                f"or delete {self.directory} to train this workdir from step 0")
        return None

    def _restore_last(self, step: int, like: Any) -> tuple[Any, list[dict[str, float]]]:
        """(state, unlogged metrics) of `last/<step>`."""
        if self._single_item(step):
            with ocp.CheckpointManager(self.last.directory) as single:
                return _typed_like(single.restore(step, args=ocp.args.StandardRestore(_abstract(like))), like), []
        restored = self.last.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_abstract(like)), unlogged=ocp.args.JsonRestore()))
        return _typed_like(restored.state, like), list(restored.unlogged)

    def _move_aside(self, manager: ocp.CheckpointManager, step: int) -> str:
        """Moves `<manager dir>/<step>` to `damaged/<last|best>-<step>[-k]`; returns where."""
        source = os.path.join(str(manager.directory), str(step))
        base = os.path.join(self.directory, "damaged", f"{os.path.basename(str(manager.directory))}-{step}")
        target, k = base, 1
        while os.path.exists(target):
            target, k = f"{base}-{k}", k + 1
        if jax.process_index() == 0:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(source, target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"lra_jax moved {source} aside")
        manager.reload()
        return target

    def unlogged_metrics(self) -> list[dict[str, float]]:
        """The per-step metrics saved with the newest state that no log line holds yet ([] if none)."""
        step = self.last_step()
        if step is None or self._single_item(step):
            return []
        if step in self._unlogged:
            return list(self._unlogged[step])
        return list(self.last.restore(step, args=ocp.args.Composite(unlogged=ocp.args.JsonRestore())).unlogged)

    def _single_item(self, step: int) -> bool:
        """Whether `last/<step>` holds the state alone, as lra_jax wrote it before it kept unlogged metrics."""
        return os.path.isdir(os.path.join(str(self.last.directory), str(step), "default"))

    def best_metrics(self) -> dict[str, float] | None:
        """Validation metrics of the best checkpoint, or None if there is none."""
        step = self.best.latest_step()
        if step is None:
            return None
        return dict(self._restore_best(step, ocp.args.Composite(metrics=ocp.args.JsonRestore())).metrics)

    def restore_best(self, like: Any) -> Any:
        step = self.best.latest_step()
        return _typed_like(self._restore_best(step, ocp.args.Composite(
            state=ocp.args.StandardRestore(_abstract(like)))).state, like)

    def _restore_best(self, step: int, args: ocp.args.Composite) -> Any:
        """`best/<step>` restored with `args`; CheckpointError in one line if it is damaged."""
        try:
            with quiet():
                return self.best.restore(step, args=args)
        except Exception as error:  # noqa: BLE001 - name it in one line
            raise CheckpointError(self._damaged_message("best", str(self.best.directory), str(step), error)) from None

    def close(self) -> None:
        self.last.close()
        self.best.close()
