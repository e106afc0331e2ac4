"""Training speed and memory of every variant, by the LRA paper's Table 2 protocol.

    python -m lra_jax.tools.bench --variants=all --lengths=1024,2048,3072,4096
    python -m lra_jax.tools.bench --variants=softmax,linformer,performer --lengths=1024,2048 --batch_size=8
    python -m lra_jax.tools.bench --kernels ...   # the Pallas kernel benchmark (lra_jax.tools.kernel_bench)

Protocol (Tay et al. 2021, Table 2): the Text task model (4 layers, 4 heads, emb 256, MLP 1024,
byte vocabulary 257, 2 classes, dropout 0.1), batch 32, one jitted train step (forward, backward,
AdamW) compiled once, `--warmup` untimed steps, then `--steps` timed steps. Each variant takes its
settings from configs/<variant file>.py (full scale). Random tokens with ragged lengths.

Per (variant, length): steps/s, examples/s, compiled FLOPs per step, XLA's memory estimate of the
step (every backend) and the device's peak bytes in use where it reports them. A run out of memory
is recorded with status "oom"; any other failure with status "error" and its message; neither stops
the sweep. Writes one JSON (device, library versions, settings, results), saved again after every
cell with "complete": false until the last, and prints LRA-Table-2-style rows, each relative to softmax.

Every (variant, length) cell runs in a fresh Python process (this module with the internal `--cell`
flag, which prints the cell's result as JSON). Many cells measured one after another in one process
hung: with the persistent compilation cache on, after a few cells an eager op building the train
state never returned. A fresh process also gives each cell all of the device's memory and its own
peak-memory counter. The parent never starts a JAX backend itself (the device is probed in a child
too), so a GPU's memory and a TPU stay free for the cells. A cell whose process runs past
`--cell_timeout` is killed and recorded with status "timeout"; one whose process dies (an exit code,
a signal such as the OOM killer's SIGKILL) with status "crashed", its exit code and its last stderr lines.
"""

from __future__ import annotations

import datetime
import importlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
from absl import app, flags, logging

from lra_jax import provenance
from lra_jax.config import paths as config_paths
from lra_jax.config import task_defaults
from lra_jax.data.tasks import default_cache_dir
from lra_jax.errors import ConfigError, LraError
from lra_jax.measure import host_memory
from lra_jax.tools.progress import print_now

