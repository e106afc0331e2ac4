"""The attention registry: variants register by name, the encoder builds them by name.

    @register("softmax")
    class SoftmaxAttention(Attention): ...

    layer = build("softmax", dim=256, num_heads=4, rngs=nnx.Rngs(0), dropout_rate=0.1)

Settings are checked against the variant's constructor, so a typo in
`config.attention` fails with the list of settings the variant accepts. A built
layer keeps each setting as an attribute of the same name, so `layer_settings`
can say exactly what ran (defaults and values derived at build time included).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx

from lra_jax.errors import ConfigError

_VARIANTS: dict[str, type[nnx.Module]] = {}


def register(name: str) -> Callable[[type[nnx.Module]], type[nnx.Module]]:
    """Class decorator that makes a variant buildable under `name`."""

    def add(cls: type[nnx.Module]) -> type[nnx.Module]:
        if name in _VARIANTS and _VARIANTS[name] is not cls:
            raise ValueError(f"attention variant {name!r} is registered twice")
        _VARIANTS[name] = cls
        cls.variant_name = name
        return cls

    return add


def names() -> list[str]:
    """All registered variant names, sorted."""
    return sorted(_VARIANTS)


def get(name: str) -> type[nnx.Module]:
    """The class registered under `name`; an unknown name lists the known ones."""
    if name not in _VARIANTS:
        hint = difflib.get_close_matches(name, _VARIANTS, n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(
            f"unknown attention variant {name!r}{did_you_mean}; "
            f"known variants: {', '.join(names())}. Set config.attention.name to one of them."
        )
    return _VARIANTS[name]


def settings_of(name: str) -> dict[str, Any]:
    """The keyword settings a variant accepts, with their defaults."""
    accepted: dict[str, Any] = {}
    for klass in get(name).__mro__:  # a variant passes **common on to its base class
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        for p in params:
            if p.kind is p.KEYWORD_ONLY and p.name != "rngs":
                accepted.setdefault(p.name, p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return accepted


def layer_settings(model: nnx.Module) -> dict[str, Any]:
    """The settings of the first attention layer in `model` (or `model` itself), read back from it.

    Defaults and values derived when the layer was built are filled in: reformer's
    num_buckets from max_len, additive's query_chunk from the backend. dtype is given by name.
    """
    layer = next(node for _, node in nnx.iter_graph(model) if hasattr(type(node), "variant_name"))
    settings = {"name": layer.variant_name}
    for key in settings_of(layer.variant_name):
        value = getattr(layer, key)
        settings[key] = jnp.dtype(value).name if key == "dtype" else value
    return settings


def layer_kernels(model: nnx.Module) -> list[dict[str, Any]]:
    """The kernel each attention layer of `model` runs, as built (for its kernel target).

    One entry per layer: its path in the model ("encoder/blocks/attention"; a scanned
    stack of layers is one entry), the platform, the kernel of a training call and of an
    evaluation call ("xla", "pallas-triton", "pallas-mosaic-splash"), whether the kernel
    runs in the Pallas interpreter, and why a layer runs XLA where its impl asked for a
    kernel (attention dropout, a setting the kernel lacks, no kernel for the platform).
    """
    entries = []
    for path, node in nnx.iter_graph(model):
        if not hasattr(type(node), "variant_name"):
            continue
        train, evaluate = node.kernel_plan(deterministic=False), node.kernel_plan(deterministic=True)
        entries.append({
            "layer": "/".join(str(part) for part in path) or node.variant_name,
            "platform": evaluate.platform,
            "train": train.kernel,
            "eval": evaluate.kernel,
            "interpreted": evaluate.uses_pallas and evaluate.interpret,
            "reason": evaluate.reason or train.reason,
        })
    return entries


def describe_kernels(entries: list[dict[str, Any]]) -> list[str]:
    """One line per distinct kernel choice of `layer_kernels`, for the console (said once per run)."""
    lines = []
    for entry in entries:
        kernel = entry["eval"] if entry["train"] == entry["eval"] else (
            f"{entry['train']} in training, {entry['eval']} in evaluation")
        line = f"attention kernel on {entry['platform']}: {kernel}" + (" (interpreted)" if entry["interpreted"] else "")
        if entry["reason"]:
            line += f"; XLA where {entry['reason']}"
        if line not in lines:
            lines.append(line)
    return lines


def check_settings(name: str, settings: Mapping[str, Any]) -> None:
    """ConfigError for an unknown variant (the known ones listed) or a setting its constructor does not
    take (its settings listed): the variant's keyword arguments are its typed settings."""
    accepted = settings_of(name)
    for key in settings:
        if key not in accepted:
            hint = difflib.get_close_matches(key, accepted, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(
                f"attention variant {name!r} has no setting {key!r}{did_you_mean}; "
                f"its settings are: {', '.join(sorted(accepted))}"
            )


def build(name: str, *, dim: int, num_heads: int, rngs: nnx.Rngs, **settings: Any) -> nnx.Module:
    """Builds variant `name` with model width `dim`, `num_heads` heads and its `settings`."""
    check_settings(name, settings)
    return get(name)(dim, num_heads, rngs=rngs, **settings)
