"""The bench's measurements (the library of `python -m lra_jax.tools.bench`): the Table 2 config of a
variant at a length (`bench_config`), one (variant, length) cell compiled and timed (`measure`) in a
fresh process of its own (`measure_in_subprocess`: the command with `--cell`), the grid of cells
(`run`) and the JSON report saved after every cell (`benchmark`). The bench's docstring says why
every cell has its own process; `bench_report` reads and prints the reports.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax

from lra_jax import provenance
from lra_jax.config import paths as config_paths
from lra_jax.config import settings as config_settings
from lra_jax.config import task_defaults
from lra_jax.data.tasks import TaskSpec, default_cache_dir
from lra_jax.errors import ConfigError, LraError
from lra_jax.research.benchmarks.bench_report import (
    MEASURED_AFTER,
    PRECISION,
    add_relative,
    dropout_rates,
    load_for_update,
    merge_results,
    table,
)
from lra_jax.research.progress import print_now
from lra_jax.measure import device_peak, flops, host_memory, step_profile, step_timing
from lra_jax.measure.out_of_memory import OutOfMemory, is_oom
from lra_jax.measure.units import gib
from lra_jax.training import distributed, run_dir

PROTOCOL = {"num_layers": 4, "num_heads": 4, "emb_dim": 256, "mlp_dim": 1024}
VOCAB_SIZE, NUM_CLASSES = 257, 2  # Text: bytes + padding, binary sentiment

# ----------------------------------------------------------------------------- configs

def variant_attention(variant: str) -> dict[str, Any]:
    """config.attention of configs/<file>.py for `variant` at full scale, else {"name": variant}."""
    path = config_paths.variant_path(variant)
    if path is None:
        return {"name": variant}
    for arg in ("text,full", None):  # Text where the configs know it; else the default task's settings
        try:
            return config_paths.load(f"{path}:{arg}" if arg else path).attention.to_dict()
        except ValueError:
            continue
    return {"name": variant}


def bench_config(variant: str, length: int, settings: dict[str, Any], dropout_rate: float = 0.1):
    """The task defaults with the Table 2 model, `length` tokens, `variant`'s attention settings (with
    settings["impl"], "auto" where absent) and `dropout_rate` on the residuals, the MLP and the attention weights."""
    attention = {**variant_attention(variant), "impl": settings.get("impl", "auto")}
    config = task_defaults.get_config(None, attention=attention)
    config.max_len = length
    config.batch_size = settings["batch_size"]
    config.seed = settings["seed"]
    config.model.update(num_layers=settings["num_layers"], num_heads=settings["num_heads"],
                        emb_dim=settings["emb_dim"], mlp_dim=settings["mlp_dim"], dropout_rate=dropout_rate,
                        attention_dropout_rate=dropout_rate, dtype=settings["dtype"],
                        scan_layers=settings["scan_layers"], remat=settings["remat"])
    return config


# ----------------------------------------------------------------------------- one measurement
def compiled_costs(compiled) -> dict[str, float | None]:
    """XLA's cost analysis of a compiled step: flops, bytes accessed (each op's operands and outputs
    after fusion: the memory traffic were nothing cached) and transcendentals; None where the backend
    gives none."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    cost = cost or {}
    return {name: float(cost[key]) if key in cost else None
            for name, key in (("flops", "flops"), ("bytes", "bytes accessed"), ("transcendentals", "transcendentals"))}


