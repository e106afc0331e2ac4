"""Bench reports (`lra_jax.research.benchmarks.bench_cells` writes them): each cell's speed and memory relative to
softmax, dropout's cost from paired steps with its confidence interval, the Table-2-style table, the
`--report` summary and profile tables, and the merge of a report measured again (`--update`).
"""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from collections.abc import Callable
from typing import Any

from lra_jax.errors import LraError

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


def _flag_values(command: str, name: str) -> list[str] | None:
    """The comma-separated values of `--name=` in a recorded command line (None: the flag is absent)."""
    for token in command.split():
        if token.startswith(f"--{name}="):
            return [v for v in token.split("=", 1)[1].split(",") if v]
    return None


def measuring_command(cell: dict[str, Any], commands: list[str] | None) -> int | None:
    """Which of a file's `commands` measured `cell`, as an index into them: the cell's `measured_by` where it
    was recorded; for a cell from before that field, the last command that named it (its variant in
    `--variants=`, its length in `--lengths=`, its rate in `--dropout_rates=`; a flag left out names every
    value), since `--update` replaces the cells it measures. None for a file of one command (no `commands`)."""
    if cell.get("measured_by") is not None:
        return cell["measured_by"]
    variant, length, rate = cell_key(cell)

    def names(command: str) -> bool:
        variants, lengths, rates = (_flag_values(command, f) for f in ("variants", "lengths", "dropout_rates"))
        return ((variants is None or variant in variants) and (lengths is None or str(length) in lengths)
                and (rates is None or any(float(r) == rate for r in rates)))

    return max((i for i, command in enumerate(commands or []) if names(command)), default=None)


def across_commands(results: list[dict[str, Any]], commands: list[str] | None,
                    baseline: str = "softmax") -> set[tuple[str, int, float]]:
    """The cells (`cell_key`) whose ratio to `baseline` divides by a baseline cell another of the file's
    `commands` measured: a ratio that also holds the machine's drift between the times the two commands ran."""
    if not commands or len(commands) < 2:
        return set()
    base = {cell_key(r)[1:]: r for r in results if r["variant"] == baseline}
    return {cell_key(r) for r in results if r["variant"] != baseline and cell_key(r)[1:] in base
            and measuring_command(r, commands) != measuring_command(base[cell_key(r)[1:]], commands)}


ACROSS_MARK = "†"


def across_note(commands: list[str]) -> str:
    """The footnote of a table whose ratios `ACROSS_MARK` marks (`across_commands`)."""
    return (f"{ACROSS_MARK} the speed × softmax divides by a softmax step that another of the file's {len(commands)} "
            "commands measured (`--update`, at another time): the ratio also holds the machine's drift between the two.")


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

def table(results: list[dict[str, Any]], commands: list[str] | None = None) -> str:
    """LRA-Table-2-style blocks per length: steps/s and memory relative to softmax, then (where
    measured) the share of the measured matmul peak and the cost of dropout. With several dropout
    rates a row is a (variant, rate). With the file's `commands` (several: cells merged by `--update`), a
    speed ratio to a softmax another command measured is marked `ACROSS_MARK` and a footnote says what it
    holds (memory is the compiler's or the device's count, not a timing, so its ratios are not marked)."""
    lengths = sorted({r["length"] for r in results})
    rates = sorted({cell_key(r)[2] for r in results})
    rows = list(dict.fromkeys((r["variant"], cell_key(r)[2]) for r in results))
    variants = list(dict.fromkeys(v for v, _ in rows))
    rows.sort(key=lambda row: (variants.index(row[0]), row[1]))  # a variant's rates together
    cell = {(r["variant"], r["length"], cell_key(r)[2]): r for r in results}
    across = across_commands(results, commands)
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
                    mark = ACROSS_MARK if relative_key == "relative_speed" and cell_key(r) in across else ""
                    text = (value(r) or "—") + (f" ({rel:.1f}×{mark})" if rel is not None and v != "softmax" else "")
                cells.append(f"{text:>{width}}")
            lines.append(f"{label(v, rate):<{name_width}}" + "".join(cells))
        return lines

    peak = max([r["peak_memory_bytes"] or 0 for r in results if r["status"] == "ok"] + [0])
    unit, scale = ("GiB", 2**30) if peak >= 2**30 else ("MiB", 2**20)
    lines = block("steps/s", lambda r: f"{r['steps_per_second']:.3g}", "relative_speed")
    lines += [""] + block(f"memory {unit}", lambda r: f"{(r['peak_memory_bytes'] or 0) / scale:.3g}",
                          "relative_memory")
    if any(utilisation(r) is not None for r in results):
        lines += [""] + block("% matmul peak", lambda r: None if utilisation(r) is None else (
            f"{100 * r['utilisation']:.0f}%" + ("" if r.get("utilisation_flops") == "model" else " xla")), None)
    if any(vendor_utilisation(r) is not None for r in results):
        lines += [""] + block("% vendor peak", lambda r: None if vendor_utilisation(r) is None else
                              f"{100 * vendor_utilisation(r):.0f}%", None)
    if any(r.get("memory_time_share") is not None for r in results):
        lines += [""] + block("% streaming bytes", lambda r: None if r.get("memory_time_share") is None
                              else f"{100 * r['memory_time_share']:.0f}%", None)
    if any(r.get("dropout_cost") is not None for r in results):
        lines += [""] + block(f"dropout cost ({COST_CONFIDENCE:.0%} CI)", _cost_with_interval, None)
    if across:  # wrapped to the table's width: the docs show it in the same fixed-width block
        lines += ["", textwrap.fill(across_note(commands), max(60, max(len(line) for line in lines)))]
    return "\n".join(lines)


def _cost_with_interval(r: dict[str, Any]) -> str | None:
    """'+9% [-12, +24]': dropout's cost and its interval (`paired_cost_interval`), in percent."""
    if r.get("dropout_cost") is None:
        return None
    interval = r.get("dropout_cost_interval")
    return f"{100 * r['dropout_cost']:+.0f}%" + (
        f" [{100 * interval[0]:+.0f}, {100 * interval[1]:+.0f}]" if interval else "")


# A measured matmul peak under this share of the vendor's is unsound: the product it was timed on was too
# small to fill the accelerator (2048-square products on an H100/H200 reached 64-112 TFLOP/s where
# 8192-square ones reach ~365 of the 494 the vendor states), and a step divided by it reads over 100%.
SOUND_PEAK_SHARE = 0.5


def unsound_peak(r: dict[str, Any]) -> bool:
    """Whether the cell's measured matmul peak is under SOUND_PEAK_SHARE of the vendor's (accelerators)."""
    vendor, measured = r.get("vendor_peak_flops_per_second"), r.get("matmul_peak_flops_per_second")
    return bool(vendor and measured and measured < SOUND_PEAK_SHARE * vendor)


def utilisation(r: dict[str, Any]) -> float | None:
    """The cell's share of the measured matmul peak; None where there is none or it is unsound."""
    return None if unsound_peak(r) else r.get("utilisation")


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
                percent(utilisation(free))] + ([percent(vendor_utilisation(free))] if vendor else []) + [
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
