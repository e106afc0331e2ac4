"""What a block-sparse kernel call takes besides q, k, v: its arrays (`BlockSparseInputs`) and its
static settings (`BlockSparseStatic`), shared by every implementation of `api.BLOCK_SPARSE`
(the Triton and Mosaic kernels and the XLA reference take them as `(q, k, v, inputs, static)`)."""

from __future__ import annotations

import dataclasses

from jaxtyping import Array, Bool

from lra_jax.kernels import masking


@dataclasses.dataclass(frozen=True)
class BlockSparseInputs:
    """The arrays of a call besides q, k, v: padding (True on real tokens), the dropout seed and the
    pattern's arrays (None where unused; the segments and global tokens shared across the batch)."""

    key_mask: Bool[Array, "b k"]
    query_mask: Bool[Array, "b q"]
    dropout_seed: Array
    query_segments: Array | None = None
    key_segments: Array | None = None
    global_queries: Array | None = None
    global_keys: Array | None = None
    block_mask: Bool[Array, "qb kb"] | None = None

    def codes(self, window: int | None, nq: int, key_mask: Bool[Array, "b k"] | None = None) -> masking.Codes:
        """The pattern in the kernels' element terms, for `key_mask` (default: the call's)."""
        return masking.element_codes(nq, self.key_mask if key_mask is None else key_mask, window,
                                     self.query_segments, self.key_segments, self.global_queries, self.global_keys)


@dataclasses.dataclass(frozen=True)
class BlockSparseStatic:
    """The static settings of a call: softmax scale, band, block size, dropout rate, interpreter."""

    scale: float
    window: int | None = None
    block: int = 64
    dropout_rate: float = 0.0
    interpret: bool = False
