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

import argparse
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from lra_jax import compat, kernels
from lra_jax.attention import registry
from lra_jax.config import checks as config_errors
from lra_jax.config import paths as config_paths
from lra_jax.config import task_defaults
from lra_jax.errors import LraError
from lra_jax.tools.choices import choose, config_files, config_path

PLATFORMS = ("cuda", "rocm", "tpu", "cpu")
SCALES = ("full", "mini")
# The custom-call targets of the Pallas kernels: Triton on GPU, Mosaic on TPU.
KERNEL_CALLS = {"gpu": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}
TEXT_LONG = 4000  # the LRA paper's second Text length, lowered at full scale besides the config's 1000


def combinations(variants: list[str], tasks: list[str], scale: str) -> list[tuple[str, str, int | None]]:
    """(variant, task, max_len override or None): full-scale Text twice, at 1000 and 4000."""
    rows = []
    for variant in variants:
        for task in tasks:
            rows.append((variant, task, None))
            if task == "text" and scale == "full":
                rows.append((variant, task, TEXT_LONG))
    return rows


def abstract_steps(config, platform: str) -> tuple[list[tuple[Any, tuple]], list[dict[str, Any]]]:
    """([(jitted train step, abstract (state, batch)), (eval step, (state, batch))], the attention
    layers' kernels) for `platform`."""
    from lra_jax.attention import registry
    from lra_jax.data import tasks
    from lra_jax.models.classifier import build_model
    from lra_jax.training import optimizer, steps

    task = tasks.get_task(config.task)
    with kernels.target_platform(platform):
        model = nnx.eval_shape(lambda: build_model(config, vocab_size=task.vocab_size, num_classes=task.num_classes,
                                                   rngs=nnx.Rngs(0), dual=task.dual))
    layer_kernels = registry.layer_kernels(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optimizer.make_optimizer(config)
    state = dict(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, rest=rest,
                 opt_state=jax.eval_shape(tx.init, params))

    def batch_of(size: int) -> dict[str, jax.ShapeDtypeStruct]:
        shape = (size, 2, config.max_len) if task.dual else (size, config.max_len)
        return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32), "label": jax.ShapeDtypeStruct((size,), jnp.int32)}

    batch, size = batch_of(config.batch_size), steps.eval_batch_size(config)
    eval_batch = {**batch_of(size), "weight": jax.ShapeDtypeStruct((size,), jnp.float32)}
    train_step = steps.make_train_step(graphdef, tx, jax.random.key(0), accum_steps=config.get("grad_accum_steps", 1))
    return [(train_step, (state, batch)),
            (steps.make_eval_step(graphdef), (state, eval_batch))], layer_kernels


def lower_one(config, platform: str) -> tuple[str, str]:
    """(the kernels of the attention layers, "ok" or the error's first line) for one lowering."""
    target = kernels.platform_of(platform)
    layer_kernels = []
    try:
        steps, layer_kernels = abstract_steps(config, platform)
        for (step, args), mode in zip(steps, ("train", "eval")):
            text = lowered_text(step, platform, *args)
            planned = [entry[mode] for entry in layer_kernels if entry[mode] != kernels.XLA]
            if planned and KERNEL_CALLS.get(target, "\0") not in text:
                return describe(layer_kernels), f"error: {planned[0]} planned but not in the lowered {mode} step"
        return describe(layer_kernels), "ok"
    except Exception as error:  # noqa: BLE001 - one row per failure, the others go on
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return describe(layer_kernels), f"error: {type(error).__name__}: {first[:300]}"


def lowered_text(fn, platform: str, *args) -> str:
    """The StableHLO text of `fn(*args)` lowered for `platform` (a GPU: for `compat.DEFAULT_GPU_KIND`).
    Export's refusal to serialize the kernels' custom calls is disabled: only the lowering matters."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(call) for call in KERNEL_CALLS.values()]
    with compat.lowering_target(platform):
        return jax.export.export(fn, platforms=[platform], disabled_checks=checks)(*args).mlir_module()


def describe(layer_kernels: list[dict[str, Any]]) -> str:
    """"layer=kernel" per attention layer of the train step, with the reason for an XLA fallback."""
    parts = []
    for entry in layer_kernels:
        part = f"{entry['layer']}={entry['train']}"
        if entry["reason"] and entry["train"] == kernels.XLA:
            part += f" ({entry['reason']})"
        if entry["eval"] != entry["train"]:
            part += f", eval {entry['eval']}"
        parts.append(part)
    return "; ".join(parts) or "-"


def load_config(path: str, task: str, scale: str, max_len: int | None = None,
                attention_dropout_rate: float | None = None):
    """The config `<path>:<task>,<scale>`, with max_len and the attention dropout overridden where given."""
    config = config_paths.load(f"{config_path(path)}:{task},{scale}")
    if max_len is not None:
        config.max_len = max_len
    if attention_dropout_rate is not None:
        config.model.attention_dropout_rate = attention_dropout_rate
    return config


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lra_jax.tools.lower", description=__doc__.splitlines()[0])
    parser.add_argument("--platforms", default="cuda,tpu", help="comma-separated: cuda, rocm, tpu, cpu")
    parser.add_argument("--variants", default="all", help="'all' or comma-separated attention names")
    parser.add_argument("--tasks", default="all", help="'all' or comma-separated LRA tasks")
    parser.add_argument("--scale", default="full", help="full | mini")
    parser.add_argument("--attention_dropout_rate", type=float, default=None,
                        help="override config.model.attention_dropout_rate (0: the kernels in the train step too)")
    args, args.overrides = parser.parse_known_args(argv)  # --config.KEY=VALUE (config_errors.apply_overrides)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        platforms = choose(args.platforms, list(PLATFORMS), "platform")
        files = config_files()
        variants = choose(args.variants, sorted(files), "variant")
        tasks = choose(args.tasks, list(task_defaults.TASKS), "task")
        if args.scale not in SCALES:
            raise LraError(f"unknown scale {args.scale!r}; choose full or mini")
        config_errors.check_override_form(args.overrides)
        matrix = []
        for variant, task, max_len in combinations(variants, tasks, args.scale):
            config = load_config(files[variant], task, args.scale, max_len, args.attention_dropout_rate)
            config = config_errors.apply_overrides(config, args.overrides, variant)
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
