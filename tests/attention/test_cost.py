"""Every variant's compiled cost grows with the length as its class declares (`cost_exponent`).

Each registered variant is built for its length (max_len = n, its defaults plus its
`settings_at_length(n)`) and compiled, without running, at n = 1024 and n = 4096: the forward
pass, and the forward and backward pass (gradient with respect to the input). For 4x the length,
a variant of exponent e may grow at most 1.5 * 4^e in FLOPs and in temporary memory (the 1.5
covers n log n sorts and FFTs and per-call buffers): 6x for a linear variant, 12x for routing's and
strided's n^1.5, while anything n x n grows 16x. A sub-quadratic variant must also need less than a
quarter of full attention's temporary memory at n = 4096, so nothing n x n is built, even once.
Its FLOPs must grow at least 4^(e - 1/2) (2x, 4x, 8x), so a variant that is cheaper than it
declares is told to declare it: a new sub-quadratic variant cannot pass as quadratic unnoticed.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from helpers import slow_except

from lra_jax.attention import registry

DIM, HEADS, SHORT, LONG = 64, 2, 1024, 4096
HEADROOM = 1.5  # allowed growth over 4^e: log factors (sorts, FFTs) and fixed per-call buffers


@functools.cache
def compiled_costs(name: str, n: int) -> dict[str, tuple[float, int]]:
    """{"forward" | "backward": (FLOPs, temporary bytes)} of the compiled passes at length n."""
    settings = registry.get(name).settings_at_length(n)
    model = nnx.eval_shape(lambda: registry.build(name, dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0), max_len=n,
                                                  **settings))
    graphdef, state = nnx.split(model)

    def forward(state, x, mask):
        return nnx.merge(graphdef, state)(x, mask, deterministic=True)

    def backward(state, x, mask):
        return jax.grad(lambda x: jnp.sum(forward(state, x, mask) ** 2))(x)

    x = jax.ShapeDtypeStruct((1, n, DIM), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, n), jnp.bool_)
    costs = {}
    for label, fn in (("forward", forward), ("backward", backward)):
        compiled = jax.jit(fn).lower(state, x, mask).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        costs[label] = (float(cost["flops"]), int(compiled.memory_analysis().temp_size_in_bytes))
    return costs


def growth(name: str, label: str) -> tuple[float, float]:
    """(FLOPs growth, temporary-memory growth) of a pass from n = SHORT to n = LONG."""
    (flops_short, temp_short), (flops_long, temp_long) = (compiled_costs(name, n)[label] for n in (SHORT, LONG))
    return flops_long / flops_short, temp_long / max(temp_short, 1)


def test_full_attention_grows_quadratically():
    """The check can tell n from n^2: softmax grows ~16x in both measures of both passes."""
    for label in ("forward", "backward"):
        flops, temp = growth("softmax", label)
        assert flops > 12 and temp > 12, (label, flops, temp)


@pytest.mark.parametrize("name", slow_except(registry.names(), keep={"linear"}))
@pytest.mark.every_variant("name")
def test_cost_grows_as_the_variant_declares(name):
    exponent = registry.get(name).cost_exponent
    limit = HEADROOM * 4**exponent
    for label in ("forward", "backward"):
        flops, temp = growth(name, label)
        assert flops < limit, f"{name} {label}: FLOPs grew {flops:.1f}x for 4x the length (cost_exponent {exponent})"
        assert temp < limit, f"{name} {label}: temporary memory grew {temp:.1f}x for 4x the length"
        assert flops > 4 ** (exponent - 0.5), (
            f"{name} {label}: FLOPs grew only {flops:.1f}x for 4x the length; declare its cost_exponent")
        if exponent < 2:
            temp_long, full_long = compiled_costs(name, LONG)[label][1], compiled_costs("softmax", LONG)[label][1]
            assert temp_long < full_long / 4, f"{name} {label}: {temp_long} temporary bytes at n = {LONG}"
