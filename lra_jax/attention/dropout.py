"""Dropout whose mask is a hash of coordinates (`lra_jax.kernels.dropout`), for every layer.

    y = x * keep / (1 - r),   keep = fmix32-hash(seed, coordinates) >= r * 2^32

(inverted dropout, Srivastava et al. 2014). A drop-in for `nnx.Dropout`: same call, same
key streams ("dropout", else "default"), one fresh key per call, so a resumed run
(dropout key = fold_in(key, step)) draws the same masks. Where `nnx.Dropout` draws
threefry bits for every element (about ten times the hash's cost on CPU, and the
largest part of a softmax train step's dropout cost: 32M attention weights per layer
at length 1024), this costs one multiply and one fmix32 per element. On attention weights
[b, h, q, k] the mask is exactly the one the Triton kernels draw (`kernels.dropout.apply`).
"""

from __future__ import annotations

from flax import nnx
from jaxtyping import Array, UInt32

from lra_jax.kernels import dropout as counter_mask


class Dropout(nnx.Module):
    """Counter-based dropout at a static `rate` in [0, 1); identity when deterministic or rate 0."""

    def __init__(self, rate: float):
        counter_mask.threshold(rate)  # refuses a rate outside [0, 1)
        self.rate = rate

    def __call__(self, x: Array, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> Array:
        if deterministic or self.rate == 0:
            return x
        return counter_mask.drop(x, self.seed(rngs), self.rate)

    def seed(self, rngs: nnx.Rngs | None) -> UInt32[Array, "1"]:
        """The mask seed of one call: a fresh key from `rngs`' "dropout" stream, else its "default" one."""
        if rngs is None:
            raise ValueError("dropout in training needs rngs (an nnx.Rngs with a 'dropout' stream)")
        stream = next((name for name in ("dropout", "default") if name in rngs), None)
        if stream is None:
            raise ValueError("dropout needs an nnx.Rngs with a 'dropout' or 'default' stream")
        return counter_mask.seed_from_key(rngs[stream]())
