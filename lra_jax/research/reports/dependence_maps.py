"""What each variant's output depends on: the map ||dy_i / dx_j|| of the real layer, one panel per form.

For a layer built at n positions (all of them real) and one random input x [1, n, d] drawn from an explicit
key, the Jacobian dy/dx of `layer(x, mask, deterministic=True)` (`jax.jacrev`, jitted once per layer) holds,
for each pair of positions (i, j), the [d, d] block of how output i moves with input j. Its Frobenius norm
over the channels, divided by the largest of the map, is the map drawn (`lra_jax.research.reports.dependence_figure`):
exactly zero where output i cannot see input j at all, small where it barely does. A variant with a causal
form (`causal_forms`) is drawn in that form too, where every entry above the diagonal must be exactly zero.

The settings are each variant's defaults, except where a default would cover 64 positions whole (a window,
block, bucket, rank or kernel of 128): `SETTINGS` scales those to the length drawn, so that the map shows the
pattern rather than its full-attention limit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Float

from lra_jax.attention import registry
from lra_jax.attention.core import causal_forms
from lra_jax.errors import ConfigError

LENGTH, DIM, HEADS, SEED = 64, 16, 2, 0
LENGTHS = (16, 256)  # the lengths the command draws: the Jacobian has (n d)^2 entries

# Settings scaled to 64 positions (defaults otherwise): a window of 6 either side, blocks and chunks of 8,
# a rank of 16, 8 landmarks, kernels of 7, 4 clusters.
SETTINGS: dict[str, dict] = {
    "local": dict(window=6),
    "strided": dict(stride=8),
    "longformer": dict(window=6, num_global=2),
    "bigbird": dict(block=8, num_random_blocks=1),
    "reformer": dict(chunk_size=8, num_buckets=8, num_hashes=1),
    "routing": dict(num_clusters=4),
    "sinkhorn": dict(block=8),
    "linformer": dict(k=16),
    "nystromformer": dict(num_landmarks=8, conv_kernel=9),
    "performer": dict(num_features=32),
    "lightweight_conv": dict(kernel_size=7),
    "dynamic_conv": dict(kernel_size=7),
}

# The levels a map is compared by (`levels`): below 10^FLOOR_DECADE of the largest, then one level per decade up
# to the largest. What the eye reads, and the same on another machine unless a value sits on a decade's edge.
# Exact zeros share the lowest level with rounding: a derivative that is zero by the algebra (a softmax over one
# key, a gradient that cancels) computes to 0 on one machine and to ~1e-8 on another, whose CPU rounds
# differently (seen on Reformer's map); that zeros are exact where a pattern says so is tests/attention/test_patterns.py's.
FLOOR_DECADE = -6


@dataclasses.dataclass(frozen=True)
class Panel:
    """One drawn map: the variant, the causal setting drawn (None: the default form), and [n, n] norms / max."""

    variant: str
    causal: str | None
    norms: Float[np.ndarray, "n n"]

    @property
    def family(self) -> str:
        return registry.family_of(self.variant)

    @property
    def cost(self) -> str:
        return registry.cost(self.variant)

    @property
    def input_dependent(self) -> bool:
        """True where the input chooses which positions a query sees (hashing, clustering, sorting)."""
        return self.family == "learned patterns" or registry.get(self.variant).data_dependent_pattern

    @property
    def label(self) -> str:
        return f"{self.variant}, causal" if self.causal else self.variant

    def seen(self) -> float:
        """The inputs an output depends on at all (a nonzero derivative), on average over the outputs."""
        return float(np.mean(np.sum(self.norms > 0, axis=1)))

    def leak(self) -> float:
        """The largest derivative of an output with respect to a later input, relative to the map's largest."""
        upper = self.norms[np.triu_indices(len(self.norms), 1)]
        return float(upper.max()) if upper.size else 0.0


def causal_setting(name: str) -> dict[str, bool]:
    """The setting of `name`'s causal form, e.g. {"causal": True} or {"bidirectional": False}."""
    key, value = causal_forms()[name].split("=")
    return {key: value == "True"}


def check_variants(names: list[str]) -> None:
    """ConfigError naming the first unknown variant, or one in no family."""
    for name in names:
        registry.get(name)  # an unknown name lists the known ones
        try:
            registry.family_of(name)
        except ValueError as error:
            raise ConfigError(str(error)) from error


