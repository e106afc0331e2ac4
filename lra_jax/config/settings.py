"""The config boundary: a ConfigDict is read here, once, into typed frozen `Settings`, each value checked.

`from_config(config)` returns `Settings` with its parts typed for their users: `model`
(`models.classifier.ModelSettings`) for the model builder, `data` (`data.tasks.DataSettings`) for the
task loaders, `optimizer` (`OptimizerSettings`) for the optimizer. The entry points (`lra_jax.train`,
the tools, the research layer) call it once and pass only Settings down: the training loop, the
optimizer and the step timing take nothing else. A bad value is a ConfigError of one line naming the key, the value and the valid range,
raised before anything is built, compiled or generated. A setting added after runs were recorded
reads as `task_defaults.OPTIONAL` says when a config lacks it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from collections.abc import Iterator, Mapping
from typing import Any

import ml_collections

from lra_jax.attention import registry
from lra_jax.attention.core import causal_forms
from lra_jax.config.task_defaults import OPTIONAL
from lra_jax.data.tasks import TASKS, DataSettings
from lra_jax.errors import ConfigError
from lra_jax.models.heads import POOLINGS
from lra_jax.models.model_settings import DTYPES, POSITIONS, ModelSettings

SCHEDULES = ("rsqrt", "cosine")
OBJECTIVES = ("none", "masked", "causal")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """`config.optimizer`, typed; `total_steps` (num_train_steps) is the cosine schedule's length;
    `ssm_max_learning_rate` is set only by configs with state-space parameters (configs/s4d.py)."""

    schedule: str
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    b1: float
    b2: float
    eps: float
    grad_clip_norm: float
    skip_nonfinite_updates: int
    total_steps: int
    ssm_max_learning_rate: float | None = None


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """`config.pretrain`, typed: the self-pretraining stage (`lra_jax.training.pretrain`). objective
    "none" trains from scratch; learning_rate 0 means the fine-tuning optimizer's peak rate."""

    objective: str
    num_steps: int
    mask_rate: float
    learning_rate: float
    warmup_steps: int


@dataclasses.dataclass(frozen=True)
class AttentionSettings(Mapping):
    """`config.attention`, typed: a registered variant's `name` and the keyword settings its constructor
    takes (a variant's keyword arguments are its settings; `registry.check_settings` refuses any other).
    Reads as the mapping {"name": name, **settings} that `registry.build` is given."""

    name: str
    settings: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.name if key == "name" else self.settings[key]

    def __iter__(self) -> Iterator[str]:
        yield "name"
        yield from self.settings

    def __len__(self) -> int:
        return 1 + len(self.settings)


@dataclasses.dataclass(frozen=True)
class Settings:
    """A run's settings. `record` is the config as JSON, as config.json and results.json keep it."""

    task: str
    scale: str
    seed: int
    max_len: int
    batch_size: int
    num_train_steps: int
    eval_every: int
    checkpoint_every: int
    log_every: int
    val_examples: int
    grad_accum_steps: int
    keep_checkpoints: int
    model: ModelSettings
    optimizer: OptimizerSettings
    data: DataSettings
    attention: AttentionSettings
    pretrain: PretrainSettings
    record: dict[str, Any]

    @property
    def variant(self) -> str:
        return self.attention.name

    @property
    def eval_batch_size(self) -> int:
        """Examples per evaluation step: the train step's micro-batch, batch_size / grad_accum_steps. A run
        that accumulates because its batch does not fit a device then also evaluates within it (an eval
        step keeps no activations for a backward pass, so it needs less than a train micro-step)."""
        return self.batch_size // self.grad_accum_steps

    @property
    def pretrain_optimizer(self) -> OptimizerSettings:
        """The pretraining stage's optimizer: the fine-tuning one over pretrain.num_steps, with the
        stage's own peak rate (when set) and warm-up."""
        p = self.pretrain
        return dataclasses.replace(self.optimizer, learning_rate=p.learning_rate or self.optimizer.learning_rate,
                                   warmup_steps=p.warmup_steps, total_steps=max(p.num_steps, 1))


