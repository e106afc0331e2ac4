"""Where a compiled step's time goes: each XLA op timed by jax's profiler, grouped by what it computes.

    share(kind) = (time of the step's ops of that kind) / (time of all its ops)
    matmul rate = (2 x output size x contraction size, summed over the dots) / (time of the ops holding them),
                  per contraction size (a head dimension of 64 streams far more bytes per FLOP than a width of 256)

XLA runs a compiled step as a sequence of top-level ops (fusions, matmuls, copies, ...); the profiler
records each op's execution as an event named after its HLO instruction (on CPU one per thunk).
Each op gets the first kind of `KINDS` that the opcodes inside it (fused computations included) match:

    matmul          a dot or convolution, alone or fused (XLA:CPU's ynn and oneDNN fusions, a GPU's gemms)
    fft             an FFT
    sort            a sort
    gather          gathers, scatters and dynamic slices (the sparse and hashing variants' lookups)
    transcendental  elementwise work or reductions with exp, log, tanh, logistic, sin, cos, power or erf
    elementwise     any other elementwise work or reduction (adds, selects, the dropout hash, maxima)
    data movement   copies, transposes, pads, slices and concatenations without arithmetic
    other           the rest (custom calls that are not matmuls, collectives, random bits)

Loops and calls (while, conditional, call) are not counted themselves: the ops inside them are.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax

KINDS = ("matmul", "fft", "sort", "gather", "transcendental", "elementwise", "data movement", "other")

_MATMUL = {"dot", "convolution"}
_GATHER = {"gather", "scatter", "dynamic-slice", "dynamic-update-slice"}
_TRANSCENDENTAL = {"exponential", "log", "tanh", "logistic", "sine", "cosine", "power", "erf",
                   "exponential-minus-one", "log-plus-one", "atan2", "tan"}
_MOVEMENT = {"copy", "transpose", "bitcast", "reshape", "broadcast", "slice", "concatenate", "pad", "reverse",
             "parameter", "constant", "tuple", "get-tuple-element", "iota", "bitcast-convert", "copy-start",
             "copy-done"}
_CONTROL = {"while", "conditional", "call"}
_OTHER = {"custom-call", "rng", "rng-bit-generator", "rng-get-and-update-state", "all-reduce", "all-gather",
          "reduce-scatter", "all-to-all", "collective-permute", "send", "recv", "infeed", "outfeed",
          "after-all", "partition-id", "replica-id"}

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%(\S+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s*=\s*(.+?)\s+([a-z][a-z0-9-]*)\((.*)$")
_SHAPE = re.compile(r"^[a-z]+[0-9]*\[([0-9,]*)\]")


def _dims(shape: str) -> list[int] | None:
    """[2, 4, 513, 64] of 'f32[2,4,513,64]{3,2,1,0}'; None for a tuple or token."""
    match = _SHAPE.match(shape.strip())
    if match is None:
        return None
    return [int(d) for d in match.group(1).split(",") if d]


def _product(values: list[int]) -> int:
    result = 1
    for v in values:
        result *= v
    return result


class Module:
    """The instructions of an optimized HLO module's text (`compiled.as_text()`): per instruction its
    opcode, the computations it calls and, for dots, the FLOPs."""

    def __init__(self, text: str):
        self.name = re.match(r"HloModule\s+(\S+?),?\s", text).group(1) if text.startswith("HloModule") else None
        self.opcode: dict[str, str] = {}
        self.calls: dict[str, list[str]] = {}
        self.flops: dict[str, float] = {}
        self.contraction: dict[str, int] = {}  # per dot: the size of the contracted dimensions
        self.body: dict[str, list[str]] = {}  # computation -> its instructions
        computation = None
        shapes: dict[str, list[int] | None] = {}
        for line in text.splitlines():
            header = _COMPUTATION.match(line)
            if header and not line.startswith(" "):
                computation, shapes = header.group(1), {}
                self.body[computation] = []
                continue
            instruction = _INSTRUCTION.match(line)
            if instruction is None or computation is None:
                continue
            name, shape, opcode, rest = instruction.groups()
            shapes[name] = _dims(shape)
            self.opcode[name] = opcode
            self.body[computation].append(name)
            self.calls[name] = re.findall(r"(?:calls|to_apply|body|condition|branch_computations)="
                                          r"\{?((?:%[\w.\-]+(?:,\s*)?)+)\}?", rest)
            self.calls[name] = [c.strip().lstrip("%") for group in self.calls[name] for c in group.split(",")]
            if opcode == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', rest)
                if target and re.search(r"matmul|gemm|conv", target.group(1), re.IGNORECASE):
                    self.opcode[name] = "dot"
            if opcode == "dot":
                lhs = re.match(r"%([\w.\-]+)", rest)
                contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
                lhs_dims = shapes.get(lhs.group(1)) if lhs else None
                out_dims = shapes[name]
                if lhs_dims and out_dims is not None and contracting:
                    size = _product([lhs_dims[int(i)] for i in contracting.group(1).split(",") if i])
                    self.flops[name] = 2.0 * _product(out_dims) * size
                    self.contraction[name] = size

    def opcodes(self, name: str) -> set[str]:
        """The opcodes an instruction executes: its own, and those of the computations it fuses."""
        found, stack, seen = {self.opcode.get(name, "")}, [name], set()
        while stack:
            current = stack.pop()
            if self.opcode.get(current) in _CONTROL:
                continue  # a loop's or call's body is timed as ops of its own
            for computation in self.calls.get(current, []):
                if computation in seen:
                    continue
                seen.add(computation)
                for inner in self.body.get(computation, []):
                    found.add(self.opcode[inner])
                    stack.append(inner)
        return found

    def dots(self, name: str) -> list[str]:
        """The dots an instruction executes: itself, or those of the computations it fuses."""
        found, stack, seen = [name] if name in self.flops else [], [name], set()
        while stack:
            current = stack.pop()
            if self.opcode.get(current) in _CONTROL:
                continue
            for computation in self.calls.get(current, []):
                if computation not in seen:
                    seen.add(computation)
                    found += [inner for inner in self.body.get(computation, []) if inner in self.flops]
                    stack += self.body.get(computation, [])
        return found

    def kind(self, name: str) -> str | None:
        """`name`'s entry of `KINDS`; None for a loop or call, whose ops are timed themselves."""
        ops = self.opcodes(name)
        if self.opcode.get(name) in _CONTROL:
            return None
        if ops & _MATMUL:
            return "matmul"
        for kind, members in (("fft", {"fft"}), ("sort", {"sort"}), ("gather", _GATHER)):
            if ops & members:
                return kind
        if ops & _TRANSCENDENTAL:
            return "transcendental"
        if ops <= _MOVEMENT:
            return "data movement"
        if ops & _OTHER and not ops - _OTHER - _MOVEMENT:
            return "other"
        return "elementwise"