PROTOCOL = {"num_layers": 4, "num_heads": 4, "emb_dim": 256, "mlp_dim": 1024}
VOCAB_SIZE, NUM_CLASSES = 257, 2  # Text: bytes + padding, binary sentiment
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM")

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command-line flags (defined only when run as a command, so modules import side by side)."""
    flags.DEFINE_string("variants", "all", "'all' or a comma list of registry names.")
    flags.DEFINE_list("lengths", ["1024", "2048", "3072", "4096"], "Sequence lengths.")
    flags.DEFINE_integer("batch_size", 32, "Examples per step (Table 2: 32).")
    flags.DEFINE_integer("steps", 5, "Timed steps after warm-up (at least 5).")
    flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
    flags.DEFINE_string("out", None, "Output JSON (default experiments/results/bench-<device>-<date>.json).")
    flags.DEFINE_bool("update", False, "Merge into an existing --out: the cells measured now replace or join "
                      "its cells (a new variant, a re-measured one); device and settings must match, "
                      "except that --steps may be larger than the file's (a more precise re-measure).")
    flags.DEFINE_list("dropout_rates", ["0.1"], "Dropout rates (residual, MLP and attention alike; Table 2: 0.1). "
                      "Several, e.g. 0,0.1, measure each (variant, length) at every rate one after another, "
                      "so the cost of dropout is read side by side under the same load.")
    flags.DEFINE_bool("huge_pages", True, "Cells run with glibc's malloc backing large buffers by transparent huge "
                      "pages (lra_jax/measure/host_memory.py): on CPU, XLA writes a step's temporaries into fresh memory every "
                      "step, and each 4 KiB page of it faults; huge pages fault once per 2 MiB.")
    flags.DEFINE_bool("keep_host_memory", True, "Cells run with glibc's malloc keeping freed memory mapped "
                      "(lra_jax/measure/host_memory.py), so a step reuses the last step's temporaries instead of faulting "
                      "fresh pages in.")
    flags.DEFINE_bool("profile", False, "After the timed steps, run one more step of each rate under jax's profiler "
                      "and record where its time goes: matmuls (and the rate they reach, by contraction size), "
                      "transcendentals, other elementwise work, data movement, sorts, gathers, FFTs "
                      "(lra_jax/measure/step_profile.py). The timed steps are not profiled.")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Model compute dtype.")
    flags.DEFINE_enum("impl", "auto", ["auto", "xla", "pallas"], "Attention implementation of every variant "
                      "(config.attention.impl): 'auto' is the Pallas kernel on GPU/TPU where a variant has one; "
                      "'xla' measures what the kernels buy.")
    flags.DEFINE_bool("scan_layers", False, "Layers in one lax.scan (config.model.scan_layers).")
    flags.DEFINE_bool("remat", False, "Recompute layers in the backward pass (config.model.remat).")
    flags.DEFINE_integer("seed", 0, "Seed of the random tokens and the parameters.")
    flags.DEFINE_integer("num_layers", PROTOCOL["num_layers"], "Model depth; change only for smoke tests.")
    flags.DEFINE_integer("num_heads", PROTOCOL["num_heads"], "Attention heads; change only for smoke tests.")
    flags.DEFINE_integer("emb_dim", PROTOCOL["emb_dim"], "Model width; change only for smoke tests.")
    flags.DEFINE_integer("mlp_dim", PROTOCOL["mlp_dim"], "MLP width; change only for smoke tests.")
    flags.DEFINE_float("cell_timeout", 1800, "Seconds one (variant, length) cell may take, start-up and "
                       "compilation included; past it its process is killed and the cell recorded as 'timeout'.")
    flags.DEFINE_string("cell", None, "Internal: one cell as JSON {variant, length, settings}; measures it "
                        "in this process and prints its result as JSON (the bench runs every cell this way).")
    flags.DEFINE_list("report", None, "Measure nothing: print the dropout-cost and utilisation summary "
                      "(`summary`) of these bench JSONs, e.g. one per length.")
    flags.DEFINE_bool("kernels", False, "Run the kernel benchmark (lra_jax.tools.kernel_bench) instead; "
                      "the other arguments go to it.")


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

class OutOfMemory(Exception):
    """The step does not fit: raised by the trainer's memory check or by XLA."""


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
    from lra_jax.data.tasks import TaskSpec
    from lra_jax.measure import device_peak, flops, step_profile, step_timing
    from lra_jax.training import trainer

    rates = [settings["dropout_rate"]] if "dropout_rate" in settings else dropout_rates(settings)
    configs = [bench_config(variant, length, settings, rate) for rate in rates]
    task = TaskSpec("text-bench", VOCAB_SIZE, NUM_CLASSES, False, load=None)
    peak_before = device_peak.measured_matmul_peak(settings["dtype"])
    try:
        timings = step_timing.time_train_steps(configs, task, trainer.make_mesh(),
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


def is_oom(error: BaseException) -> bool:
    return isinstance(error, OutOfMemory) or any(m in str(error) for m in OOM_MARKERS)


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
    code = "import json; from lra_jax.tools import bench; print(json.dumps(bench.device_info()))"
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
                detail = f"{entry['steps_per_second']:.3g} steps/s, {_gib(entry['peak_memory_bytes'])}"
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


LEGACY_DROPOUT_RATE = 0.1  # the rate of every cell measured before --dropout_rates existed


def dropout_rates(settings: dict[str, Any]) -> list[float]:
    """The dropout rates of a run's settings (a report from before --dropout_rates: [0.1])."""
    return list(settings.get("dropout_rates", [LEGACY_DROPOUT_RATE]))


def cell_key(r: dict[str, Any]) -> tuple[str, int, float]:
    return r["variant"], r["length"], r.get("dropout_rate", LEGACY_DROPOUT_RATE)


def add_relative(results: list[dict[str, Any]], baseline: str = "softmax") -> None:
    """Adds speed and memory relative to `baseline` at the same length and dropout rate (None where
    either is missing), and `dropout_cost` against the same variant and length at dropout 0 (None
    without such a cell): `paired_cost` of their timed steps, with `dropout_cost_interval`
    (`paired_cost_interval`)."""
    ok = {cell_key(r): r for r in results if r["status"] == "ok"}
    for r in results:
        variant, length, rate = cell_key(r)
        b = ok.get((baseline, length, rate)) if r["status"] == "ok" else None
        r["relative_speed"] = r["steps_per_second"] / b["steps_per_second"] if b else None
        r["relative_memory"] = (r["peak_memory_bytes"] / b["peak_memory_bytes"]
                                if b and r.get("peak_memory_bytes") and b.get("peak_memory_bytes") else None)
        free = ok.get((variant, length, 0.0)) if r["status"] == "ok" and rate > 0 else None
        r["dropout_cost"] = paired_cost(r, free) if free else None
        r["dropout_cost_interval"] = paired_cost_interval(r, free) if free else None


def paired_cost(cell: dict[str, Any], free: dict[str, Any]) -> float:
    """How much slower `cell`'s step is than `free`'s: the median over i of step_i / free step_i - 1.

    The rates of one (variant, length) alternate step by step in one process (`measure`), so step i
    of each ran back to back, under the same load; the median of the pairs' ratios drops a step that
    something else on the machine slowed, which a ratio of means does not. Cells without matching
    step lists (measured apart, or by a `measure_fn`) compare their mean seconds per step."""
    steps, free_steps = cell.get("step_seconds"), free.get("step_seconds")
    if steps and free_steps and len(steps) == len(free_steps):
        return statistics.median(a / b for a, b in zip(steps, free_steps)) - 1
    return cell["seconds_per_step"] / free["seconds_per_step"] - 1


COST_CONFIDENCE = 0.9


def paired_cost_interval(cell: dict[str, Any], free: dict[str, Any],
                         confidence: float = COST_CONFIDENCE) -> list[float] | None:
    """A distribution-free confidence interval for `paired_cost`: [r_(k) - 1, r_(n+1-k) - 1], the k-th
    smallest and k-th largest of the n pairs' ratios, with the largest k for which it holds the pairs'
    median ratio with probability >= `confidence` (independent pairs: 1 - 2 P(Binomial(n, 1/2) < k)).
    Five pairs: their smallest and largest ratio, 94%; nine: the 2nd and 8th, 96%. None without
    pairs, or with too few for `confidence` (four or fewer at 90%)."""
    steps, free_steps = cell.get("step_seconds"), free.get("step_seconds")
    if not steps or not free_steps or len(steps) != len(free_steps):
        return None
    ratios = sorted(a / b for a, b in zip(steps, free_steps))
    n = len(ratios)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    ks = [k for k in range(1, n // 2 + 1) if coverage(k) >= confidence]
    if not ks:
        return None
    k = max(ks)
    return [ratios[k - 1] - 1, ratios[n - k] - 1]


# ----------------------------------------------------------------------------- report

def _gib(value) -> str:
    return "—" if value is None else f"{value / 2**30:.3g} GiB"


def table(results: list[dict[str, Any]]) -> str:
    """LRA-Table-2-style blocks per length: steps/s and memory relative to softmax, then (where
    measured) the share of the measured matmul peak and the cost of dropout. With several dropout
    rates a row is a (variant, rate)."""
    lengths = sorted({r["length"] for r in results})
    rates = sorted({cell_key(r)[2] for r in results})
    rows = list(dict.fromkeys((r["variant"], cell_key(r)[2]) for r in results))
    variants = list(dict.fromkeys(v for v, _ in rows))
    rows.sort(key=lambda row: (variants.index(row[0]), row[1]))  # a variant's rates together
    cell = {(r["variant"], r["length"], cell_key(r)[2]): r for r in results}
    width = 18
    label = (lambda v, rate: v) if len(rates) == 1 else (lambda v, rate: f"{v} p={rate:g}")  # noqa: E731
    name_width = max([14] + [len(label(v, rate)) + 1 for v, rate in rows])

    def block(title: str, value: Callable[[dict], str | None], relative_key: str | None) -> list[str]:
        lines = [f"{title:<{name_width}}" + "".join(f"{n:>{width}}" for n in lengths)]
        for v, rate in rows:
            cells = []
            for n in lengths:
                r = cell.get((v, n, rate))
                if r is None:
                    text = "—"
                elif r["status"] != "ok":
                    text = r["status"].upper()
                else:
                    rel = r.get(relative_key) if relative_key else None
                    text = (value(r) or "—") + (f" ({rel:.1f}×)" if rel is not None and v != "softmax" else "")
                cells.append(f"{text:>{width}}")
            lines.append(f"{label(v, rate):<{name_width}}" + "".join(cells))
        return lines

    peak = max([r["peak_memory_bytes"] or 0 for r in results if r["status"] == "ok"] + [0])
    unit, scale = ("GiB", 2**30) if peak >= 2**30 else ("MiB", 2**20)
    lines = block("steps/s", lambda r: f"{r['steps_per_second']:.3g}", "relative_speed")
    lines += [""] + block(f"memory {unit}", lambda r: f"{(r['peak_memory_bytes'] or 0) / scale:.3g}",
                          "relative_memory")
    if any(r.get("utilisation") is not None for r in results):
        lines += [""] + block("% matmul peak", lambda r: None if r.get("utilisation") is None else (
            f"{100 * r['utilisation']:.0f}%" + ("" if r.get("utilisation_flops") == "model" else " xla")), None)
    if any(r.get("memory_time_share") is not None for r in results):
        lines += [""] + block("% streaming bytes", lambda r: None if r.get("memory_time_share") is None
                              else f"{100 * r['memory_time_share']:.0f}%", None)
    if any(r.get("dropout_cost") is not None for r in results):
        lines += [""] + block(f"dropout cost ({COST_CONFIDENCE:.0%} CI)", _cost_with_interval, None)
    return "\n".join(lines)


def _cost_with_interval(r: dict[str, Any]) -> str | None:
    """'+9% [-12, +24]': dropout's cost and its interval (`paired_cost_interval`), in percent."""
    if r.get("dropout_cost") is None:
        return None
    interval = r.get("dropout_cost_interval")
    return f"{100 * r['dropout_cost']:+.0f}%" + (
        f" [{100 * interval[0]:+.0f}, {100 * interval[1]:+.0f}]" if interval else "")


def vendor_utilisation(r: dict[str, Any]) -> float | None:
    """The cell's utilisation against the vendor's peak instead of the measured one (accelerators)."""
    vendor, measured = r.get("vendor_peak_flops_per_second"), r.get("matmul_peak_flops_per_second")
    if r.get("utilisation") is None or not vendor or not measured:
        return None
    return r["utilisation"] * measured / vendor


def summary(results: list[dict[str, Any]]) -> str:
    """One row per variant, per length: seconds per step at dropout 0, what dropout 0.1 costs and its
    interval (`paired_cost_interval`, lower..upper in percent), the share of the matmul peak, on
    accelerators also of the vendor's, and the share of the step that streaming XLA's bytes takes (all
    at dropout 0); '—' where a cell is missing, its status where it failed."""
    cell = {cell_key(r): r for r in results}
    lengths = sorted({r["length"] for r in results})
    variants = list(dict.fromkeys(r["variant"] for r in results))
    vendor = any(vendor_utilisation(r) is not None for r in results)
    columns = ("s/step", "dropout", f"{COST_CONFIDENCE:.0%} CI", "% peak") + (("% vendor",) if vendor else ()) + (
        "% bytes",)
    width = 9

    def values(variant: str, length: int) -> list[str]:
        free, dropped = cell.get((variant, length, 0.0)), cell.get((variant, length, 0.1))
        if free is None:
            return ["—"] * len(columns)
        if free["status"] != "ok":
            return [free["status"].upper()] + [""] * (len(columns) - 1)
        percent = lambda x: "—" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        ok = dropped and dropped["status"] == "ok"
        cost = dropped.get("dropout_cost") if ok else None
        interval = dropped.get("dropout_cost_interval") if ok else None
        return [f"{free['seconds_per_step']:.3g}", "—" if cost is None else f"{100 * cost:+.0f}%",
                "—" if interval is None else f"{100 * interval[0]:+.0f}..{100 * interval[1]:+.0f}",
                percent(free.get("utilisation"))] + ([percent(vendor_utilisation(free))] if vendor else []) + [
                percent(free.get("memory_time_share"))]

    name_width = max([8] + [len(v) + 1 for v in variants])
    head = " " * name_width + "".join(f"{f'n = {n}':^{width * len(columns)}}" for n in lengths)
    sub = f"{'variant':<{name_width}}" + "".join(f"{c:>{width}}" for _ in lengths for c in columns)
    rows = [f"{v:<{name_width}}" + "".join(f"{x:>{width}}" for n in lengths for x in values(v, n))
            for v in variants]
    return "\n".join([head, sub, *rows])


def profile_table(results: list[dict[str, Any]]) -> str:
    """Where the steps' time goes, for the cells measured with --profile: per (variant, length, rate) the
    share of the profiled ops' time in each kind of `step_profile.KINDS` (sort, gather, FFT and other
    together), the rate the matmuls reach as a share of the measured matmul peak (all of them, and
    those with the smallest contraction among the groups that carry 5% of the FLOPs or more: usually
    the head dimension), and the ops' time over the profiled step's wall time ('ops/wall')."""
    rows = sorted((r for r in results if r.get("status") == "ok" and r.get("profile")),
                  key=lambda r: (r["length"], cell_key(r)[2]))
    if not rows:
        return ""
    head = ("matmul", "at peak", "small k", "at peak", "transc.", "elemwise", "moves", "sort etc", "ops/wall")
    labels = [f"{r['variant']} p={cell_key(r)[2]:g}" for r in rows]
    name_width = max(len(label) for label in labels) + 1
    lines = [f"{'variant':<{name_width}}{'n':>6}" + "".join(f"{h:>9}" for h in head)]
    for label, r in zip(labels, rows):
        values = _profile_row(r["profile"], r["matmul_peak_flops_per_second"])
        lines.append(f"{label:<{name_width}}{r['length']:>6}" + "".join(f"{v:>9}" for v in values))
    return "\n".join(lines)


def _profile_row(profile: dict[str, Any], peak: float | None) -> list[str]:
    """The `profile_table` columns of one cell's profile."""
    kinds, total = profile["seconds_by_kind"], profile["op_seconds"]
    groups = profile["matmuls_by_contraction"]
    flops = sum(g["flops"] for g in groups.values())
    seconds = sum(g["seconds"] for g in groups.values())
    small_k = min((int(k) for k, g in groups.items() if g["flops"] >= 0.05 * flops), default=None)

    def percent(x: float) -> str:
        return f"{100 * x:.0f}%"

    def share(*names: str) -> str:
        return percent(sum(kinds[n] for n in names) / total) if total else "—"

    def rate(group_flops: float, group_seconds: float) -> str:
        return percent(group_flops / group_seconds / peak) if group_seconds and peak else "—"

    small = groups[str(small_k)] if small_k is not None else None
    return [share("matmul"), rate(flops, seconds), "—" if small is None else f"k={small_k}",
            "—" if small is None else rate(small["flops"], small["seconds"]), share("transcendental"),
            share("elementwise"), share("data movement"), share("sort", "gather", "fft", "other"),
            percent(profile["op_seconds"] / profile["profiled_wall_seconds"])]


def read_reports(paths: list[str]) -> list[dict[str, Any]]:
    """The cells of bench JSONs `paths`, merged (a later file's cell replaces an earlier one's)."""
    results = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                results = merge_results(results, json.load(f)["results"])
        except OSError as error:
            raise LraError(f"--report: cannot read {path} ({error.strerror})") from error
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise LraError(f"--report: {path} is not a bench JSON ({error})") from error
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


def resolve_variants(spec: str) -> list[str]:
    from lra_jax.attention import registry

    known = registry.names()
    if spec.strip() == "all":
        return known
    variants = [v.strip() for v in spec.split(",") if v.strip()]
    for v in variants:
        registry.get(v)  # an unknown name raises ConfigError listing the known ones
    return variants


def parse_lengths(values: list[str]) -> list[int]:
    try:
        lengths = [int(v) for v in values]
    except ValueError as error:
        raise LraError(f"--lengths must be integers, got {','.join(values)}") from error
    if not lengths or min(lengths) < 1:
        raise LraError("--lengths must be positive integers, e.g. --lengths=1024,2048")
    return lengths


def parse_rates(values: list[str]) -> list[float]:
    try:
        rates = [float(v) for v in values]
    except ValueError as error:
        raise LraError(f"--dropout_rates must be numbers, got {','.join(values)}") from error
    if not rates or not all(0 <= r < 1 for r in rates) or len(set(rates)) < len(rates):
        raise LraError("--dropout_rates must be distinct numbers in [0, 1), e.g. --dropout_rates=0,0.1")
    return rates


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)
    if FLAGS.cell is not None:
        run_cell(FLAGS.cell)
        return
    if FLAGS.report:
        try:
            results = read_reports(FLAGS.report)
            profiles = profile_table(results)
            print(summary(results) + (f"\n\nwhere the profiled steps' time goes\n{profiles}" if profiles else ""))
        except LraError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        return
    try:
        if FLAGS.steps < 5:
            raise LraError(f"--steps must be at least 5 (got {FLAGS.steps}); a shorter timing is noise")
        if FLAGS.cell_timeout <= 0:
            raise LraError(f"--cell_timeout must be a positive number of seconds (got {FLAGS.cell_timeout})")
        variants = resolve_variants(FLAGS.variants)
        lengths = parse_lengths(FLAGS.lengths)
        rates = parse_rates(FLAGS.dropout_rates)
        device = probe_device()
        if FLAGS.batch_size % device["count"]:
            raise LraError(f"--batch_size={FLAGS.batch_size} is not divisible by the {device['count']} devices")
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    names = ("batch_size", "steps", "warmup", "dtype", "impl", "scan_layers", "remat", "seed", "huge_pages", "keep_host_memory",
             *PROTOCOL)
    settings = {name: FLAGS[name].value for name in names}
    settings["dropout_rates"] = rates
    if FLAGS.profile:
        settings["profile"] = True
    settings["protocol"] = all(settings[k] == v for k, v in PROTOCOL.items())
    print(f"bench: {len(variants)} variants x {len(lengths)} lengths on {device['count']} x {device['kind']}, "
          "each cell in its own process", flush=True)
    end_on_sigterm()
    try:
        benchmark(variants, lengths, settings, FLAGS.out, device=device, cell_timeout=FLAGS.cell_timeout,
                  update=FLAGS.update)
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def end_on_sigterm() -> Any:
    """Makes SIGTERM (`kill`, a scheduler's cancel) end the bench as Ctrl-C does: the running cell's
    process is killed with it (subprocess.run kills its child on any exception) and the report keeps
    the cells measured so far. Without this the parent died alone and its cell ran on. Returns the
    previous handler."""
    def stop(signum: int, frame: Any) -> None:
        print("\nbench: SIGTERM: stopping; the running cell is killed, the cells measured so far stay in --out",
              file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


# Settings of what a cell measures after its timed steps: they change none of them, so cells measured
# with and without them compare.
MEASURED_AFTER = frozenset({"profile"})
# Settings of how precisely a cell is measured, not of what: a cell measured again may take more timed
# steps (pairs of rates) than the file's, never fewer; each cell's step_seconds say how many it took.
PRECISION = frozenset({"steps"})


def load_for_update(path: str, device: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The report at `path`, checked to be comparable with a run on `device` with `settings`."""
    try:
        with open(path, encoding="utf-8") as f:
            prior = json.load(f)
    except OSError as error:
        raise LraError(f"--update needs an existing --out file: cannot read {path} ({error.strerror})") from error
    except json.JSONDecodeError as error:
        raise LraError(f"--update: {path} line {error.lineno} is not valid JSON ({error.msg})") from error
    # Settings a file predates take the value its cells were measured with.
    prior_settings = {"dropout_rates": [LEGACY_DROPOUT_RATE], "keep_host_memory": False, "impl": "auto",
                      **prior.get("settings", {})}
    differences = [f"{key}: file {prior_settings.get(key)!r}, now {value!r}" for key, value in settings.items()
                   if key not in MEASURED_AFTER | PRECISION and prior_settings.get(key) != value]
    differences += [f"{key}: file {prior_settings[key]!r}, now {settings[key]!r} (fewer is less precise)"
                    for key in sorted(PRECISION) if key in settings and key in prior_settings
                    and settings[key] < prior_settings[key]]
    if prior.get("device", {}).get("kind") != device["kind"]:
        differences.insert(0, f"device: file {prior.get('device', {}).get('kind')!r}, now {device['kind']!r}")
    if differences:
        raise LraError(f"--update: {path} was measured differently, so its cells are not comparable "
                       f"({'; '.join(differences)}). Rerun with the file's settings or write a new --out.")
    return prior


def merge_results(prior: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """prior's cells with those measured again replaced in place, then the new cells; relatives recomputed."""
    fresh = {cell_key(r): r for r in new}
    merged = [fresh.pop(cell_key(r), r) for r in prior]
    merged += list(fresh.values())
    add_relative(merged)
    return merged


def benchmark(variants: list[str], lengths: list[int], settings: dict[str, Any], out: str | None,
              measure_fn: Callable[[str, int, dict[str, Any]], dict[str, Any]] | None = None,
              log: Callable[[str], None] = print_now, device: dict[str, Any] | None = None,
              cell_timeout: float = 1800, update: bool = False) -> dict[str, Any]:
    """Measures the grid, writes the JSON report to `out` (default path names the device), prints the table.

    Each cell runs in a fresh process unless `measure_fn` is given (see run); `device` defaults to
    probe_device(). With `update`, `out` must exist with the same device and settings (steps: at least
    the file's), and the cells measured now replace or join its cells; its earlier commands are kept
    under "commands"."""
    from lra_jax.training import trainer

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
        """Writes the report atomically; a killed or hung bench keeps what it measured."""
        report = {"device": device, "versions": versions,
                  "settings": file_settings,
                  "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "command": commands[-1], "complete": complete,
                  "results": merge_results(prior["results"], results)}
        if update:
            report["commands"] = commands
        trainer.write_json(out, report)
        return report

    results = run(variants, lengths, settings, measure_fn, log, on_result=lambda partial: save(partial, False),
                  cell_timeout=cell_timeout)
    report = save(results, True)
    log("\n" + table(report["results"]) + f"\n\nwrote {out}")
    return report


def run_kernels(argv: list[str]) -> None:
    """Hands `argv` (without --kernels) to lra_jax.tools.kernel_bench.main."""
    try:
        module = importlib.import_module("lra_jax.tools.kernel_bench")
    except ModuleNotFoundError as error:
        if error.name not in ("lra_jax.kernels", "lra_jax.tools.kernel_bench"):
            raise
        print("error: the kernel benchmark is not available: lra_jax/tools/kernel_bench.py is missing "
              "(python -m lra_jax.tools.bench without --kernels benchmarks the models)", file=sys.stderr)
        sys.exit(2)
    module.main(argv)


def cli() -> None:
    """The command (`python -m lra_jax.tools.bench`, `lra-bench`)."""
    if any(a in ("--kernels", "--kernels=true", "--kernels=True") for a in sys.argv[1:]):
        run_kernels([a for a in sys.argv if not a.startswith("--kernels")])
    else:
        define_flags()
        app.run(main)


if __name__ == "__main__":
    cli()