def _require(key: str, value: Any, ok: bool, valid: str) -> None:
    """ConfigError naming `--config.key=value` and the valid range when not `ok`."""
    if not ok:
        raise ConfigError(f"--config.{key}={value!r} is out of range: it must be {valid}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(key: str, value: Any, low: int) -> None:
    _require(key, value, _whole(value) and value >= low, f"an integer >= {low}")


def _rate(key: str, value: Any) -> None:
    _require(key, value, _number(value) and 0 <= value < 1, "in [0, 1)")


def _one_of(key: str, value: Any, choices) -> None:
    _require(key, value, value in choices, f"one of {', '.join(map(str, choices))}")


def _optional(config: ml_collections.ConfigDict, dotted: str) -> Any:
    node, _, key = dotted.rpartition(".")
    section = config[node] if node else config
    return section[key] if key in section else OPTIONAL[dotted]


def _section(config: ml_collections.ConfigDict, name: str) -> dict[str, Any]:
    return config[name].to_dict() if name in config else {}


def _defaults(name: str) -> dict[str, Any]:
    """Section `name`'s OPTIONAL values, by key (a config recorded before the section existed reads as these)."""
    return {key.partition(".")[2]: value for key, value in OPTIONAL.items() if key.startswith(f"{name}.")}


def _typed(kind: type, name: str, values: dict[str, Any]):
    """`kind(**values)`; a key it does not know, or one it needs and lacks, is one line."""
    fields = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"unknown config key --config.{name}.{unknown[0]} (keys of {name}: {', '.join(sorted(fields))})")
    try:
        return kind(**values)
    except TypeError as error:
        raise ConfigError(f"config.{name} is incomplete ({error}); start the config from "
                          "lra_jax.config.task_defaults.get_config") from None


def from_config(config: ml_collections.ConfigDict) -> Settings:
    """The checked, typed settings of `config`; ConfigError (one line) for the first bad value."""
    config = config.copy_and_resolve_references()
    settings = Settings(
        task=config.task, scale=config.get("scale", ""), seed=config.seed, max_len=config.max_len,
        batch_size=config.batch_size, num_train_steps=config.num_train_steps, eval_every=config.eval_every,
        checkpoint_every=config.checkpoint_every, log_every=config.log_every,
        val_examples=_optional(config, "val_examples"), grad_accum_steps=_optional(config, "grad_accum_steps"),
        keep_checkpoints=_optional(config, "keep_checkpoints"),
        model=_typed(ModelSettings, "model", _section(config, "model")),
        optimizer=optimizer_from_config(config),
        data=_typed(DataSettings, "data", _section(config, "data")),
        attention=_attention(_section(config, "attention")),
        record=_record(config),
        pretrain=_typed(PretrainSettings, "pretrain", {**_defaults("pretrain"), **_section(config, "pretrain")}),
    )
    check(settings)
    return settings


def _attention(section: dict[str, Any]) -> AttentionSettings:
    """The attention section, typed; ConfigError for a missing or unknown variant or a setting it lacks."""
    name = section.pop("name", None)
    _require("attention.name", name, isinstance(name, str), "a variant's name")
    registry.check_settings(name, section)
    return AttentionSettings(name, types.MappingProxyType(section))


