"""The LRA paper's Table 2 (Tay et al. 2021) compiled for its hardware: speed and memory per variant.

Table 2 trains the Text model (4 layers, width 256, 4 heads, MLP 1024) at 1K to 4K tokens, batch 32,
on a 4x4 TPU v3 slice and reports steps/s and peak memory per device, each relative to the Transformer.
The paper does not say whether 32 is per core or for the slice. Its memory column says more than one
example per core: 32 for the slice is one example on each of the 32 cores, while the paper's
Transformer takes 9.48 GB at 4K. Compiled here at 4K, 32 per core does not fit softmax into a v3
core's 16 GiB (it asks for 43.8 GiB), while 8 per core gives softmax 11.6 GiB, the nearest to the
paper's 9.48 GB of the batches that fit: the committed table uses 8 per core (256 for the slice).
`python -m lra_jax.tools.compile --lengths=...` compiles that protocol for a target (`config`); this
module turns its train rows into the table (`relative`), prints it beside the paper's figures at 4K
(`paper_figures`, experiments/reference/lra_paper.json) and gives the chart its modeled speeds
(`load_modeled`). Speeds here are the TPU compiler's modeled step times, never measurements, and only
those that pass their roofline check (`lra_jax.research.compilation.roofline`; docs/tpu-modeled-time.md): every
other variant carries the reason instead. GPU memory compiled without a device is an estimate, not a
measurement: on GPUs it came out both above and below it (docs/gpu-memory.md).
The command is `python -m lra_jax.tools.table2`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from lra_jax.config import paths as config_paths
from lra_jax.errors import LraError
from lra_jax.research.benchmarks import bench_cells
from lra_jax.research.compilation import roofline
from lra_jax.research.compilation.compile_step import DEVICELESS_GPU_MEMORY, Row
from lra_jax.measure.units import gib

LABEL = "table2"  # compile rows of this protocol are labelled "table2:<length>"
BASELINE = "softmax"
BATCH_SIZE = 32  # the bench's default; `compile --per_device_batch` sets the examples per device
REFERENCE = os.path.join(config_paths.REPO_ROOT, "experiments", "reference", "lra_paper.json")  # the paper's figures


def config(variant: str, length: int):
    """The bench's Table 2 config (`lra_jax.research.benchmarks.bench_cells.bench_config`) for `variant` at `length` tokens,
    as the Text task (byte vocabulary, 2 classes), layers unrolled and not rematerialised as in the paper."""
    settings = dict(bench_cells.PROTOCOL, batch_size=BATCH_SIZE, seed=0, dtype="float32", scan_layers=False, remat=False)
    built = bench_cells.bench_config(variant, length, settings)
    built.task = "text"
    return built


def length_of(label: str) -> int | None:
    """The length of a row labelled "table2:<n>", else None."""
    name, _, length = label.partition(":")
    return int(length) if name == LABEL and length.isdigit() else None


def relative(rows) -> list[dict[str, Any]]:
    """Per (target, variant, length) train row: modeled steps/s and memory per device, each relative to
    softmax's on the same target at the same length (None where either is missing). A modeled time is
    used only where it passes its roofline check (`roofline.check`); "note" says why one is not."""
    train = [r for r in rows if r.mode == "train" and length_of(r.task) is not None]
    checked = {id(r): roofline.check(dataclasses.asdict(r)) for r in train}
    baseline = {(r.target, r.task): r for r in train if r.variant == BASELINE}
    entries = []
    for r in train:
        base = baseline.get((r.target, r.task))
        seconds = checked[id(r)]["modeled_seconds"]
        base_seconds = checked[id(base)]["modeled_seconds"] if base else None
        speed = 1 / seconds if seconds else None
        base_speed = 1 / base_seconds if base_seconds else None
        memory = (r.memory or {}).get("total") if r.result == "ok" else None
        base_memory = (base.memory or {}).get("total") if base and base.result == "ok" else None
        entries.append({
            "variant": r.variant, "target": r.target, "length": length_of(r.task), "result": r.result,
            "modeled_steps_per_second": speed,
            "relative_speed": speed / base_speed if speed and base_speed else None,
            "roofline_seconds": checked[id(r)]["roofline_seconds"],
            "memory_bytes": memory, "relative_memory": memory / base_memory if memory and base_memory else None,
            "memory_compiled_without_device": not r.target.startswith("tpu"),  # an estimate (docs/gpu-memory.md)
            "needed_bytes": None if r.result == "ok" else (r.memory or {}).get("total") or (r.memory or {}).get("temp"),
            "note": (checked[id(r)]["reason"] if r.target.startswith("tpu") else None) or r.modeled_note or r.error})
    return entries


def paper_figures(path: str | None = None) -> dict[str, dict[str, Any]]:
    """variant -> the paper's Table 2 figures at 4K (steps/s, relative speed, memory GB), where published."""
    path = path or REFERENCE
    try:
        with open(path, encoding="utf-8") as f:
            models = json.load(f)["models"]
    except (OSError, ValueError, KeyError) as error:
        raise LraError(f"cannot read the LRA paper's figures {path}: {error}") from error
    return {m["variant"]: m for m in models if m.get("relative_speed_4k") is not None}


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(entries: list[dict[str, Any]], paper: dict[str, dict[str, Any]]) -> str:
    """Table 2 per target: modeled speed relative to softmax at each length (TPU targets), memory per
    device (GiB) at each length, and the paper's speed and memory at 4K."""
    lines = []
    for target in dict.fromkeys(e["target"] for e in entries):
        mine = [e for e in entries if e["target"] == target]
        lengths = sorted({e["length"] for e in mine})
        cells = {(e["variant"], e["length"]): e for e in mine}
        modeled = target.startswith("tpu")  # XLA:GPU has no cost model: its table is memory only
        speed = (f"train steps/s relative to {BASELINE} (modeled by the XLA TPU compiler, not measured; "
                 f"-: no modeled time passed its roofline check, see the notes) and "
                 if modeled else "no speed (XLA:GPU models none; only a GPU measures it), ")
        compiled = "compiled" if modeled else DEVICELESS_GPU_MEMORY
        lines.append(f"Table 2 on {target}: {speed}memory per device (GiB, {compiled}; !N: does not fit, the "
                     "compiler asked for N GiB); paper: Tay et al. 2021 at 4K")
        speed_lengths = lengths if modeled else []
        header = f"{'variant':<17}" + "".join(f"{'x' + str(n):>8}" for n in speed_lengths) \
            + "".join(f"{str(n) + ' GiB':>10}" for n in lengths) + f"{'paper x':>9}{'paper GB':>9}"
        lines.append(header)
        for variant in dict.fromkeys(e["variant"] for e in mine):
            row = f"{variant:<17}"
            for n in speed_lengths:
                e = cells.get((variant, n), {})
                row += f"{_cell(e.get('relative_speed'), '.2f'):>8}"
            for n in lengths:
                e = cells.get((variant, n), {})
                memory, needed = e.get("memory_bytes"), e.get("needed_bytes")
                text = gib(memory) if memory else (
                    "!" + gib(needed, ".1f") if needed else e.get("result", "-")[:9])
                row += f"{text:>10}"
            published = paper.get(variant, {})
            row += f"{_cell(published.get('relative_speed_4k'), '.1f'):>9}{_cell(published.get('memory_4k_gb'), '.2f'):>9}"
            lines.append(row)
        if modeled:
            longest = max(lengths)
            notes = [(e["variant"], e["note"]) for e in mine if e["length"] == longest and e["note"]
                     and e.get("relative_speed") is None]
            lines.extend(f"  {variant} at {longest}: {note}" for variant, note in notes)
    return "\n".join(lines)


