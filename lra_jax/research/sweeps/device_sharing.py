"""How many runs should share one device: N processes run the same train step at once, and their summed
throughput is compared across N (`probe`). The full-lra stage shares a device among the N recorded best.

    python -m lra_jax.tools.full_scale --probe_runs_per_device=1,2,4,8   # writes <root>/runs-per-device.json

Each process (`python -m lra_jax.research.sweeps.device_sharing ...`, `worker`) compiles the config's train step
on random tokens of its shape (`measure.step_timing`; no data is read) and runs `warmup` steps, says it is
ready, and waits until every process is; then all run `steps` steps at once and each times its own, so that
the timed windows overlap. Throughput at N is N x steps over the time the slowest took. The processes sit in the
slots of `device_slots` (on a GPU each preallocates 0.9/N of the memory; on a CPU they share its first
core). `best` is the smallest N within `WITHIN` of the highest throughput: more runs at once cost memory
and time per run, so they must buy throughput.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax

from lra_jax import provenance
from lra_jax.config import paths as config_paths
from lra_jax.config import settings as config_settings
from lra_jax.data import tasks
from lra_jax.errors import LraError
from lra_jax.research.sweeps import device_slots, sweep_plan
from lra_jax.measure import step_timing
from lra_jax.training import distributed

RECORD = "runs-per-device.json"
WITHIN = 0.03
READY_SECONDS = 600  # how long the processes may take to start and compile before the probe gives up


def best(totals: dict[int, float]) -> int:
    """The smallest N whose steps/s in all is within `WITHIN` of the highest."""
    top = max(totals.values())
    return min(n for n, total in totals.items() if total >= (1 - WITHIN) * top)


def _launch(command: list[str], slot: device_slots.Slot) -> subprocess.Popen:
    """Starts `command` on the slot's devices (on a CPU, with the slot's cores as its affinity)."""
    previous = os.sched_getaffinity(0)
    try:
        slot.pin()  # the child inherits this thread's CPU mask
        return subprocess.Popen(command, env={**os.environ, **slot.env}, cwd=config_paths.REPO_ROOT)
    finally:
        os.sched_setaffinity(0, previous)


def share(config_args: list[str], count: int, steps: int, warmup: int, kind: str = "auto") -> dict[str, Any]:
    """`count` processes timing `steps` steps of the config at once: each one's steps/s and their sum."""
    slots = device_slots.slots(kind, parallel=count, per_run=1, runs_per_device=count)
    with tempfile.TemporaryDirectory(prefix="device-sharing-") as folder:
        outs = [os.path.join(folder, f"{i}.json") for i in range(count)]
        workers = [_launch([sys.executable, "-m", __name__, folder, out, str(steps), str(warmup), *config_args], slot)
                   for out, slot in zip(outs, slots)]
        try:
            deadline = time.monotonic() + READY_SECONDS
            while sum(os.path.exists(f"{out}.ready") for out in outs) < count:
                failed = [w.args for w in workers if w.poll() not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise LraError(f"the probe's processes at {count} per device did not all get ready "
                                   f"({'a process failed: see its error above' if failed else 'timed out'})")
                time.sleep(0.05)
            open(os.path.join(folder, "go"), "w").close()
            codes = [w.wait() for w in workers]
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
        if any(codes):
            raise LraError(f"the probe's processes at {count} per device exited with {codes}; see their errors above")
        runs = []
        for out in outs:
            with open(out, encoding="utf-8") as f:
                runs.append(json.load(f))
    # all start at once: N x steps over the time until the last is done (a sum of each one's own rate would
    # count the seconds in which an early finisher left the device to the others twice)
    return {"steps_per_second": count * steps / max(r["seconds"] for r in runs), "per_run": runs,
            "slots": [s.label for s in slots]}


def probe(config_args: list[str], counts: list[int], steps: int, warmup: int, kind: str = "auto",
          log=print) -> dict[str, Any]:
    """`share` at each count; the record, with `best`."""
    if not counts or min(counts) < 1:
        raise LraError(f"--probe_runs_per_device={','.join(map(str, counts))}: give counts of 1 or more")
    results = {}
    for count in counts:
        results[count] = share(config_args, count, steps, warmup, kind)
        each = ", ".join(f"{r['steps_per_second']:.2f}" for r in results[count]["per_run"])
        log(f"{count} run(s) per device: {results[count]['steps_per_second']:.2f} steps/s in all ({each})")
    chosen = best({n: r["steps_per_second"] for n, r in results.items()})
    first = results[counts[0]]["per_run"][0]
    return {"what": f"train steps per second of {' '.join(config_args)} on random tokens, N processes at once on "
                    f"one device, N x {steps} steps (each after {warmup} untimed) over the time the slowest took",
            "rule": f"best: the smallest N within {WITHIN:.0%} of the highest steps/s in all",
            "device": first["device"], "counts": {str(n): r for n, r in results.items()}, "best": chosen,
            "commit": provenance.source_commit(), "date": datetime.date.today().isoformat()}


def read_best(root: str) -> int | None:
    """The recorded best N under `root`, None without a record."""
    path = os.path.join(root, RECORD)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["best"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LraError(f"{path} is damaged ({type(error).__name__}: {error}); delete it or probe again") from None


def worker(folder: str, out: str, steps: int, warmup: int, config_args: list[str]) -> None:
    """One process of `share`: compile and warm up, say ready, wait for the others, time `steps` steps."""
    config = config_settings.from_config(sweep_plan.train_config(config_args))
    timing = step_timing.time_train_step(config, tasks.get_task(config.task), distributed.make_mesh(), warmup=warmup,
                                         steps=1)
    open(f"{out}.ready", "w").close()
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.01)
    start = time.perf_counter()
    for _ in range(steps):
        state, _ = timing["run_step"]()
    jax.block_until_ready(state)
    seconds = time.perf_counter() - start
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"steps_per_second": steps / seconds, "seconds": seconds, "device": jax.devices()[0].device_kind,
                   "peak_memory_bytes": timing["peak_memory_bytes"], "peak_memory_source": timing["peak_memory_source"]},
                  f)


if __name__ == "__main__":  # python -m lra_jax.research.sweeps.device_sharing FOLDER OUT STEPS WARMUP --config=... [overrides]
    worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
