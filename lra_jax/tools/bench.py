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

import importlib
import signal
import sys
from typing import Any

from absl import flags, logging

from lra_jax.attention import registry
from lra_jax.errors import LraError
from lra_jax.research.benchmarks.bench_cells import PROTOCOL, benchmark, probe_device, run_cell
from lra_jax.research.benchmarks.bench_report import profile_table, read_reports, summary
from lra_jax.research.choices import parse_lengths
from lra_jax.tools import command_arguments, parse_command_line


KERNELS_FLAG = ("--kernels", "--kernels=true", "--kernels=True")

def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("variants", "all", "'all' or a comma list of registry names.", flag_values=values)
    flags.DEFINE_list("lengths", ["1024", "2048", "3072", "4096"], "Sequence lengths.", flag_values=values)
    flags.DEFINE_integer("batch_size", 32, "Examples per step (Table 2: 32).", flag_values=values)
    flags.DEFINE_integer("steps", 5, "Timed steps after warm-up (at least 5).", flag_values=values)
    flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.", flag_values=values)
    flags.DEFINE_string("out", None, "Output JSON (default experiments/results/bench-<device>-<date>.json).",
                        flag_values=values)
    flags.DEFINE_bool("update", False, "Merge into an existing --out: the cells measured now replace or join "
                      "its cells (a new variant, a re-measured one); device and settings must match, "
                      "except that --steps may be larger than the file's (a more precise re-measure).",
                      flag_values=values)
    flags.DEFINE_list("dropout_rates", ["0.1"], "Dropout rates (residual, MLP and attention alike; Table 2: 0.1). "
                      "Several, e.g. 0,0.1, measure each (variant, length) at every rate one after another, "
                      "so the cost of dropout is read side by side under the same load.", flag_values=values)
    flags.DEFINE_bool("huge_pages", True, "Cells run with glibc's malloc backing large buffers by transparent huge "
                      "pages (lra_jax/measure/host_memory.py): on CPU, XLA writes a step's temporaries into fresh memory every "
                      "step, and each 4 KiB page of it faults; huge pages fault once per 2 MiB.", flag_values=values)
    flags.DEFINE_bool("keep_host_memory", True, "Cells run with glibc's malloc keeping freed memory mapped "
                      "(lra_jax/measure/host_memory.py), so a step reuses the last step's temporaries instead of faulting "
                      "fresh pages in.", flag_values=values)
    flags.DEFINE_bool("profile", False, "After the timed steps, run one more step of each rate under jax's profiler "
                      "and record where its time goes: matmuls (and the rate they reach, by contraction size), "
                      "transcendentals, other elementwise work, data movement, sorts, gathers, FFTs "
                      "(lra_jax/measure/step_profile.py). The timed steps are not profiled.", flag_values=values)
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Model compute dtype.", flag_values=values)
    flags.DEFINE_enum("impl", "auto", ["auto", "xla", "pallas"], "Attention implementation of every variant "
                      "(config.attention.impl): 'auto' is the Pallas kernel on GPU/TPU where a variant has one; "
                      "'xla' measures what the kernels buy.", flag_values=values)
    flags.DEFINE_bool("scan_layers", False, "Layers in one lax.scan (config.model.scan_layers).", flag_values=values)
    flags.DEFINE_bool("remat", False, "Recompute layers in the backward pass (config.model.remat).", flag_values=values)
    flags.DEFINE_integer("seed", 0, "Seed of the random tokens and the parameters.", flag_values=values)
    flags.DEFINE_integer("num_layers", PROTOCOL["num_layers"], "Model depth; change only for smoke tests.",
                         flag_values=values)
    flags.DEFINE_integer("num_heads", PROTOCOL["num_heads"], "Attention heads; change only for smoke tests.",
                         flag_values=values)
    flags.DEFINE_integer("emb_dim", PROTOCOL["emb_dim"], "Model width; change only for smoke tests.",
                         flag_values=values)
    flags.DEFINE_integer("mlp_dim", PROTOCOL["mlp_dim"], "MLP width; change only for smoke tests.", flag_values=values)
    flags.DEFINE_float("cell_timeout", 1800, "Seconds one (variant, length) cell may take, start-up and "
                       "compilation included; past it its process is killed and the cell recorded as 'timeout'.",
                       flag_values=values)
    flags.DEFINE_string("cell", None, "Internal: one cell as JSON {variant, length, settings}; measures it "
                        "in this process and prints its result as JSON (the bench runs every cell this way).",
                        flag_values=values)
    flags.DEFINE_list("report", None, "Measure nothing: print the dropout-cost and utilisation summary "
                      "(`summary`) of these bench JSONs, e.g. one per length.", flag_values=values)
    flags.DEFINE_bool("kernels", False, "Run the kernel benchmark (lra_jax.tools.kernel_bench) instead; "
                      "the other arguments go to it.", flag_values=values)

