"""Abstract train and eval steps of a config, lowered for an accelerator from any machine (the library
of `python -m lra_jax.tools.lower`, also used by `compile`).

The state and batch are abstract (`jax.ShapeDtypeStruct`), so nothing full-size is allocated; the
attention kernels are chosen for the target platform (`lra_jax.kernels.target_platform`), not the
machine running the code. A Pallas kernel a layer planned must appear in the lowered module as its
custom call (`KERNEL_CALLS`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from lra_jax import compat, kernels
from lra_jax.attention import registry
from lra_jax.config import paths as config_paths
from lra_jax.config import settings as config_settings
from lra_jax.data import tasks
from lra_jax.models.classifier import build_model
from lra_jax.research.choices import config_path
from lra_jax.training import optimizer, steps
from lra_jax.training.train_state import TrainState

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
    layers' kernels) for `platform`; `config` a ConfigDict, read here into Settings."""
    config = config_settings.from_config(config)
    task = tasks.get_task(config.task)
    with kernels.target_platform(platform):
        model = nnx.eval_shape(lambda: build_model(config, vocab_size=task.vocab_size, num_classes=task.num_classes,
                                                   rngs=nnx.Rngs(0), dual=task.dual))
    layer_kernels = registry.layer_kernels(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optimizer.make_optimizer(config.optimizer)
    state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, rest=rest,
                       opt_state=jax.eval_shape(tx.init, params))

    def batch_of(size: int) -> dict[str, jax.ShapeDtypeStruct]:
        shape = (size, 2, config.max_len) if task.dual else (size, config.max_len)
        return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32), "label": jax.ShapeDtypeStruct((size,), jnp.int32)}

    batch, size = batch_of(config.batch_size), config.eval_batch_size
    eval_batch = {**batch_of(size), "weight": jax.ShapeDtypeStruct((size,), jnp.float32)}
    train_step = steps.make_train_step(graphdef, tx, jax.random.key(0), accum_steps=config.grad_accum_steps)
    return [(train_step, (state, batch)),
            (steps.make_eval_step(graphdef), (state, eval_batch))], layer_kernels


def lower_one(config, platform: str) -> tuple[str, str]:
    """(the kernels of the attention layers, "ok" or the error's first line) for one lowering."""
    target = kernels.platform_of(platform)
    layer_kernels = []
    try:
        built, layer_kernels = abstract_steps(config, platform)
        for (step, args), mode in zip(built, ("train", "eval")):
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
