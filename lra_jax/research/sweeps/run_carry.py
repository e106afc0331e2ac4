"""Runs that outlive one machine: an unfinished run's record and newest checkpoint, packed small enough to be
committed, and unpacked on the next machine, where the same training command resumes it exactly.

    names, left = pack(root, workdirs, "carried.tar.gz")   # what fits, and why the others do not
    restored = unpack(root, "carried.tar.gz")               # back into the run directories under root

A run travels when its newest checkpoint is small: at most `RUN_LIMIT_BYTES` (Pathfinder's model, 4 layers
of width 32, is well under a megabyte with its optimizer state), and all of them together at most
`TOTAL_LIMIT_BYTES`, so the file fits what one device call may bring back. Packed per run, named relative
to the root:

    <run>/config.json, <run>/metrics.jsonl     the run's identity and its log so far
    <run>/checkpoints/last/<newest step>/...   the state it resumes from (older saves stay behind)
    <run>/checkpoints/best/...                 the best validation state, which the test score uses at the end

and a manifest, `carried.json`, naming each run with its step. The trainer resumes from these as from its
own checkpoints (bit-exact with Orbax; the data order comes from the seed and the step), so a run that moved
ends as one that never did. `unpack` restores a run only where the directory has no checkpoints and no
results.json of its own: on a machine that still holds newer state, that state wins.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time

from lra_jax.errors import LraError
from lra_jax.training import checkpointing

MANIFEST = "carried.json"
RUN_LIMIT_BYTES = 4 << 20
TOTAL_LIMIT_BYTES = 12 << 20
RECORD_FILES = ("config.json", "metrics.jsonl")


def _steps(directory: str) -> list[int]:
    """The whole checkpoints (directories named by their step) in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def _files(directory: str) -> list[str]:
    return sorted(os.path.join(parent, n) for parent, _, names in os.walk(directory) for n in names)


def travelling_files(workdir: str) -> tuple[int, list[str]]:
    """(newest last step, the files that carry the run); (None, []) when it has no whole checkpoint."""
    checkpoints = os.path.join(workdir, "checkpoints")
    last = _steps(os.path.join(checkpoints, "last"))
    if not last:
        return None, []
    files = [os.path.join(workdir, n) for n in RECORD_FILES if os.path.exists(os.path.join(workdir, n))]
    files += _files(os.path.join(checkpoints, "last", str(last[-1])))
    best = _steps(os.path.join(checkpoints, "best"))
    if best:
        files += _files(os.path.join(checkpoints, "best", str(best[-1])))
    return last[-1], files


def pack(root: str, workdirs: list[str], dest: str) -> tuple[list[str], list[str]]:
    """Writes `dest` (tar.gz) with the runs of `workdirs` (under `root`) that travel, in order, within the
    limits, and their manifest; returns (the runs packed, one line per run left out and why). The file is
    written even when no run travels, so that it replaces an older one."""
    carried, left, total = [], [], 0
    manifest = {"what": "unfinished runs with their newest checkpoint; the stage unpacks them where it runs "
                        "(lra_jax.research.sweeps.run_carry)", "runs": {}}
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with tarfile.open(f"{dest}.tmp", "w:gz") as tar:
        for workdir in workdirs:
            run = os.path.relpath(workdir, root)
            step, files = travelling_files(workdir)
            size = sum(os.path.getsize(f) for f in files)
            if step is None:
                left.append(f"{run}: no checkpoint yet; it starts again")
                continue
            if size > RUN_LIMIT_BYTES:
                left.append(f"{run}: its checkpoint ({checkpointing.megabytes(size)}) is over the "
                            f"{checkpointing.megabytes(RUN_LIMIT_BYTES)} a run may carry; it resumes only on this machine")
                continue
            if total + size > TOTAL_LIMIT_BYTES:
                left.append(f"{run}: the carried runs already fill {checkpointing.megabytes(total)}; "
                            "it resumes only on this machine")
                continue
            for path in files:
                tar.add(path, arcname=os.path.relpath(path, root), recursive=False)
            total += size
            carried.append(run)
            manifest["runs"][run] = {"step": step, "bytes": size}
        blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(blob), int(time.time())
        tar.addfile(info, io.BytesIO(blob))
    os.replace(f"{dest}.tmp", dest)
    return carried, left


def _safe(name: str, run: str) -> bool:
    parts = name.split("/")
    return not os.path.isabs(name) and ".." not in parts and name.startswith(run + "/")


def unpack(root: str, source: str) -> list[str]:
    """Restores the runs packed in `source` under `root`, each where its directory has neither checkpoints
    nor results.json; returns '<run> at step <k>' for each run restored. A damaged file is an LraError that
    names it."""
    if not os.path.exists(source):
        return []
    restored = []
    try:
        with tarfile.open(source, "r:gz") as tar:
            manifest = json.load(tar.extractfile(MANIFEST))
            members = tar.getmembers()
            for run, entry in manifest["runs"].items():
                workdir = os.path.join(root, run)
                if os.path.isdir(os.path.join(workdir, "checkpoints")) or os.path.exists(
                        os.path.join(workdir, "results.json")):
                    continue
                for member in members:
                    if not (member.isfile() and _safe(member.name, run)):
                        continue
                    path = os.path.join(root, *member.name.split("/"))
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with tar.extractfile(member) as f, open(path, "wb") as out:
                        out.write(f.read())
                restored.append(f"{run} at step {entry['step']}")
    except (OSError, tarfile.TarError, KeyError, ValueError, TypeError) as error:
        raise LraError(f"{source} cannot be unpacked ({type(error).__name__}: {error}); restore it from git "
                       "or delete it (its runs then start again)") from None
    return restored
