"""Sub-quadratic variants are sub-quadratic in fact: XLA's compiled cost from n = 1024 to n = 4096.

Full attention grows ~16x in FLOPs and temporary memory when n grows 4x. Each variant below is
built for its length (max_len = n) and compiled (forward, one sequence, no data) at both lengths,
and must grow at most 6x in both: linear or n log n. Routing, with the paper's sqrt(n) clusters of
sqrt(n) tokens, is O(n sqrt(n)) by design: 8x, allowed up to 8.5x. At n = 4096 its temporary memory must also
stay under a quarter of full attention's, so no n x n mask or score matrix is materialised.
"""

import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from lra_jax.attention import registry

DIM, HEADS, SHORT, LONG = 64, 2, 1024, 4096

# Settings at these lengths: the LRA-style defaults where they fit, a smaller window/rank otherwise.
SUBQUADRATIC = {
    "local": dict(window=64),
    "strided": dict(),
    "longformer": dict(),
    "bigbird": dict(),
    "reformer": dict(),
    "routing": lambda n: dict(num_clusters=math.isqrt(n)),  # window = max_len / clusters = sqrt(n)
    "sinkhorn": dict(),
    "linformer": dict(k=64),
    "nystromformer": dict(),
    "performer": dict(num_features=64),
    "linear": dict(),
    "taylor": dict(),
    "lightweight_conv": dict(),
    "dynamic_conv": dict(),
    "fnet": dict(),
    "s4d": dict(),  # O(n N) kernel + O(n log n) FFT convolution
}


MAX_GROWTH = {"routing": 8.5}


def compiled_cost(name: str, n: int, settings=None) -> tuple[float, int]:
    """(FLOPs, temporary bytes) of the compiled deterministic forward pass at length n."""
    settings = settings(n) if callable(settings) else settings or {}
    model = registry.build(name, dim=DIM, num_heads=HEADS, rngs=nnx.Rngs(0), max_len=n, **settings)
    graphdef, state = nnx.split(model)

    def forward(state, x, mask):
        return nnx.merge(graphdef, state)(x, mask, deterministic=True)

    x = jax.ShapeDtypeStruct((1, n, DIM), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, n), jnp.bool_)
    compiled = jax.jit(forward).lower(state, x, mask).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"]), int(compiled.memory_analysis().temp_size_in_bytes)


def growth(name: str, settings=None) -> tuple[float, float, int]:
    (flops_short, temp_short), (flops_long, temp_long) = (compiled_cost(name, n, settings) for n in (SHORT, LONG))
    return flops_long / flops_short, temp_long / max(temp_short, 1), temp_long


@pytest.fixture(scope="module")
def full_attention():
    """softmax's (FLOPs growth, temporary-memory growth, temporary bytes at n = LONG)."""
    return growth("softmax")


def test_full_attention_grows_quadratically(full_attention):
    flops, temp, _ = full_attention
    assert flops > 12 and temp > 12, (flops, temp)


def test_every_subquadratic_variant_is_listed():
    registered = set(registry.names())
    assert set(SUBQUADRATIC) <= registered, sorted(set(SUBQUADRATIC) - registered)


@pytest.mark.parametrize("name", sorted(SUBQUADRATIC))
def test_cost_grows_subquadratically(name, full_attention):
    if name not in registry.names():
        pytest.fail(f"{name} is not registered")
    flops, temp, temp_long = growth(name, SUBQUADRATIC[name])
    limit = MAX_GROWTH.get(name, 6.0)
    assert flops < limit, f"{name}: FLOPs grew {flops:.1f}x for 4x the length"
    assert temp < limit, f"{name}: temporary memory grew {temp:.1f}x for 4x the length"
    assert temp_long < full_attention[2] / 4, f"{name}: {temp_long} temporary bytes at n = {LONG}"