def resolve_variants(spec: str) -> list[str]:
    known = registry.names()
    if spec.strip() == "all":
        return known
    variants = [v.strip() for v in spec.split(",") if v.strip()]
    for v in variants:
        registry.get(v)  # an unknown name raises ConfigError listing the known ones
    return variants

def parse_rates(values: list[str]) -> list[float]:
    try:
        rates = [float(v) for v in values]
    except ValueError as error:
        raise LraError(f"--dropout_rates must be numbers, got {','.join(values)}") from error
    if not rates or not all(0 <= r < 1 for r in rates) or len(set(rates)) < len(rates):
        raise LraError("--dropout_rates must be distinct numbers in [0, 1), e.g. --dropout_rates=0,0.1")
    return rates


def main(argv: list[str] | None = None) -> None:
    argv = command_arguments(argv)
    if any(a in KERNELS_FLAG for a in argv):  # the kernel benchmark's own flags follow: it parses them
        run_kernels([a for a in argv if a not in KERNELS_FLAG])
        return
    args, _ = parse_command_line("lra_jax.tools.bench", __doc__, define_flags, argv)
    logging.set_verbosity(logging.WARNING)
    if args.cell is not None:
        run_cell(args.cell)
        return
    if args.report:
        try:
            results = read_reports(args.report)
            profiles = profile_table(results)
            print(summary(results) + (f"\n\nwhere the profiled steps' time goes\n{profiles}" if profiles else ""))
        except LraError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        return
    try:
        if args.steps < 5:
            raise LraError(f"--steps must be at least 5 (got {args.steps}); a shorter timing is noise")
        if args.cell_timeout <= 0:
            raise LraError(f"--cell_timeout must be a positive number of seconds (got {args.cell_timeout})")
        variants = resolve_variants(args.variants)
        lengths = parse_lengths(args.lengths)
        rates = parse_rates(args.dropout_rates)
        device = probe_device()
        if args.batch_size % device["count"]:
            raise LraError(f"--batch_size={args.batch_size} is not divisible by the {device['count']} devices")
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    names = ("batch_size", "steps", "warmup", "dtype", "impl", "scan_layers", "remat", "seed", "huge_pages", "keep_host_memory",
             *PROTOCOL)
    settings = {name: args[name].value for name in names}
    settings["dropout_rates"] = rates
    if args.profile:
        settings["profile"] = True
    settings["protocol"] = all(settings[k] == v for k, v in PROTOCOL.items())
    print(f"bench: {len(variants)} variants x {len(lengths)} lengths on {device['count']} x {device['kind']}, "
          "each cell in its own process", flush=True)
    end_on_sigterm()
    try:
        benchmark(variants, lengths, settings, args.out, device=device, cell_timeout=args.cell_timeout,
                  update=args.update)
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


def run_kernels(argv: list[str]) -> None:
    """Hands `argv` (the arguments without --kernels) to lra_jax.tools.kernel_bench.main."""
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
    main()


if __name__ == "__main__":
    cli()