def modeled_time(row) -> tuple[float | None, str]:
    """(seconds, kind) of a compiled step: the TPU cost model's time where it passes its roofline check
    ("modeled", `roofline.check`), else the roofline of XLA's complete counts ("roofline"), else (None, "")."""
    checked = roofline.check(dataclasses.asdict(row))
    if checked["modeled_seconds"]:
        return checked["modeled_seconds"], "modeled"
    if row.roofline_seconds:
        return row.roofline_seconds, "roofline"
    return None, ""


def dropout_cost(free_rows, dropout_rows) -> list[dict[str, Any]]:
    """Per (target, variant, length) train row in both: the step time without and with dropout
    (`modeled_time`, the same kind for both or none) and dropout's cost, (with / without) - 1. The
    cost is marked approximate where a step has loops (each time is then a lower bound)."""
    free = {(r.target, r.variant, r.task): r for r in free_rows if r.mode == "train" and length_of(r.task)}
    entries = []
    for r in dropout_rows:
        base = free.get((r.target, r.variant, r.task))
        if r.mode != "train" or base is None:
            continue
        (without, kind), (with_, other) = modeled_time(base), modeled_time(r)
        if kind != other:
            without = with_ = None
        entries.append({"variant": r.variant, "target": r.target, "length": length_of(r.task), "time": kind,
                        "seconds_without": without, "seconds_with": with_,
                        "cost": with_ / without - 1 if without and with_ else None,
                        "has_loops": bool(r.loops or base.loops),
                        "memory_without": (base.memory or {}).get("total"), "memory_with": (r.memory or {}).get("total")})
    return entries


