"""Which modeled TPU step times can be printed: each checked against the roofline of the step's own counts.

libtpu's modeled step time (`cost_analysis()["optimal_seconds"]`) can be off by whole seconds, in
either direction, with or without loops in the step, and counts a loop body once
(docs/tpu-modeled-time.md; `python -m lra_jax.tools.cost_probe` shows both on steps of known work).
So a modeled time is printed only where it lies in

    BAND[0] * roofline <= modeled <= BAND[1] * roofline,
    roofline = max(XLA's FLOPs / peak, XLA's bytes accessed / HBM bandwidth)   (`compile_step.roofline_seconds`)

and the step's counts are complete (no loop, no kernel call counted as 0). Below 1x the time is
faster than the chip can run the counted work; the committed loop-free steps with a positive
modeled time lie at 1.05-1.55x their roofline (`band_evidence`), so 2x leaves room for a slower step
and still rejects a whole-second offset on any step under a second (1 s extra on a 0.5 s step is 3x).
Every row gets its roofline (where its counts are complete) and a reason where no modeled time is printed.
"""

from __future__ import annotations

import math
import re
from typing import Any

BAND = (1.0, 2.0)  # modeled / roofline of the times printed
_GAVE = re.compile(r"gave (-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def raw_modeled_seconds(row: dict[str, Any]) -> float | None:
    """libtpu's figure for a compile row (a `compile_step.Row` as a dict): `modeled_seconds`, or the
    negative value its `modeled_note` recorded ("not modeled: the TPU cost model gave -50.76")."""
    if row.get("modeled_seconds") is not None:
        return float(row["modeled_seconds"])
    found = _GAVE.search(row.get("modeled_note") or "")
    return float(found.group(1)) if found else None


def whole_seconds_below(seconds: float) -> int:
    """The whole seconds a negative modeled time lies below zero (ceil of its magnitude); 0 otherwise."""
    return math.ceil(-seconds) if seconds < 0 else 0


def check(row: dict[str, Any]) -> dict[str, Any]:
    """{"modeled_seconds": printable or None, "roofline_seconds", "raw_modeled_seconds", "ratio"
    (raw / roofline), "reason": why nothing is printed (None where it is)} for one train row."""
    raw = raw_modeled_seconds(row)
    roofline = row.get("roofline_seconds")
    out = {"modeled_seconds": None, "roofline_seconds": roofline, "raw_modeled_seconds": raw,
           "ratio": raw / roofline if raw is not None and roofline else None, "reason": None}
    if row.get("result") != "ok":
        needed = (row.get("memory") or {}).get("total") or (row.get("memory") or {}).get("temp")
        out["reason"] = (f"does not fit a device of {row.get('device_memory', 0) / 2**30:.0f} GiB"
                         + (f" (the compiler asked for {needed / 2**30:.1f} GiB)" if needed else "")
                         if row.get("result") == "does not fit" else f"did not compile: {row.get('error')}")
    elif row.get("kernel_calls"):
        out["reason"] = "not modeled: Mosaic kernel calls in the step, which the TPU cost model does not time"
    elif row.get("loops"):
        out["reason"] = (f"{row['loops']} loop(s) in the step, each body counted once by the TPU cost model "
                         "and XLA's counts: no modeled time or roofline")
    elif raw is None:
        out["reason"] = "no modeled time in the compile"
    elif not roofline:
        out["reason"] = "no roofline (XLA's counts incomplete)"
    elif raw < 0:
        out["reason"] = (f"modeled time negative ({raw:.3f} s: {whole_seconds_below(raw)} whole seconds below "
                         "zero), a libtpu cost-model fault")
    elif not BAND[0] <= raw / roofline <= BAND[1]:
        out["reason"] = (f"modeled {raw:.3f} s is {raw / roofline:.2f}x its roofline {roofline:.4f} s, "
                         f"outside {BAND[0]:g}-{BAND[1]:g}x")
    else:
        out["modeled_seconds"] = raw
    return out


def band_evidence(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over compile rows for TPU targets: the ratio to the roofline of positive loop-free modeled times,
    and of the fraction above the next lower whole second of the negative ones (min, max, count)."""
    positive, negative = [], []
    for row in rows:
        raw, roofline = raw_modeled_seconds(row), row.get("roofline_seconds")
        if raw is None or not roofline or row.get("loops") or row.get("kernel_calls"):
            continue
        if raw > 0:
            positive.append(raw / roofline)
        elif raw < 0:
            negative.append((raw + whole_seconds_below(raw)) / roofline)

    def span(values):
        return {"count": len(values), "min": min(values, default=None), "max": max(values, default=None)}
    return {"positive": span(positive), "negative_fraction": span(negative)}
