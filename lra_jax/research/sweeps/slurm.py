"""A sweep on a Slurm cluster (the library of `python -m lra_jax.tools.sweep --executor=slurm`): the runs
not finished and not already queued go to Slurm as one array job of `scripts/slurm_sweep.sbatch`, one
array task per run (`submit`); the job ids are recorded in <root>/slurm/jobs.json, and each run's state
is read from its workdir (results.json) and from Slurm's own view of its array task (`states`).

Each array task runs one train command. On SIGTERM from Slurm (the time limit's `--signal`, `scancel
--batch --signal=TERM`, a preemption) the sbatch script forwards it to the trainer, which saves a
checkpoint and exits; the script then requeues its task, and the rerun resumes from the checkpoint
(the trainer resumes exactly: the metrics end as those of an undisturbed run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable

from lra_jax.errors import LraError
from lra_jax.research.sweeps.sweep_plan import FINAL, REPO, Run

SCRIPT = os.path.join(REPO, "scripts", "slurm_sweep.sbatch")
ACTIVE = {"PENDING": "pending", "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running",
          "REQUEUED": "requeued", "REQUEUE_HOLD": "requeued", "REQUEUE_FED": "requeued",
          "SUSPENDED": "suspended", "RESIZING": "running", "SIGNALING": "running", "STAGE_OUT": "running"}

# Runs a command; returns its exit status and stdout (stderr passed through). Tests give their own.
Call = Callable[[list[str]], tuple[int, str]]


def call(command: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    except FileNotFoundError:
        raise LraError(f"{command[0]} not found: --executor=slurm runs on a Slurm login node (sbatch, "
                       "scontrol on PATH)") from None
    return done.returncode, done.stdout


@dataclasses.dataclass(frozen=True)
class Options:
    """What each array task asks of Slurm; empty or 0 leaves the cluster's default."""
    partition: str = ""
    account: str = ""
    time: str = "24:00:00"  # per run, HH:MM:SS or D-HH:MM:SS; near it Slurm sends SIGTERM (the script's --signal)
    gpus_per_run: int = 1
    cpus_per_run: int = 8
    mem: str = ""  # per run, e.g. 64G
    max_running: int = 0  # array tasks running at once (sbatch --array=...%N)

    def sbatch_flags(self, count: int, root: str) -> list[str]:
        output = os.path.join(os.path.abspath(root), "slurm", "%x-%A_%a.out")
        flags = [f"--array=1-{count}" + (f"%{self.max_running}" if self.max_running > 0 else ""),
                 f"--output={output}", f"--time={self.time}", f"--cpus-per-task={self.cpus_per_run}"]
        flags.append(f"--gres=gpu:{self.gpus_per_run}" if self.gpus_per_run > 0 else "--gres=none")  # over the script's
        flags += [f"--partition={self.partition}"] if self.partition else []
        flags += [f"--account={self.account}"] if self.account else []
        return flags + ([f"--mem={self.mem}"] if self.mem else [])


def jobs_path(root: str) -> str:
    return os.path.join(root, "slurm", "jobs.json")


def read_jobs(root: str) -> list[dict]:
    """The submissions recorded under `root`, oldest first: {"job_id", "commands", "workdirs", "submitted"}
    (array task i runs workdirs[i - 1])."""
    try:
        with open(jobs_path(root), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise LraError(f"{jobs_path(root)} cannot be read ({error}); it records the sweep's Slurm job ids: "
                       "restore it, or delete it if none of its jobs is still queued") from None


def slurm_view(job_ids: list[str], run: Call = call) -> dict[tuple[str, int], tuple[str, int]]:
    """(array job id, task id) -> (Slurm state, restarts) for the array tasks Slurm still knows of
    (`scontrol show job`; a pending range of tasks counts for each of its tasks)."""
    view = {}
    if not job_ids:
        return view
    code, out = run(["scontrol", "show", "job", "--oneliner"])
    if code != 0:
        raise LraError("scontrol show job failed: is slurmctld reachable from here? (sinfo says)")
    for line in out.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if "=" in token)
        job, tasks = fields.get("ArrayJobId"), fields.get("ArrayTaskId", "")
        if job not in job_ids or not tasks:
            continue
        state, restarts = fields.get("JobState", "UNKNOWN"), int(fields.get("Restarts", "0") or 0)
        for part in tasks.split("%")[0].split(","):
            first, _, last = part.partition("-")
            for task in range(int(first), int(last or first) + 1):
                view[(job, task)] = (state, restarts)
    return view


