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

# The families, named as the literature names them, in the order the docs show them, each with the
# sub-package of lra_jax.attention that holds its variants ("": the top level, beside the shared core). A
# variant's family is where its module lives (`family_of`); tests/attention/test_families.py checks that
# every registered variant lives in one of these.
FAMILY_PACKAGES: dict[str, str] = {
    "full attention": "",
    "fixed sparse patterns": "sparse",
    "learned patterns": "learned_patterns",
    "low rank": "low_rank",
    "kernelized": "kernelized",
    "synthesized": "synthesized",
    "convolution and MLP mixing": "mixing",
    "state space and gated recurrence": "recurrent",
}
_PACKAGE = __name__.rpartition(".")[0]  # lra_jax.attention

# The term beside n in the cost of a sub-quadratic variant whose work per position is set by a setting:
# "w", the inputs a position sees (a window, blocks, a bucket or cluster, a convolution's width; about sqrt(n)
# where the variant's `cost_exponent` is 1.5), or "k", a projected length (Linformer's rank, Nystromformer's
# landmarks, the MLP-Mixer's hidden units), or "log n", a Fourier transform over the sequence (FNet's mixing,
# the long convolutions of S4D and Hyena; `cost_exponent` drops the log factor). Any other sub-quadratic
# variant is O(n); a variant of `cost_exponent` 2 is O(n^2). Read by `cost`.
COST_TERMS: dict[str, str] = {
    "local": "w", "strided": "w", "longformer": "w", "bigbird": "w", "reformer": "w", "routing": "w",
    "sinkhorn": "w", "lightweight_conv": "w", "dynamic_conv": "w", "linformer": "k", "nystromformer": "k",
    "mixer": "k", "fnet": "log n", "s4d": "log n", "hyena": "log n",
}


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


def family_of(name: str) -> str:
    """The family of variant `name`: the one whose sub-package of lra_jax.attention holds its class
    (`FAMILY_PACKAGES`); ValueError for a variant defined anywhere else."""
    module = get(name).__module__
    parts = module.removeprefix(_PACKAGE + ".").split(".") if module.startswith(_PACKAGE + ".") else None
    package = "" if parts is not None and len(parts) == 1 else parts[0] if parts else None
    for family, where in FAMILY_PACKAGES.items():
        if package == where:
            return family
    raise ValueError(f"attention variant {name!r} is defined in {module}, outside every family: move it into "
                     f"the sub-package of lra_jax.attention of its family ({', '.join(p for p in FAMILY_PACKAGES.values() if p)})")


def families() -> dict[str, tuple[str, ...]]:
    """{family: its variants, in the order they registered}, every family of `FAMILY_PACKAGES` in order."""
    return {family: tuple(name for name in _VARIANTS if family_of(name) == family) for family in FAMILY_PACKAGES}


def cost(name: str) -> str:
    """How variant `name`'s cost grows with the length n: "O(n²)", "O(n w)", "O(n k)", "O(n log n)" or "O(n)",
    from its class's `cost_exponent` and `COST_TERMS`."""
    if get(name).cost_exponent >= 2:
        return "O(n²)"
    return f"O(n {COST_TERMS[name]})" if name in COST_TERMS else "O(n)"


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
