"""Runs that outlive one machine: an unfinished run's record and newest checkpoint, packed small enough to be
committed, and unpacked on the next machine, where the same training command resumes it exactly.

    names, left = pack(root, workdirs, "carried.tar.gz")   # what fits, and why the others do not
    restored = unpack(root, "carried.tar.gz")               # verified, then moved into the run directories

A run travels when its newest checkpoint is small: at most `RUN_LIMIT_BYTES` (Pathfinder's model, 4 layers
of width 32, is well under a megabyte with its optimizer state), all of them together at most
`TOTAL_LIMIT_BYTES` in at most `FILE_LIMIT` files, so the file fits what one device call may bring back.
The archive's first member is the manifest, `carried.json`, naming each run with its step and each of its
files with its size and sha256; then, per run, named relative to the root:

    <run>/config.json, <run>/metrics.jsonl     the run's identity and its log so far
    <run>/checkpoints/last/<newest step>/...   the state it resumes from (older saves stay behind)
    <run>/checkpoints/best/<step>/...          the best validation state, which the test score uses at the end

The trainer resumes from these as from its own checkpoints (bit-exact with Orbax; the data order comes from
the seed and the step), so a run that moved ends as one that never did. The archive is deterministic: the
same runs give the same bytes.

`unpack` trusts nothing it has not checked. It reads the whole gzip stream (its CRC and length too), accepts
only regular files of the kinds above under run names that stay inside the root, refuses any size over the
limits before writing a byte, and streams each file in chunks into a temporary directory beside the runs.
Only when every file of the archive matches its size and hash in the manifest is a run moved into place; any
fault refuses the whole archive (one `LraError`) and writes nothing. A run is restored only where its
directory has no checkpoints and no results.json of its own: on a machine that still holds newer state,
that state wins.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib

from lra_jax.errors import LraError
from lra_jax.training import checkpointing

MANIFEST = "carried.json"
FORMAT = 2  # 2: every file's size and sha256 in the manifest, which comes first
# What one archive may hold, checked by pack and again by unpack before it writes anything.
RUN_LIMIT_BYTES = 4 << 20
TOTAL_LIMIT_BYTES = 12 << 20
FILE_LIMIT = 2000
MANIFEST_LIMIT_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20  # files are hashed and copied this much at a time
RECORD_FILES = ("config.json", "metrics.jsonl")
# A run's file, relative to its directory: a record, or a file of a checkpoint of a given step.
CARRIED_FILE = re.compile(r"(config\.json|metrics\.jsonl|checkpoints/(last|best)/(\d+)/.+)")


class Refused(ValueError):
    """An archive that is not what `pack` writes; the message says what is wrong with it."""


def _steps(directory: str) -> list[int]:
    """The whole checkpoints (directories named by their step) in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def _files(directory: str) -> list[str]:
    return sorted(os.path.join(parent, n) for parent, _, names in os.walk(directory) for n in names)


def travelling_files(workdir: str) -> tuple[int | None, list[str]]:
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


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _why_left(run: str, workdir: str, step: int | None, files: list[str], total: int, count: int) -> str | None:
    """Why the run cannot travel in an archive already holding `total` bytes in `count` files; None if it can."""
    if step is None:
        return f"{run}: no checkpoint yet; it starts again"
    if os.path.join(workdir, "config.json") not in files:
        return f"{run}: no config.json, so its identity cannot travel; it resumes only on this machine"
    odd = [f for f in files if os.path.islink(f) or not os.path.isfile(f)]
    if odd:
        return f"{run}: {os.path.relpath(odd[0], workdir)} is not a regular file; it resumes only on this machine"
    size = sum(os.path.getsize(f) for f in files)
    if size > RUN_LIMIT_BYTES:
        return (f"{run}: its checkpoint ({checkpointing.megabytes(size)}) is over the "
                f"{checkpointing.megabytes(RUN_LIMIT_BYTES)} a run may carry; it resumes only on this machine")
    if total + size > TOTAL_LIMIT_BYTES or count + len(files) > FILE_LIMIT:
        return (f"{run}: the carried runs already fill {checkpointing.megabytes(total)} in {count} files; "
                "it resumes only on this machine")
    return None


