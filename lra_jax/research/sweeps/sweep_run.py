"""Running a sweep's training runs (the library of `python -m lra_jax.tools.sweep`): each run's train
command in a process of its own, one per device slot at a time (`run_sweep`), SIGINT/SIGTERM forwarded
to every running child so that it checkpoints (`Stop`), and one summary row per run (finished,
failed, crashed with its last lines, diverged, stale, damaged, stopped by the sweep, interrupted from outside it).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from lra_jax.errors import INTERRUPTED
from lra_jax.research.sweeps import device_slots
from lra_jax.research.progress import print_now
from lra_jax.research.sweeps.sweep_plan import FINAL, REPO, Run


class Stop:
    """SIGINT/SIGTERM, or a time box (`after`) -> forward SIGTERM to every running child (each checkpoints)
    and stop the sweep."""

    def __init__(self):
        self.requested = False
        self.children: set[subprocess.Popen] = set()
        self.previous = {}
        self.timer: threading.Timer | None = None

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.request(signal.Signals(signum).name)

    def request(self, why: str) -> None:
        """Stops the sweep as a signal does; `why` is said."""
        self.requested = True
        print(f"\nsweep: {why}: asking the {len(self.children)} running run(s) to checkpoint and stop...",
              file=sys.stderr, flush=True)
        for child in list(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def after(self, seconds: float) -> None:
        """A time box: `request` in `seconds` from now."""
        self.timer = threading.Timer(seconds, self.request, args=(f"the time box of {seconds:.0f} s is over",))
        self.timer.daemon = True
        self.timer.start()

    def __exit__(self, *exc):
        if self.timer is not None:
            self.timer.cancel()
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# The rows of runs that ended without a result and make the sweep's exit status 1 (a damaged one has a
# results.json its records do not back: `run_result`).
UNFINISHED = ("failed", "crashed", "interrupted", "damaged")
# A runner returns the exit status, or (exit status, the last lines of the run's output).
Runner = Callable[[list[str], str, device_slots.Slot | None], "int | tuple[int, str]"]
TAIL_BYTES = 4096  # of a run's output kept for its summary row
TAIL_LINES = 5


def last_lines(text: str, count: int = TAIL_LINES) -> str:
    """The last `count` non-empty lines of `text`, progress-bar redraws (carriage returns) split too."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _pump(source, sink, tail: bytearray) -> None:
    """Copies `source` to `sink` as it comes, keeping its last TAIL_BYTES in `tail`."""
    while chunk := os.read(source.fileno(), 65536):
        if hasattr(sink, "buffer"):
            sink.buffer.write(chunk)
        else:  # a text stream without bytes underneath (a test's capture)
            sink.write(chunk.decode("utf-8", errors="replace"))
        sink.flush()
        tail += chunk
        del tail[:-TAIL_BYTES]


def subprocess_runner(stop: Stop, log_to_workdir: bool = False) -> Runner:
    """Runs a command in its own session (a terminal Ctrl-C reaches only the sweep, which forwards it),
    on its slot's devices; with `log_to_workdir`, its output goes to <workdir>/train.log. Returns the
    exit status and the last lines of the run's stderr (of train.log with `log_to_workdir`)."""

    def run(command: list[str], cwd: str, slot: device_slots.Slot | None = None) -> tuple[int, str]:
        env = {**os.environ, **slot.env} if slot else None
        log, log_path = None, None
        if log_to_workdir:
            workdir = os.path.join(cwd, next(a.split("=", 1)[1] for a in command if a.startswith("--workdir=")))
            os.makedirs(workdir, exist_ok=True)
            log_path = os.path.join(workdir, "train.log")
            log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115
        tail = bytearray()
        try:
            child = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, stdout=log,
                                     stderr=subprocess.STDOUT if log else subprocess.PIPE)
            stop.children.add(child)
            if stop.requested:  # asked while this child was starting: it never got the signal
                child.send_signal(signal.SIGTERM)
            pump = None
            if log is None:
                pump = threading.Thread(target=_pump, args=(child.stderr, sys.stderr, tail), daemon=True)
                pump.start()
            try:
                code = child.wait()
            finally:
                stop.children.discard(child)
            if pump is not None:
                pump.join()
                child.stderr.close()
        finally:
            if log:
                log.close()
        if log_path:
            with open(log_path, "rb") as f:
                f.seek(max(os.path.getsize(log_path) - TAIL_BYTES, 0))
                tail = bytearray(f.read())
        return code, last_lines(tail.decode("utf-8", errors="replace"))

    return run


def crash_cause(code: int) -> str | None:
    """'killed by SIGKILL (out of memory?)' for an exit status that is a signal's; None otherwise
    (a negative status is Popen's signal number, 128 + n a shell's)."""
    number = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if number is None:
        return None
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"killed by {name}" + (" (out of memory?)" if number == signal.SIGKILL else "")


