"""A run's directory: creation, writability, what it holds, the resume policy and the run records.

    workdir/config.json    the config the run was made with (a resume with another is refused)
    workdir/results.json   the record of a finished run ("complete") or a diverged one ("diverged")
    workdir/checkpoints/   `checkpointing.Checkpoints`; metrics.jsonl, tensorboard/: `metrics.MetricsWriter`
    workdir/pretrain/      the self-pretraining stage's own checkpoints/, metrics.jsonl, tensorboard/ and
                           stage.json (`training.pretrain`), when config.pretrain.objective is not "none"

Every problem with the directory itself (not a directory, not writable, another program's files)
is a WorkdirError of one line naming the path and the fix, raised before anything is built.
Checkpoints that cannot be read for lack of permission are reported as that, never as damaged.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
from typing import Any

import jax
import numpy as np

from lra_jax.config.settings import Settings
from lra_jax.config.task_defaults import OPTIONAL
from lra_jax.errors import ConfigError, LraError, TrainingDiverged

# Settings that may change between a run and its resumption; any other change is refused.
# attention.query_chunk (additive) trades speed for memory and leaves the function unchanged.
RESUMABLE_CHANGES = {"num_train_steps", "eval_every", "checkpoint_every", "log_every", "data.data_dir",
                     "data.cache_dir", "val_examples", "attention.query_chunk",
                     "attention.impl",  # a kernel computes the same function: a run may resume on another
                     "grad_accum_steps",  # the same update in another number of micro-batches
                     "keep_checkpoints"}

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


def check_config(settings: Settings, workdir: str, resuming: bool) -> None:
    """Writes config.json (process 0 only); refuses to resume a checkpointed run made with another config."""
    path = os.path.join(workdir, "config.json")
    if resuming and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            changed = config_changes(json.load(f), settings.record)
        if changed:
            raise ConfigError(
                f"workdir {workdir} holds a run made with a different config ({', '.join(changed)} differ); "
                "pass a new --workdir, or delete that one to start over"
            )
    if jax.process_index() == 0:
        write_json(path, settings.record)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two configs (as JSON), except RESUMABLE_CHANGES."""

    def flat(d: dict[str, Any], prefix: str = ""):
        for key, value in d.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    saved, current = dict(flat(saved)), dict(flat(current))
    return sorted(k for k in saved.keys() | current.keys()
                  if saved.get(k, OPTIONAL.get(k)) != current.get(k, OPTIONAL.get(k)) and k not in RESUMABLE_CHANGES)


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
