"""What every kernel op prepares before it runs: masks, the dropout seed, block sizes and padding.

Shared by `flash`, `block_sparse` and `linear` (their `api.py`) and the Mosaic wrappers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Bool

from lra_jax.kernels import dropout, masking

MIN_BLOCK = 16  # Triton's smallest dot


@functools.partial(jax.tree_util.register_dataclass, data_fields=["mask", "dropout_seed"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class AttentionInputs:
    """The arrays of a flash or block-sparse call besides q, k, v: the mask (`masking.Mask`, resolved: both
    padding masks given) and the uint32 dropout seed [1]."""

    mask: masking.Mask
    dropout_seed: Array

    @property
    def key_mask(self) -> Bool[Array, "b k"]:
        return self.mask.key_mask

    @property
    def query_mask(self) -> Bool[Array, "b q"]:
        return self.mask.query_mask

    def codes(self, nq: int, key_mask: Bool[Array, "b k"] | None = None) -> masking.Codes:
        """The mask in the kernels' element terms, for `key_mask` (default: the call's)."""
        return self.mask.codes(nq, key_mask)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The largest kernel blocks a call asks for (query rows, key rows); powers of two >= 16 once
    `for_lengths` has fitted them. The Triton kernels may run smaller ones (`lra_jax.kernels.tiling`)."""

    block_q: int = 64
    block_k: int = 64

    def for_lengths(self, nq: int, nk: int) -> BlockSizes:
        """Powers of two >= 16, no larger than needed for nq queries and nk keys."""
        return BlockSizes(kernel_block(nq, self.block_q), kernel_block(nk, self.block_k))


def check_dropout(rate: float, seed: Array | None) -> Array:
    """The seed a call passes on: `seed` as uint32 [1] when rate > 0 (required), zeros otherwise."""
    dropout.threshold(rate)  # checks 0 <= rate < 1
    if rate == 0.0:
        return jnp.zeros((1,), jnp.uint32)
    if seed is None:
        raise ValueError(f"attention dropout at rate {rate} needs a dropout_seed (dropout.seed_from_key(key))")
    return jnp.asarray(seed, jnp.uint32).reshape(1)


def kernel_block(n: int, block: int) -> int:
    """A power-of-two block >= 16 (Triton's smallest dot), no larger than needed for n."""
    return max(MIN_BLOCK, min(pl.next_power_of_2(block), pl.next_power_of_2(n)))


def round_up(n: int, block: int) -> int:
    """n rounded up to a multiple of block."""
    return -(-n // block) * block


def pad_axis(x: Array, axis: int, size: int, value=0) -> Array:
    """Pads `axis` of x at the end up to `size`."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def padded_head_dim(d: int) -> int:
    """Head dims are padded with zeros to a power of two >= 16 (zeros change no logit)."""
    return max(MIN_BLOCK, pl.next_power_of_2(d))


def zero_rows(out: Array, keep: Bool[Array, "b q"]) -> Array:
    """out [b, q, ...] with the rows where `keep` is False set to 0 (padded queries)."""
    keep = keep.reshape(keep.shape + (1,) * (out.ndim - 2))
    return jnp.where(keep, out, jnp.zeros((), out.dtype))