def _record(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return json.loads(config.to_json())


def optimizer_from_config(config: ml_collections.ConfigDict) -> OptimizerSettings:
    """The checked optimizer settings of `config`: its `optimizer` section and `num_train_steps`, all
    the optimizer reads (a config of only those is enough)."""
    optimizer = _section(config, "optimizer")
    optimizer.setdefault("skip_nonfinite_updates", OPTIONAL["optimizer.skip_nonfinite_updates"])
    settings = _typed(OptimizerSettings, "optimizer", {**optimizer, "total_steps": config.num_train_steps})
    _at_least("num_train_steps", settings.total_steps, 1)
    check_optimizer(settings)
    return settings


def check(s: Settings) -> None:
    """ConfigError (one line) for the first value out of its range."""
    _one_of("task", s.task, TASKS)
    _require("seed", s.seed, _whole(s.seed) and 0 <= s.seed < 2**32, "an integer from 0 to 2**32 - 1")
    for key in ("max_len", "batch_size", "num_train_steps", "eval_every", "checkpoint_every", "log_every",
                "grad_accum_steps", "keep_checkpoints"):
        _at_least(key, getattr(s, key), 1)
    _at_least("val_examples", s.val_examples, 0)
    check_optimizer(s.optimizer)
    m = s.model
    for key in ("num_layers", "num_heads", "emb_dim"):
        _at_least(f"model.{key}", getattr(m, key), 1)
    _at_least("model.mlp_dim", m.mlp_dim, 0)
    _require("model.num_heads", m.num_heads, m.emb_dim % m.num_heads == 0,
             f"a divisor of model.emb_dim={m.emb_dim} (each head takes emb_dim / num_heads channels)")
    _rate("model.dropout_rate", m.dropout_rate)
    _rate("model.attention_dropout_rate", m.attention_dropout_rate)
    _one_of("model.positions", m.positions, POSITIONS)
    _one_of("model.pooling", m.pooling, POOLINGS)
    _require("model.pooling", m.pooling, m.pooling != "cls" or m.cls_token,
             "mean or max without a CLS token (or set --config.model.cls_token=True)")
    _one_of("model.dtype", m.dtype, tuple(DTYPES))
    _at_least("data.downsample", s.data.downsample, 1)
    # The CLS token goes in front, where a causal layer lets it see only itself.
    _require("model.pooling", m.pooling, m.pooling != "cls" or not causal_layers(s),
             "mean or max with causal layers, whose CLS token in front sees only itself "
             "(set --config.model.pooling=mean --config.model.cls_token=False)")
    check_pretrain(s)


def check_pretrain(s: Settings) -> None:
    """ConfigError (one line) for the first pretraining value out of its range."""
    p = s.pretrain
    _one_of("pretrain.objective", p.objective, OBJECTIVES)
    _at_least("pretrain.num_steps", p.num_steps, 0 if p.objective == "none" else 1)
    _require("pretrain.mask_rate", p.mask_rate, _number(p.mask_rate) and 0 < p.mask_rate < 1, "in (0, 1)")
    _require("pretrain.learning_rate", p.learning_rate, _number(p.learning_rate) and p.learning_rate >= 0,
             ">= 0 (0: the fine-tuning rate)")
    _at_least("pretrain.warmup_steps", p.warmup_steps, 0)
    # Next-token prediction needs every layer causal (docs/self-pretraining.md).
    forms = causal_forms()
    _require("pretrain.objective", p.objective, p.objective != "causal" or causal_layers(s),
             "masked for this layer: causal needs a causal layer, --config.attention.causal=True "
             f"({', '.join(n for n, form in forms.items() if form == 'causal=True')}) or "
             + " or ".join(f"attention.name='{n}' with --config.attention.{form}"
                           for n, form in forms.items() if form != "causal=True"))


def causal_layers(s: Settings) -> bool:
    """Whether the configured layers mix only earlier positions: the variant's causal form
    (`TokenMixer.causal_form`, a setting such as causal=True or bidirectional=False) is set."""
    form = causal_forms().get(s.variant)
    if form is None:
        return False
    key, value = form.split("=")
    return s.attention.get(key) is {"True": True, "False": False}[value]


def check_optimizer(opt: OptimizerSettings) -> None:
    """ConfigError (one line) for the first optimizer value out of its range."""
    _one_of("optimizer.schedule", opt.schedule, SCHEDULES)
    _require("optimizer.learning_rate", opt.learning_rate, _number(opt.learning_rate) and opt.learning_rate > 0,
             "> 0 (a negative rate ascends the loss)")
    _at_least("optimizer.warmup_steps", opt.warmup_steps, 0)
    _require("optimizer.weight_decay", opt.weight_decay, _number(opt.weight_decay) and opt.weight_decay >= 0, ">= 0")
    _rate("optimizer.b1", opt.b1)
    _rate("optimizer.b2", opt.b2)
    _require("optimizer.eps", opt.eps, _number(opt.eps) and opt.eps > 0, "> 0")
    _require("optimizer.grad_clip_norm", opt.grad_clip_norm, _number(opt.grad_clip_norm) and opt.grad_clip_norm >= 0,
             ">= 0 (0: no clipping)")
    _at_least("optimizer.skip_nonfinite_updates", opt.skip_nonfinite_updates, 0)
    if opt.ssm_max_learning_rate is not None:
        _require("optimizer.ssm_max_learning_rate", opt.ssm_max_learning_rate,
                 _number(opt.ssm_max_learning_rate) and opt.ssm_max_learning_rate > 0, "> 0")


def check_devices(s: Settings, num_devices: int) -> None:
    """ConfigError unless the batch splits evenly over `num_devices` devices and grad_accum_steps
    micro-batches on each (the train step's layout)."""
    step = num_devices * s.grad_accum_steps
    if s.batch_size % step:
        raise ConfigError(f"--config.batch_size={s.batch_size} is not a multiple of the {num_devices} devices times "
                          f"grad_accum_steps {s.grad_accum_steps}; set it to a multiple of {step}")
