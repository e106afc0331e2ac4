"""Pooling of encoder features and the classifiers on top (one sequence, or a pair for Retrieval).

Pooling respects padding: MEAN divides by the number of real tokens (the LRA
code averaged over padding too), MAX ignores padded positions, CLS reads the
prepended token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float

from lra_jax.errors import ConfigError

POOLINGS = ("cls", "mean", "max")


def pool(x: Float[Array, "b n d"], mask: Bool[Array, "b n"], mode: str) -> Float[Array, "b d"]:
    """One vector per sequence from its real positions; an all-padding row gives zeros."""
    if mode == "cls":
        return x[:, 0]
    if mode == "mean":
        count = jnp.maximum(mask.sum(axis=1, keepdims=True), 1).astype(x.dtype)
        return jnp.where(mask[..., None], x, 0).sum(axis=1) / count
    if mode == "max":
        pooled = jnp.where(mask[..., None], x, jnp.finfo(x.dtype).min).max(axis=1)
        return jnp.where(mask.any(axis=1, keepdims=True), pooled, 0)
    raise ConfigError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLINGS)}")


class ClassifierHead(nnx.Module):
    """Dense(mlp_dim) -> ReLU -> Dense(num_classes), as in the LRA code; mlp_dim 0: one
    Dense(num_classes), the linear decoder of the S4/S4D code."""

    def __init__(self, dim: int, mlp_dim: int, num_classes: int, *, dtype, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(dim, mlp_dim, dtype=dtype, rngs=rngs) if mlp_dim else None
        self.logits = nnx.Linear(mlp_dim or dim, num_classes, dtype=dtype, rngs=rngs)

    def __call__(self, pooled: Float[Array, "b d"]) -> Float[Array, "b c"]:
        return self.logits(pooled if self.hidden is None else jax.nn.relu(self.hidden(pooled)))


def pair_features(u: Float[Array, "b d"], v: Float[Array, "b d"]) -> Float[Array, "b 4d"]:
    """[u, v, u * v, u - v]: the two-tower interaction of the LRA matching task."""
    return jnp.concatenate([u, v, u * v, u - v], axis=-1)
