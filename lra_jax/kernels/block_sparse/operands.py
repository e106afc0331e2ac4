"""What a block-sparse kernel call takes besides q, k, v: its arrays (`BlockSparseInputs`) and its
static settings (`BlockSparseStatic`), shared by every implementation of `api.BLOCK_SPARSE`
(the Triton and Mosaic kernels and the XLA reference take them as `(q, k, v, inputs, static)`)."""

from __future__ import annotations

import dataclasses
import functools

import jax
from jaxtyping import Array, Bool

from lra_jax.kernels import masking


@functools.partial(jax.tree_util.register_dataclass, data_fields=["mask", "dropout_seed"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class BlockSparseInputs:
    """The arrays of a call besides q, k, v: the mask (`masking.Mask`, resolved: both padding masks given)
    and the dropout seed."""

    mask: masking.Mask
    dropout_seed: Array

    @property
    def key_mask(self) -> Bool[Array, "b k"]:
        return self.mask.key_mask

    @property
    def query_mask(self) -> Bool[Array, "b q"]:
        return self.mask.query_mask

    def codes(self, nq: int, key_mask: Bool[Array, "b k"] | None = None) -> masking.Codes:
        """The pattern in the kernels' element terms, for `key_mask` (default: the call's)."""
        return self.mask.codes(nq, key_mask)


@dataclasses.dataclass(frozen=True)
class BlockSparseStatic:
    """The static settings of a call: softmax scale, kernel block size (a block_mask's own where the mask
    has one), dropout rate, interpreter."""

    scale: float
    block: int = 64
    dropout_rate: float = 0.0
    interpret: bool = False