def _member(name: str, size: int) -> tarfile.TarInfo:
    """A regular file's header with nothing of the machine in it (owner, time), so that packing is repeatable."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info


def pack(root: str, workdirs: list[str], dest: str) -> tuple[list[str], list[str]]:
    """Writes `dest` (tar.gz) with the runs of `workdirs` (under `root`) that travel, in order, within the
    limits, after their manifest; returns (the runs packed, one line per run left out and why). The file is
    written even when no run travels, so that it replaces an older one."""
    runs, left, total, count = {}, [], 0, 0
    for workdir in workdirs:
        run = os.path.relpath(workdir, root).replace(os.sep, "/")
        step, files = travelling_files(workdir)
        why = _why_left(run, workdir, step, files, total, count)
        if why:
            left.append(why)
            continue
        entries = {os.path.relpath(f, workdir).replace(os.sep, "/"): {"bytes": os.path.getsize(f), "sha256": _sha256(f)}
                   for f in files}
        runs[run] = {"step": step, "bytes": sum(e["bytes"] for e in entries.values()), "files": entries}
        total, count = total + runs[run]["bytes"], count + len(files)
    manifest = {"what": "unfinished runs with their newest checkpoint; the stage verifies and unpacks them where "
                        "it runs (lra_jax.research.sweeps.run_carry)", "format": FORMAT, "runs": runs}
    blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with open(f"{dest}.tmp", "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member(MANIFEST, len(blob)), io.BytesIO(blob))
        for run, entry in runs.items():
            for name, file in entry["files"].items():
                with open(os.path.join(root, run, name), "rb") as f:
                    tar.addfile(_member(f"{run}/{name}", file["bytes"]), f)
    os.replace(f"{dest}.tmp", dest)
    return list(runs), left


def _check_run_name(run: object) -> str:
    parts = run.split("/") if isinstance(run, str) else []
    if not parts or run.startswith("/") or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise Refused(f"its manifest names a run {run!r}; a run is a relative path below the root, without "
                      "'..', '.' or empty parts")
    return run


def _check_files(run: str, entry: object) -> dict[str, dict]:
    """The run's files from its manifest entry, each of a kind `pack` writes, within the limits."""
    if not (isinstance(entry, dict) and isinstance(entry.get("step"), int) and isinstance(entry.get("files"), dict)):
        raise Refused(f"its manifest entry for {run} lacks its step or its files")
    files, step = entry["files"], entry["step"]
    for name, file in files.items():
        if not CARRIED_FILE.fullmatch(name) or any(p in ("", ".", "..") for p in name.split("/")):
            raise Refused(f"{run}/{name} is not a file a run carries (config.json, metrics.jsonl, "
                          "checkpoints/last|best/<step>/...)")
        if not (isinstance(file, dict) and isinstance(file.get("bytes"), int) and file["bytes"] >= 0
                and re.fullmatch(r"[0-9a-f]{64}", str(file.get("sha256")))):
            raise Refused(f"its manifest gives no size and sha256 for {run}/{name}")
    if "config.json" not in files or not any(n.startswith(f"checkpoints/last/{step}/") for n in files):
        raise Refused(f"{run} lacks config.json or its checkpoint of step {step}: it is not a run that can resume")
    size = sum(file["bytes"] for file in files.values())
    if size > RUN_LIMIT_BYTES:
        raise Refused(f"{run} holds {size} bytes, over the {RUN_LIMIT_BYTES} a run may carry")
    return files


