"""The matmul the Pallas kernels share: a 2-D `lax.dot_general` with float32 accumulation."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def dot(a, b, trans_a: bool = False, trans_b: bool = False):
    """a @ b (aᵀ where `trans_a`, bᵀ where `trans_b`) for 2-D blocks, accumulated in float32."""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
