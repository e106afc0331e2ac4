"""Every variant's declared dependency pattern against its own Jacobian.

A layer declares which outputs may depend on which inputs (`TokenMixer.dependency_pattern`: its window,
stride, global tokens or random blocks, its causal form, and the padding rule). Here the real layer's
Jacobian norm map ||dy_i / dx_j|| at one random input is exactly zero outside that pattern and nonzero for
almost every pair inside it. Every registered variant is checked, and each causal form (`causal_forms`), so a
variant added to the registry is held to its declaration with no test of its own. Causality is exact: the
output at i has zero derivative, not a small one, with respect to every later input, in float32, and in
bfloat16 too for S4D, Mega and Hyena, whose causal convolution was once an FFT (its rounding leaked).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import build_small, slow_except
from lra_jax.attention import registry
from lra_jax.attention.core import causal_forms

N, DIM, HEADS, REAL = 32, 8, 2, 27  # one sequence of 27 real tokens and 5 padded ones
# The share of declared pairs whose derivative must be nonzero: a window, stride or block declared wider than
# the layer computes leaves whole diagonals or blocks at exactly zero, far below it.
DENSE = 0.95


def causal_setting(name: str) -> dict:
    """The setting of `name`'s causal form, e.g. {"causal": True} or {"bidirectional": False}."""
    key, value = causal_forms()[name].split("=")
    return {key: value == "True"}


# name, name-causal for each causal form, and the causal forms whose convolution was an FFT in bfloat16 too
CASES = (registry.names() + [f"{name}-causal" for name in causal_forms()]
         + [f"{name}-causal-bfloat16" for name in ("s4d", "mega", "hyena")])
FAST = {"local", "longformer", "softmax-causal", "s4d-causal", "hyena-causal"}


def build(case: str) -> nnx.Module:
    name, *form = case.split("-")
    settings = causal_setting(name) if "causal" in form else {}
    if "bfloat16" in form:
        settings["dtype"] = jnp.bfloat16
    return build_small(name, dim=DIM, num_heads=HEADS, seed=0, max_len=N, **settings)


def jacobian_norms(layer: nnx.Module, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[n n] ||dy_i / dx_j|| (Frobenius over the channels) of one sequence, taken in float64 so that no
    nonzero entry squares to zero."""
    graphdef, state = nnx.split(layer)

    def forward(state, x):
        return nnx.merge(graphdef, state)(x[None], jnp.asarray(mask)[None], deterministic=True)[0]

    jacobian = np.asarray(jax.jit(jax.jacrev(forward, argnums=1))(state, x), np.float64)  # [n d n d]
    return np.sqrt(np.sum(jacobian**2, axis=(1, 3)))


@pytest.mark.parametrize("case", slow_except(CASES, keep=FAST))
@pytest.mark.every_variant("case")
def test_the_layer_depends_on_the_inputs_its_pattern_declares_and_no_other(case):
    layer = build(case)
    mask = np.arange(N) < REAL
    x = jnp.asarray(np.random.default_rng(0).standard_normal((N, DIM)), layer.dtype)
    pattern = layer.dependency_pattern(mask)
    norms = jacobian_norms(layer, x, mask)

    leaks = np.argwhere((norms != 0) & ~pattern)
    assert not leaks.size, (f"{case}: output i depends on input j outside its declared pattern at {len(leaks)} "
                            f"pairs (i, j), e.g. {leaks[:4].tolist()}; largest |dy_i/dx_j| there "
                            f"{norms[~pattern].max():.1e}")
    if not layer.data_dependent_pattern:  # the hash buckets or clusters of this input are a subset of the pattern
        share = np.mean(norms[pattern] != 0)
        missing = np.argwhere((norms == 0) & pattern)
        assert share >= DENSE, (f"{case}: only {share:.1%} of the declared pairs have a nonzero derivative; "
                                f"zero at (i, j) = {missing[:4].tolist()} ...")

