"""What the TPU compiler's modeled step time (`cost_analysis()["optimal_seconds"]`) does with loops,
probed on steps whose true work is known: L products h <- tanh(h @ w_l) of [n, n] float32 matrices.

Each case is compiled twice for one compile-only device of a TPU target, the L products unrolled
(straight-line code, no loop) and scanned (`lax.scan`, one while loop of L trips), forward only and
with the gradient of the sum. Per compile it records libtpu's modeled time, XLA's FLOP and byte
counts, the while loops in the compiled module and the roofline of the counts
(`compile_step.roofline_seconds`). The unrolled compile is the reference: its counts are complete,
so its roofline is the least time of the whole work. The command is `python -m lra_jax.tools.cost_probe`;
`format_doc` writes the page that explains the findings from its JSON (docs/tpu-modeled-time.md).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lra_jax.research.compilation import compile_step, roofline

TRIPS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)
GRAD_TRIPS = (2, 4, 8)
SIZE = 4096


@dataclasses.dataclass
class Compiled:
    """One probe compile: libtpu's modeled time, XLA's counts, the loops, the roofline of the counts."""

    trips: int
    layout: str  # "unrolled" | "scanned"
    grad: bool
    modeled_seconds: float | None
    flops: float | None
    bytes_accessed: float | None
    loops: int
    roofline_seconds: float | None
    compile_seconds: float


def products(layout: str, grad: bool):
    """f(h [n, n], w [L, n, n]) -> sum of h after L steps h <- tanh(h @ w_l) (or its gradient in w)."""

    def forward(h, w):
        if layout == "scanned":
            h, _ = jax.lax.scan(lambda h, w_l: (jnp.tanh(h @ w_l), None), h, w)
        else:
            for l in range(w.shape[0]):
                h = jnp.tanh(h @ w[l])
        return h.sum()

    return jax.grad(forward, argnums=1) if grad else forward


def compile_case(target, trips: int, layout: str, grad: bool, size: int = SIZE) -> Compiled:
    """Compiles one case for the first device of `target` (a TPU target of `lra_jax.measure.accelerators`)."""
    sharding = NamedSharding(Mesh(list(target.devices[:1]), ("data",)), PartitionSpec())
    h = jax.ShapeDtypeStruct((size, size), jnp.float32, sharding=sharding)
    w = jax.ShapeDtypeStruct((trips, size, size), jnp.float32, sharding=sharding)
    started = time.perf_counter()
    with compile_step.without_compilation_cache():
        compiled = jax.jit(products(layout, grad)).lower(h, w).compile()
    seconds = time.perf_counter() - started
    cost = compile_step.cost_of(compiled)
    flops, moved = cost.get("flops"), cost.get("bytes accessed")
    modeled = cost.get("optimal_seconds")
    return Compiled(trips, layout, grad, None if modeled is None else float(modeled), flops, moved,
                    compile_step.loops_in(compiled.as_text()),
                    compile_step.roofline_seconds(flops, moved, target.chip) if flops and moved else None, seconds)


def probe(target, trips=TRIPS, grad_trips=GRAD_TRIPS, size: int = SIZE, log=print) -> list[Compiled]:
    """Every case: forward at `trips`, gradient at `grad_trips`, each unrolled and scanned."""
    cases = [(t, False) for t in trips] + [(t, True) for t in grad_trips]
    results = []
    for t, grad in cases:
        for layout in ("unrolled", "scanned"):
            result = compile_case(target, t, layout, grad, size)
            log(f"{'grad' if grad else 'fwd':>4} L={t:<3} {layout:<8} modeled {result.modeled_seconds:+.6f} s, "
                f"roofline {result.roofline_seconds or 0:.6f} s, {result.loops} loop(s), {result.compile_seconds:.1f} s")
            results.append(result)
    return results


def pairs(results: list[Compiled]) -> list[dict[str, Any]]:
    """Per (trips, grad): the unrolled and scanned compiles side by side: the whole seconds the scanned
    modeled time lies below zero, that time with them added back ("corrected") and its ratio to the
    unrolled roofline (the least time of the whole work)."""
    by_key = {(r.trips, r.grad, r.layout): r for r in results}
    rows = []
    for (trips, grad, layout), unrolled in by_key.items():
        scanned = by_key.get((trips, grad, "scanned"))
        if layout != "unrolled" or scanned is None:
            continue
        reference = unrolled.roofline_seconds
        offset = None if scanned.modeled_seconds is None else roofline.whole_seconds_below(scanned.modeled_seconds)
        corrected = None if offset is None else scanned.modeled_seconds + offset
        rows.append({
            "trips": trips, "grad": grad,
            "unrolled_modeled_seconds": unrolled.modeled_seconds, "unrolled_roofline_seconds": reference,
            "unrolled_flops": unrolled.flops, "scanned_flops": scanned.flops, "scanned_loops": scanned.loops,
            "scanned_modeled_seconds": scanned.modeled_seconds, "scanned_whole_seconds_off": offset,
            "scanned_corrected_seconds": corrected,
            "scanned_corrected_over_roofline": corrected / reference if corrected and reference else None,
            "unrolled_over_roofline": (unrolled.modeled_seconds / reference
                                       if unrolled.modeled_seconds and reference else None)})
    return rows


def document(target_name: str, results: list[Compiled], size: int, provenance: dict[str, Any]) -> dict[str, Any]:
    """The probe's JSON: provenance, every compile, the unrolled-scanned pairs."""
    return {**provenance, "target": target_name, "size": size,
            "note": "f32 products h <- tanh(h @ w_l) of [size, size] matrices, L = trips; modeled_seconds: "
                    "libtpu's cost_analysis()['optimal_seconds'], roofline_seconds: max(flops / peak, "
                    "bytes / HBM bandwidth) of XLA's counts of that compile; nothing ran on a TPU",
            "compiles": [dataclasses.asdict(r) for r in results], "pairs": pairs(results)}


def _seconds(value: float | None, fmt: str = "+.6f") -> str:
    return "-" if value is None else format(value, fmt)


def format_pairs(pairs_: list[dict[str, Any]]) -> str:
    """A Markdown table of the unrolled-scanned pairs."""
    lines = ["| step | L | unrolled: modeled s | unrolled: roofline s | unrolled modeled / roofline "
             "| scanned: modeled s | whole s below 0 | scanned + those s | / unrolled roofline "
             "| FLOPs counted, scanned / unrolled |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for p in pairs_:
        counted = p["scanned_flops"] / p["unrolled_flops"] if p["scanned_flops"] and p["unrolled_flops"] else None
        lines.append(f"| {'gradient' if p['grad'] else 'forward'} | {p['trips']} "
                     f"| {_seconds(p['unrolled_modeled_seconds'])} | {_seconds(p['unrolled_roofline_seconds'], '.6f')} "
                     f"| {_seconds(p['unrolled_over_roofline'], '.2f')} | {_seconds(p['scanned_modeled_seconds'])} "
                     f"| {_seconds(p['scanned_whole_seconds_off'], 'd')} | {_seconds(p['scanned_corrected_seconds'])} "
                     f"| {_seconds(p['scanned_corrected_over_roofline'], '.2f')} | {_seconds(counted, '.3f')} |")
    return "\n".join(lines)