def states(runs: list[Run], root: str, run: Call = call) -> dict[str, tuple[str, str]]:
    """Per run name: (state, note). State: done, diverged, stale, damaged (from its workdir); else pending,
    running, requeued (from Slurm); else failed (its job left Slurm without results.json: the note
    names its log) or not submitted."""
    jobs = read_jobs(root)
    latest = {w: (job, task) for job in jobs for task, w in enumerate(job["workdirs"], 1)}
    view = slurm_view([job["job_id"] for job in jobs], run)
    found = {}
    for r in runs:
        before = r.state()
        if before in FINAL or before == "damaged":
            found[r.name] = (before, r.damage() if before == "damaged" else r.workdir)
            continue
        if r.workdir not in latest:
            found[r.name] = ("not submitted", "checkpoints to resume from" if before == "resume" else "")
            continue
        job, task = latest[r.workdir]
        where = f"job {job['job_id']}_{task}"
        state, restarts = view.get((job["job_id"], task), ("", 0))
        if state in ACTIVE:
            name = "requeued" if state == "PENDING" and restarts else ACTIVE[state]
            found[r.name] = (name, where + (f", requeued {restarts}x" if restarts else ""))
        else:
            log = os.path.join(root, "slurm", f"lra-sweep-{job['job_id']}_{task}.out")
            ended = f"{where} ended" + (f" ({state})" if state else "")
            found[r.name] = ("failed", f"{ended} without results.json; its log: {log}")
    return found


def submit(runs: list[Run], root: str, options: Options, run: Call = call) -> tuple[str | None, list[Run]]:
    """Submits the runs not final and not queued or running as one array job; returns its id (None if
    there was nothing to submit) and the runs submitted."""
    now = states(runs, root, run)
    todo = [r for r in runs if now[r.name][0] in ("not submitted", "failed")]
    if not todo:
        return None, []
    directory = os.path.join(root, "slurm")
    os.makedirs(directory, exist_ok=True)
    jobs = read_jobs(root)
    commands = os.path.join(directory, f"commands-{len(jobs) + 1}.txt")
    with open(commands, "w", encoding="utf-8") as f:
        f.writelines(shlex.join(r.command) + "\n" for r in todo)
    command = ["sbatch", "--parsable", "--job-name=lra-sweep", *options.sbatch_flags(len(todo), root),
               SCRIPT, os.path.abspath(commands)]
    code, out = run(command)
    if code != 0:
        raise LraError(f"sbatch failed (exit status {code}; its message is above): {shlex.join(command)}")
    job_id = out.strip().split(";")[0]
    jobs.append({"job_id": job_id, "commands": commands, "workdirs": [r.workdir for r in todo],
                 "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    partial = jobs_path(root) + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(jobs, f, indent=1)
    os.replace(partial, jobs_path(root))
    return job_id, todo


def status_table(runs: list[Run], found: dict[str, tuple[str, str]]) -> str:
    """One line per run (state, note) and the count per state."""
    width = max([len(r.name) for r in runs] + [3])
    lines = [f"{'run':<{width}}  {'state':<14} note"]
    lines += [f"{r.name:<{width}}  {found[r.name][0]:<14} {found[r.name][1]}" for r in runs]
    counts: dict[str, int] = {}
    for state, _ in found.values():
        counts[state] = counts.get(state, 0) + 1
    return "\n".join([*lines, ", ".join(f"{n} {state}" for state, n in counts.items())])