def measure(variant: str, length: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Compiles and times the train step of `variant` at `length`; raises on failure.

    At the cell's `settings["dropout_rate"]` (default 0.1), or, where the settings give no single rate,
    at each of `settings["dropout_rates"]` in this one process, their timed steps alternating
    (`step_timing.time_train_steps`): then the result is {"by_rate": [one result per rate]}.
    Besides time and memory: the step's model FLOPs from the shapes (`lra_jax.measure.flops`, None where the
    variant declares no count), XLA's compiled count, the peak of a matmul of the step's dtype measured
    right before and right after the steps, the faster of the two (`lra_jax.measure.device_peak`: a change of
    load on a shared machine during the steps slows one of them), and the fraction of it the step reaches (the analytic
    FLOPs where counted, else XLA's, as `utilisation_flops` says), with the vendor's peak on accelerators;
    XLA's bytes accessed and transcendentals, the measured memory bandwidth and `memory_time_share`:
    the time to stream those bytes at that bandwidth over the step's time (a memory-bound step nears
    or passes 1; caches can serve part of XLA's bytes, so it may exceed 1)."""
    rates = [settings["dropout_rate"]] if "dropout_rate" in settings else dropout_rates(settings)
    configs = [config_settings.from_config(bench_config(variant, length, settings, rate)) for rate in rates]
    task = TaskSpec("text-bench", VOCAB_SIZE, NUM_CLASSES, False, load=None)
    peak_before = device_peak.measured_matmul_peak(settings["dtype"])
    try:
        timings = step_timing.time_train_steps(configs, task, distributed.make_mesh(),
                                               warmup=settings["warmup"], steps=settings["steps"])
    except ConfigError as error:  # the step's memory estimate exceeds the device's memory
        raise OutOfMemory(str(error)) from error
    stats = jax.devices()[0].memory_stats() or {}
    peak = max(peak_before, device_peak.measured_matmul_peak(settings["dtype"]))
    bandwidth = device_peak.measured_memory_bandwidth()
    vendor = device_peak.vendor_peak(jax.devices()[0].device_kind, settings["dtype"])
    entries = []
    for config, timing in zip(configs, timings):
        steps_per_second = 1 / timing["seconds_per_step"]
        model_flops = flops.train_step_flops(
            variant=variant, batch=config.batch_size, length=length + int(config.model.cls_token),
            dim=config.model.emb_dim, num_heads=config.model.num_heads, mlp_dim=config.model.mlp_dim,
            num_layers=config.model.num_layers, settings=timing["attention"])
        costs = compiled_costs(timing["compiled"])
        xla_flops = costs["flops"]
        counted = model_flops if model_flops is not None else xla_flops
        entries.append({
            "steps_per_second": steps_per_second,
            "examples_per_second": steps_per_second * config.batch_size,
            "seconds_per_step": timing["seconds_per_step"],
            "step_seconds": timing["step_seconds"],
            "compile_seconds": timing["compile_seconds"],
            "flops_per_step": xla_flops,
            "model_flops_per_step": model_flops,
            "matmul_peak_flops_per_second": peak,
            "vendor_peak_flops_per_second": vendor,
            "utilisation_flops": "model" if model_flops is not None else ("xla" if xla_flops else None),
            "utilisation": counted / timing["seconds_per_step"] / peak if counted else None,
            "utilisation_fastest_step": counted / min(timing["step_seconds"]) / peak if counted else None,
            "xla_bytes_accessed_per_step": costs["bytes"],
            "xla_transcendentals_per_step": costs["transcendentals"],
            "memory_bandwidth_bytes_per_second": bandwidth,
            # The step's time were it only streaming XLA's bytes at that bandwidth, as a share of its time.
            "memory_time_share": costs["bytes"] / bandwidth / timing["seconds_per_step"] if costs["bytes"] else None,
            "compiled_step_memory_bytes": timing["compiled_step_memory_bytes"],
            "device_peak_bytes_in_use": stats.get("peak_bytes_in_use"),  # this cell's process
            "peak_memory_bytes": timing["compiled_step_memory_bytes"] or stats.get("peak_bytes_in_use"),
            "host_max_rss_bytes": timing["host_max_rss_bytes"],
            "num_parameters": timing["num_parameters"],
            "attention": timing["attention"],  # as built: defaults and backend-derived values filled in
            "pairing": timing["pairing"],  # how the rates' steps took turns; absent: before rounds alternated
        })
    if settings.get("profile"):  # after every rate's timed steps, so the profiler slows none of them
        for entry, timing in zip(entries, timings):
            entry["profile"] = step_profile.profile(timing["compiled"], timing["run_step"])
    return entries[0] if "dropout_rate" in settings else {"by_rate": entries}

def measure_cell(variant: str, length: int, settings: dict[str, Any],
                 measure_fn: Callable[[str, int, dict[str, Any]], dict[str, Any]] = measure) -> dict[str, Any]:
    """`measure_fn`'s result with status "ok", or status "oom" / "error" and the message."""
    try:
        return {"status": "ok", **measure_fn(variant, length, settings)}
    except Exception as error:  # noqa: BLE001 - one failure must not end a long sweep
        status = "oom" if is_oom(error) else "error"
        message = str(error).strip().splitlines()[0][:500] if str(error).strip() else repr(error)
        entry = {"status": status, "error": f"{type(error).__name__}: {message}"}
        if status == "error":
            entry["traceback"] = traceback.format_exc(limit=8)
        return entry


# ----------------------------------------------------------------------------- one cell, one process

def cell_command(variant: str, length: int, settings: dict[str, Any]) -> list[str]:
    """The command that measures one cell in a fresh process; the settings travel whole, as JSON."""
    cell = json.dumps({"variant": variant, "length": length, "settings": settings})
    return [sys.executable, "-m", "lra_jax.tools.bench", f"--cell={cell}"]


def cell_environment(settings: dict[str, Any]) -> dict[str, str]:
    """This process's environment, with GLIBC_TUNABLES asking for huge pages (`settings["huge_pages"]`)
    and for freed memory to stay mapped (`settings["keep_host_memory"]`): see `lra_jax.measure.host_memory`.
    Ignored where glibc or the kernel lacks them (`device_info` records the machine's THP mode)."""
    env = dict(os.environ)
    huge, keep = bool(settings.get("huge_pages")), bool(settings.get("keep_host_memory"))
    if huge or keep:
        env["GLIBC_TUNABLES"] = host_memory.tunables(env.get("GLIBC_TUNABLES", ""), huge_pages=huge, keep_freed=keep)
    return env


def run_cell(cell_json: str) -> None:
    """The child's side: measures the cell of `--cell` and prints its result as the last line of stdout."""
    cell = json.loads(cell_json)
    jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    entry = measure_cell(cell["variant"], cell["length"], cell["settings"])
    print(json.dumps(entry, default=str), flush=True)


def _stderr_tail(stderr: str | bytes | None, lines: int = 20) -> str:
    if isinstance(stderr, bytes):  # TimeoutExpired carries bytes even for a text-mode run
        stderr = stderr.decode(errors="replace")
    return "\n".join((stderr or "").strip().splitlines()[-lines:])[-4000:]


def exit_reason(returncode: int) -> str:
    """'exit code 3', or the signal that killed the process (negative return codes)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = " (often the kernel's OOM killer: the host ran out of memory)" if name == "SIGKILL" else ""
    return f"killed by {name}{hint}"


def measure_in_subprocess(variant: str, length: int, settings: dict[str, Any],
                          timeout: float) -> dict[str, Any]:
    """measure_cell in a fresh Python process; one killed after `timeout` seconds or dying is recorded too."""
    try:
        done = subprocess.run(cell_command(variant, length, settings), capture_output=True, text=True,
                              timeout=timeout, check=False, env=cell_environment(settings))
    except subprocess.TimeoutExpired as expired:
        return {"status": "timeout", "error": f"no result after {timeout:g} s (--cell_timeout); killed",
                "stderr_tail": _stderr_tail(expired.stderr)}
    lines = done.stdout.strip().splitlines()
    try:
        entry = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        entry = None
    if isinstance(entry, dict) and "status" in entry:
        return entry  # measured; a crash while the process shuts down afterwards costs nothing
    tail = _stderr_tail(done.stderr)
    last = tail.splitlines()[-1] if tail else "no stderr"
    return {"status": "crashed", "exit_code": done.returncode,
            "error": f"the cell's process ended without a result, {exit_reason(done.returncode)}: {last}",
            "stderr_tail": tail}


def probe_device(timeout: float = 600) -> dict[str, Any]:
    """device_info() read in a child process, so that this one never starts a backend (see the docstring)."""
    code = "import json; from lra_jax.research.benchmarks import bench_cells; print(json.dumps(bench_cells.device_info()))"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as expired:
        raise LraError(f"reading the device in a child process took over {timeout:g} s:\n"
                       f"{_stderr_tail(expired.stderr)}") from expired
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise LraError(f"cannot read the device in a child process ({exit_reason(done.returncode)}):\n"
                       f"{_stderr_tail(done.stderr)}") from None


def run(variants: list[str], lengths: list[int], settings: dict[str, Any],
        measure_fn: Callable[[str, int, dict[str, Any]], dict[str, Any]] | None = None,
        log: Callable[[str], None] = print_now,
        on_result: Callable[[list[dict[str, Any]]], None] | None = None,
        cell_timeout: float = 1800) -> list[dict[str, Any]]:
    """Measures every (variant, length), each in a fresh process; a failure is recorded and the sweep goes on.

    `measure_fn` measures in this process instead (tests). `on_result(results so far)` runs after each
    entry (the report is saved as it grows)."""
    results = []
    rates = dropout_rates(settings)
    # In the bench's own processes the rates of one (variant, length) share a process and alternate
    # step by step (see `measure`), so a change of load hits them alike; a `measure_fn` gets one rate a call.
    together = measure_fn is None and len(rates) > 1
    cells = [(v, n, None) for v in variants for n in lengths] if together else [
        (v, n, rate) for v in variants for n in lengths for rate in rates]
    for i, (variant, length, rate) in enumerate(cells, 1):
        start = time.perf_counter()
        cell_settings = settings if rate is None else {**settings, "dropout_rate": rate}
        if measure_fn is None:
            outcome = measure_in_subprocess(variant, length, cell_settings, cell_timeout)
        else:
            outcome = measure_cell(variant, length, cell_settings, measure_fn)
        wall = time.perf_counter() - start
        if rate is not None:
            outcomes = [(rate, outcome)]
        elif "by_rate" in outcome:
            outcomes = [(r, {"status": outcome["status"], **one}) for r, one in zip(rates, outcome.pop("by_rate"))]
        else:  # a failure stands for every rate of the cell
            outcomes = [(r, dict(outcome)) for r in rates]
        for cell_rate, one in outcomes:
            entry = {"variant": variant, "length": length, "dropout_rate": cell_rate, **one, "wall_seconds": wall}
            if entry["status"] == "ok":
                detail = f"{entry['steps_per_second']:.3g} steps/s, {gib(entry['peak_memory_bytes'], '.3g', '—')} GiB"
                if entry.get("utilisation") is not None:
                    detail += f", {100 * entry['utilisation']:.0f}% of the matmul peak"
            else:
                detail = f"{entry['status'].upper()}: {entry['error'][:200]}"
            results.append(entry)
            label = f"{variant} @ {length}" + (f", dropout {cell_rate:g}" if len(rates) > 1 else "")
            log(f"[{i}/{len(cells)}] {label}: {detail} ({wall:.0f} s)")
        if on_result is not None:
            on_result(results)
    add_relative(results)
    return results


def device_info() -> dict[str, Any]:
    """The accelerator, and the host CPU cores this process may use (what a CPU timing ran on)."""
    d = jax.devices()[0]
    return {"platform": d.platform, "kind": d.device_kind, "count": jax.device_count(),
            "process_count": jax.process_count(), "host_cpu_cores": len(os.sched_getaffinity(0)),
            "transparent_hugepage": transparent_hugepage_mode()}


def transparent_hugepage_mode() -> str | None:
    """The kernel's THP mode ('always', 'madvise' or 'never'; the bracketed word of sysfs), None off Linux."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            found = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def default_out(device: dict[str, Any]) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", f"{device['kind']}-x{device['count']}".lower()).strip("-")
    return os.path.join("experiments", "results", f"bench-{slug}-{datetime.date.today():%Y%m%d}.json")


def benchmark(variants: list[str], lengths: list[int], settings: dict[str, Any], out: str | None,
              measure_fn: Callable[[str, int, dict[str, Any]], dict[str, Any]] | None = None,
              log: Callable[[str], None] = print_now, device: dict[str, Any] | None = None,
              cell_timeout: float = 1800, update: bool = False) -> dict[str, Any]:
    """Measures the grid, writes the JSON report to `out` (default path names the device), prints the table.

    Each cell runs in a fresh process unless `measure_fn` is given (see run); `device` defaults to
    probe_device(). With `update`, `out` must exist with the same device and settings (steps: at least
    the file's), and the cells measured now replace or join its cells; its earlier commands are kept
    under "commands"."""
    device = device or probe_device()
    out = out or default_out(device)
    prior = load_for_update(out, device, settings) if update else {"results": []}
    file_settings = {k: v for k, v in settings.items() if k not in MEASURED_AFTER}
    # An update with more steps leaves the file's as they were: the fewest any of its cells took.
    file_settings.update({k: prior["settings"][k] for k in PRECISION if k in prior.get("settings", {})})
    commands = [*prior.get("commands", [prior["command"]] if "command" in prior else []), " ".join(sys.argv)]
    log(f"{'updating' if update else 'writing'} {out}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # Read before the first save: the report itself, once written into the checkout, is not a change to the code.
    versions = provenance.library_versions()

    def save(results: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
        """Writes the report atomically; a killed or hung bench keeps what it measured. Each cell measured now
        records this command's place in the file's commands (`measured_by`), so that a ratio between cells of
        two commands, which holds the machine's drift between them, can be told from one within a command."""
        measured = [{**r, "measured_by": len(commands) - 1} for r in results]
        report = {"device": device, "versions": versions,
                  "settings": file_settings,
                  "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "command": commands[-1], "complete": complete,
                  "results": merge_results(prior["results"], measured)}
        if update:
            report["commands"] = commands
        run_dir.write_json(out, report)
        return report

    results = run(variants, lengths, settings, measure_fn, log, on_result=lambda partial: save(partial, False),
                  cell_timeout=cell_timeout)
    report = save(results, True)
    log("\n" + table(report["results"], report.get("commands")) + f"\n\nwrote {out}")
    return report