def dependence(layer: nnx.Module, x: Float[jax.Array, "n d"]) -> Float[np.ndarray, "n n"]:
    """[n, n] ||dy_i / dx_j|| over the channels of one sequence x (all positions real), divided by its largest."""
    graphdef, state = nnx.split(layer)
    mask = jnp.ones((1, x.shape[0]), bool)

    def forward(state, x):
        return nnx.merge(graphdef, state)(x[None], mask, deterministic=True)[0]

    jacobian = np.asarray(jax.jit(jax.jacrev(forward, argnums=1))(state, x), np.float64)  # [n d n d]
    norms = np.sqrt(np.sum(jacobian**2, axis=(1, 3)))
    largest = norms.max()
    return norms / largest if largest > 0 else norms


def compute_panel(name: str, causal: bool, *, n: int = LENGTH, seed: int = SEED) -> Panel:
    """The map of variant `name` (its causal form where `causal`) at length n, its weights and input from `seed`."""
    settings = {**SETTINGS.get(name, {}), **(causal_setting(name) if causal else {})}
    layer = registry.build(name, dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), max_len=n, **settings)
    x = jax.random.normal(jax.random.fold_in(jax.random.key(seed), n), (n, DIM))
    return Panel(name, causal_forms()[name] if causal else None, dependence(layer, x))


def panels(names: list[str], *, n: int = LENGTH, seed: int = SEED,
           progress: Callable[[Panel], None] | None = None) -> list[Panel]:
    """The maps of `names`, in the order of the families and of their members, each variant then its causal form.
    `progress(panel)` is called after each."""
    check_variants(names)
    forms = causal_forms()
    ordered = [name for members in registry.families().values() for name in members if name in names]
    out = []
    for name in ordered:
        for causal in (False, True) if name in forms else (False,):
            out.append(compute_panel(name, causal, n=n, seed=seed))
            if progress:
                progress(out[-1])
    return out


def levels(norms: Float[np.ndarray, "n n"]) -> np.ndarray:
    """int8 [n, n]: 0 below 10^FLOOR_DECADE (exactly zero, or rounding), then one per decade (1 from
    10^FLOOR_DECADE, ..., 6 from 0.1 to the largest, 1)."""
    with np.errstate(divide="ignore"):
        decade = np.floor(np.log10(np.where(norms > 0, norms, 1.0)))
    level = np.clip(decade - FLOOR_DECADE + 1, 1, -FLOOR_DECADE)  # [0.1, 1] is the top level
    return np.where(norms >= 10.0 ** FLOOR_DECADE, level, 0).astype(np.int8)


def digest(drawn: list[Panel], *extra: str) -> str:
    """'sha256:<hex>' of what a figure shows: each panel's variant, form and `levels`, and `extra` text (titles)."""
    sha = hashlib.sha256()
    for text in extra:
        sha.update(text.encode("utf-8") + b"\0")
    for panel in drawn:
        sha.update(f"{panel.variant}|{panel.causal}|{panel.norms.shape}".encode("utf-8"))
        sha.update(levels(panel.norms).tobytes())
    return "sha256:" + sha.hexdigest()


def decade(value: float) -> str:
    """10^k just above `value` > 0, as text ("1e-7")."""
    return f"1e{math.ceil(math.log10(value))}"


def reach(panel: Panel) -> str:
    """How many inputs each output of the map depends on."""
    n, seen = len(panel.norms), panel.seen()
    if seen == n:
        return f"each output depends on all {n} inputs"
    return f"each output depends on {seen:.1f} of the {n} inputs on average (exactly zero on the others)"


def causality(panel: Panel) -> str:
    """Whether every output of a causal form has exactly zero derivative with respect to every later input."""
    leak = panel.leak()
    if leak == 0:
        return "no output depends on a later input (exactly zero)"
    return (f"later inputs still reach earlier outputs, at up to {decade(leak)} of the largest derivative: "
            "not exactly zero, so not causal")


def summary(panel: Panel) -> str:
    """One line of what the map shows: `reach`, and `causality` for a causal form."""
    return reach(panel) + (f"; {causality(panel)}" if panel.causal else "")