def format_dropout_cost(entries: list[dict[str, Any]]) -> str:
    """One line per variant and length: ms without / with dropout (r: roofline), the cost, memory both ways."""
    lines = ["dropout's cost in the TPU compiler's model (not measured): its modeled time, or r: the roofline "
             "max(FLOPs / peak, bytes / HBM bandwidth) of XLA's counts; ~: the step has loops, times are lower bounds",
             f"{'variant':<17}{'target':<14}{'n':>6}{'ms p=0':>10}{'ms p=0.1':>10}{'cost':>8}{'GiB p=0':>9}{'GiB p=0.1':>10}"]
    for e in entries:
        mark = " r" if e["time"] == "roofline" else ""
        ms = lambda t: "-" if not t else f"{t * 1e3:.1f}{mark}"
        cost = "-" if e["cost"] is None else ("~" if e["has_loops"] else "") + f"{e['cost']:+.0%}"
        lines.append(f"{e['variant']:<17}{e['target']:<14}{e['length']:>6}{ms(e['seconds_without']):>10}"
                     f"{ms(e['seconds_with']):>10}{cost:>8}{gib(e['memory_without'] or None):>9}{gib(e['memory_with'] or None):>10}")
    return "\n".join(lines)


def load_modeled(path: str, length: int | None) -> tuple[int | None, str, dict[str, dict[str, Any]]]:
    """(length, target, variant -> entry) from a compile JSON of this protocol, for the chart; one entry
    per train row at `length` (None: the longest in the file), every variant in the file:

        examples_per_second          global batch / libtpu's modeled step time where it passes its
                                     roofline check (`roofline.check`), else None
        reason                       why examples_per_second is None (does not fit, loops, negative or
                                     out-of-band modeled time, not compiled); None where it is printed
        peak_memory_bytes            memory per device as compiled, None where the step does not fit
        modeled_seconds              the checked modeled time (None where not printed)
        raw_modeled_seconds          libtpu's figure as it gave it (negative ones included), or None
        roofline_seconds             max(XLA's FLOPs / peak, bytes / HBM bandwidth), complete counts only
        roofline_examples_per_second global batch / roofline_seconds: the most the chip could reach
        global_batch, per_device_batch
        modeled_label                what the speed is, for a caption"""
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError) as error:
        raise LraError(f"cannot read compile JSON {path}: {error}") from error
    rows = [r for r in rows if r["mode"] == "train" and length_of(r["task"]) is not None]
    lengths = sorted({length_of(r["task"]) for r in rows})
    if not lengths:
        raise LraError(f"{path} has no Table 2 rows: make it with `python -m lra_jax.tools.compile --lengths=...`")
    if length is None:
        length = lengths[-1]
    elif length not in lengths:
        raise LraError(f"length {length} is not in {path}; it has {', '.join(map(str, lengths))}")
    chosen = [r for r in rows if length_of(r["task"]) == length]
    targets = sorted({r["target"] for r in chosen})
    if len(targets) != 1:
        raise LraError(f"{path} has Table 2 rows for {', '.join(targets)}; the chart takes one target per file")
    label = (f"modeled by libtpu for {targets[0]} (not measured), printed only within "
             f"{roofline.BAND[0]:g}-{roofline.BAND[1]:g}x the roofline of XLA's counts")
    modeled = {}
    for r in chosen:
        checked = roofline.check(r)
        seconds, bound = checked["modeled_seconds"], checked["roofline_seconds"]
        modeled[r["variant"]] = {
            "examples_per_second": r["global_batch"] / seconds if seconds else None,
            "reason": checked["reason"],
            "peak_memory_bytes": (r.get("memory") or {}).get("total") if r["result"] == "ok" else None,
            "modeled_seconds": seconds, "raw_modeled_seconds": checked["raw_modeled_seconds"],
            "roofline_seconds": bound, "roofline_examples_per_second": r["global_batch"] / bound if bound else None,
            "global_batch": r["global_batch"], "per_device_batch": r.get("per_device_batch"), "modeled_label": label}
    return length, targets[0], modeled


def read_rows(path: str):
    """The compile.Row list of a compile JSON made with --lengths."""
    try:
        with open(path, encoding="utf-8") as f:
            rows = [Row(**r) for r in json.load(f)["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LraError(f"cannot read compile JSON {path}: {error}") from error
    if not any(length_of(r.task) for r in rows):
        raise LraError(f"{path} has no Table 2 rows: make it with `python -m lra_jax.tools.compile --lengths=...`")
    return rows
