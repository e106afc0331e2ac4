"""docs/tpu-modeled-time.md, written from committed JSON: the cost probe's (`python -m lra_jax.tools.cost_probe`)
and the Table 2 and compile JSONs' TPU rows (`roofline.band_evidence`). Every figure on the page comes from them;
`python -m lra_jax.tools.docs` writes it with the other generated pages (`page`), and `--check` fails when a TPU
compile JSON changed and the page was not regenerated.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from lra_jax.errors import LraError
from lra_jax.research.compilation import modeled_loops, roofline, table2_report


def read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise LraError(f"cannot read {path}: {error}") from error


def tpu_rows(paths: list[str]) -> list[dict[str, Any]]:
    """The TPU rows of the compile JSONs among `paths` (files without "rows" are skipped)."""
    rows = []
    for path in paths:
        document = read_json(path)
        if isinstance(document, dict):
            jax_version = document.get("versions", {}).get("jax", "?")
            rows += [dict(r, jax=jax_version) for r in document.get("rows", [])
                     if str(r.get("target", "")).startswith("tpu")]
    return rows


def census(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How the TPU rows' modeled times came out: positive, negative (with and without loops), none."""
    counts = {"rows": len(rows), "positive": 0, "negative": 0, "negative_without_loops": 0, "not_modeled": 0,
              "positive_with_loops": 0}
    for row in rows:
        raw = roofline.raw_modeled_seconds(row)
        if raw is None:
            counts["not_modeled"] += 1
        elif raw < 0:
            counts["negative"] += 1
            counts["negative_without_loops"] += not row.get("loops")
        else:
            counts["positive"] += 1
            counts["positive_with_loops"] += bool(row.get("loops"))
    return counts


def line_through_positive(looped: list[dict[str, Any]]) -> tuple[float, float, float] | None:
    """(slope, intercept, largest distance in s) of the least-squares line through the positive scanned times
    over L, and the largest distance from it of the negative ones with their whole seconds added back."""
    positive = [(p["trips"], p["scanned_modeled_seconds"]) for p in looped if p["scanned_modeled_seconds"] > 0]
    if len(positive) < 2:
        return None
    n = len(positive)
    mean_l, mean_t = sum(l for l, _ in positive) / n, sum(t for _, t in positive) / n
    slope = sum((l - mean_l) * (t - mean_t) for l, t in positive) / sum((l - mean_l) ** 2 for l, _ in positive)
    intercept = mean_t - slope * mean_l
    corrected = [(p["trips"], p["scanned_corrected_seconds"]) for p in looped if p["scanned_whole_seconds_off"]]
    return slope, intercept, max((abs(t - slope * l - intercept) for l, t in corrected), default=0.0)


def reformer_versions(rows: list[dict[str, Any]]) -> str:
    """The modeled times of Reformer's full-scale Text-4K train step on tpu-v3 in the rows, per jax version."""
    found = [r for r in rows if r["variant"] == "reformer" and r["task"] == "text:4000" and r["mode"] == "train"
             and r["target"] == "tpu-v3:4x4" and roofline.raw_modeled_seconds(r) is not None]
    return "; ".join(f"jax {r['jax']}: {roofline.raw_modeled_seconds(r):.3f} s" for r in found) or "none"


def _span(span: dict[str, Any]) -> str:
    if not span["count"]:
        return "none"
    return f"{span['min']:.2f}-{span['max']:.2f}x ({span['count']} steps)"


def _commit(document: dict[str, Any]) -> str:
    return document.get("commit") or document.get("versions", {}).get("lra_jax_commit") or "unknown"


PROBE = os.path.join("experiments", "results", "cost-probe-tpu-v5e.json")


