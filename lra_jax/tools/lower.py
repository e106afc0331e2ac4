"""Lowers every train step for the accelerators from any machine: `python -m lra_jax.tools.lower`.

    python -m lra_jax.tools.lower --platforms=cuda,tpu --variants=all --tasks=all --scale=full

For each (variant, task, scale, platform) the whole jitted train step (forward,
backward, optimizer update) of the config `configs/<variant>.py:<task>,<scale>`,
and its evaluation step, are lowered with `jax.export` for that platform, with the attention kernels chosen
for the target platform, not for the machine running the command
(`lra_jax.kernels.target_platform`): `auto` and `pallas` mean Triton for cuda and
splash attention (Mosaic) for tpu. The state and batch are abstract
(`jax.ShapeDtypeStruct`), so nothing full-size is allocated here. Full scale means
the real LRA shapes in the config's dtype: ListOps 2000, Text 1000 and 4000,
Retrieval 2 x 4000, Image 1024, Pathfinder 1024, Path-X 16384.

Prints one row per combination: variant, task, platform, the kernel each
attention layer lowered to in the train step (and in the evaluation step where it
differs: splash attention has no attention dropout, so on TPU a config with
attention dropout trains softmax on our Mosaic kernel (pallas-mosaic-flash) and
the block-sparse variants on it over their block layout (pallas-mosaic-block-sparse),
and evaluates with splash; the
Triton kernels apply it) (checked against the lowered module: a Pallas kernel
must appear in it as its custom call) and ok or the error's first line. Exits 1
if any row fails, 2 on bad input. Train's `--config.KEY=VALUE` flags after the others set
that field of every config (e.g. `--config.attention.mode=factorized_random` for synthesizer).
"""

from __future__ import annotations

import sys
import time

import jax
from absl import flags

from lra_jax.config import checks as config_errors
from lra_jax.data.tasks import TASKS
from lra_jax.errors import LraError
from lra_jax.research.choices import choose, config_files
from lra_jax.research.compilation.lowering import (
    PLATFORMS,
    SCALES,
    combinations,
    load_config,
    lower_one,
)
from lra_jax.tools import parse_command_line


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("platforms", "cuda,tpu", "comma-separated: cuda, rocm, tpu, cpu", flag_values=values)
    flags.DEFINE_string("variants", "all", "'all' or comma-separated attention names", flag_values=values)
    flags.DEFINE_string("tasks", "all", "'all' or comma-separated LRA tasks", flag_values=values)
    flags.DEFINE_string("scale", "full", "full | mini", flag_values=values)
    flags.DEFINE_float("attention_dropout_rate", None,
                       "override config.model.attention_dropout_rate (0: the kernels in the train step too)",
                       flag_values=values)


def parse(argv: list[str] | None = None) -> tuple[flags.FlagValues, list[str]]:
    """The flags and the `--config.KEY=VALUE` overrides after them (config_errors.apply_overrides)."""
    return parse_command_line("lra_jax.tools.lower", __doc__, define_flags, argv,
                              positionals="[--config.KEY=VALUE ...]", pass_unknown=True)


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse(argv)
    try:
        platforms = choose(args.platforms, list(PLATFORMS), "platform")
        files = config_files()
        variants = choose(args.variants, sorted(files), "variant")
        tasks = choose(args.tasks, list(TASKS), "task")
        if args.scale not in SCALES:
            raise LraError(f"unknown scale {args.scale!r}; choose full or mini")
        config_errors.check_override_form(overrides)
        matrix = []
        for variant, task, max_len in combinations(variants, tasks, args.scale):
            config = load_config(files[variant], task, args.scale, max_len, args.attention_dropout_rate)
            config = config_errors.apply_overrides(config, overrides, variant)
            matrix.append((variant, f"{task}:{config.max_len}" if max_len else task, config))
    except LraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    start, failures, count = time.perf_counter(), 0, 0
    print(f"{'variant':<17}{'task':<15}{'platform':<9}{'result':<7}attention kernels")
    for variant, label, config in matrix:
        for platform in platforms:
            kernel_text, result = lower_one(config, platform)
            count += 1
            failures += result != "ok"
            status = "ok" if result == "ok" else "FAIL"
            print(f"{variant:<17}{label:<15}{platform:<9}{status:<7}{kernel_text}"
                  + ("" if result == "ok" else f"\n    {result}"), flush=True)
    seconds = time.perf_counter() - start
    print(f"{count - failures}/{count} lowered ({args.scale} scale) in {seconds:.0f} s on "
          f"{jax.devices()[0].device_kind}" + (f"; {failures} failed" if failures else ""))
    return 1 if failures else 0


def cli() -> None:
    """The command (`python -m lra_jax.tools.lower`, `lra-lower`)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