def op_seconds(run: Callable[[], Any], module_name: str | None) -> tuple[dict[str, float], float]:
    """(seconds spent in each HLO instruction of module `module_name` while `run()` executes, the
    seconds `run()` took under the profiler). Instructions are named by the profiler's events; the
    events of other modules are left out."""
    with tempfile.TemporaryDirectory() as directory:
        jax.profiler.start_trace(directory)
        try:
            start = time.perf_counter()
            jax.block_until_ready(run())
            wall = time.perf_counter() - start
        finally:
            jax.profiler.stop_trace()
        traces = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
        events = []
        if traces:
            with gzip.open(traces[0], "rt", encoding="utf-8") as f:
                events = json.load(f).get("traceEvents", [])
    seconds: dict[str, float] = {}
    for event in events:
        args = event.get("args") or {}
        if event.get("ph") != "X" or "hlo_op" not in args:
            continue
        if module_name is not None and args.get("hlo_module") not in (module_name, None):
            continue
        seconds[args["hlo_op"]] = seconds.get(args["hlo_op"], 0.0) + event.get("dur", 0.0) * 1e-6
    return seconds, wall


def profile(compiled, run: Callable[[], Any]) -> dict[str, Any]:
    """Where the time of `run()` (one execution of `compiled`) goes: seconds per kind of `KINDS`, the
    seconds of ops the profiler named but the module does not hold ("unmatched"), the wall time of the
    profiled run, and per contraction size of the dots (the
    head dimension, the model width, ...) their FLOPs and the seconds of the ops holding them: FLOPs /
    seconds is the rate that matmuls of that shape reach inside the step."""
    module = Module(compiled.as_text())
    by_op, wall = op_seconds(run, module.name)
    kinds = dict.fromkeys(KINDS, 0.0)
    unmatched = 0.0
    matmuls: dict[str, dict[str, float]] = {}  # by contraction size: FLOPs and seconds
    for name, seconds in by_op.items():
        if name not in module.opcode:
            unmatched += seconds
            continue
        kind = module.kind(name)
        if kind is None:
            continue
        kinds[kind] += seconds
        dots = module.dots(name)
        if dots:
            group = matmuls.setdefault(str(module.contraction[dots[0]]), {"flops": 0.0, "seconds": 0.0})
            group["flops"] += sum(module.flops[d] for d in dots)
            group["seconds"] += seconds
    return {"seconds_by_kind": kinds, "op_seconds": sum(kinds.values()), "unmatched_seconds": unmatched,
            "profiled_wall_seconds": wall, "matmuls_by_contraction": matmuls}