def render(probe_path: str, compile_paths: list[str], command: str, root: str = ".") -> str:
    """The page, from the probe JSON at `probe_path` and the compile JSONs `compile_paths` (named relative to
    `root`)."""
    probe = read_json(probe_path)
    rows = tpu_rows(compile_paths)
    counts, evidence = census(rows), roofline.band_evidence(rows)
    pairs = probe["pairs"]
    forward = [p for p in pairs if not p["grad"]]
    looped = [p for p in forward if p["scanned_loops"]]
    off = [p for p in looped if p["scanned_whole_seconds_off"]]
    line = line_through_positive(looped)
    on_line = ("they lie on the line through the scans that came out positive "
               f"({line[0] * 1e3:.4f} ms per trip + {line[1] * 1e3:.4f} ms), within {line[2] * 1e3:.4f} ms of it"
               if line else "no positive scans to compare them with")
    one = next((p for p in forward if p["trips"] == 1), None)
    single = ("A scan of one trip is compiled without a loop and models the same time as the single product."
              if one and not one["scanned_loops"] and one["scanned_modeled_seconds"] == one["unrolled_modeled_seconds"]
              else "")
    paper_gb = table2_report.paper_figures().get(table2_report.BASELINE, {}).get("memory_4k_gb")
    versions = probe.get("versions", {})
    sources = ", ".join(f"`{os.path.relpath(p, root)}`" for p in [probe_path, *compile_paths])
    return f"""# Modeled TPU step times: whole-second offsets, loops, and the roofline check

<!-- Generated by `{command}`; do not edit by hand. -->

Generated by `{command}` from {sources}.
The probe ran at commit {_commit(probe)} with jax {versions.get('jax', '?')} and libtpu
{versions.get('libtpu', '?')}, compiling for one compile-only device of `{probe['target']}`; nothing ran on a TPU.

The TPU compiler models a step's time without a TPU: `compiled.cost_analysis()["optimal_seconds"]`. The Table 2
panel and `sweep --estimate` used it as the step time. It cannot be read as is, for two reasons this page
shows on steps whose work is known.

## 1. Loops: the body is counted once, and small loops lose a whole second

The probe compiles L products `h <- tanh(h @ w_l)` of {probe['size']} x {probe['size']} float32 matrices, once
unrolled (straight-line code) and once with `lax.scan` (one while loop of L trips), forward and with the gradient.
The unrolled compile has complete counts, so its roofline (max(FLOPs / peak, bytes / HBM bandwidth)) is the least
time of the whole work.

{modeled_loops.format_pairs(pairs)}

- The unrolled modeled times lie at {min(p['unrolled_over_roofline'] for p in pairs):.2f}-{max(p['unrolled_over_roofline'] for p in pairs):.2f}x
  their roofline: on straight-line code the field is a plausible time in seconds (no unit or field is read wrongly).
- A scanned step's counted FLOPs stay those of one product whatever L is (the last column falls as 1/L):
  XLA's counts and libtpu's model take a loop body once. Even with its whole seconds added back, a scanned
  step's modeled time is below the least time of its work for every L > 1.
- {len(off)} of the {len(looped)} forward scans with a loop are negative: the modeled time minus exactly
  {', '.join(sorted({str(p['scanned_whole_seconds_off']) for p in off})) or 'no'} whole second(s); with it added back
  {on_line}. {single}

## 2. Whole-second offsets in full train steps, with and without loops

Of the {counts['rows']} TPU rows in the compile JSONs above, {counts['negative']} have a negative modeled time
({counts['negative_without_loops']} of them in steps without any loop), {counts['positive']} a positive one and
{counts['not_modeled']} none (Mosaic kernels, which the model does not time). For loop-free steps with complete
counts, the positive modeled times lie at {_span(evidence['positive'])} of their roofline; the negative ones,
taken above the next lower whole second, at {_span(evidence['negative_fraction'])}. So a negative time is a
plausible time minus a whole number of seconds, and nothing tells how many seconds a positive figure carries:
an offset up is as possible as the offsets down seen here (Reformer's full-scale Text-4K train step, 32 examples on a v3
core, a step with loops: {reformer_versions(rows)}). The offset is inside libtpu's closed cost model; from
outside it cannot be corrected, only detected.

## 3. What is printed instead

Every modeled time is checked against the roofline of its own step (`lra_jax/research/compilation/roofline.py`): it is
printed only where the step has no loop and no uncounted kernel and
{roofline.BAND[0]:g} x roofline <= modeled <= {roofline.BAND[1]:g} x roofline. Below 1x a time is faster than
the chip can do the counted work; the loop-free positive times above lie within the band with room, and an
offset of a whole second on a step under 0.5 s falls far outside it. Every other variant keeps its roofline and
the reason its modeled time is not printed (`table2_report.load_modeled`, the `table2` and `compile`
commands). The roofline is a lower bound on the time (perfect overlap, XLA's byte count as HBM traffic), so
its speed is the most the chip could reach, labelled as such.

## The Table 2 panel's batch

Table 2 of the LRA paper trains at batch 32 on a 4x4 TPU v3 slice (32 cores) and reports {paper_gb} GB per
device for the Transformer at 4K: more than one example per core would need. Compiled here, 32 per core does
not fit a v3 core's 16 GiB, and 8 per core (256 for the slice) is the nearest to the paper's memory among the
batches that fit, so the committed panel uses 8 per core (`lra_jax/research/compilation/table2_report.py`).
"""


def compile_jsons(results: str) -> list[str]:
    """The compile JSONs of TPU targets committed under `results` (Table 2, full-scale, dropout's cost)."""
    found = sorted(set(glob.glob(os.path.join(results, "table2-tpu-*.json"))
                       + glob.glob(os.path.join(results, "compile-*tpu*.json"))
                       + glob.glob(os.path.join(results, "compile-reformer-*.json"))
                       + glob.glob(os.path.join(results, "modeled-*.json"))))
    if not found:
        raise LraError(f"no TPU compile JSONs under {results}")
    return found


def page(root: str = ".") -> str:
    """The committed page: from the committed probe and every TPU compile JSON under `root`."""
    return render(os.path.join(root, PROBE), compile_jsons(os.path.join(root, "experiments", "results")),
                  "python -m lra_jax.tools.docs", root)