def _final_row(r: Run, before: str) -> dict | None:
    """The summary row of a run that is not trained again (done, diverged, stale, damaged); None otherwise."""
    row = {"run": r.name, "before": before, "status": "skipped", "seconds": 0.0, "workdir": r.workdir}
    if before == "damaged":  # the trainer would refuse it too: the user decides what to delete
        row["status"], row["error"] = "damaged", r.damage()
        return row
    if before == "diverged":
        row["status"], row["error"] = "diverged", r.divergence()
    elif before == "stale":
        row["status"] = "stale"
        row["error"] = (f"finished with another config ({', '.join(r.changes())} differ); "
                        f"delete {r.workdir} to train it with the current one")
    return row if before in FINAL else None


def _train(r: Run, before: str, runner: Runner, slot, stop: Stop | None, cwd: str) -> dict:
    """Trains one run; its summary row."""
    row = {"run": r.name, "before": before, "status": "failed", "seconds": 0.0, "workdir": r.workdir}
    start = time.perf_counter()
    tail = ""
    try:
        code = runner(r.command, cwd, slot)
        if isinstance(code, tuple):
            code, tail = code
    except OSError as error:
        code, row["error"] = -1, str(error)
    row["seconds"] = time.perf_counter() - start
    row["exit_code"] = code
    if tail:
        row["last_lines"] = tail
    after = r.state()
    crashed = crash_cause(code)
    if after == "done":
        row["status"] = "finished"
    elif after == "damaged":
        row["status"], row["error"] = "damaged", r.damage()
    elif after == "diverged":
        row["status"], row["error"] = "diverged", r.divergence()
    elif after == "stale":  # trained by code newer than this sweep's: its results stand
        row["status"] = "stale"
        row["error"] = (f"finished, with a config that differs from the one this sweep planned "
                        f"({', '.join(r.changes())} differ): was the code changed while the sweep ran? "
                        f"A new sweep judges it against the code of now")
    elif stop is not None and stop.requested:
        row["status"] = "stopped"
    elif code == INTERRUPTED:  # a signal from outside the sweep; the trainer saved the step in flight
        row["status"] = "interrupted"
        row["error"] = "stopped by a signal from outside the sweep, its checkpoint saved; run the sweep again to resume it"
    elif crashed:
        row["status"] = "crashed"
        row["error"] = (f"{crashed}; run the sweep again to resume it from its checkpoint"
                        + (f"; its last lines: {' | '.join(tail.splitlines())}" if tail else ""))
    else:
        row.setdefault("error", f"exit status {code}" + (" without results.json" if code == 0 else "")
                       + (f"; its last lines: {' | '.join(tail.splitlines())}" if tail else ""))
    return row


def run_sweep(runs: list[Run] | Callable[[], list[Run]], runner: Runner, stop: Stop | None = None,
              log: Callable[[str], None] = print_now, cwd: str = REPO,
              slots: list[device_slots.Slot | None] = (None,)) -> list[dict]:
    """Trains the unfinished runs, one per slot at a time; returns one summary row per run.

    `runs` may be a function giving the runs to do now (the protocol's plan, which grows as first
    stages finish): a free slot takes the next unstarted run of its latest answer."""
    current = runs if callable(runs) else (lambda: runs)
    printing = threading.Lock()

    def say(line: str) -> None:
        with printing:  # one slot's lines never break into another's
            log(line)

    rows: dict[str, dict] = {}
    started: set[str] = set()
    in_flight = [0]
    changed = threading.Condition()

    def next_run():
        for r in current():
            if r.name in started:
                continue
            started.add(r.name)
            before = r.state()
            row = _final_row(r, before)
            if row is None:
                return r, before
            rows[r.name] = row
            say(f"{r.name}: " + (row.get("error") or "done, skipped"))
        return None, None

    def work(slot):
        if slot is not None:
            slot.pin()  # this thread's CPU mask, which the runs it starts inherit
        while True:
            with changed:
                while True:
                    if stop is not None and stop.requested:
                        return
                    r, before = next_run()
                    if r is not None or in_flight[0] == 0:
                        break
                    changed.wait()  # a running first stage may release second-stage runs
                if r is None:
                    changed.notify_all()
                    return
                in_flight[0] += 1
            where = f" on {slot.label}" if slot is not None else ""
            say(f"{r.name}: {'resuming' if before == 'resume' else 'starting'}{where}\n  " + shlex.join(r.command))
            row = _train(r, before, runner, slot, stop, cwd)
            say(f"{r.name}: {row['status']} ({row['seconds']:.0f} s)"
                + (f": {row['error']}" if row["status"] in UNFINISHED + ("diverged",) else ""))
            with changed:
                rows[r.name] = row
                in_flight[0] -= 1
                changed.notify_all()

    workers = [threading.Thread(target=work, args=(slot,), daemon=True) for slot in slots]
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):  # joined with a timeout so that signals reach the handler
        for w in workers:
            w.join(0.2)
    return [rows.get(r.name) or {"run": r.name, "before": r.state(), "status": "not started", "seconds": 0.0,
                                 "workdir": r.workdir} for r in current()]