def _check_manifest(manifest: object) -> dict[str, dict]:
    """run -> its manifest entry, every name, kind and limit checked; `Refused` on the first fault."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("runs"), dict):
        raise Refused(f"its manifest is not of format {FORMAT} (each file's size and sha256): it was packed by an "
                      "older version, or is not a carried-runs archive")
    runs = manifest["runs"]
    for run, entry in runs.items():
        _check_run_name(run)
        _check_files(run, entry)
        nested = [other for other in runs if other.startswith(run + "/")]
        if nested:
            raise Refused(f"its manifest names run {nested[0]} inside run {run}")
    files = [file for entry in runs.values() for file in entry["files"].values()]
    total = sum(file["bytes"] for file in files)
    if len(files) > FILE_LIMIT or total > TOTAL_LIMIT_BYTES:
        raise Refused(f"it holds {len(files)} files of {total} bytes in all, over the {FILE_LIMIT} files and "
                      f"{TOTAL_LIMIT_BYTES} bytes the carried runs may take")
    return runs


def _kind(member: tarfile.TarInfo) -> str:
    return ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else "a directory"
            if member.isdir() else "a device" if member.isdev() else "not a regular file")


def _copy_member(source, size: int, path: str) -> str:
    """Copies `size` bytes of `source` to `path`, a chunk at a time; returns their sha256."""
    digest = hashlib.sha256()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        while size > 0:
            chunk = source.read(min(CHUNK_BYTES, size))
            if not chunk:
                raise Refused(f"a member ends {size} bytes before its declared size")
            digest.update(chunk)
            out.write(chunk)
            size -= len(chunk)
    return digest.hexdigest()


def _receive(source: str, staging: str) -> dict[str, dict]:
    """Reads all of `source` into `staging`, each file checked against the manifest; returns its runs."""
    with open(source, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
        with tarfile.open(fileobj=gz, mode="r|") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isreg() or first.size > MANIFEST_LIMIT_BYTES:
                raise Refused(f"its first member is not the manifest {MANIFEST} (at most "
                              f"{checkpointing.megabytes(MANIFEST_LIMIT_BYTES)})")
            runs = _check_manifest(json.loads(tar.extractfile(first).read()))
            expected = {f"{run}/{name}": file for run, entry in runs.items() for name, file in entry["files"].items()}
            while (member := tar.next()) is not None:
                if not member.isreg():
                    raise Refused(f"{member.name} is {_kind(member)}; only regular files are carried")
                file = expected.pop(member.name, None)
                if file is None:
                    raise Refused(f"{member.name} is not a file its manifest names (or comes twice)")
                if member.size != file["bytes"]:
                    raise Refused(f"{member.name} is {member.size} bytes, its manifest says {file['bytes']}")
                digest = _copy_member(tar.extractfile(member), member.size, os.path.join(staging, member.name))
                if digest != file["sha256"]:
                    raise Refused(f"{member.name} does not match its sha256 in the manifest")
            if expected:
                raise Refused(f"{len(expected)} files its manifest names are missing, {next(iter(expected))} first")
        while gz.read(CHUNK_BYTES):  # to the end of the stream, where gzip checks its CRC and length
            pass
    return runs


def _inside(root: str, run: str) -> bool:
    """Whether the run's directory resolves (links followed) inside the root."""
    real_root = os.path.realpath(root)
    return os.path.realpath(os.path.join(root, run)).startswith(real_root + os.sep)


def _move_into_place(staged: str, workdir: str) -> None:
    """The staged run into `workdir`: one rename when the directory is new, else its record files, then its
    checkpoints (last, so that the run resumes only once whole)."""
    if not os.path.exists(workdir):
        os.makedirs(os.path.dirname(workdir), exist_ok=True)
        os.rename(staged, workdir)
        return
    for name in (*RECORD_FILES, "checkpoints"):
        if os.path.exists(os.path.join(staged, name)):
            os.replace(os.path.join(staged, name), os.path.join(workdir, name))


def unpack(root: str, source: str) -> list[str]:
    """Verifies `source` whole, then restores its runs under `root`, each where its directory has neither
    checkpoints nor results.json; returns '<run> at step <k>' for each run written. A damaged, truncated or
    foreign archive is one LraError that names it and the fault; nothing of it is then written."""
    if not os.path.exists(source):
        return []
    try:
        os.makedirs(root, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".carried-", dir=root)  # the same filesystem: moves are renames
    except OSError as error:
        raise LraError(f"the carried runs of {source} cannot be written under {root} ({error}); give this user "
                       "write permission there, or pass another root") from None
    try:
        try:
            runs = _receive(source, staging)
            outside = [run for run in runs if not _inside(root, run)]
            if outside:
                raise Refused(f"run {outside[0]} resolves outside {root} through a link")
        except Refused as error:
            raise LraError(f"{source} cannot be unpacked: {error}; nothing of it was written. Restore it from git "
                           "or delete it (its runs then start again)") from None
        except (OSError, EOFError, zlib.error, tarfile.TarError, ValueError) as error:
            raise LraError(f"{source} cannot be unpacked ({type(error).__name__}: {error}); nothing of it was "
                           "written. Restore it from git or delete it (its runs then start again)") from None
        restored = []
        for run, entry in runs.items():
            workdir = os.path.join(root, *run.split("/"))
            if os.path.isdir(os.path.join(workdir, "checkpoints")) or os.path.exists(
                    os.path.join(workdir, "results.json")):
                continue
            try:
                _move_into_place(os.path.join(staging, *run.split("/")), workdir)
            except OSError as error:
                raise LraError(f"{source}: the verified run {run} cannot be moved into {workdir} ({error}); "
                               f"the runs restored before it: {', '.join(restored) or 'none'}") from None
            restored.append(f"{run} at step {entry['step']}")
        return restored
    finally:
        shutil.rmtree(staging, ignore_errors=True)
