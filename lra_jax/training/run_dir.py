"""A run's directory: creation, writability, what it holds, the resume policy and the run records.

    workdir/.lock          held by the process training there: a second one refuses the directory (`locked`)
    workdir/config.json    the config the run was made with (a start with another is refused)
    workdir/results.json   the record of a finished run ("complete") or a diverged one ("diverged")
    workdir/checkpoints/   `checkpointing.Checkpoints`; metrics.jsonl, tensorboard/: `metrics.MetricsWriter`
    workdir/pretrain/      the self-pretraining stage's own checkpoints/, metrics.jsonl, tensorboard/ and
                           stage.json (`training.pretrain`), when config.pretrain.objective is not "none"

Every problem with the directory itself (not a directory, not writable, another program's files)
is a WorkdirError of one line naming the path and the fix, raised before anything is built.
Checkpoints that cannot be read for lack of permission are reported as that, never as damaged.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from lra_jax.config.settings import Settings
from lra_jax.config.task_defaults import OPTIONAL
from lra_jax.errors import ConfigError, LraError, TrainingDiverged

# Settings that may change between a run and its resumption; any other change is refused.
# num_train_steps too, where the schedule never reads it (`EXTENDABLE_SCHEDULES`).
# attention.query_chunk (additive) trades speed for memory and leaves the function unchanged.
RESUMABLE_CHANGES = {"eval_every", "checkpoint_every", "log_every", "data.data_dir",
                     "data.cache_dir", "val_examples", "attention.query_chunk",
                     "attention.impl",  # a kernel computes the same function: a run may resume on another
                     "grad_accum_steps",  # the same update in another number of micro-batches
                     "keep_checkpoints"}

# LRA's rsqrt schedule (warm-up, then 1/sqrt(step)) does not depend on the number of steps, so a run extended
# to more steps is the run it would have been; a cosine schedule decays to zero at the last step, so one
# extended is another run (its rate would jump back up) and must start anew.
EXTENDABLE_SCHEDULES = ("rsqrt",)
LOCK = ".lock"

# What a run writes in its directory; train.log is the sweep's log of the run. Anything else (not
# hidden) is another program's, and the run refuses the directory rather than write among it.
RUN_FILES = {"config.json", "results.json", "metrics.jsonl", "metrics.jsonl.damaged", "checkpoints", "tensorboard",
             "train.log", "pretrain"}
PROBE = ".lra_jax-write-test"
PERMISSION_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


class WorkdirError(LraError):
    """The workdir cannot hold the run: not a directory, not writable, or another program's files."""


def prepare(workdir: str) -> None:
    """Creates `workdir` if needed and checks that the run can write there; WorkdirError (one line) if not.

    Writability is tried, not inferred from the mode bits (root passes those; a read-only mount does not)."""
    path = os.path.abspath(workdir)
    blocker = _file_on_the_way(path)
    if blocker == path:
        raise WorkdirError(f"--workdir {workdir} is a file, not a directory; pass a directory's path")
    if blocker:
        raise WorkdirError(f"--workdir {workdir} cannot be created: {blocker} is a file, not a directory; "
                           "pass a path under a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise WorkdirError(f"--workdir {workdir} cannot be created ({error.strerror}); pass a --workdir in a "
                           "directory you can write to") from None
    probe = os.path.join(path, f"{PROBE}-{socket.gethostname()}-{os.getpid()}")  # one per process of a run
    try:
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as error:
        raise WorkdirError(f"--workdir {workdir} is not writable ({error.strerror}); give this user write "
                           "permission there (chmod/chown, or remount it read-write) or pass another --workdir") \
            from None
    foreign = sorted(n for n in os.listdir(path)  # a record's .tmp, left by a kill mid-write, is the run's
                     if not n.startswith(".") and not any(n == r or n.startswith(f"{r}.") for r in RUN_FILES))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise WorkdirError(f"--workdir {workdir} holds files that are not a run's ({shown}); pass a new or "
                           "empty directory as --workdir")


def _file_on_the_way(path: str) -> str | None:
    """`path` or the nearest of its parents that exists, when that is not a directory; else None."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def permission_denied(error: BaseException) -> bool:
    """Whether `error` (or one of its causes) is a refused permission, not damage or a full disk."""
    chain, seen = error, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, OSError) and chain.errno in PERMISSION_ERRNOS:
            return True
        if any(marker in str(chain) for marker in ("PERMISSION_DENIED", "Permission denied",
                                                   "Read-only file system")):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def not_writable(workdir: str, error: BaseException) -> WorkdirError:
    """The one line for a write refused mid-run: what failed, that the checkpoints are kept, and the fix."""
    where = getattr(error, "filename", None) or workdir
    return WorkdirError(f"writing {where} was refused (permission denied); the checkpoints saved before are "
                        f"kept. Give this user write permission on {workdir} again and run the same command to "
                        "resume")


@contextlib.contextmanager
def locked(workdir: str) -> Iterator[None]:
    """Holds `workdir`'s lock while the block runs (process 0 of a run; the others share its directory).
    WorkdirError, naming the holder, when another process holds it."""
    if jax.process_index() != 0:
        yield
        return
    f = open(os.path.join(workdir, LOCK), "a+", encoding="utf-8")  # noqa: SIM115 - held across the yield
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise WorkdirError(f"--workdir {workdir} is in use by {holder}; wait for that run to end (or stop it "
                               "with SIGTERM: it saves a checkpoint), or pass another --workdir") from None
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()} since "
                f"{datetime.datetime.now().isoformat(timespec='seconds')}\n")
        f.flush()
        yield
    finally:
        f.close()  # releases the lock


def _saved_configs(workdir: str) -> dict[str, dict[str, Any]]:
    """The run's config as each record that survives holds it: {"config.json": ..., "results.json": ...}."""
    found = {}
    for name in ("config.json", "results.json"):
        path = os.path.join(workdir, name)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):  # missing, or damaged (a damaged results.json is a run to end again)
            continue
        config = record if name == "config.json" else record.get("config") if isinstance(record, dict) else None
        if isinstance(config, dict) and config:
            found[name] = config
    return found


def check_config(settings: Settings, workdir: str) -> None:
    """Refuses a workdir that holds another run, from whatever record of its config survives (config.json,
    results.json), and one whose config nothing records (its identity cannot be checked); then writes
    config.json (process 0 only)."""
    saved = _saved_configs(workdir)
    for name, config in saved.items():
        changed = config_changes(config, settings.record)
        if changed:
            steps = (" (the cosine schedule decays to zero at the last step: a run extended is another run)"
                     if "num_train_steps" in changed else "")
            raise ConfigError(f"workdir {workdir} holds a run made with a different config ({', '.join(changed)} "
                              f"differ from its {name}){steps}; pass a new --workdir, or delete that one to start "
                              "over")
    leftovers = [n for n in ("metrics.jsonl", "checkpoints", "pretrain")
                 if any(files for _, _, files in os.walk(os.path.join(workdir, n)))
                 or os.path.isfile(os.path.join(workdir, n))]
    if not saved and leftovers:
        raise ConfigError(f"workdir {workdir} holds a run's {', '.join(leftovers)} but no record of its config "
                          "(config.json and results.json are gone), so it cannot be told from another run; pass a "
                          "new --workdir, or delete that one to start over")
    if jax.process_index() == 0:
        write_json(os.path.join(workdir, "config.json"), settings.record)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two configs (as JSON), except RESUMABLE_CHANGES, and
    num_train_steps where both schedules are EXTENDABLE_SCHEDULES."""

    def flat(d: dict[str, Any], prefix: str = ""):
        for key, value in d.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    saved, current = dict(flat(saved)), dict(flat(current))
    resumable = set(RESUMABLE_CHANGES)
    if {saved.get("optimizer.schedule"), current.get("optimizer.schedule")} <= set(EXTENDABLE_SCHEDULES):
        resumable.add("num_train_steps")
    return sorted(k for k in saved.keys() | current.keys()
                  if saved.get(k, OPTIONAL.get(k)) != current.get(k, OPTIONAL.get(k)) and k not in resumable)


def write_json(path: str, content: dict) -> None:
    """Writes JSON atomically (temporary file, then rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def finished_results(path: str) -> dict[str, Any] | None:
    """The results.json of a finished run; None (with one line saying so if it exists) when it is
    missing or unreadable, e.g. truncated: the run then finishes again from its checkpoints."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        if jax.process_index() == 0:
            print(f"warning: {path} is damaged ({error}); the run's end is done again", file=sys.stderr)
        return None


def diverged_record(settings: Settings, diverged: TrainingDiverged, versions: dict[str, str]) -> dict[str, Any]:
    """results.json of a diverged run: status "diverged", where and how, and no accuracy at all,
    so that it cannot be read as a result."""
    return {
        "status": "diverged",
        "task": settings.task,
        "variant": settings.variant,
        "scale": settings.scale,
        "message": str(diverged),
        "diverged_at_step": diverged.step,
        "loss": repr(diverged.loss),  # "nan" / "inf": strict JSON has no non-finite numbers
        "grad_norm": repr(diverged.grad_norm),
        "last_checkpoint_step": diverged.last_checkpoint,
        "versions": versions,
        "config": settings.record,
    }


def results_record(settings: Settings, test: dict[str, float], best: dict[str, float], test_labels: np.ndarray,
                   steps_per_second: float | None, memory: dict[str, Any], num_parameters: int,
                   attention: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    """The contents of results.json; `versions` as read when the run (or its last resume) started."""
    device = jax.devices()[0]
    return {
        "status": "complete",
        "task": settings.task,
        "variant": settings.variant,
        "impl": settings.attention.get("impl"),
        "scale": settings.scale,
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "val_accuracy": best["accuracy"],
        "best_step": best["step"],
        "test_majority_class_rate": float(np.bincount(test_labels).max() / len(test_labels)),
        "num_train_steps": settings.num_train_steps,
        "batch_size": settings.batch_size,
        "max_len": settings.max_len,
        "steps_per_second": steps_per_second,
        "examples_per_second": steps_per_second and steps_per_second * settings.batch_size,
        **memory,
        "num_parameters": int(num_parameters),
        "attention": attention,
        "devices": {"platform": device.platform, "kind": device.device_kind, "count": jax.device_count()},
        "versions": versions,
        "config": settings.record,
    }
